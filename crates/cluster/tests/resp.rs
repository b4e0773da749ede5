//! The Redis protocol on a cluster's KV nodes: any node serves any key (the ones it does not own are
//! forwarded), multi-key commands span nodes, DBSIZE counts the whole cluster, read-modify-writes stay atomic
//! when clients hit different nodes, and pipelines keep their per-key order while ownership moves.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use dinomo_cluster::LocalCluster;
use dinomo_resp::encode_request;
use dinomo_resp::value::{Value, ValueLimits};

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// No test here kills a node, so leases are long: a machine loaded by other work must not make a node miss
/// its heartbeats and fence itself mid-test. The cluster has a token, so forwarding (and the M-node's installs
/// when nodes join and leave) present it on the native protocol.
fn cluster(kns: usize) -> anyhow::Result<LocalCluster> {
    Ok(LocalCluster::start(cluster_config(kns))?)
}

/// A cluster whose nodes each run `loops` RESP event loops: a node's connections are dealt round robin to its
/// loops, so clients of one node run on different loops.
fn cluster_with_loops(kns: usize, loops: usize) -> anyhow::Result<LocalCluster> {
    let mut cfg = cluster_config(kns);
    cfg.node.resp.io_threads = loops;
    Ok(LocalCluster::start(cfg)?)
}

fn cluster_config(kns: usize) -> dinomo_cluster::LocalClusterConfig {
    let mut cfg = common::small_cluster(kns);
    cfg.memory_node.cluster_token = "resp-test-token".into();
    cfg.node.lease_ttl = Duration::from_secs(5);
    cfg.node.heartbeat = Duration::from_millis(50);
    cfg.resp_listen = vec![any_port()];
    // Fewer forwarding clients than the tests' connections: they are shared.
    cfg.node.resp_forward_threads = 2;
    cfg
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut wire = Vec::new();
        encode_request(args, &mut wire);
        self.stream.write_all(&wire).unwrap();
    }

    fn read(&mut self) -> Value {
        loop {
            if let Some((v, used)) = Value::parse(&self.buf, &ValueLimits::default()).unwrap() {
                self.buf.drain(..used);
                return v;
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).expect("a reply");
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> Value {
        self.send(args);
        self.read()
    }
}

fn bulk(b: &[u8]) -> Value {
    Value::Bulk(b.to_vec())
}

fn ok() -> Value {
    Value::Simple(b"OK".to_vec())
}

fn resp_addrs(c: &LocalCluster) -> Vec<SocketAddr> {
    c.nodes()
        .iter()
        .map(|n| n.resp_addr().expect("RESP enabled"))
        .collect()
}

#[test]
fn any_node_serves_any_key() -> anyhow::Result<()> {
    let c = cluster(3)?;
    let addrs = resp_addrs(&c);
    let mut conns: Vec<Conn> = addrs.iter().map(|a| Conn::open(*a)).collect();
    let keys: Vec<Vec<u8>> = (0..60u32)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let routing = c.nodes()[0].routing();
    let owners: std::collections::BTreeSet<_> = keys
        .iter()
        .filter_map(|k| routing.ring.primary(k))
        .collect();
    assert_eq!(owners.len(), 3, "the keys are spread over every node");
    for (i, k) in keys.iter().enumerate() {
        let v = format!("value-{i}");
        assert_eq!(conns[i % 3].call(&[b"SET", k, v.as_bytes()]), ok());
    }
    for (i, k) in keys.iter().enumerate() {
        let v = format!("value-{i}");
        for conn in &mut conns {
            assert_eq!(conn.call(&[b"GET", k]), bulk(v.as_bytes()));
        }
    }
    // Multi-key commands over keys of every node.
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(Vec::as_slice));
    mget.push(b"missing");
    let Value::Array(values) = conns[1].call(&mget) else {
        panic!("MGET answers with an array")
    };
    assert_eq!(values.len(), keys.len() + 1);
    assert_eq!(values[7], bulk(b"value-7"));
    assert_eq!(values[keys.len()], Value::NullBulk);
    assert_eq!(conns[2].call(&[b"DBSIZE"]), Value::Integer(60));
    let mut del: Vec<&[u8]> = vec![b"DEL"];
    del.extend(keys[..30].iter().map(Vec::as_slice));
    del.push(b"missing");
    assert_eq!(conns[0].call(&del), Value::Integer(30));
    let mut exists: Vec<&[u8]> = vec![b"EXISTS"];
    exists.extend(keys.iter().map(Vec::as_slice));
    assert_eq!(conns[1].call(&exists), Value::Integer(30));
    for conn in &mut conns {
        assert_eq!(conn.call(&[b"DBSIZE"]), Value::Integer(30));
    }
    let mset: Vec<Vec<u8>> = std::iter::once(b"MSET".to_vec())
        .chain((0..20u32).flat_map(|i| [format!("m{i}").into_bytes(), format!("{i}").into_bytes()]))
        .collect();
    let mset: Vec<&[u8]> = mset.iter().map(Vec::as_slice).collect();
    assert_eq!(conns[2].call(&mset), ok());
    assert_eq!(conns[0].call(&[b"GET", b"m13"]), bulk(b"13"));
    assert_eq!(conns[0].call(&[b"DBSIZE"]), Value::Integer(50));
    // Errors of the store come back as errors, wherever the key lives.
    assert_eq!(conns[0].call(&[b"SET", b"text", b"abc"]), ok());
    for conn in &mut conns {
        assert_eq!(
            conn.call(&[b"INCR", b"text"]),
            Value::Error(b"ERR value is not an integer or out of range".to_vec())
        );
    }
    let too_big = vec![b'x'; (64 << 10) + 1];
    for conn in &mut conns {
        assert!(
            matches!(conn.call(&[b"SET", b"big", &too_big]), Value::Error(e) if e.starts_with(b"ERR value of"))
        );
    }
    Ok(())
}

#[test]
fn increments_from_every_node_are_atomic() -> anyhow::Result<()> {
    let c = cluster_with_loops(3, 2)?;
    let addrs = resp_addrs(&c);
    const PER_CLIENT: i64 = 300;
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let addr = addrs[t % addrs.len()];
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                // Pipelines of 10 increments of two counters, one of them shared by everybody.
                for _ in 0..PER_CLIENT / 10 {
                    let mut wire = Vec::new();
                    for _ in 0..10 {
                        encode_request(&[b"INCR".as_slice(), b"shared"], &mut wire);
                        encode_request(
                            &[b"INCRBY".as_slice(), format!("own-{t}").as_bytes(), b"2"],
                            &mut wire,
                        );
                    }
                    conn.stream.write_all(&wire).unwrap();
                    let mut last_own = 0;
                    for _ in 0..10 {
                        assert!(matches!(conn.read(), Value::Integer(_)));
                        let Value::Integer(own) = conn.read() else {
                            panic!("INCRBY answers with an integer")
                        };
                        assert!(
                            own > last_own,
                            "a pipeline's increments of one key apply in order"
                        );
                        last_own = own;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let mut conn = Conn::open(addrs[0]);
    assert_eq!(
        conn.call(&[b"GET", b"shared"]),
        bulk((6 * PER_CLIENT).to_string().as_bytes())
    );
    for t in 0..6 {
        assert_eq!(
            conn.call(&[b"GET", format!("own-{t}").as_bytes()]),
            bulk((2 * PER_CLIENT).to_string().as_bytes())
        );
    }
    Ok(())
}

#[test]
fn pipelines_keep_their_order_while_nodes_join_and_leave() -> anyhow::Result<()> {
    let mut c = cluster(2)?;
    let addr = resp_addrs(&c)[0];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || -> i64 {
            let mut conn = Conn::open(addr);
            let mut rounds = 0;
            // Bounded: at most 2,000 pipelines, and it stops once the reconfigurations are done.
            while rounds < 2000 && (rounds < 20 || !stop.load(std::sync::atomic::Ordering::Acquire))
            {
                // Each key is changed twice per pipeline: the second reply must follow the first.
                let mut wire = Vec::new();
                for k in 0..16 {
                    for op in [b"APPEND".as_slice(), b"APPEND"] {
                        encode_request(&[op, format!("log-{k}").as_bytes(), b"x"], &mut wire);
                    }
                    encode_request(
                        &[b"INCR".as_slice(), format!("count-{k}").as_bytes()],
                        &mut wire,
                    );
                }
                conn.stream.write_all(&wire).unwrap();
                for _ in 0..16 {
                    let replies = (conn.read(), conn.read(), conn.read());
                    let (Value::Integer(first), Value::Integer(second), Value::Integer(count)) =
                        replies
                    else {
                        panic!("APPEND and INCR answer with integers: {replies:?}");
                    };
                    assert_eq!(
                        (first, second),
                        (2 * rounds + 1, 2 * rounds + 2),
                        "a pipeline's writes of one key apply in order, once"
                    );
                    assert_eq!(count, rounds + 1);
                }
                rounds += 1;
            }
            rounds
        })
    };
    let added = c.add_node()?;
    c.remove_node(added)?;
    let added = c.add_node()?;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let rounds = writer.join().expect("writer");
    let mut conn = Conn::open(
        c.nodes()
            .iter()
            .find(|n| n.id() == added)
            .unwrap()
            .resp_addr()
            .unwrap(),
    );
    for k in 0..16 {
        assert_eq!(
            conn.call(&[b"GET", format!("count-{k}").as_bytes()]),
            bulk(rounds.to_string().as_bytes())
        );
        assert_eq!(
            conn.call(&[b"STRLEN", format!("log-{k}").as_bytes()]),
            Value::Integer(2 * rounds)
        );
    }
    Ok(())
}

/// The first key named `prefix-N` whose primary owner is `node`.
fn key_owned_by(c: &LocalCluster, node: dinomo_ring::NodeId, prefix: &str) -> Vec<u8> {
    let routing = c.nodes()[0].routing();
    (0..10_000)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .find(|k| routing.ring.primary(k) == Some(node))
        .expect("some key of every node")
}

fn err(text: &str) -> Value {
    Value::Error(text.as_bytes().to_vec())
}

#[test]
fn probes_and_increment_errors_answer_like_redis_here_and_forwarded() -> anyhow::Result<()> {
    let c = cluster(2)?;
    let addr = resp_addrs(&c)[0];
    let here = c.nodes()[0].id();
    let there = c.nodes()[1].id();
    let mut conn = Conn::open(addr);
    for owner in [here, there] {
        let k = key_owned_by(&c, owner, "probe");
        let absent = key_owned_by(&c, owner, "absent");
        // An empty value exists; an absent key does not; STRLEN of either is 0.
        assert_eq!(conn.call(&[b"SET", &k, b""]), ok());
        assert_eq!(conn.call(&[b"EXISTS", &k]), Value::Integer(1));
        assert_eq!(conn.call(&[b"STRLEN", &k]), Value::Integer(0));
        assert_eq!(conn.call(&[b"EXISTS", &absent]), Value::Integer(0));
        assert_eq!(conn.call(&[b"STRLEN", &absent]), Value::Integer(0));
        assert_eq!(conn.call(&[b"SET", &k, b"hello"]), ok());
        assert_eq!(conn.call(&[b"STRLEN", &k]), Value::Integer(5));
        assert_eq!(conn.call(&[b"EXISTS", &k, &absent, &k]), Value::Integer(2));

        // Overflow, either way, leaves the value as it was.
        let n = key_owned_by(&c, owner, "n");
        let max = i64::MAX.to_string();
        let min = i64::MIN.to_string();
        assert_eq!(conn.call(&[b"SET", &n, max.as_bytes()]), ok());
        let overflow = err("ERR increment or decrement would overflow");
        assert_eq!(conn.call(&[b"INCR", &n]), overflow);
        assert_eq!(conn.call(&[b"INCRBY", &n, b"5"]), overflow);
        assert_eq!(conn.call(&[b"GET", &n]), bulk(max.as_bytes()));
        assert_eq!(conn.call(&[b"SET", &n, min.as_bytes()]), ok());
        assert_eq!(conn.call(&[b"DECR", &n]), overflow);
        assert_eq!(conn.call(&[b"DECRBY", &n, b"1"]), overflow);
        assert_eq!(conn.call(&[b"GET", &n]), bulk(min.as_bytes()));
        assert_eq!(
            conn.call(&[b"INCRBY", &n, max.as_bytes()]),
            Value::Integer(-1)
        );
        // Not an integer: the stored value, or the argument.
        let not_int = err("ERR value is not an integer or out of range");
        assert_eq!(conn.call(&[b"INCR", &k]), not_int);
        assert_eq!(conn.call(&[b"INCRBY", &n, b"1.5"]), not_int);
        assert_eq!(conn.call(&[b"GET", &k]), bulk(b"hello"));
    }
    Ok(())
}

#[test]
fn a_pipeline_mixing_local_and_forwarded_keys_is_answered_in_order() -> anyhow::Result<()> {
    let c = cluster(2)?;
    let addr = resp_addrs(&c)[0];
    // One at a time: `nodes()` holds the cluster's lock while its guard lives.
    let here = c.nodes()[0].id();
    let there = c.nodes()[1].id();
    let routing = c.nodes()[0].routing();
    // Keys of both nodes, interleaved.
    let keys: Vec<Vec<u8>> = (0..60).map(|i| format!("mixed-{i}").into_bytes()).collect();
    let owners: std::collections::BTreeSet<_> = keys
        .iter()
        .filter_map(|k| routing.ring.primary(k))
        .collect();
    assert_eq!(owners, [here, there].into_iter().collect());
    let mut conn = Conn::open(addr);
    for round in 0..3 {
        // Every key several times in one pipeline, each command's reply depending on the ones before it on that
        // key, so a reply out of order or an operation applied out of order shows.
        let mut wire = Vec::new();
        let mut want = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let v = format!("{round}-{i}");
            let counter = [k.as_slice(), b"-n"].concat();
            let requests: [(Vec<&[u8]>, Value); 9] = [
                (vec![b"SET", k, v.as_bytes()], ok()),
                (vec![b"GET", k], bulk(v.as_bytes())),
                (vec![b"APPEND", k, b"+"], Value::Integer(v.len() as i64 + 1)),
                (vec![b"STRLEN", k], Value::Integer(v.len() as i64 + 1)),
                (vec![b"INCR", &counter], Value::Integer(round * 2 + 1)),
                (vec![b"INCR", &counter], Value::Integer(round * 2 + 2)),
                (vec![b"DEL", k], Value::Integer(1)),
                (vec![b"EXISTS", k], Value::Integer(0)),
                (vec![b"GET", k], Value::NullBulk),
            ];
            for (args, reply) in requests {
                encode_request(&args, &mut wire);
                want.push(reply);
            }
        }
        conn.stream.write_all(&wire)?;
        for (n, w) in want.iter().enumerate() {
            assert_eq!(&conn.read(), w, "reply {n} of round {round}");
        }
    }
    Ok(())
}

/// Clients pipelining reads and writes of a few keys at two nodes (each node serves some keys and forwards the
/// others): the recorded history is linearizable.
#[test]
fn pipelined_reads_and_writes_over_resp_are_linearizable() -> anyhow::Result<()> {
    use dinomo_lincheck::{Op, Outcome, Recorder};
    use std::sync::Arc;
    use std::time::Instant;

    let c = cluster_with_loops(2, 2)?;
    let addrs = resp_addrs(&c);
    let rec = Arc::new(Recorder::new());
    let clients: Vec<_> = (0..4u32)
        .map(|client| {
            let (rec, addr) = (rec.clone(), addrs[client as usize % addrs.len()]);
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let start = Instant::now();
                let mut n = 0u64;
                // A small deterministic mix per client: pipelines of 1 to 3 operations on 4 keys, mostly reads.
                let mut x = 0x9e37_79b9_u64.wrapping_mul(u64::from(client) + 1);
                let mut next = move |m: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % m
                };
                for round in 0..400u64 {
                    if start.elapsed() > Duration::from_secs(10) {
                        break;
                    }
                    let ops: Vec<Op> = (0..1 + next(3))
                        .map(|j| {
                            let key = format!("lin{}", next(4)).into_bytes();
                            match next(10) {
                                0..=5 => Op::Get(key),
                                6 | 7 => {
                                    Op::Set(key, format!("c{client}-{round}-{j}").into_bytes())
                                }
                                8 => Op::Delete(key),
                                _ => Op::Take(key),
                            }
                        })
                        .collect();
                    let mut tickets = Vec::new();
                    for op in &ops {
                        tickets.push(rec.invoke(client, op.clone()));
                        match op {
                            Op::Get(k) => conn.send(&[b"GET", k]),
                            Op::Set(k, v) => conn.send(&[b"SET", k, v]),
                            Op::Delete(k) => conn.send(&[b"DEL", k]),
                            Op::Take(k) => conn.send(&[b"GETDEL", k]),
                            _ => unreachable!("only these are generated"),
                        }
                    }
                    for (op, ticket) in ops.iter().zip(tickets) {
                        let reply = conn.read();
                        let outcome = match (op, reply) {
                            (Op::Get(_) | Op::Take(_), Value::Bulk(v)) => Outcome::Value(Some(v)),
                            (Op::Get(_) | Op::Take(_), Value::NullBulk | Value::Null) => {
                                Outcome::Value(None)
                            }
                            (Op::Set(..), Value::Simple(s)) if s == b"OK" => Outcome::Ok,
                            (Op::Delete(_), Value::Integer(d)) => Outcome::Applied(d == 1),
                            // An error reply: not applied or applied unknowably; the checker may place it anywhere.
                            (_, Value::Error(_)) => {
                                rec.unknown(ticket);
                                continue;
                            }
                            (op, other) => panic!("{op:?} answered with {other:?}"),
                        };
                        rec.complete(ticket, outcome);
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let ops: u64 = clients
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .sum();
    assert!(ops > 400, "only {ops} operations completed");
    common::assert_linearizable(&rec.history(), "dinomo-resp-nonlinearizable-history.json")
}

/// A full pool: a write is refused at once with Redis's `-OOM`, on its owner and through a node that forwards it,
/// and with `ClientError::OutOfSpace` over the native protocol (not retried until the deadline: the nodes share
/// the memory node); everything stored before is still read.
#[test]
fn a_full_pool_refuses_writes_with_oom_and_keeps_serving_reads() -> anyhow::Result<()> {
    use dinomo_cluster::{Client, ClientError};
    use std::time::Instant;

    let mut cfg = cluster_config(2);
    cfg.pool_size = 24 << 20;
    let c = LocalCluster::start(cfg)?;
    let op_timeout = Duration::from_secs(20);
    let mut cl = Client::connect(dinomo_cluster::ClientConfig {
        op_timeout,
        ..c.client_config()
    })?;
    let value = |i: u32| {
        let mut v = vec![(i % 251) as u8; 60 << 10];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    // Fill until every worker's segment is full: writes keep failing. Each failure comes back at once.
    let (mut stored, mut failures_in_a_row) = (Vec::new(), 0);
    for i in 0..5_000u32 {
        let key = format!("fill-{i}");
        let began = Instant::now();
        match cl.set(key.as_bytes(), &value(i)) {
            Ok(_) => {
                stored.push(i);
                failures_in_a_row = 0;
            }
            Err(ClientError::OutOfSpace(why)) => {
                assert!(why.contains("out of memory-node space"), "{why}");
                assert!(
                    began.elapsed() < op_timeout / 4,
                    "a full store's refusal took {:?}",
                    began.elapsed()
                );
                failures_in_a_row += 1;
                if failures_in_a_row == 50 {
                    break;
                }
            }
            Err(e) => panic!("write {i}: {e}"),
        }
    }
    assert_eq!(failures_in_a_row, 50, "the pool never filled up");
    assert!(stored.len() > 100, "only {} writes fit", stored.len());

    // Both nodes answer a write with -OOM: one owns the key, the other forwards it.
    for addr in resp_addrs(&c) {
        let mut conn = Conn::open(addr);
        match conn.call(&[b"SET", b"one-more", &value(0)]) {
            Value::Error(e) => assert!(e.starts_with(b"OOM "), "{}", String::from_utf8_lossy(&e)),
            other => panic!("a write to a full store: {other:?}"),
        }
        // Reads are served, through either node.
        for &i in stored.iter().step_by(17) {
            assert_eq!(
                conn.call(&[b"GET", format!("fill-{i}").as_bytes()]),
                bulk(&value(i)),
                "fill-{i}"
            );
        }
    }
    for &i in &stored {
        assert_eq!(
            cl.get(format!("fill-{i}").as_bytes())?,
            Some(value(i)),
            "fill-{i}"
        );
    }

    // The full store takes deletes, through either node, and the space they free is written again.
    let addrs = resp_addrs(&c);
    let mut conns: Vec<Conn> = addrs.iter().map(|&a| Conn::open(a)).collect();
    for (n, &i) in stored.iter().enumerate() {
        let conn = &mut conns[n % 2];
        assert_eq!(
            conn.call(&[b"DEL", format!("fill-{i}").as_bytes()]),
            Value::Integer(1),
            "DEL fill-{i} on a full store"
        );
    }
    for &i in stored.iter().step_by(17) {
        assert_eq!(cl.get(format!("fill-{i}").as_bytes())?, None, "fill-{i}");
    }
    let mut refilled = 0;
    for i in 0..stored.len() as u32 {
        let key = format!("again-{i}");
        match conns[i as usize % 2].call(&[b"SET", key.as_bytes(), &value(i)]) {
            Value::Simple(s) if s == b"OK" => refilled += 1,
            Value::Error(e) if e.starts_with(b"OOM ") => break,
            other => panic!("SET {key} after emptying the store: {other:?}"),
        }
    }
    assert!(
        refilled * 2 >= stored.len(),
        "after emptying the store only {refilled} of {} writes fit again",
        stored.len()
    );
    Ok(())
}

/// Many connections of one node forward at once: each sends, in one pipeline, three increments of a key of its
/// own and one of a shared key (both owned by the other node), a read of a local key, and a read of its own key
/// after the increments. The event loop sends every connection's first wave together and hands each its own
/// answers: every connection sees 1, 2, 3 in order and its read after them, and the shared key counts them all.
#[test]
fn connections_forwarding_at_once_each_get_their_own_answers_in_order() -> anyhow::Result<()> {
    let c = cluster(2)?;
    let addr = resp_addrs(&c)[0];
    let there = c.nodes()[1].id();
    let here = c.nodes()[0].id();
    let shared = key_owned_by(&c, there, "shared");
    let local = key_owned_by(&c, here, "local");
    let mut setup = Conn::open(addr);
    assert_eq!(setup.call(&[b"SET", &local, b"here"]), ok());
    let keys: Vec<Vec<u8>> = (0..16)
        .map(|i| key_owned_by(&c, there, &format!("own{i}")))
        .collect();
    let mut conns: Vec<Conn> = keys.iter().map(|_| Conn::open(addr)).collect();
    for round in 0..5 {
        // Every pipeline is written before any reply is read, so the loop finds many connections ready at once.
        for (conn, key) in conns.iter_mut().zip(&keys) {
            let mut wire = Vec::new();
            for args in [
                &[&b"INCR"[..], key][..],
                &[b"INCR", key],
                &[b"INCR", shared.as_slice()],
                &[b"GET", local.as_slice()],
                &[b"INCR", key],
                &[b"GET", key],
            ] {
                encode_request(args, &mut wire);
            }
            conn.stream.write_all(&wire)?;
        }
        for conn in &mut conns {
            let base = 3 * round;
            assert_eq!(conn.read(), Value::Integer(base + 1));
            assert_eq!(conn.read(), Value::Integer(base + 2));
            assert!(matches!(conn.read(), Value::Integer(_)));
            assert_eq!(conn.read(), bulk(b"here"));
            assert_eq!(conn.read(), Value::Integer(base + 3));
            assert_eq!(conn.read(), bulk((base + 3).to_string().as_bytes()));
        }
    }
    assert_eq!(
        setup.call(&[b"GET", &shared]),
        bulk((5 * keys.len()).to_string().as_bytes())
    );
    Ok(())
}

/// A pipeline on a node that is a secondary owner of a shared key: its reads of the key may be served here and its
/// writes anywhere the key is owned, but each read must still see the writes the connection sent before it.
#[test]
fn a_pipeline_on_a_secondary_owner_of_a_shared_key_reads_its_own_writes() -> anyhow::Result<()> {
    let c = cluster(2)?;
    let ids: Vec<_> = c.nodes().iter().map(|n| n.id()).collect();
    let key = key_owned_by(&c, ids[0], "shared");
    c.mnode().set_replication(&key, 2)?;
    c.wait_until_serving(Duration::from_secs(20))?;
    let secondary = c
        .nodes()
        .iter()
        .find(|n| n.id() == ids[1])
        .and_then(|n| n.resp_addr())
        .expect("the second node's RESP address");
    assert!(c.nodes()[1].routing().ring.is_owner(ids[1], &key));
    let mut conn = Conn::open(secondary);
    for round in 0..20 {
        for i in 0..10 {
            let v = format!("v{round}-{i}");
            conn.send(&[b"SET", &key, v.as_bytes()]);
            conn.send(&[b"GET", &key]);
        }
        for i in 0..10 {
            assert_eq!(conn.read(), ok());
            let v = format!("v{round}-{i}");
            assert_eq!(conn.read(), bulk(v.as_bytes()), "round {round}, pair {i}");
        }
    }
    c.stop();
    Ok(())
}

/// The value of metric `series` (name and labels, as exposed) in the cluster's metrics, 0 when absent.
fn metric(c: &LocalCluster, series: &str) -> f64 {
    dinomo_cluster::metrics::render(&c.metrics())
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// In a local cluster the front door queues the operations on another node's keys straight at that node's workers
/// (the nodes run in one process), not through the network; their answers are the owner's all the same.
#[test]
fn a_local_clusters_front_door_queues_its_peers_keys_at_their_workers() -> anyhow::Result<()> {
    let c = cluster(2)?;
    let ids: Vec<_> = c.nodes().iter().map(|n| n.id()).collect();
    let here = c.nodes()[0].resp_addr().expect("RESP enabled");
    let routing = c.nodes()[0].routing();
    let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("peer-{i}").into_bytes()).collect();
    let elsewhere = keys
        .iter()
        .filter(|k| routing.ring.primary(k) == Some(ids[1]))
        .count();
    assert!(
        elsewhere > 10,
        "{elsewhere} of the keys are the other node's"
    );
    let mut conn = Conn::open(here);
    for k in &keys {
        conn.send(&[b"SET", k, k]);
    }
    for k in &keys {
        conn.send(&[b"GET", k]);
    }
    for _ in &keys {
        assert_eq!(conn.read(), ok());
    }
    for k in &keys {
        assert_eq!(conn.read(), bulk(k));
    }
    let node = ids[0];
    let to_peers = metric(
        &c,
        &format!("dinomo_kn_resp_ops_sent_total{{node=\"{node}\",to=\"peer\"}}"),
    );
    let forwarded = metric(
        &c,
        &format!("dinomo_kn_resp_ops_sent_total{{node=\"{node}\",to=\"network\"}}"),
    );
    assert_eq!((to_peers, forwarded), (2.0 * elsewhere as f64, 0.0));
    // The other node's workers served them: its counters moved by as much.
    let other = c.nodes()[1].worker_stats()?;
    let served: u64 = other.iter().map(|t| t.ops.get + t.ops.set).sum();
    assert!(served >= 2 * elsewhere as u64, "{served} ops at the owner");
    c.stop();
    Ok(())
}

/// A peer that crashes, and another cluster (with the same token) that starts on its address before this one has
/// handed its keys over: the forwarded operations must not be answered there. The native handshake names the node
/// and its cluster's pool, so the stale address is found to be someone else's and the operations wait for the
/// keys' new owner (or fail), never answering "no such key" for a key that has a value.
#[test]
fn a_crashed_peers_address_taken_by_another_cluster_answers_nothing_for_it() -> anyhow::Result<()> {
    let InFlight {
        mut c,
        ids,
        keys,
        mut conn,
    } = gets_in_flight_at_a_peer("taken")?;
    let dead: SocketAddr = c.nodes()[1].addr().parse()?;
    c.crash_node(ids[1])?;
    let mut other = cluster_config(1);
    other.node.listen = dead;
    let other = LocalCluster::start(other)?;
    assert_eq!(other.nodes()[0].addr(), dead.to_string());
    for k in &keys {
        match conn.read() {
            Value::Bulk(v) => assert_eq!(&v, k),
            Value::Error(_) => {}
            wrong => panic!("{wrong:?} for {}", String::from_utf8_lossy(k)),
        }
    }
    c.wait_until_serving(Duration::from_secs(30))?;
    for k in &keys {
        assert_eq!(conn.call(&[b"GET", k]), bulk(k));
    }
    drop(other);
    c.stop();
    Ok(())
}

/// A two-node cluster (leases of 1 s) whose second node owns `keys` (`{prefix}-{i}`), each set through the first
/// node's front door, and a connection to that front door with a GET of every key pipelined on it.
struct InFlight {
    c: LocalCluster,
    ids: Vec<dinomo_ring::NodeId>,
    keys: Vec<Vec<u8>>,
    conn: Conn,
}

fn gets_in_flight_at_a_peer(prefix: &str) -> anyhow::Result<InFlight> {
    let mut cfg = cluster_config(2);
    cfg.node.lease_ttl = Duration::from_secs(1);
    let c = LocalCluster::start(cfg)?;
    let ids: Vec<_> = c.nodes().iter().map(|n| n.id()).collect();
    let here = c.nodes()[0].resp_addr().expect("RESP enabled");
    let routing = c.nodes()[0].routing();
    let keys: Vec<Vec<u8>> = (0..200)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .filter(|k| routing.ring.primary(k) == Some(ids[1]))
        .collect();
    let mut conn = Conn::open(here);
    for k in &keys {
        assert_eq!(conn.call(&[b"SET", k, k]), ok());
    }
    for k in &keys {
        conn.send(&[b"GET", k]);
    }
    Ok(InFlight { c, ids, keys, conn })
}

/// A peer that crashes while a connection pipelines operations on its keys: each is answered, with its value or an
/// error, never with a wrong value, and once the cluster has handed the keys over they are all served again.
#[test]
fn a_peer_that_crashes_under_a_pipeline_leaves_every_operation_answered() -> anyhow::Result<()> {
    // Pipelines of reads in flight while the owner crashes.
    let InFlight {
        mut c,
        ids,
        keys,
        mut conn,
    } = gets_in_flight_at_a_peer("crash")?;
    let crashed = Instant::now();
    c.crash_node(ids[1])?;
    // What the cluster did, for a failure's message: the M-node's changes (a failure's take-over says how many
    // entries it merged) and when the reply came.
    let context = |c: &LocalCluster| {
        format!(
            "{:?} after the crash; the M-node's changes: {:?}",
            crashed.elapsed(),
            c.mnode().events()
        )
    };
    for k in &keys {
        match conn.read() {
            Value::Bulk(v) => assert_eq!(&v, k, "{}", context(&c)),
            Value::Error(_) => {}
            other => panic!(
                "{other:?} for {}, {}",
                String::from_utf8_lossy(k),
                context(&c)
            ),
        }
    }
    c.wait_until_serving(Duration::from_secs(30))?;
    for k in &keys {
        assert_eq!(conn.call(&[b"GET", k]), bulk(k), "{}", context(&c));
    }
    c.stop();
    Ok(())
}

/// Sends `commands` between MULTI and EXEC in one pipeline; EXEC's reply.
fn transaction(conn: &mut Conn, commands: &[Vec<&[u8]>]) -> Value {
    let mut wire = Vec::new();
    encode_request(&[b"MULTI".as_slice()], &mut wire);
    for c in commands {
        encode_request(c, &mut wire);
    }
    encode_request(&[b"EXEC".as_slice()], &mut wire);
    conn.stream.write_all(&wire).unwrap();
    assert_eq!(conn.read(), ok());
    for _ in commands {
        assert_eq!(conn.read(), Value::Simple(b"QUEUED".to_vec()));
    }
    conn.read()
}

fn number(v: &Value) -> i64 {
    match v {
        Value::Bulk(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
        Value::Integer(n) => *n,
        other => panic!("expected a number, got {other:?}"),
    }
}

/// The first key named `prefix-N` owned by `node`'s worker `worker` (of `threads`).
fn key_at(
    c: &LocalCluster,
    node: dinomo_ring::NodeId,
    worker: usize,
    threads: usize,
    prefix: &str,
) -> Vec<u8> {
    let routing = c.nodes()[0].routing();
    (0..100_000)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .find(|k| {
            routing.ring.primary(k) == Some(node) && dinomo_kn::thread_for_key(k, threads) == worker
        })
        .expect("some key of every worker")
}

/// Where [`transfers_stay_whole`] runs: the nodes' RESP addresses, three accounts (two on different workers of the
/// first node, one on the second node) and a pair of counters (one on each node).
struct Transfers {
    addrs: Vec<SocketAddr>,
    accounts: Vec<Vec<u8>>,
    pair: Vec<Vec<u8>>,
}

impl Transfers {
    fn on(c: &LocalCluster) -> Transfers {
        let (a, b) = {
            let nodes = c.nodes();
            (nodes[0].id(), nodes[1].id())
        };
        Transfers {
            addrs: resp_addrs(c),
            accounts: vec![
                key_at(c, a, 0, 2, "acct"),
                key_at(c, a, 1, 2, "acct"),
                key_at(c, b, 0, 2, "acct"),
            ],
            pair: vec![key_at(c, a, 1, 2, "pair"), key_at(c, b, 1, 2, "pair")],
        }
    }
}

/// Whether `reply` is EXEC's refusal of a whole transaction (nothing of it applied).
fn not_run(reply: &Value) -> bool {
    matches!(reply, Value::Error(e) if e.starts_with(b"ERR the transaction did not run, nothing was applied"))
}

/// Transfers between accounts on different workers of one node and on another node, in transactions from several
/// connections to both nodes, while other connections read every account in transactions (the total never
/// changes) and read a pair of counters on two nodes, increased together in transactions, one after the other
/// outside any (the second, read later, is never behind). Aborted transactions (`allow_aborts`, while ownership
/// moves) are retried; a transaction that ran ran whole.
fn transfers_stay_whole(
    Transfers {
        addrs,
        accounts,
        pair,
    }: Transfers,
    allow_aborts: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> usize {
    use std::sync::atomic::Ordering;
    let mut setup = Conn::open(addrs[0]);
    for k in accounts.iter().chain(&pair) {
        assert_eq!(setup.call(&[b"SET", k, b"500"]), ok());
    }
    let total = 500 * accounts.len() as i64;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Each client makes at least 50 rounds, at most 300, and stops after 50 once `stop` is set, or at the deadline.
    let rounds = move || {
        (0..300usize).take_while(move |&i| {
            Instant::now() <= deadline && (i < 50 || !stop.load(Ordering::Acquire))
        })
    };
    let ran = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..3usize {
            let (accounts, pair, ran) = (&accounts, &pair, &ran);
            let addr = addrs[t % addrs.len()];
            scope.spawn(move || {
                let mut conn = Conn::open(addr);
                for i in rounds() {
                    let (from, to) = (&accounts[(t + i) % 3], &accounts[(t + i + 1) % 3]);
                    let amount = (1 + i % 9).to_string();
                    let r = transaction(
                        &mut conn,
                        &[
                            vec![b"DECRBY".as_slice(), from, amount.as_bytes()],
                            vec![b"INCRBY".as_slice(), to, amount.as_bytes()],
                            vec![b"INCR".as_slice(), &pair[0]],
                            vec![b"INCR".as_slice(), &pair[1]],
                        ],
                    );
                    if allow_aborts && not_run(&r) {
                        continue;
                    }
                    assert!(
                        matches!(&r, Value::Array(a) if a.len() == 4 && a.iter().all(|v| matches!(v, Value::Integer(_)))),
                        "{r:?}"
                    );
                    ran.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for t in 0..2usize {
            let (accounts, pair) = (&accounts, &pair);
            let addr = addrs[t % addrs.len()];
            scope.spawn(move || {
                let mut conn = Conn::open(addr);
                for _ in rounds() {
                    let gets: Vec<Vec<&[u8]>> = accounts
                        .iter()
                        .map(|k| vec![b"GET".as_slice(), k])
                        .collect();
                    let r = transaction(&mut conn, &gets);
                    if allow_aborts && not_run(&r) {
                        continue;
                    }
                    let Value::Array(values) = r else {
                        panic!("EXEC answers an array: {r:?}")
                    };
                    assert_eq!(
                        values.iter().map(number).sum::<i64>(),
                        total,
                        "a transfer seen half done"
                    );
                    let first = number(&conn.call(&[b"GET", &pair[0]]));
                    let second = number(&conn.call(&[b"GET", &pair[1]]));
                    assert!(second >= first, "{second} read after {first}");
                }
            });
        }
    });
    let gets: Vec<Vec<&[u8]>> = accounts
        .iter()
        .chain(&pair)
        .map(|k| vec![b"GET".as_slice(), k])
        .collect();
    let r = transaction(&mut setup, &gets);
    let Value::Array(values) = r else {
        panic!("EXEC answers an array: {r:?}")
    };
    assert_eq!(values[..3].iter().map(number).sum::<i64>(), total);
    assert_eq!(
        number(&values[3]),
        number(&values[4]),
        "both counters of every transaction that ran"
    );
    ran.into_inner()
}

#[test]
fn transactions_are_isolated_across_workers_and_nodes() -> anyhow::Result<()> {
    let c = cluster_with_loops(2, 2)?;
    let stop = std::sync::atomic::AtomicBool::new(true);
    assert!(transfers_stay_whole(Transfers::on(&c), false, &stop) > 0);
    Ok(())
}

#[test]
fn transactions_run_whole_or_not_at_all_while_nodes_join_and_leave() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut c = cluster(2)?;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let clients = {
        let (transfers, stop) = (Transfers::on(&c), stop.clone());
        std::thread::spawn(move || transfers_stay_whole(transfers, true, &stop))
    };
    let added = c.add_node()?;
    c.remove_node(added)?;
    c.add_node()?;
    stop.store(true, Ordering::Release);
    let ran = clients.join().expect("clients");
    assert!(ran > 0, "no transaction ran");
    Ok(())
}

/// Optimistic increments (`WATCH`, `GET`, `MULTI`, `SET` of the value read plus one, `EXEC`, again when `EXEC`
/// answers null) from connections to both nodes of counters on both: no increment is lost, and every one that
/// ran is counted once.
#[test]
fn watched_check_and_set_loses_no_increment() -> anyhow::Result<()> {
    let c = cluster_with_loops(2, 2)?;
    let addrs = resp_addrs(&c);
    let (a, b) = {
        let nodes = c.nodes();
        (nodes[0].id(), nodes[1].id())
    };
    let counters = vec![key_owned_by(&c, a, "cas"), key_owned_by(&c, b, "cas")];
    const PER_CLIENT: i64 = 60;
    let deadline = Instant::now() + Duration::from_secs(30);
    let retries: Vec<_> = (0..4usize)
        .map(|t| {
            let (addr, counters) = (addrs[t % 2], counters.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                let mut retries = 0;
                for i in 0..PER_CLIENT {
                    let key = &counters[(t + i as usize) % 2];
                    loop {
                        assert!(Instant::now() < deadline, "increments starved");
                        assert_eq!(conn.call(&[b"WATCH", key]), ok());
                        let now = match conn.call(&[b"GET", key]) {
                            Value::NullBulk => 0,
                            v => number(&v),
                        };
                        let next = (now + 1).to_string();
                        let r = transaction(
                            &mut conn,
                            &[vec![b"SET".as_slice(), key, next.as_bytes()]],
                        );
                        match r {
                            Value::Array(a) if a == vec![ok()] => break,
                            Value::NullArray => retries += 1,
                            other => panic!("EXEC answered {other:?}"),
                        }
                    }
                }
                retries
            })
        })
        .collect();
    let retried: i64 = retries.into_iter().map(|t| t.join().expect("client")).sum();
    let mut conn = Conn::open(addrs[0]);
    let total: i64 = counters
        .iter()
        .map(|k| number(&conn.call(&[b"GET", k])))
        .sum();
    assert_eq!(total, 4 * PER_CLIENT, "{retried} retries");
    Ok(())
}
