//! `dinomo bench ycsb`: YCSB workloads against a store, measured end to end.
//!
//! A run starts (or reaches) the store under test ([`target`]: DINOMO in this process or over its native protocol,
//! or any server speaking the Redis protocol), loads `records` records with pipelined writes,
//! then drives `clients` closed-loop client threads, each keeping up to `outstanding` operations in flight, through
//! a warm-up and a measured phase. It reports throughput, latency percentiles (HdrHistogram), what each operation
//! cost the system — fabric round trips and bytes, KV-node and memory-node CPU time, group commits — the cache's
//! hit ratios split by value, shortcut, log and miss, the merge backlog, and a per-second timeline ([`report`]).
//!
//! Every read is checked: the value must be one the workload wrote for that record ([`crate::ycsb::verify_value`]);
//! a missing or corrupt value is counted and reported, never ignored.
//!
//! Resource figures are deltas of the counters the system keeps, taken just before the measured phase starts and
//! just after it ends, divided by the operations completed in it; the operations in flight across either edge
//! (at most `clients × outstanding`) make them approximate by that much. A target that cannot read them (a RESP
//! server, [`resp`]) reports them as absent.

mod driver;
pub mod pdpm;
pub mod report;
mod resources;
pub mod resp;
pub mod target;

use std::time::Duration;

use anyhow::{bail, ensure};
use serde::{Deserialize, Serialize};

use crate::ycsb::{
    Distribution, MAX_KEY_SIZE, MAX_VALUE_SIZE, MIN_BINARY_KEY_SIZE, MIN_VALUE_SIZE, Workload,
};

pub use report::{PlotKind, ServerFabric, YcsbReport, YcsbSweep, load_reports, plot};
pub use resources::CpuRole;
pub use target::{ServerIdentity, Session, Store, StoreError, StoreOp, StoreReply};

/// Most client threads a run may have.
pub const MAX_CLIENTS: usize = 4096;
/// Most operations one client may keep in flight (a KV-node worker queues at most 4096 requests by default).
pub const MAX_OUTSTANDING: usize = 4096;
/// Longest measured phase, in seconds (the timeline keeps one entry per second).
pub const MAX_SECONDS: f64 = 24.0 * 3600.0;

/// The systems the benchmark knows: DINOMO and the variants of the DINOMO paper built on the same code
/// ([`dinomo_cluster::Variant`]), and the pDPM baselines of [`dinomo_pdpm`] ([`pdpm`]). Systems of the papers that
/// are not built yet are named in [`SYSTEMS_NOT_BUILT`] so that asking for one gives a clear answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// DINOMO: ownership partitioning, DAC, one-sided reads of the memory node's index.
    Dinomo,
    /// DINOMO-S: DINOMO with a shortcut-only cache (every hit costs one READ).
    DinomoS,
    /// DINOMO-N: shared-nothing, one index partition per KV node; data moves when ownership does.
    DinomoN,
    /// pDPM DirectDS: one-sided verbs only, per-key locks on the memory nodes; reads lock (3 round trips).
    #[serde(rename = "directds")]
    DirectDs,
    /// pDPM DirectDS-C: DirectDS with CRC-checked, lock-free reads (1 round trip).
    #[serde(rename = "directds-c")]
    DirectDsC,
    /// pDPM CentralDS: a coordinator behind RPC owns the metadata (a read is a LOOKUP and a READ).
    #[serde(rename = "centralds")]
    CentralDs,
    /// pDPM SepDS, published as Clover: one-sided reads and writes along per-key version chains, a metadata
    /// server for space and garbage collection (a read is 1 round trip on a cursor hit, a write 2).
    Clover,
}

/// The systems of the papers that are not built yet.
pub const SYSTEMS_NOT_BUILT: [&str; 2] = ["ditto", "tac"];

impl System {
    /// Every system that can be run.
    pub const BUILT: [System; 7] = [
        System::Dinomo,
        System::DinomoS,
        System::DinomoN,
        System::DirectDs,
        System::DirectDsC,
        System::CentralDs,
        System::Clover,
    ];

    /// The pDPM baselines the pDPM figures run: DirectDS, DirectDS-C, CentralDS and Clover (the paper's SepDS).
    pub const PDPM: [System; 4] = [
        System::DirectDs,
        System::DirectDsC,
        System::CentralDs,
        System::Clover,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::DirectDs => "directds",
            System::DirectDsC => "directds-c",
            System::CentralDs => "centralds",
            System::Clover => "clover",
            dinomo => dinomo.variant().map_or("dinomo", |v| v.name()),
        }
    }

    /// The cluster variant that runs it; `None` for the pDPM baselines, which run no DINOMO cluster.
    pub fn variant(self) -> Option<dinomo_cluster::Variant> {
        match self {
            System::Dinomo => Some(dinomo_cluster::Variant::Dinomo),
            System::DinomoS => Some(dinomo_cluster::Variant::DinomoS),
            System::DinomoN => Some(dinomo_cluster::Variant::DinomoN),
            System::DirectDs | System::DirectDsC | System::CentralDs | System::Clover => None,
        }
    }

    /// Whether it is one of the pDPM baselines.
    pub fn is_pdpm(self) -> bool {
        self.variant().is_none()
    }

    /// The cache policy it runs with when none is asked for ("dac", or "shortcut-only" for DINOMO-S; "none" for
    /// the pDPM baselines, which have no cache).
    pub fn default_policy(self) -> String {
        match self.variant() {
            None => pdpm::NO_CACHE.to_string(),
            Some(v) => v
                .cache_policy(None)
                .map(|p| p.to_string())
                .unwrap_or_else(|_| dinomo_cache::Policy::default().to_string()),
        }
    }
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for System {
    type Err = String;

    fn from_str(s: &str) -> Result<System, String> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some(built) = System::BUILT.iter().find(|b| b.name() == lower) {
            return Ok(*built);
        }
        let built: Vec<&str> = System::BUILT.iter().map(|b| b.name()).collect();
        if SYSTEMS_NOT_BUILT.contains(&lower.as_str()) {
            Err(format!(
                "{lower} is not built yet ({} are not built yet; available: {})",
                SYSTEMS_NOT_BUILT.join(", "),
                built.join(", ")
            ))
        } else {
            Err(format!(
                "unknown system {s:?} (available: {}; not built yet: {})",
                built.join(", "),
                SYSTEMS_NOT_BUILT.join(", ")
            ))
        }
    }
}

/// Where the store under test runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TargetOptions {
    /// A whole cluster started in this process ([`dinomo_cluster::LocalCluster`]), reached over loopback TCP.
    InProcess(InProcessOptions),
    /// A running cluster, reached over the network through its routing nodes.
    Native(NativeOptions),
    /// Any server speaking the Redis protocol (a dinomo KV node's RESP port, a redis-server), through `GET` and
    /// `SET`. Its internal counters cannot be read: the report leaves them out.
    Resp(RespOptions),
}

impl TargetOptions {
    /// "in-process", "native" or "resp".
    pub fn name(&self) -> &'static str {
        match self {
            TargetOptions::InProcess(_) => "in-process",
            TargetOptions::Native(_) => "native",
            TargetOptions::Resp(_) => "resp",
        }
    }
}

/// Settings of an in-process cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InProcessOptions {
    /// KV nodes. Default 2.
    pub kns: usize,
    /// Worker threads per KV node. Default 2.
    pub kn_threads: usize,
    /// Cache bytes per KV node, split evenly among its workers. Default 64 MiB.
    pub cache_bytes: u64,
    /// Caching policy: dac, static-N, value-only, shortcut-only. Default dac.
    pub policy: String,
    /// Busy-wait per fabric round trip, in nanoseconds (emulates a microsecond fabric). Default 0.
    pub latency_ns: u64,
    /// Bytes a KV-node worker reads ahead for a batch's lookups (`kn.workers.read_ahead_bytes`): 0 gives the paper's
    /// KV nodes. Applies only with a `latency_ns` above 0, where round trips cost something. Default 1 MiB.
    #[serde(default = "read_ahead_bytes")]
    pub read_ahead_bytes: u64,
    /// Whether KV-node caches record keys an index walk found without a value (`kn.workers.cache.remember_absent`):
    /// false gives the paper's DAC. Applies only with a `latency_ns` above 0. Default true.
    #[serde(default = "remember_absent")]
    pub remember_absent: bool,
    /// The memory node's merge threads. Default 4.
    pub merge_threads: usize,
    /// Bytes of the memory node's pool (anonymous memory, touched only as it is used); `None` sizes it from the
    /// records: four times their log entries, at least 1 GiB.
    pub pool_bytes: Option<u64>,
    /// KV-node liveness lease in milliseconds (heartbeats every tenth of it). Default 2000: long, so that a machine
    /// busy with the benchmark itself never takes a late heartbeat for a failure (failures are `bench elastic`'s
    /// subject).
    pub lease_ms: u64,
    /// pDPM baselines: memory nodes, each over its own anonymous pool. Default 1 (DINOMO runs one memory node and
    /// takes no other value).
    #[serde(default = "one_usize")]
    pub memory_nodes: usize,
    /// pDPM baselines: copies of every value, on distinct memory nodes (at most `memory_nodes`). Default 1.
    #[serde(default = "one_u32")]
    pub replication: u32,
    /// pDPM baselines: keys the store is sized for (slots of DirectDS, blocks of CentralDS); `None` sizes it from
    /// the records and the operations: `records + ops` (twice the records without `ops`), at least 1024. Writes
    /// of new keys beyond it may fail with "table full", counted as failed operations.
    #[serde(default)]
    pub pdpm_keys: Option<u64>,
    /// Clover: how long a retired version's slot waits before reuse (the metadata server's reclaim lease, the
    /// paper's Tr), in milliseconds. Default 100, the store's. Retired slots waiting out the lease are not free, so
    /// a longer lease needs more slots at a given write rate.
    #[serde(default = "clover_reclaim_lease_ms")]
    pub clover_reclaim_lease_ms: u64,
    /// Clover: a read whose round trip took longer than this many milliseconds is abandoned and starts over (at
    /// most half the reclaim lease). Default 50, the store's. A stall of the client thread that long (a loaded
    /// machine) costs an extra round trip, never a wrong value; runs that count round trips exactly set it long.
    #[serde(default = "clover_read_timeout_ms")]
    pub clover_read_timeout_ms: u64,
}

fn clover_reclaim_lease_ms() -> u64 {
    dinomo_pdpm::clover::MetadataConfig::default()
        .reclaim_lease
        .as_millis() as u64
}

fn clover_read_timeout_ms() -> u64 {
    dinomo_pdpm::clover::CloverSettings::default()
        .read_timeout
        .as_millis() as u64
}

fn read_ahead_bytes() -> u64 {
    dinomo_kn::KnConfig::default().read_ahead_bytes
}

fn remember_absent() -> bool {
    dinomo_cache::CacheConfig::default().remember_absent
}

fn one_usize() -> usize {
    1
}

fn one_u32() -> u32 {
    1
}

impl Default for InProcessOptions {
    fn default() -> Self {
        InProcessOptions {
            kns: 2,
            kn_threads: 2,
            cache_bytes: 64 << 20,
            policy: "dac".to_string(),
            latency_ns: 0,
            read_ahead_bytes: read_ahead_bytes(),
            remember_absent: remember_absent(),
            merge_threads: 4,
            pool_bytes: None,
            lease_ms: 2000,
            memory_nodes: 1,
            replication: 1,
            pdpm_keys: None,
            clover_reclaim_lease_ms: clover_reclaim_lease_ms(),
            clover_read_timeout_ms: clover_read_timeout_ms(),
        }
    }
}

/// Settings of a running cluster.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NativeOptions {
    /// Routing nodes (or KV nodes) to fetch the routing table from.
    pub seeds: Vec<String>,
    /// The memory node's fabric address, to read its merge statistics (optional).
    pub dpm: Option<String>,
    /// The cluster token, presented to the memory node and the KV and routing nodes (never written to reports).
    #[serde(skip)]
    pub token: String,
}

/// Settings of a RESP server.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RespOptions {
    /// Its addresses (HOST:PORT); client sessions take them in turn, one connection each.
    pub addrs: Vec<String>,
    /// The password sent with `AUTH` on every connection; empty for none (never written to reports).
    #[serde(skip)]
    pub password: String,
}

/// Settings of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YcsbOptions {
    /// The system under test.
    pub system: System,
    /// Where it runs.
    pub target: TargetOptions,
    /// Operation mix.
    pub workload: Workload,
    /// Which records operations target.
    pub distribution: Distribution,
    /// Records loaded before the run (and the key space of reads and updates). Default 100 000.
    pub records: u64,
    /// Bytes per key. Default 8.
    pub key_bytes: usize,
    /// Bytes per value. Default 1024.
    pub value_bytes: usize,
    /// Closed-loop client threads. Default 8.
    pub clients: usize,
    /// Operations each client keeps in flight (pipelined over one connection per node, or over its one RESP
    /// connection). Default 1.
    pub outstanding: usize,
    /// Warm-up before the measured phase, in seconds. Default 2.
    pub warmup_secs: f64,
    /// Length of the measured phase, in seconds; with `ops`, the most it may last. Default 10.
    pub secs: f64,
    /// Warm-up operations in all (split among the clients) instead of a timed warm-up; `warmup_secs` still bounds
    /// it.
    pub warmup_ops: Option<u64>,
    /// Measured operations in all (split among the clients); `secs` still bounds the phase.
    pub ops: Option<u64>,
    /// Seed of the operation streams: the same seed gives every client the same operations.
    pub seed: u64,
    /// Load the records first. Default true; off to run again against a cluster loaded before.
    pub load: bool,
    /// Check every value read. Default true.
    pub verify: bool,
    /// How long one operation may take, retries included, before it counts as failed. Default 5 s.
    pub op_timeout_ms: u64,
}

impl Default for YcsbOptions {
    fn default() -> Self {
        YcsbOptions {
            system: System::Dinomo,
            target: TargetOptions::InProcess(InProcessOptions::default()),
            workload: Workload::A,
            distribution: Workload::A.default_distribution(),
            records: 100_000,
            key_bytes: 8,
            value_bytes: 1024,
            clients: 8,
            outstanding: 1,
            warmup_secs: 2.0,
            secs: 10.0,
            warmup_ops: None,
            ops: None,
            seed: 42,
            load: true,
            verify: true,
            op_timeout_ms: 5000,
        }
    }
}

impl YcsbOptions {
    /// Checks the settings before anything starts.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            (1..=MAX_CLIENTS).contains(&self.clients),
            "--clients must be 1 to {MAX_CLIENTS} (got {})",
            self.clients
        );
        ensure!(
            (1..=MAX_OUTSTANDING).contains(&self.outstanding),
            "--outstanding must be 1 to {MAX_OUTSTANDING} (got {})",
            self.outstanding
        );
        ensure!(
            (MIN_BINARY_KEY_SIZE..=MAX_KEY_SIZE).contains(&self.key_bytes),
            "--key-bytes must be {MIN_BINARY_KEY_SIZE} to {MAX_KEY_SIZE} (got {})",
            self.key_bytes
        );
        ensure!(
            (MIN_VALUE_SIZE..=MAX_VALUE_SIZE).contains(&self.value_bytes),
            "--value-bytes must be {MIN_VALUE_SIZE} to {MAX_VALUE_SIZE}: a value names its record and version in \
             its first 16 bytes (got {})",
            self.value_bytes
        );
        ensure!(
            self.secs > 0.0 && self.secs <= MAX_SECONDS,
            "--secs must be above 0 and at most {MAX_SECONDS} (got {})",
            self.secs
        );
        ensure!(
            self.warmup_secs >= 0.0 && self.warmup_secs <= MAX_SECONDS,
            "--warmup-secs must be 0 to {MAX_SECONDS} (got {})",
            self.warmup_secs
        );
        ensure!(self.ops != Some(0), "--ops must be at least 1");
        ensure!(self.op_timeout_ms > 0, "--op-timeout-ms must be positive");
        if self.workload.mix().needs_records() {
            ensure!(
                self.records > 0,
                "workload {} reads or updates existing records: --records must be at least 1",
                self.workload
            );
        }
        self.distribution.validate()?;
        // Over RESP the system names what serves the address (`dinomo up --system S`).
        if self.system.is_pdpm() && matches!(self.target, TargetOptions::Native(_)) {
            bail!(
                "{} has no native server: run it in this process (--target in-process) or behind `dinomo up \
                 --system {}` (--target resp)",
                self.system,
                self.system
            );
        }
        match &self.target {
            TargetOptions::InProcess(p) => {
                ensure!(p.kns >= 1, "--kns must be at least 1");
                ensure!(p.kn_threads >= 1, "--kn-threads must be at least 1");
                ensure!(p.merge_threads >= 1, "--merge-threads must be at least 1");
                ensure!(p.lease_ms >= 10, "--lease-ms must be at least 10");
                match self.system.variant() {
                    Some(variant) => {
                        ensure!(
                            p.memory_nodes == 1 && p.replication == 1,
                            "{} runs one memory node: --memory-nodes and --replication are for the pDPM \
                             baselines (directds, directds-c, centralds, clover)",
                            self.system
                        );
                        let policy = match p.policy.parse::<dinomo_cache::Policy>() {
                            Ok(policy) => policy,
                            Err(e) => bail!("--policy: {e}"),
                        };
                        if let Err(e) = variant.cache_policy(Some(policy)) {
                            bail!("--policy: {e}");
                        }
                    }
                    None => pdpm::validate(self, p)?,
                }
            }
            TargetOptions::Native(n) => {
                ensure!(
                    !n.seeds.is_empty(),
                    "--target native needs the address of a routing node (--seed HOST:PORT)"
                );
            }
            TargetOptions::Resp(r) => {
                ensure!(
                    !r.addrs.is_empty(),
                    "--target resp needs the address of a RESP server (--resp HOST:PORT)"
                );
            }
        }
        Ok(())
    }

    /// The operation timeout.
    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
}

/// What a run tells its caller while it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A step starts ("starting 2 KV nodes", "warming up").
    Phase(String),
    /// Records loaded so far.
    Load {
        /// Loaded.
        done: u64,
        /// To load.
        total: u64,
    },
    /// One second of the measured phase ended.
    Second {
        /// Seconds since the measured phase began.
        t_s: u64,
        /// Operations per second in that second.
        ops_per_s: f64,
        /// 99th-percentile latency in that second, µs.
        p99_us: f64,
    },
}

/// Runs one benchmark: starts or reaches the store, loads it, runs the workload, and reports.
pub fn run_ycsb(
    opts: &YcsbOptions,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<YcsbReport> {
    opts.validate()?;
    let store = target::open(opts, progress)?;
    driver::run(opts, &*store, progress)
}

/// Runs the same workload on in-process clusters of each size in `kns` (a fresh cluster for each), one after
/// another.
pub fn run_sweep(
    opts: &YcsbOptions,
    kns: &[usize],
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<YcsbSweep> {
    let TargetOptions::InProcess(base) = &opts.target else {
        bail!("a sweep over KV-node counts needs --target in-process");
    };
    ensure!(!kns.is_empty(), "--sweep-kns needs at least one node count");
    let mut runs = Vec::with_capacity(kns.len());
    for &n in kns {
        let o = YcsbOptions {
            target: TargetOptions::InProcess(InProcessOptions {
                kns: n,
                ..base.clone()
            }),
            ..opts.clone()
        };
        progress(Progress::Phase(format!("sweep: {n} KV node(s)")));
        runs.push(run_ycsb(&o, progress)?);
    }
    Ok(YcsbSweep { runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_not_built_are_named_in_the_error() {
        assert_eq!("dinomo".parse::<System>(), Ok(System::Dinomo));
        assert_eq!("DINOMO".parse::<System>(), Ok(System::Dinomo));
        assert_eq!("dinomo-s".parse::<System>(), Ok(System::DinomoS));
        assert_eq!("clover".parse::<System>(), Ok(System::Clover));
        let err = "ditto".parse::<System>().unwrap_err();
        assert!(
            err.contains("ditto is not built yet")
                && err.contains("available: dinomo, dinomo-s, dinomo-n"),
            "{err}"
        );
        let err = "redis".parse::<System>().unwrap_err();
        assert!(
            err.contains("unknown system") && err.contains("available: dinomo"),
            "{err}"
        );
    }

    #[test]
    fn bad_settings_are_refused_before_anything_starts() {
        let ok = YcsbOptions::default();
        ok.validate().unwrap();
        let bad = [
            YcsbOptions {
                clients: 0,
                ..ok.clone()
            },
            YcsbOptions {
                outstanding: MAX_OUTSTANDING + 1,
                ..ok.clone()
            },
            YcsbOptions {
                value_bytes: 8,
                ..ok.clone()
            },
            YcsbOptions {
                key_bytes: 4,
                ..ok.clone()
            },
            YcsbOptions {
                secs: 0.0,
                ..ok.clone()
            },
            YcsbOptions {
                records: 0,
                ..ok.clone()
            },
            YcsbOptions {
                ops: Some(0),
                ..ok.clone()
            },
            YcsbOptions {
                target: TargetOptions::Native(NativeOptions::default()),
                ..ok.clone()
            },
            YcsbOptions {
                target: TargetOptions::Resp(RespOptions::default()),
                ..ok.clone()
            },
            YcsbOptions {
                target: TargetOptions::InProcess(InProcessOptions {
                    policy: "lru".into(),
                    ..InProcessOptions::default()
                }),
                ..ok.clone()
            },
            // DINOMO-S caches shortcuts only.
            YcsbOptions {
                system: System::DinomoS,
                ..ok.clone()
            },
        ];
        YcsbOptions {
            system: System::DinomoS,
            target: TargetOptions::InProcess(InProcessOptions {
                policy: System::DinomoS.default_policy(),
                ..InProcessOptions::default()
            }),
            ..ok.clone()
        }
        .validate()
        .unwrap();
        for o in bad {
            assert!(o.validate().is_err(), "{o:?}");
        }
        // Inserting needs no records.
        YcsbOptions {
            workload: Workload::InsertOnly,
            records: 0,
            ..ok
        }
        .validate()
        .unwrap();
    }
}
