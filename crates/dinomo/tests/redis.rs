//! Real Redis clients against a real `dinomo up` process: redis-cli and redis-benchmark (Debian's redis-tools),
//! redis-py (Debian's python3-redis), and clients that send garbage or vanish while others are served.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};

mod common;

/// A running `dinomo up`, stopped with SIGINT when dropped.
struct Up {
    _process: common::Interrupted,
    resp: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

/// Starts `dinomo up` with two KV nodes serving RESP on free ports. Nothing here kills a node, so leases are
/// long: a loaded machine must not make a node miss its heartbeats and fence itself.
fn up(extra: &[&str]) -> anyhow::Result<Up> {
    let dir = tempfile::tempdir()?;
    let child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args([
            "up",
            "--kns",
            "2",
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
            "--pool-size",
            "512MiB",
            "--rn-listen",
            "127.0.0.1:0",
            "--resp-listen",
            "127.0.0.1:0",
            "--lease-ms",
            "10000",
            "--heartbeat-ms",
            "100",
        ])
        .args(extra)
        .env("DINOMO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut resp = Vec::new();
    let process = common::read_banner(child, |line| {
        if let Some((_, addr)) = line.split_once("Redis protocol on ") {
            resp.push(addr.parse()?);
        }
        Ok(line.contains("memory node:"))
    })?;
    anyhow::ensure!(resp.len() == 2, "expected two RESP addresses, got {resp:?}");
    Ok(Up {
        _process: process,
        resp,
        _dir: dir,
    })
}

use common::{cli, run};

#[test]
fn redis_cli_talks_to_every_node() -> anyhow::Result<()> {
    let up = up(&[])?;
    let (a, b) = (up.resp[0], up.resp[1]);
    assert_eq!(cli(a, &["PING"])?, "PONG\n");
    assert_eq!(cli(a, &["SET", "greeting", "hello"])?, "OK\n");
    assert_eq!(cli(b, &["GET", "greeting"])?, "hello\n");
    assert_eq!(cli(a, &["INCR", "n"])?, "1\n");
    assert_eq!(cli(b, &["INCRBY", "n", "41"])?, "42\n");
    assert_eq!(cli(a, &["MSET", "a", "1", "b", "2", "c", "3"])?, "OK\n");
    assert_eq!(cli(b, &["MGET", "a", "b", "c", "nothere"])?, "1\n2\n3\n\n");
    assert_eq!(cli(a, &["DEL", "a", "b", "nothere"])?, "2\n");
    assert_eq!(cli(b, &["EXISTS", "a", "c"])?, "1\n");
    assert_eq!(cli(a, &["APPEND", "greeting", " world"])?, "11\n");
    assert_eq!(cli(b, &["STRLEN", "greeting"])?, "11\n");
    assert_eq!(cli(a, &["GET", "nothere"])?, "\n");
    assert_eq!(cli(b, &["DBSIZE"])?, "3\n");
    assert!(cli(a, &["INFO", "keyspace"])?.contains("db0:keys=3,expires=0,avg_ttl=0"));
    assert!(
        cli(a, &["SET", "k", "v", "EX", "10"])?
            .starts_with("ERR dinomo keeps keys until they are deleted")
    );
    assert_eq!(
        cli(b, &["SELECT", "1"])?,
        "ERR DB index is out of range\n\n"
    );
    assert_eq!(cli(a, &["COMMAND", "COUNT"])?, "55\n");
    // RESP3 through redis-cli's -3 switch.
    assert_eq!(cli(b, &["-3", "GET", "greeting"])?, "hello world\n");
    Ok(())
}

#[test]
fn passwords_and_protected_mode() -> anyhow::Result<()> {
    let up = up(&["--requirepass", "s3cret"])?;
    let a = up.resp[0];
    assert_eq!(
        cli(a, &["GET", "x"])?,
        "NOAUTH Authentication required.\n\n"
    );
    assert_eq!(
        cli(a, &["-a", "s3cret", "--no-auth-warning", "SET", "x", "1"])?,
        "OK\n"
    );
    assert_eq!(
        cli(
            up.resp[1],
            &["-a", "s3cret", "--no-auth-warning", "GET", "x"]
        )?,
        "1\n"
    );
    // Without a password, a public address is refused at start-up (nothing is bound).
    let dir = tempfile::tempdir()?;
    let refused = run(
        env!("CARGO_BIN_EXE_dinomo"),
        &[
            "up",
            "--kns",
            "1",
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
            "--pool-size",
            "64MiB",
            "--rn-listen",
            "127.0.0.1:0",
            "--resp-listen",
            "0.0.0.0:0",
        ]
        .map(String::from),
        Duration::from_secs(60),
    )?;
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("protected mode"), "{err}");
    Ok(())
}

#[test]
fn redis_cli_shutdown_stops_dinomo_up_cleanly_and_a_restart_serves_the_data() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let start = || -> anyhow::Result<(std::process::Child, SocketAddr)> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
            .args(["up", "--kns", "1", "--data-dir"])
            .arg(dir.path())
            .args(["--pool-size", "256MiB", "--rn-listen", "127.0.0.1:0"])
            .args(["--resp-listen", "127.0.0.1:0"])
            .env("DINOMO_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        loop {
            line.clear();
            anyhow::ensure!(
                std::io::BufRead::read_line(&mut stdout, &mut line)? > 0,
                "dinomo up exited before it served"
            );
            if let Some((_, addr)) = line.split_once("Redis protocol on ") {
                let addr = addr.trim().parse()?;
                // Keep draining stdout so that the child never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
                return Ok((child, addr));
            }
        }
    };
    let (mut child, addr) = start()?;
    assert_eq!(cli(addr, &["SET", "kept", "across"])?, "OK\n");
    // The connection closes without a reply; the process then stops as it does on SIGTERM.
    let _ = cli(addr, &["SHUTDOWN", "NOSAVE"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("dinomo up did not stop after SHUTDOWN");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "dinomo up exited with {status}");
    let (child, addr) = start()?;
    let _running = common::Interrupted::from(child);
    assert_eq!(cli(addr, &["GET", "kept"])?, "across\n");
    Ok(())
}

#[test]
fn redis_benchmark_completes_without_errors() -> anyhow::Result<()> {
    let up = up(&[])?;
    common::redis_benchmark(
        up.resp[0],
        "set,get,incr,mset",
        100_000,
        &["SET", "GET", "INCR", "MSET (10 keys)"],
        Duration::from_secs(300),
        "dinomo",
    )?;
    // Every one of the 100,000 increments of its counter was applied once.
    assert_eq!(
        cli(up.resp[1], &["GET", "counter:__rand_int__"])?,
        "100000\n"
    );
    Ok(())
}

#[test]
fn redis_py_binary_values_pipelines_and_increments() -> anyhow::Result<()> {
    let up = up(&[])?;
    let script = r#"
import os, sys, redis
a = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
b = redis.Redis(host="127.0.0.1", port=int(sys.argv[2]))
assert a.ping()
# Binary keys and values, every byte value, read back through the other node.
key = bytes(range(256))
assert a.set(key, bytes(reversed(key)))
assert b.get(key) == bytes(reversed(key))
# Random keys under a prefix of their own: a bare one-byte key is "n" (the counter below) one run in 256.
for i in range(64):
    k, v = b"rand:" + os.urandom(1 + i), os.urandom(3 * i)
    assert a.set(k, v)
    assert b.get(k) == v
# 1 MiB values.
big = os.urandom(1 << 20)
assert b.set("big", big)
assert a.get("big") == big
assert a.strlen("big") == 1 << 20
# Pipelines without MULTI, then as transactions (redis-py's default).
p = a.pipeline(transaction=False)
for i in range(1000):
    p.set("p%d" % i, i)
    p.incr("pc")
replies = p.execute()
assert replies[0::2] == [True] * 1000, replies[:4]
assert replies[1::2] == list(range(1, 1001)), replies[:4]
p = b.pipeline(transaction=False)
for i in range(1000):
    p.get("p%d" % i)
assert p.execute() == [str(i).encode() for i in range(1000)]
with b.pipeline() as p:
    for i in range(100):
        p.incr("tx-a").decr("tx-b")
    p.get("tx-a").get("tx-b")
    r = p.execute()
assert r[-2:] == [b"100", b"-100"], r[-2:]
with a.pipeline() as p:
    p.set("tx-c", "x").incr("tx-c").get("tx-c")
    r = p.execute(raise_on_error=False)
assert r[0] is True and isinstance(r[1], redis.ResponseError) and r[2] == b"x", r
a.delete("tx-a", "tx-b", "tx-c")
# Optimistic updates with WATCH, as redis-py's transaction() helper makes them, on keys of both nodes.
def double(pipe):
    n = int(pipe.get("tx-n") or 1)
    m = int(pipe.get("tx-m") or 1)
    pipe.multi()
    pipe.set("tx-n", n * 2)
    pipe.set("tx-m", m * 3)
for _ in range(5):
    a.transaction(double, "tx-n", "tx-m")
assert a.mget("tx-n", "tx-m") == [b"32", b"243"]
with b.pipeline() as p:
    p.watch("tx-n")
    a.set("tx-n", "changed")
    p.multi()
    p.set("tx-n", "lost")
    try:
        p.execute()
        raise SystemExit("EXEC ran although a watched key changed")
    except redis.WatchError:
        pass
assert b.get("tx-n") == b"changed"
a.delete("tx-n", "tx-m")
# Increments.
assert a.incr("n") == 1
assert b.incrby("n", 41) == 42
assert a.decr("n") == 41
assert b.decrby("n", 40) == 1
assert a.mget(["p1", "nothere", "n"]) == [b"1", None, b"1"]
assert a.mset({"m1": "x", "m2": "y"})
assert b.delete("m1", "m2", "nothere") == 2
assert a.exists("p1", "p2", "m1") == 2
assert a.getset("p1", "new") == b"1"
assert a.setnx("p1", "again") is False
assert a.append("p1", "er") == 5
try:
    a.incr(key)
    raise SystemExit("INCR of a binary value succeeded")
except redis.ResponseError as e:
    assert "not an integer" in str(e), e
try:
    a.set("t", "1", ex=10)
    raise SystemExit("SET EX succeeded")
except redis.ResponseError as e:
    assert "EX" in str(e), e
assert a.dbsize() == b.dbsize() == 1 + 64 + 1 + 1000 + 1 + 1
# One pipeline touching keys of both nodes several times each: the replies come back in order, and each key's
# commands apply in order.
p = a.pipeline(transaction=False)
for i in range(200):
    k = "mix%d" % i
    p.set(k, "v%d" % i)
    p.append(k, "+")
    p.strlen(k)
    p.exists(k)
    p.get(k)
    p.delete(k)
    p.exists(k)
    p.strlen(k)
r = p.execute()
for i in range(200):
    v = ("v%d" % i).encode() + b"+"
    assert r[8 * i:8 * i + 8] == [True, len(v), len(v), 1, v, 1, 0, 0], (i, r[8 * i:8 * i + 8])
# Increments past the 64-bit range are refused with Redis's text, and change nothing.
assert b.set("edge", 2 ** 63 - 1)
for op in (lambda: a.incr("edge"), lambda: a.incrby("edge", 2), lambda: b.decrby("edge", -1)):
    try:
        op()
        raise SystemExit("an increment past i64::MAX succeeded")
    except redis.ResponseError as e:
        assert "increment or decrement would overflow" in str(e), e
assert a.get("edge") == str(2 ** 63 - 1).encode()
# The string commands of Redis 6 and 7, as redis-py calls them, on keys of both nodes.
for i in range(20):
    k = "str%d" % i
    assert a.set(k, "Hello World")
    assert b.setrange(k, 6, "Redis") == 11
    assert a.getrange(k, 0, 4) == b"Hello"
    assert b.getdel(k) == b"Hello Redis"
    assert a.getdel(k) is None
    assert b.incrbyfloat(k, 10.5) == 10.5
    assert a.incrbyfloat(k, 0.1) == 10.6
    assert b.set(k, "x", nx=True, get=True) == b"10.6"
    assert a.set(k, "y", xx=True, get=True) == b"10.6"
    assert b.ttl(k) == -1 and a.pttl("nothere") == -2
    assert a.getex(k, persist=True) == b"y"
    assert b.touch(k, "nothere") == 1
secs, micros = a.time()
assert secs > 1_600_000_000 and 0 <= micros < 1_000_000
# FLUSHDB empties the whole cluster, whichever node is asked.
assert a.flushdb()
assert a.dbsize() == b.dbsize() == 0
assert b.get(key) is None
print("ok")
"#;
    redis_py(script, &up)
}

/// Runs the redis-py `script` with the two nodes' ports as its arguments; it must print `ok`.
fn redis_py(script: &str, up: &Up) -> anyhow::Result<()> {
    let args = vec![
        "-c".to_string(),
        script.to_string(),
        up.resp[0].port().to_string(),
        up.resp[1].port().to_string(),
    ];
    // Debian's python3, where python3-redis is installed.
    let out = run("/usr/bin/python3", &args, Duration::from_secs(120))?;
    assert!(
        out.status.success(),
        "redis-py: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    Ok(())
}

/// A raw connection.
/// SCAN, KEYS and TYPE through either node: a walk lists the keys of the whole cluster (those merged into the
/// index and those still in the KV nodes' logs), each deleted key left out.
#[test]
fn scan_and_keys_list_the_whole_cluster_through_any_node() -> anyhow::Result<()> {
    let up = up(&[])?;
    let script = r#"
import sys, redis
a = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
b = redis.Redis(host="127.0.0.1", port=int(sys.argv[2]))
p = a.pipeline(transaction=False)
for i in range(3000):
    p.set("user:%d" % i, "v")
for i in range(100):
    p.set(b"bin:\x00\xff" + bytes([i]), "v")
p.execute()
p = b.pipeline(transaction=False)
for i in range(0, 3000, 6):
    p.delete("user:%d" % i)
p.execute()
users = {("user:%d" % i).encode() for i in range(3000) if i % 6}
bins = {b"bin:\x00\xff" + bytes([i]) for i in range(100)}
for node in (a, b):
    assert set(node.scan_iter(count=50)) == users | bins
    assert set(node.scan_iter(match="user:1*", count=1000)) == {k for k in users if k.startswith(b"user:1")}
    assert set(node.keys("bin:*")) == bins
    assert set(node.keys("user:2[0-4]?")) == {k for k in users if len(k) == 8 and k.startswith(b"user:2") and k[6] in b"01234"}
    assert list(node.scan_iter(_type="hash")) == []
assert a.type("user:1") == b"string" and b.type("user:0") == b"none"
cursor, keys = a.scan(0, count=5)
assert cursor != 0 and len(set(keys)) == len(keys)
print("ok")
"#;
    redis_py(script, &up)?;
    // redis-cli's own walk.
    let listed = cli(up.resp[1], &["--scan", "--pattern", "user:29*"])?;
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort_unstable();
    listed.dedup();
    let mut want: Vec<String> = (0..3000)
        .filter(|i| i % 6 != 0)
        .map(|i| format!("user:{i}"))
        .filter(|k| k.starts_with("user:29"))
        .collect();
    want.sort_unstable();
    assert_eq!(listed, want);
    assert_eq!(cli(up.resp[0], &["KEYS", "nothing*"])?, "\n");
    Ok(())
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Sends `request` and reads exactly `want.len()` bytes.
fn exchange(s: &mut TcpStream, request: &[u8], want: &[u8]) {
    s.write_all(request).unwrap();
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(
        got.escape_ascii().to_string(),
        want.escape_ascii().to_string()
    );
}

#[test]
fn garbage_and_vanishing_clients_do_not_disturb_others() -> anyhow::Result<()> {
    let up = up(&[])?;
    let addr = up.resp[0];
    let mut good = connect(addr);
    exchange(&mut good, b"SET k v\r\n", b"+OK\r\n");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut attacks: Vec<Vec<u8>> = vec![
        // Huge lengths: refused before anything is allocated for them.
        b"*1\r\n$99999999999\r\n".to_vec(),
        b"*2147483648\r\n".to_vec(),
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n".to_vec(),
        // Deep nesting: requests are arrays of bulk strings only.
        b"*1\r\n".repeat(10_000),
        // Half a frame, then the client vanishes.
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nhal".to_vec(),
        b"*100\r\n$1\r\na\r\n".to_vec(),
        // A line that never ends.
        vec![b'x'; 100 << 10],
    ];
    // A large write whose sender vanishes before the reply.
    let mut big = b"*3\r\n$3\r\nSET\r\n$6\r\nbigkey\r\n$1048576\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'z', 1 << 20));
    big.extend_from_slice(b"\r\n");
    attacks.push(big);
    for _ in 0..20 {
        let len = rng.random_range(1..4096);
        attacks.push((0..len).map(|_| rng.random::<u8>()).collect());
    }
    for attack in &attacks {
        let mut bad = connect(addr);
        // The server may close the connection before everything is written: that is its answer.
        let _ = bad.write_all(attack);
        drop(bad);
        exchange(&mut good, b"GET k\r\n", b"$1\r\nv\r\n");
    }
    // The vanished clients' connections are all gone; the good one is the only one left.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = cli(addr, &["INFO", "clients"])?;
        // redis-cli's own connection is one of them.
        if info.contains("connected_clients:2\r") {
            break;
        }
        assert!(Instant::now() < deadline, "connections stay open: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    exchange(&mut good, b"DEL k\r\n", b":1\r\n");
    Ok(())
}

/// A redis-server on a free loopback port, without persistence, stopped when dropped.
struct RedisServer {
    child: Child,
    addr: SocketAddr,
}

impl RedisServer {
    fn start() -> anyhow::Result<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = common::spawn(
            Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        let mut server = RedisServer {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while cli(server.addr, &["PING"]).ok().as_deref() != Some("PONG\n") {
            if let Some(status) = server.child.try_wait()? {
                anyhow::bail!("redis-server exited: {status}");
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "redis-server did not answer in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `requests` as one pipeline and reads one reply per request.
fn pipeline(addr: SocketAddr, requests: &[Vec<&[u8]>]) -> anyhow::Result<Vec<dinomo_resp::Value>> {
    use dinomo_resp::{Value, ValueLimits};
    let mut s = connect(addr);
    let mut wire = Vec::new();
    for r in requests {
        dinomo_resp::encode_request(r, &mut wire);
    }
    s.write_all(&wire)?;
    let (mut buf, mut replies) = (Vec::new(), Vec::new());
    let mut chunk = [0u8; 65536];
    while replies.len() < requests.len() {
        match Value::parse(&buf, &ValueLimits::default())? {
            Some((v, used)) => {
                buf.drain(..used);
                replies.push(v);
            }
            None => {
                let n = s.read(&mut chunk)?;
                anyhow::ensure!(n > 0, "{addr} closed the connection");
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    Ok(replies)
}

#[test]
fn probes_and_increment_errors_match_redis_server_reply_for_reply() -> anyhow::Result<()> {
    let up = up(&[])?;
    let redis = RedisServer::start()?;
    let (max, min) = (i64::MAX.to_string(), i64::MIN.to_string());
    let mut requests: Vec<Vec<&[u8]>> = Vec::new();
    // Keys of both KV nodes: the node asked serves some and forwards the others.
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for k in &keys {
        let k = k.as_bytes();
        requests.extend([
            vec![b"SET".as_slice(), k, b""],
            vec![b"EXISTS", k],
            vec![b"STRLEN", k],
            vec![b"APPEND", k, b"abc"],
            vec![b"STRLEN", k],
            vec![b"INCR", k],
            vec![b"SET", k, max.as_bytes()],
            vec![b"INCR", k],
            vec![b"INCRBY", k, b"1"],
            vec![b"DECRBY", k, b"-1"],
            vec![b"GET", k],
            vec![b"SET", k, min.as_bytes()],
            vec![b"DECR", k],
            vec![b"DECRBY", k, b"1"],
            vec![b"INCRBY", k, max.as_bytes()],
            vec![b"INCRBY", k, b"1x"],
            vec![b"DEL", k],
            vec![b"EXISTS", k, k],
            vec![b"STRLEN", k],
            vec![b"GET", k],
        ]);
    }
    assert_same_replies(up.resp[0], redis.addr, &requests)
}

#[test]
fn transactions_match_redis_server_reply_for_reply() -> anyhow::Result<()> {
    let up = up(&[])?;
    let redis = RedisServer::start()?;
    let mut requests: Vec<Vec<&[u8]>> = Vec::new();
    // Keys of both KV nodes, in one transaction: they run on the workers of both nodes of the process.
    let keys: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let k: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    requests.extend([
        vec![b"EXEC".as_slice()],
        vec![b"DISCARD"],
        vec![b"MULTI"],
        vec![b"SET", k[0], b"1"],
        vec![b"INCR", k[0]],
        vec![b"INCRBY", k[0], b"x"],
        vec![b"APPEND", k[1], b"abc"],
        vec![b"MSET", k[2], b"a", k[3], b"b", k[4], b"c"],
        vec![b"MGET", k[0], k[1], k[2], k[3], k[4], k[5]],
        vec![b"GETDEL", k[4]],
        vec![b"DEL", k[3], k[5]],
        vec![b"EXISTS", k[0], k[1], k[2], k[3], k[4], k[5]],
        vec![b"SET", k[5], b"v", b"NX", b"GET"],
        vec![b"SETRANGE", k[1], b"1", b"ZZ"],
        vec![b"PING"],
        vec![b"ECHO", b"hi"],
        vec![b"EXEC"],
        vec![b"MGET", k[0], k[1], k[2], k[3], k[4], k[5]],
        // DISCARD, then nothing open.
        vec![b"MULTI"],
        vec![b"SET", k[0], b"discarded"],
        vec![b"DISCARD"],
        vec![b"EXEC"],
        vec![b"GET", k[0]],
        // A nested MULTI is refused and changes nothing; an empty transaction answers an empty array.
        vec![b"MULTI"],
        vec![b"MULTI"],
        vec![b"EXEC"],
        // A command refused while queuing discards the transaction.
        vec![b"MULTI"],
        vec![b"SET", k[0], b"never"],
        vec![b"NOSUCHCOMMAND", b"x"],
        vec![b"EXEC"],
        vec![b"MULTI"],
        vec![b"SET", k[0], b"never"],
        vec![b"GET"],
        vec![b"EXEC"],
        vec![b"GET", k[0]],
        // RESET closes an open transaction.
        vec![b"MULTI"],
        vec![b"SET", k[0], b"never"],
        vec![b"RESET"],
        vec![b"EXEC"],
        vec![b"GET", k[0]],
        // WATCH: a watched key the connection itself changes (to another value) stops the next EXEC; EXEC, UNWATCH
        // and DISCARD forget the watched keys; WATCH is refused inside MULTI, where UNWATCH is queued.
        vec![b"WATCH", k[0], k[1], k[5]],
        vec![b"MULTI"],
        vec![b"GET", k[0]],
        vec![b"EXEC"],
        vec![b"WATCH", k[0], k[2]],
        vec![b"APPEND", k[2], b"!"],
        vec![b"MULTI"],
        vec![b"SET", k[0], b"not run"],
        vec![b"EXEC"],
        vec![b"GET", k[0]],
        vec![b"MULTI"],
        vec![b"SET", k[0], b"run"],
        vec![b"EXEC"],
        vec![b"WATCH", k[3]],
        vec![b"SET", k[3], b"created"],
        vec![b"UNWATCH"],
        vec![b"MULTI"],
        vec![b"WATCH", k[0]],
        vec![b"UNWATCH"],
        vec![b"GET", k[3]],
        vec![b"EXEC"],
        vec![b"WATCH", k[3]],
        vec![b"MULTI"],
        vec![b"DISCARD"],
        vec![b"DEL", k[3]],
        vec![b"MULTI"],
        vec![b"EXISTS", k[3]],
        vec![b"EXEC"],
        vec![b"WATCH"],
    ]);
    assert_same_replies(up.resp[0], redis.addr, &requests)
}

/// Sends `requests` as one pipeline to dinomo at `mine` and to redis-server at `theirs`; the replies must be the
/// same, one by one.
fn assert_same_replies(
    mine: SocketAddr,
    theirs: SocketAddr,
    requests: &[Vec<&[u8]>],
) -> anyhow::Result<()> {
    let from_dinomo = pipeline(mine, requests)?;
    let from_redis = pipeline(theirs, requests)?;
    for ((r, m), t) in requests.iter().zip(&from_dinomo).zip(&from_redis) {
        let shown: Vec<String> = r.iter().map(|a| a.escape_ascii().to_string()).collect();
        assert_eq!(m, t, "{shown:?}: dinomo answered {m:?}, redis-server {t:?}");
    }
    Ok(())
}

#[test]
fn bit_commands_match_redis_server_reply_for_reply() -> anyhow::Result<()> {
    let up = up(&[])?;
    let redis = RedisServer::start()?;
    let mut requests: Vec<Vec<&[u8]>> = Vec::new();
    let keys: Vec<String> = (0..6).map(|i| format!("b{i}")).collect();
    let positions: Vec<String> = (-20..=20).map(|i: i32| i.to_string()).collect();
    for k in &keys {
        let k = k.as_bytes();
        requests.extend([
            vec![b"GETBIT".as_slice(), k, b"7"],
            vec![b"BITCOUNT", k],
            vec![b"BITCOUNT", k, b"0", b"-1"],
            vec![b"BITPOS", k, b"0"],
            vec![b"BITPOS", k, b"1"],
            vec![b"SETBIT", k, b"7", b"1"],
            vec![b"SETBIT", k, b"7", b"1"],
            vec![b"GET", k],
            vec![b"SETBIT", k, b"100", b"0"],
            vec![b"STRLEN", k],
            vec![b"SETBIT", k, b"7", b"0"],
            vec![b"SETBIT", k, b"-1", b"1"],
            vec![b"SETBIT", k, b"x", b"1"],
            vec![b"SETBIT", k, b"4294967296", b"1"],
            vec![b"SETBIT", k, b"1", b"2"],
            vec![b"SETBIT", k, b"1", b"y"],
            vec![b"GETBIT", k, b"-1"],
            vec![b"GETBIT", k, b"999999"],
            vec![b"SET", k, b"foobar"],
            vec![b"BITCOUNT", k],
            vec![b"BITCOUNT", k, b"1", b"1"],
            vec![b"BITCOUNT", k, b"5", b"30", b"BIT"],
            vec![b"BITCOUNT", k, b"5", b"30", b"byte"],
            vec![b"BITCOUNT", k, b"5", b"30", b"bot"],
            vec![b"BITCOUNT", k, b"x", b"30"],
            vec![b"BITCOUNT", k, b"0"],
            vec![b"BITPOS", k, b"2"],
            vec![b"BITPOS", k, b"x"],
            vec![b"BITPOS", k, b"1", b"2", b"-1", b"BIT", b"extra"],
            vec![b"SET", k, b"\xff\xf0\x00"],
            vec![b"BITPOS", k, b"0"],
            vec![b"SET", k, b"\x00\xff\xf0"],
            vec![b"BITPOS", k, b"1", b"0"],
            vec![b"BITPOS", k, b"1", b"2"],
            vec![b"BITPOS", k, b"1", b"2", b"-1", b"BYTE"],
            vec![b"BITPOS", k, b"1", b"7", b"15", b"BIT"],
            vec![b"SET", k, b"\xff\xff"],
            vec![b"BITPOS", k, b"0"],
            vec![b"BITPOS", k, b"0", b"1"],
            vec![b"BITPOS", k, b"0", b"0", b"-1"],
            vec![b"BITPOS", k, b"0", b"3", b"BIT"],
            vec![b"SET", k, b""],
            vec![b"BITPOS", k, b"0"],
            vec![b"BITCOUNT", k, b"0", b"-1"],
            vec![b"DEL", k],
        ]);
    }
    // Every range over a 3-byte value with bits on both sides, in bytes and in bits.
    let k = keys[0].as_bytes();
    requests.push(vec![b"SET", k, b"\x0f\xa5\xf0"]);
    for start in &positions {
        for end in &positions {
            for unit in [b"BYTE".as_slice(), b"BIT"] {
                requests.push(vec![b"BITCOUNT", k, start.as_bytes(), end.as_bytes(), unit]);
                for bit in [b"0".as_slice(), b"1"] {
                    requests.push(vec![
                        b"BITPOS",
                        k,
                        bit,
                        start.as_bytes(),
                        end.as_bytes(),
                        unit,
                    ]);
                }
            }
        }
        for bit in [b"0".as_slice(), b"1"] {
            requests.push(vec![b"BITPOS", k, bit, start.as_bytes()]);
        }
    }
    assert_same_replies(up.resp[0], redis.addr, &requests)
}

#[test]
fn string_commands_of_redis_6_and_7_match_redis_server_reply_for_reply() -> anyhow::Result<()> {
    let up = up(&[])?;
    let redis = RedisServer::start()?;
    let mut requests: Vec<Vec<&[u8]>> = Vec::new();
    // Keys of both KV nodes: the node asked serves some and forwards the others.
    let keys: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    for k in &keys {
        let k = k.as_bytes();
        requests.extend([
            vec![b"GETRANGE".as_slice(), k, b"0", b"-1"],
            vec![b"SET", k, b"This is a string"],
            vec![b"GETRANGE", k, b"0", b"3"],
            vec![b"GETRANGE", k, b"-3", b"-1"],
            vec![b"GETRANGE", k, b"-1", b"-5"],
            vec![b"GETRANGE", k, b"-100", b"-20"],
            vec![b"SUBSTR", k, b"10", b"100"],
            vec![b"GETRANGE", k, b"x", b"1"],
            vec![b"SETRANGE", k, b"10", b"STRING!"],
            vec![b"SETRANGE", k, b"20", b"far"],
            vec![b"SETRANGE", k, b"0", b""],
            vec![b"SETRANGE", k, b"-1", b"x"],
            vec![b"GET", k],
            vec![b"GETDEL", k],
            vec![b"GETDEL", k],
            vec![b"SETRANGE", k, b"3", b""],
            vec![b"EXISTS", k],
            vec![b"SETRANGE", k, b"3", b"abc"],
            vec![b"GET", k],
            vec![b"INCRBYFLOAT", k, b"1"],
            vec![b"SET", k, b"10.50"],
            vec![b"INCRBYFLOAT", k, b"0.1"],
            // Sums exact in binary from here: Redis adds 80-bit long doubles, dinomo doubles, and their inexact
            // sums differ in the last digits (5.6 + 5000 is 5005.60000000000000009 there, 5005.6 here).
            vec![b"SET", k, b"3.5"],
            vec![b"INCRBYFLOAT", k, b"-5"],
            vec![b"INCRBYFLOAT", k, b"5.0e3"],
            vec![b"INCRBYFLOAT", k, b"-4998.5"],
            vec![b"INCRBYFLOAT", k, b"0.125"],
            vec![b"INCRBYFLOAT", k, b"nan"],
            vec![b"INCRBYFLOAT", k, b"inf"],
            // Beyond a long double too (a double ends near 1.8e308, where dinomo refuses).
            vec![b"INCRBYFLOAT", k, b"1e5000"],
            vec![b"INCRBYFLOAT", k, b" 1"],
            vec![b"INCRBYFLOAT", k, b"1 "],
            vec![b"GET", k],
            vec![b"SET", k, b"a", b"NX", b"GET"],
            vec![b"SET", k, b"b", b"XX", b"GET"],
            vec![b"GETDEL", k],
            vec![b"SET", k, b"c", b"XX", b"GET"],
            vec![b"SET", k, b"d", b"NX", b"GET"],
            vec![b"GET", k],
            vec![b"TTL", k],
            vec![b"PTTL", k],
            vec![b"EXPIRETIME", k],
            vec![b"PEXPIRETIME", k],
            vec![b"PERSIST", k],
            vec![b"GETEX", k],
            vec![b"GETEX", k, b"PERSIST"],
            vec![b"GETEX", k, b"EX"],
            vec![b"GETEX", k, b"EX", b"0"],
            vec![b"GETEX", k, b"PERSIST", b"EX", b"10"],
            vec![b"TOUCH", k, k, b"nothere"],
            vec![b"DEL", k],
            vec![b"TTL", k],
            vec![b"PERSIST", k],
            vec![b"GETEX", k],
        ]);
    }
    requests.extend([
        vec![b"CLIENT".as_slice(), b"SETNAME", b"named"],
        vec![b"RESET"],
        vec![b"CLIENT", b"GETNAME"],
        vec![b"RESET", b"now"],
        vec![b"SET", b"left", b"1"],
        vec![b"FLUSHALL", b"NOW"],
        vec![b"FLUSHDB", b"ASYNC"],
        vec![b"DBSIZE"],
        vec![b"EXISTS", b"left"],
        vec![b"FLUSHALL"],
    ]);
    assert_same_replies(up.resp[1], redis.addr, &requests)?;
    // Every key of every node is gone.
    for addr in &up.resp {
        assert_eq!(cli(*addr, &["DBSIZE"])?, "0\n");
    }
    Ok(())
}
