//! The configuration file: one TOML file holds every setting of every process (`up`, `dpm`, `kn`, `rn`, `mnode`).
//! Each section is the settings struct of the part it configures (`ProcessorConfig`, `NodeConfig`, `PolicyConfig`
//! ...), read with unknown keys refused; a key left out keeps its default. Flags given on the command line override
//! the file.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use dinomo_cluster::{AutoscaleConfig, MNodeConfig, NodeConfig, ServerLimits, Variant};
use dinomo_dpm::ProcessorConfig;
use dinomo_fabric::{EndpointConfig, NodeConfig as FabricNodeConfig, ServerConfig};
use dinomo_meta::MetaConfig;
use dinomo_pool::PersistMode;
use serde::{Deserialize, Serialize};

use crate::pdpm::{Baseline, PdpmUpConfig};

/// Everything a configuration file can hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The memory node's pool file.
    pub pool: PoolConfig,
    /// The memory node's processor (merges, log directory, index).
    pub processor: ProcessorConfig,
    /// The memory-node process (`dpm`): its fabric server and limits.
    pub dpm: DpmConfig,
    /// The fabric as every process that connects to the memory node uses it.
    pub fabric: FabricConfig,
    /// How `kn`, `rn` and `mnode` processes find the cluster.
    pub cluster: ClusterConfig,
    /// Every KV node (`kn`, and the KV nodes of `up`).
    pub kn: NodeConfig,
    /// The routing node.
    pub rn: RnConfig,
    /// The M-node.
    pub mnode: MNodeConfig,
    /// The M-node's policy loop.
    pub autoscale: AutoscaleConfig,
    /// `dinomo up`: the whole cluster in one process.
    pub up: UpConfig,
    /// The Prometheus endpoint of every process.
    pub metrics: MetricsConfig,
}

impl Default for Config {
    /// The parts' own defaults, except where the commands always differed: a `dinomo kn` listens on port 7300,
    /// and a KV node's 64 MiB of cache is shared by its workers (32 MiB each for the default two).
    fn default() -> Self {
        let mut kn = NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7300)),
            ..NodeConfig::default()
        };
        kn.kn.cache.budget_bytes = (64 << 20) / kn.kn.threads as u64;
        Config {
            pool: PoolConfig::default(),
            processor: ProcessorConfig::default(),
            dpm: DpmConfig::default(),
            fabric: FabricConfig::default(),
            cluster: ClusterConfig::default(),
            kn,
            rn: RnConfig::default(),
            mnode: MNodeConfig::default(),
            autoscale: AutoscaleConfig::default(),
            up: UpConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

/// The memory node's pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// The pool file (created when missing, with its directory).
    pub path: PathBuf,
    /// Bytes of a new pool.
    pub size: u64,
    /// Allocation unit of a new pool in bytes (`dpm`; `up` uses the log segment size, at most 8 MiB).
    pub segment_size: u64,
    /// Bytes of the lowest free space kept faulted in ahead of the log writers by a background thread; 0: off.
    pub prefault_ahead: u64,
    /// Durability of writes.
    pub persist: PersistMode,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            path: PathBuf::from("dinomo-data/pool"),
            size: 1 << 30,
            segment_size: dinomo_pool::DEFAULT_SEGMENT_SIZE,
            prefault_ahead: dinomo_pool::DEFAULT_PREFAULT_AHEAD,
            persist: PersistMode::default(),
        }
    }
}

/// The memory-node process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DpmConfig {
    /// Serve raw registered memory without the data plane.
    pub fabric_only: bool,
    /// The fabric's TCP server.
    pub server: ServerConfig,
    /// Message limits and processor threads.
    pub node: FabricNodeConfig,
    /// Limits of the cluster record kept in the pool.
    pub meta: MetaConfig,
}

/// The fabric as seen by the processes that connect to the memory node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FabricConfig {
    /// Shared secret of the memory node's fabric (the memory node requires it, every other process presents it).
    pub token: String,
    /// Endpoint settings: injected latency and timeouts.
    pub endpoint: EndpointConfig,
}

/// How processes find the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The memory node's address.
    pub dpm: SocketAddr,
    /// etcd endpoints holding the cluster record instead of the memory node (empty: the memory node).
    pub etcd: Vec<String>,
    /// Key prefix in etcd.
    pub etcd_prefix: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            dpm: SocketAddr::from(([127, 0, 0, 1], 7100)),
            etcd: Vec::new(),
            etcd_prefix: "/dinomo/".into(),
        }
    }
}

/// The routing node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RnConfig {
    /// Where it serves routing tables.
    pub listen: SocketAddr,
    /// How often it re-reads the cluster record.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
    /// Its server's limits.
    pub limits: ServerLimits,
}

impl Default for RnConfig {
    fn default() -> Self {
        RnConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7200)),
            refresh: Duration::from_millis(5),
            limits: ServerLimits::default(),
        }
    }
}

/// What `dinomo up` runs: one of the DINOMO paper's systems, or a pDPM baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum UpSystem {
    /// DINOMO, DINOMO-S or DINOMO-N.
    Dinomo(Variant),
    /// DirectDS, DirectDS-C, CentralDS or Clover.
    Pdpm(Baseline),
}

impl Default for UpSystem {
    fn default() -> Self {
        UpSystem::Dinomo(Variant::Dinomo)
    }
}

impl std::fmt::Display for UpSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpSystem::Dinomo(v) => v.fmt(f),
            UpSystem::Pdpm(b) => b.fmt(f),
        }
    }
}

impl std::str::FromStr for UpSystem {
    type Err = String;

    fn from_str(s: &str) -> Result<UpSystem, String> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some(b) = Baseline::ALL.into_iter().find(|b| b.name() == lower) {
            return Ok(UpSystem::Pdpm(b));
        }
        match lower.parse::<Variant>() {
            Ok(v) => Ok(UpSystem::Dinomo(v)),
            Err(_) => {
                let names: Vec<&str> = Variant::ALL
                    .iter()
                    .map(|v| v.name())
                    .chain(Baseline::ALL.iter().map(|b| b.name()))
                    .collect();
                Err(format!(
                    "unknown system {s:?} (one of {})",
                    names.join(", ")
                ))
            }
        }
    }
}

impl TryFrom<String> for UpSystem {
    type Error = String;

    fn try_from(s: String) -> Result<UpSystem, String> {
        s.parse()
    }
}

impl From<UpSystem> for String {
    fn from(s: UpSystem) -> String {
        s.to_string()
    }
}

/// `dinomo up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpConfig {
    /// Which system it runs. For a system of the DINOMO paper, it sets the cache policy, the index layout and
    /// whether keys are replicated wherever the file and the flags leave them ([`Config::apply_system`]); a pDPM
    /// baseline runs with `pdpm`.
    pub system: UpSystem,
    /// KV nodes to start.
    pub kns: usize,
    /// Whether the KV nodes serve the Redis protocol.
    pub resp: bool,
    /// Redis-protocol addresses, one per node; later nodes take the ports after the last.
    pub resp_listen: Vec<SocketAddr>,
    /// How long starting a KV node may take.
    #[serde(with = "humantime_serde")]
    pub node_start_timeout: Duration,
    /// A KV node removed from the ring keeps refusing its former keys until no request has reached it for this
    /// long, then stops.
    #[serde(with = "humantime_serde")]
    pub retire_quiet: Duration,
    /// The longest a removed KV node drains before it stops.
    #[serde(with = "humantime_serde")]
    pub retire_max: Duration,
    /// A pDPM baseline's memory nodes, sizes and clients.
    pub pdpm: PdpmUpConfig,
}

impl Default for UpConfig {
    fn default() -> Self {
        UpConfig {
            system: UpSystem::default(),
            kns: 2,
            resp: true,
            resp_listen: vec![SocketAddr::from(([127, 0, 0, 1], 6379))],
            node_start_timeout: Duration::from_secs(30),
            retire_quiet: Duration::from_millis(50),
            retire_max: Duration::from_secs(2),
            pdpm: PdpmUpConfig::default(),
        }
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where `/metrics` is served over HTTP; unset: not served.
    pub listen: Option<SocketAddr>,
    /// Scrapes served at once; more are closed.
    pub max_connections: usize,
    /// Bound on reading a request and writing its answer.
    #[serde(with = "humantime_serde")]
    pub io_timeout: Duration,
    /// Longest request head (request line and headers) accepted.
    pub max_request_bytes: usize,
    /// When set, scrapes must present it as `Authorization: Bearer <token>`; unset: no authorization.
    pub bearer_token: Option<String>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        let d = dinomo_cluster::metrics::HttpConfig::default();
        MetricsConfig {
            listen: None,
            max_connections: d.max_connections,
            io_timeout: d.io_timeout,
            max_request_bytes: d.max_request_bytes,
            bearer_token: None,
        }
    }
}

impl MetricsConfig {
    /// The HTTP server's settings, when metrics are served.
    pub fn http(&self) -> Option<dinomo_cluster::metrics::HttpConfig> {
        self.listen
            .map(|listen| dinomo_cluster::metrics::HttpConfig {
                listen,
                max_connections: self.max_connections,
                io_timeout: self.io_timeout,
                max_request_bytes: self.max_request_bytes,
                bearer_token: self.bearer_token.clone().map(Into::into),
            })
    }

    /// Starts the endpoint when one is configured, and says where it listens.
    pub fn serve(
        &self,
        sources: impl FnOnce() -> Vec<std::sync::Arc<dyn dinomo_cluster::metrics::MetricsSource>>,
    ) -> anyhow::Result<Option<dinomo_cluster::metrics::MetricsServer>> {
        let Some(http) = self.http() else {
            return Ok(None);
        };
        let listen = http.listen;
        let server = dinomo_cluster::metrics::MetricsServer::start(http, sources())
            .with_context(|| format!("serving metrics on {listen}"))?;
        println!("  metrics on http://{}/metrics", server.local_addr());
        Ok(Some(server))
    }
}

/// What each key of the file means, in file order. Optional keys, absent from the defaults, carry an example.
#[rustfmt::skip]
const DOCS: &[(&str, &str)] = &[
    ("pool.path", "pool file of the memory node (`dpm --pool`, `up --data-dir` DIR/pool); created with its directory when missing"),
    ("pool.size", "bytes of a new pool (ignored when the file exists)"),
    ("pool.segment_size", "allocation unit of a new pool in bytes (dpm; `up` uses processor.segment_size, at most 8 MiB)"),
    ("pool.prefault_ahead", "bytes of the lowest free pool space a background thread keeps faulted in (madvise MADV_POPULATE_READ), so that the threads granting and writing log segments on a fresh pool do not take the page faults and the kernel's zeroing of new file pages; 0 turns it off"),
    ("pool.persist.mode", "durability: volatile, periodic (msync every interval_ms), durable (msync per write) or dax"),
    ("pool.persist.interval_ms", "milliseconds between background msyncs (mode = periodic only)"),
    ("processor.merge_threads", "threads merging KV nodes' logs into the index"),
    ("processor.directory_capacity", "KV-node thread logs the pool can hold at once (fixed when the pool is formatted); logs of departed nodes are given back"),
    ("processor.segment_size", "bytes of a log segment (fixed when the pool is formatted)"),
    ("processor.shared_key_capacity", "keys that can be shared by several KV nodes at once (fixed when the pool is formatted)"),
    ("processor.shared_key_max_len", "longest key that can be shared, in bytes (fixed when the pool is formatted)"),
    ("processor.partitioning", "index layout (fixed when the pool is formatted): shared (one index every KV node reads: dinomo, dinomo-s) or per-node (one partition per KV node: dinomo-n; `up` follows up.system)"),
    ("processor.partition_capacity", "KV nodes that can have an index partition at once (per-node layout; fixed when the pool is formatted; departed nodes' partitions are freed)"),
    ("processor.delete_reserve_segments", "log segments held back so that a full pool still takes deletes (0: none); refilled before any other log segment is granted"),
    ("processor.clean_below_free_percent", "the log cleaner copies the live entries of mostly-dead log segments elsewhere and recycles them while less than this share of the pool is free, in percent (0: no background cleaning; a grant that finds the pool full cleans anyway)"),
    ("processor.clean_max_live_percent", "only log segments with at most this share of live entries are cleaned, in percent (0: the cleaner is off)"),
    ("processor.index.initial_buckets", "primary buckets of a new index (a power of two)"),
    ("processor.index.max_load", "share of the index's slots in use before it doubles"),
    ("processor.index.overflow_per_bucket", "spare overflow buckets per primary bucket of a new table"),
    ("processor.index.retire_grace", "how long a replaced index table stays allocated for lookups under way (a pool out of space frees it sooner)"),
    ("dpm.fabric_only", "serve raw registered memory without the data plane (fabric tests and benchmarks)"),
    ("dpm.server.listen", "fabric address of the memory node"),
    ("dpm.server.allow_non_loopback", "permit a non-loopback listen address (needs fabric.token)"),
    ("dpm.server.max_connections", "fabric connections served at once; more are refused in the handshake"),
    ("dpm.server.handshake_timeout", "time a new fabric connection has to complete its handshake"),
    ("dpm.node.max_message_len", "largest payload of one verb or RPC in bytes"),
    ("dpm.node.rpc_threads", "processor threads serving two-sided calls"),
    ("dpm.node.rpc_queue", "two-sided calls queued before callers wait"),
    ("dpm.node.max_revoked_clients", "revoked KV-node incarnations remembered, kept in the pool across restarts, and refused when they connect again (the oldest is forgotten)"),
    ("dpm.meta.max_record_len", "largest cluster record in bytes"),
    ("dpm.meta.max_info_len", "largest member info in bytes"),
    ("dpm.meta.max_name_len", "longest member, election or candidate name in bytes"),
    ("dpm.meta.max_leases", "live leases at once"),
    ("dpm.meta.max_members", "registered members at once"),
    ("dpm.meta.max_elections", "elections with a leader at once"),
    ("dpm.meta.max_ttl", "longest lease"),
    ("fabric.token", "shared secret of the cluster: the memory node's fabric and the KV and routing nodes' native protocol (also DINOMO_CLUSTER_TOKEN)"),
    ("fabric.endpoint.injected_latency_ns", "busy-wait added per fabric round trip, in ns (emulates a µs-scale network)"),
    ("fabric.endpoint.timeout", "how long a fabric round trip may take before the connection is given up"),
    ("fabric.endpoint.connect_timeout", "how long connecting to the memory node and the handshake may take"),
    ("cluster.dpm", "address of the memory node for kn, rn and mnode"),
    ("cluster.etcd", "etcd endpoints keeping the cluster record, leases and election (empty: the memory node)"),
    ("cluster.etcd_prefix", "key prefix in etcd"),
    ("kn.node_id", "this KV node's id: it names its logs, so a restart with the same id takes them back (kn)"),
    ("kn.listen", "native-protocol address of the KV node (kn; `up` picks free ports; a non-loopback address needs fabric.token)"),
    ("kn.advertise", "address other processes use to reach the KV node, when it differs from the bound one (example)"),
    ("kn.lease_ttl", "liveness lease: a node silent this long is declared failed and stops serving itself (at most dpm.meta.max_ttl with the embedded store)"),
    ("kn.heartbeat", "heartbeat period (well under lease_ttl)"),
    ("kn.lease_wait", "how long a request that finds the lease lapsed (a late renewal) waits for a renewal before it is refused (0: refused at once; an expired lease never serves)"),
    ("kn.resp_listen", "Redis-protocol address of the KV node (kn; unset: no RESP; `up` uses up.resp_listen) (example)"),
    ("kn.resp_forward_threads", "threads that forward the Redis connections' commands on keys of other nodes (0: one per RESP event-loop thread)"),
    ("kn.txn_wait", "how long each worker of a Redis transaction (MULTI/EXEC) waits for its other workers before the transaction is abandoned, nothing applied"),
    ("kn.workers.threads", "worker threads, each owning a share of the node's keys"),
    ("kn.workers.max_key_len", "largest key in bytes (at most 65535)"),
    ("kn.workers.max_value_len", "largest value in bytes (a largest key and value must fit in one log segment)"),
    ("kn.workers.max_unmerged_segments", "sealed segments a worker may have unmerged before its writes wait"),
    ("kn.workers.merge_wait_timeout", "how long a write waits for the memory node to merge before it fails"),
    ("kn.workers.max_batch", "requests a worker takes for one group commit"),
    ("kn.workers.read_ahead_bytes", "bytes a worker reads ahead for a batch's lookups: the index walks of its uncached keys side by side, then in one round trip the entries found and those its cached shortcuts lead to (0: none; not in process without injected latency)"),
    ("kn.workers.queue_depth", "requests that may wait in a worker's queue"),
    ("kn.workers.shared_cas_attempts", "attempts of a write to a shared key before it gives up under contention"),
    ("kn.workers.cache.budget_bytes", "cache bytes per worker thread (--cache is per node and divided among the workers)"),
    ("kn.workers.cache.policy", "cache policy: dac, static-N (N% values), value-only or shortcut-only"),
    ("kn.workers.cache.initial_miss_cost", "round trips per miss assumed until misses are measured"),
    ("kn.workers.cache.miss_cost_weight", "weight of a new sample in the moving average of round trips per miss"),
    ("kn.workers.cache.remember_absent", "remember keys an index walk found without a value (in free cache space only), so their next reads walk no index; only where a walk costs a fabric round trip (TCP, or an injected latency), not over an in-process fabric without one; false: the paper's DAC, values and shortcuts only"),
    ("kn.workers.key_stats.enabled", "whether workers keep key-access statistics for the M-node's policy"),
    ("kn.workers.key_stats.heavy_hitters", "counters of the heavy-hitter summary (1..=65536)"),
    ("kn.workers.key_stats.distinct_precision", "log2 of the distinct-key estimator's registers (4..=18)"),
    ("kn.workers.key_stats.f2_depth", "rows of the F2 estimator (1..=16)"),
    ("kn.workers.key_stats.f2_width", "counters per row of the F2 estimator, a power of two (16..=65536)"),
    ("kn.workers.key_stats.max_tracked_keys", "keys counted exactly at the node's request (its replicated keys)"),
    ("kn.limits.max_frame", "largest native-protocol request frame in bytes"),
    ("kn.limits.max_connections", "native-protocol connections served at once; one more is told the limit (clients retry) and closed"),
    ("kn.limits.handshake_timeout", "time a new native-protocol connection has to send its Hello (version and cluster token)"),
    ("kn.limits.io_threads", "event-loop threads serving the native-protocol connections of a KV node (1..=1024)"),
    ("kn.limits.control_threads", "threads answering native requests that may wait: statistics, ownership installs (1..=1024)"),
    ("kn.resp.requirepass", "password of the `default` Redis user (also DINOMO_REQUIREPASS; unset: no AUTH) (example)"),
    ("kn.resp.protected_mode", "refuse a non-loopback Redis address without a password"),
    ("kn.resp.max_clients", "Redis clients served at once per KV node"),
    ("kn.resp.idle_timeout", "close a Redis client idle this long (0s: never)"),
    ("kn.resp.max_pipeline", "pipelined Redis requests run together before their replies are written"),
    ("kn.resp.io_threads", "event-loop threads serving the Redis clients of a KV node (0: one per 4 available cores, 1..=8)"),
    ("kn.resp.max_keys_reply", "most keys KEYS answers with; a pattern matching more gets an error that points to SCAN"),
    ("kn.resp.limits.max_bulk_len", "longest Redis argument in bytes (proto-max-bulk-len)"),
    ("kn.resp.limits.max_multibulk_len", "most arguments in one Redis request"),
    ("kn.resp.limits.max_inline_len", "longest inline Redis command in bytes"),
    ("kn.resp.limits.max_request_bytes", "most bytes of one Redis request (client-query-buffer-limit)"),
    ("rn.listen", "address of the routing node (clients start here; a non-loopback address needs fabric.token)"),
    ("rn.refresh", "how often the routing node re-reads the cluster record (shorter than up.node_start_timeout)"),
    ("rn.limits.max_frame", "largest request frame the routing node accepts, in bytes"),
    ("rn.limits.max_connections", "connections the routing node serves at once; one more is told the limit and closed"),
    ("rn.limits.handshake_timeout", "time a new connection to the routing node has to send its Hello"),
    ("rn.limits.io_threads", "event-loop threads serving the routing node's connections (1..=1024)"),
    ("rn.limits.control_threads", "threads answering the routing node's requests that may wait (1..=1024)"),
    ("mnode.name", "this M-node's name in the election (unique per M-node)"),
    ("mnode.lease_ttl", "leadership lease: a standby takes over this long after the leader stops (at most dpm.meta.max_ttl with the embedded store)"),
    ("mnode.check_interval", "how often the M-node checks leases and membership (under half of mnode.lease_ttl)"),
    ("mnode.install_timeout", "bound on installing a routing table at a KV node during reconfiguration, asking again a node that refused for now (a late lease renewal)"),
    ("mnode.vnodes", "virtual nodes per KV node in a new ring"),
    ("mnode.failure_grace", "time unregistered ring members get to come back after an M-node starts leading"),
    ("mnode.max_retry_pause", "longest pause between attempts of a reconfiguration step that keeps failing (the pause starts at mnode.check_interval and doubles with each failure in a row)"),
    ("autoscale.enabled", "run the policy loop (Table 4): add and remove KV nodes, replicate hot keys"),
    ("autoscale.monitoring_epoch", "how often the KV nodes' statistics are collected (at most the decision period)"),
    ("autoscale.collect_timeout", "bound on collecting one node's statistics"),
    ("autoscale.max_events", "policy events kept for inspection"),
    ("autoscale.policy.avg_latency_slo", "average-latency SLO"),
    ("autoscale.policy.tail_latency_slo", "99th-percentile latency SLO"),
    ("autoscale.policy.over_utilization_lower_bound", "occupancy above which a KV node is over-utilized"),
    ("autoscale.policy.under_utilization_upper_bound", "occupancy below which a KV node is under-utilized"),
    ("autoscale.policy.hotness_sigmas", "a key is hot above mean + this many standard deviations of access frequency"),
    ("autoscale.policy.coldness_sigmas", "a replicated key is cold below mean - this many standard deviations"),
    ("autoscale.policy.decision_period", "time between decisions"),
    ("autoscale.policy.grace_period", "no node is added or removed this long after a membership change"),
    ("autoscale.policy.min_nodes", "fewest KV nodes the policy leaves"),
    ("autoscale.policy.max_nodes", "most KV nodes the policy adds up to"),
    ("autoscale.policy.max_replication", "highest replication factor of a hot key (never above the node count)"),
    ("autoscale.policy.max_replication_changes", "most replication changes in one decision"),
    ("autoscale.policy.autoscaling", "whether the policy adds and removes nodes"),
    ("autoscale.policy.selective_replication", "whether the policy replicates hot keys and de-replicates cold ones"),
    ("up.system", "system `up` runs: dinomo, dinomo-s (shortcut-only cache) or dinomo-n (shared-nothing), which set the cache policy, index layout and replication the file leaves out; or a pDPM baseline: directds, directds-c, centralds or clover (run with up.pdpm)"),
    ("up.kns", "KV nodes `up` starts"),
    ("up.resp", "whether `up`'s KV nodes serve the Redis protocol"),
    ("up.resp_listen", "Redis-protocol addresses of `up`'s KV nodes, one per node; later nodes take the next ports"),
    ("up.node_start_timeout", "how long starting a KV node may take until it serves"),
    ("up.retire_quiet", "a KV node removed from the ring keeps refusing its former keys (so clients learn the new table) until no request has reached it for this long"),
    ("up.retire_max", "the longest a removed KV node drains before it stops"),
    ("up.pdpm.memory_nodes", "pDPM baseline: memory nodes, each a pool file SYSTEM-I.pool in the data directory (formatted on first start)"),
    ("up.pdpm.replication", "pDPM baseline: copies of every value on distinct memory nodes (at most memory_nodes)"),
    ("up.pdpm.keys", "pDPM baseline: keys the memory nodes are sized for when formatted (DirectDS: slots at load 1/2; CentralDS: blocks for a quarter more; Clover: cells at load 1/2, data slots for twice the copies and the grants)"),
    ("up.pdpm.max_key", "pDPM baseline: longest key in bytes (fixed when formatted; at most 65534)"),
    ("up.pdpm.max_value", "pDPM baseline: longest value in bytes (fixed when formatted)"),
    ("up.pdpm.grant_clients", "CentralDS and Clover: connected clients whose block (slot) grants each memory node has room for (fixed when formatted)"),
    ("up.pdpm.coordinator_threads", "CentralDS's coordinator and Clover's metadata server: RPC threads"),
    ("up.pdpm.coordinator_shards", "CentralDS: shards of the coordinator's key map"),
    ("up.pdpm.max_grant", "CentralDS: most block locations one grant hands out"),
    ("up.pdpm.direct.lock_lease", "DirectDS: a lock word unchanged this long belongs to a crashed client and is taken over, with recovery"),
    ("up.pdpm.direct.lock_wait", "DirectDS: how long to wait for a lock held by a live client"),
    ("up.pdpm.direct.max_probe", "DirectDS: slots probed for a key before the table counts as full"),
    ("up.pdpm.direct.torn_retries", "DirectDS-C: lock-free reads that may find a torn copy before a read takes the lock"),
    ("up.pdpm.direct.fuse_validation", "DirectDS: post each WRITE with its validating READ (one round trip less per step)"),
    ("up.pdpm.direct.node_seed", "DirectDS: seed of the hash that picks a key's primary memory node"),
    ("up.pdpm.direct.node_retry", "DirectDS: how long a client leaves a memory node it found unreachable before it connects again (meanwhile reads use replicas and writes are refused)"),
    ("up.pdpm.direct.max_cached_slots", "DirectDS: key-to-slot entries a client caches before it starts over"),
    ("up.pdpm.central.grant_batch", "CentralDS: block locations a client asks for per grant"),
    ("up.pdpm.central.read_retries", "CentralDS: times a GET whose block was reused by a later write starts over"),
    ("up.pdpm.central.fuse_validation", "CentralDS: post the WRITE with its validating READ (a PUT costs 2 round trips)"),
    ("up.pdpm.central.node_retry", "CentralDS: how long a client leaves a memory node it found unreachable before it connects again (meanwhile reads use the other copies)"),
    ("up.pdpm.central.update_wait", "CentralDS: how long a read-modify-write whose conditional commit keeps finding the key changed may start over before it fails"),
    ("up.pdpm.central.update_backoff_max", "CentralDS: longest randomized pause between two attempts of a read-modify-write"),
    ("up.pdpm.metadata.max_probe", "Clover: cells probed for a key on its home memory node before its cell table counts as full"),
    ("up.pdpm.metadata.node_seed", "Clover: seed of the hash that picks a key's home memory node (keep it across restarts)"),
    ("up.pdpm.metadata.reclaim_lease", "Clover: how long a retired version's slot waits before reuse (the paper's Tr; at least twice up.pdpm.clover.read_timeout)"),
    ("up.pdpm.metadata.wrap_park", "Clover: how long a slot whose 8-bit GC version wrapped is parked before reuse (the paper's Te; above up.pdpm.clover.cursor_idle)"),
    ("up.pdpm.metadata.max_grant", "Clover: most slots one grant hands out"),
    ("up.pdpm.metadata.max_walk", "Clover: versions the metadata server follows along one chain (at start, and checking a crashed client's grants)"),
    ("up.pdpm.metadata.node_retry", "Clover: how long the metadata server grants no space and creates no keys on a memory node found unreachable before it connects again"),
    ("up.pdpm.clover.grant_batch", "Clover: slots a client asks for per refill"),
    ("up.pdpm.clover.refill_at", "Clover: a client's background thread refills its slots once fewer than this are left (0: only when a write finds none)"),
    ("up.pdpm.clover.record_batch", "Clover: records (linked, retired) a client holds before sending them on their own"),
    ("up.pdpm.clover.cursor_capacity", "Clover: keys whose cell and last known tail a client caches (LRU)"),
    ("up.pdpm.clover.cursor_idle", "Clover: a cached tail unused this long is dropped (below up.pdpm.metadata.wrap_park)"),
    ("up.pdpm.clover.read_timeout", "Clover: a READ slower than this is abandoned and the read starts over (at most half up.pdpm.metadata.reclaim_lease)"),
    ("up.pdpm.clover.max_hops", "Clover: chain hops one operation may take before it fails as contended"),
    ("up.pdpm.clover.space_wait", "Clover: how long a write waits for free slots while every slot is live, granted or waiting out the lease"),
    ("up.pdpm.clover.node_retry", "Clover: how long a client leaves a memory node found unreachable alone before it connects again"),
    ("metrics.listen", "address serving Prometheus metrics at /metrics over HTTP (unset: off) (example)"),
    ("metrics.max_connections", "metrics scrapes served at once; more are closed"),
    ("metrics.io_timeout", "bound on reading a metrics request and writing its answer"),
    ("metrics.max_request_bytes", "longest HTTP request head accepted by the metrics endpoint"),
    ("metrics.bearer_token", "scrapes must present it as `Authorization: Bearer <token>` (also DINOMO_METRICS_TOKEN; unset: none) (example)"),
];

/// Examples for the optional keys, printed commented out in the defaults.
#[rustfmt::skip]
const EXAMPLES: &[(&str, &str)] = &[
    ("kn.advertise", "\"10.0.0.5:7301\""),
    ("kn.resp_listen", "\"127.0.0.1:6379\""),
    ("kn.resp.requirepass", "\"secret\""),
    ("metrics.listen", "\"127.0.0.1:9100\""),
    ("metrics.bearer_token", "\"scrape-secret\""),
];

fn doc(path: &str) -> Option<&'static str> {
    DOCS.iter()
        .find(|(p, _)| *p == path)
        .map(|(_, d)| d.trim_end_matches(" (example)"))
}

/// A value as written in the file, with a readable size beside byte counts.
fn shown(path: &str, value: &toml::Value) -> String {
    let text = value.to_string();
    let bytes_key = path.ends_with("size")
        || path.ends_with("bytes")
        || path.ends_with("_len")
        || path.ends_with("max_frame")
        || path == "pool.prefault_ahead";
    match value.as_integer() {
        Some(n) if bytes_key && n >= 1 << 10 => format!("{text} = {}", human_bytes(n as u64)),
        _ => text,
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size && n % size == 0 {
            return format!("{} {unit}", n / size);
        }
    }
    format!("{n} bytes")
}

/// The default configuration as a commented TOML file: every key with what it is and its default.
pub fn defaults_file() -> String {
    let table = toml::Table::try_from(Config::default()).expect("the defaults serialize");
    let mut out = String::from(
        "# dinomo configuration. Every key is optional: a key left out keeps the default shown here, and flags given\n\
         # on the command line override the file. Durations are written like \"200ms\", \"5s\" or \"1m 30s\"; sizes\n\
         # are in bytes. Check a file with `dinomo config check FILE`.\n",
    );
    write_table(&mut out, "", &table);
    out
}

fn write_table(out: &mut String, path: &str, table: &toml::Table) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    // Optional keys are absent from the serialized defaults: shown commented out, in their place in DOCS.
    let optional: Vec<&str> = EXAMPLES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| p.rsplit_once('.').map(|(parent, _)| parent) == Some(path))
        .collect();
    for (key, value) in table.iter().filter(|(_, v)| !v.is_table()) {
        let full = join(key);
        let _ = writeln!(
            out,
            "# {} (default: {})",
            doc(&full).unwrap_or("(undocumented)"),
            shown(&full, value)
        );
        let _ = writeln!(out, "{key} = {value}");
    }
    for full in optional {
        let key = full.rsplit_once('.').map_or(full, |(_, k)| k);
        let example = EXAMPLES
            .iter()
            .find(|(p, _)| *p == full)
            .map_or("", |(_, e)| e);
        let _ = writeln!(
            out,
            "# {} (default: unset)",
            doc(full).unwrap_or("(undocumented)")
        );
        let _ = writeln!(out, "# {key} = {example}");
    }
    for (key, value) in table.iter() {
        if let Some(sub) = value.as_table() {
            let full = join(key);
            let _ = writeln!(out, "\n[{full}]");
            write_table(out, &full, sub);
        }
    }
}

/// A configuration file that could not be used.
#[derive(Debug)]
pub struct ConfigErrors {
    /// Where it came from.
    pub source: String,
    /// What is wrong, each naming its key.
    pub errors: Vec<String>,
}

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:", self.source)?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl ConfigErrors {
    /// `errors` of the settings from `source`, when there are any.
    pub fn fail_if_any(source: &str, errors: Vec<String>) -> Result<(), ConfigErrors> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors {
                source: source.to_string(),
                errors,
            })
        }
    }
}

/// A configuration read from a file, with the keys the file set.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The settings: the file's over the defaults.
    pub config: Config,
    /// The file as written.
    raw: toml::Table,
}

impl Loaded {
    /// Whether the file gave `path` (dotted) explicitly.
    pub fn file_sets(&self, path: &str) -> bool {
        let mut table = &self.raw;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            match table.get(part) {
                None => return false,
                Some(_) if parts.peek().is_none() => return true,
                Some(toml::Value::Table(t)) => table = t,
                Some(_) => return false,
            }
        }
        false
    }
}

/// Parses a configuration file's text; every error names its key.
pub fn parse(source: &str, text: &str) -> Result<Loaded, ConfigErrors> {
    let fail = |errors| ConfigErrors {
        source: source.to_string(),
        errors,
    };
    let raw: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| fail(vec![e.to_string().trim_end().to_string()]))?;
    let config: Config = serde_path_to_error::deserialize(raw.clone()).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().message().to_string();
        fail(vec![if path == "." {
            message
        } else {
            format!("{path}: {message}")
        }])
    })?;
    let loaded = Loaded { config, raw };
    // serde ignores fields beside the tag of a variant without fields, so a leftover interval would go unnoticed.
    if loaded.file_sets("pool.persist.interval_ms")
        && !matches!(loaded.config.pool.persist, PersistMode::Periodic { .. })
    {
        return Err(fail(vec![
            "pool.persist.interval_ms: applies only to mode = \"periodic\"".into(),
        ]));
    }
    Ok(loaded)
}

/// Reads and parses a configuration file.
pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration file {}", path.display()))?;
    Ok(parse(&path.display().to_string(), &text)?)
}

/// The file given with `--config`, or the defaults.
pub fn load_or_default(path: Option<&Path>) -> anyhow::Result<Loaded> {
    match path {
        Some(p) => load(p),
        None => Ok(Loaded::default()),
    }
}

impl Config {
    /// Checks that the settings fit together; each problem names its key.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut check = |key: &str, r: Result<(), String>| {
            if let Err(e) = r {
                errors.push(format!("{key}: {e}"));
            }
        };
        check(
            "kn.workers",
            self.kn.kn.validate().map_err(|e| e.to_string()),
        );
        check(
            "processor.index",
            self.processor.index.validate().map_err(|e| e.to_string()),
        );
        check("autoscale", self.autoscale.validate());
        if self.up.kns == 0 {
            check(
                "up.kns",
                Err("`up` needs at least one KV node to form a cluster".into()),
            );
        }
        let positive = |what: &str, d: Duration| {
            if d.is_zero() {
                Err(format!("{what} must be above zero"))
            } else {
                Ok(())
            }
        };
        check("kn.lease_ttl", positive("the lease", self.kn.lease_ttl));
        check(
            "kn.heartbeat",
            positive("the heartbeat period", self.kn.heartbeat),
        );
        if self.kn.heartbeat >= self.kn.lease_ttl {
            check(
                "kn.heartbeat",
                Err(format!(
                    "the heartbeat period ({:?}) must be shorter than the lease ({:?})",
                    self.kn.heartbeat, self.kn.lease_ttl
                )),
            );
        }
        check(
            "mnode.lease_ttl",
            positive("the lease", self.mnode.lease_ttl),
        );
        check(
            "rn.refresh",
            positive("the refresh period", self.rn.refresh),
        );
        // A start waits for the routing node to hand out the newest table, so it must refresh within that wait.
        if self.rn.refresh >= self.up.node_start_timeout {
            check(
                "rn.refresh",
                Err(format!(
                    "the refresh period ({:?}) must be shorter than up.node_start_timeout ({:?}), which a start \
                     waits for the routing node to hand out the newest table",
                    self.rn.refresh, self.up.node_start_timeout
                )),
            );
        }
        check(
            "mnode.check_interval",
            positive("the check interval", self.mnode.check_interval),
        );
        // The M-node renews its leadership between checks: a longer interval would let the lease lapse.
        if self.mnode.check_interval >= self.mnode.lease_ttl / 2 {
            check(
                "mnode.check_interval",
                Err(format!(
                    "the check interval ({:?}) must be shorter than half the leadership lease \
                     (mnode.lease_ttl = {:?}), which the M-node renews between checks",
                    self.mnode.check_interval, self.mnode.lease_ttl
                )),
            );
        }
        // The embedded metadata store grants no longer lease (etcd keeps its own limit).
        if self.cluster.etcd.is_empty() {
            let max = self.dpm.meta.max_ttl;
            for (key, ttl) in [
                ("kn.lease_ttl", self.kn.lease_ttl),
                ("mnode.lease_ttl", self.mnode.lease_ttl),
            ] {
                if ttl > max {
                    check(
                        key,
                        Err(format!(
                            "the lease ({ttl:?}) is longer than the metadata store grants \
                             (dpm.meta.max_ttl = {max:?})"
                        )),
                    );
                }
            }
        }
        if self.kn.kn.cache.budget_bytes == 0 {
            check(
                "kn.workers.cache.budget_bytes",
                Err("the cache needs at least one byte".into()),
            );
        }
        if self.kn.resp.max_clients == 0 {
            check("kn.resp.max_clients", Err("must be at least 1".into()));
        }
        let max_threads = dinomo_cluster::MAX_SERVER_THREADS;
        for (key, n) in [
            ("kn.limits.io_threads", self.kn.limits.io_threads),
            ("kn.limits.control_threads", self.kn.limits.control_threads),
            ("rn.limits.io_threads", self.rn.limits.io_threads),
            ("rn.limits.control_threads", self.rn.limits.control_threads),
        ] {
            if !(1..=max_threads).contains(&n) {
                check(key, Err(format!("must be 1 to {max_threads}, not {n}")));
            }
        }
        if self.pool.size == 0 {
            check("pool.size", Err("must be above zero".into()));
        }
        if self.metrics.max_connections == 0 {
            check("metrics.max_connections", Err("must be at least 1".into()));
        }
        if self.dpm.node.max_message_len == 0 {
            check("dpm.node.max_message_len", Err("must be above zero".into()));
        }
        for (key, percent) in [
            (
                "processor.clean_below_free_percent",
                self.processor.clean_below_free_percent,
            ),
            (
                "processor.clean_max_live_percent",
                self.processor.clean_max_live_percent,
            ),
        ] {
            if percent > 100 {
                check(key, Err("a share in percent is at most 100".into()));
            }
        }
        if self.processor.partition_capacity == 0 {
            check(
                "processor.partition_capacity",
                Err("must be at least 1".into()),
            );
        }
        errors.extend(self.up.pdpm.validate());
        errors
    }

    /// Makes these the settings of `up.system` (the system `dinomo up` runs): each setting the system decides —
    /// the cache policy (shortcut-only for DINOMO-S), the index layout (per node for DINOMO-N) and selective
    /// replication (off for DINOMO-N, which cannot share keys) — takes the system's value unless `set` says the
    /// file or a flag gave it, in which case it must be one the system runs with. Returns the problems, each
    /// naming its key.
    pub fn apply_system(&mut self, set: impl Fn(&str) -> bool) -> Vec<String> {
        let system = match self.up.system {
            UpSystem::Dinomo(v) => v,
            // A baseline has none of these parts; its own settings are checked by `validate`.
            UpSystem::Pdpm(_) => return Vec::new(),
        };
        let mut errors = Vec::new();
        const POLICY: &str = "kn.workers.cache.policy";
        let requested = set(POLICY).then_some(self.kn.kn.cache.policy);
        match system.cache_policy(requested) {
            Ok(p) if requested.is_none() && system == Variant::DinomoS => {
                self.kn.kn.cache.policy = p
            }
            Ok(_) => {}
            Err(e) => errors.push(format!("{POLICY}: {e} (up.system = \"{system}\")")),
        }
        const PARTITIONING: &str = "processor.partitioning";
        let layout = system.partitioning();
        if !set(PARTITIONING) {
            self.processor.partitioning = layout;
        } else if self.processor.partitioning != layout {
            let runs_it = Variant::ALL
                .into_iter()
                .filter(|v| v.partitioning() == self.processor.partitioning)
                .map(Variant::name)
                .collect::<Vec<_>>()
                .join(" or ");
            errors.push(format!(
                "{PARTITIONING}: {system} keeps its index {layout}, not {} (that is {runs_it}: set up.system)",
                self.processor.partitioning
            ));
        }
        const REPLICATION: &str = "autoscale.policy.selective_replication";
        if system == Variant::DinomoN {
            if !set(REPLICATION) {
                self.autoscale.policy.selective_replication = false;
            } else if self.autoscale.policy.selective_replication {
                errors.push(format!(
                    "{REPLICATION}: dinomo-n cannot share keys, so it cannot replicate them"
                ));
            }
        }
        errors
    }

    /// [`Config::validate`] as a result.
    pub fn checked(self, source: &str) -> Result<Config, ConfigErrors> {
        ConfigErrors::fail_if_any(source, self.validate())?;
        Ok(self)
    }
}

/// `--config FILE` and `--metrics-listen ADDR`, on every command that starts a process.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// Configuration file (TOML; see `dinomo config defaults`). Flags given here override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9100 (port 0: any free port)
    /// [metrics.listen; default off].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Token every scrape must present as `Authorization: Bearer <token>` [metrics.bearer_token; default none].
    #[arg(
        long,
        value_name = "TOKEN",
        env = "DINOMO_METRICS_TOKEN",
        hide_env_values = true
    )]
    pub metrics_token: Option<String>,
}

impl ConfigArgs {
    /// The file's settings (or the defaults) with the metrics flag applied.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let mut loaded = load_or_default(self.config.as_deref())?;
        if let Some(listen) = self.metrics_listen {
            loaded.config.metrics.listen = Some(listen);
        }
        if let Some(token) = &self.metrics_token {
            loaded.config.metrics.bearer_token = Some(token.clone());
        }
        Ok(loaded)
    }

    /// Where the settings came from, for error messages.
    pub fn source(&self) -> String {
        match &self.config {
            Some(p) => format!("{} with the command-line flags", p.display()),
            None => "the command-line flags".into(),
        }
    }
}

/// `dinomo config`.
#[derive(Debug, Args)]
pub struct ConfigCmdArgs {
    #[command(subcommand)]
    pub op: ConfigOp,
}

/// What `dinomo config` does.
#[derive(Debug, Subcommand)]
pub enum ConfigOp {
    /// Print the full default configuration file, every key commented.
    Defaults,
    /// Check a configuration file: unknown keys, wrong types and settings that do not fit together.
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// What `dinomo config check` finds wrong with a file: settings that do not fit together and, when the file names
/// `up.system`, settings that system cannot run with (without it, a layout or policy may be meant for `dpm` or `kn`
/// alone).
pub fn check(loaded: &Loaded, source: &str) -> Result<Config, ConfigErrors> {
    let mut config = loaded.config.clone();
    if loaded.file_sets("up.system") {
        ConfigErrors::fail_if_any(source, config.apply_system(|key| loaded.file_sets(key)))?;
    }
    config.checked(source)
}

pub fn run(args: ConfigCmdArgs) -> anyhow::Result<()> {
    match args.op {
        ConfigOp::Defaults => print!("{}", defaults_file()),
        ConfigOp::Check { file } => {
            check(&load(&file)?, &file.display().to_string())?;
            println!("{}: ok", file.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_paths(table: &toml::Table, path: &str, out: &mut Vec<String>) {
        for (k, v) in table {
            let full = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match v.as_table() {
                Some(t) => leaf_paths(t, &full, out),
                None => out.push(full),
            }
        }
    }

    #[test]
    fn the_metrics_token_flag_overrides_the_file_and_reaches_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dinomo.toml");
        std::fs::write(
            &file,
            "[metrics]\nlisten = \"127.0.0.1:0\"\nbearer_token = \"from-file\"\n",
        )
        .unwrap();
        let args = |token: Option<&str>| ConfigArgs {
            config: Some(file.clone()),
            metrics_listen: None,
            metrics_token: token.map(str::to_string),
        };
        let token = |args: ConfigArgs| {
            let http = args.load().unwrap().config.metrics.http().unwrap();
            http.bearer_token.map(|t| t.0)
        };
        assert_eq!(token(args(None)).as_deref(), Some("from-file"));
        assert_eq!(token(args(Some("from-flag"))).as_deref(), Some("from-flag"));
        assert_eq!(MetricsConfig::default().bearer_token, None);
    }

    #[test]
    fn the_defaults_file_parses_back_to_the_defaults() {
        let text = defaults_file();
        let loaded = parse("defaults", &text).unwrap();
        assert_eq!(loaded.config, Config::default());
        assert!(Config::default().validate().is_empty());
    }

    #[test]
    fn every_key_is_documented_and_every_documented_key_exists() {
        let table = toml::Table::try_from(Config::default()).unwrap();
        let mut keys = Vec::new();
        leaf_paths(&table, "", &mut keys);
        for k in &keys {
            assert!(doc(k).is_some(), "{k} has no description");
        }
        for (p, _) in EXAMPLES {
            assert!(!keys.contains(&p.to_string()), "{p} is not optional");
        }
        for (p, _) in DOCS {
            assert!(
                keys.iter().any(|k| k == p) || EXAMPLES.iter().any(|(e, _)| e == p),
                "{p} is documented but not a key"
            );
        }
        // Every key appears in the printed file, with its comment.
        let text = defaults_file();
        for (p, d) in DOCS {
            let d = d.trim_end_matches(" (example)");
            assert!(text.contains(&format!("# {d} (default: ")), "{p}");
        }
        // The commented-out examples are accepted when uncommented.
        let uncommented: String = text
            .lines()
            .map(|l| {
                EXAMPLES
                    .iter()
                    .find(|(p, e)| l == format!("# {} = {e}", p.rsplit_once('.').unwrap().1))
                    .map_or(l.to_string(), |_| l.trim_start_matches("# ").to_string())
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = parse("examples", &uncommented).unwrap().config;
        assert_eq!(c.kn.resp.requirepass.as_deref(), Some("secret"));
        assert!(c.kn.resp_listen.is_some() && c.metrics.listen.is_some());
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults() {
        let text = r#"
            [kn.workers]
            threads = 4
            [kn]
            lease_ttl = "300ms"
            [autoscale.policy]
            avg_latency_slo = "2ms 500us"
            [kn.workers.cache]
            policy = "static-40"
            [pool.persist]
            mode = "durable"
        "#;
        let loaded = parse("t", text).unwrap();
        let c = &loaded.config;
        assert_eq!(c.kn.kn.threads, 4);
        assert_eq!(c.kn.lease_ttl, Duration::from_millis(300));
        assert_eq!(
            c.autoscale.policy.avg_latency_slo,
            Duration::from_micros(2500)
        );
        assert_eq!(
            c.kn.kn.cache.policy,
            dinomo_cache::Policy::Static { value_percent: 40 }
        );
        assert_eq!(c.pool.persist, PersistMode::Durable);
        assert_eq!(c.kn.kn.max_batch, KnConfig::default().max_batch);
        assert!(loaded.file_sets("kn.workers.threads") && !loaded.file_sets("kn.node_id"));
    }

    fn error_of(text: &str) -> String {
        parse("t", text).unwrap_err().errors.join("\n")
    }

    /// What [`check`] finds wrong with a file that parses.
    fn check_error_of(text: &str) -> String {
        check(&parse("t", text).unwrap(), "t")
            .unwrap_err()
            .errors
            .join("\n")
    }

    use dinomo_kn::KnConfig;

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = error_of("[kn.workers]\nthread = 4\n");
        assert!(
            e.contains("kn.workers") && e.contains("unknown field `thread`"),
            "{e}"
        );
        let e = error_of("[kn.workers]\nthreads = \"four\"\n");
        assert!(e.starts_with("kn.workers.threads: invalid type"), "{e}");
        let e = error_of("[nope]\n");
        assert!(e.contains("unknown field `nope`"), "{e}");
        let e = error_of("[kn]\nlease_ttl = \"soon\"\n");
        assert!(e.starts_with("kn.lease_ttl:"), "{e}");
        let e = error_of("[kn.workers.cache]\npolicy = \"lru\"\n");
        assert!(
            e.starts_with("kn.workers.cache.policy:") && e.contains("unknown cache policy"),
            "{e}"
        );
        let e = error_of("[rn]\nlisten = \"localhost\"\n");
        assert!(e.starts_with("rn.listen:"), "{e}");
        let e = error_of("[kn.workers]\nthreads = -1\n");
        assert!(e.starts_with("kn.workers.threads:"), "{e}");
        let e = error_of("[kn\n");
        assert!(e.contains("line 1"), "{e}");
        let e = error_of("[pool.persist]\nmode = \"sometimes\"\n");
        assert!(e.starts_with("pool.persist"), "{e}");
        let e = error_of("[pool.persist]\nmode = \"durable\"\ninterval_ms = 5\n");
        assert!(e.starts_with("pool.persist.interval_ms:"), "{e}");
        let e = error_of("[pool.persist]\nmode = \"periodic\"\nintervl_ms = 5\n");
        assert!(e.contains("unknown field `intervl_ms`"), "{e}");
    }

    #[test]
    fn periods_and_leases_that_cannot_work_are_refused_with_the_reason() {
        let e = check_error_of("[rn]\nrefresh = \"1day\"\n");
        assert!(
            e.starts_with("rn.refresh:") && e.contains("up.node_start_timeout"),
            "{e}"
        );
        let e = check_error_of("[mnode]\ncheck_interval = \"600ms\"\n");
        assert!(
            e.starts_with("mnode.check_interval:") && e.contains("half the leadership lease"),
            "{e}"
        );
        let e = check_error_of("[mnode]\ncheck_interval = \"0s\"\n");
        assert!(e.starts_with("mnode.check_interval:"), "{e}");
        let e = check_error_of("[kn]\nlease_ttl = \"2h\"\n");
        assert!(
            e.starts_with("kn.lease_ttl:") && e.contains("dpm.meta.max_ttl"),
            "{e}"
        );
        let e = check_error_of("[mnode]\nlease_ttl = \"2h\"\ncheck_interval = \"1s\"\n");
        assert!(e.starts_with("mnode.lease_ttl:"), "{e}");
        // A longer lease is fine where the store grants it: a higher max_ttl, or etcd's own limit.
        for ok in [
            "[kn]\nlease_ttl = \"2h\"\n[dpm.meta]\nmax_ttl = \"3h\"\n",
            "[kn]\nlease_ttl = \"2h\"\n[cluster]\netcd = [\"127.0.0.1:2379\"]\n",
            "[rn]\nrefresh = \"1s\"\n[mnode]\ncheck_interval = \"100ms\"\n",
        ] {
            check(&parse("t", ok).unwrap(), "t").unwrap();
        }
    }

    #[test]
    fn a_pdpm_baseline_is_a_system_with_its_own_section() {
        let loaded = parse(
            "t",
            "[up]\nsystem = \"directds-c\"\n[up.pdpm]\nmemory_nodes = 2\nreplication = 2\n\
             [up.pdpm.direct]\nlock_wait = \"3s\"\n",
        )
        .unwrap();
        let c = check(&loaded, "t").unwrap();
        assert_eq!(c.up.system, UpSystem::Pdpm(Baseline::DirectDsC));
        assert_eq!((c.up.pdpm.memory_nodes, c.up.pdpm.replication), (2, 2));
        assert_eq!(c.up.pdpm.direct.lock_wait, Duration::from_secs(3));
        // The defaults file round-trips the system's name.
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("system = \"directds-c\""), "{text}");
        let e = check_error_of("[up.pdpm]\nreplication = 3\n");
        assert!(e.contains("up.pdpm.replication"), "{e}");
        let e = error_of("[up]\nsystem = \"sepds\"\n");
        assert!(e.contains("up.system") && e.contains("centralds"), "{e}");
    }

    #[test]
    fn the_system_and_the_index_layout_are_keys() {
        use dinomo_dpm::Partitioning;
        let loaded = parse(
            "t",
            "[up]\nsystem = \"dinomo-n\"\n[processor]\npartition_capacity = 64\n",
        )
        .unwrap();
        assert_eq!(loaded.config.up.system, UpSystem::Dinomo(Variant::DinomoN));
        assert_eq!(loaded.config.processor.partition_capacity, 64);
        // The system decides the layout and replication the file leaves out.
        let c = check(&loaded, "t").unwrap();
        assert_eq!(c.processor.partitioning, Partitioning::PerNode);
        assert!(!c.autoscale.policy.selective_replication);
        // A layout for `dpm` alone needs no system.
        let dpm_only = parse("t", "[processor]\npartitioning = \"per-node\"\n").unwrap();
        assert_eq!(
            check(&dpm_only, "t").unwrap().processor.partitioning,
            Partitioning::PerNode
        );
        let e = check_error_of(
            "[up]\nsystem = \"dinomo-s\"\n[kn.workers.cache]\npolicy = \"value-only\"\n",
        );
        assert!(
            e.starts_with("kn.workers.cache.policy:") && e.contains("shortcuts only"),
            "{e}"
        );
        let e =
            check_error_of("[up]\nsystem = \"dinomo\"\n[processor]\npartitioning = \"per-node\"\n");
        assert!(
            e.starts_with("processor.partitioning:") && e.contains("dinomo-n"),
            "{e}"
        );
        let e = error_of("[up]\nsystem = \"ditto\"\n");
        assert!(e.starts_with("up.system:") && e.contains("dinomo-n"), "{e}");
        let e = error_of("[processor]\npartitioning = \"sharded\"\n");
        assert!(e.starts_with("processor.partitioning:"), "{e}");
        let c = parse("t", "[processor]\npartition_capacity = 0\n")
            .unwrap()
            .config;
        assert!(
            c.validate()
                .iter()
                .any(|e| e.starts_with("processor.partition_capacity:")),
            "{:?}",
            c.validate()
        );
    }

    #[test]
    fn settings_that_do_not_fit_name_the_key() {
        let c = parse(
            "t",
            "[kn]\nlease_ttl = \"50ms\"\nheartbeat = \"60ms\"\n[kn.workers]\nthreads = 0\n[autoscale.policy]\nmin_nodes = 0\n[up]\nkns = 0\n",
        )
        .unwrap()
        .config;
        let errors = c.validate();
        assert!(
            errors.iter().any(|e| e.starts_with("kn.heartbeat:")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.starts_with("kn.workers:")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.starts_with("autoscale:")),
            "{errors:?}"
        );
        assert!(
            errors.iter().any(|e| e.starts_with("up.kns:")),
            "{errors:?}"
        );
    }
}
