//! Elasticity under load (Figures 6 and 8 of the DINOMO paper, scaled): an in-process cluster serves closed-loop
//! YCSB clients while a KV node is added, removed or crashed. Reports the throughput timeline, the dip and its
//! length, and for a crash the time from the kill until every key the dead node owned is served again. The
//! `replicate` scenario is Figure 7 scaled: under a skewed load, the hottest keys become shared by several nodes
//! (selective replication), and the report gives the throughput after against before.
//!
//! Any system built on the cluster runs it ([`ElasticOptions::system`]): for DINOMO-N (shared-nothing) the report
//! also gives the data the reconfiguration moved between partitions and how long that took. After the run every
//! record is read back and checked, so a reconfiguration that lost or damaged data fails the report.
//!
//! **Clover** (shared-everything, [`dinomo_pdpm::clover`]) runs `add`, `remove` and `failure` with compute nodes
//! in place of KV nodes: `kns` compute nodes share the `clients` client threads (each thread is one Clover client
//! of its compute node, as on the pDPM target of `bench ycsb`), over one memory node and a metadata server. No
//! compute node owns anything, so a join only starts the new node's clients (as many as a node had), a removal
//! stops one node's clients (they hand their unused slots back), and a failure stops them mid-write: each of the
//! node's clients stops inside its next write at one of the three crash points (written not linked, linked with
//! the shortcut behind, linked with no record sent to the metadata server), never runs its cleanup, and the
//! metadata server then reclaims its grants ([`dinomo_pdpm::clover::MetadataServer::reclaim_grants`]). The report
//! gives the interrupted writes, the slots reclaimed and how long that took, and the time until each key a crashed
//! client was writing is read back by a surviving client. `replicate` has no meaning for Clover (there is no owner
//! to add: every compute node already serves every key) and is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use dinomo_cluster::{
    Client, ClientConfig, ClientError, LocalCluster, LocalClusterConfig, MNodeConfig, NodeConfig,
    ReconfigEvent,
};
use dinomo_dpm::ProcessorConfig;
use dinomo_fabric::{Connector, MemoryNode};
use dinomo_kn::KnConfig;
use dinomo_pdpm::clover::{
    CloverClient, CloverCrash, CloverLayout, CloverSettings, MetadataConfig, MetadataServer,
};
use dinomo_pdpm::{PdpmError, PdpmStore};
use serde::Serialize;

use crate::svg;
use crate::ycsb::{
    Distribution, OpGenerator, OpKind, Workload, fill_value, key_bytes, verify_value,
};
use crate::ycsb_run::System;
use crate::ycsb_run::pdpm::{COORDINATOR_POOL, connector, pool_for};

/// What happens in the middle of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// A KV node joins.
    Add,
    /// A KV node is removed (it hands its keys over first).
    Remove,
    /// A KV node dies abruptly (no more heartbeats, connections cut).
    Failure,
    /// The hottest keys (record ids 0.. under a plain Zipf distribution) become shared by several KV nodes.
    Replicate,
}

impl Scenario {
    /// "add", "remove", "failure" or "replicate" (as `--scenario` takes it, and in file names).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Add => "add",
            Scenario::Remove => "remove",
            Scenario::Failure => "failure",
            Scenario::Replicate => "replicate",
        }
    }
}

impl std::str::FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "add" => Ok(Scenario::Add),
            "remove" => Ok(Scenario::Remove),
            "failure" | "kill" => Ok(Scenario::Failure),
            "replicate" => Ok(Scenario::Replicate),
            other => Err(format!(
                "unknown scenario {other:?} (add, remove, failure, replicate)"
            )),
        }
    }
}

/// Settings of one run.
#[derive(Debug, Clone, Serialize)]
pub struct ElasticOptions {
    /// The system under test (default DINOMO).
    pub system: System,
    /// The event.
    pub scenario: Scenario,
    /// KV nodes at the start.
    pub kns: usize,
    /// Worker threads per KV node.
    pub kn_threads: usize,
    /// Records loaded.
    pub keys: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Closed-loop client threads (one request outstanding each).
    pub clients: usize,
    /// The YCSB workload (A: 50% reads, 50% updates, as in the paper's elasticity runs).
    pub workload: Workload,
    /// Request distribution.
    pub distribution: Distribution,
    /// Run time before the event.
    pub before: Duration,
    /// Run time after the event.
    pub after: Duration,
    /// Width of a timeline bucket.
    pub bucket: Duration,
    /// KV-node lease (failure detection time).
    pub lease: Duration,
    /// KV-node heartbeat period.
    pub heartbeat: Duration,
    /// Injected fabric latency per round trip, ns.
    pub latency_ns: u64,
    /// Seed of the clients' generators.
    pub seed: u64,
    /// `replicate`: how many of the hottest keys become shared.
    pub hot_keys: u64,
    /// `replicate`: owners of each shared key (0: every node).
    pub replication: u32,
}

impl Default for ElasticOptions {
    fn default() -> Self {
        ElasticOptions {
            system: System::Dinomo,
            scenario: Scenario::Failure,
            kns: 4,
            kn_threads: 1,
            keys: 100_000,
            value_size: 64,
            clients: 8,
            workload: Workload::A,
            distribution: Distribution::Uniform,
            before: Duration::from_millis(1500),
            after: Duration::from_millis(1500),
            bucket: Duration::from_millis(10),
            lease: Duration::from_millis(30),
            heartbeat: Duration::from_millis(5),
            latency_ns: 0,
            seed: 42,
            hot_keys: 4,
            replication: 0,
        }
    }
}

/// One timeline bucket.
#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    /// Start of the bucket, ms since the measured phase began.
    pub t_ms: f64,
    /// Operations completed per second in the bucket.
    pub ops_per_s: f64,
    /// Operations that failed (no owner before the client's deadline).
    pub failed: u64,
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct ElasticReport {
    /// The settings.
    pub options: ElasticOptions,
    /// When the event started, ms since the measured phase began.
    pub event_at_ms: f64,
    /// Mean throughput before the event (ops/s), after a warm-up fifth.
    pub baseline_ops_per_s: f64,
    /// Mean throughput in the last half of the time after the event.
    pub settled_ops_per_s: f64,
    /// `settled_ops_per_s / baseline_ops_per_s`.
    pub settled_over_baseline: f64,
    /// Lowest bucket after the event (ops/s).
    pub min_ops_per_s: f64,
    /// Time after the event during which buckets stayed below 80% of the baseline, until three in a row recovered.
    pub dip_ms: f64,
    /// For a failure: from the kill until every key the node owned was served again.
    pub all_keys_served_after_ms: Option<f64>,
    /// For a failure: from the kill until the M-node noticed (the lease ran out).
    pub noticed_after_ms: Option<f64>,
    /// The reconfigurations the M-node performed during the run.
    pub reconfigurations: Vec<ReconfigEvent>,
    /// Keys whose data the reconfigurations copied into another node's partition (DINOMO-N; 0 otherwise).
    pub moved_keys: u64,
    /// Bytes of log entries those copies wrote.
    pub moved_bytes: u64,
    /// How long the M-node waited for the data to move, ms.
    pub move_ms: f64,
    /// Records read back and checked after the run (every one loaded).
    pub values_checked: u64,
    /// Of those, records that were gone.
    pub values_missing: u64,
    /// Of those, records whose value was not one the run wrote for them.
    pub values_corrupt: u64,
    /// Clover runs: what happened to the compute nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clover: Option<CloverEvent>,
    /// The timeline.
    pub timeline: Vec<Bucket>,
}

fn cluster_config(o: &ElasticOptions) -> LocalClusterConfig {
    let mut cfg = LocalClusterConfig {
        pool_size: (o.keys * (o.value_size as u64 + 64) * 4).max(512 << 20),
        processor: ProcessorConfig {
            merge_threads: 2,
            segment_size: 4 << 20,
            ..ProcessorConfig::default()
        },
        kns: o.kns,
        node: NodeConfig {
            kn: KnConfig {
                threads: o.kn_threads,
                max_value_len: 64 << 10,
                ..KnConfig::default()
            },
            lease_ttl: o.lease,
            heartbeat: o.heartbeat,
            ..NodeConfig::default()
        },
        mnode: MNodeConfig {
            check_interval: Duration::from_millis(1),
            ..MNodeConfig::default()
        },
        injected_latency_ns: o.latency_ns,
        ..LocalClusterConfig::default()
    };
    if let Some(variant) = o.system.variant() {
        variant.configure(&mut cfg);
    }
    cfg
}

impl ElasticOptions {
    /// The stem of the run's files: `elastic-SCENARIO`, with the system's name after `elastic-` for systems other
    /// than DINOMO.
    pub fn file_stem(&self) -> String {
        match self.system {
            System::Dinomo => format!("elastic-{}", self.scenario.name()),
            other => format!("elastic-{}-{}", other.name(), self.scenario.name()),
        }
    }
}

/// Writes version 0 of every record through up to 4 loader threads, each with its own client from `connect`,
/// written with `put`.
fn load_every_record<C>(
    o: &ElasticOptions,
    connect: impl Fn() -> anyhow::Result<C> + Sync,
    put: impl Fn(&mut C, &[u8], &[u8]) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let loaders = o.clients.clamp(1, 4) as u64;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..loaders)
            .map(|c| {
                let (connect, put) = (&connect, &put);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut cl = connect()?;
                    let (mut k, mut v) = (Vec::new(), Vec::new());
                    for id in (c..o.keys).step_by(loaders as usize) {
                        key_bytes(id, 8, &mut k)?;
                        fill_value(id, 0, o.value_size.max(16), &mut v)?;
                        put(&mut cl, &k, &v).with_context(|| format!("loading record {id}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("loader panicked"))??;
        }
        Ok(())
    })
}

/// Reads every record back through up to 4 reader threads, each with its own client from `connect`, read with
/// `get`: (checked, missing, corrupt).
fn read_every_record_back<C>(
    o: &ElasticOptions,
    connect: impl Fn() -> anyhow::Result<C> + Sync,
    get: impl Fn(&mut C, &[u8]) -> anyhow::Result<Option<Vec<u8>>> + Sync,
) -> anyhow::Result<(u64, u64, u64)> {
    let readers = o.clients.clamp(1, 4) as u64;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers)
            .map(|c| {
                let (connect, get) = (&connect, &get);
                scope.spawn(move || -> anyhow::Result<(u64, u64, u64)> {
                    let mut cl = connect()?;
                    let mut k = Vec::new();
                    let (mut checked, mut missing, mut corrupt) = (0, 0, 0);
                    for id in (c..o.keys).step_by(readers as usize) {
                        key_bytes(id, 8, &mut k)?;
                        checked += 1;
                        match get(&mut cl, &k)
                            .with_context(|| format!("reading record {id} back"))?
                        {
                            None => missing += 1,
                            Some(v) if verify_value(id, &v).is_err() => corrupt += 1,
                            Some(_) => {}
                        }
                    }
                    Ok((checked, missing, corrupt))
                })
            })
            .collect();
        let mut total = (0, 0, 0);
        for h in handles {
            let (c, m, x) = h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
            total = (total.0 + c, total.1 + m, total.2 + x);
        }
        Ok(total)
    })
}

/// Runs one scenario.
pub fn run_elastic(
    o: &ElasticOptions,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<ElasticReport> {
    anyhow::ensure!(
        o.kns >= 2 || o.scenario == Scenario::Add,
        "removing or killing needs 2 or more KV nodes"
    );
    anyhow::ensure!(o.clients >= 1 && o.keys >= 1, "need clients and keys");
    anyhow::ensure!(!o.bucket.is_zero(), "bucket width must be positive");
    if o.system == System::Clover {
        return run_elastic_clover(o, progress);
    }
    anyhow::ensure!(
        !o.system.is_pdpm(),
        "{} has no KV nodes to add, remove or kill: bench elastic runs dinomo, dinomo-s, dinomo-n or clover",
        o.system
    );
    anyhow::ensure!(
        !(o.scenario == Scenario::Replicate && o.system == System::DinomoN),
        "dinomo-n has no selective replication: the replicate scenario runs on dinomo or dinomo-s"
    );
    let mut cluster = LocalCluster::start(cluster_config(o)).context("starting the cluster")?;
    let client_cfg = ClientConfig {
        op_timeout: Duration::from_secs(10),
        max_retry_pause: Duration::from_millis(1),
        ..cluster.client_config()
    };
    progress(&format!("loading {} keys", o.keys));
    load_every_record(
        o,
        || Ok(Client::connect(client_cfg.clone())?),
        |cl: &mut Client, k, v| Ok(cl.set(k, v)?),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    progress(&format!(
        "running {:?} with the event at {:?}",
        o.before + o.after,
        o.before
    ));
    let workers: Vec<_> = (0..o.clients as u64)
        .map(|c| {
            let (cfg, o, stop) = (client_cfg.clone(), o.clone(), stop.clone());
            std::thread::spawn(move || -> anyhow::Result<BucketCounts> {
                let mut cl = Client::connect(cfg)?;
                let mut ops = OpGenerator::for_client(
                    o.workload,
                    o.distribution,
                    o.keys,
                    o.seed,
                    c,
                    o.clients as u64,
                )?;
                let mut counts = BucketCounts::new(&o);
                let (mut k, mut v) = (Vec::new(), Vec::new());
                let mut version = 1;
                while !stop.load(Ordering::Acquire) {
                    let op = ops.next();
                    key_bytes(op.key_id, 8, &mut k)?;
                    let r = match op.kind {
                        OpKind::Read => cl.get(&k).map(|_| ()),
                        OpKind::ReadModifyWrite => cl.get(&k).and_then(|_| {
                            fill_value(op.key_id, version, o.value_size.max(16), &mut v)
                                .map_err(|e| ClientError::Invalid(e.to_string()))?;
                            cl.set(&k, &v)
                        }),
                        OpKind::Update | OpKind::Insert => {
                            fill_value(op.key_id, version, o.value_size.max(16), &mut v)
                                .map_err(|e| ClientError::Invalid(e.to_string()))?;
                            cl.set(&k, &v)
                        }
                    };
                    version += 1;
                    let ok = match r {
                        Ok(()) => true,
                        Err(ClientError::Invalid(e)) => anyhow::bail!("invalid request: {e}"),
                        Err(_) => false,
                    };
                    counts.count(&o, start, ok);
                }
                Ok(counts)
            })
        })
        .collect();

    std::thread::sleep(o.before.saturating_sub(start.elapsed()));
    let event_at = start.elapsed();
    let mut served_after = None;
    let mut kill_since_mnode_start = None;
    match o.scenario {
        Scenario::Add => {
            cluster.add_node()?;
        }
        Scenario::Remove => {
            let victim = cluster.nodes()[0].id();
            cluster.remove_node(victim)?;
        }
        Scenario::Replicate => {
            let factor = match o.replication {
                0 => o.kns as u32,
                r => r,
            };
            let mut k = Vec::new();
            for id in 0..o.hot_keys.min(o.keys) {
                key_bytes(id, 8, &mut k)?;
                cluster.mnode().set_replication(&k, factor)?;
            }
        }
        Scenario::Failure => {
            let victim = cluster.nodes()[0].id();
            let routing = cluster.nodes()[0].routing();
            let mut after = routing.ring.clone();
            after.remove_node(victim);
            // Keys the victim owned: one per (new owner, worker thread) is probed by its own thread, since each
            // worker of each survivor starts serving its share on its own; up to 256 more are read afterwards.
            let mut k = Vec::new();
            let mut owned: Vec<Vec<u8>> = Vec::new();
            let mut probes: std::collections::BTreeMap<(u32, usize), Vec<u8>> = Default::default();
            for id in 0..o.keys {
                key_bytes(id, 8, &mut k)?;
                if routing.ring.primary(&k) == Some(victim) {
                    let heir = after.primary(&k).unwrap_or(0);
                    probes
                        .entry((heir, dinomo_kn::thread_for_key(&k, o.kn_threads)))
                        .or_insert_with(|| k.clone());
                    if owned.len() < 256 {
                        owned.push(k.clone());
                    }
                }
            }
            let probers: Vec<_> = probes
                .into_values()
                .map(|key| {
                    let cfg = client_cfg.clone();
                    let cl = Client::connect(cfg);
                    (key, cl)
                })
                .collect();
            // The probes wait behind this gate until the node is down: a probe answered by the node before the
            // crash would time nothing.
            let gate = Arc::new(std::sync::RwLock::new(()));
            let closed = gate.write().unwrap_or_else(|p| p.into_inner());
            let killed = Instant::now();
            kill_since_mnode_start = Some(killed.duration_since(cluster.mnode().started()));
            let handles: Vec<_> = probers
                .into_iter()
                .map(|(key, cl)| {
                    let gate = gate.clone();
                    std::thread::spawn(move || -> anyhow::Result<Duration> {
                        let mut cl = cl?;
                        drop(gate.read().unwrap_or_else(|p| p.into_inner()));
                        cl.get(&key)
                            .context("a key of the killed node was never served again")?;
                        Ok(killed.elapsed())
                    })
                })
                .collect();
            let crashed = cluster.crash_node(victim);
            drop(closed);
            crashed?;
            let mut last = Duration::ZERO;
            for h in handles {
                last = last.max(h.join().map_err(|_| anyhow::anyhow!("prober panicked"))??);
            }
            served_after = Some(last.as_secs_f64() * 1e3);
            let mut check = Client::connect(client_cfg.clone())?;
            for key in &owned {
                check
                    .get(key)
                    .context("a key of the killed node is not served")?;
            }
        }
    }
    std::thread::sleep((o.before + o.after).saturating_sub(start.elapsed()));
    stop.store(true, Ordering::Release);
    let mut counts = BucketCounts::new(o);
    for w in workers {
        counts.add(&w.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
    }
    let t = Timeline::of(o, event_at, &counts);
    // The first `kns` events are the initial joins.
    let all = cluster.mnode().events();
    let reconfigurations = all[o.kns.min(all.len())..].to_vec();
    progress(&format!("reading all {} keys back", o.keys));
    let (values_checked, values_missing, values_corrupt) = read_every_record_back(
        o,
        || Ok(Client::connect(client_cfg.clone())?),
        |cl: &mut Client, k| Ok(cl.get(k)?),
    )?;
    cluster.stop();
    Ok(ElasticReport {
        options: o.clone(),
        event_at_ms: event_at.as_secs_f64() * 1e3,
        baseline_ops_per_s: t.baseline,
        settled_ops_per_s: t.settled,
        settled_over_baseline: t.settled_over_baseline(),
        min_ops_per_s: t.min,
        dip_ms: t.dip_ms,
        all_keys_served_after_ms: served_after,
        noticed_after_ms: kill_since_mnode_start.and_then(|k| {
            reconfigurations
                .iter()
                .find(|e| e.kind == dinomo_cluster::ReconfigKind::Failure)
                .map(|e| e.noticed_at.saturating_sub(k).as_secs_f64() * 1e3)
        }),
        moved_keys: reconfigurations.iter().map(|e| e.moved_keys).sum(),
        moved_bytes: reconfigurations.iter().map(|e| e.moved_bytes).sum(),
        move_ms: reconfigurations
            .iter()
            .map(|e| e.move_duration.as_secs_f64() * 1e3)
            .sum(),
        reconfigurations,
        values_checked,
        values_missing,
        values_corrupt,
        clover: None,
        timeline: t.buckets,
    })
}

/// Operations completed and failed per bucket of a run, one bucket past its end taking the stragglers.
struct BucketCounts {
    done: Vec<u64>,
    failed: Vec<u64>,
}

impl BucketCounts {
    fn new(o: &ElasticOptions) -> BucketCounts {
        let buckets = ((o.before + o.after).as_nanos() / o.bucket.as_nanos()) as usize + 1;
        BucketCounts {
            done: vec![0; buckets],
            failed: vec![0; buckets],
        }
    }

    /// Counts an operation that ended now, `ok` or failed, in the bucket of its time since `start`.
    fn count(&mut self, o: &ElasticOptions, start: Instant, ok: bool) {
        let b =
            ((start.elapsed().as_nanos() / o.bucket.as_nanos()) as usize).min(self.done.len() - 1);
        if ok {
            self.done[b] += 1;
        } else {
            self.failed[b] += 1;
        }
    }

    fn add(&mut self, other: &BucketCounts) {
        for (a, b) in self.done.iter_mut().zip(&other.done) {
            *a += b;
        }
        for (a, b) in self.failed.iter_mut().zip(&other.failed) {
            *a += b;
        }
    }
}

/// A run's timeline and what it shows about the event.
struct Timeline {
    buckets: Vec<Bucket>,
    baseline: f64,
    settled: f64,
    min: f64,
    dip_ms: f64,
}

impl Timeline {
    /// From the operations completed and failed per bucket, the event at `event_at`.
    fn of(o: &ElasticOptions, event_at: Duration, counts: &BucketCounts) -> Timeline {
        let (done, failed) = (&counts.done, &counts.failed);
        let bucket_s = o.bucket.as_secs_f64();
        let last_full = (((o.before + o.after).as_nanos() / o.bucket.as_nanos()) as usize)
            .min(done.len())
            .min(failed.len());
        let buckets: Vec<Bucket> = (0..last_full)
            .map(|i| Bucket {
                t_ms: i as f64 * bucket_s * 1e3,
                ops_per_s: done[i] as f64 / bucket_s,
                failed: failed[i],
            })
            .collect();
        let event_bucket =
            ((event_at.as_nanos() / o.bucket.as_nanos()) as usize).min(buckets.len());
        let mean =
            |b: &[Bucket]| b.iter().map(|x| x.ops_per_s).sum::<f64>() / b.len().max(1) as f64;
        let baseline = mean(
            &buckets[(event_bucket / 5).min(event_bucket)..event_bucket.max(1).min(buckets.len())],
        );
        let after = &buckets[event_bucket..];
        let settled = mean(&after[after.len() / 2..]);
        let min = after
            .iter()
            .map(|b| b.ops_per_s)
            .fold(f64::INFINITY, f64::min);
        let dip_end = (0..after.len())
            .find(|&i| {
                after[i..]
                    .iter()
                    .take(3)
                    .all(|b| b.ops_per_s >= 0.8 * baseline)
            })
            .unwrap_or(after.len());
        Timeline {
            baseline,
            settled,
            min: if min.is_finite() { min } else { 0.0 },
            dip_ms: dip_end as f64 * bucket_s * 1e3,
            buckets,
        }
    }

    fn settled_over_baseline(&self) -> f64 {
        if self.baseline > 0.0 {
            self.settled / self.baseline
        } else {
            0.0
        }
    }
}

/// What a Clover run's event did to its compute nodes.
#[derive(Debug, Clone, Serialize)]
pub struct CloverEvent {
    /// Compute nodes before the event.
    pub compute_nodes_before: usize,
    /// Compute nodes after it.
    pub compute_nodes_after: usize,
    /// Client threads (Clover clients) that started (`add`) or stopped (`remove`, `failure`) with it.
    pub clients_changed: usize,
    /// `failure`: writes the crash interrupted, by crash point: written not linked, linked with the shortcut
    /// behind, linked and the shortcut advanced with no record sent.
    pub interrupted_writes: [u64; 3],
    /// `failure`: slots the metadata server took back from the crashed clients' grants.
    pub reclaimed_slots: u64,
    /// `failure`: how long reclaiming every crashed client's grants took, ms.
    pub reclaim_ms: Option<f64>,
    /// The metadata server's slots after the run: (free, granted, live, waiting).
    pub space_after: (usize, usize, usize, usize),
}

/// The crash points a crashed compute node's clients stop at, in turn.
const CRASH_POINTS: [CloverCrash; 3] = [
    CloverCrash::AfterWrite,
    CloverCrash::AfterLink,
    CloverCrash::AfterShortcut,
];

/// One memory node formatted for Clover, its metadata server and the connectors clients use.
struct CloverDeployment {
    _memory_node: Arc<MemoryNode>,
    _ms_host: Arc<MemoryNode>,
    ms: Arc<MetadataServer>,
    ms_connector: Connector,
    connectors: Vec<Connector>,
}

impl CloverDeployment {
    fn start(o: &ElasticOptions) -> anyhow::Result<CloverDeployment> {
        // Twice the live versions and the clients' grants (added clients too), and room for the versions that
        // wait out the reclaim lease under a write-heavy load.
        let grants = (o.clients as u64 * 2 + 8) * CloverSettings::default().grant_batch as u64;
        let layout = CloverLayout {
            // Linear probing within `max_probe` cells: a load factor of 1/4 keeps every key within reach.
            cells: (o.keys * 4).max(64),
            slots: o
                .keys
                .saturating_add(grants)
                .saturating_mul(2)
                .saturating_add(65_536),
            max_key: 8,
            max_value: u32::try_from(o.value_size.max(16)).context("value size")?,
            replication: 1,
        };
        let data = pool_for(layout.area_len())?;
        dinomo_pdpm::clover::format(&data, &layout).context("formatting the Clover area")?;
        let node_config = dinomo_fabric::NodeConfig::default();
        let memory_node = MemoryNode::new(data, node_config.clone());
        let connectors = vec![connector(&memory_node, o.latency_ns)];
        let ms = MetadataServer::new(&connectors, MetadataConfig::default())
            .context("starting Clover's metadata server")?;
        let ms_host = MemoryNode::new(pool_for(COORDINATOR_POOL)?, node_config);
        ms.serve(&ms_host);
        Ok(CloverDeployment {
            _memory_node: memory_node,
            ms_connector: connector(&ms_host, o.latency_ns),
            _ms_host: ms_host,
            ms,
            connectors,
        })
    }

    fn client(&self) -> anyhow::Result<CloverClient> {
        CloverClient::connect(
            &self.ms_connector,
            &self.connectors,
            CloverSettings::default(),
        )
        .context("connecting a Clover client")
    }
}

/// How a Clover client thread ended.
enum CloverExit {
    /// Stopped at the end of the run or by a removal; its client cleaned up.
    Stopped,
    /// Crashed inside a write of `key_id` at crash point `point` (an index into [`CRASH_POINTS`]); its client
    /// never cleaned up.
    Crashed {
        client: u32,
        key_id: u64,
        point: usize,
    },
}

/// One compute node's stop signals: `stop` ends its clients' loops cleanly, `crash` makes each stop inside its
/// next write.
#[derive(Default)]
struct ComputeNode {
    stop: AtomicBool,
    crash: AtomicBool,
}

type CloverWorker = std::thread::JoinHandle<anyhow::Result<(BucketCounts, CloverExit)>>;

/// Starts client thread `c` (of `of` generators) of compute node `node`.
#[allow(clippy::too_many_arguments)]
fn spawn_clover_client(
    d: &CloverDeployment,
    o: &ElasticOptions,
    c: u64,
    of: u64,
    node: Arc<ComputeNode>,
    stop_all: Arc<AtomicBool>,
    start: Instant,
) -> anyhow::Result<CloverWorker> {
    let mut cl = d.client()?;
    let o = o.clone();
    Ok(std::thread::spawn(move || {
        let mut ops = OpGenerator::for_client(o.workload, o.distribution, o.keys, o.seed, c, of)?;
        let mut counts = BucketCounts::new(&o);
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let mut version = 1;
        while !stop_all.load(Ordering::Acquire) && !node.stop.load(Ordering::Acquire) {
            let op = ops.next();
            key_bytes(op.key_id, 8, &mut k)?;
            if node.crash.load(Ordering::Acquire) {
                // The node dies inside this write: the client stops at a crash point and never cleans up (its
                // grants and unsent records are left for the metadata server to reclaim).
                // A node's clients are c, c + kns, ...: each stops at the next crash point in turn.
                let point = (c as usize / o.kns.max(1)) % CRASH_POINTS.len();
                fill_value(op.key_id, version, o.value_size.max(16), &mut v)?;
                let crashed = cl.put_crashing(&k, &v, CRASH_POINTS[point]);
                let client = cl.id();
                std::mem::forget(cl);
                if let Err(e) = crashed {
                    anyhow::bail!(
                        "the crashing write of record {} failed before its crash point: {e}",
                        op.key_id
                    );
                }
                return Ok((
                    counts,
                    CloverExit::Crashed {
                        client,
                        key_id: op.key_id,
                        point,
                    },
                ));
            }
            let r = match op.kind {
                OpKind::Read => cl.get(&k).map(|_| ()),
                OpKind::ReadModifyWrite => cl.get(&k).and_then(|_| {
                    fill_value(op.key_id, version, o.value_size.max(16), &mut v)
                        .map_err(|e| PdpmError::Config(e.to_string()))?;
                    cl.put(&k, &v)
                }),
                OpKind::Update | OpKind::Insert => {
                    fill_value(op.key_id, version, o.value_size.max(16), &mut v)
                        .map_err(|e| PdpmError::Config(e.to_string()))?;
                    cl.put(&k, &v)
                }
            };
            version += 1;
            let ok = match r {
                Ok(()) => true,
                Err(e) if e.is_invalid_request() => anyhow::bail!("invalid request: {e}"),
                Err(_) => false,
            };
            counts.count(&o, start, ok);
        }
        Ok((counts, CloverExit::Stopped))
    }))
}

/// Runs `add`, `remove` or `failure` on Clover (see the module's documentation).
fn run_elastic_clover(
    o: &ElasticOptions,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<ElasticReport> {
    anyhow::ensure!(
        o.scenario != Scenario::Replicate,
        "clover has no owners to add: every compute node already serves every key, so the replicate scenario \
         does not apply (run it on dinomo or dinomo-s)"
    );
    let d = CloverDeployment::start(o)?;
    progress(&format!("loading {} keys", o.keys));
    load_every_record(
        o,
        || d.client(),
        |cl: &mut CloverClient, k, v| Ok(cl.put(k, v)?),
    )?;
    let stop_all = Arc::new(AtomicBool::new(false));
    let nodes: Vec<Arc<ComputeNode>> = (0..o.kns).map(|_| Arc::default()).collect();
    // Client c belongs to compute node c mod kns; a joining node gets as many as the first node has.
    let per_node = o.clients.div_ceil(o.kns);
    let generators = (o.clients + per_node) as u64;
    let start = Instant::now();
    progress(&format!(
        "running {:?} with the event at {:?} on {} compute node(s)",
        o.before + o.after,
        o.before,
        o.kns
    ));
    let mut workers: Vec<(usize, CloverWorker)> = Vec::new();
    for c in 0..o.clients {
        let node = c % o.kns;
        let w = spawn_clover_client(
            &d,
            o,
            c as u64,
            generators,
            nodes[node].clone(),
            stop_all.clone(),
            start,
        )?;
        workers.push((node, w));
    }
    std::thread::sleep(o.before.saturating_sub(start.elapsed()));
    let event_at = start.elapsed();
    let mut event = CloverEvent {
        compute_nodes_before: o.kns,
        compute_nodes_after: o.kns,
        clients_changed: 0,
        interrupted_writes: [0; 3],
        reclaimed_slots: 0,
        reclaim_ms: None,
        space_after: (0, 0, 0, 0),
    };
    let mut served_after = None;
    let mut counts = BucketCounts::new(o);
    match o.scenario {
        Scenario::Add => {
            let joined = Arc::new(ComputeNode::default());
            for i in 0..per_node {
                let c = (o.clients + i) as u64;
                let w = spawn_clover_client(
                    &d,
                    o,
                    c,
                    generators,
                    joined.clone(),
                    stop_all.clone(),
                    start,
                )?;
                workers.push((o.kns, w));
            }
            event.compute_nodes_after = o.kns + 1;
            event.clients_changed = per_node;
        }
        Scenario::Remove | Scenario::Failure => {
            let victim = &nodes[0];
            let crash = o.scenario == Scenario::Failure;
            if crash {
                victim.crash.store(true, Ordering::Release);
            } else {
                victim.stop.store(true, Ordering::Release);
            }
            let killed = Instant::now();
            let (theirs, others): (Vec<_>, Vec<_>) =
                workers.into_iter().partition(|(n, _)| *n == 0);
            workers = others;
            let mut crashed = Vec::new();
            for (_, w) in theirs {
                let (theirs, exit) = w.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
                counts.add(&theirs);
                event.clients_changed += 1;
                if let CloverExit::Crashed {
                    client,
                    key_id,
                    point,
                } = exit
                {
                    event.interrupted_writes[point] += 1;
                    crashed.push((client, key_id));
                }
            }
            event.compute_nodes_after = o.kns - 1;
            if crash {
                // Nothing detects the crash here: the metadata server is told of it at once and takes the slots
                // back; the surviving compute nodes never waited on the dead one.
                let t = Instant::now();
                for (client, _) in &crashed {
                    event.reclaimed_slots +=
                        d.ms.reclaim_grants(*client)
                            .context("reclaiming a crashed client's grants")?
                            as u64;
                }
                event.reclaim_ms = Some(t.elapsed().as_secs_f64() * 1e3);
                // Every key a crashed client was writing is read by a surviving client (an unlinked version is
                // invisible, a lagging shortcut is chased).
                let mut check = d.client()?;
                let mut k = Vec::new();
                for (_, key_id) in &crashed {
                    key_bytes(*key_id, 8, &mut k)?;
                    let v = check
                        .get(&k)
                        .with_context(|| {
                            format!("reading record {key_id}, interrupted by the crash")
                        })?
                        .with_context(|| {
                            format!("record {key_id}, interrupted by the crash, is gone")
                        })?;
                    verify_value(*key_id, &v).map_err(|e| {
                        anyhow::anyhow!("record {key_id}, interrupted by the crash: {e}")
                    })?;
                }
                served_after = Some(killed.elapsed().as_secs_f64() * 1e3);
            }
        }
        Scenario::Replicate => unreachable!("refused above"),
    }
    std::thread::sleep((o.before + o.after).saturating_sub(start.elapsed()));
    stop_all.store(true, Ordering::Release);
    for (_, w) in workers {
        let (theirs, _) = w.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
        counts.add(&theirs);
    }
    let t = Timeline::of(o, event_at, &counts);
    progress(&format!("reading all {} keys back", o.keys));
    // Fresh clients: none of the run's cursors.
    let (values_checked, values_missing, values_corrupt) =
        read_every_record_back(o, || d.client(), |cl: &mut CloverClient, k| Ok(cl.get(k)?))?;
    let space = d.ms.space();
    event.space_after = (space.free, space.granted, space.live, space.waiting);
    Ok(ElasticReport {
        options: o.clone(),
        event_at_ms: event_at.as_secs_f64() * 1e3,
        baseline_ops_per_s: t.baseline,
        settled_ops_per_s: t.settled,
        settled_over_baseline: t.settled_over_baseline(),
        min_ops_per_s: t.min,
        dip_ms: t.dip_ms,
        all_keys_served_after_ms: served_after,
        noticed_after_ms: None,
        reconfigurations: Vec::new(),
        moved_keys: 0,
        moved_bytes: 0,
        move_ms: 0.0,
        values_checked,
        values_missing,
        values_corrupt,
        clover: Some(event),
        timeline: t.buckets,
    })
}

impl ElasticReport {
    /// The timeline as CSV.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("t_ms,ops_per_s,failed\n");
        for b in &self.timeline {
            s.push_str(&format!("{:.1},{:.0},{}\n", b.t_ms, b.ops_per_s, b.failed));
        }
        s
    }

    /// The timeline as an SVG chart; the event is a vertical marker line.
    pub fn to_svg(&self) -> String {
        let peak = self
            .timeline
            .iter()
            .map(|b| b.ops_per_s)
            .fold(0.0, f64::max);
        let series = [
            svg::Series {
                name: "throughput".into(),
                points: self
                    .timeline
                    .iter()
                    .map(|b| (b.t_ms, b.ops_per_s / 1e3))
                    .collect(),
            },
            svg::Series {
                name: self.options.scenario.name().into(),
                points: vec![(self.event_at_ms, 0.0), (self.event_at_ms, peak / 1e3)],
            },
        ];
        svg::render(&[svg::Panel {
            title: "Throughput while the cluster reconfigures",
            x_label: "time (ms)",
            y_label: "Kops/s",
            log2_x: false,
            series: &series,
        }])
    }

    /// A one-paragraph summary for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: {:?} at {:.0} ms: baseline {:.0} ops/s, lowest bucket {:.0} ops/s, below 80% for {:.0} ms, settled at {:.0} ops/s ({:.2}x the baseline)",
            self.options.system,
            self.options.scenario,
            self.event_at_ms,
            self.baseline_ops_per_s,
            self.min_ops_per_s,
            self.dip_ms,
            self.settled_ops_per_s,
            self.settled_over_baseline
        );
        if let Some(ms) = self.all_keys_served_after_ms {
            s.push_str(&format!(
                "; every key of the killed node served again {ms:.1} ms after the kill"
            ));
        }
        if let Some(ms) = self.noticed_after_ms {
            s.push_str(&format!(" (the M-node noticed after {ms:.1} ms)"));
        }
        if let Some(c) = &self.clover {
            s.push_str(&format!(
                "\n  compute nodes {} -> {} ({} client(s) {})",
                c.compute_nodes_before,
                c.compute_nodes_after,
                c.clients_changed,
                if c.compute_nodes_after > c.compute_nodes_before {
                    "started"
                } else {
                    "stopped"
                }
            ));
            if let Some(ms) = c.reclaim_ms {
                s.push_str(&format!(
                    "; writes interrupted {} written-not-linked, {} linked-shortcut-behind, {} linked-no-record; \
                     metadata server reclaimed {} slot(s) in {ms:.2} ms",
                    c.interrupted_writes[0], c.interrupted_writes[1], c.interrupted_writes[2], c.reclaimed_slots
                ));
            }
        }
        for e in &self.reconfigurations {
            s.push_str(&format!(
                "\n  M-node: {:?} of node {} (epoch {}) took {:.1} ms from noticing",
                e.kind,
                e.node,
                e.epoch,
                e.duration.as_secs_f64() * 1e3
            ));
            if e.moved_keys > 0 {
                s.push_str(&format!(
                    ", {:.1} ms of it moving {} keys ({} bytes) between partitions",
                    e.move_duration.as_secs_f64() * 1e3,
                    e.moved_keys,
                    e.moved_bytes
                ));
            }
        }
        s.push_str(&format!(
            "\n  afterwards {} of {} records read back intact",
            self.values_checked - self.values_missing - self.values_corrupt,
            self.values_checked
        ));
        if self.values_missing + self.values_corrupt > 0 {
            s.push_str(&format!(
                " — DATA LOST: {} missing, {} corrupt",
                self.values_missing, self.values_corrupt
            ));
        }
        s
    }
}
