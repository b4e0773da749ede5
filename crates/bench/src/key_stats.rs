//! `dinomo bench key-stats`: what the per-epoch key-access statistics (heavy hitters, distinct keys, F2; see
//! `dinomo_kn::KeySketch`) cost the KV node.
//!
//! Two in-process KV nodes, each with its own memory node and the same data, differ only in
//! `KnConfig::key_stats.enabled`. One benchmark thread keeps `depth` requests in flight at the node's worker
//! (through its queue, as the node's server does) and counts replies; the two nodes take turns in timed slices,
//! the order alternating, so that drift of the machine affects both alike. Beside it, the sketch alone: the
//! nanoseconds of one `KeySketch::record` on the same key stream.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use crossbeam_channel::unbounded;
use dinomo_kn::{
    Command, DataOp, Embedded, EmbeddedConfig, KeySketch, KeyStatsConfig, KnConfig, Reply, Tagged,
};
use serde::{Deserialize, Serialize};

use crate::ycsb::{Distribution, OpGenerator, OpKind, Workload, key_bytes};

/// Settings of the key-statistics overhead benchmark.
#[derive(Debug, Clone)]
pub struct KeyStatsBenchOptions {
    /// Keys loaded (default 100,000).
    pub keys: u64,
    /// Bytes per value (default 64).
    pub value_size: usize,
    /// Operation mix (default C: reads only, which leaves the most room for the sketch to show).
    pub workload: Workload,
    /// Request distribution (default scrambled Zipfian 0.99).
    pub distribution: Distribution,
    /// Requests kept in flight at the worker (default 64).
    pub depth: usize,
    /// One timed slice (default 200 ms).
    pub slice: Duration,
    /// Slices per configuration (default 10).
    pub slices: u32,
    /// Seed of the operation stream.
    pub seed: u64,
}

impl Default for KeyStatsBenchOptions {
    fn default() -> Self {
        KeyStatsBenchOptions {
            keys: 100_000,
            value_size: 64,
            workload: Workload::C,
            distribution: Distribution::ScrambledZipfian { theta: 0.99 },
            depth: 64,
            slice: Duration::from_millis(200),
            slices: 10,
            seed: 1,
        }
    }
}

/// Operations generated ahead and replayed in a loop.
const STREAM_LEN: usize = 1 << 18;

/// What the run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyStatsReport {
    /// Workload name.
    pub workload: String,
    /// Distribution name.
    pub distribution: String,
    /// Keys loaded.
    pub keys: u64,
    /// Requests in flight.
    pub depth: usize,
    /// Operations per second with the statistics on, per slice.
    pub with_stats: Vec<f64>,
    /// Operations per second with the statistics off, per slice.
    pub without_stats: Vec<f64>,
    /// Total operations per second over all slices, on and off.
    pub with_stats_ops: f64,
    /// As above, with the statistics off.
    pub without_stats_ops: f64,
    /// Throughput lost to the statistics over all slices, in percent (negative: within noise, the run with them
    /// was faster).
    pub overhead_percent: f64,
    /// The median over slices of the throughput lost in that slice's pair of runs, in percent (less sensitive to
    /// a slice disturbed by other work on the machine).
    pub median_slice_overhead_percent: f64,
    /// Nanoseconds of one `KeySketch::record` alone on the same key stream (best of five repetitions).
    pub sketch_ns_per_access: f64,
    /// Nanoseconds per operation of the node with the statistics off (1 / throughput), for scale.
    pub node_ns_per_op: f64,
    /// Accesses the node with the statistics counted in its last epoch (a check that it really kept them).
    pub counted_accesses: u64,
}

impl KeyStatsReport {
    /// A table for people.
    pub fn print_table(&self) {
        println!(
            "workload {}, {}, {} keys, {} requests in flight",
            self.workload, self.distribution, self.keys, self.depth
        );
        println!("slice   with key stats (ops/s)   without (ops/s)");
        for (i, (a, b)) in self.with_stats.iter().zip(&self.without_stats).enumerate() {
            println!("{:>5}   {:>22.0}   {:>15.0}", i + 1, a, b);
        }
        println!(
            "total   {:>22.0}   {:>15.0}   overhead {:+.2}% (median of the slices {:+.2}%)",
            self.with_stats_ops,
            self.without_stats_ops,
            self.overhead_percent,
            self.median_slice_overhead_percent
        );
        println!(
            "sketch alone: {:.1} ns per access; the node spends {:.0} ns per operation",
            self.sketch_ns_per_access, self.node_ns_per_op
        );
    }
}

fn store(enabled: bool, cfg: &KeyStatsBenchOptions) -> anyhow::Result<Embedded> {
    let data = cfg.keys * (8 + cfg.value_size as u64 + 64);
    Ok(Embedded::open(&EmbeddedConfig {
        pool_size: (data * 4).max(128 << 20),
        kn: KnConfig {
            threads: 1,
            key_stats: KeyStatsConfig {
                enabled,
                ..KeyStatsConfig::default()
            },
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    })?)
}

/// Runs the benchmark.
pub fn run_key_stats(
    o: &KeyStatsBenchOptions,
    progress: impl Fn(&str),
) -> anyhow::Result<KeyStatsReport> {
    ensure!(
        o.keys > 0 && o.depth > 0 && o.slices > 0,
        "keys, depth and slices must be positive"
    );
    progress("loading");
    let stores = [store(true, o)?, store(false, o)?];
    let value = vec![b'v'; o.value_size];
    let mut key = Vec::new();
    for s in &stores {
        let sub = s.submitter();
        let (tx, rx) = unbounded::<Tagged>();
        let mut in_flight = 0;
        for id in 0..o.keys {
            key_bytes(id, 8, &mut key)?;
            sub.submit(
                Command::Data(DataOp::Set(key.clone(), value.clone())),
                0,
                &tx,
            )?;
            in_flight += 1;
            if in_flight == 256 {
                rx.recv()?.1?;
                in_flight -= 1;
            }
        }
        for _ in 0..in_flight {
            rx.recv()?.1?;
        }
        s.handle().merge_all()?;
    }
    let mut generator = OpGenerator::new(o.workload, o.distribution, o.keys, o.seed)?;
    let ops: Vec<(bool, Vec<u8>)> = (0..STREAM_LEN)
        .map(|_| {
            let op = generator.next();
            let mut k = Vec::new();
            key_bytes(op.key_id, 8, &mut k).map(|_| (op.kind != OpKind::Read, k))
        })
        .collect::<Result<_, _>>()?;
    progress("warming up");
    let mut cursor = [0usize; 2];
    for (i, s) in stores.iter().enumerate() {
        drive(s, &ops, &mut cursor[i], &value, o.depth, o.slice / 2)?;
    }
    stores[0].handle().epoch_stats()?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut with_ops, mut with_time, mut without_ops, mut without_time) = (0u64, 0.0, 0u64, 0.0);
    for slice in 0..o.slices {
        progress(&format!("slice {} of {}", slice + 1, o.slices));
        let order = if slice % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (n, secs) = drive(&stores[i], &ops, &mut cursor[i], &value, o.depth, o.slice)?;
            let rate = n as f64 / secs;
            if i == 0 {
                with.push(rate);
                with_ops += n;
                with_time += secs;
            } else {
                without.push(rate);
                without_ops += n;
                without_time += secs;
            }
        }
    }
    let counted = stores[0]
        .handle()
        .epoch_stats()?
        .iter()
        .filter_map(|e| e.keys.as_ref().map(|k| k.accesses))
        .sum();
    ensure!(
        counted >= with_ops,
        "the node with statistics counted {counted} of {with_ops} accesses"
    );
    let (with_rate, without_rate) = (
        with_ops as f64 / with_time,
        without_ops as f64 / without_time,
    );
    let mut pairs: Vec<f64> = with
        .iter()
        .zip(&without)
        .map(|(a, b)| (1.0 - a / b) * 100.0)
        .collect();
    pairs.sort_by(f64::total_cmp);
    let median = if pairs.len() % 2 == 1 {
        pairs[pairs.len() / 2]
    } else {
        (pairs[pairs.len() / 2 - 1] + pairs[pairs.len() / 2]) / 2.0
    };
    progress("the sketch alone");
    let sketch_ns = sketch_alone(&ops, o.slice);
    Ok(KeyStatsReport {
        workload: o.workload.to_string(),
        distribution: o.distribution.to_string(),
        keys: o.keys,
        depth: o.depth,
        with_stats: with,
        without_stats: without,
        with_stats_ops: with_rate,
        without_stats_ops: without_rate,
        overhead_percent: (1.0 - with_rate / without_rate) * 100.0,
        median_slice_overhead_percent: median,
        sketch_ns_per_access: sketch_ns,
        node_ns_per_op: 1e9 / without_rate,
        counted_accesses: counted,
    })
}

/// Keeps `depth` operations of `ops` in flight at `store` for `time`; returns the operations completed and the
/// seconds it took.
fn drive(
    store: &Embedded,
    ops: &[(bool, Vec<u8>)],
    cursor: &mut usize,
    value: &[u8],
    depth: usize,
    time: Duration,
) -> anyhow::Result<(u64, f64)> {
    let sub = store.submitter();
    let (tx, rx) = unbounded::<Tagged>();
    let submit = |cursor: &mut usize| -> anyhow::Result<()> {
        let (write, key) = &ops[*cursor % ops.len()];
        *cursor += 1;
        let op = if *write {
            DataOp::Set(key.clone(), value.to_vec())
        } else {
            DataOp::Get(key.clone())
        };
        sub.submit(Command::Data(op), 0, &tx).context("submitting")
    };
    for _ in 0..depth {
        submit(cursor)?;
    }
    let start = Instant::now();
    let mut done = 0u64;
    loop {
        let (_, r) = rx.recv()?;
        match r? {
            Reply::Value(_) | Reply::Applied(_) => {}
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
        done += 1;
        // The clock is read every 64 replies, not per operation.
        if done % 64 == 0 && start.elapsed() >= time {
            break;
        }
        submit(cursor)?;
    }
    let secs = start.elapsed().as_secs_f64();
    // Drain what is still in flight (not counted).
    for _ in 0..depth - 1 {
        rx.recv()?.1?;
    }
    Ok((done, secs))
}

/// Nanoseconds per `KeySketch::record` over the stream's keys: the best of five repetitions of about `time / 5`
/// each (the least disturbed by other work on the machine).
fn sketch_alone(ops: &[(bool, Vec<u8>)], time: Duration) -> f64 {
    let mut sketch = KeySketch::new(&KeyStatsConfig::default());
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < time / 5 {
            for (_, key) in ops {
                sketch.record(black_box(key));
            }
            n += ops.len() as u64;
        }
        best = best.min(start.elapsed().as_nanos() as f64 / n as f64);
        black_box(sketch.take());
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_run_measures_both_and_counts_every_access() {
        let o = KeyStatsBenchOptions {
            keys: 2000,
            slice: Duration::from_millis(20),
            slices: 2,
            depth: 8,
            ..KeyStatsBenchOptions::default()
        };
        let r = run_key_stats(&o, |_| {}).unwrap();
        assert_eq!(r.with_stats.len(), 2);
        assert_eq!(r.without_stats.len(), 2);
        assert!(r.with_stats_ops > 0.0 && r.without_stats_ops > 0.0);
        assert!(r.sketch_ns_per_access > 0.0);
        assert!(r.counted_accesses > 0);
    }
}
