//! `dinomo bench dac`: Figure 3 of the DINOMO paper (§5.1) scaled to this machine: read throughput and round trips
//! per read of each caching policy, as the cache grows from 1% to 16% of the data.
//!
//! A memory node over an anonymous pool is loaded with `keys` pairs (8-byte keys, 64-byte values by default) and
//! its logs merged. Then, for each cache size and policy, `threads` KV-node workers (each driven directly by one
//! benchmark thread, so no queue hop blurs the data path) read keys drawn uniformly from a working set of 5% of the
//! keys, with an injected fabric round-trip latency: first a warm-up long enough for the cache to settle, then
//! timed slices in which the policies of one cache size take turns, so that drift of the machine affects them alike. Throughput is read operations per second of all workers; round trips come from the fabric
//! counters of the worker threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use dinomo_cache::{CacheConfig, Policy};
use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_kn::{DirectWorker, KnConfig, WorkerStats, thread_for_key};
use dinomo_pool::Pool;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::svg;

/// Settings of the DAC benchmark.
#[derive(Debug, Clone)]
pub struct DacBenchOptions {
    /// Keys loaded (default 1,000,000).
    pub keys: u64,
    /// Bytes per value (default 64).
    pub value_size: usize,
    /// Share of the keys read, uniformly, in percent (default 5).
    pub working_set_percent: f64,
    /// Cache sizes in percent of the data (keys × (key + value) bytes), summed over the workers.
    pub cache_percents: Vec<f64>,
    /// Policies compared.
    pub policies: Vec<Policy>,
    /// Workers, each on its own thread (default 1).
    pub threads: usize,
    /// Timed phase per case.
    pub duration: Duration,
    /// Warm-up reads per worker, as a multiple of its share of the working set (default 6).
    pub warmup_passes: f64,
    /// Busy-wait per fabric round trip, in nanoseconds (default 2000: a few-microsecond fabric).
    pub injected_latency_ns: u64,
    /// Seed of the key choice.
    pub seed: u64,
}

impl Default for DacBenchOptions {
    fn default() -> Self {
        DacBenchOptions {
            keys: 1_000_000,
            value_size: 64,
            working_set_percent: 5.0,
            cache_percents: vec![1.0, 2.0, 4.0, 8.0, 16.0],
            policies: vec![
                Policy::ShortcutOnly,
                Policy::Static { value_percent: 25 },
                Policy::Static { value_percent: 50 },
                Policy::Static { value_percent: 75 },
                Policy::ValueOnly,
                Policy::Adaptive,
            ],
            threads: 1,
            duration: Duration::from_millis(1000),
            warmup_passes: 6.0,
            injected_latency_ns: 2000,
            seed: 1,
        }
    }
}

/// One policy at one cache size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DacCase {
    /// Cache size in percent of the data.
    pub cache_percent: f64,
    /// Cache bytes of all workers together.
    pub cache_bytes: u64,
    /// The policy.
    pub policy: String,
    /// Reads in the timed phase.
    pub reads: u64,
    /// Reads per second.
    pub reads_per_sec: f64,
    /// Fabric round trips per read.
    pub round_trips_per_read: f64,
    /// Share of reads served from a cached value.
    pub value_hit_ratio: f64,
    /// Share of reads served through a cached shortcut.
    pub shortcut_hit_ratio: f64,
    /// Share of reads that walked the index.
    pub miss_ratio: f64,
    /// Values cached at the end.
    pub values: u64,
    /// Shortcuts cached at the end.
    pub shortcuts: u64,
    /// Measured round trips per miss (moving average, last worker).
    pub miss_cost: f64,
}

/// DAC against the best other policy at one cache size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DacVersusBest {
    /// Cache size in percent of the data.
    pub cache_percent: f64,
    /// The best policy other than DAC.
    pub best_policy: String,
    /// Its reads per second.
    pub best_reads_per_sec: f64,
    /// DAC's reads per second.
    pub dac_reads_per_sec: f64,
    /// DAC / best.
    pub ratio: f64,
}

/// The whole result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DacReport {
    /// Keys loaded.
    pub keys: u64,
    /// Bytes per key.
    pub key_size: usize,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys in the working set.
    pub working_set_keys: u64,
    /// Bytes of data (keys × (key + value)).
    pub data_bytes: u64,
    /// Workers.
    pub threads: usize,
    /// Injected latency per round trip.
    pub injected_latency_ns: u64,
    /// Every case.
    pub cases: Vec<DacCase>,
    /// DAC against the best other policy, per cache size.
    pub dac_versus_best: Vec<DacVersusBest>,
}

/// Bytes of a key: the key id, big-endian, like the paper's 8-byte keys.
const KEY_SIZE: usize = 8;

fn key(id: u64) -> [u8; KEY_SIZE] {
    id.to_be_bytes()
}

fn value(id: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (id as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// Runs the benchmark; `progress` is told what is happening.
pub fn run_dac(
    opts: &DacBenchOptions,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<DacReport> {
    ensure!(
        opts.keys > 0 && opts.threads > 0,
        "keys and threads must be at least 1"
    );
    ensure!(
        opts.working_set_percent > 0.0 && opts.working_set_percent <= 100.0,
        "working set must be in (0, 100]"
    );
    let data_bytes = opts.keys * (KEY_SIZE + opts.value_size) as u64;
    let entry = dinomo_log::entry_len(KEY_SIZE, opts.value_size) as u64;
    // Log entries, the index (with room for the tables a resize retires) and slack.
    let pool_size =
        (opts.keys * entry * 2 + opts.keys * 64 + (256 << 20)).next_multiple_of(1 << 20);
    let pool = Arc::new(Pool::anonymous(pool_size, 1 << 20).context("creating the pool")?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            merge_threads: 2,
            ..ProcessorConfig::default()
        },
    )?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    let connector = Connector::new(Target::InProcess(node.clone()));
    let kn = |budget: u64, policy: Policy| KnConfig {
        threads: opts.threads,
        max_value_len: opts.value_size.max(64),
        cache: CacheConfig {
            budget_bytes: budget,
            policy,
            ..CacheConfig::default()
        },
        ..KnConfig::default()
    };

    progress(&format!(
        "loading {} keys of {} B values",
        opts.keys, opts.value_size
    ));
    let mut loaders = (0..opts.threads)
        .map(|t| DirectWorker::start(kn(0, Policy::Adaptive), t as u32, connector.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut buckets: Vec<Vec<(Vec<u8>, Vec<u8>)>> = vec![Vec::new(); opts.threads];
    for id in 0..opts.keys {
        let k = key(id);
        let t = thread_for_key(&k, opts.threads);
        buckets[t].push((k.to_vec(), value(id, opts.value_size)));
        if buckets[t].len() == 4096 {
            loaders[t].set_many(buckets[t].iter().map(|(k, v)| (&k[..], &v[..])))?;
            buckets[t].clear();
        }
    }
    for (t, b) in buckets.iter().enumerate() {
        loaders[t].set_many(b.iter().map(|(k, v)| (&k[..], &v[..])))?;
        loaders[t].merge_all()?;
    }
    drop(loaders);

    // Each worker reads the working-set keys it owns.
    let ws_keys = ((opts.keys as f64 * opts.working_set_percent / 100.0) as u64).max(1);
    let mut owned: Vec<Vec<u64>> = vec![Vec::new(); opts.threads];
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut chosen = std::collections::HashSet::new();
    while (chosen.len() as u64) < ws_keys {
        chosen.insert(rng.random_range(0..opts.keys));
    }
    let mut chosen: Vec<u64> = chosen.into_iter().collect();
    chosen.sort_unstable();
    for id in chosen {
        owned[thread_for_key(&key(id), opts.threads)].push(id);
    }

    let mut cases = Vec::new();
    for &pct in &opts.cache_percents {
        let cache_bytes = (data_bytes as f64 * pct / 100.0) as u64;
        let per_worker = cache_bytes / opts.threads as u64;
        progress(&format!(
            "cache {pct}% ({cache_bytes} B): warming every policy"
        ));
        // Every policy gets its own workers (each claims a log of its own; reads never write to it), all warmed,
        // then the policies take turns in timed slices so that drift of the machine affects them alike.
        let mut sets = Vec::new();
        for (p, &policy) in opts.policies.iter().enumerate() {
            let mut set = Vec::new();
            for (t, ids) in owned.iter().enumerate() {
                let log_thread = (p * opts.threads + t) as u32;
                let w = DirectWorker::start(kn(per_worker, policy), log_thread, connector.clone())?;
                let seed = opts.seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                set.push(Reader::new(w, ids, seed));
            }
            in_parallel(&mut set, |r| r.warm(opts))?;
            sets.push(set);
        }
        let slice = opts.duration / SLICES;
        for _ in 0..SLICES {
            for set in &mut sets {
                in_parallel(set, |r| r.timed(slice, opts.value_size))?;
            }
        }
        for (policy, set) in opts.policies.iter().zip(&mut sets) {
            // Counters over the timed slices, summed over the workers; cache contents at the end.
            let (mut reads, mut secs) = (0u64, 0f64);
            let mut agg = WorkerStats::default();
            for r in set.iter_mut() {
                let after = r.worker.stats();
                let before = &r.before;
                reads += r.reads;
                secs = secs.max(r.busy.as_secs_f64());
                agg.round_trips += r.round_trips;
                agg.value_hits += after.value_hits - before.value_hits;
                agg.shortcut_hits += after.shortcut_hits - before.shortcut_hits;
                agg.index_walks += after.index_walks - before.index_walks;
                agg.cache.values += after.cache.values;
                agg.cache.shortcuts += after.cache.shortcuts;
                agg.miss_cost = after.miss_cost;
            }
            let per = |x: u64| {
                if reads == 0 {
                    0.0
                } else {
                    x as f64 / reads as f64
                }
            };
            cases.push(DacCase {
                cache_percent: pct,
                cache_bytes,
                policy: policy.to_string(),
                reads,
                reads_per_sec: reads as f64 / secs.max(1e-9),
                round_trips_per_read: per(agg.round_trips),
                value_hit_ratio: per(agg.value_hits),
                shortcut_hit_ratio: per(agg.shortcut_hits),
                miss_ratio: per(agg.index_walks),
                values: agg.cache.values,
                shortcuts: agg.cache.shortcuts,
                miss_cost: agg.miss_cost,
            });
        }
    }
    processor.shutdown();
    let dac_versus_best = versus_best(&cases, &opts.cache_percents);
    Ok(DacReport {
        keys: opts.keys,
        key_size: KEY_SIZE,
        value_size: opts.value_size,
        working_set_keys: ws_keys,
        data_bytes,
        threads: opts.threads,
        injected_latency_ns: opts.injected_latency_ns,
        cases,
        dac_versus_best,
    })
}

/// Timed slices per cache size; the policies take turns.
const SLICES: u32 = 5;

/// One worker of one policy with its share of the working set, its random key stream and its timed totals.
struct Reader<'a> {
    worker: DirectWorker,
    ids: &'a [u64],
    rng: StdRng,
    /// Counters when the timed slices began.
    before: WorkerStats,
    reads: u64,
    busy: Duration,
    /// Fabric round trips of the timed slices (counted per thread, and each slice runs on a new thread).
    round_trips: u64,
}

impl<'a> Reader<'a> {
    fn new(worker: DirectWorker, ids: &'a [u64], seed: u64) -> Reader<'a> {
        Reader {
            worker,
            ids,
            rng: StdRng::seed_from_u64(seed),
            before: WorkerStats::default(),
            reads: 0,
            busy: Duration::ZERO,
            round_trips: 0,
        }
    }

    /// Every key once, so that no key's first miss falls into a timed slice, then random reads until the cache
    /// has settled.
    fn warm(&mut self, opts: &DacBenchOptions) -> anyhow::Result<()> {
        self.worker.set_injected_latency(opts.injected_latency_ns);
        for &id in self.ids {
            ensure!(self.worker.get(&key(id))?.is_some(), "key {id} is missing");
        }
        if !self.ids.is_empty() {
            for _ in 0..(self.ids.len() as f64 * opts.warmup_passes) as u64 {
                let id = self.ids[self.rng.random_range(0..self.ids.len())];
                ensure!(self.worker.get(&key(id))?.is_some(), "key {id} is missing");
            }
        }
        self.before = self.worker.stats();
        Ok(())
    }

    /// Uniform random reads for `slice`.
    fn timed(&mut self, slice: Duration, value_size: usize) -> anyhow::Result<()> {
        if self.ids.is_empty() {
            return Ok(());
        }
        let trips = dinomo_fabric::counters::thread_snapshot().round_trips;
        let start = Instant::now();
        while start.elapsed() < slice {
            for _ in 0..64 {
                let id = self.ids[self.rng.random_range(0..self.ids.len())];
                let v = self.worker.get(&key(id))?;
                ensure!(
                    v.as_deref().map(<[u8]>::len) == Some(value_size),
                    "key {id} read back wrong"
                );
            }
            self.reads += 64;
        }
        self.busy += start.elapsed();
        self.round_trips += dinomo_fabric::counters::thread_snapshot().round_trips - trips;
        Ok(())
    }
}

/// Runs `f` on every reader of a set at once, one thread each.
fn in_parallel(
    set: &mut [Reader<'_>],
    f: impl Fn(&mut Reader<'_>) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = set.iter_mut().map(|r| s.spawn(move || f(r))).collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("benchmark thread"))
    })
}

fn versus_best(cases: &[DacCase], percents: &[f64]) -> Vec<DacVersusBest> {
    let dac = Policy::Adaptive.to_string();
    percents
        .iter()
        .filter_map(|&p| {
            let at: Vec<&DacCase> = cases.iter().filter(|c| c.cache_percent == p).collect();
            let d = at.iter().find(|c| c.policy == dac)?;
            let best = at
                .iter()
                .filter(|c| c.policy != dac)
                .max_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec))?;
            Some(DacVersusBest {
                cache_percent: p,
                best_policy: best.policy.clone(),
                best_reads_per_sec: best.reads_per_sec,
                dac_reads_per_sec: d.reads_per_sec,
                ratio: d.reads_per_sec / best.reads_per_sec,
            })
        })
        .collect()
}

impl DacReport {
    /// An aligned table for people.
    pub fn print_table(&self) {
        println!(
            "DAC benchmark: {} keys of {} B + {} B ({} MB of data), working set {} keys uniform, {} worker(s), {} ns per round trip",
            self.keys,
            self.key_size,
            self.value_size,
            self.data_bytes / 1_000_000,
            self.working_set_keys,
            self.threads,
            self.injected_latency_ns
        );
        println!();
        println!(
            "{:>7} {:<14} {:>11} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9}",
            "cache", "policy", "reads/s", "RT/op", "value", "short", "miss", "values", "shortcuts"
        );
        for c in &self.cases {
            println!(
                "{:>6}% {:<14} {:>11.0} {:>7.3} {:>6.1}% {:>6.1}% {:>6.1}% {:>9} {:>9}",
                c.cache_percent,
                c.policy,
                c.reads_per_sec,
                c.round_trips_per_read,
                c.value_hit_ratio * 100.0,
                c.shortcut_hit_ratio * 100.0,
                c.miss_ratio * 100.0,
                c.values,
                c.shortcuts
            );
        }
        println!();
        println!(
            "{:>7} {:<14} {:>11} {:>11} {:>7}",
            "cache", "best other", "its reads/s", "DAC reads/s", "DAC/best"
        );
        for v in &self.dac_versus_best {
            println!(
                "{:>6}% {:<14} {:>11.0} {:>11.0} {:>7.3}",
                v.cache_percent, v.best_policy, v.best_reads_per_sec, v.dac_reads_per_sec, v.ratio
            );
        }
        if let Some(worst) = self
            .dac_versus_best
            .iter()
            .map(|v| v.ratio)
            .min_by(f64::total_cmp)
        {
            let verdict = |limit: f64| if worst >= limit { "MET" } else { "NOT MET" };
            println!();
            println!("targets (worst DAC/best {worst:.3}):");
            println!(
                "  [{}] DAC within 16% of the best other policy at every cache size (the paper's figure)",
                verdict(0.84)
            );
            println!(
                "  [{}] DAC within 5% of the best other policy at every cache size",
                verdict(0.95)
            );
        }
    }

    /// One line per case.
    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "cache_percent,cache_bytes,policy,reads,reads_per_sec,round_trips_per_read,value_hit_ratio,shortcut_hit_ratio,miss_ratio,values,shortcuts,miss_cost\n",
        );
        for c in &self.cases {
            s.push_str(&format!(
                "{},{},{},{},{:.1},{:.4},{:.4},{:.4},{:.4},{},{},{:.3}\n",
                c.cache_percent,
                c.cache_bytes,
                c.policy,
                c.reads,
                c.reads_per_sec,
                c.round_trips_per_read,
                c.value_hit_ratio,
                c.shortcut_hit_ratio,
                c.miss_ratio,
                c.values,
                c.shortcuts,
                c.miss_cost
            ));
        }
        s
    }

    /// Throughput and round trips per read against cache size, one line per policy.
    pub fn to_svg(&self) -> String {
        let mut names: Vec<String> = Vec::new();
        for c in &self.cases {
            if !names.contains(&c.policy) {
                names.push(c.policy.clone());
            }
        }
        let series = |f: fn(&DacCase) -> f64| -> Vec<svg::Series> {
            names
                .iter()
                .map(|n| svg::Series {
                    name: n.clone(),
                    points: self
                        .cases
                        .iter()
                        .filter(|c| &c.policy == n)
                        .map(|c| (c.cache_percent, f(c)))
                        .collect(),
                })
                .collect()
        };
        let tput = series(|c| c.reads_per_sec / 1e6);
        let rts = series(|c| c.round_trips_per_read);
        svg::render(&[
            svg::Panel {
                title: "Read throughput by caching policy",
                x_label: "cache size (% of data)",
                y_label: "million reads/s",
                log2_x: true,
                series: &tput,
            },
            svg::Panel {
                title: "Round trips per read",
                x_label: "cache size (% of data)",
                y_label: "round trips / read",
                log2_x: true,
                series: &rts,
            },
        ])
    }
}
