//! `dinomo dpm`: a memory node serving its pool over TCP until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dinomo_dpm::{Partitioning, Processor, ProcessorConfig};
use dinomo_fabric::{MemoryNode, NodeConfig, Server, ServerConfig};
use dinomo_pool::{PersistMode, Pool, PoolOptions};

use crate::size::parse_size;

/// The memory node's shared secret: the dpm requires it of every fabric connection, and every process that
/// connects presents it.
#[derive(Debug, Clone, Args)]
pub struct ClusterToken {
    /// Shared secret of the memory node's fabric; also read from DINOMO_CLUSTER_TOKEN.
    #[arg(
        long = "token",
        value_name = "TOKEN",
        env = "DINOMO_CLUSTER_TOKEN",
        default_value = "",
        hide_env_values = true
    )]
    pub value: String,
}

/// Settings of `dinomo dpm`.
#[derive(Debug, Args)]
pub struct DpmArgs {
    /// Address to serve the fabric on. Non-loopback addresses need --allow-non-loopback and a cluster token.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// Pool file; created with --size if it does not exist.
    #[arg(long)]
    pub pool: PathBuf,
    /// Size of a new pool (ignored when the file exists), e.g. 1GiB.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    pub size: u64,
    /// Allocation unit of a new pool (the log segment size), e.g. 8MiB.
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub segment_size: u64,
    /// Durability: volatile, periodic (msync every second), durable (msync per write) or dax.
    #[arg(long, default_value = "periodic")]
    pub persist: PersistMode,
    #[command(flatten)]
    pub token: ClusterToken,
    /// Allow listening on addresses other than loopback.
    #[arg(long)]
    pub allow_non_loopback: bool,
    /// Fabric connections served at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Largest payload of one verb or RPC, e.g. 64MiB.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub max_message: u64,
    /// Processor threads serving two-sided calls.
    #[arg(long, default_value_t = 2)]
    pub rpc_threads: usize,
    /// Threads merging KV nodes' logs into the index.
    #[arg(long, default_value_t = 4)]
    pub merge_threads: usize,
    /// Bytes of a log segment (fixed when the pool is first formatted), e.g. 8MiB.
    #[arg(long, value_parser = parse_size, default_value = "8MiB")]
    pub log_segment_size: u64,
    /// Logs (KV-node threads) the pool can hold (fixed when the pool is first formatted).
    #[arg(long, default_value_t = 4096)]
    pub max_logs: u32,
    /// Index layout, fixed when the pool is first formatted: shared (one index every KV node reads: dinomo and
    /// dinomo-s) or per-node (one partition per KV node, data moved when keys change owner: dinomo-n).
    #[arg(long, default_value = "shared", value_parser = parse_partitioning)]
    pub partitioning: Partitioning,
    /// Serve the pool as plain registered memory, without the data plane (no index, logs or merge threads): for
    /// fabric tests and benchmarks that use the memory directly.
    #[arg(long)]
    pub fabric_only: bool,
}

fn parse_partitioning(s: &str) -> Result<Partitioning, String> {
    match s {
        "shared" => Ok(Partitioning::Shared),
        "per-node" => Ok(Partitioning::PerNode),
        other => Err(format!(
            "unknown index layout {other:?} (shared or per-node)"
        )),
    }
}

/// Runs the memory node until a termination signal, then closes the pool cleanly.
pub fn run(args: DpmArgs) -> anyhow::Result<()> {
    let max_message_len = u32::try_from(args.max_message)
        .ok()
        .filter(|&m| m > 0)
        .context("--max-message must be between 1 byte and 4 GiB - 1")?;
    let opts = PoolOptions {
        size: args.size,
        segment_size: args.segment_size,
        persist: args.persist,
    };
    // Register the signal handlers first so that a signal during start-up still stops us cleanly.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let (pool, report) = Pool::open_or_create(&args.pool, &opts)
        .with_context(|| format!("opening pool {}", args.pool.display()))?;
    let pool = Arc::new(pool);
    let layout = *pool.layout();
    let node = MemoryNode::new(
        pool.clone(),
        NodeConfig {
            cluster_token: args.token.value,
            max_message_len,
            rpc_threads: args.rpc_threads,
            ..NodeConfig::default()
        },
    );
    let processor = if args.fabric_only {
        None
    } else {
        let cfg = ProcessorConfig {
            merge_threads: args.merge_threads,
            segment_size: args.log_segment_size,
            directory_capacity: args.max_logs,
            partitioning: args.partitioning,
            ..ProcessorConfig::default()
        };
        let p = Processor::start(pool.clone(), &cfg).context("starting the data plane")?;
        // The cluster record lives in this pool; KV nodes, routing nodes and M-nodes reach it over the fabric.
        let meta =
            dinomo_meta::EmbeddedMeta::open(pool.clone(), dinomo_meta::MetaConfig::default())
                .context("opening the cluster metadata")?;
        node.set_rpc_handler(Arc::new(dinomo_cluster::MemoryNodeRpc::new(
            p.rpc_handler(),
            meta,
        )));
        Some(p)
    };
    let mut server = Server::start(
        node.clone(),
        ServerConfig {
            listen: args.listen,
            allow_non_loopback: args.allow_non_loopback,
            max_connections: args.max_connections,
            ..ServerConfig::default()
        },
    )?;
    println!(
        "dinomo dpm listening on {} (pool {}, {} segments of {} bytes, {}, opened {}{})",
        server.local_addr(),
        args.pool.display(),
        layout.segment_count,
        layout.segment_size,
        match pool.persist_mode() {
            PersistMode::Volatile => "volatile",
            PersistMode::Periodic { .. } => "periodic msync",
            PersistMode::Durable => "durable",
            PersistMode::Dax => "dax",
        },
        if report.was_clean {
            "clean"
        } else {
            "after an unclean shutdown"
        },
        match &processor {
            None => ", fabric only".to_string(),
            Some(p) => {
                let s = p.stats();
                let layout = match p.partitioning() {
                    Partitioning::Shared => "one shared index".to_string(),
                    Partitioning::PerNode => format!("{} index partitions", s.partitions),
                };
                format!(
                    ", {} logs, {layout}, {} keys, {} entries recovered",
                    s.logs, s.index_entries, s.recovered_entries
                )
            }
        },
    );
    let signal = signals.forever().next();
    tracing::info!(?signal, "stopping memory node");
    server.shutdown();
    if let Some(p) = processor {
        p.shutdown();
    }
    drop(node);
    pool.close().context("closing the pool")?;
    println!("dinomo dpm stopped cleanly");
    Ok(())
}
