//! Zipfian samplers: YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
//! databases", SIGMOD 1994) for θ < 1, and rejection-inversion sampling (Hörmann & Derflinger, "Rejection-inversion
//! to generate variates from monotone discrete distributions", 1996) for θ ≥ 1, where Gray's approximation no longer
//! holds; plus ζ(n, θ), YCSB's FNV-64 hash, and the stable extension of a hashed index to a growing count.

use rand::{Rng, RngExt};

/// YCSB's default Zipfian constant (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const YCSB_ZIPFIAN_CONSTANT: f64 = 0.99;

/// Items of the Zipfian space behind a scrambled Zipfian distribution (YCSB's `ScrambledZipfianGenerator.ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// Terms of ζ summed one by one; the rest of a long sum comes from the Euler–Maclaurin formula, whose error past
/// this many terms is far below the rounding error of the sum.
const ZETA_EXACT_TERMS: u64 = 1024;

/// Largest growth of the item count whose new terms are added one by one (as YCSB does); a larger jump uses the
/// Euler–Maclaurin formula for the new terms.
const ZETA_INCREMENTAL_TERMS: u64 = 4096;

/// Attempts of rejection-inversion before the last candidate is taken as is. One attempt is accepted with
/// probability about 0.99 (measured for θ from 1 to 40 and counts from 2 to 10^10), so the cap is never reached in
/// practice; it only bounds the loop.
const MAX_REJECTION_ATTEMPTS: u32 = 64;

/// ζ(n, θ) = Σ_{i=1}^{n} i^−θ, the normalising constant of a Zipfian distribution over `n` items.
///
/// Exact summation for the first terms and the Euler–Maclaurin formula for the tail, so that any `n` costs the same
/// (YCSB sums every term, which takes minutes for 10^10 items).
pub fn zeta(n: u64, theta: f64) -> f64 {
    zeta_range(0, n, theta)
}

/// Σ_{i=from+1}^{to} i^−θ: the terms that ζ gains when the item count grows from `from` to `to`.
fn zeta_range(from: u64, to: u64, theta: f64) -> f64 {
    if to <= from {
        return 0.0;
    }
    if to - from <= ZETA_INCREMENTAL_TERMS {
        return exact_sum(from + 1, to, theta);
    }
    let exact_end = from.max(ZETA_EXACT_TERMS).min(to);
    let mut sum = exact_sum(from + 1, exact_end, theta);
    if exact_end < to {
        sum += euler_maclaurin(exact_end + 1, to, theta);
    }
    sum
}

/// Σ_{i=first}^{last} i^−θ term by term.
fn exact_sum(first: u64, last: u64, theta: f64) -> f64 {
    (first..=last).map(|i| (i as f64).powf(-theta)).sum()
}

/// Σ_{i=a}^{b} i^−s by the Euler–Maclaurin formula with three Bernoulli corrections; for `a` past
/// [`ZETA_EXACT_TERMS`] the remainder is below 10^−25 of the sum.
fn euler_maclaurin(a: u64, b: u64, s: f64) -> f64 {
    let (a, b) = (a as f64, b as f64);
    let f = |x: f64| x.powf(-s);
    // ∫_a^b x^−s dx = a^{1−s} · ((b/a)^{1−s} − 1) / (1−s), written with expm1 so that θ near 1 loses no digits.
    let log_ratio = (b / a).ln();
    let integral = a.powf(1.0 - s) * log_ratio * expm1_over_x((1.0 - s) * log_ratio);
    // Odd derivatives of x^−s: f' = −s x^{−s−1}, f''' = −s(s+1)(s+2) x^{−s−3}, f^(5) = −s…(s+4) x^{−s−5}.
    let d1 = |x: f64| -s * x.powf(-s - 1.0);
    let d3 = |x: f64| -s * (s + 1.0) * (s + 2.0) * x.powf(-s - 3.0);
    let d5 = |x: f64| -s * (s + 1.0) * (s + 2.0) * (s + 3.0) * (s + 4.0) * x.powf(-s - 5.0);
    integral + (f(a) + f(b)) / 2.0 + (d1(b) - d1(a)) / 12.0 - (d3(b) - d3(a)) / 720.0
        + (d5(b) - d5(a)) / 30240.0
}

/// (e^x − 1) / x, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

/// ln(1 + x) / x, continuous at 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the eight little-endian bytes of `value`, made non-negative as Java's
/// `Math.abs` of a `long` would (the one value Java leaves negative, 2^63, is kept as 2^63 here).
pub fn fnv64(value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    for byte in value.to_le_bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(PRIME);
    }
    (hash as i64).unsigned_abs()
}

/// The SplitMix64 finaliser: a bijection on `u64` that spreads every input bit over every output bit.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 increment.
pub(crate) const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The index in `[0, count)` of the hash `h` when the items grew from `initial` to `count`: `h % initial` (YCSB's
/// mapping) as long as `count == initial`, and stable as `count` grows — going from `count` to `count + 1` moves
/// the index of a hash to `count` with probability 1/(count+1) and leaves it alone otherwise, so every index keeps
/// an equal share (the jump consistent hash of Lamping and Veach, started from `initial` items instead of one).
///
/// `initial` must be at least 1 and `count` at least `initial`; costs ln(count/initial) + 1 steps on average.
pub(crate) fn grow_index(h: u64, initial: u64, count: u64) -> u64 {
    debug_assert!(initial >= 1 && count >= initial);
    let mut index = h % initial;
    // The jumps draw from their own stream, independent of `h % initial`.
    let mut state = mix64(h ^ 0x5851_F42D_4C95_7F2D);
    // `seen`: the count up to which the hash has stayed at `index`. The next move lands at j ≥ seen with
    // P(j ≥ m) = seen/m (no move at any of seen..m, each taken with probability 1/(i+1)).
    let mut seen = initial;
    while seen < count {
        state = state.wrapping_add(GOLDEN_GAMMA);
        let r = ((mix64(state) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64); // (0, 1]
        let jump = (seen as f64 / r).floor();
        if jump >= count as f64 {
            break;
        }
        index = jump as u64;
        seen = index + 1;
    }
    index
}

/// A Zipfian sampler over `[0, count)`: item `i` drawn with probability proportional to 1/(i+1)^θ (exactly for
/// θ ≥ 1; with Gray's approximation beyond the first two items for θ < 1, as YCSB). The count may grow between
/// draws.
#[derive(Debug, Clone)]
pub(crate) enum ZipfSampler {
    /// YCSB's algorithm, θ < 1.
    Gray(GrayZipf),
    /// Rejection-inversion, θ ≥ 1.
    RejectionInversion(RejectionInversionZipf),
}

impl ZipfSampler {
    /// A sampler over `count` items; θ must be finite and positive, `count` at least 1.
    pub(crate) fn new(count: u64, theta: f64) -> ZipfSampler {
        if theta < 1.0 {
            ZipfSampler::Gray(GrayZipf::new(count, theta))
        } else {
            ZipfSampler::RejectionInversion(RejectionInversionZipf::new(count, theta))
        }
    }

    /// One draw over `[0, count)`, after adjusting to `count` items if it changed (at least 1).
    pub(crate) fn sample<R: Rng + ?Sized>(&mut self, rng: &mut R, count: u64) -> u64 {
        match self {
            ZipfSampler::Gray(g) => {
                g.set_count(count);
                g.sample(rng.random::<f64>())
            }
            ZipfSampler::RejectionInversion(r) => {
                r.set_count(count);
                r.sample(rng)
            }
        }
    }
}

/// YCSB's `ZipfianGenerator`: ζ computed once, extended term by term as the count grows; item 0 with probability
/// 1/ζ(n), item 1 with 2^−θ/ζ(n), the others by Gray's closed-form inversion.
#[derive(Debug, Clone)]
pub(crate) struct GrayZipf {
    theta: f64,
    /// 1 / (1 − θ).
    alpha: f64,
    /// ζ(2, θ).
    zeta2: f64,
    /// 2^−θ.
    half_pow_theta: f64,
    /// ζ(count, θ).
    zetan: f64,
    count: u64,
    eta: f64,
}

impl GrayZipf {
    pub(crate) fn new(count: u64, theta: f64) -> GrayZipf {
        let count = count.max(1);
        let mut g = GrayZipf {
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2: zeta(2, theta),
            half_pow_theta: 0.5f64.powf(theta),
            zetan: zeta(count, theta),
            count,
            eta: 0.0,
        };
        g.eta = g.eta();
        g
    }

    /// η of Gray's inversion for the current count. (YCSB recomputes it with the count the generator was built with
    /// after the count grows; the current count is the correct one.)
    fn eta(&self) -> f64 {
        (1.0 - (2.0 / self.count as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    fn set_count(&mut self, count: u64) {
        let count = count.max(1);
        if count == self.count {
            return;
        }
        self.zetan = if count > self.count {
            self.zetan + zeta_range(self.count, count, self.theta)
        } else {
            zeta(count, self.theta)
        };
        self.count = count;
        self.eta = self.eta();
    }

    /// The item for the uniform variate `u` in [0, 1).
    pub(crate) fn sample(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        let last = self.count - 1;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1.min(last);
        }
        let v = self.count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha);
        // A float-to-int cast saturates (and maps NaN to 0), so the clamp keeps every draw in range.
        (v as u64).min(last)
    }
}

/// Rejection-inversion for a Zipfian distribution of exponent θ > 0 over ranks 1..=n (reported as 0..n), after
/// Apache Commons RNG's `RejectionInversionZipfSampler`. Exact for any θ, needs no ζ, and adapts to a new count in
/// constant time.
#[derive(Debug, Clone)]
pub(crate) struct RejectionInversionZipf {
    exponent: f64,
    count: u64,
    /// H(1.5) − 1.
    h_integral_x1: f64,
    /// H(n + 0.5).
    h_integral_n: f64,
    /// The squeeze: a candidate within `s` of its rank is accepted without evaluating H.
    s: f64,
}

impl RejectionInversionZipf {
    pub(crate) fn new(count: u64, exponent: f64) -> RejectionInversionZipf {
        let count = count.max(1);
        let mut r = RejectionInversionZipf {
            exponent,
            count,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        r.h_integral_x1 = r.h_integral(1.5) - 1.0;
        r.h_integral_n = r.h_integral(count as f64 + 0.5);
        r.s = 2.0 - r.h_integral_inverse(r.h_integral(2.5) - r.h(2.0));
        r
    }

    fn set_count(&mut self, count: u64) {
        let count = count.max(1);
        if count != self.count {
            self.count = count;
            self.h_integral_n = self.h_integral(count as f64 + 0.5);
        }
    }

    /// h(x) = x^−θ.
    fn h(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    /// H(x) = (x^{1−θ} − 1) / (1 − θ), or ln x for θ = 1: an antiderivative of h.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.exponent) * log_x) * log_x
    }

    /// The inverse of H.
    fn h_integral_inverse(&self, x: f64) -> f64 {
        // Rounding may push t below −1, where the logarithm is undefined.
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }

    fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        let mut k = 1u64;
        for _ in 0..MAX_REJECTION_ATTEMPTS {
            // Uniform in (H(1.5) − 1, H(n + 0.5)].
            let u =
                self.h_integral_n + rng.random::<f64>() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            // Saturating cast, then clamp: k in [1, n].
            k = ((x + 0.5) as u64).clamp(1, self.count);
            let kf = k as f64;
            if kf - x <= self.s || u >= self.h_integral(kf + 0.5) - self.h(kf) {
                break;
            }
        }
        k - 1
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// The probability that Gray's algorithm (as [`GrayZipf`] implements it) returns `k` out of `n` items: exact for
    /// items 0 and 1, and the measure of the uniform variates that its closed form maps to `k` for the others.
    pub(crate) fn gray_probability(k: u64, n: u64, theta: f64) -> f64 {
        let z = zeta(n, theta);
        let first_two = (1.0 + 0.5f64.powf(theta)) / z;
        match k {
            0 => (1.0 / z).min(1.0),
            1 if n >= 2 => 0.5f64.powf(theta) / z,
            _ if k >= n => 0.0,
            _ => {
                let g = GrayZipf::new(n, theta);
                // u ↦ n (η u − η + 1)^α is increasing; it reaches x at u = 1 − (1 − (x/n)^{1−θ}) / η.
                let u_at = |x: f64| {
                    let u = 1.0 - (1.0 - (x / n as f64).powf(1.0 - theta)) / g.eta;
                    u.clamp(first_two, 1.0)
                };
                u_at((k + 1) as f64) - u_at(k as f64)
            }
        }
    }

    /// The exact Zipfian probability of item `k` (rank k + 1) out of `n`.
    pub(crate) fn zipf_probability(k: u64, n: u64, theta: f64) -> f64 {
        ((k + 1) as f64).powf(-theta) / zeta(n, theta)
    }

    /// The upper 10^−4 quantile of χ² with `df` degrees of freedom (Wilson–Hilferty).
    pub(crate) fn chi_square_critical(df: f64) -> f64 {
        let z = 3.719; // standard normal quantile of 1 − 10^−4
        let c = 2.0 / (9.0 * df);
        df * (1.0 - c + z * c.sqrt()).powi(3)
    }

    /// χ² of `observed` counts against the probabilities `expected` (which sum to 1) over `total` draws, with buckets
    /// whose expected count is below 5 pooled into one.
    pub(crate) fn chi_square(observed: &[u64], expected: &[f64], total: u64) -> (f64, f64) {
        let (mut stat, mut df) = (0.0, -1.0);
        let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
        for (&o, &p) in observed.iter().zip(expected) {
            let e = p * total as f64;
            if e < 5.0 {
                pooled_obs += o as f64;
                pooled_exp += e;
                continue;
            }
            stat += (o as f64 - e).powi(2) / e;
            df += 1.0;
        }
        if pooled_exp > 0.0 {
            stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(5.0);
            df += 1.0;
        }
        (stat, df)
    }

    /// Five binomial standard deviations of a frequency `p` over `n` draws.
    pub(crate) fn five_sigma(p: f64, n: u64) -> f64 {
        5.0 * (p * (1.0 - p) / n as f64).sqrt()
    }

    fn histogram(sampler: &mut ZipfSampler, n: u64, draws: u64, seed: u64) -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let k = sampler.sample(&mut rng, n);
            assert!(k < n, "draw {k} outside [0, {n})");
            counts[k as usize] += 1;
        }
        counts
    }

    #[test]
    fn zeta_matches_the_plain_sum_and_ycsbs_constant() {
        for theta in [0.5, 0.99, 1.0, 1.5, 2.0] {
            for n in [1u64, 2, 10, 1024, 1025, 5000, 100_000] {
                let plain: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
                let z = zeta(n, theta);
                assert!(
                    ((z - plain) / plain).abs() < 1e-12,
                    "ζ({n}, {theta}) = {z}, summed {plain}"
                );
            }
        }
        // YCSB's ScrambledZipfianGenerator.ZETAN: ζ(10^10, 0.99), summed term by term.
        let z = zeta(SCRAMBLED_ITEM_COUNT, YCSB_ZIPFIAN_CONSTANT);
        assert!((z - 26.469_028_201_783_02).abs() < 1e-9, "{z}");
        // θ = 2 converges to π²/6.
        let z = zeta(1 << 40, 2.0);
        assert!(
            (z - std::f64::consts::PI.powi(2) / 6.0).abs() < 1e-11,
            "{z}"
        );
    }

    #[test]
    fn growing_zeta_equals_zeta_of_the_new_count() {
        for theta in [0.5, 0.99] {
            let mut g = GrayZipf::new(1000, theta);
            for count in [1001u64, 1002, 5000, 5001, 1_000_000, 1_000_001, 700] {
                g.set_count(count);
                let direct = zeta(count, theta);
                assert!(((g.zetan - direct) / direct).abs() < 1e-12, "{count}");
                let fresh = GrayZipf::new(count, theta);
                assert!((g.eta - fresh.eta).abs() <= 1e-9 * fresh.eta.abs());
            }
        }
    }

    #[test]
    fn gray_probabilities_sum_to_one() {
        for theta in [0.2, 0.5, 0.99] {
            for n in [1u64, 2, 3, 50] {
                let total: f64 = (0..n).map(|k| gray_probability(k, n, theta)).sum();
                assert!((total - 1.0).abs() < 1e-9, "n {n} θ {theta}: {total}");
            }
        }
    }

    /// Gray's algorithm: the first two items exactly as the Zipfian law, every item as the algorithm's own law
    /// (χ² over the whole range), and the rest within the approximation's known error of the law.
    #[test]
    fn gray_matches_the_zipfian_law() {
        const DRAWS: u64 = 200_000;
        for (theta, n, seed) in [
            (0.99, 50u64, 1u64),
            (0.5, 50, 2),
            (0.99, 1000, 3),
            (0.5, 1000, 4),
        ] {
            let mut sampler = ZipfSampler::new(n, theta);
            assert!(matches!(sampler, ZipfSampler::Gray(_)));
            let counts = histogram(&mut sampler, n, DRAWS, seed);
            for k in 0..2 {
                let p = zipf_probability(k, n, theta);
                let f = counts[k as usize] as f64 / DRAWS as f64;
                assert!(
                    (f - p).abs() < five_sigma(p, DRAWS),
                    "θ {theta} n {n} item {k}: {f} vs {p}"
                );
            }
            for k in 2..10 {
                let p = zipf_probability(k, n, theta);
                let f = counts[k as usize] as f64 / DRAWS as f64;
                // Gray's inversion gives item 2 up to ~20% too much at θ = 0.99, less further out.
                assert!(
                    (f / p - 1.0).abs() < 0.25,
                    "θ {theta} n {n} item {k}: {f} vs {p}"
                );
            }
            let expected: Vec<f64> = (0..n).map(|k| gray_probability(k, n, theta)).collect();
            let (stat, df) = chi_square(&counts, &expected, DRAWS);
            assert!(
                stat < chi_square_critical(df),
                "θ {theta} n {n}: χ² {stat} with {df} df"
            );
            assert_eq!(
                counts.iter().enumerate().max_by_key(|&(_, c)| c).unwrap().0,
                0
            );
            if n <= 50 {
                assert!(counts.iter().all(|&c| c > 0), "every item drawn");
            }
        }
    }

    /// Rejection-inversion is exact: χ² against the Zipfian law itself.
    #[test]
    fn rejection_inversion_matches_the_zipfian_law() {
        const DRAWS: u64 = 200_000;
        for (theta, n, seed) in [
            (2.0, 10u64, 5u64),
            (2.0, 1000, 6),
            (1.0, 200, 7),
            (1.3, 1000, 8),
        ] {
            let mut sampler = ZipfSampler::new(n, theta);
            assert!(matches!(sampler, ZipfSampler::RejectionInversion(_)));
            let counts = histogram(&mut sampler, n, DRAWS, seed);
            for k in 0..10.min(n) {
                let p = zipf_probability(k, n, theta);
                let f = counts[k as usize] as f64 / DRAWS as f64;
                assert!(
                    (f - p).abs() < five_sigma(p, DRAWS),
                    "θ {theta} n {n} item {k}: {f} vs {p}"
                );
            }
            let expected: Vec<f64> = (0..n).map(|k| zipf_probability(k, n, theta)).collect();
            let (stat, df) = chi_square(&counts, &expected, DRAWS);
            assert!(
                stat < chi_square_critical(df),
                "θ {theta} n {n}: χ² {stat} with {df} df"
            );
            if n == 10 {
                assert!(counts.iter().all(|&c| c > 0), "every item drawn");
            }
        }
    }

    #[test]
    fn samplers_follow_a_growing_count() {
        for theta in [0.99, 2.0] {
            let mut sampler = ZipfSampler::new(1, theta);
            let mut rng = StdRng::seed_from_u64(9);
            for count in 1..2000u64 {
                assert!(sampler.sample(&mut rng, count) < count);
            }
            // After growing, the law is that of the new count.
            let counts = histogram(&mut sampler, 20, 100_000, 10);
            let p0 = zipf_probability(0, 20, theta);
            let f0 = counts[0] as f64 / 100_000.0;
            assert!(
                (f0 - p0).abs() < five_sigma(p0, 100_000),
                "θ {theta}: {f0} vs {p0}"
            );
        }
    }

    #[test]
    fn huge_counts_stay_in_range() {
        let mut rng = StdRng::seed_from_u64(11);
        for theta in [
            1e-300, 0.01, 0.5, 0.99, 0.999_999, 1.0, 1.000_001, 2.0, 40.0, 1e300,
        ] {
            for n in [1u64, 2, 3, SCRAMBLED_ITEM_COUNT, u64::MAX / 2] {
                let mut sampler = ZipfSampler::new(n, theta);
                for _ in 0..200 {
                    assert!(sampler.sample(&mut rng, n) < n, "θ {theta} n {n}");
                }
            }
        }
    }

    #[test]
    fn fnv64_is_ycsbs() {
        // YCSB's Utils.fnvhash64: key 0 of a hashed load is the well-known "user6284781860667377211".
        assert_eq!(fnv64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv64(1_234_567_890), 8_578_831_968_459_195_056);
    }

    #[test]
    fn grown_indices_are_uniform_and_stable() {
        const HASHES: u64 = 100_000;
        let (initial, count) = (100u64, 250u64);
        let mut counts = vec![0u64; count as usize];
        for i in 0..HASHES {
            let h = mix64(i);
            let index = grow_index(h, initial, count);
            assert!(index < count);
            counts[index as usize] += 1;
            assert_eq!(grow_index(h, initial, initial), h % initial);
            // Growing by one either keeps the index or moves it to the new item.
            let next = grow_index(h, initial, count + 1);
            assert!(next == index || next == count, "{index} → {next}");
        }
        let expected = vec![1.0 / count as f64; count as usize];
        let (stat, df) = chi_square(&counts, &expected, HASHES);
        assert!(stat < chi_square_critical(df), "χ² {stat} with {df} df");
    }
}
