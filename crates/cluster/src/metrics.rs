//! Prometheus metrics: the text exposition format (version 0.0.4) built from the counters the parts already keep,
//! and a minimal HTTP/1.1 server answering `GET /metrics` on `std::net`.
//!
//! Nothing is counted twice: every scrape reads the KV nodes' worker counters (the same `Stats` the benchmarks
//! read), the memory node's processor statistics, the fabric's per-thread counters, the latency reports clients
//! sent, the routing table and the M-node's reconfigurations, and renders them. Counters end in `_total` and only
//! grow while the process lives; gauges are values now.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dinomo_dpm::{Processor, ProcessorStats};
use dinomo_meta::MetaStore;
use tracing::{debug, warn};

use crate::ClusterRecord;
use crate::latency::LatencyHistogram;
use crate::server::accept_until_stopped;
use crate::wire::Routing;

/// Powers of two of nanoseconds whose `2^k - 1` bounds the latency histogram's buckets: about 1 µs to 17 s.
const LATENCY_POWERS: std::ops::RangeInclusive<u32> = 10..=34;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

struct Family {
    name: String,
    help: &'static str,
    kind: Kind,
    samples: String,
}

/// Metrics being gathered for one scrape: samples of one family are kept together under one `# HELP` and
/// `# TYPE`, whichever source adds them.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
    by_name: HashMap<String, usize>,
}

/// Labels of a sample: `(name, value)` pairs.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

fn escape(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn label_set(labels: Labels<'_>, extra: Option<(&str, &str)>) -> String {
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().copied().chain(extra).enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        out.push_str(k);
        out.push_str("=\"");
        escape(v, &mut out);
        out.push('"');
    }
    if !out.is_empty() {
        out.push('}');
    }
    out
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    /// Nothing yet.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    fn family(&mut self, name: &str, help: &'static str, kind: Kind) -> &mut String {
        debug_assert_eq!(kind == Kind::Counter, name.ends_with("_total"), "{name}");
        let i = *self.by_name.entry(name.to_string()).or_insert_with(|| {
            self.families.push(Family {
                name: name.to_string(),
                help,
                kind,
                samples: String::new(),
            });
            self.families.len() - 1
        });
        debug_assert!(self.families[i].kind == kind, "{name} declared twice");
        &mut self.families[i].samples
    }

    fn sample(&mut self, name: &str, help: &'static str, kind: Kind, labels: Labels<'_>, v: &str) {
        let line = format!("{name}{} {v}\n", label_set(labels, None));
        self.family(name, help, kind).push_str(&line);
    }

    /// A counter (its name ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &'static str, labels: Labels<'_>, value: u64) {
        self.sample(name, help, Kind::Counter, labels, &value.to_string());
    }

    /// A counter of a continuous quantity, such as seconds.
    pub fn counter_f64(&mut self, name: &str, help: &'static str, labels: Labels<'_>, value: f64) {
        self.sample(name, help, Kind::Counter, labels, &number(value));
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &'static str, labels: Labels<'_>, value: f64) {
        self.sample(name, help, Kind::Gauge, labels, &number(value));
    }

    /// A latency histogram in seconds, with buckets at powers of two of nanoseconds.
    pub fn latency_histogram(
        &mut self,
        name: &str,
        help: &'static str,
        labels: Labels<'_>,
        h: &LatencyHistogram,
    ) {
        let mut lines = String::new();
        for (bound_ns, count) in h.counts_below_powers_of_two(LATENCY_POWERS) {
            let le = number(bound_ns as f64 / 1e9);
            let _ = writeln!(
                lines,
                "{name}_bucket{} {count}",
                label_set(labels, Some(("le", &le)))
            );
        }
        let set = label_set(labels, None);
        let _ = writeln!(
            lines,
            "{name}_bucket{} {}",
            label_set(labels, Some(("le", "+Inf"))),
            h.count()
        );
        let _ = writeln!(lines, "{name}_sum{set} {}", number(h.sum_ns() as f64 / 1e9));
        let _ = writeln!(lines, "{name}_count{set} {}", h.count());
        self.family(name, help, Kind::Histogram).push_str(&lines);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {kind}", f.name);
            out.push_str(&f.samples);
        }
        out
    }
}

/// Something that adds metrics to a scrape.
pub trait MetricsSource: Send + Sync + 'static {
    /// Adds the current values.
    fn collect(&self, out: &mut Exposition);
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A KV node's metrics; see [`crate::ClusterNode::metrics`].
pub struct NodeMetrics {
    pub(crate) shared: Arc<crate::node::NodeShared>,
    pub(crate) gate: Arc<dinomo_kn::LeaseGate>,
    pub(crate) resp: Option<dinomo_resp::StatsHandle>,
}

impl MetricsSource for NodeMetrics {
    fn collect(&self, out: &mut Exposition) {
        let id = self.shared.id.to_string();
        let node: Labels<'_> = &[("node", &id)];
        let stats = match self.shared.stats() {
            Ok(s) => s,
            Err(e) => {
                debug!(node = %id, error = %e, "no worker statistics for the metrics");
                out.gauge(
                    "dinomo_kn_serving",
                    "Whether the KV node's lease lets it serve (1) or not (0).",
                    node,
                    0.0,
                );
                return;
            }
        };
        let serving = if self.gate.is_open() { 1.0 } else { 0.0 };
        out.gauge(
            "dinomo_kn_serving",
            "Whether the KV node's lease lets it serve (1) or not (0).",
            node,
            serving,
        );
        for (to, n) in [
            ("peer", &self.shared.resp_ops_to_peers),
            ("network", &self.shared.resp_ops_forwarded),
        ] {
            out.counter(
                "dinomo_kn_resp_ops_sent_total",
                "Operations the Redis front door sent to their owners: queued at the workers of another node of this \
                 process (peer), or forwarded over the native protocol (network).",
                &[("node", &id), ("to", to)],
                n.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        out.gauge(
            "dinomo_kn_ring_epoch",
            "Epoch of the routing table the KV node serves under.",
            node,
            stats.epoch as f64,
        );
        out.gauge(
            "dinomo_kn_ring_share",
            "Share of the ring the KV node owns (0..1).",
            node,
            stats.share,
        );
        out.gauge(
            "dinomo_kn_worker_threads",
            "Worker threads of the KV node.",
            node,
            stats.threads.len() as f64,
        );

        let mut sum = dinomo_kn::WorkerStats::default();
        let mut ops = dinomo_kn::OpCounts::default();
        for t in &stats.threads {
            ops = ops.plus(&t.ops);
            sum.not_owner += t.not_owner;
            sum.lookups += t.lookups;
            sum.value_hits += t.value_hits;
            sum.shortcut_hits += t.shortcut_hits;
            sum.absent_hits += t.absent_hits;
            sum.entries_read_ahead += t.entries_read_ahead;
            sum.index_walks_ahead += t.index_walks_ahead;
            sum.stale_shortcuts += t.stale_shortcuts;
            sum.log_hits += t.log_hits;
            sum.index_walks += t.index_walks;
            sum.index_walk_round_trips += t.index_walk_round_trips;
            sum.index_rewalks += t.index_rewalks;
            sum.shared_ops += t.shared_ops;
            sum.shared_cas_retries += t.shared_cas_retries;
            sum.cell_rereads += t.cell_rereads;
            sum.writes += t.writes;
            sum.commits += t.commits;
            sum.segments_sealed += t.segments_sealed;
            sum.merge_waits += t.merge_waits;
            sum.lease_waits_served += t.lease_waits_served;
            sum.lease_refusals += t.lease_refusals;
            sum.unmerged_bytes += t.unmerged_bytes;
            sum.unmerged_keys += t.unmerged_keys;
            sum.round_trips += t.round_trips;
            sum.bytes_out += t.bytes_out;
            sum.bytes_in += t.bytes_in;
            sum.busy_ns += t.busy_ns;
            sum.wall_ns += t.wall_ns;
            sum.cache.values += t.cache.values;
            sum.cache.shortcuts += t.cache.shortcuts;
            sum.cache.used_bytes += t.cache.used_bytes;
            sum.cache.budget_bytes += t.cache.budget_bytes;
            sum.cache.value_bytes += t.cache.value_bytes;
            sum.cache.shortcut_bytes += t.cache.shortcut_bytes;
            sum.cache.evictions += t.cache.evictions;
            sum.cache.promotions += t.cache.promotions;
            sum.cache.demotions += t.cache.demotions;
        }
        for (kind, n) in ops.by_kind() {
            out.counter(
                "dinomo_kn_ops_total",
                "Data operations the KV node's workers served, by kind.",
                &[("node", &id), ("op", kind)],
                n,
            );
        }
        out.counter(
            "dinomo_kn_not_owner_total",
            "Requests refused because the KV node does not own the key.",
            node,
            sum.not_owner,
        );
        out.counter(
            "dinomo_kn_lookups_total",
            "Key lookups (reads, and the reads of read-modify-writes).",
            node,
            sum.lookups,
        );
        // Where lookups were answered: the cache's value, shortcut or record of absence, the unmerged log, or an
        // index walk (a miss).
        let answered = [
            ("value", sum.value_hits),
            ("shortcut", sum.shortcut_hits),
            ("absent", sum.absent_hits),
            ("log", sum.log_hits),
            ("miss", sum.index_walks),
        ];
        for (kind, n) in answered {
            out.counter("dinomo_kn_lookup_answers_total", "Lookups by where they were answered: value (cached value), shortcut (cached pointer, one READ), absent (cached record that the key has no value), log (unmerged log), miss (index walk).", &[("node", &id), ("kind", kind)], n);
        }
        for (kind, n) in answered {
            out.gauge(
                "dinomo_kn_hit_ratio",
                "Share of lookups since start answered each way (value, shortcut, absent, log, miss).",
                &[("node", &id), ("kind", kind)],
                ratio(n, sum.lookups),
            );
        }
        out.counter(
            "dinomo_kn_entries_read_ahead_total",
            "Entries that cached shortcuts led to, read ahead for a batch's lookups in one round trip.",
            node,
            sum.entries_read_ahead,
        );
        out.counter(
            "dinomo_kn_index_walks_ahead_total",
            "Index walks of a batch's uncached keys made side by side before it was served.",
            node,
            sum.index_walks_ahead,
        );
        out.counter(
            "dinomo_kn_stale_shortcuts_total",
            "Cached shortcuts that no longer led to their key.",
            node,
            sum.stale_shortcuts,
        );
        out.counter(
            "dinomo_kn_index_rewalks_total",
            "Index walks made again because a candidate entry had been replaced since its bucket was read.",
            node,
            sum.index_rewalks,
        );
        out.counter(
            "dinomo_kn_index_walk_round_trips_total",
            "Fabric round trips spent walking the index.",
            node,
            sum.index_walk_round_trips,
        );
        out.counter(
            "dinomo_kn_shared_ops_total",
            "Operations on keys shared by several KV nodes.",
            node,
            sum.shared_ops,
        );
        out.counter(
            "dinomo_kn_shared_cas_retries_total",
            "Lost CASes on shared keys' cells (retried).",
            node,
            sum.shared_cas_retries,
        );
        out.counter(
            "dinomo_kn_cell_rereads_total",
            "Shared keys' cells read again because another owner moved them on between the cell and entry reads.",
            node,
            sum.cell_rereads,
        );
        out.counter(
            "dinomo_kn_writes_total",
            "Writes logged and acknowledged.",
            node,
            sum.writes,
        );
        out.counter(
            "dinomo_kn_group_commits_total",
            "Group commits (one fabric WRITE each).",
            node,
            sum.commits,
        );
        out.counter(
            "dinomo_kn_segments_sealed_total",
            "Log segments the KV node's workers filled.",
            node,
            sum.segments_sealed,
        );
        out.counter(
            "dinomo_kn_merge_waits_total",
            "Times a write waited for the memory node's merge (backpressure).",
            node,
            sum.merge_waits,
        );
        out.counter(
            "dinomo_kn_lease_waits_served_total",
            "Requests and group commits that found the KV node's lease lapsed and were served once it was renewed.",
            node,
            sum.lease_waits_served,
        );
        out.counter(
            "dinomo_kn_lease_refusals_total",
            "Requests and group commits refused because the KV node's lease lapsed and was not renewed in time.",
            node,
            sum.lease_refusals,
        );
        out.gauge(
            "dinomo_kn_unmerged_bytes",
            "Bytes of unmerged log segment copies held by the workers.",
            node,
            sum.unmerged_bytes as f64,
        );
        out.gauge(
            "dinomo_kn_unmerged_entries",
            "Entries in the workers' unmerged log segment copies.",
            node,
            sum.unmerged_keys as f64,
        );
        out.counter(
            "dinomo_kn_round_trips_total",
            "Fabric round trips the KV node's workers made.",
            node,
            sum.round_trips,
        );
        out.gauge(
            "dinomo_kn_round_trips_per_op",
            "Fabric round trips per data operation since start.",
            node,
            ratio(sum.round_trips, ops.total()),
        );
        out.counter(
            "dinomo_kn_fabric_bytes_total",
            "Fabric bytes the workers moved, by direction.",
            &[("node", &id), ("direction", "out")],
            sum.bytes_out,
        );
        out.counter(
            "dinomo_kn_fabric_bytes_total",
            "Fabric bytes the workers moved, by direction.",
            &[("node", &id), ("direction", "in")],
            sum.bytes_in,
        );
        out.counter_f64(
            "dinomo_kn_busy_seconds_total",
            "Time the workers spent serving, summed over the workers (rate / threads = occupancy).",
            node,
            sum.busy_ns as f64 / 1e9,
        );
        out.gauge(
            "dinomo_kn_occupancy",
            "Busy share of the workers since start (0..1).",
            node,
            ratio(sum.busy_ns, sum.wall_ns),
        );
        out.gauge(
            "dinomo_kn_cache_used_bytes",
            "Bytes the cache charges for its entries.",
            node,
            sum.cache.used_bytes as f64,
        );
        out.gauge(
            "dinomo_kn_cache_budget_bytes",
            "The cache's byte budget.",
            node,
            sum.cache.budget_bytes as f64,
        );
        out.gauge(
            "dinomo_kn_cache_entries",
            "Cached entries by kind.",
            &[("node", &id), ("kind", "value")],
            sum.cache.values as f64,
        );
        out.gauge(
            "dinomo_kn_cache_entries",
            "Cached entries by kind.",
            &[("node", &id), ("kind", "shortcut")],
            sum.cache.shortcuts as f64,
        );
        out.counter(
            "dinomo_kn_cache_evictions_total",
            "Cache entries dropped to make room.",
            node,
            sum.cache.evictions,
        );
        out.counter(
            "dinomo_kn_cache_promotions_total",
            "Cached shortcuts turned into values.",
            node,
            sum.cache.promotions,
        );
        out.counter(
            "dinomo_kn_cache_demotions_total",
            "Cached values turned into shortcuts.",
            node,
            sum.cache.demotions,
        );
        out.latency_histogram(
            "dinomo_kn_client_latency_seconds",
            "Operation latency as the clients measured and reported it to this KV node.",
            node,
            &self.shared.reported_latency(),
        );
        if let Some(resp) = &self.resp {
            let s = resp.stats();
            out.gauge(
                "dinomo_resp_connected_clients",
                "Redis-protocol connections open.",
                node,
                s.connected_clients as f64,
            );
            out.counter(
                "dinomo_resp_connections_total",
                "Redis-protocol connections accepted.",
                node,
                s.connections_received,
            );
            out.counter(
                "dinomo_resp_rejected_connections_total",
                "Redis-protocol connections refused by the client limit.",
                node,
                s.rejected_connections,
            );
            out.counter(
                "dinomo_resp_commands_total",
                "Redis-protocol commands handled.",
                node,
                s.commands_processed,
            );
            out.counter(
                "dinomo_resp_error_replies_total",
                "Redis-protocol error replies sent.",
                node,
                s.error_replies,
            );
        }
    }
}

/// The memory node's metrics: its pool and its processor.
pub struct ProcessorMetrics(pub Arc<Processor>);

impl MetricsSource for ProcessorMetrics {
    fn collect(&self, out: &mut Exposition) {
        processor_metrics(&self.0.stats(), out);
    }
}

/// The memory node's named clients (KV-node incarnations) and their revocation.
pub struct ClientMetrics(pub Arc<dinomo_fabric::MemoryNode>);

impl MetricsSource for ClientMetrics {
    fn collect(&self, out: &mut Exposition) {
        let clients = self.0.clients();
        out.gauge(
            "dinomo_dpm_named_clients",
            "KV-node incarnations connected to the memory node now.",
            &[],
            clients.connected().len() as f64,
        );
        out.counter(
            "dinomo_dpm_revoked_connections_total",
            "Connections of taken-over KV nodes the memory node closed.",
            &[],
            clients.revoked_connections(),
        );
    }
}

/// Adds a memory node's statistics.
pub fn processor_metrics(s: &ProcessorStats, out: &mut Exposition) {
    out.gauge(
        "dinomo_pool_used_bytes",
        "Pool bytes in use.",
        &[],
        s.pool_used_bytes as f64,
    );
    out.gauge(
        "dinomo_pool_free_bytes",
        "Pool bytes free.",
        &[],
        s.pool_free_bytes as f64,
    );
    out.counter(
        "dinomo_pool_prefaulted_bytes_total",
        "Pool bytes faulted in ahead of the log writers.",
        &[],
        s.pool_prefaulted_bytes,
    );
    out.gauge(
        "dinomo_dpm_logs",
        "KV-node thread logs in the directory.",
        &[],
        s.logs as f64,
    );
    out.gauge(
        "dinomo_dpm_log_segments",
        "Segments held by logs.",
        &[],
        s.segments as f64,
    );
    out.gauge(
        "dinomo_dpm_merge_backlog_segments",
        "Sealed log segments not merged yet.",
        &[],
        s.backlog_segments as f64,
    );
    out.gauge(
        "dinomo_dpm_merge_backlog_bytes",
        "Bytes of entries in the merge backlog.",
        &[],
        s.backlog_bytes as f64,
    );
    out.counter(
        "dinomo_dpm_merged_entries_total",
        "Log entries merged into the index.",
        &[],
        s.merged_entries,
    );
    out.counter(
        "dinomo_dpm_recycled_segments_total",
        "Log segments recycled.",
        &[],
        s.recycled_segments,
    );
    out.gauge(
        "dinomo_dpm_delete_reserve_segments",
        "Log segments held back for deletes on a full pool.",
        &[],
        s.delete_reserve_segments as f64,
    );
    out.counter(
        "dinomo_dpm_delete_reserve_grants_total",
        "Log segments granted from the delete reserve (the pool was full).",
        &[],
        s.delete_reserve_grants,
    );
    out.counter(
        "dinomo_dpm_cleaned_segments_total",
        "Log segments the cleaner emptied (live entries copied to a relocation log) and recycled.",
        &[],
        s.cleaned_segments,
    );
    out.counter(
        "dinomo_dpm_relocated_entries_total",
        "Live log entries the cleaner copied, their index slots moved to the copies.",
        &[],
        s.relocated_entries,
    );
    out.counter(
        "dinomo_dpm_relocated_bytes_total",
        "Bytes of log entries the cleaner copied.",
        &[],
        s.relocated_bytes,
    );
    out.counter(
        "dinomo_dpm_table_runs_made_total",
        "Runs of log segments the cleaner emptied for an index table that had room only in pieces.",
        &[],
        s.table_runs_made,
    );
    out.counter(
        "dinomo_dpm_retired_logs_total",
        "Logs whose directory descriptors were given back (their node gone, their segments recycled).",
        &[],
        s.retired_logs,
    );
    out.counter(
        "dinomo_dpm_emptied_logs_total",
        "Logs the cleaner emptied because a KV node's claim found the log directory full.",
        &[],
        s.emptied_logs,
    );
    out.gauge(
        "dinomo_dpm_partitions",
        "Index partitions, one per KV node (DINOMO-N; 0 with the shared index).",
        &[],
        s.partitions as f64,
    );
    out.counter(
        "dinomo_dpm_freed_partitions_total",
        "Index partitions of departed KV nodes freed once empty and no log merged into them.",
        &[],
        s.freed_partitions,
    );
    out.gauge(
        "dinomo_dpm_manager_epoch",
        "The newest management epoch the memory node acted on; calls of older ones are refused.",
        &[],
        s.manager_epoch as f64,
    );
    out.counter(
        "dinomo_dpm_stale_manager_calls_total",
        "Management calls refused because they came from an M-node that no longer leads (an older epoch).",
        &[],
        s.stale_manager_calls,
    );
    out.gauge(
        "dinomo_dpm_revocations_kept",
        "Revoked KV-node incarnations kept in the pool, refused by the memory node after a restart as before it.",
        &[],
        s.revocations_kept as f64,
    );
    out.counter(
        "dinomo_dpm_recovered_entries_total",
        "Entries a crash had left unmerged, merged at start.",
        &[],
        s.recovered_entries,
    );
    out.counter(
        "dinomo_dpm_torn_entries_total",
        "Sealed segments whose entries ended before their seal.",
        &[],
        s.torn_entries,
    );
    out.counter(
        "dinomo_dpm_damaged_log_bytes_total",
        "Bytes of log segments skipped as damaged: valid entries followed them, so the writes there are lost.",
        &[],
        s.damaged_log_bytes,
    );
    out.counter(
        "dinomo_dpm_resealed_segments_total",
        "Segments whose sealed length was found damaged at start-up and sealed again at their last valid entry.",
        &[],
        s.resealed_segments,
    );
    out.counter(
        "dinomo_dpm_relinked_segments_total",
        "Segments whose link to the older segment was found damaged at start-up and written again.",
        &[],
        s.relinked_segments,
    );
    out.gauge(
        "dinomo_dpm_index_entries",
        "Keys in the index.",
        &[],
        s.index_entries as f64,
    );
    out.gauge(
        "dinomo_dpm_index_table_bytes",
        "Bytes of the index's current table.",
        &[],
        s.index_table_bytes as f64,
    );
    out.gauge(
        "dinomo_dpm_shared_keys",
        "Keys shared by several KV nodes through indirect cells.",
        &[],
        s.shared_keys as f64,
    );
}

/// This process's fabric counters (every thread that talks to a memory node).
pub struct FabricMetrics;

impl MetricsSource for FabricMetrics {
    fn collect(&self, out: &mut Exposition) {
        let c = dinomo_fabric::counters::global_snapshot();
        out.counter(
            "dinomo_fabric_round_trips_total",
            "Fabric round trips this process made.",
            &[],
            c.round_trips,
        );
        for (verb, n) in [
            ("read", c.reads),
            ("write", c.writes),
            ("cas", c.cas),
            ("faa", c.faa),
            ("rpc", c.rpcs),
        ] {
            out.counter(
                "dinomo_fabric_verbs_total",
                "Fabric verbs this process issued, by kind.",
                &[("verb", verb)],
                n,
            );
        }
        out.counter(
            "dinomo_fabric_bytes_total",
            "Fabric bytes this process moved, by direction.",
            &[("direction", "out")],
            c.bytes_out,
        );
        out.counter(
            "dinomo_fabric_bytes_total",
            "Fabric bytes this process moved, by direction.",
            &[("direction", "in")],
            c.bytes_in,
        );
    }
}

/// Adds a routing table's epoch, nodes and shares under `prefix` (`dinomo_ring` for the cluster record,
/// `dinomo_rn` for what a routing node serves).
fn routing_metrics(prefix: &str, r: &Routing, out: &mut Exposition) {
    out.gauge(
        &format!("{prefix}_epoch"),
        "Epoch of the routing table.",
        &[],
        r.epoch() as f64,
    );
    out.gauge(
        &format!("{prefix}_nodes"),
        "KV nodes in the ring.",
        &[],
        r.ring.nodes().count() as f64,
    );
    for (node, share) in r.ring.shares() {
        let id = node.to_string();
        out.gauge(
            &format!("{prefix}_share"),
            "Share of the ring each KV node owns.",
            &[("node", &id)],
            share,
        );
    }
}

/// The cluster record's ring, as the metadata store holds it (the M-node's view).
pub struct RecordMetrics(pub Arc<dyn MetaStore>);

impl MetricsSource for RecordMetrics {
    fn collect(&self, out: &mut Exposition) {
        match ClusterRecord::load(&*self.0) {
            Ok(Some((r, _))) => routing_metrics("dinomo_ring", &r.routing, out),
            Ok(None) => {}
            Err(e) => debug!(error = %e, "no cluster record for the metrics"),
        }
    }
}

/// A routing node's metrics; see [`crate::RoutingNode::metrics`].
pub struct RoutingMetrics(pub(crate) Arc<crate::rn::RoutingService>);

impl MetricsSource for RoutingMetrics {
    fn collect(&self, out: &mut Exposition) {
        if let Some(r) = self.0.current() {
            routing_metrics("dinomo_rn_ring", &r, out);
        }
    }
}

/// An M-node's metrics; see [`crate::MNode::metrics`].
pub struct MNodeMetrics {
    pub(crate) leading: Arc<AtomicBool>,
    pub(crate) events: Arc<Mutex<Vec<crate::ReconfigEvent>>>,
    pub(crate) failures: Arc<crate::failures::FailureStreak>,
}

impl MetricsSource for MNodeMetrics {
    fn collect(&self, out: &mut Exposition) {
        let leading = if self.leading.load(Ordering::Acquire) {
            1.0
        } else {
            0.0
        };
        out.gauge(
            "dinomo_mnode_leading",
            "Whether this M-node leads (1) or stands by (0).",
            &[],
            leading,
        );
        out.counter(
            "dinomo_mnode_reconfiguration_failures_total",
            "Reconfiguration steps that failed and were retried (the log names the cause).",
            &[],
            self.failures.total(),
        );
        let mut by_kind: Vec<(String, u64)> =
            ["add", "remove", "failure", "replicate", "dereplicate"]
                .iter()
                .map(|k| (k.to_string(), 0))
                .collect();
        // Only a memory node partitioned per KV node (DINOMO-N) moves data; with the shared index these stay 0.
        let (mut keys, mut bytes, mut took) = (0u64, 0u64, Duration::ZERO);
        for e in self.events.lock().expect("events lock").iter() {
            let kind = format!("{:?}", e.kind).to_ascii_lowercase();
            if let Some(slot) = by_kind.iter_mut().find(|(k, _)| *k == kind) {
                slot.1 += 1;
            }
            keys = keys.saturating_add(e.moved_keys);
            bytes = bytes.saturating_add(e.moved_bytes);
            took = took.saturating_add(e.move_duration);
        }
        for (kind, n) in &by_kind {
            out.counter(
                "dinomo_mnode_reconfigurations_total",
                "Reconfigurations this M-node carried out, by kind.",
                &[("kind", kind)],
                *n,
            );
        }
        out.counter(
            "dinomo_mnode_moved_keys_total",
            "Keys whose data reconfigurations copied into their new owner's index partition.",
            &[],
            keys,
        );
        out.counter(
            "dinomo_mnode_moved_bytes_total",
            "Bytes of log entries written by those copies.",
            &[],
            bytes,
        );
        out.counter_f64(
            "dinomo_mnode_move_seconds_total",
            "Time reconfigurations spent moving data between partitions.",
            &[],
            took.as_secs_f64(),
        );
    }
}

/// Every source's metrics, rendered.
pub fn render(sources: &[Arc<dyn MetricsSource>]) -> String {
    let mut e = Exposition::new();
    for s in sources {
        s.collect(&mut e);
    }
    e.render()
}

/// Settings of the metrics HTTP server.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Where it listens. Default 127.0.0.1:0.
    pub listen: SocketAddr,
    /// Scrapes served at once; more are closed unanswered. Default 16.
    pub max_connections: usize,
    /// Bound on reading a request and on writing its answer. Default 5 s.
    pub io_timeout: Duration,
    /// Longest request head (request line and headers). Default 8 KiB.
    pub max_request_bytes: usize,
    /// When set, every scrape must present it as `Authorization: Bearer <token>` (Prometheus's
    /// `authorization.credentials`); others are answered 401. Default unset: anyone who reaches the address may
    /// scrape.
    pub bearer_token: Option<crate::wire::Secret>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_connections: 16,
            io_timeout: Duration::from_secs(5),
            max_request_bytes: 8 << 10,
            bearer_token: None,
        }
    }
}

type Conns = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

/// Serves `GET /metrics` until dropped; dropping it also ends the scrapes under way.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Conns,
    accept: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `cfg.listen` and answers scrapes with the metrics of `sources`.
    pub fn start(
        cfg: HttpConfig,
        sources: Vec<Arc<dyn MetricsSource>>,
    ) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Conns = Arc::default();
        let sources: Arc<[Arc<dyn MetricsSource>]> = sources.into();
        let accept = {
            let (stop, conns) = (stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name("dinomo-metrics".into())
                .spawn(move || {
                    accept_until_stopped(&listener, &stop, "metrics", |stream| {
                        let mut live = conns.lock().expect("metrics connections lock");
                        // Finished scrapes give their place back.
                        let (done, open): (Vec<_>, Vec<_>) =
                            live.drain(..).partition(|(_, t)| t.is_finished());
                        *live = open;
                        for (_, t) in done {
                            let _ = t.join();
                        }
                        if live.len() >= cfg.max_connections {
                            debug!("metrics connection limit reached; closing a new connection");
                            return;
                        }
                        let Ok(handle) = stream.try_clone() else {
                            return;
                        };
                        let (cfg, sources) = (cfg.clone(), sources.clone());
                        match std::thread::Builder::new()
                            .name("dinomo-metrics-conn".into())
                            .spawn(move || serve(stream, &cfg, &sources))
                        {
                            Ok(t) => live.push((handle, t)),
                            Err(e) => warn!(error = %e, "cannot start a metrics connection thread"),
                        }
                    });
                })?
        };
        Ok(MetricsServer {
            addr,
            stop,
            conns,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let live: Vec<_> = self
            .conns
            .lock()
            .expect("metrics connections lock")
            .drain(..)
            .collect();
        for (stream, t) in live {
            let _ = stream.shutdown(Shutdown::Both);
            let _ = t.join();
        }
    }
}

/// Why a request head could not be read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// The connection closed (or timed out) before a request began: nothing to answer.
    Gone,
    /// Not HTTP/1.x as it should be.
    Malformed(&'static str),
    /// The head is longer than the limit.
    TooLarge,
}

/// Reads up to the blank line that ends a request head.
fn read_head(stream: &mut impl Read, max: usize) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(_) if head.is_empty() => return Err(HeadError::Gone),
            Err(_) => return Err(HeadError::Malformed("the request head was cut off")),
        };
        if n == 0 {
            return Err(if head.is_empty() {
                HeadError::Gone
            } else {
                HeadError::Malformed("the request head was cut off")
            });
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics {
        head_only: bool,
    },
    MethodNotAllowed,
    NotFound,
    /// The endpoint wants a bearer token, and the request presented none or another.
    Unauthorized,
}

/// Parses a request head (without its final blank line); with `bearer`, `/metrics` is only for a request whose
/// `Authorization` header presents it as a bearer token.
fn route(head: &[u8], bearer: Option<&str>) -> Result<Route, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed("not text"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed(
            "the request line is not METHOD TARGET VERSION",
        ));
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    if !token(method) {
        return Err(HeadError::Malformed("bad method"));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err(HeadError::Malformed("bad request target"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(HeadError::Malformed("not HTTP/1.0 or HTTP/1.1"));
    }
    let mut authorized = bearer.is_none();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(HeadError::Malformed("a header line without a colon"));
        };
        if !token(name) {
            return Err(HeadError::Malformed("bad header name"));
        }
        if let Some(want) = bearer
            && name.eq_ignore_ascii_case("authorization")
        {
            // The scheme is case-insensitive (RFC 9110); the credentials are compared in constant time.
            authorized |= value
                .trim()
                .split_once(' ')
                .is_some_and(|(scheme, credentials)| {
                    scheme.eq_ignore_ascii_case("bearer")
                        && dinomo_fabric::token_matches(
                            credentials.trim().as_bytes(),
                            want.as_bytes(),
                        )
                });
        }
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(match (method, path) {
        (_, "/metrics") if !authorized => Route::Unauthorized,
        ("GET", "/metrics") => Route::Metrics { head_only: false },
        ("HEAD", "/metrics") => Route::Metrics { head_only: true },
        (_, "/metrics") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    })
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    extra: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if !head_only {
        let _ = stream.write_all(body.as_bytes());
    }
    let _ = stream.flush();
}

fn serve(mut stream: TcpStream, cfg: &HttpConfig, sources: &[Arc<dyn MetricsSource>]) {
    let _ = stream.set_read_timeout(Some(cfg.io_timeout));
    let _ = stream.set_write_timeout(Some(cfg.io_timeout));
    const TEXT: &str = "text/plain; charset=utf-8";
    let token = cfg.bearer_token.as_ref().map(|t| t.0.as_str());
    let result = read_head(&mut stream, cfg.max_request_bytes).and_then(|h| route(&h, token));
    match result {
        Ok(Route::Metrics { head_only }) => {
            let body = render(sources);
            respond(
                &mut stream,
                "200 OK",
                "",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                head_only,
            );
        }
        Ok(Route::MethodNotAllowed) => respond(
            &mut stream,
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            TEXT,
            "only GET and HEAD\n",
            false,
        ),
        Ok(Route::Unauthorized) => respond(
            &mut stream,
            "401 Unauthorized",
            "WWW-Authenticate: Bearer realm=\"dinomo\"\r\n",
            TEXT,
            "this endpoint wants its bearer token (metrics.bearer_token)\n",
            false,
        ),
        Ok(Route::NotFound) => respond(
            &mut stream,
            "404 Not Found",
            "",
            TEXT,
            "metrics are at /metrics\n",
            false,
        ),
        Err(HeadError::Gone) => {}
        Err(HeadError::TooLarge) => respond(
            &mut stream,
            "431 Request Header Fields Too Large",
            "",
            TEXT,
            "request head too large\n",
            false,
        ),
        Err(HeadError::Malformed(why)) => respond(
            &mut stream,
            "400 Bad Request",
            "",
            TEXT,
            &format!("{why}\n"),
            false,
        ),
    }
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_group_their_samples_and_escape_labels() {
        let mut e = Exposition::new();
        e.counter("a_total", "A.", &[("node", "1")], 3);
        e.gauge("b", "B.", &[], 0.5);
        e.counter("a_total", "A.", &[("node", "x\"y\\z\n")], 4);
        e.gauge("b", "B.", &[("k", "v")], f64::INFINITY);
        let text = e.render();
        assert_eq!(
            text,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{node=\"1\"} 3\na_total{node=\"x\\\"y\\\\z\\n\"} 4\n\
             # HELP b B.\n# TYPE b gauge\nb 0.5\nb{k=\"v\"} +Inf\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let mut h = LatencyHistogram::new();
        for ns in [500, 1500, 3000, 1_000_000] {
            h.record(ns);
        }
        let mut e = Exposition::new();
        e.latency_histogram("lat_seconds", "L.", &[("node", "1")], &h);
        let text = e.render();
        assert!(text.contains("# TYPE lat_seconds histogram\n"));
        assert!(
            text.contains("lat_seconds_bucket{node=\"1\",le=\"0.000001023\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_bucket{node=\"1\",le=\"0.000002047\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_bucket{node=\"1\",le=\"0.000004095\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("lat_seconds_bucket{node=\"1\",le=\"+Inf\"} 4\n"),
            "{text}"
        );
        assert!(text.contains("lat_seconds_count{node=\"1\"} 4\n"), "{text}");
        assert!(
            text.contains("lat_seconds_sum{node=\"1\"} 0.001005\n"),
            "{text}"
        );
        // Cumulative: never decreasing.
        let counts: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("lat_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]));
    }

    fn route_open(head: &[u8]) -> Result<Route, HeadError> {
        route(head, None)
    }

    #[test]
    fn with_a_bearer_token_only_requests_presenting_it_get_metrics() {
        let with = |headers: &str| {
            let head = format!("GET /metrics HTTP/1.1\r\nHost: x{headers}");
            route(head.as_bytes(), Some("s3cret")).unwrap()
        };
        let metrics = Route::Metrics { head_only: false };
        assert_eq!(with("\r\nAuthorization: Bearer s3cret"), metrics);
        assert_eq!(with("\r\nauthorization:   bearer   s3cret  "), metrics);
        for refused in [
            "",
            "\r\nAuthorization: Bearer s3cre",
            "\r\nAuthorization: Bearer s3cret2",
            "\r\nAuthorization: Basic czNjcmV0",
            "\r\nAuthorization: s3cret",
            "\r\nAuthorization: Bearer",
            "\r\nX-Authorization: Bearer s3cret",
            "\r\nAuthorization: Bé s3cret",
            "\r\nAuthorization: Bearerés3cret",
        ] {
            assert_eq!(with(refused), Route::Unauthorized, "{refused:?}");
        }
        // Other paths and malformed heads are answered as without a token.
        assert_eq!(
            route(b"GET / HTTP/1.1", Some("s3cret")).unwrap(),
            Route::NotFound
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1", Some("s3cret")).unwrap(),
            Route::Unauthorized
        );
        assert!(route(b"GET /metrics HTTP/9", Some("s3cret")).is_err());
    }

    #[test]
    fn requests_are_routed_or_refused() {
        let ok = route_open(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*").unwrap();
        assert_eq!(ok, Route::Metrics { head_only: false });
        assert_eq!(
            route_open(b"HEAD /metrics?x=1 HTTP/1.0").unwrap(),
            Route::Metrics { head_only: true }
        );
        assert_eq!(
            route_open(b"POST /metrics HTTP/1.1").unwrap(),
            Route::MethodNotAllowed
        );
        assert_eq!(route_open(b"GET / HTTP/1.1").unwrap(), Route::NotFound);
        for bad in [
            &b"GET /metrics"[..],
            b"GET /metrics HTTP/2.0",
            b"GET metrics HTTP/1.1",
            b"GET  /metrics HTTP/1.1",
            b"G\xffT /metrics HTTP/1.1",
            b"GET /metrics HTTP/1.1\r\nno colon here",
            b"GET /metrics HTTP/1.1\r\nbad name: x",
            b"",
        ] {
            assert!(
                matches!(route_open(bad), Err(HeadError::Malformed(_))),
                "{bad:?}"
            );
        }
        let mut long = std::io::Cursor::new(vec![b'a'; 100_000]);
        assert_eq!(read_head(&mut long, 8192), Err(HeadError::TooLarge));
        let mut cut = std::io::Cursor::new(b"GET /metrics HTTP/1.1\r\n".to_vec());
        assert!(matches!(
            read_head(&mut cut, 8192),
            Err(HeadError::Malformed(_))
        ));
        let mut none = std::io::Cursor::new(Vec::new());
        assert_eq!(read_head(&mut none, 8192), Err(HeadError::Gone));
    }
}
