//! Every baseline under concurrent clients, checked for linearizability: clients each with a compute-node client of
//! their own read, upsert, insert, delete, increment and take (read and delete) a few keys at once, every operation
//! recorded with its invocation and response times; `dinomo-lincheck` then checks the history key by key. Reads
//! here are the stores' own (DirectDS under the key's lock, DirectDS-C lock-free with CRCs, CentralDS through the
//! coordinator's index, Clover along the version chain) and every conditional write is the store's atomic
//! read-modify-write (`PdpmStore::update`).

mod common;

use std::time::{Duration, Instant};

use anyhow::Result;
use common::{Central, Clover, Nodes};
use dinomo_lincheck::{CheckConfig, Op, Outcome, Recorder, Verdict, check};
use dinomo_pdpm::central::{CentralLayout, CentralSettings, CoordinatorConfig};
use dinomo_pdpm::clover::{CloverLayout, CloverSettings, MetadataConfig};
use dinomo_pdpm::direct::{self, DirectClient, DirectLayout, DirectSettings, Flavor};
use dinomo_pdpm::{Change, FailureKind, PdpmError, PdpmStore};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const CLIENTS: u32 = 4;
const KEYS: u32 = 3;
/// Operations per client, and the time they may take at most.
const OPS: u64 = 1_500;
const TIME: Duration = Duration::from_secs(8);

fn key(i: u32) -> Vec<u8> {
    format!("key{i}").into_bytes()
}

/// Runs one operation on `store` and returns its outcome, or the error and whether the operation was a write.
fn run(store: &mut dyn PdpmStore, op: &Op) -> Result<Outcome, PdpmError> {
    Ok(match op {
        Op::Get(k) => Outcome::Value(store.get(k)?),
        Op::Set(k, v) => {
            store.put(k, v)?;
            Outcome::Ok
        }
        Op::Insert(k, v) | Op::Update(k, v) => {
            let want_present = matches!(op, Op::Update(..));
            let mut applied = false;
            store.update(k, &mut |old| {
                applied = old.is_some() == want_present;
                if applied {
                    Change::Put(v.clone())
                } else {
                    Change::Keep
                }
            })?;
            Outcome::Applied(applied)
        }
        Op::Delete(k) => {
            let mut had = false;
            store.update(k, &mut |old| {
                had = old.is_some();
                if had { Change::Delete } else { Change::Keep }
            })?;
            Outcome::Applied(had)
        }
        Op::Take(k) => {
            let mut had = None;
            store.update(k, &mut |old| {
                had = old.map(<[u8]>::to_vec);
                if had.is_some() {
                    Change::Delete
                } else {
                    Change::Keep
                }
            })?;
            Outcome::Value(had)
        }
        Op::Incr(k, delta) => {
            let mut sum = None;
            store.update(k, &mut |old| {
                sum = dinomo_value::increment(old, *delta).ok();
                match sum {
                    Some(n) => Change::Put(n.to_string().into_bytes()),
                    None => Change::Keep,
                }
            })?;
            sum.map_or(Outcome::Error, Outcome::Int)
        }
    })
}

/// A random operation of client `client`'s `n`th step: values name their writer, so no two writes are alike.
fn draw(rng: &mut StdRng, client: u32, n: u64) -> Op {
    let k = key(rng.random_range(0..KEYS));
    let value = format!("c{client}-{n}").into_bytes();
    match rng.random_range(0..12u32) {
        0..=3 => Op::Get(k),
        4..=5 => Op::Set(k, value),
        6 => Op::Insert(k, value),
        7 => Op::Update(k, value),
        8 => Op::Delete(k),
        9 => Op::Take(k),
        _ => Op::Incr(k, rng.random_range(-2..5)),
    }
}

/// `CLIENTS` clients from `connect` run random operations at once; the recorded history must be linearizable.
fn assert_linearizable<C: PdpmStore>(system: &str, connect: impl Fn() -> C + Sync) -> Result<()> {
    let rec = Recorder::new();
    let ops: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let (rec, connect) = (&rec, &connect);
                scope.spawn(move || {
                    let mut store = connect();
                    let mut rng = StdRng::seed_from_u64(0x11ea + u64::from(client));
                    let started = Instant::now();
                    let mut n = 0;
                    while n < OPS && started.elapsed() < TIME {
                        let op = draw(&mut rng, client, n);
                        let ticket = rec.invoke(client, op.clone());
                        match run(&mut store, &op) {
                            Ok(outcome) => rec.complete(ticket, outcome),
                            Err(e) => match e.kind(!matches!(op, Op::Get(_))) {
                                FailureKind::NotApplied | FailureKind::OutOfSpace => {
                                    rec.not_applied(ticket)
                                }
                                FailureKind::Indeterminate => rec.unknown(ticket),
                                FailureKind::Invalid => panic!("{system}: {op} refused: {e}"),
                            },
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    eprintln!("{system}: {ops} operations recorded");
    assert!(
        ops >= u64::from(CLIENTS) * 100,
        "{system}: only {ops} operations ran"
    );
    match check(&rec.history(), &CheckConfig::default())? {
        Verdict::Linearizable => Ok(()),
        other => {
            let path = std::env::temp_dir().join(format!("{system}-nonlinearizable-history.json"));
            let _ = rec.history().save(&path);
            panic!("{system}: {other:?} (history saved to {})", path.display())
        }
    }
}

fn direct(flavor: Flavor, replication: u32, tcp: bool) -> Result<()> {
    let layout = DirectLayout {
        flavor,
        slots: 64,
        max_key: 32,
        max_value: 64,
        replication,
    };
    let nodes = Nodes::new(replication as usize, |pool| {
        direct::format(pool, &layout).unwrap()
    });
    let name = format!(
        "{flavor:?}-r{replication}-{}",
        if tcp { "tcp" } else { "in-process" }
    );
    assert_linearizable(&name, || {
        DirectClient::connect(&nodes.connectors(tcp), DirectSettings::default()).unwrap()
    })
}

#[test]
fn directds_histories_are_linearizable() -> Result<()> {
    direct(Flavor::Markers, 1, false)?;
    direct(Flavor::Markers, 2, true)
}

#[test]
fn directds_c_histories_are_linearizable() -> Result<()> {
    direct(Flavor::Crc, 1, false)?;
    direct(Flavor::Crc, 2, true)
}

#[test]
fn centralds_histories_are_linearizable() -> Result<()> {
    let layout = CentralLayout {
        blocks: 4096,
        max_key: 32,
        max_value: 64,
    };
    for tcp in [false, true] {
        let central = Central::new(2, &layout, CoordinatorConfig::default(), 4);
        assert_linearizable(&format!("centralds-tcp-{tcp}"), || {
            central.client(tcp, CentralSettings::default())
        })?;
    }
    Ok(())
}

#[test]
fn clover_histories_are_linearizable() -> Result<()> {
    for (replication, tcp) in [(1, false), (2, true)] {
        let layout = CloverLayout {
            cells: 64,
            slots: 8192,
            max_key: 32,
            max_value: 64,
            replication,
        };
        // A short reclaim lease: superseded versions go back to the writers while readers still walk the chains.
        let config = MetadataConfig {
            reclaim_lease: Duration::from_millis(20),
            ..MetadataConfig::default()
        };
        let clover = Clover::new(2, &layout, config);
        assert_linearizable(&format!("clover-r{replication}-tcp-{tcp}"), || {
            // A read gives up on a chain walk after 10 ms, within half the lease, as Clover requires.
            let settings = CloverSettings {
                read_timeout: Duration::from_millis(10),
                ..CloverSettings::default()
            };
            clover.client(tcp, settings)
        })?;
    }
    Ok(())
}
