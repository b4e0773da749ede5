//! Client latency for the M-node's SLO check: a log-linear histogram every client keeps of its operations'
//! latencies, and the compact, mergeable summary it sends to the node it talks to once per report period.
//!
//! Buckets: values below 16 ns are exact; above, every power of two is cut into 16 equal buckets, so a bucket
//! spans at most 1/16 of its lower bound (quantiles are reported as their bucket's upper bound, at most 6.25%
//! above the true value, and never above the largest value recorded). 976 buckets cover all of `u64`.

use serde::{Deserialize, Serialize};

/// log2 of the buckets per power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets of a histogram.
pub const LATENCY_BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) * SUB as usize;

/// The bucket of `v`.
#[inline]
fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let shift = e - SUB_BITS;
    ((e - SUB_BITS + 1) as u64 * SUB + ((v >> shift) & (SUB - 1))) as usize
}

/// The largest value in bucket `i`.
fn bucket_upper(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let (group, sub) = (i / SUB, i % SUB);
    let shift = (group - 1) as u32;
    ((SUB + sub) << shift) + ((1u64 << shift) - 1)
}

/// Latencies in nanoseconds, in fixed memory.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    counts: Box<[u64]>,
    count: u64,
    sum_ns: u64,
    max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; LATENCY_BUCKETS].into_boxed_slice(),
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> LatencyHistogram {
        LatencyHistogram::default()
    }

    /// Records one latency.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean latency (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.count as f64
    }

    /// The largest latency recorded.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The latency at quantile `q` (0..=1): the upper bound of the bucket holding the ⌈q·count⌉-th smallest
    /// value, capped at the largest value recorded; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_upper(i).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// The compact form sent over the network.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.count,
            sum_ns: self.sum_ns,
            max_ns: self.max_ns,
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, &c)| (i as u16, c))
                .collect(),
        }
    }

    /// Adds the latencies of `s` (checked first: a malformed summary changes nothing).
    pub fn merge(&mut self, s: &LatencySummary) -> Result<(), String> {
        s.validate()?;
        // The buckets always add up to `count`, so a count that fits means every bucket does: merged whole or
        // not at all, the quantiles stay exact.
        self.count = self
            .count
            .checked_add(s.count)
            .ok_or("the latency histogram cannot count that many more values")?;
        for &(i, c) in &s.buckets {
            self.counts[i as usize] += c;
        }
        self.sum_ns = self.sum_ns.saturating_add(s.sum_ns);
        self.max_ns = self.max_ns.max(s.max_ns);
        Ok(())
    }

    /// The sum of the latencies recorded, in nanoseconds (saturating).
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// Latencies of at most `2^k - 1` ns for each `k` of `powers`: exact, because a power of two starts a bucket.
    pub fn counts_below_powers_of_two(
        &self,
        powers: std::ops::RangeInclusive<u32>,
    ) -> Vec<(u64, u64)> {
        powers
            .map(|k| {
                let bound = 1u64.checked_shl(k).map_or(u64::MAX, |p| p - 1);
                let below = bucket_of(bound) + 1;
                (bound, self.counts[..below].iter().sum())
            })
            .collect()
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.count = 0;
        self.sum_ns = 0;
        self.max_ns = 0;
    }
}

/// A histogram's non-empty buckets and totals: what a client reports, and what a node hands the M-node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Latencies.
    pub count: u64,
    /// Their sum in nanoseconds.
    pub sum_ns: u64,
    /// The largest.
    pub max_ns: u64,
    /// (bucket, latencies in it) for every non-empty bucket, in bucket order.
    pub buckets: Vec<(u16, u64)>,
}

impl LatencySummary {
    /// Checks that the buckets exist, come in order, hold something, and add up to `count`, and that `max_ns`
    /// lies in the last bucket.
    pub fn validate(&self) -> Result<(), String> {
        let mut total = 0u64;
        let mut prev: Option<u16> = None;
        for &(i, c) in &self.buckets {
            if i as usize >= LATENCY_BUCKETS {
                return Err(format!("latency bucket {i} does not exist"));
            }
            if prev.is_some_and(|p| p >= i) {
                return Err("latency buckets out of order".into());
            }
            if c == 0 {
                return Err(format!("latency bucket {i} is listed empty"));
            }
            total = total.checked_add(c).ok_or("latency counts overflow")?;
            prev = Some(i);
        }
        if total != self.count {
            return Err(format!(
                "latency buckets hold {total} values, the summary says {}",
                self.count
            ));
        }
        if let Some(last) = prev
            && bucket_of(self.max_ns) != last as usize
        {
            return Err("the largest latency is not in the last bucket".into());
        }
        Ok(())
    }
}

/// The latency of the clients' requests over a period, as the policy sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyObservation {
    /// Requests measured.
    pub requests: u64,
    /// Their mean latency in nanoseconds.
    pub avg_ns: f64,
    /// Their 99th-percentile latency in nanoseconds.
    pub p99_ns: u64,
}

impl From<&LatencyHistogram> for LatencyObservation {
    fn from(h: &LatencyHistogram) -> Self {
        LatencyObservation {
            requests: h.count(),
            avg_ns: h.mean_ns(),
            p99_ns: h.quantile_ns(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_below_powers_of_two_are_exact() {
        let mut h = LatencyHistogram::new();
        for v in [0, 1, 1023, 1024, 1025, 2047, 2048, 1 << 20, u64::MAX] {
            h.record(v);
        }
        let c = h.counts_below_powers_of_two(10..=12);
        assert_eq!(c, vec![(1023, 3), (2047, 6), (4095, 7)]);
        let all = h.counts_below_powers_of_two(64..=64);
        assert_eq!(all, vec![(u64::MAX, 9)]);
    }

    #[test]
    fn buckets_cover_u64_in_order() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(15), 15);
        assert_eq!(bucket_of(16), 16);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(bucket_upper(LATENCY_BUCKETS - 1), u64::MAX);
        for i in 0..LATENCY_BUCKETS - 1 {
            let up = bucket_upper(i);
            assert_eq!(bucket_of(up), i);
            assert_eq!(bucket_of(up + 1), i + 1, "bucket {i}");
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut h = LatencyHistogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 10_000);
        assert!((h.mean_ns() - 5_000_500.0).abs() < 1.0);
        let p99 = h.quantile_ns(0.99);
        assert!((9_900_000..=9_900_000 * 17 / 16).contains(&p99), "{p99}");
        assert_eq!(h.quantile_ns(1.0), 10_000_000);
        assert_eq!(LatencyHistogram::new().quantile_ns(0.99), 0);
    }

    #[test]
    fn malformed_summaries_are_refused_and_change_nothing() {
        let mut h = LatencyHistogram::new();
        h.record(100);
        let good = h.summary();
        for bad in [
            LatencySummary {
                count: 2,
                ..good.clone()
            },
            LatencySummary {
                buckets: vec![(u16::MAX, 1)],
                ..good.clone()
            },
            LatencySummary {
                count: 2,
                buckets: vec![(90, 1), (80, 1)],
                ..good.clone()
            },
            LatencySummary {
                max_ns: 1 << 40,
                ..good.clone()
            },
        ] {
            let mut acc = LatencyHistogram::new();
            assert!(acc.merge(&bad).is_err(), "{bad:?}");
            assert_eq!(acc.count(), 0);
        }
    }

    #[test]
    fn a_merge_that_would_overflow_the_counts_is_refused_whole() {
        // Two summaries, each valid, whose counts together exceed u64: the second must change nothing, so that the
        // buckets still add up to the count and every quantile stays computable.
        let first = LatencySummary {
            count: 1 << 63,
            sum_ns: 0,
            max_ns: 0,
            buckets: vec![(0, 1 << 63)],
        };
        let second = LatencySummary {
            count: u64::MAX,
            sum_ns: u64::MAX,
            max_ns: 1,
            buckets: vec![(bucket_of(1) as u16, u64::MAX)],
        };
        let mut h = LatencyHistogram::new();
        h.merge(&first).unwrap();
        assert!(h.merge(&second).is_err());
        assert_eq!(h.count(), 1 << 63);
        assert_eq!(h.quantile_ns(0.99), 0);
        assert_eq!(
            h.counts_below_powers_of_two(0..=1),
            vec![(0, 1 << 63), (1, 1 << 63)]
        );
    }

    proptest! {
        #[test]
        fn merged_summaries_equal_one_histogram_of_everything(
            a in proptest::collection::vec(any::<u64>(), 0..200),
            b in proptest::collection::vec(0u64..100_000_000, 0..200),
            q in 0.0f64..=1.0,
        ) {
            let (mut ha, mut hb, mut all) = (LatencyHistogram::new(), LatencyHistogram::new(), LatencyHistogram::new());
            for &v in &a { ha.record(v); all.record(v); }
            for &v in &b { hb.record(v); all.record(v); }
            let mut merged = LatencyHistogram::new();
            merged.merge(&ha.summary()).unwrap();
            merged.merge(&hb.summary()).unwrap();
            prop_assert_eq!(merged.summary(), all.summary());
            // The quantile is within one bucket above the exact order statistic.
            let mut sorted: Vec<u64> = a.iter().chain(&b).copied().collect();
            sorted.sort_unstable();
            if !sorted.is_empty() {
                let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
                let exact = sorted[rank - 1];
                let got = merged.quantile_ns(q);
                prop_assert!(got >= exact);
                prop_assert!(got <= bucket_upper(bucket_of(exact)));
            }
        }
    }
}
