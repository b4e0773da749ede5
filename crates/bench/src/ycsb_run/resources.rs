//! Counters of the store, read before and after the measured phase: KV-node workers' statistics (fabric round
//! trips and bytes, lookups by where they were answered, writes and group commits), the memory node's processor
//! statistics (merge backlog, entries merged) and, when the whole cluster runs in this process, each thread's CPU
//! time by role.

use std::collections::{BTreeMap, HashMap};

use dinomo_cache::CacheStats;
use dinomo_dpm::ProcessorStats;
use dinomo_kn::WorkerStats;
use serde::{Deserialize, Serialize};

/// The store's counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every KV node in the routing table; `None` when the target cannot read them (a RESP server).
    pub nodes: Option<Vec<NodeCounters>>,
    /// The memory node's processor, if it can be read.
    pub memory: Option<ProcessorStats>,
    /// Thread CPU times of this process, if the cluster runs in it.
    pub cpu: Option<CpuTimes>,
    /// Whether the nodes have caches (DINOMO's KV nodes do; the pDPM baselines' compute nodes do not): without,
    /// the report leaves the cache section out.
    pub caches: bool,
    /// The serving processes' fabric counters, summed over them (a RESP server's `INFO fabric`); `None` where
    /// they cannot be read.
    pub fabric: Option<FabricTotals>,
}

/// Fabric counters of whole server processes, every thread included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricTotals {
    /// Round trips to memory nodes.
    pub round_trips: u64,
    /// Bytes sent to memory nodes.
    pub bytes_out: u64,
    /// Bytes received from memory nodes.
    pub bytes_in: u64,
}

/// One KV node's counters.
#[derive(Debug, Clone)]
pub struct NodeCounters {
    /// Its id.
    pub node_id: u32,
    /// Its share of the key space.
    pub share: f64,
    /// Its workers' statistics, in thread order.
    pub threads: Vec<WorkerStats>,
}

/// What a thread of this process does, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuRole {
    /// KV-node worker threads (`dinomo-kn-N`): the data path, cache and group commit.
    KnWorkers,
    /// KV-node (and routing-node) connection threads (`dinomo-conn-ioN`, the event loops, and `dinomo-conn-ctlN`):
    /// decoding requests and writing replies.
    KnNetwork,
    /// The memory node's merge threads (`dinomo-merge-N`).
    MemoryMerge,
    /// The memory node's processor threads serving two-sided calls (`dpm-proc-N`, `dpm-nic-N`).
    MemoryRpc,
    /// The benchmark's own client threads (`ycsb-client-N`).
    Clients,
    /// Everything else (heartbeats, the M-node, the routing node's refresher).
    Other,
}

impl CpuRole {
    /// The role of a thread named `name` (as the kernel keeps it: at most 15 bytes).
    pub fn of_thread(name: &str) -> CpuRole {
        if name.starts_with("dinomo-kn-") {
            CpuRole::KnWorkers
        } else if name.starts_with("dinomo-conn") {
            CpuRole::KnNetwork
        } else if name.starts_with("dinomo-merge") {
            CpuRole::MemoryMerge
        } else if name.starts_with("dpm-proc") || name.starts_with("dpm-nic") {
            CpuRole::MemoryRpc
        } else if name.starts_with(super::driver::CLIENT_THREAD_PREFIX) {
            CpuRole::Clients
        } else {
            CpuRole::Other
        }
    }
}

/// CPU time of every thread of this process, in nanoseconds, with its role.
#[derive(Debug, Clone, Default)]
pub struct CpuTimes {
    threads: HashMap<u32, (CpuRole, u64)>,
}

impl CpuTimes {
    /// Reads `/proc/self/task/*/{comm,schedstat}` (Linux); `None` where that is not available.
    pub fn read() -> Option<CpuTimes> {
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task").ok()? {
            let Ok(entry) = entry else { continue };
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            // A thread may end between listing and reading: skip it.
            let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            let Some(ns) = thread_cpu_ns(&path) else {
                continue;
            };
            threads.insert(tid, (CpuRole::of_thread(comm.trim_end()), ns));
        }
        (!threads.is_empty()).then_some(CpuTimes { threads })
    }

    /// CPU time spent from `self` to `later`, by role. Threads started in between count from zero; threads that
    /// ended in between are lost (none of the measured ones do).
    pub fn delta_by_role(&self, later: &CpuTimes) -> BTreeMap<CpuRole, u64> {
        let mut by_role = BTreeMap::new();
        for (tid, &(role, ns)) in &later.threads {
            let before = self.threads.get(tid).map_or(0, |&(_, b)| b);
            *by_role.entry(role).or_insert(0) += ns.saturating_sub(before);
        }
        by_role
    }
}

/// A thread's time on a CPU: `schedstat`'s first field (ns), else `stat`'s utime + stime (clock ticks).
fn thread_cpu_ns(task: &std::path::Path) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(task.join("schedstat"))
        && let Some(ns) = s.split_whitespace().next().and_then(|f| f.parse().ok())
    {
        return Some(ns);
    }
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // The name in parentheses may hold spaces: fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based over the whole line).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as u64 } else { 100 };
    Some((utime + stime) * 1_000_000_000 / ticks)
}

/// Summed worker counters over an interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerTotals {
    /// Lookups served (reads).
    pub lookups: u64,
    /// Lookups answered from a cached value.
    pub value_hits: u64,
    /// Lookups answered through a cached shortcut (one READ).
    pub shortcut_hits: u64,
    /// Lookups answered from the cache's record that the key has no value.
    #[serde(default)]
    pub absent_hits: u64,
    /// Shortcuts found stale (the lookup went on).
    pub stale_shortcuts: u64,
    /// Lookups answered from the worker's unmerged log.
    pub log_hits: u64,
    /// Lookups that walked the memory node's index.
    pub index_walks: u64,
    /// Round trips spent on index walks.
    pub index_walk_round_trips: u64,
    /// Entries that cached shortcuts led to, read ahead for a batch's lookups in one round trip.
    #[serde(default)]
    pub entries_read_ahead: u64,
    /// Index walks of a batch's uncached keys made side by side before it was served.
    #[serde(default)]
    pub index_walks_ahead: u64,
    /// Writes logged.
    pub writes: u64,
    /// Group commits (one WRITE each).
    pub commits: u64,
    /// Log segments filled.
    pub segments_sealed: u64,
    /// Times a write waited for the memory node to merge.
    pub merge_waits: u64,
    /// Fabric round trips.
    pub round_trips: u64,
    /// Bytes sent over the fabric.
    pub bytes_out: u64,
    /// Bytes received over the fabric.
    pub bytes_in: u64,
}

impl WorkerTotals {
    /// Adds one worker's counters from `before` (zero if it is new) to `after`.
    fn add_delta(&mut self, before: Option<&WorkerStats>, after: &WorkerStats) {
        let d = |f: fn(&WorkerStats) -> u64| f(after).saturating_sub(before.map_or(0, f));
        self.lookups += d(|s| s.lookups);
        self.value_hits += d(|s| s.value_hits);
        self.shortcut_hits += d(|s| s.shortcut_hits);
        self.absent_hits += d(|s| s.absent_hits);
        self.stale_shortcuts += d(|s| s.stale_shortcuts);
        self.log_hits += d(|s| s.log_hits);
        self.index_walks += d(|s| s.index_walks);
        self.index_walk_round_trips += d(|s| s.index_walk_round_trips);
        self.entries_read_ahead += d(|s| s.entries_read_ahead);
        self.index_walks_ahead += d(|s| s.index_walks_ahead);
        self.writes += d(|s| s.writes);
        self.commits += d(|s| s.commits);
        self.segments_sealed += d(|s| s.segments_sealed);
        self.merge_waits += d(|s| s.merge_waits);
        self.round_trips += d(|s| s.round_trips);
        self.bytes_out += d(|s| s.bytes_out);
        self.bytes_in += d(|s| s.bytes_in);
    }

    /// Lookups not answered by the cache (a value, a shortcut or a record of absence) or the log: they walked the
    /// index.
    pub fn misses(&self) -> u64 {
        self.lookups
            .saturating_sub(self.value_hits + self.shortcut_hits + self.absent_hits + self.log_hits)
    }
}

/// The cache's state at the end of the interval, summed over every worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheState {
    /// Values cached.
    pub values: u64,
    /// Shortcuts cached.
    pub shortcuts: u64,
    /// Bytes charged for cached entries.
    pub used_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
    /// Shortcuts promoted to values during the interval.
    pub promotions: u64,
    /// Values demoted to shortcuts during the interval.
    pub demotions: u64,
    /// Entries evicted during the interval.
    pub evictions: u64,
}

impl CacheState {
    /// Adds one worker's cache: its gauges at `after`, its counters from `before` (zero if it is new) to `after`.
    fn add_delta(&mut self, before: Option<&CacheStats>, after: &CacheStats) {
        let d = |f: fn(&CacheStats) -> u64| f(after).saturating_sub(before.map_or(0, f));
        self.values += after.values;
        self.shortcuts += after.shortcuts;
        self.used_bytes += after.used_bytes;
        self.budget_bytes += after.budget_bytes;
        self.promotions += d(|s| s.promotions);
        self.demotions += d(|s| s.demotions);
        self.evictions += d(|s| s.evictions);
    }
}

/// What changed between two snapshots.
#[derive(Debug, Clone, Default)]
pub struct Deltas {
    /// Whether the KV nodes' counters were read at both ends; when not, the totals, nodes and caches below are
    /// empty and mean nothing.
    pub kv_counters: bool,
    /// All KV nodes together.
    pub totals: WorkerTotals,
    /// Each KV node: id, key-space share, its counters.
    pub per_node: Vec<(u32, f64, WorkerTotals)>,
    /// The caches at the end.
    pub cache: CacheState,
    /// Whether the nodes have caches at both ends; when not, the cache counters mean nothing.
    pub caches: bool,
    /// The memory node at the start and at the end.
    pub memory: Option<(ProcessorStats, ProcessorStats)>,
    /// CPU time by role.
    pub cpu: Option<BTreeMap<CpuRole, u64>>,
    /// The serving processes' fabric counters over the phase, when read at both ends.
    pub fabric: Option<FabricTotals>,
}

/// The counters' changes from `start` to `end`, matched by node id and thread.
pub fn diff(start: &Snapshot, end: &Snapshot) -> Deltas {
    let mut out = Deltas::default();
    if let (Some(start_nodes), Some(end_nodes)) = (&start.nodes, &end.nodes) {
        out.kv_counters = true;
        out.caches = start.caches && end.caches;
        for node in end_nodes {
            let before = start_nodes.iter().find(|n| n.node_id == node.node_id);
            let mut totals = WorkerTotals::default();
            for (i, t) in node.threads.iter().enumerate() {
                let b = before.and_then(|n| n.threads.get(i));
                totals.add_delta(b, t);
                out.totals.add_delta(b, t);
                out.cache.add_delta(b.map(|s| &s.cache), &t.cache);
            }
            out.per_node.push((node.node_id, node.share, totals));
        }
    }
    out.fabric = match (start.fabric, end.fabric) {
        (Some(a), Some(b)) => Some(FabricTotals {
            round_trips: b.round_trips.saturating_sub(a.round_trips),
            bytes_out: b.bytes_out.saturating_sub(a.bytes_out),
            bytes_in: b.bytes_in.saturating_sub(a.bytes_in),
        }),
        _ => None,
    };
    out.memory = start.memory.clone().zip(end.memory.clone());
    out.cpu = match (&start.cpu, &end.cpu) {
        (Some(a), Some(b)) => Some(a.delta_by_role(b)),
        _ => None,
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(lookups: u64, value_hits: u64, round_trips: u64) -> WorkerStats {
        WorkerStats {
            lookups,
            value_hits,
            round_trips,
            ..WorkerStats::default()
        }
    }

    #[test]
    fn deltas_match_nodes_and_threads() {
        let start = Snapshot {
            nodes: Some(vec![NodeCounters {
                node_id: 1,
                share: 0.5,
                threads: vec![worker(10, 5, 100), worker(20, 0, 200)],
            }]),
            ..Snapshot::default()
        };
        let end = Snapshot {
            nodes: Some(vec![
                NodeCounters {
                    node_id: 1,
                    share: 0.5,
                    threads: vec![worker(15, 9, 110), worker(30, 1, 260)],
                },
                // A node that joined in between counts from zero.
                NodeCounters {
                    node_id: 2,
                    share: 0.5,
                    threads: vec![worker(7, 7, 0)],
                },
            ]),
            ..Snapshot::default()
        };
        let d = diff(&start, &end);
        assert_eq!(d.totals.lookups, 5 + 10 + 7);
        assert_eq!(d.totals.value_hits, 4 + 1 + 7);
        assert_eq!(d.totals.round_trips, 10 + 60);
        assert_eq!(d.totals.misses(), 22 - 12);
        assert_eq!(d.per_node.len(), 2);
        assert_eq!(d.per_node[0].2.lookups, 15);
        assert!(d.kv_counters && d.memory.is_none() && d.cpu.is_none());
        // A target that cannot read the KV nodes says so rather than reporting zeros.
        let unseen = diff(&Snapshot::default(), &Snapshot::default());
        assert!(!unseen.kv_counters && unseen.per_node.is_empty());
    }

    #[test]
    fn thread_roles_follow_the_names_the_cluster_gives_its_threads() {
        assert_eq!(CpuRole::of_thread("dinomo-kn-0"), CpuRole::KnWorkers);
        assert_eq!(CpuRole::of_thread("dinomo-kn3-heart"), CpuRole::Other);
        assert_eq!(CpuRole::of_thread("dinomo-conn-io1"), CpuRole::KnNetwork);
        assert_eq!(CpuRole::of_thread("dinomo-conn-ctl0"), CpuRole::KnNetwork);
        assert_eq!(CpuRole::of_thread("dinomo-merge-1"), CpuRole::MemoryMerge);
        assert_eq!(CpuRole::of_thread("dpm-proc-0"), CpuRole::MemoryRpc);
        assert_eq!(CpuRole::of_thread("ycsb-client-3"), CpuRole::Clients);
    }

    #[test]
    fn this_thread_burns_cpu_that_is_counted() {
        let Some(before) = CpuTimes::read() else {
            return; // not Linux
        };
        // A fixed amount of work on this thread: 10 million dependent multiply-adds take well over 2 ms of CPU
        // on any machine, however long the scheduler makes them wait.
        let mut x = 0u64;
        for _ in 0..10_000_000 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = CpuTimes::read().unwrap();
        let spent: u64 = before.delta_by_role(&after).values().sum();
        assert!(spent >= 2_000_000, "{spent} ns");
    }
}
