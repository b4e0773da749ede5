//! Request distributions: which existing record an operation targets.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::YcsbError;
use super::zipf::{SCRAMBLED_ITEM_COUNT, YCSB_ZIPFIAN_CONSTANT, ZipfSampler, fnv64, grow_index};

/// How an operation picks the existing record it targets, over the records present when it is generated.
///
/// The records are numbered 0..n, n growing with every insert; a distribution picks an index in [0, n).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Distribution {
    /// Every record equally likely. (YCSB's `uniform` draws only among the records loaded before the run; this
    /// draws among all present, inserted ones included.)
    Uniform,
    /// YCSB's `ZipfianGenerator`: record i with probability ∝ 1/(i+1)^θ, record 0 the most popular.
    ///
    /// θ < 1 uses Gray et al.'s algorithm as YCSB does (exact for records 0 and 1; its closed form gives the next
    /// few records a little too much, record 2 about 18% at θ = 0.99), with ζ(n, θ) computed once and extended as
    /// records are inserted. θ ≥ 1, where Gray's algorithm does not hold (α = 1/(1−θ) is infinite at 1, and at
    /// θ = 2 over 1000 records it gives record 2 about 18% too much and the records past it 7% too little), uses
    /// exact rejection-inversion sampling instead.
    Zipfian {
        /// The skew, finite and positive: 0.5 low, 0.99 YCSB's default, 2 high.
        theta: f64,
    },
    /// YCSB's `ScrambledZipfianGenerator`, which is what YCSB's `requestdistribution=zipfian` really instantiates:
    /// a Zipfian draw of skew θ over 10^10 items, FNV-64-hashed modulo the record count, so the popular records
    /// are spread over the key space. While nothing is inserted the record is exactly YCSB's
    /// `fnvhash64(rank) % n`; inserts extend the mapping consistently (each new record takes over an equal share of
    /// the hashed ranks, the others keep theirs), so the popular records stay popular as the store grows.
    ScrambledZipfian {
        /// The skew of the underlying Zipfian draw, finite and positive.
        theta: f64,
    },
    /// YCSB's `SkewedLatestGenerator`: a Zipfian draw (θ = 0.99) of the distance back from the newest record, so
    /// the newest is the most popular and new inserts take over at once. (YCSB's version never picks record 0;
    /// this one does, with the probability its distance gives it.)
    Latest,
}

impl Distribution {
    /// Checks that θ is finite and positive.
    pub fn validate(&self) -> Result<(), YcsbError> {
        match *self {
            Distribution::Zipfian { theta } | Distribution::ScrambledZipfian { theta }
                if !(theta.is_finite() && theta > 0.0) =>
            {
                Err(YcsbError::BadTheta(theta))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Distribution {
    /// "uniform", "zipf:θ", "scrambled-zipf:θ" or "latest".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Zipfian { theta } => write!(f, "zipf:{theta}"),
            Distribution::ScrambledZipfian { theta } => write!(f, "scrambled-zipf:{theta}"),
            Distribution::Latest => f.write_str("latest"),
        }
    }
}

impl FromStr for Distribution {
    type Err = YcsbError;

    /// Parses "uniform", "zipf:θ" (also "zipfian:θ"), "scrambled-zipf:θ" (also "scrambled-zipfian:θ") or "latest",
    /// ignoring case; θ defaults to 0.99 when left out ("zipf").
    fn from_str(s: &str) -> Result<Distribution, YcsbError> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, theta) = match lower.split_once(':') {
            Some((name, theta)) => {
                let theta: f64 = theta
                    .trim()
                    .parse()
                    .map_err(|_| YcsbError::UnknownDistribution(format!("bad θ in {s:?}")))?;
                (name.trim(), Some(theta))
            }
            None => (lower.as_str(), None),
        };
        let zipf_theta = theta.unwrap_or(YCSB_ZIPFIAN_CONSTANT);
        let d = match name {
            "uniform" if theta.is_none() => Distribution::Uniform,
            "latest" if theta.is_none() => Distribution::Latest,
            "zipf" | "zipfian" => Distribution::Zipfian { theta: zipf_theta },
            "scrambled-zipf" | "scrambled-zipfian" | "scrambled_zipf" | "scrambledzipfian" => {
                Distribution::ScrambledZipfian { theta: zipf_theta }
            }
            _ => {
                return Err(YcsbError::UnknownDistribution(format!(
                    "{s:?} (expected uniform, zipf:θ, scrambled-zipf:θ or latest)"
                )));
            }
        };
        d.validate()?;
        Ok(d)
    }
}

impl TryFrom<String> for Distribution {
    type Error = YcsbError;

    fn try_from(s: String) -> Result<Distribution, YcsbError> {
        s.parse()
    }
}

impl From<Distribution> for String {
    fn from(d: Distribution) -> String {
        d.to_string()
    }
}

/// The state behind a [`Distribution`]: picks an index in [0, count) for a count that only grows.
#[derive(Debug, Clone)]
pub(crate) enum KeyChooser {
    Uniform,
    Zipfian(ZipfSampler),
    Scrambled {
        /// Zipfian over [`SCRAMBLED_ITEM_COUNT`] ranks.
        ranks: ZipfSampler,
        /// The count the hashed ranks were first spread over.
        initial: u64,
    },
    Latest(ZipfSampler),
}

impl KeyChooser {
    /// The chooser of a validated `distribution`, starting with `count` records (at least 1).
    pub(crate) fn new(distribution: Distribution, count: u64) -> KeyChooser {
        let count = count.max(1);
        match distribution {
            Distribution::Uniform => KeyChooser::Uniform,
            Distribution::Zipfian { theta } => KeyChooser::Zipfian(ZipfSampler::new(count, theta)),
            Distribution::ScrambledZipfian { theta } => KeyChooser::Scrambled {
                ranks: ZipfSampler::new(SCRAMBLED_ITEM_COUNT, theta),
                initial: count,
            },
            Distribution::Latest => {
                KeyChooser::Latest(ZipfSampler::new(count, YCSB_ZIPFIAN_CONSTANT))
            }
        }
    }

    /// An index in [0, count); `count` must be at least 1 and never below the count of an earlier call (or of
    /// [`KeyChooser::new`]).
    pub(crate) fn choose<R: Rng + ?Sized>(&mut self, rng: &mut R, count: u64) -> u64 {
        let count = count.max(1);
        match self {
            KeyChooser::Uniform => rng.random_range(0..count),
            KeyChooser::Zipfian(z) => z.sample(rng, count),
            KeyChooser::Scrambled { ranks, initial } => {
                let rank = ranks.sample(rng, SCRAMBLED_ITEM_COUNT);
                grow_index(fnv64(rank), *initial, count.max(*initial))
            }
            KeyChooser::Latest(z) => count - 1 - z.sample(rng, count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::zipf::tests::{
        chi_square, chi_square_critical, five_sigma, gray_probability, zipf_probability,
    };
    use super::super::zipf::zeta;
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const DRAWS: u64 = 200_000;

    fn histogram(d: Distribution, n: u64, seed: u64) -> Vec<u64> {
        let mut chooser = KeyChooser::new(d, n);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..DRAWS {
            let i = chooser.choose(&mut rng, n);
            assert!(i < n, "{d}: {i} outside [0, {n})");
            counts[i as usize] += 1;
        }
        counts
    }

    fn most_frequent(counts: &[u64]) -> usize {
        counts
            .iter()
            .enumerate()
            .max_by_key(|&(_, c)| c)
            .map(|(i, _)| i)
            .unwrap()
    }

    #[test]
    fn names_parse_and_print() {
        let cases = [
            ("uniform", Distribution::Uniform),
            ("zipf:0.99", Distribution::Zipfian { theta: 0.99 }),
            ("zipf:0.5", Distribution::Zipfian { theta: 0.5 }),
            ("zipf:2", Distribution::Zipfian { theta: 2.0 }),
            (
                "scrambled-zipf:0.99",
                Distribution::ScrambledZipfian { theta: 0.99 },
            ),
            ("latest", Distribution::Latest),
        ];
        for (s, d) in cases {
            assert_eq!(s.parse::<Distribution>().unwrap(), d, "{s}");
            assert_eq!(d.to_string().parse::<Distribution>().unwrap(), d);
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(serde_json::from_str::<Distribution>(&json).unwrap(), d);
        }
        assert_eq!(
            "zipf".parse::<Distribution>().unwrap(),
            Distribution::Zipfian { theta: 0.99 }
        );
        assert_eq!(
            "Scrambled-Zipfian".parse::<Distribution>().unwrap(),
            Distribution::ScrambledZipfian { theta: 0.99 }
        );
        for bad in [
            "",
            "zipf:",
            "zipf:0",
            "zipf:-1",
            "zipf:nan",
            "zipf:inf",
            "uniform:1",
            "latest:0.5",
            "hotspot",
        ] {
            assert!(bad.parse::<Distribution>().is_err(), "{bad:?}");
        }
        assert!(
            Distribution::Zipfian { theta: f64::NAN }
                .validate()
                .is_err()
        );
    }

    #[test]
    fn uniform_passes_chi_square() {
        let n = 1000u64;
        let counts = histogram(Distribution::Uniform, n, 21);
        let expected = vec![1.0 / n as f64; n as usize];
        let (stat, df) = chi_square(&counts, &expected, DRAWS);
        assert_eq!(df, 999.0);
        assert!(stat < chi_square_critical(df), "χ² {stat} with {df} df");
        // And is not suspiciously regular either (lower 10^-4 tail of χ²(999) is above 840).
        assert!(stat > 840.0, "χ² {stat}");
    }

    #[test]
    fn zipfian_top_ranks_follow_the_law() {
        let n = 1000u64;
        for (theta, seed) in [(0.99, 22u64), (0.5, 23), (2.0, 24)] {
            let counts = histogram(Distribution::Zipfian { theta }, n, seed);
            assert_eq!(most_frequent(&counts), 0, "θ {theta}");
            for k in 0..8u64 {
                // Gray's algorithm for θ < 1 (exact for the first two), the exact law above.
                let p = if theta < 1.0 {
                    gray_probability(k, n, theta)
                } else {
                    zipf_probability(k, n, theta)
                };
                let f = counts[k as usize] as f64 / DRAWS as f64;
                assert!(
                    (f - p).abs() < five_sigma(p, DRAWS),
                    "θ {theta} rank {k}: {f} vs {p}"
                );
                let law = ((k + 1) as f64).powf(-theta) / zeta(n, theta);
                assert!(
                    (f / law - 1.0).abs() < 0.25,
                    "θ {theta} rank {k}: {f} vs {law}"
                );
            }
            // Non-increasing on the whole within noise: each decade of ranks gets less than the one before.
            let decade =
                |a: usize, b: usize| counts[a..b].iter().sum::<u64>() as f64 / (b - a) as f64;
            assert!(decade(0, 10) > decade(10, 100) && decade(10, 100) > decade(100, 1000));
        }
    }

    #[test]
    fn scrambled_zipfian_spreads_the_hot_ranks_by_fnv() {
        let n = 1000u64;
        let theta = 0.99;
        let counts = histogram(Distribution::ScrambledZipfian { theta }, n, 25);
        // The law: each record gets the ranks that hash to it. Ranks below TOP exactly (Gray's probabilities for
        // the first three, whose error matters), the rest — half the mass, spread over ~10^7 ranks per record —
        // evenly.
        const TOP: u64 = 200_000;
        let z = zeta(SCRAMBLED_ITEM_COUNT, theta);
        let mut expected = vec![0.0f64; n as usize];
        let mut top_mass = 0.0;
        for rank in 0..TOP {
            let p = if rank < 3 {
                gray_probability(rank, SCRAMBLED_ITEM_COUNT, theta)
            } else {
                ((rank + 1) as f64).powf(-theta) / z
            };
            expected[(fnv64(rank) % n) as usize] += p;
            top_mass += p;
        }
        for e in &mut expected {
            *e += (1.0 - top_mass) / n as f64;
        }
        let hottest = (fnv64(0) % n) as usize;
        assert_eq!(most_frequent(&counts), hottest);
        assert_ne!(hottest, 0, "the hot record is not record 0");
        let mut by_expectation: Vec<usize> = (0..n as usize).collect();
        by_expectation.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]));
        for &i in &by_expectation[..5] {
            let f = counts[i] as f64 / DRAWS as f64;
            let p = expected[i];
            // 5σ of sampling plus 3% of model error (the even spread of the tail, Gray's error past rank 2).
            assert!(
                (f - p).abs() < five_sigma(p, DRAWS) + 0.03 * p,
                "record {i}: {f} vs {p}"
            );
        }
        // Far flatter than a plain Zipfian over n: the hottest record holds rank 0 and a thousandth of the rest.
        let f0 = counts[hottest] as f64 / DRAWS as f64;
        assert!(f0 < 0.06 && f0 > 1.0 / z, "{f0}");
    }

    #[test]
    fn scrambled_zipfian_keeps_its_hot_records_as_records_are_inserted() {
        let theta = 0.99;
        let (initial, grown) = (1000u64, 1500u64);
        let mut chooser = KeyChooser::new(Distribution::ScrambledZipfian { theta }, initial);
        let mut rng = StdRng::seed_from_u64(26);
        // One draw per insert up to `grown`, then draws at `grown`.
        for count in initial..grown {
            assert!(chooser.choose(&mut rng, count) < count);
        }
        let mut counts = vec![0u64; grown as usize];
        for _ in 0..DRAWS {
            let i = chooser.choose(&mut rng, grown);
            assert!(i < grown);
            counts[i as usize] += 1;
        }
        // Rank 0 stays on its record unless the growth moved it (probability 1/3), then it sits on a new record.
        let hottest = grow_index(fnv64(0), initial, grown) as usize;
        assert_eq!(most_frequent(&counts), hottest);
        // New records get their share: about a third of the draws away from the hot ranks land on them.
        let new_share = counts[initial as usize..].iter().sum::<u64>() as f64 / DRAWS as f64;
        assert!((0.15..0.5).contains(&new_share), "{new_share}");
    }

    #[test]
    fn latest_favours_the_newest_record() {
        let n = 1000u64;
        let counts = histogram(Distribution::Latest, n, 27);
        assert_eq!(most_frequent(&counts), (n - 1) as usize);
        for distance in 0..5u64 {
            let p = gray_probability(distance, n, YCSB_ZIPFIAN_CONSTANT);
            let f = counts[(n - 1 - distance) as usize] as f64 / DRAWS as f64;
            assert!(
                (f - p).abs() < five_sigma(p, DRAWS),
                "distance {distance}: {f} vs {p}"
            );
        }
        // Decays with the distance from the newest, and reaches record 0 (which YCSB's version never picks).
        let at = |d: u64| counts[(n - 1 - d) as usize];
        assert!(at(0) > at(1) && at(1) > at(2) && at(2) > at(3));
        let span = |a: u64, b: u64| (a..b).map(at).sum::<u64>() as f64 / (b - a) as f64;
        assert!(span(0, 10) > span(10, 100) && span(10, 100) > span(100, 1000));
        let mut chooser = KeyChooser::new(Distribution::Latest, 2);
        let mut rng = StdRng::seed_from_u64(28);
        let zeros = (0..10_000)
            .filter(|_| chooser.choose(&mut rng, 2) == 0)
            .count();
        assert!(zeros > 2000, "{zeros}");
    }

    #[test]
    fn latest_follows_inserts() {
        let mut chooser = KeyChooser::new(Distribution::Latest, 100);
        let mut rng = StdRng::seed_from_u64(29);
        let mut newest_hits = 0u64;
        for count in 100..20_100u64 {
            let i = chooser.choose(&mut rng, count);
            assert!(i < count);
            newest_hits += u64::from(i == count - 1);
        }
        // About 1/ζ(n, 0.99) of the draws pick the newest, n going from 100 to 20100.
        let p = 1.0 / zeta(20_100, 0.99);
        let f = newest_hits as f64 / 20_000.0;
        assert!(
            f > p && f < 1.0 / zeta(100, 0.99) + five_sigma(0.2, 20_000),
            "{f}"
        );
    }
}
