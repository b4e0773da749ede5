//! `dinomo dpm`: a memory node serving its pool over TCP until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dinomo_dpm::{Partitioning, Processor};
use dinomo_fabric::{MemoryNode, NodeConfig, Server};
use dinomo_pool::{PersistMode, Pool, PoolOptions};

use crate::config::{Config, ConfigArgs};
use crate::size::parse_size;

/// The cluster's shared secret: the memory node requires it of every fabric connection, the KV and routing nodes
/// of every native-protocol connection, and every process that connects presents it.
#[derive(Debug, Clone, Default, Args)]
pub struct ClusterToken {
    /// Shared secret of the cluster (the memory node's fabric, the KV and routing nodes' native protocol); also
    /// read from DINOMO_CLUSTER_TOKEN [fabric.token].
    #[arg(
        long = "token",
        value_name = "TOKEN",
        env = "DINOMO_CLUSTER_TOKEN",
        hide_env_values = true
    )]
    pub value: Option<String>,
}

impl ClusterToken {
    /// Sets the token when one was given.
    pub fn apply(&self, cfg: &mut Config) {
        if let Some(t) = &self.value {
            cfg.fabric.token = t.clone();
        }
    }
}

/// Settings of `dinomo dpm`. Each flag overrides the configuration file.
#[derive(Debug, Args, Default)]
pub struct DpmArgs {
    /// Address to serve the fabric on. Non-loopback addresses need --allow-non-loopback and a cluster token
    /// [dpm.server.listen; default 127.0.0.1:7100].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Pool file; created with --size if it does not exist [pool.path; default dinomo-data/pool].
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Size of a new pool (ignored when the file exists), e.g. 1GiB [pool.size; default 1GiB].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Allocation unit of a new pool, e.g. 8MiB [pool.segment_size; default 8MiB].
    #[arg(long, value_parser = parse_size)]
    pub segment_size: Option<u64>,
    /// Free pool space kept faulted in ahead of the log writers, e.g. 64MiB; 0 turns it off
    /// [pool.prefault_ahead; default 32MiB].
    #[arg(long, value_parser = parse_size)]
    pub prefault_ahead: Option<u64>,
    /// Durability: volatile, periodic (msync every second), durable (msync per write) or dax [pool.persist;
    /// default periodic].
    #[arg(long)]
    pub persist: Option<PersistMode>,
    #[command(flatten)]
    pub token: ClusterToken,
    /// Allow listening on addresses other than loopback [dpm.server.allow_non_loopback].
    #[arg(long)]
    pub allow_non_loopback: bool,
    /// Fabric connections served at once [dpm.server.max_connections; default 1024].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Largest payload of one verb or RPC, e.g. 64MiB [dpm.node.max_message_len; default 64MiB].
    #[arg(long, value_parser = parse_size)]
    pub max_message: Option<u64>,
    /// Processor threads serving two-sided calls [dpm.node.rpc_threads; default 2].
    #[arg(long)]
    pub rpc_threads: Option<usize>,
    /// Threads merging KV nodes' logs into the index [processor.merge_threads; default 4].
    #[arg(long)]
    pub merge_threads: Option<usize>,
    /// Bytes of a log segment (fixed when the pool is first formatted), e.g. 8MiB [processor.segment_size;
    /// default 8MiB].
    #[arg(long, value_parser = parse_size)]
    pub log_segment_size: Option<u64>,
    /// Logs (KV-node threads) the pool can hold at once (fixed when the pool is first formatted; logs of departed
    /// nodes are given back) [processor.directory_capacity; default 4096].
    #[arg(long)]
    pub max_logs: Option<u32>,
    /// Index layout, fixed when the pool is first formatted: shared (one index every KV node reads: dinomo and
    /// dinomo-s) or per-node (one partition per KV node, data moved when keys change owner: dinomo-n)
    /// [processor.partitioning; default shared].
    #[arg(long)]
    pub partitioning: Option<Partitioning>,
    /// Serve the pool as plain registered memory, without the data plane (no index, logs or merge threads): for
    /// fabric tests and benchmarks that use the memory directly [dpm.fabric_only].
    #[arg(long)]
    pub fabric_only: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl DpmArgs {
    /// The settings: the defaults, then the configuration file, then the flags given.
    pub fn settings(&self) -> anyhow::Result<Config> {
        let mut cfg = self.config.load()?.config;
        if let Some(l) = self.listen {
            cfg.dpm.server.listen = l;
        }
        if let Some(p) = &self.pool {
            cfg.pool.path = p.clone();
        }
        if let Some(s) = self.size {
            cfg.pool.size = s;
        }
        if let Some(s) = self.segment_size {
            cfg.pool.segment_size = s;
        }
        if let Some(bytes) = self.prefault_ahead {
            cfg.pool.prefault_ahead = bytes;
        }
        if let Some(p) = self.persist {
            cfg.pool.persist = p;
        }
        self.token.apply(&mut cfg);
        if self.allow_non_loopback {
            cfg.dpm.server.allow_non_loopback = true;
        }
        if let Some(n) = self.max_connections {
            cfg.dpm.server.max_connections = n;
        }
        if let Some(m) = self.max_message {
            cfg.dpm.node.max_message_len = u32::try_from(m)
                .ok()
                .filter(|&m| m > 0)
                .context("--max-message must be between 1 byte and 4 GiB - 1")?;
        }
        if let Some(n) = self.rpc_threads {
            cfg.dpm.node.rpc_threads = n;
        }
        if let Some(n) = self.merge_threads {
            cfg.processor.merge_threads = n;
        }
        if let Some(s) = self.log_segment_size {
            cfg.processor.segment_size = s;
        }
        if let Some(n) = self.max_logs {
            cfg.processor.directory_capacity = n;
        }
        if let Some(p) = self.partitioning {
            cfg.processor.partitioning = p;
        }
        if self.fabric_only {
            cfg.dpm.fabric_only = true;
        }
        Ok(cfg.checked(&self.config.source())?)
    }
}

/// Runs the memory node until a termination signal, then closes the pool cleanly.
pub fn run(args: DpmArgs) -> anyhow::Result<()> {
    let cfg = args.settings()?;
    let opts = PoolOptions {
        size: cfg.pool.size,
        segment_size: cfg.pool.segment_size,
        persist: cfg.pool.persist,
    };
    // Register the signal handlers first so that a signal during start-up still stops us cleanly.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let pool_path = &cfg.pool.path;
    crate::cluster::create_parent_dir(pool_path)?;
    let (pool, report) = Pool::open_or_create(pool_path, &opts)
        .with_context(|| format!("opening pool {}", pool_path.display()))?;
    let pool = Arc::new(pool);
    pool.start_prefaulter(cfg.pool.prefault_ahead)
        .context("starting the pool's prefaulter")?;
    let layout = *pool.layout();
    let node = MemoryNode::new(
        pool.clone(),
        NodeConfig {
            cluster_token: cfg.fabric.token.clone(),
            ..cfg.dpm.node.clone()
        },
    );
    let processor = if cfg.dpm.fabric_only {
        None
    } else {
        let p =
            Processor::start(pool.clone(), &cfg.processor).context("starting the data plane")?;
        // The cluster record lives in this pool; KV nodes, routing nodes and M-nodes reach it over the fabric.
        let meta = dinomo_meta::EmbeddedMeta::open(pool.clone(), cfg.dpm.meta.clone())
            .context("opening the cluster metadata")?;
        node.set_rpc_handler(Arc::new(dinomo_cluster::MemoryNodeRpc::new(
            p.rpc_handler(&node),
            meta,
        )));
        Some(p)
    };
    let mut server = Server::start(node.clone(), cfg.dpm.server.clone())?;
    println!(
        "dinomo dpm listening on {} (pool {}, {} segments of {} bytes, {}, opened {}{})",
        server.local_addr(),
        pool_path.display(),
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
                // Damage recovery met: what it cost, and what it rebuilt.
                let mut damage = match s.damaged_log_bytes {
                    0 => String::new(),
                    n => format!(
                        ", {n} bytes of damaged log entries skipped (their writes are lost; see the log)"
                    ),
                };
                let repaired = s.resealed_segments + s.relinked_segments;
                if repaired > 0 {
                    damage.push_str(&format!(
                        ", {repaired} damaged segment header words rebuilt (nothing lost; see the log)"
                    ));
                }
                format!(
                    ", {} logs, {layout}, {} keys, {} entries recovered{damage}",
                    s.logs, s.index_entries, s.recovered_entries
                )
            }
        },
    );
    let metrics = cfg.metrics.serve(|| {
        use dinomo_cluster::metrics::{ClientMetrics, MetricsSource, ProcessorMetrics};
        let mut sources: Vec<Arc<dyn MetricsSource>> = vec![Arc::new(ClientMetrics(node.clone()))];
        if let Some(p) = &processor {
            sources.push(Arc::new(ProcessorMetrics(p.clone())));
        }
        sources
    })?;
    let signal = signals.forever().next();
    tracing::info!(?signal, "stopping memory node");
    drop(metrics);
    server.shutdown();
    if let Some(p) = processor {
        p.shutdown();
    }
    drop(node);
    pool.close().context("closing the pool")?;
    println!("dinomo dpm stopped cleanly");
    Ok(())
}
