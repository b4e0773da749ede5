//! YCSB workloads (Cooper et al., "Benchmarking Cloud Serving Systems with YCSB", SoCC 2010) as YCSB's
//! `CoreWorkload` defines them: operation mixes, request distributions, keys and values.
//!
//! - [`Workload`]: the core workloads A (50% reads, 50% updates), B (95/5), C (reads only), D (95% reads, 5%
//!   inserts, reads of the latest records) and F (50% reads, 50% read-modify-writes), plus W (50% reads, 50%
//!   inserts), insert-only, and custom [`Mix`]es. Workload E (scans) is left out: the store has no range queries.
//! - [`Distribution`]: uniform, Zipfian (YCSB's `ZipfianGenerator`, Gray et al.'s algorithm for θ < 1 and exact
//!   rejection-inversion for θ ≥ 1), scrambled Zipfian (what YCSB's `requestdistribution=zipfian` instantiates, and
//!   the default of every preset but D) and latest (`SkewedLatestGenerator`, D's default).
//! - [`OpGenerator`]: the seeded, repeatable operation stream of one client; inserts take fresh ids and the
//!   distributions follow the growing record count. [`load_ids`] splits the load phase among clients.
//! - [`key_bytes`] / [`KeyFormat`]: fixed-size keys of record ids, 8 bytes by default as in the DINOMO paper;
//!   [`fill_value`] / [`verify_value`]: values that name their record and version, so a reader can check them.
//!
//! Where this departs from YCSB, it is to fix a defect or to let the record count grow cleanly, and each item's
//! documentation says so: the Zipfian η follows the current count, latest can pick record 0, uniform includes
//! inserted records, scrambled Zipfian extends its hash mapping consistently as records are inserted, ζ comes from
//! the Euler–Maclaurin formula for long sums, and hashed keys use a bijective hash instead of FNV-64.
//!
//! Repeatability: the generators use rand's `StdRng` (ChaCha12) and `f64` arithmetic, so a seed gives the same
//! sequence on every run of the same build on the same platform.

mod data;
mod distribution;
mod generator;
mod workload;
mod zipf;

use thiserror::Error;

pub use data::{
    DEFAULT_KEY_SIZE, KeyFormat, KeyOrder, KeyStyle, MAX_KEY_SIZE, MAX_VALUE_SIZE,
    MIN_BINARY_KEY_SIZE, MIN_USER_KEY_SIZE, MIN_VALUE_SIZE, VerifyError, fill_value, key_bytes,
    verify_value,
};
pub use distribution::Distribution;
pub use generator::{OpGenerator, client_seed, load_ids};
pub use workload::{Mix, OpKind, Operation, Workload};
pub use zipf::{SCRAMBLED_ITEM_COUNT, YCSB_ZIPFIAN_CONSTANT, fnv64, zeta};

/// Why a workload could not be set up, or a key or value not made.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum YcsbError {
    /// Not a workload name or mix.
    #[error("unknown workload {0}")]
    UnknownWorkload(String),
    /// Not a distribution name.
    #[error("unknown request distribution {0}")]
    UnknownDistribution(String),
    /// A mix with a negative or non-finite weight, or with every weight 0.
    #[error("bad operation mix: {0}")]
    BadMix(String),
    /// A Zipfian θ that is not finite and positive.
    #[error("the Zipfian θ must be finite and positive (got {0})")]
    BadTheta(f64),
    /// The workload reads or updates, but no record is loaded.
    #[error("workload {0} targets existing records, so the record count must be at least 1")]
    NoRecords(String),
    /// A client number outside `0..clients`, or no clients.
    #[error(
        "client {client} of {clients}: clients are numbered from 0 and there must be at least one"
    )]
    BadClient {
        /// The client asked for.
        client: u64,
        /// The number of clients.
        clients: u64,
    },
    /// A key size outside the format's bounds.
    #[error("a key of {size} bytes is outside {min}..={max}")]
    KeySize {
        /// The size asked for.
        size: usize,
        /// The format's smallest size.
        min: usize,
        /// The largest size.
        max: usize,
    },
    /// A YCSB-style key too short for its number's digits.
    #[error("the key of record {id} needs {needed} bytes, more than the key size {size}")]
    KeyTooShort {
        /// The record.
        id: u64,
        /// The key size.
        size: usize,
        /// The bytes its key needs.
        needed: usize,
    },
    /// A value size outside the bounds.
    #[error("a value of {size} bytes is outside {min}..={max}")]
    ValueSize {
        /// The size asked for.
        size: usize,
        /// [`MIN_VALUE_SIZE`].
        min: usize,
        /// [`MAX_VALUE_SIZE`].
        max: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every operation of every distribution targets a present record or the next insert id.
        #[test]
        fn operations_stay_in_the_key_space(
            theta in 0.05f64..4.0,
            records in 1u64..5000,
            seed in any::<u64>(),
            which in 0usize..4,
            insert in 0.0f64..1.0,
        ) {
            let distribution = [
                Distribution::Uniform,
                Distribution::Zipfian { theta },
                Distribution::ScrambledZipfian { theta },
                Distribution::Latest,
            ][which];
            let mix = Mix::new(1.0 - insert, 0.1, insert, 0.1).unwrap();
            let mut g = OpGenerator::new(Workload::Custom(mix), distribution, records, seed).unwrap();
            for _ in 0..300 {
                let before = g.present();
                let op = g.next();
                if op.kind == OpKind::Insert {
                    prop_assert_eq!(op.key_id, before);
                    prop_assert_eq!(g.present(), before + 1);
                } else {
                    prop_assert!(op.key_id < before);
                }
            }
        }

        /// Names print and parse back.
        #[test]
        fn distribution_names_round_trip(theta in 0.001f64..100.0, which in 0usize..4) {
            let d = [
                Distribution::Uniform,
                Distribution::Zipfian { theta },
                Distribution::ScrambledZipfian { theta },
                Distribution::Latest,
            ][which];
            prop_assert_eq!(d.to_string().parse::<Distribution>().unwrap(), d);
        }

        /// Any value verifies as its own record and version, and as no other record.
        #[test]
        fn values_verify(key in any::<u64>(), version in any::<u64>(), size in 16usize..2048) {
            let mut v = Vec::new();
            fill_value(key, version, size, &mut v).unwrap();
            prop_assert_eq!(verify_value(key, &v), Ok(version));
            prop_assert!(verify_value(key.wrapping_add(1), &v).is_err());
        }
    }
}
