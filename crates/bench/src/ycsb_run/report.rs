//! What a YCSB run reports, as JSON for scripts (and the projection model that builds on these runs), as a summary
//! for people, and as CSV and SVG.
//!
//! Everything a model needs per operation is in [`YcsbReport::resources`]: fabric round trips and bytes, lookups and
//! writes reaching the KV nodes, group commits, and CPU time by role (KV-node workers, KV-node network threads,
//! memory-node merge and RPC threads, the benchmark's clients) when the cluster runs in this process. A target that
//! cannot read a store's counters (a RESP server) leaves those parts out (`None`), never reports them as zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::driver::latency_histogram;
use super::resources::{CacheState, CpuRole, Deltas, WorkerTotals};
use super::target::{ServerIdentity, StoreError};
use super::{TargetOptions, YcsbOptions};
use crate::format::rate;
use crate::svg;
use crate::ycsb::OpKind;

/// The load phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadResult {
    /// Records written.
    pub records: u64,
    /// How long it took.
    pub secs: f64,
    /// Records per second.
    pub ops_per_s: f64,
}

/// One second of the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// Start, in seconds since the measured phase began.
    pub t_s: f64,
    /// How much time this entry covers: 1 s, less for the last, up to 1.5 s when a short last part-second was
    /// folded into it.
    pub secs: f64,
    /// Operations completed in it.
    pub ops: u64,
    /// Operations per second in it.
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
    /// Sealed log segments waiting to be merged at its end, when the memory node can be read.
    pub backlog_segments: Option<u64>,
}

/// Latency percentiles of a set of operations, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Operations measured.
    pub samples: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| ns as f64 / 1e3;
        if h.is_empty() {
            return Latency {
                samples: 0,
                mean_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        Latency {
            samples: h.len(),
            mean_us: h.mean() / 1e3,
            p50_us: us(h.value_at_quantile(0.5)),
            p90_us: us(h.value_at_quantile(0.9)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// What the clients saw, merged over all of them (the measured phase only).
pub(crate) struct Outcomes {
    all: Histogram<u64>,
    by_kind: [Histogram<u64>; 4],
    pub verified: u64,
    missing: u64,
    corrupt: u64,
    unavailable: u64,
    indeterminate: u64,
    first_problem: Option<String>,
}

fn kind_index(kind: OpKind) -> usize {
    OpKind::ALL
        .iter()
        .position(|&k| k == kind)
        .expect("every kind is listed")
}

impl Outcomes {
    pub(crate) fn new() -> Outcomes {
        Outcomes {
            all: latency_histogram(3),
            by_kind: std::array::from_fn(|_| latency_histogram(3)),
            verified: 0,
            missing: 0,
            corrupt: 0,
            unavailable: 0,
            indeterminate: 0,
            first_problem: None,
        }
    }

    /// A completed operation and its latency.
    pub(crate) fn record(&mut self, kind: OpKind, ns: u64) {
        let _ = self.all.record(ns);
        let _ = self.by_kind[kind_index(kind)].record(ns);
    }

    pub(crate) fn error(&mut self, e: &StoreError) {
        match e {
            StoreError::Indeterminate(_) => self.indeterminate += 1,
            StoreError::Unavailable(_) | StoreError::Invalid(_) => self.unavailable += 1,
        }
        self.first_problem.get_or_insert_with(|| e.to_string());
    }

    pub(crate) fn missing(&mut self, key_id: u64) {
        self.missing += 1;
        self.first_problem
            .get_or_insert_with(|| format!("record {key_id} was not found"));
    }

    pub(crate) fn corrupt(&mut self, key_id: u64, why: &str) {
        self.corrupt += 1;
        self.first_problem
            .get_or_insert_with(|| format!("record {key_id}: {why}"));
    }

    pub(crate) fn merge(&mut self, o: &Outcomes) {
        let _ = self.all.add(&o.all);
        for (a, b) in self.by_kind.iter_mut().zip(&o.by_kind) {
            let _ = a.add(b);
        }
        self.verified += o.verified;
        self.missing += o.missing;
        self.corrupt += o.corrupt;
        self.unavailable += o.unavailable;
        self.indeterminate += o.indeterminate;
        if self.first_problem.is_none() {
            self.first_problem.clone_from(&o.first_problem);
        }
    }
}

/// Operations of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindResult {
    /// The kind.
    pub kind: OpKind,
    /// Completed in the measured phase.
    pub ops: u64,
    /// Per second.
    pub ops_per_s: f64,
    /// Their latency.
    pub latency: Latency,
}

/// Operations that did not complete as they should.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    /// No node served the operation before its deadline.
    pub unavailable: u64,
    /// A write whose outcome is unknown.
    pub indeterminate: u64,
    /// Reads of a loaded or inserted record that found nothing.
    pub missing: u64,
    /// Reads whose value is not one the workload wrote for that record.
    pub corrupt: u64,
    /// The first of them, for people.
    pub first: Option<String>,
}

impl Errors {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.unavailable + self.indeterminate + self.missing + self.corrupt
    }
}

/// The measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Its length.
    pub secs: f64,
    /// Operations completed (a read-modify-write counts once).
    pub ops: u64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// By kind.
    pub by_kind: Vec<KindResult>,
    /// Reads whose value was checked and found right.
    pub reads_verified: u64,
    /// What went wrong.
    pub errors: Errors,
}

impl Measured {
    /// Operations of `kind` completed (0 when the workload has none).
    pub fn ops_of(&self, kind: crate::ycsb::OpKind) -> u64 {
        self.by_kind
            .iter()
            .find(|k| k.kind == kind)
            .map_or(0, |k| k.ops)
    }
}

/// Resources per operation of the measured phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PerOp {
    /// Fabric round trips (KV-node workers to the memory node).
    pub round_trips: f64,
    /// Fabric bytes sent by KV nodes (as on the TCP wire, headers included).
    pub bytes_out: f64,
    /// Fabric bytes received by KV nodes.
    pub bytes_in: f64,
    /// Lookups at KV nodes (a read or the read of a read-modify-write).
    pub lookups: f64,
    /// Writes logged at KV nodes.
    pub writes: f64,
    /// Group commits (one WRITE round trip each).
    pub commits: f64,
    /// Round trips of index walks (misses).
    pub index_walk_round_trips: f64,
    /// Entries read ahead for a batch's shortcut hits (`kn.workers.read_ahead_bytes`).
    #[serde(default)]
    pub entries_read_ahead: f64,
    /// Index walks made ahead, side by side, for a batch's misses.
    #[serde(default)]
    pub index_walks_ahead: f64,
    /// Entries the memory node merged into its index.
    pub merged_entries: Option<f64>,
    /// CPU µs of KV-node worker threads.
    pub kn_worker_cpu_us: Option<f64>,
    /// CPU µs of KV-node network threads.
    pub kn_network_cpu_us: Option<f64>,
    /// CPU µs of the memory node's merge threads.
    pub memory_merge_cpu_us: Option<f64>,
    /// CPU µs of the memory node's RPC threads.
    pub memory_rpc_cpu_us: Option<f64>,
    /// CPU µs of the benchmark's clients.
    pub client_cpu_us: Option<f64>,
}

/// Resources used in the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// Summed over every KV node.
    pub totals: WorkerTotals,
    /// CPU ns by role (in-process target only).
    pub cpu_ns: Option<BTreeMap<CpuRole, u64>>,
    /// Per operation.
    pub per_op: PerOp,
    /// Writes per group commit.
    pub writes_per_commit: f64,
}

/// Fractions of lookups by where they were answered; they sum to 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HitRatios {
    /// From a cached value (no round trip).
    pub value: f64,
    /// Through a cached shortcut (one READ).
    pub shortcut: f64,
    /// From the cache's record that the key has no value (no round trip).
    #[serde(default)]
    pub absent: f64,
    /// From the worker's unmerged log (no round trip).
    pub log: f64,
    /// By walking the index.
    pub miss: f64,
}

/// The KV nodes' caches in the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheReport {
    /// Lookups.
    pub lookups: u64,
    /// Answered by a value.
    pub value_hits: u64,
    /// Answered through a shortcut.
    pub shortcut_hits: u64,
    /// Answered from the cache's record that the key has no value.
    #[serde(default)]
    pub absent_hits: u64,
    /// Answered from the unmerged log.
    pub log_hits: u64,
    /// Walked the index.
    pub misses: u64,
    /// Shortcuts found stale.
    pub stale_shortcuts: u64,
    /// The split; `None` when nothing was looked up.
    pub ratios: Option<HitRatios>,
    /// The caches at the end.
    pub state: CacheState,
}

/// The memory node's merging in the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeReport {
    /// Sealed segments waiting to be merged when the phase began.
    pub backlog_segments_start: u64,
    /// ... when it ended.
    pub backlog_segments_end: u64,
    /// Bytes of entries waiting when it ended.
    pub backlog_bytes_end: u64,
    /// The most seen at a second's end.
    pub backlog_segments_max: u64,
    /// Entries merged into the index.
    pub merged_entries: u64,
    /// Per second.
    pub merged_entries_per_s: f64,
    /// Times a KV-node write waited for the merge to catch up.
    pub merge_waits: u64,
    /// Index partitions on the memory node when the phase ended (one per KV node for dinomo-n, 0 with one shared
    /// index).
    #[serde(default)]
    pub partitions: u64,
    /// Log segments the memory node's cleaner emptied and recycled.
    #[serde(default)]
    pub cleaned_segments: u64,
    /// Live entries it copied to do so.
    #[serde(default)]
    pub relocated_entries: u64,
    /// Bytes of those copies.
    #[serde(default)]
    pub relocated_bytes: u64,
    /// Runs of segments it emptied so that an index table could grow (the pool had room only in pieces).
    #[serde(default)]
    pub table_runs_made: u64,
    /// Pool bytes free when the phase ended.
    #[serde(default)]
    pub pool_free_bytes_end: u64,
}

/// One KV node's part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Its id.
    pub node_id: u32,
    /// Its share of the key space.
    pub share: f64,
    /// Lookups it served.
    pub lookups: u64,
    /// Writes it logged.
    pub writes: u64,
    /// Its fraction of all lookups and writes.
    pub load_share: f64,
    /// Fabric round trips.
    pub round_trips: u64,
    /// Fabric bytes sent.
    pub bytes_out: u64,
    /// Fabric bytes received.
    pub bytes_in: u64,
}

/// The machine the run was on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// Logical cores.
    pub cores: usize,
    /// "x86_64", "aarch64".
    pub arch: String,
    /// "linux".
    pub os: String,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YcsbReport {
    /// "dinomo bench ycsb".
    pub tool: String,
    /// Version of the tool.
    pub version: String,
    /// Where it ran.
    pub host: Host,
    /// Its settings.
    pub options: YcsbOptions,
    /// The system: the one run, or over RESP what the server says it is ("redis"; "resp" when it does not say;
    /// for a dinomo server, whose `INFO` does not tell its systems apart, the `--system` given).
    pub system: String,
    /// The server's version as it reports it (RESP targets).
    #[serde(default)]
    pub server_version: Option<String>,
    /// "in-process", "native" or "resp".
    pub target: String,
    /// KV nodes serving at the end; `None` when the target cannot tell (RESP).
    pub kv_nodes: Option<usize>,
    /// Worker threads per KV node, when known.
    pub kn_threads: Option<usize>,
    /// The load phase, if there was one.
    pub load: Option<LoadResult>,
    /// The measured phase.
    pub measured: Measured,
    /// Latency of every operation.
    pub latency: Latency,
    /// Resources, in all and per operation; `None` when the KV nodes' counters cannot be read (RESP).
    pub resources: Option<Resources>,
    /// Where lookups were answered; `None` when the KV nodes' counters cannot be read (RESP) or the system has no
    /// cache (the pDPM baselines).
    pub cache: Option<CacheReport>,
    /// The memory node's merging, when it can be read.
    pub merge: Option<MergeReport>,
    /// Each KV node (none when their counters cannot be read).
    pub nodes: Vec<NodeReport>,
    /// Per second.
    pub timeline: Vec<Second>,
    /// The serving processes' whole fabric traffic over the measured phase, as a RESP server publishes it
    /// (`INFO fabric`); `None` where it cannot be read.
    #[serde(default)]
    pub server_fabric: Option<ServerFabric>,
}

/// Fabric traffic of the server processes, every thread of them: the data path and the background work
/// (heartbeats, routing refreshes, a metadata server), per operation of the measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerFabric {
    /// Round trips in all.
    pub round_trips: u64,
    /// Round trips per operation.
    pub round_trips_per_op: f64,
    /// Bytes received from memory nodes per operation.
    pub bytes_in_per_op: f64,
    /// Bytes sent to memory nodes per operation.
    pub bytes_out_per_op: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Builds the report from what the run collected.
#[allow(clippy::too_many_arguments, reason = "one call site, each part named")]
pub(crate) fn assemble(
    opts: &YcsbOptions,
    identity: Option<ServerIdentity>,
    kv_nodes: Option<usize>,
    kn_threads: Option<usize>,
    load: Option<LoadResult>,
    outcomes: Outcomes,
    secs: f64,
    deltas: &Deltas,
    timeline: Vec<Second>,
) -> YcsbReport {
    let ops = outcomes.all.len();
    let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let by_kind = OpKind::ALL
        .iter()
        .zip(&outcomes.by_kind)
        .filter(|(k, h)| !h.is_empty() || opts.workload.mix().fraction(**k) > 0.0)
        .map(|(&kind, h)| KindResult {
            kind,
            ops: h.len(),
            ops_per_s: per_s(h.len()),
            latency: Latency::of(h),
        })
        .collect();
    let t = deltas.totals;
    let per = |n: u64| ratio(n, ops);
    let cpu = deltas.cpu.clone();
    let cpu_us = |role: CpuRole| {
        cpu.as_ref()
            .map(|c| c.get(&role).copied().unwrap_or(0) as f64 / 1e3 / ops.max(1) as f64)
    };
    let merged_entries = deltas
        .memory
        .as_ref()
        .map(|(a, b)| b.merged_entries.saturating_sub(a.merged_entries));
    let per_op = PerOp {
        round_trips: per(t.round_trips),
        bytes_out: per(t.bytes_out),
        bytes_in: per(t.bytes_in),
        lookups: per(t.lookups),
        writes: per(t.writes),
        commits: per(t.commits),
        index_walk_round_trips: per(t.index_walk_round_trips),
        entries_read_ahead: per(t.entries_read_ahead),
        index_walks_ahead: per(t.index_walks_ahead),
        merged_entries: merged_entries.map(per),
        kn_worker_cpu_us: cpu_us(CpuRole::KnWorkers),
        kn_network_cpu_us: cpu_us(CpuRole::KnNetwork),
        memory_merge_cpu_us: cpu_us(CpuRole::MemoryMerge),
        memory_rpc_cpu_us: cpu_us(CpuRole::MemoryRpc),
        client_cpu_us: cpu_us(CpuRole::Clients),
    };
    let misses = t.misses();
    let ratios = (t.lookups > 0).then(|| HitRatios {
        value: ratio(t.value_hits, t.lookups),
        shortcut: ratio(t.shortcut_hits, t.lookups),
        absent: ratio(t.absent_hits, t.lookups),
        log: ratio(t.log_hits, t.lookups),
        miss: ratio(misses, t.lookups),
    });
    let merge = deltas.memory.as_ref().map(|(a, b)| {
        let max_seen = timeline
            .iter()
            .filter_map(|s| s.backlog_segments)
            .max()
            .unwrap_or(0);
        let merged = b.merged_entries.saturating_sub(a.merged_entries);
        MergeReport {
            backlog_segments_start: a.backlog_segments,
            backlog_segments_end: b.backlog_segments,
            backlog_bytes_end: b.backlog_bytes,
            backlog_segments_max: max_seen.max(a.backlog_segments).max(b.backlog_segments),
            merged_entries: merged,
            merged_entries_per_s: per_s(merged),
            merge_waits: t.merge_waits,
            partitions: b.partitions,
            cleaned_segments: b.cleaned_segments.saturating_sub(a.cleaned_segments),
            relocated_entries: b.relocated_entries.saturating_sub(a.relocated_entries),
            relocated_bytes: b.relocated_bytes.saturating_sub(a.relocated_bytes),
            table_runs_made: b.table_runs_made.saturating_sub(a.table_runs_made),
            pool_free_bytes_end: b.pool_free_bytes,
        }
    });
    let node_work: u64 = deltas
        .per_node
        .iter()
        .map(|(_, _, n)| n.lookups + n.writes)
        .sum();
    let nodes = deltas
        .per_node
        .iter()
        .map(|&(node_id, share, n)| NodeReport {
            node_id,
            share,
            lookups: n.lookups,
            writes: n.writes,
            load_share: ratio(n.lookups + n.writes, node_work),
            round_trips: n.round_trips,
            bytes_out: n.bytes_out,
            bytes_in: n.bytes_in,
        })
        .collect();
    let seen = deltas.kv_counters;
    let (system, server_version) = match identity {
        // dinomo's INFO does not tell its systems apart: `--system` names the one serving the address.
        Some(id) if id.system == "dinomo" => (opts.system.name().to_string(), id.version),
        Some(id) => (id.system, id.version),
        None => (opts.system.name().to_string(), None),
    };
    YcsbReport {
        tool: "dinomo bench ycsb".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        host: Host {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            arch: std::env::consts::ARCH.into(),
            os: std::env::consts::OS.into(),
        },
        options: opts.clone(),
        system,
        server_version,
        target: opts.target.name().into(),
        kv_nodes,
        kn_threads,
        load,
        measured: Measured {
            secs,
            ops,
            ops_per_s: per_s(ops),
            by_kind,
            reads_verified: outcomes.verified,
            errors: Errors {
                unavailable: outcomes.unavailable,
                indeterminate: outcomes.indeterminate,
                missing: outcomes.missing,
                corrupt: outcomes.corrupt,
                first: outcomes.first_problem,
            },
        },
        latency: Latency::of(&outcomes.all),
        resources: seen.then(|| Resources {
            totals: t,
            cpu_ns: cpu,
            per_op,
            writes_per_commit: ratio(t.writes, t.commits),
        }),
        cache: (seen && deltas.caches).then_some(CacheReport {
            lookups: t.lookups,
            value_hits: t.value_hits,
            shortcut_hits: t.shortcut_hits,
            absent_hits: t.absent_hits,
            log_hits: t.log_hits,
            misses,
            stale_shortcuts: t.stale_shortcuts,
            ratios,
            state: deltas.cache,
        }),
        merge,
        nodes,
        timeline,
        server_fabric: deltas.fabric.map(|f| {
            let per_op = |n: u64| if ops > 0 { n as f64 / ops as f64 } else { 0.0 };
            ServerFabric {
                round_trips: f.round_trips,
                round_trips_per_op: per_op(f.round_trips),
                bytes_in_per_op: per_op(f.bytes_in),
                bytes_out_per_op: per_op(f.bytes_out),
            }
        }),
    }
}

/// Microseconds with sensible precision.
fn us(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn bytes(v: u64) -> String {
    if v >= 1 << 30 {
        format!("{:.1} GiB", v as f64 / (1u64 << 30) as f64)
    } else if v >= 1 << 20 {
        format!("{:.1} MiB", v as f64 / (1u64 << 20) as f64)
    } else if v >= 1 << 10 {
        format!("{:.1} KiB", v as f64 / 1024.0)
    } else {
        format!("{v} B")
    }
}

impl YcsbReport {
    /// A name for this run's files: `ycsb-a-zipf0.99-v1024-2kn`, with the system after `ycsb-` for systems other
    /// than DINOMO (`ycsb-dinomo-n-a-zipf0.99-v1024-2kn`), or over RESP, where the server names itself,
    /// `ycsb-a-zipf0.99-v1024-resp-redis`.
    pub fn file_stem(&self) -> String {
        match self.kv_nodes {
            Some(n) => format!("ycsb-{}{}-{n}kn", self.system_prefix(), self.base_stem()),
            None => format!("ycsb-{}-{}", self.base_stem(), self.target_part()),
        }
    }

    /// `SYSTEM-` for systems other than DINOMO, else nothing.
    fn system_prefix(&self) -> String {
        if self.system == "dinomo" {
            String::new()
        } else {
            format!("{}-", self.system)
        }
    }

    /// `TARGET-SYSTEM` (`resp-redis`), for a target that cannot tell its KV nodes.
    fn target_part(&self) -> String {
        let system: String = self
            .system
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        format!("{}-{system}", self.target)
    }

    /// The workload, distribution and value size part of [`YcsbReport::file_stem`]: `a-zipf0.99-v1024`.
    fn base_stem(&self) -> String {
        let dist = self
            .options
            .distribution
            .to_string()
            .replace([':', '='], "");
        let workload: String = self
            .options
            .workload
            .to_string()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{workload}-{dist}-v{}", self.options.value_bytes)
    }

    /// "2 KV node(s)", or "KV nodes unknown".
    fn nodes_text(&self) -> String {
        self.kv_nodes.map_or_else(
            || "KV nodes unknown".to_string(),
            |n| format!("{n} KV node(s)"),
        )
    }

    /// The workload line: "workload a (read 50%, update 50%)".
    fn workload_line(&self) -> String {
        let mix = self.options.workload.mix();
        let parts: Vec<String> = OpKind::ALL
            .iter()
            .filter(|&&k| mix.fraction(k) > 0.0)
            .map(|&k| format!("{k} {:.0}%", mix.fraction(k) * 100.0))
            .collect();
        format!("workload {} ({})", self.options.workload, parts.join(", "))
    }

    /// A summary for people.
    pub fn summary(&self) -> String {
        let o = &self.options;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {}, {}, {} records, {} B keys, {} B values, seed {}",
            self.tool,
            self.workload_line(),
            o.distribution,
            o.records,
            o.key_bytes,
            o.value_bytes,
            o.seed
        );
        let target = match &o.target {
            TargetOptions::InProcess(p) if o.system.is_pdpm() => format!(
                "{} in-process: {} memory node(s), replication {}, {} compute node(s), no cache, fabric latency {} ns",
                self.system,
                p.memory_nodes,
                p.replication,
                self.kv_nodes.map_or("?".to_string(), |n| n.to_string()),
                p.latency_ns
            ),
            TargetOptions::InProcess(p) => format!(
                "{} in-process: {} × {} worker(s), {} cache per node ({}), fabric latency {} ns{}",
                self.system,
                self.nodes_text(),
                p.kn_threads,
                bytes(p.cache_bytes),
                p.policy,
                p.latency_ns,
                // Both apply only where a round trip costs something.
                if p.latency_ns > 0 {
                    format!(
                        ", read-ahead {}, absence records {}",
                        bytes(p.read_ahead_bytes),
                        if p.remember_absent { "on" } else { "off" }
                    )
                } else {
                    String::new()
                }
            ),
            TargetOptions::Native(n) => format!(
                "{} at {}: {}",
                self.system,
                n.seeds.join(", "),
                self.nodes_text()
            ),
            TargetOptions::Resp(r) => format!(
                "{}{} over RESP at {}",
                self.system,
                self.server_version
                    .as_ref()
                    .map_or(String::new(), |v| format!(" {v}")),
                r.addrs.join(", ")
            ),
        };
        let _ = writeln!(
            s,
            "{target}; {} client(s) × {} in flight; {} core(s)",
            o.clients, o.outstanding, self.host.cores
        );
        if let Some(l) = &self.load {
            let _ = writeln!(
                s,
                "load:    {} records in {:.1} s ({} records/s)",
                l.records,
                l.secs,
                rate(l.ops_per_s)
            );
        }
        let m = &self.measured;
        let _ = writeln!(
            s,
            "run:     {} ops in {:.1} s = {} ops/s; {} reads verified; errors {}",
            m.ops,
            m.secs,
            rate(m.ops_per_s),
            m.reads_verified,
            m.errors.total()
        );
        if let Some(first) = &m.errors.first {
            let _ = writeln!(
                s,
                "         unavailable {}, indeterminate {}, missing {}, corrupt {}; first: {first}",
                m.errors.unavailable, m.errors.indeterminate, m.errors.missing, m.errors.corrupt
            );
        }
        let l = &self.latency;
        let _ = writeln!(
            s,
            "latency: p50 {} µs, p90 {}, p99 {}, p99.9 {}, max {} (mean {})",
            us(l.p50_us),
            us(l.p90_us),
            us(l.p99_us),
            us(l.p999_us),
            us(l.max_us),
            us(l.mean_us)
        );
        for k in &m.by_kind {
            let _ = writeln!(
                s,
                "  {:<7} {:>9} ops  p50 {:>7} µs  p99 {:>7} µs  p99.9 {:>7} µs",
                k.kind.name(),
                k.ops,
                us(k.latency.p50_us),
                us(k.latency.p99_us),
                us(k.latency.p999_us)
            );
        }
        let Some(resources) = &self.resources else {
            let _ = writeln!(
                s,
                "server:  its counters are not collected through RESP: no round trips, cache hits, merge backlog or \
                 server CPU time"
            );
            return s;
        };
        let p = &resources.per_op;
        let _ = writeln!(
            s,
            "per op:  {:.3} fabric round trips, {:.0} B out, {:.0} B in; {:.3} lookups, {:.3} writes in {:.3} group commits ({:.1} writes each)",
            p.round_trips,
            p.bytes_out,
            p.bytes_in,
            p.lookups,
            p.writes,
            p.commits,
            resources.writes_per_commit
        );
        if p.entries_read_ahead > 0.0 || p.index_walks_ahead > 0.0 {
            let _ = writeln!(
                s,
                "ahead:   {:.3} entries of shortcut hits and {:.3} index walks per op read ahead for their batches",
                p.entries_read_ahead, p.index_walks_ahead
            );
        }
        if let (Some(w), Some(n), Some(mm), Some(mr), Some(c)) = (
            p.kn_worker_cpu_us,
            p.kn_network_cpu_us,
            p.memory_merge_cpu_us,
            p.memory_rpc_cpu_us,
            p.client_cpu_us,
        ) {
            let _ = writeln!(
                s,
                "cpu/op:  KV-node workers {} µs, KV-node network {} µs, memory-node merge {} µs, memory-node RPC {} µs, clients {} µs",
                us(w),
                us(n),
                us(mm),
                us(mr),
                us(c)
            );
        }
        match self.cache.as_ref().map(|c| (c, c.ratios)) {
            None => {
                let _ = writeln!(s, "cache:   none");
            }
            Some((c, Some(r))) => {
                let _ = writeln!(
                    s,
                    "cache:   value {:.1}%, shortcut {:.1}%, log {:.1}%, miss {:.1}% of {} lookups; {} values and {} shortcuts cached ({} of {})",
                    r.value * 100.0,
                    r.shortcut * 100.0,
                    r.log * 100.0,
                    r.miss * 100.0,
                    c.lookups,
                    c.state.values,
                    c.state.shortcuts,
                    bytes(c.state.used_bytes),
                    bytes(c.state.budget_bytes)
                );
            }
            Some((_, None)) => {
                let _ = writeln!(s, "cache:   no lookups");
            }
        }
        if let Some(g) = &self.merge {
            let _ = writeln!(
                s,
                "merge:   backlog {} → {} segment(s) (max {}), {} entries merged ({}/s), {} write wait(s)",
                g.backlog_segments_start,
                g.backlog_segments_end,
                g.backlog_segments_max,
                g.merged_entries,
                rate(g.merged_entries_per_s),
                g.merge_waits
            );
            let _ = writeln!(
                s,
                "space:   {} free at the end; cleaner: {} segment(s) emptied, {} live entries ({}) copied{}",
                bytes(g.pool_free_bytes_end),
                g.cleaned_segments,
                g.relocated_entries,
                bytes(g.relocated_bytes),
                match g.table_runs_made {
                    0 => String::new(),
                    n => format!(", {n} run(s) emptied for the index table"),
                }
            );
        }
        if !self.nodes.is_empty() {
            let parts: Vec<String> = self
                .nodes
                .iter()
                .map(|n| {
                    if o.system.is_pdpm() {
                        // Compute nodes own no part of the key space.
                        format!("{}: {:.0}% of the work", n.node_id, n.load_share * 100.0)
                    } else {
                        format!(
                            "{}: {:.0}% of the work ({:.0}% of the keys)",
                            n.node_id,
                            n.load_share * 100.0,
                            n.share * 100.0
                        )
                    }
                })
                .collect();
            let _ = writeln!(s, "nodes:   {}", parts.join("; "));
        }
        s
    }

    /// The timeline as CSV.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("t_s,secs,ops,ops_per_s,p50_us,p99_us,backlog_segments\n");
        for t in &self.timeline {
            let _ = writeln!(
                s,
                "{},{:.3},{},{:.0},{:.1},{:.1},{}",
                t.t_s,
                t.secs,
                t.ops,
                t.ops_per_s,
                t.p50_us,
                t.p99_us,
                t.backlog_segments.map_or(String::new(), |b| b.to_string())
            );
        }
        s
    }

    /// The timeline as an SVG chart: throughput and p99 latency per second.
    pub fn to_svg(&self) -> String {
        let thr = [svg::Series {
            name: "throughput".into(),
            points: self
                .timeline
                .iter()
                .map(|t| (t.t_s, t.ops_per_s / 1e3))
                .collect(),
        }];
        let lat = [
            svg::Series {
                name: "p99".into(),
                points: self.timeline.iter().map(|t| (t.t_s, t.p99_us)).collect(),
            },
            svg::Series {
                name: "p50".into(),
                points: self.timeline.iter().map(|t| (t.t_s, t.p50_us)).collect(),
            },
        ];
        let title = format!(
            "YCSB {} {}, {}, {}",
            self.options.workload,
            self.options.distribution,
            self.system,
            self.nodes_text()
        );
        svg::render(&[
            svg::Panel {
                title: &title,
                x_label: "time (s)",
                y_label: "Kops/s",
                log2_x: false,
                series: &thr,
            },
            svg::Panel {
                title: "latency per second",
                x_label: "time (s)",
                y_label: "µs",
                log2_x: false,
                series: &lat,
            },
        ])
    }
}

/// Several runs of one workload, usually on different numbers of KV nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YcsbSweep {
    /// The runs, in the order they ran.
    pub runs: Vec<YcsbReport>,
}

impl YcsbSweep {
    /// A name for the sweep's files: `ycsb-sweep-a-zipf0.99-v1024-1-2-4kn` (`ycsb-dinomo-n-sweep-...` for systems
    /// other than DINOMO).
    pub fn file_stem(&self) -> String {
        let Some(first) = self.runs.first() else {
            return "ycsb-sweep".to_string();
        };
        let nodes: Vec<String> = self
            .runs
            .iter()
            .map(|r| {
                r.kv_nodes
                    .map_or_else(|| "x".to_string(), |n| n.to_string())
            })
            .collect();
        let (prefix, base) = match first.kv_nodes {
            Some(_) => (first.system_prefix(), first.base_stem()),
            None => (
                String::new(),
                format!("{}-{}", first.base_stem(), first.target),
            ),
        };
        format!("ycsb-{prefix}sweep-{base}-{}kn", nodes.join("-"))
    }

    /// One line per run.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:>5}  {:>10}  {:>8}  {:>8}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}\n",
            "nodes",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "RT/op",
            "value",
            "short",
            "log",
            "miss",
            "errors"
        );
        // What a run could not see is shown as "-".
        let pct =
            |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
        for r in &self.runs {
            let h = r.cache.as_ref().and_then(|c| c.ratios);
            let _ = writeln!(
                s,
                "{:>5}  {:>10}  {:>8}  {:>8}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}",
                r.kv_nodes
                    .map_or_else(|| "-".to_string(), |n| n.to_string()),
                rate(r.measured.ops_per_s),
                us(r.latency.p50_us),
                us(r.latency.p99_us),
                r.resources.as_ref().map_or_else(
                    || "-".to_string(),
                    |x| format!("{:.3}", x.per_op.round_trips)
                ),
                pct(h.map(|h| h.value)),
                pct(h.map(|h| h.shortcut)),
                pct(h.map(|h| h.log)),
                pct(h.map(|h| h.miss)),
                r.measured.errors.total()
            );
        }
        s
    }

    /// One row per run.
    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "kv_nodes,ops_per_s,p50_us,p90_us,p99_us,p999_us,round_trips_per_op,bytes_out_per_op,bytes_in_per_op,value_hit,shortcut_hit,log_hit,miss,errors\n",
        );
        for r in &self.runs {
            let h = r.cache.as_ref().and_then(|c| c.ratios);
            let per = r.resources.as_ref().map(|x| &x.per_op);
            let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
            let f1 = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
            let _ = writeln!(
                s,
                "{},{:.0},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{},{},{},{}",
                r.kv_nodes.map_or(String::new(), |n| n.to_string()),
                r.measured.ops_per_s,
                r.latency.p50_us,
                r.latency.p90_us,
                r.latency.p99_us,
                r.latency.p999_us,
                f(per.map(|p| p.round_trips)),
                f1(per.map(|p| p.bytes_out)),
                f1(per.map(|p| p.bytes_in)),
                f(h.map(|h| h.value)),
                f(h.map(|h| h.shortcut)),
                f(h.map(|h| h.log)),
                f(h.map(|h| h.miss)),
                r.measured.errors.total()
            );
        }
        s
    }

    /// Throughput, round trips per operation and hit ratios against the number of KV nodes.
    pub fn to_svg(&self) -> String {
        plot_panels(
            &[PlotKind::Nodes, PlotKind::RoundTrips, PlotKind::HitRatios],
            &self.runs,
        )
    }
}

/// What [`plot`] draws against the number of KV nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotKind {
    /// Throughput.
    Nodes,
    /// Fabric round trips per operation.
    RoundTrips,
    /// Value, shortcut, log and miss ratios.
    HitRatios,
}

impl std::str::FromStr for PlotKind {
    type Err = String;

    fn from_str(s: &str) -> Result<PlotKind, String> {
        match s {
            "nodes" | "throughput" => Ok(PlotKind::Nodes),
            "round-trips" | "rt" => Ok(PlotKind::RoundTrips),
            "hit-ratios" | "hits" => Ok(PlotKind::HitRatios),
            other => Err(format!(
                "unknown plot {other:?} (nodes, round-trips, hit-ratios)"
            )),
        }
    }
}

/// The label of the series a run belongs to: what differs between runs other than the node count.
pub(crate) fn series_label(r: &YcsbReport) -> String {
    let o = &r.options;
    let mut label = format!(
        "{} {} {} {}B",
        r.system, o.workload, o.distribution, o.value_bytes
    );
    if o.outstanding > 1 {
        let _ = write!(label, " x{}", o.outstanding);
    }
    if let TargetOptions::InProcess(p) = &o.target
        && p.latency_ns > 0
    {
        let _ = write!(label, " {}ns", p.latency_ns);
    }
    label
}

/// Runs grouped into series by [`series_label`], each sorted by node count; runs whose node count is unknown
/// (RESP) cannot be placed on that axis and are left out.
fn series_of(runs: &[YcsbReport]) -> BTreeMap<String, Vec<&YcsbReport>> {
    let mut groups: BTreeMap<String, Vec<&YcsbReport>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.kv_nodes.is_some()) {
        groups.entry(series_label(r)).or_default().push(r);
    }
    for g in groups.values_mut() {
        g.sort_by_key(|r| r.kv_nodes);
    }
    groups
}

/// One chart of `kind` against the number of KV nodes, a line per series of runs (runs that differ only in their
/// node count form one series).
pub fn plot(kind: PlotKind, runs: &[YcsbReport]) -> String {
    plot_panels(&[kind], runs)
}

fn plot_panels(kinds: &[PlotKind], runs: &[YcsbReport]) -> String {
    let groups = series_of(runs);
    let many = groups.len() > 1;
    let mut panels_series: Vec<(PlotKind, Vec<svg::Series>)> = Vec::new();
    for &kind in kinds {
        let mut series = Vec::new();
        for (label, g) in &groups {
            // A run that could not see a quantity has no point for it.
            let points = |f: &dyn Fn(&YcsbReport) -> Option<f64>| -> Vec<(f64, f64)> {
                g.iter()
                    .filter_map(|r| Some((r.kv_nodes? as f64, f(r)?)))
                    .collect()
            };
            match kind {
                PlotKind::Nodes => series.push(svg::Series {
                    name: label.clone(),
                    points: points(&|r| Some(r.measured.ops_per_s / 1e3)),
                }),
                PlotKind::RoundTrips => series.push(svg::Series {
                    name: label.clone(),
                    points: points(&|r| r.resources.as_ref().map(|x| x.per_op.round_trips)),
                }),
                PlotKind::HitRatios => {
                    type Pick = fn(&HitRatios) -> f64;
                    let parts: [(&str, Pick); 4] = [
                        ("value", |h| h.value),
                        ("shortcut", |h| h.shortcut),
                        ("log", |h| h.log),
                        ("miss", |h| h.miss),
                    ];
                    for (name, pick) in parts {
                        series.push(svg::Series {
                            name: if many {
                                format!("{label} {name}")
                            } else {
                                name.to_string()
                            },
                            points: points(&|r| {
                                let c = r.cache.as_ref()?;
                                Some(c.ratios.as_ref().map_or(0.0, pick) * 100.0)
                            }),
                        });
                    }
                }
            }
        }
        panels_series.push((kind, series));
    }
    let panels: Vec<svg::Panel<'_>> = panels_series
        .iter()
        .map(|(kind, series)| {
            let (title, y_label) = match kind {
                PlotKind::Nodes => ("Throughput vs KV nodes", "Kops/s"),
                PlotKind::RoundTrips => ("Fabric round trips per operation", "round trips / op"),
                PlotKind::HitRatios => ("Where lookups were answered", "% of lookups"),
            };
            svg::Panel {
                title,
                x_label: "KV nodes",
                y_label,
                log2_x: false,
                series,
            }
        })
        .collect();
    svg::render(&panels)
}

/// The runs in a result file: a single report or a sweep.
pub fn load_reports(path: &Path) -> anyhow::Result<Vec<YcsbReport>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    if value.get("runs").is_some() {
        let sweep: YcsbSweep = serde_json::from_value(value)
            .with_context(|| format!("{} is not a YCSB sweep", path.display()))?;
        Ok(sweep.runs)
    } else if value.get("measured").is_some() {
        let r: YcsbReport = serde_json::from_value(value)
            .with_context(|| format!("{} is not a YCSB report", path.display()))?;
        Ok(vec![r])
    } else {
        bail!(
            "{} is neither a YCSB report nor a sweep (no \"measured\" or \"runs\")",
            path.display()
        )
    }
}
