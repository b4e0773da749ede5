//! The operation stream of one client, and the load phase's share of one client.

use std::ops::Range;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::YcsbError;
use super::distribution::{Distribution, KeyChooser};
use super::workload::{Mix, OpKind, Operation, Workload};
use super::zipf::{GOLDEN_GAMMA, mix64};

/// The seed of client `client`'s generator in a run seeded with `base_seed`: distinct clients get distinct,
/// unrelated seeds.
pub fn client_seed(base_seed: u64, client: u64) -> u64 {
    // `client + 1` times an odd constant is a bijection, and so is mix64: distinct clients, distinct seeds.
    mix64(base_seed ^ mix64(client.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

/// The records client `client` of `clients` loads: a contiguous share of `0..record_count`, the shares of all
/// clients covering it exactly once and differing in length by at most one. (Whether consecutive ids land far
/// apart in the key space, YCSB's `insertorder`, is up to the [`super::KeyFormat`].)
pub fn load_ids(record_count: u64, client: u64, clients: u64) -> Result<Range<u64>, YcsbError> {
    if clients == 0 || client >= clients {
        return Err(YcsbError::BadClient { client, clients });
    }
    let bound = |c: u64| (record_count as u128 * c as u128 / clients as u128) as u64;
    Ok(bound(client)..bound(client + 1))
}

/// Draws an operation kind with the mix's proportions from one random word.
#[derive(Debug, Clone)]
struct KindChooser {
    /// Kinds of positive weight, in [`OpKind::ALL`] order.
    kinds: [OpKind; 4],
    /// `thresholds[i]`: a word below it (and not below the previous) picks `kinds[i]`; the last kind takes the rest.
    thresholds: [u64; 4],
    len: usize,
}

impl KindChooser {
    fn new(mix: &Mix) -> KindChooser {
        let total = mix.total();
        let mut chooser = KindChooser {
            kinds: [OpKind::Read; 4],
            thresholds: [u64::MAX; 4],
            len: 0,
        };
        let mut cumulative = 0.0;
        for kind in OpKind::ALL {
            let w = mix.weight(kind);
            if w > 0.0 {
                cumulative += w;
                chooser.kinds[chooser.len] = kind;
                // 2^64 · cumulative share; the cast saturates at the top.
                chooser.thresholds[chooser.len] =
                    (cumulative / total * 18_446_744_073_709_551_616.0) as u64;
                chooser.len += 1;
            }
        }
        chooser
    }

    fn choose<R: Rng + ?Sized>(&self, rng: &mut R) -> OpKind {
        let last = self.len - 1;
        if last == 0 {
            return self.kinds[0];
        }
        let word = rng.next_u64();
        self.kinds[..last]
            .iter()
            .zip(&self.thresholds)
            .find(|&(_, &t)| word < t)
            .map_or(self.kinds[last], |(&k, _)| k)
    }
}

/// The operations of one client: kinds in the workload's proportions, targets from the request distribution,
/// inserts under fresh key ids. Seeded and repeatable: the same arguments give the same sequence. Generating an
/// operation allocates nothing.
///
/// **Which records exist.** Records `0..record_count` are loaded before the run. A generator inserts under its own
/// sequence of new ids (YCSB's transaction insert counter): `record_count + client + k · clients` for its k-th
/// insert, so that the clients of a run never insert the same id. Reads, updates and read-modify-writes target the
/// loaded records and the generator's *own* inserts only, which are `record_count + inserted()` records in all,
/// numbered in that order for the request distribution (so [`Distribution::Latest`] favours this client's newest
/// insert). YCSB instead shares one insert counter among its threads and reads up to the highest insert
/// *acknowledged* by all of them; one generator per client thread avoids that shared state, and a client that
/// performs its operations in the order it draws them (waiting for each insert before issuing the next operation)
/// never targets a record not yet inserted. A client that keeps several operations in flight must complete an
/// insert before issuing an operation drawn after it, or accept reads that miss.
///
/// Ids saturate at `u64::MAX` instead of wrapping, which no run reaches.
#[derive(Debug)]
pub struct OpGenerator {
    workload: Workload,
    distribution: Distribution,
    rng: StdRng,
    kinds: KindChooser,
    keys: KeyChooser,
    record_count: u64,
    inserted: u64,
    client: u64,
    clients: u64,
}

impl OpGenerator {
    /// The generator of a single client seeded with `seed` (StdRng's `seed_from_u64`), over `record_count` loaded
    /// records. Pass `workload.default_distribution()` for YCSB's distribution of the workload.
    ///
    /// Fails on an invalid mix or θ, or when the mix targets existing records and `record_count` is 0.
    pub fn new(
        workload: Workload,
        distribution: Distribution,
        record_count: u64,
        seed: u64,
    ) -> Result<OpGenerator, YcsbError> {
        OpGenerator::build(workload, distribution, record_count, seed, 0, 1)
    }

    /// The generator of client `client` of `clients` (numbered from 0) in a run seeded with `base_seed`: seeded
    /// with [`client_seed`], inserting under its own ids (see [`OpGenerator`]).
    pub fn for_client(
        workload: Workload,
        distribution: Distribution,
        record_count: u64,
        base_seed: u64,
        client: u64,
        clients: u64,
    ) -> Result<OpGenerator, YcsbError> {
        if clients == 0 || client >= clients {
            return Err(YcsbError::BadClient { client, clients });
        }
        let seed = client_seed(base_seed, client);
        OpGenerator::build(workload, distribution, record_count, seed, client, clients)
    }

    fn build(
        workload: Workload,
        distribution: Distribution,
        record_count: u64,
        seed: u64,
        client: u64,
        clients: u64,
    ) -> Result<OpGenerator, YcsbError> {
        let mix = workload.mix();
        mix.validate()?;
        distribution.validate()?;
        if record_count == 0 && mix.needs_records() {
            return Err(YcsbError::NoRecords(workload.to_string()));
        }
        Ok(OpGenerator {
            workload,
            distribution,
            rng: StdRng::seed_from_u64(seed),
            kinds: KindChooser::new(&mix),
            keys: KeyChooser::new(distribution, record_count),
            record_count,
            inserted: 0,
            client,
            clients,
        })
    }

    /// The next operation. An insert's record counts as present from the next operation on.
    #[allow(
        clippy::should_implement_trait,
        reason = "an endless stream: an Option would only add an unwrap to every operation"
    )]
    pub fn next(&mut self) -> Operation {
        let kind = self.kinds.choose(&mut self.rng);
        let key_id = if kind == OpKind::Insert {
            let id = self.id_of(self.present());
            self.inserted += 1;
            id
        } else {
            let present = self.present();
            let index = self.keys.choose(&mut self.rng, present);
            self.id_of(index)
        };
        Operation { kind, key_id }
    }

    /// The records this generator may target: the loaded ones and its own inserts.
    pub fn present(&self) -> u64 {
        self.record_count.saturating_add(self.inserted)
    }

    /// Inserts generated so far.
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    /// The workload.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// The request distribution.
    pub fn distribution(&self) -> Distribution {
        self.distribution
    }

    /// The key id of the `index`-th record this generator knows: a loaded record, or its own insert number
    /// `index − record_count`.
    fn id_of(&self, index: u64) -> u64 {
        match index.checked_sub(self.record_count) {
            None => index,
            Some(k) => self
                .record_count
                .saturating_add(self.client)
                .saturating_add(k.saturating_mul(self.clients)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::zipf::tests::five_sigma;
    use super::*;

    const OPS: u64 = 200_000;

    #[test]
    fn presets_draw_their_mix() {
        for (i, workload) in Workload::PRESETS.into_iter().enumerate() {
            let mut g = OpGenerator::new(
                workload,
                workload.default_distribution(),
                1000,
                40 + i as u64,
            )
            .unwrap();
            let mut counts = [0u64; 4];
            for _ in 0..OPS {
                let op = g.next();
                counts[OpKind::ALL.iter().position(|&k| k == op.kind).unwrap()] += 1;
            }
            for (kind, &count) in OpKind::ALL.iter().zip(&counts) {
                let p = workload.mix().fraction(*kind);
                let f = count as f64 / OPS as f64;
                if p == 0.0 || p == 1.0 {
                    assert_eq!(f, p, "{workload} {kind}");
                } else {
                    assert!(
                        (f - p).abs() < five_sigma(p, OPS),
                        "{workload} {kind}: {f} vs {p}"
                    );
                }
            }
            assert_eq!(g.inserted(), counts[2]);
        }
    }

    #[test]
    fn custom_mixes_draw_their_weights() {
        let mix: Mix = "read=2,update=1,insert=0.5,rmw=0.5".parse().unwrap();
        let mut g =
            OpGenerator::new(Workload::Custom(mix), Distribution::Uniform, 100, 50).unwrap();
        let mut counts = [0u64; 4];
        for _ in 0..OPS {
            let op = g.next();
            counts[OpKind::ALL.iter().position(|&k| k == op.kind).unwrap()] += 1;
        }
        for (p, &count) in [0.5, 0.25, 0.125, 0.125].iter().zip(&counts) {
            let f = count as f64 / OPS as f64;
            assert!((f - p).abs() < five_sigma(*p, OPS), "{f} vs {p}");
        }
    }

    #[test]
    fn inserts_extend_the_key_space_and_reads_stay_inside() {
        for distribution in [
            Distribution::Uniform,
            Distribution::Zipfian { theta: 0.99 },
            Distribution::Zipfian { theta: 2.0 },
            Distribution::ScrambledZipfian { theta: 0.99 },
            Distribution::Latest,
        ] {
            let mut g = OpGenerator::new(Workload::W, distribution, 10, 51).unwrap();
            let mut present: HashSet<u64> = (0..10).collect();
            let mut reads_of_inserted = 0u64;
            for _ in 0..20_000 {
                let op = g.next();
                match op.kind {
                    OpKind::Insert => {
                        assert_eq!(op.key_id, present.len() as u64, "{distribution}");
                        assert!(present.insert(op.key_id));
                    }
                    _ => {
                        assert!(present.contains(&op.key_id), "{distribution}: {op:?}");
                        reads_of_inserted += u64::from(op.key_id >= 10);
                    }
                }
            }
            assert_eq!(g.present(), present.len() as u64);
            // A plain Zipfian keeps favouring the first records; the others reach the inserted ones often.
            let least = if matches!(distribution, Distribution::Zipfian { .. }) {
                1
            } else {
                5000
            };
            assert!(
                reads_of_inserted >= least,
                "{distribution}: {reads_of_inserted}"
            );
        }
    }

    #[test]
    fn latest_reads_the_newest_insert_most() {
        let mut g =
            OpGenerator::new(Workload::D, Workload::D.default_distribution(), 1000, 52).unwrap();
        // Distance of each read from the newest record at the time.
        let mut by_distance = [0u64; 8];
        let mut reads = 0u64;
        for _ in 0..OPS {
            let op = g.next();
            if op.kind == OpKind::Read {
                reads += 1;
                let distance = g.present() - 1 - op.key_id;
                if let Some(c) = by_distance.get_mut(distance as usize) {
                    *c += 1;
                }
            }
        }
        assert!(
            by_distance.windows(2).all(|w| w[0] > w[1]),
            "{by_distance:?}"
        );
        // The newest takes about 1/ζ(n, 0.99) ≈ 13% of the reads (n ≈ 1000–11000 over the run).
        let newest = by_distance[0] as f64 / reads as f64;
        assert!((0.10..0.15).contains(&newest), "{newest}");
    }

    #[test]
    fn clients_insert_disjoint_ids_and_read_only_what_they_know() {
        let clients = 4u64;
        let mut all_inserts = HashSet::new();
        for client in 0..clients {
            let mut g =
                OpGenerator::for_client(Workload::W, Distribution::Latest, 100, 7, client, clients)
                    .unwrap();
            let mut mine: HashSet<u64> = (0..100).collect();
            for _ in 0..5000 {
                let op = g.next();
                if op.kind == OpKind::Insert {
                    assert!(op.key_id >= 100 && (op.key_id - 100) % clients == client);
                    assert!(all_inserts.insert(op.key_id), "{op:?} inserted twice");
                    mine.insert(op.key_id);
                } else {
                    assert!(mine.contains(&op.key_id), "client {client}: {op:?}");
                }
            }
        }
        assert!(OpGenerator::for_client(Workload::A, Distribution::Uniform, 10, 1, 4, 4).is_err());
        assert!(OpGenerator::for_client(Workload::A, Distribution::Uniform, 10, 1, 0, 0).is_err());
    }

    #[test]
    fn same_seed_same_sequence_other_seeds_differ() {
        let run = |seed: u64, client: u64| {
            let mut g = OpGenerator::for_client(
                Workload::A,
                Distribution::ScrambledZipfian { theta: 0.99 },
                10_000,
                seed,
                client,
                8,
            )
            .unwrap();
            (0..10_000).map(|_| g.next()).collect::<Vec<_>>()
        };
        assert_eq!(run(1, 0), run(1, 0));
        assert_ne!(run(1, 0), run(2, 0));
        assert_ne!(run(1, 0), run(1, 1));
        let mut a = OpGenerator::new(Workload::D, Distribution::Latest, 50, 9).unwrap();
        let mut b = OpGenerator::new(Workload::D, Distribution::Latest, 50, 9).unwrap();
        for _ in 0..10_000 {
            assert_eq!(a.next(), b.next());
        }
        let seeds: HashSet<u64> = (0..1000).map(|c| client_seed(3, c)).collect();
        assert_eq!(seeds.len(), 1000);
    }

    #[test]
    fn records_are_required_unless_only_inserting() {
        assert!(matches!(
            OpGenerator::new(Workload::C, Distribution::Uniform, 0, 1),
            Err(YcsbError::NoRecords(_))
        ));
        let mut g = OpGenerator::new(Workload::InsertOnly, Distribution::Uniform, 0, 1).unwrap();
        for id in 0..100 {
            assert_eq!(
                g.next(),
                Operation {
                    kind: OpKind::Insert,
                    key_id: id
                }
            );
        }
        let bad = Workload::Custom(Mix {
            read: -1.0,
            ..Mix::default()
        });
        assert!(OpGenerator::new(bad, Distribution::Uniform, 10, 1).is_err());
        let bad_theta = Distribution::Zipfian { theta: 0.0 };
        assert!(OpGenerator::new(Workload::A, bad_theta, 10, 1).is_err());
    }

    /// Through the whole generator (kinds, then keys, then ids), a read-only workload's key ids follow the Zipfian
    /// law over every record: χ² against Gray's probabilities for θ < 1 and the exact law for θ ≥ 1.
    #[test]
    fn generated_keys_follow_the_zipfian_law_over_every_record() {
        use super::super::zipf::tests::{
            chi_square, chi_square_critical, gray_probability, zipf_probability,
        };
        let n = 500u64;
        for (theta, seed) in [(0.99, 60u64), (2.0, 61)] {
            let distribution = Distribution::Zipfian { theta };
            let mut g = OpGenerator::new(Workload::C, distribution, n, seed).unwrap();
            let mut counts = vec![0u64; n as usize];
            for _ in 0..OPS {
                let op = g.next();
                assert_eq!(op.kind, OpKind::Read);
                counts[op.key_id as usize] += 1;
            }
            let expected: Vec<f64> = (0..n)
                .map(|k| {
                    if theta < 1.0 {
                        gray_probability(k, n, theta)
                    } else {
                        zipf_probability(k, n, theta)
                    }
                })
                .collect();
            let (stat, df) = chi_square(&counts, &expected, OPS);
            assert!(
                stat < chi_square_critical(df),
                "θ {theta}: χ² {stat} with {df} df"
            );
            // The test can fail: the same draws judged against a uniform law are far off.
            let uniform = vec![1.0 / n as f64; n as usize];
            let (off, df) = chi_square(&counts, &uniform, OPS);
            assert!(off > 10.0 * chi_square_critical(df), "θ {theta}: {off}");
        }
    }

    /// The records every client of a write-heavy run inserts have distinct keys, also from the loaded records'.
    #[test]
    fn inserted_keys_are_unique_across_clients() {
        use super::super::data::key_bytes;
        let (records, clients) = (1000u64, 8u64);
        let mut keys = HashSet::new();
        let mut k = Vec::new();
        for id in 0..records {
            key_bytes(id, 8, &mut k).unwrap();
            assert!(keys.insert(k.clone()));
        }
        let mut inserts = 0;
        for client in 0..clients {
            let mut g = OpGenerator::for_client(
                Workload::InsertOnly,
                Distribution::Uniform,
                records,
                3,
                client,
                clients,
            )
            .unwrap();
            for _ in 0..2000 {
                let op = g.next();
                assert_eq!(op.kind, OpKind::Insert);
                key_bytes(op.key_id, 8, &mut k).unwrap();
                assert!(keys.insert(k.clone()), "client {client} repeats {op:?}");
                inserts += 1;
            }
        }
        assert_eq!(keys.len() as u64, records + inserts);
    }

    #[test]
    fn load_shares_cover_the_records_once() {
        for (records, clients) in [(0u64, 1u64), (10, 3), (1000, 7), (5, 8), (u64::MAX, 3)] {
            let mut next = 0u64;
            let mut lens = Vec::new();
            for c in 0..clients {
                let share = load_ids(records, c, clients).unwrap();
                assert_eq!(share.start, next);
                next = share.end;
                lens.push(share.end - share.start);
            }
            assert_eq!(next, records);
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
        }
        assert_eq!(
            load_ids(10, 0, 1).unwrap().collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        assert!(load_ids(10, 1, 1).is_err());
        assert!(load_ids(10, 0, 0).is_err());
    }
}
