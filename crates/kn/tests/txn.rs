//! Transactions over a node's workers (`Submitter::submit_txn`): isolated from every other request on their keys,
//! whichever workers the keys live on, and all or nothing when a part may not run.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use dinomo_kn::{
    Command, DataOp, EmbeddedConfig, KnConfig, KnError, Ownership, Reply, ReplySink, Tagged,
    thread_for_key,
};

const WAIT: Duration = Duration::from_secs(5);

/// Sends each reply to a channel.
struct ToChannel(Sender<Tagged>);

impl ReplySink for ToChannel {
    fn deliver(&self, tag: u64, reply: Result<Reply, KnError>) -> bool {
        self.0.send((tag, reply)).is_ok()
    }
}

fn store(threads: usize) -> anyhow::Result<dinomo_kn::Embedded> {
    Ok(dinomo_kn::Embedded::open(&EmbeddedConfig {
        pool_size: 64 << 20,
        kn: KnConfig {
            threads,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    })?)
}

/// Runs `ops` as one transaction; their results in order.
fn transaction(submitter: &dinomo_kn::Submitter, ops: Vec<DataOp>) -> Vec<Result<Reply, KnError>> {
    let (tx, rx): (Sender<Tagged>, Receiver<Tagged>) = unbounded();
    let n = ops.len();
    let sink: Arc<dyn ReplySink> = Arc::new(ToChannel(tx.clone()));
    submitter.submit_txn(
        ops.into_iter()
            .enumerate()
            .map(|(i, op)| (i as u64, op))
            .collect(),
        WAIT,
        sink,
        |tag, e| {
            let _ = tx.send((tag, Err(e)));
        },
    );
    let mut results: Vec<Option<Result<Reply, KnError>>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (tag, r) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("every operation of a transaction is answered");
        assert!(
            results[tag as usize].is_none(),
            "operation {tag} answered twice"
        );
        results[tag as usize] = Some(r);
    }
    results.into_iter().map(Option::unwrap).collect()
}

/// `count` keys named `prefix<i>`, each on a different worker of `threads`.
fn keys_on_different_workers(prefix: &str, count: usize, threads: usize) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut workers = Vec::new();
    for i in 0.. {
        let key = format!("{prefix}{i}").into_bytes();
        let w = thread_for_key(&key, threads);
        if !workers.contains(&w) {
            workers.push(w);
            keys.push(key);
            if keys.len() == count {
                break;
            }
        }
    }
    keys
}

/// The replies of a transaction every operation of which succeeded.
fn replies(results: Vec<Result<Reply, KnError>>) -> Vec<Reply> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("an operation failed: {e}")))
        .collect()
}

fn int(r: &Result<Reply, KnError>) -> i64 {
    match r {
        Ok(Reply::Int(n)) => *n,
        Ok(Reply::Value(Some(v))) => std::str::from_utf8(v).unwrap().parse().unwrap(),
        other => panic!("expected a number, got {other:?}"),
    }
}

/// Three accounts on three workers; clients move amounts between them in transactions while others read all three
/// in transactions. Every read must see the total unchanged: no transfer is seen half done.
#[test]
fn transfers_across_workers_are_never_seen_half_done() -> anyhow::Result<()> {
    const THREADS: usize = 3;
    const TOTAL: i64 = 3000;
    let kv = store(THREADS)?;
    let accounts = keys_on_different_workers("account-", 3, THREADS);
    let submitter = kv.submitter();
    for a in &accounts {
        let r = transaction(&submitter, vec![DataOp::Set(a.clone(), b"1000".to_vec())]);
        assert_eq!(replies(r), vec![Reply::Applied(true)]);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let movers: Vec<_> = (0..3)
        .map(|t| {
            let (submitter, accounts) = (submitter.clone(), accounts.clone());
            std::thread::spawn(move || {
                for i in 0..300i64 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let (from, to) = (
                        &accounts[(t + i as usize) % 3],
                        &accounts[(t + 1 + i as usize) % 3],
                    );
                    let amount = 1 + (i % 7);
                    let r = transaction(
                        &submitter,
                        vec![
                            DataOp::Incr(from.clone(), -amount),
                            DataOp::Incr(to.clone(), amount),
                        ],
                    );
                    assert!(r.iter().all(|r| matches!(r, Ok(Reply::Int(_)))), "{r:?}");
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (submitter, accounts) = (submitter.clone(), accounts.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                for _ in 0..400 {
                    if Instant::now() > deadline {
                        break;
                    }
                    let r = transaction(
                        &submitter,
                        accounts.iter().map(|a| DataOp::Get(a.clone())).collect(),
                    );
                    let sum: i64 = r.iter().map(int).sum();
                    assert_eq!(sum, TOTAL, "a transaction read a transfer half done: {r:?}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for m in movers {
        m.join().expect("mover");
    }
    for r in readers {
        assert!(r.join().expect("reader") > 0);
    }
    let r = transaction(
        &submitter,
        accounts.iter().map(|a| DataOp::Get(a.clone())).collect(),
    );
    assert_eq!(r.iter().map(int).sum::<i64>(), TOTAL);
    Ok(())
}

/// Owns every key but `foreign`.
struct AllBut(&'static [u8]);

impl Ownership for AllBut {
    fn epoch(&self) -> u64 {
        7
    }
    fn owns(&self, key: &[u8]) -> bool {
        key != self.0
    }
}

#[test]
fn a_transaction_with_a_key_the_node_does_not_own_applies_nothing() -> anyhow::Result<()> {
    const THREADS: usize = 2;
    let kv = store(THREADS)?;
    let submitter = kv.submitter();
    let own: Arc<dyn Ownership> = Arc::new(AllBut(b"foreign"));
    let (tx, rx) = unbounded();
    submitter.broadcast(|| Command::Own(own.clone()), 0, &tx)?;
    for _ in 0..THREADS {
        assert!(rx.recv()?.1.is_ok());
    }
    // Keys on both workers, then the key owned elsewhere: the writes before it must not apply either.
    let mut keys = keys_on_different_workers("mine-", THREADS, THREADS);
    keys.push(b"foreign".to_vec());
    let r = transaction(
        &submitter,
        keys.iter()
            .map(|k| DataOp::Set(k.clone(), b"v".to_vec()))
            .collect(),
    );
    for result in &r {
        match result {
            Err(KnError::TxnAborted(reason)) => {
                assert!(reason.contains("not this node's"), "{reason}")
            }
            other => panic!("expected the transaction to abort, got {other:?}"),
        }
    }
    let r = transaction(
        &submitter,
        keys[..THREADS]
            .iter()
            .map(|k| DataOp::Get(k.clone()))
            .collect(),
    );
    assert!(replies(r).iter().all(|r| *r == Reply::Value(None)));
    Ok(())
}

#[test]
fn a_transaction_reads_its_own_writes_in_order_and_reports_each_operations_error()
-> anyhow::Result<()> {
    let kv = store(2)?;
    let submitter = kv.submitter();
    let r = transaction(
        &submitter,
        vec![
            DataOp::Set(b"k".to_vec(), b"10".to_vec()),
            DataOp::Incr(b"k".to_vec(), 5),
            DataOp::Set(b"text".to_vec(), b"abc".to_vec()),
            // An operation's own failure fails it alone, as in Redis: the rest of the transaction runs.
            DataOp::Incr(b"text".to_vec(), 1),
            DataOp::Get(b"k".to_vec()),
            DataOp::Append(b"text".to_vec(), b"d".to_vec()),
        ],
    );
    assert!(matches!(r[3], Err(KnError::NotAnInteger)), "{:?}", r[3]);
    let mut r = r;
    let _ = r.remove(3);
    assert_eq!(
        replies(r),
        vec![
            Reply::Applied(true),
            Reply::Int(15),
            Reply::Applied(true),
            Reply::Value(Some(b"15".to_vec())),
            Reply::Int(4),
        ]
    );
    Ok(())
}

#[test]
fn a_transaction_on_a_stopped_node_answers_every_operation() -> anyhow::Result<()> {
    let kv = store(2)?;
    let submitter = kv.submitter();
    drop(kv);
    let keys = keys_on_different_workers("gone-", 2, 2);
    let r = transaction(
        &submitter,
        keys.iter().map(|k| DataOp::Get(k.clone())).collect(),
    );
    assert!(r.iter().all(|r| r.is_err()), "{r:?}");
    Ok(())
}

#[test]
fn two_handles_on_one_node_make_one_part_per_worker() -> anyhow::Result<()> {
    let kv = store(2)?;
    let (a, b) = (kv.submitter(), kv.submitter());
    let keys = keys_on_different_workers("handles-", 2, 2);
    let (tx, rx) = unbounded();
    let sink: Arc<dyn ReplySink> = Arc::new(ToChannel(tx));
    let started = Instant::now();
    // The same worker's keys through both handles: one part each worker, not one per handle, or the parts of one
    // worker would wait for each other until the wait ran out.
    dinomo_kn::submit_txn(
        vec![
            (&a, vec![(0, DataOp::Set(keys[0].clone(), b"1".to_vec()))]),
            (
                &b,
                vec![
                    (1, DataOp::Incr(keys[0].clone(), 1)),
                    (2, DataOp::Set(keys[1].clone(), b"x".to_vec())),
                ],
            ),
        ],
        WAIT,
        sink,
        |tag, e| panic!("operation {tag} not queued: {e}"),
    );
    let mut got: Vec<(u64, Reply)> = (0..3)
        .map(|_| {
            let (tag, r) = rx.recv_timeout(Duration::from_secs(30)).expect("a reply");
            (
                tag,
                r.unwrap_or_else(|e| panic!("operation {tag} failed: {e}")),
            )
        })
        .collect();
    got.sort_by_key(|(tag, _)| *tag);
    assert_eq!(
        got,
        vec![
            (0, Reply::Applied(true)),
            (1, Reply::Int(2)),
            (2, Reply::Applied(true))
        ]
    );
    assert!(started.elapsed() < WAIT, "the parts waited for each other");
    Ok(())
}

#[test]
fn a_transaction_whose_watched_key_changed_applies_nothing() -> anyhow::Result<()> {
    let kv = store(2)?;
    let submitter = kv.submitter();
    let keys = keys_on_different_workers("watched-", 2, 2);
    let digest = |v: &[u8]| dinomo_value::digest(Some(v));
    transaction(
        &submitter,
        vec![DataOp::Set(keys[0].clone(), b"old".to_vec())],
    );
    // The watched key is on the other worker from the write: its part says no, so neither part runs.
    let r = transaction(
        &submitter,
        vec![
            DataOp::Set(keys[1].clone(), b"written".to_vec()),
            DataOp::Unchanged(keys[0].clone(), digest(b"older")),
        ],
    );
    assert!(
        r.iter().all(|r| matches!(r, Err(KnError::TxnChanged))),
        "{r:?}"
    );
    let r = transaction(&submitter, vec![DataOp::Get(keys[1].clone())]);
    assert_eq!(replies(r), vec![Reply::Value(None)]);
    // Still as watched: it runs, and the check answers that it held.
    let r = transaction(
        &submitter,
        vec![
            DataOp::Set(keys[1].clone(), b"written".to_vec()),
            DataOp::Unchanged(keys[0].clone(), digest(b"old")),
            DataOp::Unchanged(b"never-written".to_vec(), None),
        ],
    );
    assert_eq!(
        replies(r),
        vec![
            Reply::Applied(true),
            Reply::Applied(true),
            Reply::Applied(true)
        ]
    );
    Ok(())
}
