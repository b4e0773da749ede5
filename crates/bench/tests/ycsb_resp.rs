//! `dinomo bench ycsb` through the Redis protocol: the same workloads against a dinomo cluster's RESP ports and a
//! real redis-server, at tiny scale; and the RESP sessions on their own: pipelining, a closed connection, a server
//! that is gone.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use dinomo_bench::ycsb::{Distribution, OpKind, Workload};
use dinomo_bench::ycsb_run::resp::RespStore;
use dinomo_bench::ycsb_run::{
    RespOptions, Store, StoreError, StoreOp, StoreReply, TargetOptions, YcsbOptions, YcsbReport,
    load_reports, run_ycsb,
};
use dinomo_cluster::{LocalCluster, LocalClusterConfig};
use dinomo_resp::{MemoryBackend, ParseLimits, RequestParser, RespServer, ServerConfig};

mod common;
use common::{patient_cluster, tiny_run};

fn tiny(workload: Workload, addrs: Vec<String>) -> YcsbOptions {
    let target = TargetOptions::Resp(RespOptions {
        addrs,
        ..RespOptions::default()
    });
    tiny_run(target, workload, Distribution::Zipfian { theta: 0.99 }, 11)
}

/// What a run through RESP must satisfy: every operation done, every read found its value, and what the target
/// cannot see reported as absent.
fn check(r: &YcsbReport, system: &str) {
    let m = &r.measured;
    assert_eq!(m.ops, 400, "exactly the operations asked for");
    assert_eq!(m.errors.total(), 0, "{:?}", m.errors);
    assert_eq!(m.by_kind.iter().map(|k| k.ops).sum::<u64>(), m.ops);
    assert_eq!(
        m.reads_verified,
        r.measured.ops_of(OpKind::Read) + r.measured.ops_of(OpKind::ReadModifyWrite),
        "every read found a value its record was given"
    );
    assert_eq!(r.latency.samples, m.ops);
    assert_eq!((r.target.as_str(), r.system.as_str()), ("resp", system));
    assert!(r.server_version.is_some());
    assert!(r.load.as_ref().is_some_and(|l| l.records == 500));
    assert!(
        r.kv_nodes.is_none()
            && r.resources.is_none()
            && r.cache.is_none()
            && r.merge.is_none()
            && r.nodes.is_empty(),
        "a RESP server's counters are absent, not zero"
    );
    assert!(r.timeline.iter().all(|s| s.backlog_segments.is_none()));
    assert!(
        r.summary().contains("not collected through RESP"),
        "{}",
        r.summary()
    );
}

#[test]
fn a_dinomo_cluster_is_measured_through_its_redis_ports() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(LocalClusterConfig {
        resp_listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
        ..patient_cluster()
    })?;
    let addrs: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.resp_addr().map(|a| a.to_string()))
        .collect::<Option<_>>()
        .context("every node serves RESP")?;
    // One node's port only: the keys of the other node are forwarded.
    let opts = tiny(Workload::A, addrs[..1].to_vec());
    let r = run_ycsb(&opts, &mut |_| {})?;
    check(&r, "dinomo");
    assert!(r.measured.ops_of(OpKind::Read) > 100 && r.measured.ops_of(OpKind::Update) > 100);

    // The report reads back as written; its files are named by what was measured.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(format!("{}.json", r.file_stem()));
    assert!(r.file_stem().ends_with("-resp-dinomo"), "{}", r.file_stem());
    std::fs::write(&path, serde_json::to_string_pretty(&r)?)?;
    assert_eq!(load_reports(&path)?, vec![r]);

    // F's read-modify-writes (a GET, then a SET) over both nodes' ports, on the records loaded above.
    let f = YcsbOptions {
        load: false,
        distribution: Distribution::ScrambledZipfian { theta: 0.99 },
        ..tiny(Workload::F, addrs)
    };
    let r = run_ycsb(&f, &mut |_| {})?;
    assert!(r.load.is_none());
    let m = &r.measured;
    assert_eq!((m.ops, m.errors.total()), (400, 0), "{:?}", m.errors);
    assert!(r.measured.ops_of(OpKind::ReadModifyWrite) > 100);
    assert_eq!(
        m.reads_verified,
        r.measured.ops_of(OpKind::Read) + r.measured.ops_of(OpKind::ReadModifyWrite)
    );
    cluster.stop();
    Ok(())
}

/// A redis-server on a free loopback port, without persistence, stopped when dropped.
struct RedisServer {
    child: Child,
    addr: SocketAddr,
}

impl RedisServer {
    fn start() -> anyhow::Result<RedisServer> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (Debian package redis-server)")?;
        let mut server = RedisServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut s) = TcpStream::connect(server.addr) {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(b"PING\r\n")?;
                let mut buf = [0u8; 7];
                if s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                    return Ok(server);
                }
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("redis-server exited: {status}");
            }
            ensure!(
                Instant::now() < deadline,
                "redis-server did not answer in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_redis_server_is_measured_the_same_way() -> anyhow::Result<()> {
    let redis = RedisServer::start()?;
    let r = run_ycsb(
        &tiny(Workload::A, vec![redis.addr.to_string()]),
        &mut |_| {},
    )?;
    check(&r, "redis");
    assert!(r.file_stem().ends_with("-resp-redis"), "{}", r.file_stem());
    Ok(())
}

fn resp_store(addr: SocketAddr, timeout: Duration) -> anyhow::Result<RespStore> {
    RespStore::open(
        &RespOptions {
            addrs: vec![addr.to_string()],
            ..RespOptions::default()
        },
        timeout,
        64,
    )
}

#[test]
fn a_session_survives_a_closed_connection_and_a_vanished_server() -> anyhow::Result<()> {
    let server = RespServer::start(
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..ServerConfig::default()
        },
        MemoryBackend::new(),
    )?;
    let addr = server.local_addr();
    let store = resp_store(addr, Duration::from_millis(500))?;
    let mut s = store.session()?;
    s.submit(1, StoreOp::Set(b"k", b"v1"))?;
    s.submit(2, StoreOp::Get(b"k"))?;
    s.submit(3, StoreOp::Get(b"absent"))?;
    assert_eq!(s.outstanding(), 3);
    assert_eq!(s.next_completion(), Some((1, Ok(StoreReply::Stored))));
    assert_eq!(
        s.next_completion(),
        Some((2, Ok(StoreReply::Value(Some(b"v1".to_vec())))))
    );
    assert_eq!(s.next_completion(), Some((3, Ok(StoreReply::Value(None)))));
    assert_eq!(s.next_completion(), None);

    // The server closes the connection: the read in flight fails, the next request opens a new connection.
    server.cut_all_connections();
    s.submit(4, StoreOp::Get(b"k"))?;
    let (tag, r) = s.next_completion().context("a completion")?;
    assert_eq!(tag, 4);
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    s.submit(5, StoreOp::Set(b"k", b"v2"))?;
    assert_eq!(s.next_completion(), Some((5, Ok(StoreReply::Stored))));

    // The server goes away: a write in flight has an unknown outcome; a new request finds nobody and is not sent.
    drop(server);
    s.submit(6, StoreOp::Set(b"k", b"v3"))?;
    let (tag, r) = s.next_completion().context("a completion")?;
    assert_eq!(tag, 6);
    assert!(matches!(r, Err(StoreError::Indeterminate(_))), "{r:?}");
    s.submit(7, StoreOp::Get(b"k"))?;
    let (tag, r) = s.next_completion().context("a completion")?;
    assert_eq!(tag, 7);
    let Err(StoreError::Unavailable(why)) = r else {
        bail!("expected unavailable, got {r:?}");
    };
    assert!(why.contains(&addr.to_string()), "{why}");
    assert_eq!((s.next_completion(), s.outstanding()), (None, 0));

    // Nobody listening at all: opening the store fails with a clear error.
    let err = resp_store(addr, Duration::from_millis(200))
        .err()
        .context("nothing listens")?;
    assert!(err.to_string().contains("cannot connect"), "{err:#}");
    Ok(())
}

/// Reads requests from `s` until `n` have arrived (with the parser the dinomo server uses).
fn read_requests(s: &mut TcpStream, n: usize) -> anyhow::Result<Vec<Vec<Vec<u8>>>> {
    let mut parser = RequestParser::new(ParseLimits::default());
    let (mut input, mut requests) = (Vec::new(), Vec::new());
    let mut chunk = [0u8; 4096];
    while requests.len() < n {
        let (used, r) = parser.parse(&input, true);
        input.drain(..used);
        match r {
            Ok(Some(args)) => requests.push(args),
            Ok(None) => {
                let got = s.read(&mut chunk)?;
                ensure!(got > 0, "the client closed the connection");
                input.extend_from_slice(&chunk[..got]);
            }
            Err(e) => bail!("not a request: {e}"),
        }
    }
    Ok(requests)
}

#[test]
fn a_session_sends_its_outstanding_requests_together() -> anyhow::Result<()> {
    const WINDOW: usize = 16;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    // A server that answers nothing until the whole window has arrived: a client sending one request at a time
    // would wait for a reply that never comes.
    let server = std::thread::spawn(move || -> anyhow::Result<Vec<Vec<Vec<u8>>>> {
        let (mut probe, _) = listener.accept()?;
        let info = read_requests(&mut probe, 1)?;
        ensure!(info[0][0] == b"INFO", "{info:?}");
        let text = "# Server\r\nredis_version:7.0.0\r\n";
        probe.write_all(format!("${}\r\n{text}\r\n", text.len()).as_bytes())?;
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        let requests = read_requests(&mut conn, WINDOW)?;
        let mut replies = Vec::new();
        for r in &requests {
            replies.extend_from_slice(if r[0] == b"SET" {
                b"+OK\r\n".as_slice()
            } else {
                b"$2\r\nv0\r\n"
            });
        }
        conn.write_all(&replies)?;
        Ok(requests)
    });
    let store = resp_store(addr, Duration::from_secs(20))?;
    assert_eq!(
        store.identity().map(|i| i.system),
        Some("redis".to_string())
    );
    let mut s = store.session()?;
    for tag in 0..WINDOW as u64 {
        let key = format!("k{tag}");
        if tag % 2 == 0 {
            s.submit(tag, StoreOp::Set(key.as_bytes(), b"v0"))?;
        } else {
            s.submit(tag, StoreOp::Get(key.as_bytes()))?;
        }
    }
    for tag in 0..WINDOW as u64 {
        let want = if tag % 2 == 0 {
            StoreReply::Stored
        } else {
            StoreReply::Value(Some(b"v0".to_vec()))
        };
        assert_eq!(s.next_completion(), Some((tag, Ok(want))));
    }
    let requests = server.join().expect("server thread")?;
    assert_eq!(
        requests[0],
        [b"SET".to_vec(), b"k0".to_vec(), b"v0".to_vec()]
    );
    assert_eq!(requests[1], [b"GET".to_vec(), b"k1".to_vec()]);
    Ok(())
}
