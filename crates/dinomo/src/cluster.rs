//! `dinomo up`, `dinomo kn`, `dinomo rn`, `dinomo mnode` and `dinomo kv`: a whole cluster in one process, or its
//! parts as separate processes that meet through the memory node (or etcd).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use dinomo_cache::{CacheConfig, Policy};
use dinomo_cluster::policy::PolicyConfig;
use dinomo_cluster::{
    AutoscaleConfig, Autoscaler, Client, ClientConfig, ClusterNode, LocalCluster,
    LocalClusterConfig, MNode, MNodeConfig, ManualScaler, NodeConfig, RoutingNode, ServerLimits,
    Variant,
};
use dinomo_dpm::ProcessorConfig;
use dinomo_fabric::{Connector, Target};
use dinomo_kn::KnConfig;
use dinomo_meta::{MetaStore, RemoteMeta};
use dinomo_pool::PersistMode;

use crate::size::parse_size;

/// Where the cluster metadata lives.
#[derive(Debug, Args, Clone)]
pub struct MetaArgs {
    /// The memory node (`dinomo dpm`) to use; it also keeps the cluster record unless --etcd is given.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub dpm: SocketAddr,
    /// Keep the cluster record, leases and the M-node election in etcd instead (comma-separated endpoints).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/dinomo/")]
    pub etcd_prefix: String,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
}

impl MetaArgs {
    fn connector(&self) -> Connector {
        let mut c = Connector::new(Target::Tcp(self.dpm));
        c.config.cluster_token = self.token.value.clone();
        c
    }

    fn store(&self) -> anyhow::Result<Arc<dyn MetaStore>> {
        if self.etcd.is_empty() {
            return Ok(Arc::new(RemoteMeta::new(self.connector())));
        }
        etcd_store(&self.etcd, &self.etcd_prefix)
    }
}

#[cfg(feature = "etcd")]
fn etcd_store(endpoints: &[String], prefix: &str) -> anyhow::Result<Arc<dyn MetaStore>> {
    Ok(Arc::new(dinomo_meta::EtcdMeta::connect(
        endpoints,
        prefix,
        Duration::from_secs(5),
    )?))
}

#[cfg(not(feature = "etcd"))]
fn etcd_store(_: &[String], _: &str) -> anyhow::Result<Arc<dyn MetaStore>> {
    anyhow::bail!("this dinomo was built without etcd support; rebuild with `--features etcd`")
}

/// KV-node settings shared by `up` and `kn`.
#[derive(Debug, Args, Clone)]
pub struct KnArgs {
    /// Worker threads per KV node.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Cache bytes per KV node (values and shortcuts), e.g. 64MiB.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub cache: u64,
    /// Cache policy: dac, static-N (N% values), value-only or shortcut-only (default dac; with `up --system
    /// dinomo-s`, shortcut-only, the only one it takes).
    #[arg(long)]
    pub policy: Option<Policy>,
    /// Largest key, in bytes.
    #[arg(long, default_value_t = 4096)]
    pub max_key: usize,
    /// Largest value, e.g. 1MiB.
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub max_value: u64,
    /// Liveness lease in milliseconds: a node silent this long is declared failed (and stops serving itself).
    #[arg(long, default_value_t = 200)]
    pub lease_ms: u64,
    /// Heartbeat period in milliseconds.
    #[arg(long, default_value_t = 40)]
    pub heartbeat_ms: u64,
    /// Password Redis clients must give (AUTH, or HELLO ... AUTH default <password>); without one, RESP refuses
    /// to listen on a non-loopback address (Redis's protected mode).
    #[arg(long, env = "DINOMO_REQUIREPASS")]
    pub requirepass: Option<String>,
    /// Redis clients served at once per KV node; more are refused.
    #[arg(long, default_value_t = dinomo_resp::server::DEFAULT_MAX_CLIENTS)]
    pub resp_max_clients: usize,
    /// Seconds after which an idle Redis client is disconnected (0: never).
    #[arg(long, default_value_t = 0)]
    pub resp_timeout: u64,
}

impl KnArgs {
    fn node_config(&self, node_id: u32, listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            node_id,
            listen,
            advertise: None,
            kn: KnConfig {
                threads: self.threads,
                max_key_len: self.max_key,
                max_value_len: self.max_value as usize,
                cache: CacheConfig {
                    budget_bytes: self.cache / self.threads.max(1) as u64,
                    policy: self.policy.unwrap_or_default(),
                    ..CacheConfig::default()
                },
                ..KnConfig::default()
            },
            lease_ttl: Duration::from_millis(self.lease_ms),
            heartbeat: Duration::from_millis(self.heartbeat_ms),
            limits: ServerLimits::default(),
            resp_listen: None,
            resp: dinomo_resp::ServerConfig {
                requirepass: self.requirepass.clone(),
                max_clients: self.resp_max_clients,
                idle_timeout: Duration::from_secs(self.resp_timeout),
                ..dinomo_resp::ServerConfig::default()
            },
            ..NodeConfig::default()
        }
    }
}

/// The M-node's policy (paper §3.5, Table 4): shared by `up` and `mnode`. The defaults are the paper's.
#[derive(Debug, Args, Clone)]
pub struct PolicyArgs {
    /// Run the policy loop: add and remove KV nodes (and replicate hot keys) to keep the latency SLOs.
    #[arg(long)]
    pub autoscale: bool,
    /// Average-latency SLO in milliseconds.
    #[arg(long, default_value_t = 1.2)]
    pub slo_avg_ms: f64,
    /// 99th-percentile latency SLO in milliseconds.
    #[arg(long, default_value_t = 16.0)]
    pub slo_p99_ms: f64,
    /// Occupancy (busy share) above which a KV node is over-utilized.
    #[arg(long, default_value_t = 0.20)]
    pub over_utilization: f64,
    /// Occupancy below which a KV node is under-utilized.
    #[arg(long, default_value_t = 0.10)]
    pub under_utilization: f64,
    /// A key is hot above mean + N standard deviations of the access frequency.
    #[arg(long, default_value_t = 3.0)]
    pub hot_sigmas: f64,
    /// A replicated key is cold below mean - N standard deviations.
    #[arg(long, default_value_t = 1.0)]
    pub cold_sigmas: f64,
    /// Seconds between decisions.
    #[arg(long, default_value_t = 10.0)]
    pub decision_s: f64,
    /// Seconds after a membership change before the policy adds or removes another node.
    #[arg(long, default_value_t = 90.0)]
    pub grace_s: f64,
    /// Seconds between collections of the KV nodes' statistics (at most the decision period).
    #[arg(long, default_value_t = 5.0)]
    pub epoch_s: f64,
    /// Fewest KV nodes the policy leaves.
    #[arg(long, default_value_t = 1)]
    pub min_kns: usize,
    /// Most KV nodes the policy adds up to.
    #[arg(long, default_value_t = 16)]
    pub max_kns: usize,
    /// Highest replication factor for a hot key.
    #[arg(long, default_value_t = 8)]
    pub max_replication: u32,
    /// Leave replication alone (only add and remove nodes).
    #[arg(long)]
    pub no_selective_replication: bool,
}

fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{what} must be a positive number of seconds, not {s}"))
}

impl PolicyArgs {
    /// The autoscaler settings these flags describe (checked).
    pub fn config(&self) -> anyhow::Result<AutoscaleConfig> {
        let cfg = AutoscaleConfig {
            enabled: self.autoscale,
            policy: PolicyConfig {
                avg_latency_slo: seconds("--slo-avg-ms", self.slo_avg_ms / 1e3)?,
                tail_latency_slo: seconds("--slo-p99-ms", self.slo_p99_ms / 1e3)?,
                over_utilization_lower_bound: self.over_utilization,
                under_utilization_upper_bound: self.under_utilization,
                hotness_sigmas: self.hot_sigmas,
                coldness_sigmas: self.cold_sigmas,
                decision_period: seconds("--decision-s", self.decision_s)?,
                grace_period: Duration::try_from_secs_f64(self.grace_s)
                    .with_context(|| format!("--grace-s must be seconds, not {}", self.grace_s))?,
                min_nodes: self.min_kns,
                max_nodes: self.max_kns,
                max_replication: self.max_replication,
                selective_replication: !self.no_selective_replication,
                ..PolicyConfig::default()
            },
            monitoring_epoch: seconds("--epoch-s", self.epoch_s)?,
            ..AutoscaleConfig::default()
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }
}

/// `dinomo up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Which system of the DINOMO paper to run: dinomo, dinomo-s (a shortcut-only cache) or dinomo-n
    /// (shared-nothing: one index partition per KV node, data moved when ownership changes). A pool keeps the index
    /// layout it was formatted with: dinomo-n opens only a pool formatted for it, the others only one formatted
    /// for them.
    #[arg(long, default_value = "dinomo")]
    pub system: Variant,
    /// KV nodes.
    #[arg(long, default_value_t = 2)]
    pub kns: usize,
    /// Data directory (the pool file lives here); a restart on it serves everything written before.
    #[arg(long, default_value = "dinomo-data")]
    pub data_dir: PathBuf,
    /// Size of a new pool, e.g. 1GiB.
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    pub pool_size: u64,
    /// Durability: volatile, periodic (msync every second), durable or dax.
    #[arg(long, default_value = "periodic")]
    pub persist: PersistMode,
    /// Routing-node address (clients start here).
    #[arg(long, default_value = "127.0.0.1:7200")]
    pub rn_listen: SocketAddr,
    /// Injected fabric latency per round trip in nanoseconds (emulates a µs-scale network on one host).
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Where the KV nodes serve the Redis protocol: one address per node (comma-separated); nodes beyond the
    /// list take the ports after the last one (port 0: any free port each).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:6379")]
    pub resp_listen: Vec<SocketAddr>,
    /// Serve no Redis protocol.
    #[arg(long)]
    pub no_resp: bool,
    #[command(flatten)]
    pub kn: KnArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// `dinomo kn`.
#[derive(Debug, Args)]
pub struct KnCmdArgs {
    /// This node's id (it names its logs: a restart with the same id takes them back).
    #[arg(long)]
    pub node_id: u32,
    /// Native-protocol address.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub listen: SocketAddr,
    /// Serve the Redis protocol on this address too.
    #[arg(long)]
    pub resp_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub meta: MetaArgs,
    #[command(flatten)]
    pub kn: KnArgs,
}

/// `dinomo rn`.
#[derive(Debug, Args)]
pub struct RnArgs {
    /// Address to serve routing on.
    #[arg(long, default_value = "127.0.0.1:7200")]
    pub listen: SocketAddr,
    /// How often to re-read the cluster record, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub refresh_ms: u64,
    #[command(flatten)]
    pub meta: MetaArgs,
}

/// `dinomo mnode`.
#[derive(Debug, Args)]
pub struct MnodeArgs {
    /// Name in the M-node election (unique per M-node).
    #[arg(long, default_value = "mnode-1")]
    pub name: String,
    /// Leadership lease in milliseconds (a standby takes over this long after the leader dies).
    #[arg(long, default_value_t = 1000)]
    pub lease_ms: u64,
    #[command(flatten)]
    pub meta: MetaArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// `dinomo kv`: one operation against a running cluster.
#[derive(Debug, Args)]
pub struct KvArgs {
    /// A routing node (or any KV node).
    #[arg(long, default_value = "127.0.0.1:7200")]
    pub seed: String,
    #[command(subcommand)]
    pub op: KvOp,
}

/// Operations of `dinomo kv`.
#[derive(Debug, Subcommand)]
pub enum KvOp {
    /// Print a value.
    Get { key: String },
    /// Set a value.
    Set { key: String, value: String },
    /// Delete a key.
    Del { key: String },
    /// Add to an integer value.
    Incr {
        key: String,
        #[arg(default_value_t = 1, allow_hyphen_values = true)]
        delta: i64,
    },
    /// Print the routing table.
    Routing,
}

fn signals() -> anyhow::Result<signal_hook::iterator::Signals> {
    signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("installing signal handlers")
}

fn wait_for_signal(mut s: signal_hook::iterator::Signals) {
    let signal = s.forever().next();
    tracing::info!(?signal, "stopping");
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let policy = args
        .system
        .cache_policy(args.kn.policy)
        .map_err(anyhow::Error::msg)
        .context("--policy")?;
    let mut cfg = LocalClusterConfig {
        pool_path: Some(args.data_dir.join("pool")),
        pool_size: args.pool_size,
        persist: args.persist,
        processor: ProcessorConfig::default(),
        kns: args.kns,
        node: args
            .kn
            .node_config(0, SocketAddr::from(([127, 0, 0, 1], 0))),
        mnode: MNodeConfig::default(),
        rn_listen: args.rn_listen,
        injected_latency_ns: args.latency_ns,
        resp_listen: if args.no_resp {
            Vec::new()
        } else {
            args.resp_listen.clone()
        },
        autoscale: args.policy.config()?,
        ..LocalClusterConfig::default()
    };
    cfg.node.kn.cache.policy = policy;
    args.system.configure(&mut cfg);
    let cluster = LocalCluster::start(cfg).context("starting the cluster")?;
    println!(
        "dinomo up ({}): routing node on {}",
        args.system,
        cluster.rn_addr()
    );
    for n in cluster.nodes().iter() {
        match n.resp_addr() {
            Some(resp) => println!(
                "  KV node {} on {}, Redis protocol on {resp}",
                n.id(),
                n.addr()
            ),
            None => println!("  KV node {} on {}", n.id(), n.addr()),
        }
    }
    let s = cluster.processor().stats();
    println!(
        "  memory node: pool {} ({} keys, {} bytes free)",
        args.data_dir.join("pool").display(),
        s.index_entries,
        s.pool_free_bytes
    );
    if cluster.autoscaler().is_some() {
        println!("  autoscaler on (the M-node adds and removes KV nodes to keep the latency SLOs)");
    }
    wait_for_signal(signals);
    cluster.stop();
    println!("dinomo up stopped cleanly");
    Ok(())
}

pub fn kn(args: KnCmdArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let meta = args.meta.store()?;
    let config = NodeConfig {
        resp_listen: args.resp_listen,
        ..args.kn.node_config(args.node_id, args.listen)
    };
    let node =
        ClusterNode::start(config, args.meta.connector(), meta).context("starting the KV node")?;
    println!("dinomo kn {} listening on {}", node.id(), node.addr());
    if let Some(resp) = node.resp_addr() {
        println!("  Redis protocol on {resp}");
    }
    wait_for_signal(signals);
    node.stop();
    println!("dinomo kn stopped cleanly");
    Ok(())
}

pub fn rn(args: RnArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let rn = RoutingNode::start(
        args.listen,
        args.meta.store()?,
        Duration::from_millis(args.refresh_ms),
        ServerLimits::default(),
    )?;
    println!("dinomo rn listening on {}", rn.local_addr());
    wait_for_signal(signals);
    drop(rn);
    println!("dinomo rn stopped cleanly");
    Ok(())
}

pub fn mnode(args: MnodeArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let autoscale = args.policy.config()?;
    let meta = args.meta.store()?;
    let m = Arc::new(MNode::start(
        MNodeConfig {
            name: args.name.clone(),
            lease_ttl: Duration::from_millis(args.lease_ms),
            ..MNodeConfig::default()
        },
        meta.clone(),
        args.meta.connector(),
    )?);
    // This M-node cannot start KV-node processes: the policy removes nodes and changes replication, and an
    // add it decides on is logged as refused (start a `dinomo kn` by hand).
    let autoscaler = if autoscale.enabled {
        Some(Autoscaler::start(
            autoscale,
            meta,
            m.clone(),
            Arc::new(ManualScaler),
        )?)
    } else {
        None
    };
    println!(
        "dinomo mnode {} running{}",
        args.name,
        if autoscaler.is_some() {
            " with the autoscaler"
        } else {
            ""
        }
    );
    wait_for_signal(signals);
    drop(autoscaler);
    drop(m);
    println!("dinomo mnode stopped cleanly");
    Ok(())
}

pub fn kv(args: KvArgs) -> anyhow::Result<()> {
    let mut c = Client::connect(ClientConfig {
        seeds: vec![args.seed],
        ..ClientConfig::default()
    })?;
    match args.op {
        KvOp::Get { key } => match c.get(key.as_bytes())? {
            Some(v) => println!("{}", String::from_utf8_lossy(&v)),
            None => println!("(nil)"),
        },
        KvOp::Set { key, value } => {
            c.set(key.as_bytes(), value.as_bytes())?;
            println!("OK");
        }
        KvOp::Del { key } => println!("{}", u8::from(c.delete(key.as_bytes())?)),
        KvOp::Incr { key, delta } => println!("{}", c.incr(key.as_bytes(), delta)?),
        KvOp::Routing => {
            let r = c.routing().context("no routing table")?;
            println!("epoch {}", r.epoch());
            for (id, share) in r.ring.shares() {
                println!(
                    "  node {id} at {} owns {:.1}%",
                    r.addrs.get(&id).map_or("?", String::as_str),
                    share * 100.0
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    #[derive(Debug, Parser)]
    struct UpCli {
        #[command(flatten)]
        up: UpArgs,
    }

    #[test]
    fn up_runs_the_system_it_is_asked_for() {
        let up = |args: &[&str]| {
            UpCli::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
        };
        assert_eq!(up(&[]).unwrap().up.system, Variant::Dinomo);
        let n = up(&["--system", "dinomo-n"]).unwrap().up;
        assert_eq!(n.system, Variant::DinomoN);
        assert_eq!(
            n.system.cache_policy(n.kn.policy),
            Ok(Policy::Adaptive),
            "DINOMO-N caches with DAC"
        );
        let s = up(&["--system", "dinomo-s", "--policy", "value-only"])
            .unwrap()
            .up;
        assert!(s.system.cache_policy(s.kn.policy).is_err());
        assert!(up(&["--system", "clover"]).is_err());
    }

    #[test]
    fn policy_flags_default_to_the_policy_defaults() {
        let cfg = Cli::parse_from(["dinomo"]).policy.config().unwrap();
        assert_eq!(cfg, AutoscaleConfig::default());
        let cfg = Cli::parse_from([
            "dinomo",
            "--autoscale",
            "--slo-avg-ms",
            "0.5",
            "--grace-s",
            "0",
            "--no-selective-replication",
        ])
        .policy
        .config()
        .unwrap();
        assert!(cfg.enabled && !cfg.policy.selective_replication);
        assert_eq!(cfg.policy.avg_latency_slo, Duration::from_micros(500));
        assert!(cfg.policy.grace_period.is_zero());
        let bad = Cli::parse_from(["dinomo", "--under-utilization", "0.5"]);
        assert!(bad.policy.config().is_err());
        let negative = Cli::try_parse_from(["dinomo", "--slo-p99-ms=-1"]).unwrap();
        assert!(negative.policy.config().is_err());
    }
}
