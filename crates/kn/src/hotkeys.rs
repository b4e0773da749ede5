//! Per-epoch key-access statistics for the M-node's policy (paper §3.5, Table 4): which keys are hot, and the
//! mean and standard deviation of the access frequency, without a map of every key.
//!
//! Each worker keeps one [`KeySketch`] per monitoring epoch:
//! - **heavy hitters** — a Misra–Gries summary of `heavy_hitters` counters: every key accessed more than
//!   `accesses / (heavy_hitters + 1) + 1` times is listed, and each listed count is at most
//!   [`KeyStats::heavy_hitter_error`] below the true one (never above). A candidate's key bytes are copied only
//!   when it is seen a second time, so a spread stream does not copy a key per access;
//! - **distinct keys** D — a HyperLogLog of 2^`distinct_precision` one-byte registers (standard error
//!   1.04 / √registers);
//! - **second frequency moment** F2 = Σ count² — an AMS estimator in count-sketch form: `f2_depth` rows of
//!   `f2_width` signed counters, the median of the rows' sums of squares (standard error about √(2 / width) per row);
//! - **tracked keys** — exact counters for a bounded set of keys the node names (its replicated keys), so the
//!   M-node can tell when one has gone cold.
//!
//! With N accesses, mean = N / D and σ² = F2 / D − mean². An update hashes the key once and touches a fixed
//! number of words; the heavy-hitter step is O(1) amortised (a decrement of all counters happens at most once
//! per `heavy_hitters + 1` accesses' worth of counts). Every part is mergeable, so the snapshots of all workers
//! and all nodes combine into the cluster's ([`KeyStats::merge`]).

// MurmurHash3's 64-bit finaliser (the index's bucket mix): a bijective mix whose every output bit depends on
// every input bit.
use dinomo_index::layout::mix as fmix64;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Settings of the key-access statistics of each worker thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyStatsConfig {
    /// Whether workers keep the statistics at all (default true).
    pub enabled: bool,
    /// Counters of the heavy-hitter summary (default 128; 1..=65536).
    pub heavy_hitters: usize,
    /// log2 of the distinct-key estimator's registers (default 12: 4 KiB, about 1.6% standard error; 4..=18).
    pub distinct_precision: u8,
    /// Rows of the F2 estimator; the estimate is their median (default 3; 1..=16).
    pub f2_depth: usize,
    /// Counters per row of the F2 estimator, a power of two (default 1024: about 4.4% standard error per row;
    /// 16..=65536).
    pub f2_width: usize,
    /// Keys counted exactly at the node's request (its replicated keys; default 1024). More are ignored.
    pub max_tracked_keys: usize,
}

impl Default for KeyStatsConfig {
    fn default() -> Self {
        KeyStatsConfig {
            enabled: true,
            heavy_hitters: 128,
            distinct_precision: 12,
            f2_depth: 3,
            f2_width: 1024,
            max_tracked_keys: 1024,
        }
    }
}

impl KeyStatsConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_HEAVY_HITTERS).contains(&self.heavy_hitters) {
            return Err(format!(
                "key_stats.heavy_hitters {} is outside 1..={MAX_HEAVY_HITTERS}",
                self.heavy_hitters
            ));
        }
        if !(MIN_PRECISION..=MAX_PRECISION).contains(&self.distinct_precision) {
            return Err(format!(
                "key_stats.distinct_precision {} is outside {MIN_PRECISION}..={MAX_PRECISION}",
                self.distinct_precision
            ));
        }
        if !(1..=MAX_F2_DEPTH).contains(&self.f2_depth) {
            return Err(format!(
                "key_stats.f2_depth {} is outside 1..={MAX_F2_DEPTH}",
                self.f2_depth
            ));
        }
        if !self.f2_width.is_power_of_two() || !(16..=MAX_F2_WIDTH).contains(&self.f2_width) {
            return Err(format!(
                "key_stats.f2_width {} must be a power of two in 16..={MAX_F2_WIDTH}",
                self.f2_width
            ));
        }
        Ok(())
    }
}

const MAX_HEAVY_HITTERS: usize = 1 << 16;
const MIN_PRECISION: u8 = 4;
const MAX_PRECISION: u8 = 18;
const MAX_F2_DEPTH: usize = 16;
const MAX_F2_WIDTH: usize = 1 << 16;
/// Mixed into the key hash so the sketch's bits are independent of the thread and index hashes built on it.
const SKETCH_SEED: u64 = 0x6b65_7973_7461_7473;
/// Offsets of the F2 rows' hash functions.
const ROW_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// The 64-bit hash the sketch works on.
#[inline]
pub fn sketch_hash(key: &[u8]) -> u64 {
    sketch_hash_of(dinomo_log::key_hash(key))
}

/// [`sketch_hash`] of a key whose [`dinomo_log::key_hash`] is `key_hash` (the worker hashes each key once).
#[inline]
pub fn sketch_hash_of(key_hash: u64) -> u64 {
    fmix64(key_hash ^ SKETCH_SEED)
}

/// A map keyed by already well-mixed 64-bit hashes, which it does not hash again.
type HashIndex<V> = nohash_hasher::IntMap<u64, V>;

/// A key and how often it was accessed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCount {
    /// The key.
    pub key: Vec<u8>,
    /// Accesses counted.
    pub count: u64,
}

struct Slot {
    hash: u64,
    count: u64,
    /// The key's bytes, copied the first time the key is counted again while it holds the slot (most candidates
    /// of a spread stream are seen once and never need them).
    key: Vec<u8>,
    has_key: bool,
}

/// One worker's statistics of the current monitoring epoch (the hot-path side; [`KeySketch::take`] turns it into a
/// [`KeyStats`] snapshot and starts the next epoch).
pub struct KeySketch {
    capacity: usize,
    precision: u8,
    depth: usize,
    width: usize,
    max_tracked: usize,
    accesses: u64,
    /// Counters; a count of 0 marks a free slot. A slot keeps its key buffer when freed, so a new candidate does
    /// not allocate.
    slots: Vec<Slot>,
    /// Free slots.
    free: Vec<u32>,
    index: HashIndex<u32>,
    decrements: u64,
    registers: Vec<u8>,
    counters: Vec<i64>,
    /// Bits of the mixed hash each F2 row takes (its bucket and its sign), and rows per 64-bit mix.
    row_bits: u32,
    rows_per_mix: usize,
    tracked: HashIndex<KeyCount>,
}

impl KeySketch {
    /// An empty sketch shaped by `cfg` (which must be valid).
    pub fn new(cfg: &KeyStatsConfig) -> KeySketch {
        let mut index = HashIndex::default();
        index.reserve(cfg.heavy_hitters);
        KeySketch {
            capacity: cfg.heavy_hitters,
            precision: cfg.distinct_precision,
            depth: cfg.f2_depth,
            width: cfg.f2_width,
            max_tracked: cfg.max_tracked_keys,
            accesses: 0,
            slots: Vec::with_capacity(cfg.heavy_hitters),
            free: Vec::with_capacity(cfg.heavy_hitters),
            index,
            decrements: 0,
            registers: vec![0; 1 << cfg.distinct_precision],
            counters: vec![0; cfg.f2_depth * cfg.f2_width],
            row_bits: cfg.f2_width.trailing_zeros() + 1,
            rows_per_mix: (64 / (cfg.f2_width.trailing_zeros() + 1)) as usize,
            tracked: HashIndex::default(),
        }
    }

    /// Counts one access of `key`.
    #[inline]
    pub fn record(&mut self, key: &[u8]) {
        self.record_hashed(sketch_hash(key), key);
    }

    /// Counts one access of `key`, whose [`sketch_hash`] is `h`.
    pub fn record_hashed(&mut self, h: u64, key: &[u8]) {
        self.accesses += 1;
        // Distinct keys: the first `precision` bits pick a register, which keeps the longest run of leading zeros
        // seen in the rest.
        let p = u32::from(self.precision);
        let reg = (h >> (64 - p)) as usize;
        let rank = ((h << p).leading_zeros().min(64 - p) + 1) as u8;
        if self.registers[reg] < rank {
            self.registers[reg] = rank;
        }
        // F2: each row adds ±1 to one counter; the row's bucket and sign are its own slice of bits of a mix of
        // the key's hash (one mix serves several rows).
        let mask = (self.width - 1) as u64;
        let (mut bits, mut left) = (0u64, 0usize);
        for (row, counters) in self.counters.chunks_exact_mut(self.width).enumerate() {
            if left == 0 {
                bits = fmix64(h.wrapping_add(ROW_STEP.wrapping_mul(row as u64 + 1)));
                left = self.rows_per_mix;
            }
            let c = &mut counters[(bits & mask) as usize];
            *c += if bits & (mask + 1) == 0 { 1 } else { -1 };
            bits >>= self.row_bits;
            left -= 1;
        }
        if !self.tracked.is_empty()
            && let Some(t) = self.tracked.get_mut(&h)
        {
            t.count += 1;
        }
        // Heavy hitters (Misra–Gries).
        if let Some(&i) = self.index.get(&h) {
            let slot = &mut self.slots[i as usize];
            slot.count += 1;
            if !slot.has_key {
                slot.key.clear();
                slot.key.extend_from_slice(key);
                slot.has_key = true;
            }
        } else if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            (slot.hash, slot.count, slot.has_key) = (h, 1, false);
            self.index.insert(h, i);
        } else if self.slots.len() < self.capacity {
            self.index.insert(h, self.slots.len() as u32);
            self.slots.push(Slot {
                hash: h,
                count: 1,
                key: Vec::new(),
                has_key: false,
            });
        } else {
            self.decrement_all();
        }
    }

    /// The Misra–Gries step for an untracked key arriving at a full summary: every counter (and the arrival) loses
    /// one; counters that reach zero free their slots.
    fn decrement_all(&mut self) {
        self.decrements += 1;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.count == 0 {
                continue;
            }
            slot.count -= 1;
            if slot.count == 0 {
                self.index.remove(&slot.hash);
                self.free.push(i as u32);
            }
        }
    }

    /// Counts `keys` exactly from now on (at most `max_tracked_keys` of them), instead of the keys tracked before.
    /// Keys tracked before and still named keep their counts.
    pub fn track(&mut self, keys: &[Vec<u8>]) {
        let mut next = HashIndex::default();
        for key in keys.iter().take(self.max_tracked) {
            let h = sketch_hash(key);
            let count = self.tracked.get(&h).map_or(0, |t| t.count);
            next.insert(
                h,
                KeyCount {
                    key: key.clone(),
                    count,
                },
            );
        }
        self.tracked = next;
    }

    /// Accesses counted this epoch.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Heap bytes the sketch holds (bounded by its settings and the longest keys seen).
    pub fn heap_bytes(&self) -> usize {
        let keys: usize = self.slots.iter().map(|s| s.key.capacity()).sum::<usize>()
            + self
                .tracked
                .values()
                .map(|t| t.key.capacity())
                .sum::<usize>();
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.free.capacity() * 4
            + self.registers.capacity()
            + self.counters.capacity() * 8
            + self.tracked.capacity() * (std::mem::size_of::<(u64, KeyCount)>() + 1)
            + keys
    }

    /// The statistics of the epoch that ends now; the sketch starts the next one empty (tracked keys stay tracked,
    /// at zero).
    pub fn take(&mut self) -> KeyStats {
        let mut heavy: Vec<KeyCount> = self
            .slots
            .iter()
            .filter(|s| s.count > 0 && s.has_key)
            .map(|s| KeyCount {
                key: s.key.clone(),
                count: s.count,
            })
            .collect();
        // Candidates counted once hold no key bytes and are left out: each was accessed at most once more than the
        // decrements, which the error then covers.
        let unlisted = self.slots.iter().any(|s| s.count > 0 && !s.has_key);
        sort_by_count(&mut heavy);
        let mut tracked: Vec<KeyCount> = self
            .tracked
            .values_mut()
            .map(|t| KeyCount {
                key: t.key.clone(),
                count: std::mem::take(&mut t.count),
            })
            .collect();
        tracked.sort_by(|a, b| a.key.cmp(&b.key));
        let stats = KeyStats {
            accesses: self.accesses,
            heavy_hitters: heavy,
            heavy_hitter_error: self.decrements + u64::from(unlisted),
            heavy_hitter_capacity: self.capacity as u32,
            distinct_precision: self.precision,
            registers: self.registers.clone(),
            f2_depth: self.depth as u32,
            f2_width: self.width as u32,
            f2_counters: self.counters.clone(),
            tracked,
        };
        self.accesses = 0;
        self.decrements = 0;
        self.index.clear();
        self.free.clear();
        for (i, slot) in self.slots.iter_mut().enumerate().rev() {
            slot.count = 0;
            self.free.push(i as u32);
        }
        self.registers.fill(0);
        self.counters.fill(0);
        stats
    }
}

/// Orders by count, highest first (ties by key, so results do not depend on hash order).
fn sort_by_count(v: &mut [KeyCount]) {
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
}

/// Why two [`KeyStats`] cannot be combined, or one received from the network is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyStatsError {
    /// The sketches were made with different settings.
    #[error("key statistics of different shapes: {0}")]
    Shape(String),
    /// A field is inconsistent.
    #[error("malformed key statistics: {0}")]
    Malformed(String),
}

/// The key-access statistics of one monitoring epoch: of one worker, or merged over workers and nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyStats {
    /// Accesses counted.
    pub accesses: u64,
    /// The heavy-hitter candidates, highest count first. A listed count is at most `heavy_hitter_error` below the
    /// key's true count; an unlisted key was accessed at most `heavy_hitter_error` times.
    pub heavy_hitters: Vec<KeyCount>,
    /// The most any key's count may be under-reported by.
    pub heavy_hitter_error: u64,
    /// Counters of the heavy-hitter summary.
    pub heavy_hitter_capacity: u32,
    /// log2 of the number of distinct-key registers.
    pub distinct_precision: u8,
    /// The distinct-key estimator's registers.
    pub registers: Vec<u8>,
    /// Rows of the F2 estimator.
    pub f2_depth: u32,
    /// Counters per row of the F2 estimator.
    pub f2_width: u32,
    /// The F2 estimator's counters, row after row.
    pub f2_counters: Vec<i64>,
    /// Exact counts of the tracked keys, in key order.
    pub tracked: Vec<KeyCount>,
}

impl KeyStats {
    /// Statistics of no accesses, shaped by `cfg`.
    pub fn empty(cfg: &KeyStatsConfig) -> KeyStats {
        KeySketch::new(cfg).take()
    }

    /// Checks that the fields fit together (for statistics received from the network).
    pub fn validate(&self) -> Result<(), KeyStatsError> {
        let bad = |s: String| Err(KeyStatsError::Malformed(s));
        let p = self.distinct_precision;
        if !(MIN_PRECISION..=MAX_PRECISION).contains(&p) || self.registers.len() != 1 << p {
            return bad(format!(
                "{} registers at precision {p}",
                self.registers.len()
            ));
        }
        let top = 64 - u32::from(p) + 1;
        if self.registers.iter().any(|&r| u32::from(r) > top) {
            return bad("a register beyond the hash width".into());
        }
        let (d, w) = (self.f2_depth as usize, self.f2_width as usize);
        if !(1..=MAX_F2_DEPTH).contains(&d)
            || !w.is_power_of_two()
            || w > MAX_F2_WIDTH
            || self.f2_counters.len() != d * w
        {
            return bad(format!(
                "{} F2 counters for {d} rows of {w}",
                self.f2_counters.len()
            ));
        }
        let cap = self.heavy_hitter_capacity as usize;
        if !(1..=MAX_HEAVY_HITTERS).contains(&cap) || self.heavy_hitters.len() > cap {
            return bad(format!(
                "{} heavy hitters for {cap} counters",
                self.heavy_hitters.len()
            ));
        }
        Ok(())
    }

    /// Adds `other`'s accesses to these (the statistics of both streams together). Heavy hitters merge as
    /// mergeable Misra–Gries summaries (counts added, then lowered by the (capacity+1)-th largest), distinct-key
    /// registers by maximum, F2 counters by sum, tracked keys by sum.
    pub fn merge(&mut self, other: &KeyStats) -> Result<(), KeyStatsError> {
        other.validate()?;
        if (
            self.distinct_precision,
            self.f2_depth,
            self.f2_width,
            self.heavy_hitter_capacity,
        ) != (
            other.distinct_precision,
            other.f2_depth,
            other.f2_width,
            other.heavy_hitter_capacity,
        ) {
            return Err(KeyStatsError::Shape(format!(
                "precision {} / {}, F2 {}x{} / {}x{}, heavy hitters {} / {}",
                self.distinct_precision,
                other.distinct_precision,
                self.f2_depth,
                self.f2_width,
                other.f2_depth,
                other.f2_width,
                self.heavy_hitter_capacity,
                other.heavy_hitter_capacity
            )));
        }
        self.accesses = self.accesses.saturating_add(other.accesses);
        for (a, &b) in self.registers.iter_mut().zip(&other.registers) {
            *a = (*a).max(b);
        }
        for (a, &b) in self.f2_counters.iter_mut().zip(&other.f2_counters) {
            *a = a.saturating_add(b);
        }
        let mut combined: BTreeMap<&[u8], u64> = BTreeMap::new();
        for kc in self.heavy_hitters.iter().chain(&other.heavy_hitters) {
            let c = combined.entry(&kc.key).or_default();
            *c = c.saturating_add(kc.count);
        }
        let mut heavy: Vec<KeyCount> = combined
            .into_iter()
            .map(|(key, count)| KeyCount {
                key: key.to_vec(),
                count,
            })
            .collect();
        sort_by_count(&mut heavy);
        let mut error = self
            .heavy_hitter_error
            .saturating_add(other.heavy_hitter_error);
        let cap = self.heavy_hitter_capacity as usize;
        if heavy.len() > cap {
            let cut = heavy[cap].count;
            heavy.truncate(cap);
            heavy.retain_mut(|kc| {
                kc.count -= cut;
                kc.count > 0
            });
            error = error.saturating_add(cut);
        }
        self.heavy_hitters = heavy;
        self.heavy_hitter_error = error;
        let mut tracked: BTreeMap<Vec<u8>, u64> = self
            .tracked
            .drain(..)
            .map(|kc| (kc.key, kc.count))
            .collect();
        for kc in &other.tracked {
            let c = tracked.entry(kc.key.clone()).or_default();
            *c = c.saturating_add(kc.count);
        }
        self.tracked = tracked
            .into_iter()
            .map(|(key, count)| KeyCount { key, count })
            .collect();
        Ok(())
    }

    /// Estimated number of distinct keys accessed (HyperLogLog, with linear counting for small numbers).
    pub fn distinct(&self) -> f64 {
        let m = self.registers.len() as f64;
        if m == 0.0 {
            return 0.0;
        }
        let alpha = match self.registers.len() {
            16 => 0.673,
            32 => 0.697,
            64 => 0.709,
            _ => 0.7213 / (1.0 + 1.079 / m),
        };
        let (sum, zeros) = self.registers.iter().fold((0.0f64, 0usize), |(s, z), &r| {
            (s + (-f64::from(r)).exp2(), z + usize::from(r == 0))
        });
        let raw = alpha * m * m / sum;
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }

    /// Estimated second frequency moment (Σ over keys of count²): the median of the rows' sums of squares.
    pub fn f2(&self) -> f64 {
        let w = self.f2_width as usize;
        if w == 0 || self.f2_counters.is_empty() {
            return 0.0;
        }
        let mut rows: Vec<f64> = self
            .f2_counters
            .chunks(w)
            .map(|row| row.iter().map(|&c| (c as f64) * (c as f64)).sum())
            .collect();
        rows.sort_by(f64::total_cmp);
        let n = rows.len();
        if n % 2 == 1 {
            rows[n / 2]
        } else {
            (rows[n / 2 - 1] + rows[n / 2]) / 2.0
        }
    }

    /// What the policy engine needs: counts and the moments of the access frequency.
    pub fn frequency(&self) -> KeyFrequency {
        KeyFrequency {
            accesses: self.accesses,
            distinct: self.distinct(),
            f2: self.f2(),
            heavy_hitters: self.heavy_hitters.clone(),
            heavy_hitter_error: self.heavy_hitter_error,
            tracked: self.tracked.clone(),
        }
    }
}

/// The access frequency of keys over one period: the estimates the policy's hotness and coldness bounds are made
/// of.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyFrequency {
    /// Accesses in the period.
    pub accesses: u64,
    /// Estimated distinct keys accessed.
    pub distinct: f64,
    /// Estimated Σ count².
    pub f2: f64,
    /// The most accessed keys (lower bounds of their counts), highest first.
    pub heavy_hitters: Vec<KeyCount>,
    /// The most a count may be under-reported by; an unlisted key was accessed at most this often.
    pub heavy_hitter_error: u64,
    /// Exact counts of the tracked (replicated) keys.
    pub tracked: Vec<KeyCount>,
}

impl KeyFrequency {
    /// Mean accesses per distinct key accessed (N / D).
    pub fn mean(&self) -> f64 {
        if self.distinct < 1.0 {
            return self.accesses as f64;
        }
        self.accesses as f64 / self.distinct
    }

    /// Standard deviation of the accesses per distinct key: √(F2 / D − mean²), 0 when the estimates put it below.
    pub fn stddev(&self) -> f64 {
        if self.distinct < 1.0 {
            return 0.0;
        }
        let mean = self.mean();
        (self.f2 / self.distinct - mean * mean).max(0.0).sqrt()
    }

    /// The most accesses `key` may have had: exact if tracked, else its listed count plus the error, else the error.
    pub fn upper_bound(&self, key: &[u8]) -> u64 {
        if let Some(t) = self.tracked.iter().find(|t| t.key == key) {
            return t.count;
        }
        self.heavy_hitters
            .iter()
            .find(|h| h.key == key)
            .map_or(0, |h| h.count)
            .saturating_add(self.heavy_hitter_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};
    use std::collections::HashMap;

    fn key(i: u64) -> Vec<u8> {
        format!("key-{i}").into_bytes()
    }

    /// A seeded Zipf(`theta`) stream of `len` ranks over `n` keys (rank 0 hottest), by inverse CDF.
    fn zipf_stream(n: usize, theta: f64, len: usize, seed: u64) -> Vec<u64> {
        let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(theta)).collect();
        let total: f64 = weights.iter().sum();
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for w in weights {
            acc += w / total;
            cdf.push(acc);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        (0..len)
            .map(|_| {
                let u: f64 = rng.random();
                cdf.partition_point(|&c| c < u).min(n - 1) as u64
            })
            .collect()
    }

    fn exact(stream: &[u64]) -> HashMap<u64, u64> {
        let mut m = HashMap::new();
        for &k in stream {
            *m.entry(k).or_default() += 1;
        }
        m
    }

    fn sketch_of(stream: &[u64], cfg: &KeyStatsConfig) -> KeyStats {
        let mut s = KeySketch::new(cfg);
        for &k in stream {
            s.record(&key(k));
        }
        s.take()
    }

    #[test]
    fn estimates_on_zipf_streams_are_within_their_error_bounds() {
        let cfg = KeyStatsConfig::default();
        for (theta, seed) in [(0.5, 1), (0.99, 2), (1.5, 3)] {
            let stream = zipf_stream(20_000, theta, 200_000, seed);
            let truth = exact(&stream);
            let stats = sketch_of(&stream, &cfg);
            stats.validate().unwrap();
            assert_eq!(stats.accesses, stream.len() as u64);
            // Distinct keys: HyperLogLog with 4096 registers has a standard error of 1.6%; allow 4 of them.
            let d = truth.len() as f64;
            let rel = (stats.distinct() - d).abs() / d;
            assert!(
                rel < 0.065,
                "theta {theta}: distinct {} vs {d}",
                stats.distinct()
            );
            // F2: the median of 3 rows of 1024 counters; allow 25% (over 5 standard errors of one row).
            let f2: f64 = truth.values().map(|&c| (c * c) as f64).sum();
            let rel = (stats.f2() - f2).abs() / f2;
            assert!(rel < 0.25, "theta {theta}: F2 {} vs {f2}", stats.f2());
            // Heavy hitters: every key above N/(k+1) + 1 is listed, and no count is over or more than the error
            // under.
            let bound = stream.len() as u64 / (cfg.heavy_hitters as u64 + 1) + 1;
            assert!(stats.heavy_hitter_error <= bound);
            for (k, &c) in &truth {
                let listed = stats.heavy_hitters.iter().find(|h| h.key == key(*k));
                match listed {
                    Some(h) => {
                        assert!(h.count <= c && c - h.count <= stats.heavy_hitter_error);
                    }
                    None => assert!(
                        c <= stats.heavy_hitter_error,
                        "theta {theta}: key {k} with {c} accesses is missing"
                    ),
                }
            }
            // The mean and σ built from them are close to the exact ones.
            let f = stats.frequency();
            let mean = stream.len() as f64 / d;
            let sd = (f2 / d - mean * mean).sqrt();
            assert!(
                (f.mean() - mean).abs() / mean < 0.07,
                "mean {} vs {mean}",
                f.mean()
            );
            assert!(
                (f.stddev() - sd).abs() / sd < 0.2,
                "sd {} vs {sd}",
                f.stddev()
            );
        }
    }

    #[test]
    fn the_hottest_keys_of_a_skewed_stream_stand_above_mean_plus_three_sigma() {
        let stream = zipf_stream(10_000, 1.2, 100_000, 7);
        let f = sketch_of(&stream, &KeyStatsConfig::default()).frequency();
        let bound = f.mean() + 3.0 * f.stddev();
        let hot: Vec<&KeyCount> = f
            .heavy_hitters
            .iter()
            .filter(|h| h.count as f64 > bound)
            .collect();
        assert!(!hot.is_empty() && hot.len() < 50, "{} hot keys", hot.len());
        assert_eq!(hot[0].key, key(0), "rank 0 is the hottest");
    }

    #[test]
    fn memory_stays_bounded_however_many_keys_pass() {
        let cfg = KeyStatsConfig::default();
        let mut s = KeySketch::new(&cfg);
        let mut most = 0;
        for i in 0..300_000u64 {
            s.record(&key(i));
            if i % 10_000 == 0 {
                most = most.max(s.heap_bytes());
            }
        }
        most = most.max(s.heap_bytes());
        // 4 KiB of registers, 24 KiB of F2 counters, and 128 counters with short keys.
        assert!(most < 64 << 10, "{most} bytes");
        assert!(s.slots.len() <= cfg.heavy_hitters);
        let stats = s.take();
        assert!(stats.heavy_hitters.len() <= cfg.heavy_hitters);
        assert_eq!(s.accesses(), 0, "a new epoch starts empty");
    }

    #[test]
    fn merged_statistics_match_those_of_the_whole_stream() {
        let cfg = KeyStatsConfig::default();
        let stream = zipf_stream(5_000, 0.99, 60_000, 11);
        // Split the keys as ownership does: each part sees only its keys.
        let (a, b): (Vec<u64>, Vec<u64>) = stream.iter().partition(|&&k| k % 3 == 0);
        let whole = sketch_of(&stream, &cfg);
        let mut merged = sketch_of(&a, &cfg);
        merged.merge(&sketch_of(&b, &cfg)).unwrap();
        assert_eq!(merged.accesses, whole.accesses);
        assert_eq!(
            merged.registers, whole.registers,
            "HyperLogLog merges exactly"
        );
        assert_eq!(
            merged.f2_counters, whole.f2_counters,
            "F2 counters merge exactly"
        );
        let truth = exact(&stream);
        for (k, &c) in &truth {
            let listed = merged.heavy_hitters.iter().find(|h| h.key == key(*k));
            let est = listed.map_or(0, |h| h.count);
            assert!(est <= c && c - est <= merged.heavy_hitter_error, "key {k}");
        }
        assert!(
            merged.heavy_hitter_error <= stream.len() as u64 / (cfg.heavy_hitters as u64 + 1) + 2
        );
        // Different shapes are refused.
        let other = KeyStats::empty(&KeyStatsConfig {
            f2_width: 512,
            ..cfg.clone()
        });
        assert!(matches!(merged.merge(&other), Err(KeyStatsError::Shape(_))));
    }

    #[test]
    fn tracked_keys_are_counted_exactly_and_survive_epochs() {
        let mut s = KeySketch::new(&KeyStatsConfig::default());
        s.track(&[key(1), key(2)]);
        for i in 0..10_000u64 {
            s.record(&key(i % 1000));
        }
        let stats = s.take();
        assert_eq!(
            stats.tracked,
            vec![
                KeyCount {
                    key: key(1),
                    count: 10
                },
                KeyCount {
                    key: key(2),
                    count: 10
                }
            ]
        );
        let f = stats.frequency();
        assert_eq!(f.upper_bound(&key(1)), 10);
        // Next epoch: still tracked, from zero.
        s.record(&key(2));
        let stats = s.take();
        assert_eq!(stats.tracked[0].count, 0);
        assert_eq!(stats.tracked[1].count, 1);
    }

    #[test]
    fn malformed_statistics_are_refused() {
        let good = KeyStats::empty(&KeyStatsConfig::default());
        let mut bad = good.clone();
        bad.registers.pop();
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.registers[0] = 200;
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.f2_width = 3;
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.heavy_hitter_capacity = 0;
        assert!(bad.validate().is_err());
        let mut acc = good.clone();
        assert!(acc.merge(&bad).is_err());
        assert!(
            KeyStatsConfig {
                f2_width: 100,
                ..KeyStatsConfig::default()
            }
            .validate()
            .is_err()
        );
    }

    proptest! {
        #[test]
        fn misra_gries_never_overcounts_and_undercounts_at_most_the_error(
            keys in proptest::collection::vec(0u64..40, 0..2000),
            capacity in 1usize..12,
        ) {
            let cfg = KeyStatsConfig { heavy_hitters: capacity, ..KeyStatsConfig::default() };
            let stats = sketch_of(&keys, &cfg);
            let truth = exact(&keys);
            prop_assert!(stats.heavy_hitters.len() <= capacity);
            prop_assert!(stats.heavy_hitter_error <= keys.len() as u64 / (capacity as u64 + 1) + 1);
            let listed: u64 = stats.heavy_hitters.iter().map(|h| h.count).sum();
            prop_assert!(listed <= keys.len() as u64);
            for (k, &c) in &truth {
                let est = stats.heavy_hitters.iter().find(|h| h.key == key(*k)).map_or(0, |h| h.count);
                prop_assert!(est <= c);
                prop_assert!(c - est <= stats.heavy_hitter_error);
            }
        }

        #[test]
        fn merging_keeps_the_guarantees(
            a in proptest::collection::vec(0u64..30, 0..800),
            b in proptest::collection::vec(0u64..30, 0..800),
            capacity in 1usize..8,
        ) {
            let cfg = KeyStatsConfig { heavy_hitters: capacity, ..KeyStatsConfig::default() };
            let mut m = sketch_of(&a, &cfg);
            m.merge(&sketch_of(&b, &cfg)).unwrap();
            let all: Vec<u64> = a.iter().chain(&b).copied().collect();
            let truth = exact(&all);
            prop_assert!(m.heavy_hitters.len() <= capacity);
            prop_assert!(m.heavy_hitter_error <= all.len() as u64 / (capacity as u64 + 1) + 2);
            for (k, &c) in &truth {
                let est = m.heavy_hitters.iter().find(|h| h.key == key(*k)).map_or(0, |h| h.count);
                prop_assert!(est <= c);
                prop_assert!(c - est <= m.heavy_hitter_error);
            }
        }
    }
}
