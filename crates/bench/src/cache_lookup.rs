//! `dinomo bench cache`: what a KV-node worker's cache lookup costs, served one key at a time or as a batch announced
//! first with [`Dac::prefetch`] (as a worker does with the requests it took from its queue together).
//!
//! One cache holds every key (values of `value_size` bytes, far more memory than the CPU caches). Each round draws
//! `batch` keys uniformly, looks each one up and copies its value out, as a GET reply does; with prefetch the round
//! first announces its keys. The two ways take turns in timed slices, the order alternating, so that drift of the
//! machine affects both alike.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use dinomo_cache::{CacheConfig, Dac, Lookup, Policy, Shortcut};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// Settings of the cache lookup benchmark.
#[derive(Debug, Clone)]
pub struct CacheBenchOptions {
    /// Keys cached (default 100,000).
    pub keys: u64,
    /// Bytes per value (default 1024).
    pub value_size: usize,
    /// Keys per round, one case each (default 1, 4, 16 and 64).
    pub batches: Vec<usize>,
    /// One timed slice (default 100 ms).
    pub slice: Duration,
    /// Slices per way and batch size (default 10).
    pub slices: u32,
    /// Seed of the key draws.
    pub seed: u64,
}

impl Default for CacheBenchOptions {
    fn default() -> Self {
        CacheBenchOptions {
            keys: 100_000,
            value_size: 1024,
            batches: vec![1, 4, 16, 64],
            slice: Duration::from_millis(100),
            slices: 10,
            seed: 1,
        }
    }
}

/// One batch size's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheCase {
    /// Keys per round.
    pub batch: usize,
    /// Nanoseconds per lookup (and value copy), keys looked up one at a time.
    pub plain_ns: f64,
    /// Nanoseconds per lookup (and value copy), each round announced with a prefetch first.
    pub prefetched_ns: f64,
    /// `plain_ns / prefetched_ns`: above 1, the prefetch pays.
    pub speedup: f64,
    /// The median over slice pairs of the same ratio (less sensitive to a slice disturbed by other work).
    pub median_slice_speedup: f64,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheReport {
    /// Keys cached.
    pub keys: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Bytes the cache charged for its entries.
    pub cache_bytes: u64,
    /// One row per batch size.
    pub cases: Vec<CacheCase>,
}

impl CacheReport {
    /// A table for people.
    pub fn print_table(&self) {
        println!(
            "{} keys, {} B values, {:.1} MiB cached; ns per lookup and value copy",
            self.keys,
            self.value_size,
            self.cache_bytes as f64 / f64::from(1 << 20)
        );
        println!("batch   one at a time   prefetched   speedup   median slice speedup");
        for c in &self.cases {
            println!(
                "{:>5}   {:>13.1}   {:>10.1}   {:>6.2}x   {:>19.2}x",
                c.batch, c.plain_ns, c.prefetched_ns, c.speedup, c.median_slice_speedup
            );
        }
    }
}

fn key_of(id: u64) -> Vec<u8> {
    format!("key:{id:012}").into_bytes()
}

/// Runs the benchmark.
pub fn run_cache(o: &CacheBenchOptions, progress: impl Fn(&str)) -> anyhow::Result<CacheReport> {
    ensure!(
        o.keys > 0 && o.slices > 0 && !o.batches.is_empty() && o.batches.iter().all(|&b| b > 0),
        "keys, slices and every batch size must be positive"
    );
    progress("filling the cache");
    let keys: Vec<Vec<u8>> = (0..o.keys).map(key_of).collect();
    let entry = Dac::value_entry_bytes(keys[0].len(), o.value_size);
    let mut dac = Dac::new(CacheConfig {
        budget_bytes: entry.saturating_mul(o.keys + 1),
        policy: Policy::ValueOnly,
        ..CacheConfig::default()
    });
    let value = vec![b'v'; o.value_size];
    for (i, k) in keys.iter().enumerate() {
        dac.fill(
            k,
            &value,
            Shortcut {
                ptr: i as u64,
                seq: 1,
            },
        );
    }
    ensure!(
        dac.stats().values == o.keys,
        "the cache kept {} of {} values",
        dac.stats().values,
        o.keys
    );
    let cache_bytes = dac.stats().used_bytes;
    let mut rng = StdRng::seed_from_u64(o.seed);
    let mut out = vec![0u8; o.value_size];
    let mut cases = Vec::new();
    for &batch in &o.batches {
        progress(&format!("batch {batch}"));
        let mut ids = vec![0u64; batch];
        let mut slice = |dac: &mut Dac, prefetch: bool| -> anyhow::Result<(u64, Duration)> {
            let start = Instant::now();
            let mut lookups = 0u64;
            while start.elapsed() < o.slice {
                for _ in 0..16 {
                    ids.fill_with(|| rng.random_range(0..o.keys));
                    if prefetch {
                        dac.prefetch(ids.iter().map(|&i| keys[i as usize].as_slice()));
                    }
                    for &i in &ids {
                        match dac.lookup(&keys[i as usize]) {
                            Lookup::Value { value, .. } => out.copy_from_slice(value),
                            _ => bail!("key {i} is not a cached value"),
                        }
                        black_box(&out);
                    }
                }
                lookups += 16 * batch as u64;
            }
            Ok((lookups, start.elapsed()))
        };
        // Warm-up: both ways once.
        slice(&mut dac, false)?;
        slice(&mut dac, true)?;
        // Lookups and time of each way: one at a time [0], prefetched [1].
        let mut totals = [(0u64, Duration::ZERO); 2];
        let mut ratios = Vec::new();
        for s in 0..o.slices {
            let mut ns = [0.0f64; 2];
            let order = if s % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for prefetch in order {
                let (n, t) = slice(&mut dac, prefetch)?;
                let way = usize::from(prefetch);
                totals[way].0 += n;
                totals[way].1 += t;
                ns[way] = t.as_nanos() as f64 / n as f64;
            }
            ratios.push(ns[0] / ns[1]);
        }
        ratios.sort_by(f64::total_cmp);
        let [plain_ns, prefetched_ns] = totals.map(|(n, t)| t.as_nanos() as f64 / n as f64);
        cases.push(CacheCase {
            batch,
            plain_ns,
            prefetched_ns,
            speedup: plain_ns / prefetched_ns,
            median_slice_speedup: ratios[ratios.len() / 2],
        });
    }
    Ok(CacheReport {
        keys: o.keys,
        value_size: o.value_size,
        cache_bytes,
        cases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_times_every_batch_size_both_ways() {
        let report = run_cache(
            &CacheBenchOptions {
                keys: 500,
                value_size: 100,
                batches: vec![1, 3, 70],
                slice: Duration::from_millis(2),
                slices: 2,
                seed: 7,
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(
            report.cases.iter().map(|c| c.batch).collect::<Vec<_>>(),
            [1, 3, 70]
        );
        assert!(report.cache_bytes > 500 * 100);
        for c in &report.cases {
            assert!(c.plain_ns > 0.0 && c.prefetched_ns > 0.0, "{c:?}");
            assert!(
                c.speedup.is_finite() && c.median_slice_speedup.is_finite(),
                "{c:?}"
            );
        }
    }
}
