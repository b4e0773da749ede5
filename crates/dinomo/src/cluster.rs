//! `dinomo up`, `dinomo kn`, `dinomo rn`, `dinomo mnode` and `dinomo kv`: a whole cluster in one process, or its
//! parts as separate processes that meet through the memory node (or etcd).
//!
//! Every flag of a process-starting command is optional: a flag given overrides the configuration file
//! (`--config`), which overrides the defaults ([`Config::default`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use dinomo_cache::Policy;
use dinomo_cluster::metrics::{FabricMetrics, MetricsSource, RecordMetrics};
use dinomo_cluster::{
    AutoscaleConfig, Autoscaler, Client, ClientConfig, ClusterNode, LocalCluster,
    LocalClusterConfig, MNode, ManualScaler, NodeConfig, RoutingNode,
};
use dinomo_fabric::{Connector, EndpointConfig, Target};
use dinomo_meta::{MetaStore, RemoteMeta};
use dinomo_pool::PersistMode;

use crate::config::{Config, ConfigArgs, ConfigErrors, UpSystem};
use crate::pdpm::Baseline;
use crate::size::parse_size;

/// Where the cluster metadata lives.
#[derive(Debug, Args, Clone, Default)]
pub struct MetaArgs {
    /// The memory node (`dinomo dpm`) to use; it also keeps the cluster record unless --etcd is given
    /// [cluster.dpm; default 127.0.0.1:7100].
    #[arg(long)]
    pub dpm: Option<SocketAddr>,
    /// Keep the cluster record, leases and the M-node election in etcd instead (comma-separated endpoints)
    /// [cluster.etcd].
    #[arg(long, value_delimiter = ',')]
    pub etcd: Option<Vec<String>>,
    /// Key prefix in etcd [cluster.etcd_prefix; default /dinomo/].
    #[arg(long)]
    pub etcd_prefix: Option<String>,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
}

impl MetaArgs {
    fn apply(&self, cfg: &mut Config) {
        if let Some(dpm) = self.dpm {
            cfg.cluster.dpm = dpm;
        }
        if let Some(etcd) = &self.etcd {
            cfg.cluster.etcd = etcd.clone();
        }
        if let Some(prefix) = &self.etcd_prefix {
            cfg.cluster.etcd_prefix = prefix.clone();
        }
        self.token.apply(cfg);
    }
}

/// The memory node's fabric as the settings describe it. Every call in a process gives a clone of one connector
/// per memory-node address, so the whole process (its nodes, their restarts in place, its metadata store) holds on
/// to the pool it reached first and refuses another one behind the same address.
pub fn connector(cfg: &Config) -> Connector {
    static CONNECTORS: OnceLock<Mutex<HashMap<SocketAddr, Connector>>> = OnceLock::new();
    let mut connectors = CONNECTORS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut c = connectors
        .entry(cfg.cluster.dpm)
        .or_insert_with(|| Connector::new(Target::Tcp(cfg.cluster.dpm)))
        .clone();
    c.config = endpoint(cfg);
    c
}

/// The fabric endpoints' settings, presenting the cluster token.
fn endpoint(cfg: &Config) -> EndpointConfig {
    EndpointConfig {
        cluster_token: cfg.fabric.token.clone(),
        ..cfg.fabric.endpoint.clone()
    }
}

fn store(cfg: &Config) -> anyhow::Result<Arc<dyn MetaStore>> {
    if cfg.cluster.etcd.is_empty() {
        return Ok(Arc::new(RemoteMeta::new(connector(cfg))));
    }
    etcd_store(&cfg.cluster.etcd, &cfg.cluster.etcd_prefix)
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
#[derive(Debug, Args, Clone, Default)]
pub struct KnArgs {
    /// Worker threads per KV node [kn.workers.threads; default 2].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Cache bytes per KV node (values and shortcuts), e.g. 64MiB, divided among its workers
    /// [kn.workers.cache.budget_bytes per worker; default 32MiB each].
    #[arg(long, value_parser = parse_size)]
    pub cache: Option<u64>,
    /// Cache policy: dac, static-N (N% values), value-only or shortcut-only [kn.workers.cache.policy; default dac;
    /// with `up --system dinomo-s`, shortcut-only, the only one it takes].
    #[arg(long)]
    pub policy: Option<Policy>,
    /// Largest key, in bytes [kn.workers.max_key_len; default 4096; for a pDPM baseline up.pdpm.max_key, default
    /// 64].
    #[arg(long)]
    pub max_key: Option<usize>,
    /// Largest value, e.g. 1MiB [kn.workers.max_value_len; default 1MiB; for a pDPM baseline up.pdpm.max_value,
    /// default 1KiB].
    #[arg(long, value_parser = parse_size)]
    pub max_value: Option<u64>,
    /// Liveness lease in milliseconds: a node silent this long is declared failed (and stops serving itself)
    /// [kn.lease_ttl; default 200].
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Heartbeat period in milliseconds [kn.heartbeat; default 40].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Password Redis clients must give (AUTH, or HELLO ... AUTH default <password>); without one, RESP refuses
    /// to listen on a non-loopback address (Redis's protected mode) [kn.resp.requirepass].
    #[arg(long, env = "DINOMO_REQUIREPASS", hide_env_values = true)]
    pub requirepass: Option<String>,
    /// Redis clients served at once per KV node; more are refused [kn.resp.max_clients; default 10000].
    #[arg(long)]
    pub resp_max_clients: Option<usize>,
    /// Seconds after which an idle Redis client is disconnected (0: never) [kn.resp.idle_timeout; default 0].
    #[arg(long)]
    pub resp_timeout: Option<u64>,
}

impl KnArgs {
    fn apply(&self, node: &mut NodeConfig) -> anyhow::Result<()> {
        let kn = &mut node.kn;
        if let Some(t) = self.threads {
            kn.threads = t;
        }
        if let Some(bytes) = self.cache {
            kn.cache.budget_bytes = bytes / kn.threads.max(1) as u64;
        }
        if let Some(p) = self.policy {
            kn.cache.policy = p;
        }
        if let Some(k) = self.max_key {
            kn.max_key_len = k;
        }
        if let Some(v) = self.max_value {
            kn.max_value_len =
                usize::try_from(v).context("--max-value does not fit this machine's memory")?;
        }
        if let Some(ms) = self.lease_ms {
            node.lease_ttl = Duration::from_millis(ms);
        }
        if let Some(ms) = self.heartbeat_ms {
            node.heartbeat = Duration::from_millis(ms);
        }
        self.apply_resp(&mut node.resp);
        Ok(())
    }

    /// Applies the Redis listener's flags (password, client limit, idle timeout).
    fn apply_resp(&self, resp: &mut dinomo_resp::ServerConfig) {
        if let Some(p) = &self.requirepass {
            resp.requirepass = Some(p.clone());
        }
        if let Some(n) = self.resp_max_clients {
            resp.max_clients = n;
        }
        if let Some(s) = self.resp_timeout {
            resp.idle_timeout = Duration::from_secs(s);
        }
    }
}

/// The M-node's policy (paper §3.5, Table 4): shared by `up` and `mnode`. The defaults are the paper's.
#[derive(Debug, Args, Clone, Default)]
pub struct PolicyArgs {
    /// Run the policy loop: add and remove KV nodes (and replicate hot keys) to keep the latency SLOs
    /// [autoscale.enabled].
    #[arg(long)]
    pub autoscale: bool,
    /// Average-latency SLO in milliseconds [autoscale.policy.avg_latency_slo; default 1.2].
    #[arg(long)]
    pub slo_avg_ms: Option<f64>,
    /// 99th-percentile latency SLO in milliseconds [autoscale.policy.tail_latency_slo; default 16].
    #[arg(long)]
    pub slo_p99_ms: Option<f64>,
    /// Occupancy (busy share) above which a KV node is over-utilized
    /// [autoscale.policy.over_utilization_lower_bound; default 0.20].
    #[arg(long)]
    pub over_utilization: Option<f64>,
    /// Occupancy below which a KV node is under-utilized [autoscale.policy.under_utilization_upper_bound; default
    /// 0.10].
    #[arg(long)]
    pub under_utilization: Option<f64>,
    /// A key is hot above mean + N standard deviations of the access frequency [autoscale.policy.hotness_sigmas;
    /// default 3].
    #[arg(long)]
    pub hot_sigmas: Option<f64>,
    /// A replicated key is cold below mean - N standard deviations [autoscale.policy.coldness_sigmas; default 1].
    #[arg(long)]
    pub cold_sigmas: Option<f64>,
    /// Seconds between decisions [autoscale.policy.decision_period; default 10].
    #[arg(long)]
    pub decision_s: Option<f64>,
    /// Seconds after a membership change before the policy adds or removes another node
    /// [autoscale.policy.grace_period; default 90].
    #[arg(long)]
    pub grace_s: Option<f64>,
    /// Seconds between collections of the KV nodes' statistics (at most the decision period)
    /// [autoscale.monitoring_epoch; default 5].
    #[arg(long)]
    pub epoch_s: Option<f64>,
    /// Fewest KV nodes the policy leaves [autoscale.policy.min_nodes; default 1].
    #[arg(long)]
    pub min_kns: Option<usize>,
    /// Most KV nodes the policy adds up to [autoscale.policy.max_nodes; default 16].
    #[arg(long)]
    pub max_kns: Option<usize>,
    /// Highest replication factor for a hot key [autoscale.policy.max_replication; default 8].
    #[arg(long)]
    pub max_replication: Option<u32>,
    /// Leave replication alone (only add and remove nodes) [autoscale.policy.selective_replication = false].
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
    /// Applies the flags given to `cfg` (checked with the rest of the configuration).
    pub fn apply(&self, cfg: &mut AutoscaleConfig) -> anyhow::Result<()> {
        let p = &mut cfg.policy;
        if self.autoscale {
            cfg.enabled = true;
        }
        if let Some(ms) = self.slo_avg_ms {
            p.avg_latency_slo = seconds("--slo-avg-ms", ms / 1e3)?;
        }
        if let Some(ms) = self.slo_p99_ms {
            p.tail_latency_slo = seconds("--slo-p99-ms", ms / 1e3)?;
        }
        if let Some(o) = self.over_utilization {
            p.over_utilization_lower_bound = o;
        }
        if let Some(u) = self.under_utilization {
            p.under_utilization_upper_bound = u;
        }
        if let Some(s) = self.hot_sigmas {
            p.hotness_sigmas = s;
        }
        if let Some(s) = self.cold_sigmas {
            p.coldness_sigmas = s;
        }
        if let Some(s) = self.decision_s {
            p.decision_period = seconds("--decision-s", s)?;
        }
        if let Some(s) = self.grace_s {
            p.grace_period = Duration::try_from_secs_f64(s)
                .with_context(|| format!("--grace-s must be seconds, not {s}"))?;
        }
        if let Some(n) = self.min_kns {
            p.min_nodes = n;
        }
        if let Some(n) = self.max_kns {
            p.max_nodes = n;
        }
        if let Some(r) = self.max_replication {
            p.max_replication = r;
        }
        if self.no_selective_replication {
            p.selective_replication = false;
        }
        if let Some(s) = self.epoch_s {
            cfg.monitoring_epoch = seconds("--epoch-s", s)?;
        }
        Ok(())
    }
}

/// `dinomo up`.
#[derive(Debug, Args, Default)]
pub struct UpArgs {
    /// Which system to run: dinomo, dinomo-s (a shortcut-only cache) or dinomo-n (shared-nothing: one index
    /// partition per KV node, data moved when ownership changes) of the DINOMO paper; or a pDPM baseline:
    /// directds, directds-c, centralds or clover (its memory nodes and a Redis listener, see --memory-nodes). A pool keeps
    /// the index layout it was formatted with: dinomo-n opens only a pool formatted for it, the others only one
    /// formatted for them [up.system; default dinomo].
    #[arg(long)]
    pub system: Option<UpSystem>,
    /// pDPM baselines only: memory nodes, each a pool file in the data directory [up.pdpm.memory_nodes; default
    /// 1].
    #[arg(long)]
    pub memory_nodes: Option<usize>,
    /// pDPM baselines only: copies of every value, on distinct memory nodes [up.pdpm.replication; default 1].
    #[arg(long)]
    pub replication: Option<u32>,
    /// pDPM baselines only: keys the memory nodes are sized for when they are formatted [up.pdpm.keys; default
    /// 16384].
    #[arg(long)]
    pub keys: Option<u64>,
    /// KV nodes [up.kns; default 2].
    #[arg(long)]
    pub kns: Option<usize>,
    /// Data directory: the pool file is DIR/pool, and a restart on it serves everything written before
    /// [pool.path; default dinomo-data/pool].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Size of a new pool, e.g. 1GiB [pool.size; default 1GiB].
    #[arg(long, value_parser = parse_size)]
    pub pool_size: Option<u64>,
    /// Free pool space kept faulted in ahead of the log writers, e.g. 64MiB; 0 turns it off
    /// [pool.prefault_ahead; default 32MiB].
    #[arg(long, value_parser = parse_size)]
    pub prefault_ahead: Option<u64>,
    /// Durability: volatile, periodic (msync every second), durable or dax [pool.persist; default periodic].
    #[arg(long)]
    pub persist: Option<PersistMode>,
    /// Routing-node address (clients start here) [rn.listen; default 127.0.0.1:7200].
    #[arg(long)]
    pub rn_listen: Option<SocketAddr>,
    /// Injected fabric latency per round trip in nanoseconds (emulates a µs-scale network on one host)
    /// [fabric.endpoint.injected_latency_ns; default 0].
    #[arg(long)]
    pub latency_ns: Option<u64>,
    /// Where the KV nodes serve the Redis protocol: one address per node (comma-separated); nodes beyond the
    /// list take the ports after the last one (port 0: any free port each) [up.resp_listen; default
    /// 127.0.0.1:6379].
    #[arg(long, value_delimiter = ',')]
    pub resp_listen: Option<Vec<SocketAddr>>,
    /// Serve no Redis protocol [up.resp = false].
    #[arg(long)]
    pub no_resp: bool,
    #[command(flatten)]
    pub kn: KnArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl UpArgs {
    /// The settings: the defaults, then the configuration file, then the flags given.
    pub fn settings(&self) -> anyhow::Result<Config> {
        let loaded = self.config.load()?;
        let mut cfg = loaded.config.clone();
        if let Some(system) = self.system {
            cfg.up.system = system;
        }
        if let UpSystem::Pdpm(baseline) = cfg.up.system {
            return self.pdpm_settings(cfg, baseline);
        }
        let pdpm_only = given([
            ("--memory-nodes", self.memory_nodes.is_some()),
            ("--replication", self.replication.is_some()),
            ("--keys", self.keys.is_some()),
        ]);
        anyhow::ensure!(
            pdpm_only.is_empty(),
            "{} applies only to the pDPM baselines (directds, directds-c, centralds, clover), not to {}",
            pdpm_only.join(", "),
            cfg.up.system
        );
        self.apply_shared(&mut cfg);
        if let Some(n) = self.kns {
            cfg.up.kns = n;
        }
        if let Some(size) = self.pool_size {
            cfg.pool.size = size;
        }
        if let Some(bytes) = self.prefault_ahead {
            cfg.pool.prefault_ahead = bytes;
        }
        if let Some(l) = self.rn_listen {
            cfg.rn.listen = l;
        }
        if self.no_resp {
            cfg.up.resp = false;
        }
        self.kn.apply(&mut cfg.kn)?;
        self.policy.apply(&mut cfg.autoscale)?;
        // The system sets what the file and the flags left alone; what they set must suit it.
        let set = |key: &str| {
            loaded.file_sets(key) || (key == "kn.workers.cache.policy" && self.kn.policy.is_some())
        };
        ConfigErrors::fail_if_any(&self.config.source(), cfg.apply_system(set))?;
        Ok(cfg.checked(&self.config.source())?)
    }
}

impl UpArgs {
    /// Applies the flags every system takes: data directory, durability, fabric latency, Redis addresses.
    fn apply_shared(&self, cfg: &mut Config) {
        if let Some(dir) = &self.data_dir {
            cfg.pool.path = dir.join("pool");
        }
        if let Some(p) = self.persist {
            cfg.pool.persist = p;
        }
        if let Some(ns) = self.latency_ns {
            cfg.fabric.endpoint.injected_latency_ns = ns;
        }
        if let Some(l) = &self.resp_listen {
            cfg.up.resp_listen = l.clone();
        }
        self.token.apply(cfg);
    }

    /// The flags given that only the DINOMO systems have.
    fn dinomo_only_flags(&self) -> Vec<&'static str> {
        let (k, p) = (&self.kn, &self.policy);
        given([
            ("--kns", self.kns.is_some()),
            ("--pool-size", self.pool_size.is_some()),
            ("--prefault-ahead", self.prefault_ahead.is_some()),
            ("--rn-listen", self.rn_listen.is_some()),
            ("--no-resp", self.no_resp),
            ("--threads", k.threads.is_some()),
            ("--cache", k.cache.is_some()),
            ("--policy", k.policy.is_some()),
            ("--lease-ms", k.lease_ms.is_some()),
            ("--heartbeat-ms", k.heartbeat_ms.is_some()),
            ("--autoscale", p.autoscale),
            ("--slo-avg-ms", p.slo_avg_ms.is_some()),
            ("--slo-p99-ms", p.slo_p99_ms.is_some()),
            ("--over-utilization", p.over_utilization.is_some()),
            ("--under-utilization", p.under_utilization.is_some()),
            ("--hot-sigmas", p.hot_sigmas.is_some()),
            ("--cold-sigmas", p.cold_sigmas.is_some()),
            ("--decision-s", p.decision_s.is_some()),
            ("--grace-s", p.grace_s.is_some()),
            ("--epoch-s", p.epoch_s.is_some()),
            ("--min-kns", p.min_kns.is_some()),
            ("--max-kns", p.max_kns.is_some()),
            ("--max-replication", p.max_replication.is_some()),
            ("--no-selective-replication", p.no_selective_replication),
        ])
    }

    /// The settings of a pDPM baseline: the flags it shares with DINOMO (data directory, durability, fabric
    /// latency, the Redis listener and its password and limits, key and value limits) and its own.
    fn pdpm_settings(&self, mut cfg: Config, baseline: Baseline) -> anyhow::Result<Config> {
        let refused = self.dinomo_only_flags();
        anyhow::ensure!(
            refused.is_empty(),
            "{} applies only to the DINOMO systems (dinomo, dinomo-s, dinomo-n), not to {baseline}",
            refused.join(", ")
        );
        self.apply_shared(&mut cfg);
        let pdpm = &mut cfg.up.pdpm;
        if let Some(n) = self.memory_nodes {
            pdpm.memory_nodes = n;
        }
        if let Some(r) = self.replication {
            pdpm.replication = r;
        }
        if let Some(k) = self.keys {
            pdpm.keys = k;
        }
        if let Some(k) = self.kn.max_key {
            pdpm.max_key = u32::try_from(k).context("--max-key is too large")?;
        }
        if let Some(v) = self.kn.max_value {
            pdpm.max_value = u32::try_from(v).context("--max-value is too large for a baseline")?;
        }
        self.kn.apply_resp(&mut cfg.kn.resp);
        let mut errors = Vec::new();
        if cfg.up.resp_listen.len() != 1 {
            errors.push(format!(
                "up.resp_listen: {baseline} serves the Redis protocol on one address, not {}",
                cfg.up.resp_listen.len()
            ));
        }
        if !cfg.up.resp {
            errors.push(format!(
                "up.resp: {baseline} is served only over the Redis protocol"
            ));
        }
        if cfg.metrics.listen.is_some() {
            errors.push(format!(
                "metrics.listen: metrics are served for the DINOMO systems only, not for {baseline}"
            ));
        }
        ConfigErrors::fail_if_any(&self.config.source(), errors)?;
        Ok(cfg.checked(&self.config.source())?)
    }
}

/// The flags of `flags` that were given, in order.
fn given<const N: usize>(flags: [(&'static str, bool); N]) -> Vec<&'static str> {
    flags
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
}

/// `dinomo kn`.
#[derive(Debug, Args, Default)]
pub struct KnCmdArgs {
    /// This node's id (it names its logs: a restart with the same id takes them back) [kn.node_id; required here
    /// or in the file].
    #[arg(long)]
    pub node_id: Option<u32>,
    /// Native-protocol address [kn.listen; default 127.0.0.1:0].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve the Redis protocol on this address too [kn.resp_listen].
    #[arg(long)]
    pub resp_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub meta: MetaArgs,
    #[command(flatten)]
    pub kn: KnArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl KnCmdArgs {
    /// The settings: the defaults, then the configuration file, then the flags given.
    pub fn settings(&self) -> anyhow::Result<Config> {
        let loaded = self.config.load()?;
        if self.node_id.is_none() && !loaded.file_sets("kn.node_id") {
            anyhow::bail!(
                "a KV node needs an id: give --node-id, or kn.node_id in the configuration file"
            );
        }
        let mut cfg = loaded.config;
        if let Some(id) = self.node_id {
            cfg.kn.node_id = id;
        }
        if let Some(l) = self.listen {
            cfg.kn.listen = l;
        }
        if let Some(l) = self.resp_listen {
            cfg.kn.resp_listen = Some(l);
        }
        self.meta.apply(&mut cfg);
        self.kn.apply(&mut cfg.kn)?;
        Ok(cfg.checked(&self.config.source())?)
    }
}

/// `dinomo rn`.
#[derive(Debug, Args, Default)]
pub struct RnArgs {
    /// Address to serve routing on [rn.listen; default 127.0.0.1:7200].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// How often to re-read the cluster record, in milliseconds [rn.refresh; default 5].
    #[arg(long)]
    pub refresh_ms: Option<u64>,
    #[command(flatten)]
    pub meta: MetaArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl RnArgs {
    /// The settings: the defaults, then the configuration file, then the flags given.
    pub fn settings(&self) -> anyhow::Result<Config> {
        let mut cfg = self.config.load()?.config;
        if let Some(l) = self.listen {
            cfg.rn.listen = l;
        }
        if let Some(ms) = self.refresh_ms {
            cfg.rn.refresh = Duration::from_millis(ms);
        }
        self.meta.apply(&mut cfg);
        Ok(cfg.checked(&self.config.source())?)
    }
}

/// `dinomo mnode`.
#[derive(Debug, Args, Default)]
pub struct MnodeArgs {
    /// Name in the M-node election (unique per M-node) [mnode.name; default mnode-1].
    #[arg(long)]
    pub name: Option<String>,
    /// Leadership lease in milliseconds (a standby takes over this long after the leader dies)
    /// [mnode.lease_ttl; default 1000].
    #[arg(long)]
    pub lease_ms: Option<u64>,
    #[command(flatten)]
    pub meta: MetaArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
}

impl MnodeArgs {
    /// The settings: the defaults, then the configuration file, then the flags given.
    pub fn settings(&self) -> anyhow::Result<Config> {
        let mut cfg = self.config.load()?.config;
        if let Some(n) = &self.name {
            cfg.mnode.name = n.clone();
        }
        if let Some(ms) = self.lease_ms {
            cfg.mnode.lease_ttl = Duration::from_millis(ms);
        }
        self.meta.apply(&mut cfg);
        self.policy.apply(&mut cfg.autoscale)?;
        Ok(cfg.checked(&self.config.source())?)
    }
}

/// `dinomo status`: the cluster at a glance.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A routing node (or any KV node).
    #[arg(long, default_value = "127.0.0.1:7200")]
    pub seed: String,
    /// Milliseconds over which each node's load and hit ratio are sampled.
    #[arg(long, default_value_t = 1000)]
    pub window_ms: u64,
    /// Milliseconds each node may take to answer.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.timeout_ms > 0, "--timeout-ms must be above zero");
    let s = dinomo_cluster::status::collect(
        &args.seed,
        args.token.value.as_deref().unwrap_or_default(),
        Duration::from_millis(args.window_ms),
        Duration::from_millis(args.timeout_ms),
    )
    .with_context(|| format!("asking {} for the cluster", args.seed))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.table());
    }
    Ok(())
}

/// `dinomo kv`: one operation against a running cluster.
#[derive(Debug, Args)]
pub struct KvArgs {
    /// A routing node (or any KV node).
    #[arg(long, default_value = "127.0.0.1:7200")]
    pub seed: String,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
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
    /// Print the keys that match a Redis glob pattern, one per line (a whole walk, as `KEYS`).
    Keys {
        #[arg(default_value = "*")]
        pattern: String,
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

/// Waits for SIGINT or SIGTERM (true) or until `done` says so (false), asking it every 50 ms.
fn wait_for_signal_or(s: &mut signal_hook::iterator::Signals, done: impl Fn() -> bool) -> bool {
    loop {
        if let Some(signal) = s.pending().next() {
            tracing::info!(?signal, "stopping");
            return true;
        }
        if done() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The in-process cluster the settings describe.
pub fn local_cluster_config(cfg: &Config) -> LocalClusterConfig {
    LocalClusterConfig {
        pool_path: Some(cfg.pool.path.clone()),
        pool_size: cfg.pool.size,
        persist: cfg.pool.persist,
        pool_prefault_ahead: cfg.pool.prefault_ahead,
        processor: cfg.processor.clone(),
        kns: cfg.up.kns,
        // Each KV node listens on a free port; the routing table tells clients where.
        node: NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..cfg.kn.clone()
        },
        mnode: cfg.mnode.clone(),
        rn_listen: cfg.rn.listen,
        rn_refresh: cfg.rn.refresh,
        rn_limits: cfg.rn.limits.clone(),
        memory_node: memory_node(cfg),
        meta: cfg.dpm.meta.clone(),
        injected_latency_ns: cfg.fabric.endpoint.injected_latency_ns,
        resp_listen: if cfg.up.resp {
            cfg.up.resp_listen.clone()
        } else {
            Vec::new()
        },
        autoscale: cfg.autoscale.clone(),
        node_start_timeout: cfg.up.node_start_timeout,
        retire_quiet: cfg.up.retire_quiet,
        retire_max: cfg.up.retire_max,
    }
}

/// The memory node's fabric side as the settings describe it, with the cluster token it requires.
fn memory_node(cfg: &Config) -> dinomo_fabric::NodeConfig {
    dinomo_fabric::NodeConfig {
        cluster_token: cfg.fabric.token.clone(),
        ..cfg.dpm.node.clone()
    }
}

/// Creates the directory a pool file lives in.
pub fn create_parent_dir(path: &std::path::Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// What a Redis client's `SHUTDOWN` does to a `dinomo up` or `dinomo kn` process: what SIGTERM does (a clean
/// stop).
fn stop_like_sigterm() -> dinomo_resp::ShutdownHook {
    dinomo_resp::ShutdownHook::new(|| {
        if let Err(e) = signal_hook::low_level::raise(signal_hook::consts::SIGTERM) {
            tracing::error!(error = %e, "SHUTDOWN could not raise SIGTERM");
        }
    })
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let mut cfg = args.settings()?;
    cfg.kn.resp.shutdown = Some(stop_like_sigterm());
    if let UpSystem::Pdpm(baseline) = cfg.up.system {
        return up_pdpm(&cfg, baseline, signals);
    }
    create_parent_dir(&cfg.pool.path)?;
    let cluster =
        LocalCluster::start(local_cluster_config(&cfg)).context("starting the cluster")?;
    println!("dinomo up: routing node on {}", cluster.rn_addr());
    println!("  system {}", cfg.up.system);
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
        cfg.pool.path.display(),
        s.index_entries,
        s.pool_free_bytes
    );
    if cluster.autoscaler().is_some() {
        println!("  autoscaler on (the M-node adds and removes KV nodes to keep the latency SLOs)");
    }
    let metrics = cfg.metrics.serve(|| cluster.metrics())?;
    wait_for_signal(signals);
    // The endpoint reads the cluster: it goes first.
    drop(metrics);
    cluster.stop();
    println!("dinomo up stopped cleanly");
    Ok(())
}

/// `dinomo up` of a pDPM baseline.
fn up_pdpm(
    cfg: &Config,
    baseline: Baseline,
    signals: signal_hook::iterator::Signals,
) -> anyhow::Result<()> {
    let data_dir = cfg
        .pool
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    let listen = cfg
        .up
        .resp_listen
        .first()
        .copied()
        .context("up.resp_listen is empty")?;
    let (running, nodes) = crate::pdpm::start(crate::pdpm::StartOptions {
        system: baseline,
        pdpm: cfg.up.pdpm.clone(),
        data_dir,
        persist: cfg.pool.persist,
        endpoint: endpoint(cfg),
        node: memory_node(cfg),
        resp: dinomo_resp::ServerConfig {
            listen,
            ..cfg.kn.resp.clone()
        },
    })
    .with_context(|| format!("starting {baseline}"))?;
    println!(
        "dinomo up: {baseline}, Redis protocol on {}",
        running.resp_addr()
    );
    for (i, n) in nodes.iter().enumerate() {
        println!(
            "  memory node {i}: pool {} ({})",
            n.path.display(),
            if n.formatted { "formatted" } else { "reopened" }
        );
    }
    let p = &cfg.up.pdpm;
    println!(
        "  replication {}, keys up to {} bytes, values up to {} bytes",
        p.replication, p.max_key, p.max_value
    );
    wait_for_signal(signals);
    running.stop()?;
    println!("dinomo up stopped cleanly");
    Ok(())
}

pub fn kn(args: KnCmdArgs) -> anyhow::Result<()> {
    let mut signals = signals()?;
    let mut cfg = args.settings()?;
    cfg.kn.resp.shutdown = Some(stop_like_sigterm());
    let meta = store(&cfg)?;
    let mut node_cfg = cfg.kn.clone();
    let mut starting = "starting the KV node";
    loop {
        let node = ClusterNode::start(node_cfg, connector(&cfg), meta.clone()).context(starting)?;
        println!("dinomo kn {} listening on {}", node.id(), node.addr());
        if let Some(resp) = node.resp_addr() {
            println!("  Redis protocol on {resp}");
        }
        let metrics = cfg
            .metrics
            .serve(|| vec![Arc::new(node.metrics()), Arc::new(FabricMetrics)])?;
        let signalled = wait_for_signal_or(&mut signals, || node.is_fenced());
        drop(metrics);
        if signalled {
            node.stop();
            println!("dinomo kn stopped cleanly");
            return Ok(());
        }
        // The cluster declared this incarnation failed and may have handed its keys to others: start again
        // with the same id, which takes its logs back, and let the M-node give it keys.
        tracing::warn!(
            node = node.id(),
            "the lease expired while the node ran (starved of CPU or cut off from the metadata store); \
             restarting with the same id"
        );
        node_cfg = node.restart_config();
        node.crash();
        starting = "restarting the KV node";
    }
}

pub fn rn(args: RnArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let cfg = args.settings()?;
    let rn = RoutingNode::start(
        cfg.rn.listen,
        store(&cfg)?,
        cfg.rn.refresh,
        cfg.rn.limits.clone(),
        &cfg.fabric.token,
    )?;
    println!("dinomo rn listening on {}", rn.local_addr());
    let metrics = cfg
        .metrics
        .serve(|| vec![Arc::new(rn.metrics()), Arc::new(FabricMetrics)])?;
    wait_for_signal(signals);
    drop(metrics);
    drop(rn);
    println!("dinomo rn stopped cleanly");
    Ok(())
}

pub fn mnode(args: MnodeArgs) -> anyhow::Result<()> {
    let signals = signals()?;
    let cfg = args.settings()?;
    let meta = store(&cfg)?;
    let m = Arc::new(MNode::start(
        cfg.mnode.clone(),
        meta.clone(),
        connector(&cfg),
    )?);
    let record: Arc<dyn MetricsSource> = Arc::new(RecordMetrics(meta.clone()));
    // This M-node cannot start KV-node processes: the policy removes nodes and changes replication, and an
    // add it decides on is logged as refused (start a `dinomo kn` by hand).
    let autoscaler = if cfg.autoscale.enabled {
        Some(Autoscaler::start(
            cfg.autoscale.clone(),
            meta,
            m.clone(),
            Arc::new(ManualScaler),
        )?)
    } else {
        None
    };
    println!(
        "dinomo mnode {} running{}",
        cfg.mnode.name,
        if autoscaler.is_some() {
            " with the autoscaler"
        } else {
            ""
        }
    );
    let metrics = cfg
        .metrics
        .serve(|| vec![Arc::new(m.metrics()), record, Arc::new(FabricMetrics)])?;
    wait_for_signal(signals);
    drop(metrics);
    drop(autoscaler);
    drop(m);
    println!("dinomo mnode stopped cleanly");
    Ok(())
}

pub fn kv(args: KvArgs) -> anyhow::Result<()> {
    let mut c = Client::connect(ClientConfig {
        seeds: vec![args.seed],
        token: args.token.value.unwrap_or_default().into(),
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
        KvOp::Keys { pattern } => {
            // Each walk step's keys are asked about at once.
            let mut pipelined = dinomo_cluster::PipelinedClient::from_client(c);
            for key in pipelined.keys(pattern.as_bytes())? {
                println!("{}", String::from_utf8_lossy(&key));
            }
        }
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
    use dinomo_cluster::Variant;

    #[derive(Debug, Parser)]
    struct Up {
        #[command(flatten)]
        args: UpArgs,
    }

    #[derive(Debug, Parser)]
    struct Kn {
        #[command(flatten)]
        args: KnCmdArgs,
    }

    #[derive(Debug, Parser)]
    struct Mnode {
        #[command(flatten)]
        args: MnodeArgs,
    }

    fn up(argv: &[&str]) -> anyhow::Result<Config> {
        Up::try_parse_from(std::iter::once("dinomo").chain(argv.iter().copied()))?
            .args
            .settings()
    }

    fn kn(argv: &[&str]) -> anyhow::Result<Config> {
        Kn::try_parse_from(std::iter::once("dinomo").chain(argv.iter().copied()))?
            .args
            .settings()
    }

    #[test]
    fn a_pdpm_baseline_takes_its_own_settings_and_refuses_dinomo_only_flags() {
        let d = up(&[
            "--system",
            "centralds",
            "--memory-nodes",
            "3",
            "--replication",
            "2",
            "--keys",
            "100",
            "--max-value",
            "4KiB",
            "--requirepass",
            "pw",
        ])
        .unwrap();
        assert_eq!(d.up.system, UpSystem::Pdpm(Baseline::CentralDs));
        assert_eq!(
            (
                d.up.pdpm.memory_nodes,
                d.up.pdpm.replication,
                d.up.pdpm.keys,
                d.up.pdpm.max_value
            ),
            (3, 2, 100, 4096)
        );
        assert_eq!(d.kn.resp.requirepass.as_deref(), Some("pw"));
        for system in ["directds", "directds-c", "centralds", "clover"] {
            let e = format!(
                "{:#}",
                up(&["--system", system, "--kns", "3", "--autoscale"]).unwrap_err()
            );
            assert!(
                e.contains("--kns, --autoscale applies only to the DINOMO systems")
                    && e.contains(system),
                "{e}"
            );
        }
        let e = format!(
            "{:#}",
            up(&["--system", "directds", "--replication", "2"]).unwrap_err()
        );
        assert!(e.contains("up.pdpm.replication"), "{e}");
        let e = format!("{:#}", up(&["--memory-nodes", "2"]).unwrap_err());
        assert!(e.contains("applies only to the pDPM baselines"), "{e}");
        let e = format!(
            "{:#}",
            up(&[
                "--system",
                "directds",
                "--resp-listen",
                "127.0.0.1:1,127.0.0.1:2"
            ])
            .unwrap_err()
        );
        assert!(e.contains("up.resp_listen"), "{e}");
    }

    #[test]
    fn up_runs_the_system_it_is_asked_for() {
        use dinomo_dpm::Partitioning;
        let cfg = up(&[]).unwrap();
        assert_eq!(cfg.up.system, UpSystem::Dinomo(Variant::Dinomo));
        assert_eq!(cfg.processor.partitioning, Partitioning::Shared);
        let n = up(&["--system", "dinomo-n"]).unwrap();
        assert_eq!(n.up.system, UpSystem::Dinomo(Variant::DinomoN));
        assert_eq!(n.processor.partitioning, Partitioning::PerNode);
        assert!(!n.autoscale.policy.selective_replication);
        assert_eq!(
            n.kn.kn.cache.policy,
            Policy::Adaptive,
            "DINOMO-N caches with DAC"
        );
        let s = up(&["--system", "dinomo-s"]).unwrap();
        assert_eq!(s.kn.kn.cache.policy, Policy::ShortcutOnly);
        assert_eq!(s.processor.partitioning, Partitioning::Shared);
        let e = format!(
            "{:#}",
            up(&["--system", "dinomo-s", "--policy", "value-only"]).unwrap_err()
        );
        assert!(
            e.contains("kn.workers.cache.policy") && e.contains("shortcuts only"),
            "{e}"
        );
        assert!(up(&["--system", "dinomo-s", "--policy", "shortcut-only"]).is_ok());
        assert!(up(&["--system", "ditto"]).is_err());
    }

    #[test]
    fn the_system_comes_from_the_file_and_refuses_settings_it_cannot_run_with() {
        use dinomo_dpm::Partitioning;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dinomo.toml");
        let with = |text: &str, argv: &[&str]| {
            std::fs::write(&file, text).unwrap();
            let mut all = vec!["--config", file.to_str().unwrap()];
            all.extend_from_slice(argv);
            up(&all).map_err(|e| format!("{e:#}"))
        };
        let n = with("[up]\nsystem = \"dinomo-n\"\n", &[]).unwrap();
        assert_eq!(n.processor.partitioning, Partitioning::PerNode);
        // A flag overrides the file's system, and the layout follows it.
        let d = with("[up]\nsystem = \"dinomo-n\"\n", &["--system", "dinomo"]).unwrap();
        assert_eq!(d.processor.partitioning, Partitioning::Shared);
        assert!(d.autoscale.policy.selective_replication);
        // Settings the file gives explicitly must suit the system.
        let e = with(
            "[up]\nsystem = \"dinomo-n\"\n[processor]\npartitioning = \"shared\"\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("processor.partitioning:"), "{e}");
        let e = with("[processor]\npartitioning = \"per-node\"\n", &[]).unwrap_err();
        assert!(
            e.contains("processor.partitioning:") && e.contains("dinomo-n"),
            "{e}"
        );
        let e = with(
            "[up]\nsystem = \"dinomo-n\"\n[autoscale.policy]\nselective_replication = true\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("autoscale.policy.selective_replication:"), "{e}");
        let e = with(
            "[up]\nsystem = \"dinomo-s\"\n[kn.workers.cache]\npolicy = \"dac\"\n",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("kn.workers.cache.policy:"), "{e}");
        // A flag can put right what the file got wrong.
        assert!(
            with(
                "[up]\nsystem = \"dinomo-s\"\n[kn.workers.cache]\npolicy = \"dac\"\n",
                &["--policy", "shortcut-only"],
            )
            .is_ok()
        );
        let e = with("[up]\nsystem = \"ditto\"\n", &[]).unwrap_err();
        assert!(e.contains("up.system:"), "{e}");
    }

    #[test]
    fn policy_flags_default_to_the_policy_defaults() {
        let cfg = up(&[]).unwrap();
        assert_eq!(cfg.autoscale, AutoscaleConfig::default());
        let cfg = up(&[
            "--autoscale",
            "--slo-avg-ms",
            "0.5",
            "--grace-s",
            "0",
            "--no-selective-replication",
        ])
        .unwrap();
        assert!(cfg.autoscale.enabled && !cfg.autoscale.policy.selective_replication);
        assert_eq!(
            cfg.autoscale.policy.avg_latency_slo,
            Duration::from_micros(500)
        );
        assert!(cfg.autoscale.policy.grace_period.is_zero());
        assert!(up(&["--under-utilization", "0.5"]).is_err());
        assert!(up(&["--slo-p99-ms=-1"]).is_err());
        let m = Mnode::try_parse_from(["dinomo", "--epoch-s", "20"]).unwrap();
        let e = m.args.settings().unwrap_err().to_string();
        assert!(e.contains("autoscale:"), "{e}");
    }

    #[test]
    fn no_flags_and_no_file_give_the_defaults() {
        let cfg = up(&[]).unwrap();
        assert_eq!(cfg, Config::default());
        // What `dinomo up` ran with before it had a configuration file.
        assert_eq!(
            cfg.kn.kn.threads * cfg.kn.kn.cache.budget_bytes as usize,
            64 << 20
        );
        assert_eq!(cfg.pool.path, PathBuf::from("dinomo-data/pool"));
        assert_eq!(cfg.up.resp_listen, vec!["127.0.0.1:6379".parse().unwrap()]);
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dinomo.toml");
        std::fs::write(
            &file,
            r#"
[up]
kns = 5
resp = false
[pool]
path = "/srv/dinomo/pool"
[kn]
node_id = 7
lease_ttl = "300ms"
[kn.workers]
threads = 4
[kn.workers.cache]
budget_bytes = 1048576
[kn.resp]
requirepass = "from-file"
[autoscale.policy]
avg_latency_slo = "3ms"
grace_period = "10s"
[rn]
listen = "127.0.0.1:7299"
"#,
        )
        .unwrap();
        let path = file.to_str().unwrap();
        // The file over the defaults.
        let cfg = up(&["--config", path]).unwrap();
        assert_eq!(cfg.up.kns, 5);
        assert!(!cfg.up.resp);
        assert_eq!(cfg.pool.path, PathBuf::from("/srv/dinomo/pool"));
        assert_eq!(cfg.kn.kn.threads, 4);
        assert_eq!(cfg.kn.kn.cache.budget_bytes, 1 << 20);
        assert_eq!(cfg.kn.lease_ttl, Duration::from_millis(300));
        assert_eq!(cfg.kn.resp.requirepass.as_deref(), Some("from-file"));
        assert_eq!(
            cfg.autoscale.policy.avg_latency_slo,
            Duration::from_millis(3)
        );
        assert_eq!(cfg.rn.listen, "127.0.0.1:7299".parse().unwrap());
        // Keys the file leaves out keep their defaults.
        let d = Config::default();
        assert_eq!(cfg.kn.heartbeat, d.kn.heartbeat);
        assert_eq!(cfg.kn.kn.max_key_len, d.kn.kn.max_key_len);
        assert_eq!(
            cfg.autoscale.policy.tail_latency_slo,
            d.autoscale.policy.tail_latency_slo
        );
        assert_eq!(cfg.pool.size, d.pool.size);

        // Flags over the file.
        let cfg = up(&[
            "--config",
            path,
            "--kns",
            "3",
            "--threads",
            "8",
            "--cache",
            "64MiB",
            "--slo-avg-ms",
            "0.5",
            "--lease-ms",
            "250",
            "--data-dir",
            "/tmp/d",
            "--requirepass",
            "from-flag",
        ])
        .unwrap();
        assert_eq!(cfg.up.kns, 3);
        assert_eq!(cfg.kn.kn.threads, 8);
        assert_eq!(cfg.kn.kn.cache.budget_bytes, 8 << 20, "--cache is per node");
        assert_eq!(
            cfg.autoscale.policy.avg_latency_slo,
            Duration::from_micros(500)
        );
        assert_eq!(cfg.kn.lease_ttl, Duration::from_millis(250));
        assert_eq!(cfg.pool.path, PathBuf::from("/tmp/d/pool"));
        assert_eq!(cfg.kn.resp.requirepass.as_deref(), Some("from-flag"));
        // What no flag named still comes from the file.
        assert_eq!(cfg.autoscale.policy.grace_period, Duration::from_secs(10));
        assert_eq!(cfg.rn.listen, "127.0.0.1:7299".parse().unwrap());
        assert!(!cfg.up.resp);

        // `kn` takes its id from the file, or a flag over it.
        assert_eq!(kn(&["--config", path]).unwrap().kn.node_id, 7);
        assert_eq!(
            kn(&["--config", path, "--node-id", "9"])
                .unwrap()
                .kn
                .node_id,
            9
        );
    }

    #[test]
    fn a_kv_node_needs_an_id() {
        let e = kn(&[]).unwrap_err().to_string();
        assert!(e.contains("--node-id"), "{e}");
        let cfg = kn(&["--node-id", "3", "--dpm", "127.0.0.1:7111"]).unwrap();
        assert_eq!(cfg.kn.node_id, 3);
        assert_eq!(cfg.cluster.dpm, "127.0.0.1:7111".parse().unwrap());
        assert_eq!(cfg.kn.listen, "127.0.0.1:7300".parse().unwrap());
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[kn.workers]\nthreads = \"many\"\n").unwrap();
        let e = format!(
            "{:#}",
            up(&["--config", file.to_str().unwrap()]).unwrap_err()
        );
        assert!(e.contains("kn.workers.threads"), "{e}");
        std::fs::write(&file, "[kn]\nlease_ttl = \"40ms\"\n").unwrap();
        let e = format!(
            "{:#}",
            up(&["--config", file.to_str().unwrap()]).unwrap_err()
        );
        assert!(e.contains("kn.heartbeat"), "{e}");
        // A flag can put right what the file got wrong.
        assert!(up(&["--config", file.to_str().unwrap(), "--heartbeat-ms", "10"]).is_ok());
        let missing = dir.path().join("missing.toml");
        assert!(up(&["--config", missing.to_str().unwrap()]).is_err());
    }
}
