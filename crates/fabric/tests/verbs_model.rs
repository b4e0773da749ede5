//! Any sequence of verbs gives the same results on the in-process and TCP transports as on a plain byte-array model,
//! and CAS/FAA stay atomic under many concurrent clients on both.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::Harness;
use dinomo_fabric::{Batch, DATA_REGION, FabricError, RemoteAddr, VerbError, VerbKind, counters};
use proptest::prelude::*;

/// The model: the data region as a byte array, with the node's rules.
struct Model {
    bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
enum Op {
    Read {
        off: u64,
        len: u32,
    },
    Write {
        off: u64,
        data: Vec<u8>,
    },
    Cas {
        word: u64,
        expected_from_model: bool,
        expected: u64,
        new: u64,
    },
    Faa {
        word: u64,
        add: u64,
    },
    /// Misaligned atomic: always refused.
    BadAtomic {
        off: u64,
    },
    /// Past the end of the region: always refused.
    OutOfBounds {
        past: u64,
        len: u32,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Data(Vec<u8>),
    Old(u64),
    Done,
    Refused(VerbError),
}

const REGION_BYTES: u64 = 64 * 1024;

fn read_op() -> impl Strategy<Value = Op> {
    (0..REGION_BYTES - 1, 0u32..600).prop_map(|(off, len)| Op::Read {
        off: off.min(REGION_BYTES - len as u64),
        len,
    })
}

fn write_op() -> impl Strategy<Value = Op> {
    (
        0..REGION_BYTES - 1,
        proptest::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(off, data)| Op::Write {
            off: off.min(REGION_BYTES - data.len() as u64),
            data,
        })
}

fn cas_op() -> impl Strategy<Value = Op> {
    (
        0..REGION_BYTES / 8,
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(w, e, x, n)| Op::Cas {
            word: w % 64,
            expected_from_model: e,
            expected: x,
            new: n,
        })
}

fn faa_op() -> impl Strategy<Value = Op> {
    (0..64u64, any::<u64>()).prop_map(|(w, add)| Op::Faa { word: w, add })
}

fn bad_atomic_op() -> impl Strategy<Value = Op> {
    (0..REGION_BYTES / 8).prop_map(|w| Op::BadAtomic { off: w * 8 + 3 })
}

fn out_of_bounds_op() -> impl Strategy<Value = Op> {
    (0..4096u64, 1u32..64).prop_map(|(past, len)| Op::OutOfBounds { past, len })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        read_op(),
        write_op(),
        cas_op(),
        faa_op(),
        bad_atomic_op(),
        out_of_bounds_op(),
    ]
}

/// Ops of one verb kind only, refusals of that kind included (out-of-bounds READs, misaligned FAAs): batches of one
/// kind run the in-process executor's per-kind loops.
fn one_kind_ops() -> impl Strategy<Value = Vec<Op>> {
    let len = 1..80;
    prop_oneof![
        proptest::collection::vec(
            prop_oneof![4 => read_op(), 1 => out_of_bounds_op()],
            len.clone()
        ),
        proptest::collection::vec(write_op(), len.clone()),
        proptest::collection::vec(cas_op(), len.clone()),
        proptest::collection::vec(prop_oneof![4 => faa_op(), 1 => bad_atomic_op()], len),
    ]
}

impl Model {
    fn word(&self, off: u64) -> u64 {
        u64::from_le_bytes(
            self.bytes[off as usize..off as usize + 8]
                .try_into()
                .unwrap(),
        )
    }
    fn set_word(&mut self, off: u64, v: u64) {
        self.bytes[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// Resolves the expected value a CAS should use, so roughly half of them succeed.
    fn resolve(&self, op: &Op) -> Op {
        match op {
            Op::Cas {
                word,
                expected_from_model: true,
                new,
                ..
            } => Op::Cas {
                word: *word,
                expected_from_model: true,
                expected: self.word(word * 8),
                new: *new,
            },
            o => o.clone(),
        }
    }
    fn apply(&mut self, op: &Op, region_len: u64) -> Outcome {
        match op {
            Op::Read { off, len } => {
                Outcome::Data(self.bytes[*off as usize..(*off + *len as u64) as usize].to_vec())
            }
            Op::Write { off, data } => {
                self.bytes[*off as usize..*off as usize + data.len()].copy_from_slice(data);
                Outcome::Done
            }
            Op::Cas {
                word,
                expected,
                new,
                ..
            } => {
                let old = self.word(word * 8);
                if old == *expected {
                    self.set_word(word * 8, *new);
                }
                Outcome::Old(old)
            }
            Op::Faa { word, add } => {
                let old = self.word(word * 8);
                self.set_word(word * 8, old.wrapping_add(*add));
                Outcome::Old(old)
            }
            Op::BadAtomic { .. } => Outcome::Refused(VerbError::Misaligned),
            Op::OutOfBounds { past, len } => {
                let _ = (past, len, region_len);
                Outcome::Refused(VerbError::OutOfBounds)
            }
        }
    }
}

/// Where an op goes: inside the test window at the start of the region, or across/after the region's real end.
fn addr(base: RemoteAddr, region_start: u64, region_len: u64, op: &Op) -> RemoteAddr {
    let off = match op {
        Op::Read { off, .. } | Op::Write { off, .. } => *off,
        Op::Cas { word, .. } | Op::Faa { word, .. } => word * 8,
        Op::BadAtomic { off } => *off,
        Op::OutOfBounds { past, len } => region_len - (*len as u64 / 2) + past,
    };
    RemoteAddr {
        offset: region_start + off,
        ..base
    }
}

fn run_single(ep: &mut dinomo_fabric::Endpoint, a: RemoteAddr, op: &Op) -> Outcome {
    let refused = |e: FabricError| match e {
        FabricError::Verb { error, .. } => Outcome::Refused(error),
        other => panic!("transport failure: {other}"),
    };
    match op {
        Op::Read { len, .. } => {
            let mut buf = vec![0u8; *len as usize];
            ep.read(a, &mut buf)
                .map(|()| Outcome::Data(buf))
                .unwrap_or_else(refused)
        }
        Op::Write { data, .. } => ep
            .write(a, data)
            .map(|()| Outcome::Done)
            .unwrap_or_else(refused),
        Op::Cas { expected, new, .. } => ep
            .cas(a, *expected, *new)
            .map(Outcome::Old)
            .unwrap_or_else(refused),
        Op::Faa { add, .. } => ep.faa(a, *add).map(Outcome::Old).unwrap_or_else(refused),
        Op::BadAtomic { .. } => ep.faa(a, 1).map(Outcome::Old).unwrap_or_else(refused),
        Op::OutOfBounds { len, .. } => {
            let mut buf = vec![0u8; *len as usize];
            ep.read(a, &mut buf)
                .map(|()| Outcome::Data(buf))
                .unwrap_or_else(refused)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Single verbs and batches on both transports agree with the model, op by op.
    #[test]
    fn transports_agree_with_the_byte_array_model(
        ops in prop_oneof![proptest::collection::vec(op_strategy(), 1..80), one_kind_ops()],
        batch_sizes in proptest::collection::vec(1usize..20, 1..10),
    ) {
        // Confine the test to the first REGION_BYTES of the data region, seen as a whole region by the model:
        // out-of-bounds ops target the real end of the region.
        let h = Harness::new(1 << 21, 1 << 16);
        for tcp in [false, true] {
            let mut ep = h.connect(tcp);
            let region = ep.region(DATA_REGION).unwrap().clone();
            // Start from a zeroed window.
            ep.write(region.at(region.start), &vec![0u8; REGION_BYTES as usize]).unwrap();
            let mut model = Model { bytes: vec![0; REGION_BYTES as usize] };
            let base = region.at(0);
            let region_len = region.len;
            let start = region.start;
            let oob_addr = |op: &Op| addr(base, start, region_len, op);
            // Single verbs.
            for op in &ops {
                let op = model.resolve(op);
                let expect = model.apply(&op, region_len);
                let got = run_single(&mut ep, oob_addr(&op), &op);
                prop_assert_eq!(got, expect, "tcp={} op={:?}", tcp, op);
            }
            // The same ops again, in batches: results agree and a refusal skips the rest of its batch. WRITEs alternate
            // between borrowed and copied payloads, and one batch's buffers serve every round.
            let mut spare = Batch::new();
            let mut i = 0;
            for &size in batch_sizes.iter().cycle() {
                if i >= ops.len() { break; }
                let chunk: Vec<Op> = ops[i..(i + size).min(ops.len())].iter().map(|o| model.resolve(o)).collect();
                i += chunk.len();
                let mut batch = std::mem::take(&mut spare).reuse();
                let slots: Vec<_> = chunk.iter().enumerate().map(|(k, op)| {
                    let a = oob_addr(op);
                    match op {
                        Op::Read { len, .. } => batch.read(a, *len),
                        Op::Write { data, .. } if k % 2 == 0 => batch.write(a, data),
                        Op::Write { data, .. } => batch.write_copy(a, data),
                        Op::Cas { expected, new, .. } => batch.cas(a, *expected, *new),
                        Op::Faa { add, .. } => batch.faa(a, *add),
                        Op::BadAtomic { .. } => batch.faa(a, 1),
                        Op::OutOfBounds { len, .. } => batch.read(a, *len),
                    }
                }).collect();
                let before = counters::thread_snapshot();
                let r = ep.post(&mut batch);
                prop_assert_eq!((counters::thread_snapshot() - before).round_trips, 1);
                let mut failed_at = None;
                for (k, (op, slot)) in chunk.iter().zip(&slots).enumerate() {
                    if failed_at.is_some() {
                        prop_assert_eq!(batch.status(*slot), Err(VerbError::Skipped));
                        continue;
                    }
                    let expect = model.apply(op, region_len);
                    let got = match batch.status(*slot) {
                        Err(e) => { failed_at = Some(k); Outcome::Refused(e) }
                        Ok(()) => match op {
                            Op::Read { .. } | Op::OutOfBounds { .. } => Outcome::Data(batch.read_data(*slot).to_vec()),
                            Op::Write { .. } => Outcome::Done,
                            _ => Outcome::Old(batch.old_value(*slot)),
                        },
                    };
                    prop_assert_eq!(got, expect, "tcp={} batched op={:?}", tcp, op);
                }
                match (failed_at, r) {
                    (None, Ok(())) => {}
                    (Some(k), Err(FabricError::Verb { index, .. })) => prop_assert_eq!(index, k),
                    (f, r) => prop_assert!(false, "batch result {:?} with failure at {:?}", r, f),
                }
                spare = batch.reuse();
            }
            // And the memory itself matches the model.
            let mut image = vec![0u8; REGION_BYTES as usize];
            h.node.pool().read(region.start, &mut image).unwrap();
            prop_assert!(image == model.bytes, "memory differs from the model (tcp={})", tcp);
        }
    }
}

fn hammer(tcp: bool, threads: usize, per_thread: u64) {
    let h = Harness::new(1 << 21, 1 << 16);
    let connector = h.connector(tcp);
    let region = h.connect(tcp).region(DATA_REGION).unwrap().clone();
    let faa_word = region.at(region.start + 64);
    let cas_word = region.at(region.start + 128);
    let cas_retries = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let c = connector.clone();
            let retries = &cas_retries;
            s.spawn(move || {
                let mut ep = c.connect().unwrap();
                for _ in 0..per_thread {
                    ep.faa(faa_word, 1).unwrap();
                    // CAS increment loop.
                    let mut seen = 0;
                    loop {
                        let old = ep.cas(cas_word, seen, seen + 1).unwrap();
                        if old == seen {
                            break;
                        }
                        retries.fetch_add(1, Ordering::Relaxed);
                        seen = old;
                    }
                }
            });
        }
    });
    let mut ep = h.connect(tcp);
    let mut b = [0u8; 8];
    ep.read(faa_word, &mut b).unwrap();
    assert_eq!(
        u64::from_le_bytes(b),
        threads as u64 * per_thread,
        "FAA lost updates (tcp={tcp})"
    );
    ep.read(cas_word, &mut b).unwrap();
    assert_eq!(
        u64::from_le_bytes(b),
        threads as u64 * per_thread,
        "CAS lost updates (tcp={tcp})"
    );
}

#[test]
fn faa_and_cas_are_atomic_in_process() {
    hammer(false, 8, 20_000);
}

#[test]
fn faa_and_cas_are_atomic_over_tcp() {
    hammer(true, 8, 2_000);
}

/// A lock taken with CAS and released with an 8-byte WRITE of zero (as the pDPM baselines do), guarding a counter
/// read and written with plain verbs: a WRITE stores each byte once, so a release never undoes the CAS that takes
/// the lock next, and no increment is lost.
fn lock_with_cas_release_with_write(tcp: bool, threads: usize, per_thread: u64) {
    let h = Harness::new(1 << 21, 1 << 16);
    let connector = h.connector(tcp);
    let region = h.connect(tcp).region(DATA_REGION).unwrap().clone();
    let lock = region.at(region.start + 64);
    let counter = region.at(region.start + 128);
    std::thread::scope(|s| {
        for id in 1..=threads as u64 {
            let c = connector.clone();
            s.spawn(move || {
                let mut ep = c.connect().unwrap();
                let mut b = [0u8; 8];
                for _ in 0..per_thread {
                    while ep.cas(lock, 0, id).unwrap() != 0 {
                        std::thread::yield_now();
                    }
                    ep.read(counter, &mut b).unwrap();
                    ep.write(counter, &(u64::from_le_bytes(b) + 1).to_le_bytes())
                        .unwrap();
                    ep.write(lock, &0u64.to_le_bytes()).unwrap();
                }
            });
        }
    });
    let mut b = [0u8; 8];
    h.connect(tcp).read(counter, &mut b).unwrap();
    assert_eq!(
        u64::from_le_bytes(b),
        threads as u64 * per_thread,
        "increments lost under the lock (tcp={tcp})"
    );
}

#[test]
fn a_write_releasing_a_lock_never_undoes_the_next_cas_in_process() {
    lock_with_cas_release_with_write(false, 4, 20_000);
}

#[test]
fn a_write_releasing_a_lock_never_undoes_the_next_cas_over_tcp() {
    lock_with_cas_release_with_write(true, 4, 1_000);
}

#[test]
fn counters_count_verbs_bytes_and_round_trips() {
    let h = Harness::new(1 << 21, 1 << 16);
    for tcp in [false, true] {
        let mut ep = h.connect(tcp);
        let r = ep.region(DATA_REGION).unwrap().clone();
        let before = counters::thread_snapshot();
        ep.write(r.at(r.start), &[1u8; 100]).unwrap();
        ep.read(r.at(r.start), &mut [0u8; 100]).unwrap();
        ep.faa(r.at(r.start + 8), 1).unwrap();
        let mut batch = Batch::new();
        for i in 0..16 {
            batch.read(r.at(r.start + i * 8), 8);
        }
        ep.post(&mut batch).unwrap();
        let d = counters::thread_snapshot() - before;
        assert_eq!(d.round_trips, 4, "tcp={tcp}");
        assert_eq!((d.reads, d.writes, d.faa, d.cas), (17, 1, 1, 0));
        let (o1, i1) = dinomo_fabric::wire::verb_bytes(VerbKind::Write, 100);
        let (o2, i2) = dinomo_fabric::wire::verb_bytes(VerbKind::Read, 100);
        let (o3, i3) = dinomo_fabric::wire::verb_bytes(VerbKind::Faa, 8);
        let (o4, i4) = dinomo_fabric::wire::verb_bytes(VerbKind::Read, 8);
        assert_eq!(d.bytes_out, o1 + o2 + o3 + 16 * o4);
        assert_eq!(d.bytes_in, i1 + i2 + i3 + 16 * i4);
    }
}
