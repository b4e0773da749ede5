//! A cluster of real processes on loopback — `dinomo dpm`, three `dinomo kn`, `dinomo rn` and `dinomo mnode` — in
//! which a KV node is SIGKILLed under load: its keys are served again by the others (the memory node merged its
//! log), every acknowledged write is there, and a node started later joins. Once with the memory node's index shared
//! (DINOMO), once partitioned per KV node (`--partitioning per-node`, DINOMO-N: the keys' data moves between the
//! nodes' partitions). Every process shares one cluster token, given through `DINOMO_CLUSTER_TOKEN`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dinomo_cluster::{Client, ClientConfig};
use dinomo_resp::{Value, ValueLimits, encode_request};

/// The cluster token every process of these tests is given.
const TOKEN: &str = "process-test-token";

struct Proc {
    child: Child,
    banner: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `dinomo <args>` and returns once it printed its banner.
fn start(args: &[&str]) -> anyhow::Result<Proc> {
    start_with_banner(args, 1)
}

/// Starts `dinomo <args>` and returns once it printed the first `lines` lines, which make its banner.
fn start_with_banner(args: &[&str], lines: usize) -> anyhow::Result<Proc> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(args)
        .env("DINOMO_LOG", "warn")
        .env("DINOMO_CLUSTER_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut banner = String::new();
    for _ in 0..lines {
        let before = banner.len();
        stdout.read_line(&mut banner)?;
        anyhow::ensure!(
            banner.len() > before,
            "dinomo {args:?} exited without a banner: {:?}",
            child.wait()?
        );
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in stdout.lines() {});
    Ok(Proc { child, banner })
}

/// Starts a memory node; returns it with its fabric address and its metrics address.
fn dpm(pool: &Path, partitioning: &str) -> anyhow::Result<(Proc, String, String)> {
    let p = start_with_banner(
        &[
            "dpm",
            "--metrics-listen",
            "127.0.0.1:0",
            "--partitioning",
            partitioning,
            "--listen",
            "127.0.0.1:0",
            "--size",
            "128MiB",
            "--segment-size",
            "1MiB",
            "--log-segment-size",
            "1MiB",
            "--merge-threads",
            "2",
            "--pool",
            pool.to_str().expect("utf-8 path"),
        ],
        2,
    )?;
    let addr = p
        .banner
        .split_whitespace()
        .nth(4)
        .expect("address in banner")
        .to_string();
    let metrics = p
        .banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("metrics on http://"))
        .and_then(|a| a.strip_suffix("/metrics"))
        .expect("metrics address in banner")
        .to_string();
    Ok((p, addr, metrics))
}

/// The value of the sample `name` (without labels) on the `/metrics` page at `addr`.
fn scrape(addr: &str, name: &str) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")?;
    let mut page = String::new();
    conn.read_to_string(&mut page)?;
    let value = page
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .ok_or_else(|| anyhow::anyhow!("no sample {name} in:\n{page}"))?;
    Ok(value.trim().parse()?)
}

fn kn(dpm: &str, id: u32) -> anyhow::Result<Proc> {
    kn_with(dpm, id, SHORT_LEASE_MS, &[])
}

/// The KV nodes' lease in most of these tests, in milliseconds: a failed node is noticed within about that.
const SHORT_LEASE_MS: &str = "300";

/// A KV node with a lease of `lease_ms` milliseconds, given `extra` flags too; with `--resp-listen`, its banner's
/// second line says where RESP listens.
fn kn_with(dpm: &str, id: u32, lease_ms: &str, extra: &[&str]) -> anyhow::Result<Proc> {
    let lines = if extra.contains(&"--resp-listen") {
        2
    } else {
        1
    };
    let args = [
        "kn",
        "--dpm",
        dpm,
        "--node-id",
        &id.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--max-value",
        "64KiB",
        "--lease-ms",
        lease_ms,
        "--heartbeat-ms",
        "20",
    ];
    start_with_banner(&[&args[..], extra].concat(), lines)
}

fn value(i: u32, v: u32) -> Vec<u8> {
    format!("v{i}-{v}").into_bytes()
}

/// A memory node, an M-node, a routing node and `kns` KV nodes (ids 1 to `kns`), each its own process. Killed in
/// field order: the KV nodes first, the memory node last.
struct Cluster {
    nodes: Vec<Proc>,
    _rn: Proc,
    rn_addr: String,
    _mnode: Proc,
    dpm: Proc,
    dpm_addr: String,
    dpm_metrics: String,
}

impl Cluster {
    fn start(pool: &Path, partitioning: &str, kns: u32) -> anyhow::Result<Cluster> {
        Cluster::start_with_lease(pool, partitioning, kns, SHORT_LEASE_MS)
    }

    /// [`Cluster::start`] with KV nodes whose lease is `lease_ms` milliseconds.
    fn start_with_lease(
        pool: &Path,
        partitioning: &str,
        kns: u32,
        lease_ms: &str,
    ) -> anyhow::Result<Cluster> {
        let (dpm, dpm_addr, dpm_metrics) = dpm(pool, partitioning)?;
        let mnode = start(&["mnode", "--dpm", &dpm_addr, "--lease-ms", "500"])?;
        let rn = start(&["rn", "--dpm", &dpm_addr, "--listen", "127.0.0.1:0"])?;
        let rn_addr = rn
            .banner
            .split_whitespace()
            .nth(4)
            .expect("address")
            .to_string();
        let nodes = (1..=kns)
            .map(|id| kn_with(&dpm_addr, id, lease_ms, &[]))
            .collect::<Result<_, _>>()?;
        Ok(Cluster {
            nodes,
            _rn: rn,
            rn_addr,
            _mnode: mnode,
            dpm,
            dpm_addr,
            dpm_metrics,
        })
    }

    /// A client seeded with the routing node.
    fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect(ClientConfig {
            seeds: vec![self.rn_addr.clone()],
            token: TOKEN.into(),
            op_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        })?)
    }
}

/// Refreshes `client`'s routing table until `want` holds of it; fails with `what` after 20 s.
fn wait_for_ring(
    client: &mut Client,
    want: impl Fn(&dinomo_cluster::Routing) -> bool,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        client.refresh_routing();
        if client.routing().is_some_and(&want) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sigkilled_kv_node_is_replaced_without_losing_acknowledged_writes() -> anyhow::Result<()> {
    kill_and_join("shared")
}

#[test]
fn a_sigkilled_shared_nothing_kv_node_is_replaced_without_losing_acknowledged_writes()
-> anyhow::Result<()> {
    kill_and_join("per-node")
}

fn kill_and_join(partitioning: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(&dir.path().join("pool"), partitioning, 3)?;
    let layout = match partitioning {
        "per-node" => "0 index partitions",
        _ => "one shared index",
    };
    assert!(
        cluster.dpm.banner.contains(layout),
        "{}",
        cluster.dpm.banner
    );
    let mut client = cluster.client()?;
    // Wait for the M-node to add all three.
    wait_for_ring(
        &mut client,
        |r| r.ring.len() == 3,
        "three nodes never joined",
    )?;
    let n = 300;
    for i in 0..n {
        client.set(format!("key{i}").as_bytes(), &value(i, 0))?;
    }
    // Kill the owner of key 0 while a writer keeps writing.
    let victim = client.owner(b"key0").expect("owner");
    let writer = {
        let mut c = cluster.client()?;
        std::thread::spawn(move || -> anyhow::Result<u32> {
            for i in 0..n {
                match c.set(format!("key{i}").as_bytes(), &value(i, 1)) {
                    Ok(()) => {}
                    // The write in flight at the kill may or may not have landed.
                    Err(dinomo_cluster::ClientError::Indeterminate(_)) => return Ok(i),
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(n)
        })
    };
    std::thread::sleep(Duration::from_millis(5));
    let killed_at = Instant::now();
    let idx = (victim - 1) as usize;
    cluster.nodes[idx].child.kill()?; // SIGKILL
    cluster.nodes[idx].child.wait()?;
    let acknowledged = writer.join().expect("writer")?;

    // Every key is served again, with its last acknowledged value (or the in-flight one).
    for i in 0..n {
        let got = client.get(format!("key{i}").as_bytes())?;
        let ok = if i < acknowledged {
            got == Some(value(i, 1))
        } else if i == acknowledged {
            got == Some(value(i, 0)) || got == Some(value(i, 1))
        } else {
            got == Some(value(i, 0))
        };
        assert!(
            ok,
            "key{i}: {got:?} (writer acknowledged up to {acknowledged})"
        );
    }
    let served_again = killed_at.elapsed();
    assert!(!client.routing().expect("routing").ring.contains(victim));
    eprintln!("all keys served {served_again:?} after the SIGKILL");

    // A new node joins and takes a share.
    cluster.nodes.push(kn(&cluster.dpm_addr, 4)?);
    wait_for_ring(&mut client, |r| r.ring.contains(4), "node 4 never joined")?;
    for i in 0..n {
        assert!(client.get(format!("key{i}").as_bytes())?.is_some());
    }
    // The memory node's walk over the keys (SCAN, KEYS) lists them all, the dead node's logs taken over included.
    let mut want: Vec<Vec<u8>> = (0..n).map(|i| format!("key{i}").into_bytes()).collect();
    want.sort();
    assert_eq!(client.keys(b"key*")?, want);
    Ok(())
}

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(p: &Proc, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &p.child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} failed: {status}");
    Ok(())
}

/// Freezes `p` (SIGSTOP) and returns once every one of its threads is stopped. `kill` returns as soon as the
/// signal is queued; the kernel wakes one thread to begin the stop, and only when that thread runs are the others
/// told to stop. On a loaded machine that can take tens of milliseconds, in which the other threads go on serving.
fn freeze(p: &Proc) -> anyhow::Result<()> {
    signal(p, "STOP")?;
    let tasks = format!("/proc/{}/task", p.child.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut running = 0;
        for task in std::fs::read_dir(&tasks)? {
            // A thread that exited meanwhile has no stat to read: it serves nothing either.
            let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
                continue;
            };
            // The state follows the command name, which is in parentheses and may hold spaces.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            if !matches!(state, Some("T" | "t")) {
                running += 1;
            }
        }
        if running == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{running} threads of process {} still run after SIGSTOP",
            p.child.id()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A KV node frozen (SIGSTOP) for longer than its lease, as a starved process is, is declared failed and its keys
/// go to the other node. Woken again, it finds its lease expired, serves nothing under the old table, restarts
/// itself with the same id and rejoins; every write made while it was frozen is read back through it.
#[test]
fn a_kv_node_frozen_past_its_lease_restarts_itself_and_rejoins() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(&dir.path().join("pool"), "shared", 2)?;
    let mut client = cluster.client()?;
    wait_for_ring(&mut client, |r| r.ring.len() == 2, "two nodes never joined")?;
    let n = 200;
    for i in 0..n {
        client.set(format!("key{i}").as_bytes(), &value(i, 0))?;
    }
    let frozen = client.owner(b"key0").expect("owner");
    let idx = (frozen - 1) as usize;
    freeze(&cluster.nodes[idx])?;
    wait_for_ring(
        &mut client,
        |r| !r.ring.contains(frozen),
        "the frozen node was never declared failed",
    )?;
    // The take-over revoked the frozen node at the memory node: its connections were closed, so nothing it had
    // on its way when it froze lands once it wakes.
    let revoked = scrape(&cluster.dpm_metrics, "dinomo_dpm_revoked_connections_total")?;
    assert!(revoked >= 1.0, "{revoked} connections revoked");
    for i in 0..n {
        client.set(format!("key{i}").as_bytes(), &value(i, 1))?;
    }
    signal(&cluster.nodes[idx], "CONT")?;
    wait_for_ring(
        &mut client,
        |r| r.ring.contains(frozen),
        "the woken node never rejoined",
    )?;
    assert!(
        cluster.nodes[idx].child.try_wait()?.is_none(),
        "the woken node exited instead of restarting"
    );
    for i in 0..n {
        assert_eq!(
            client.get(format!("key{i}").as_bytes())?,
            Some(value(i, 1)),
            "key{i}"
        );
    }
    assert_eq!(
        client.owner(b"key0"),
        Some(frozen),
        "key0 is back at the node that owned it"
    );
    the_command_line_tools_present_the_token(&cluster.rn_addr)
}

/// `dinomo kv` and `dinomo status` present the token they are given, and without it are refused with the reason.
fn the_command_line_tools_present_the_token(rn: &str) -> anyhow::Result<()> {
    let tool = |args: &[&str], token: Option<&str>| -> anyhow::Result<std::process::Output> {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dinomo"));
        c.args(args).env("DINOMO_LOG", "warn");
        match token {
            Some(t) => c.env("DINOMO_CLUSTER_TOKEN", t),
            None => c.env_remove("DINOMO_CLUSTER_TOKEN"),
        };
        Ok(c.output()?)
    };
    let set = tool(&["kv", "--seed", rn, "set", "cli", "yes"], Some(TOKEN))?;
    assert!(set.status.success(), "{set:?}");
    let get = tool(&["kv", "--seed", rn, "get", "cli"], Some(TOKEN))?;
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "yes");
    let keys = tool(&["kv", "--seed", rn, "keys", "c?i"], Some(TOKEN))?;
    assert_eq!(String::from_utf8_lossy(&keys.stdout), "cli\n", "{keys:?}");
    let status = tool(
        &["status", "--seed", rn, "--window-ms", "50", "--json"],
        Some(TOKEN),
    )?;
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("\"alive\": true"));
    for args in [
        &["kv", "--seed", rn, "get", "cli"][..],
        &["status", "--seed", rn, "--window-ms", "50"][..],
    ] {
        let refused = tool(args, None)?;
        assert!(!refused.status.success(), "{args:?} ran without the token");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("wrong cluster token"), "{args:?}: {stderr}");
    }
    Ok(())
}

/// A plain RESP connection: requests encoded by [`encode_request`], replies read by [`Value::parse`].
struct RespConn {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl RespConn {
    fn open(addr: &str) -> anyhow::Result<RespConn> {
        let stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(RespConn {
            stream,
            buf: Vec::new(),
        })
    }

    fn send(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        use std::io::Write;
        let mut wire = Vec::new();
        encode_request(args, &mut wire);
        self.stream.write_all(&wire)?;
        Ok(())
    }

    fn read(&mut self) -> anyhow::Result<Value> {
        use std::io::Read;
        loop {
            if let Some((v, used)) = Value::parse(&self.buf, &ValueLimits::default())? {
                self.buf.drain(..used);
                return Ok(v);
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk)?;
            anyhow::ensure!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Whether a reply (or part of one) has arrived and is not read yet.
    fn has_input(&mut self) -> anyhow::Result<bool> {
        if !self.buf.is_empty() {
            return Ok(true);
        }
        self.stream.set_nonblocking(true)?;
        let peeked = self.stream.peek(&mut [0u8; 1]);
        self.stream.set_nonblocking(false)?;
        match peeked {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// A KV node's Redis front door forwards a command on a key another node owns without waiting for it on its event
/// loop: with that owner frozen (SIGSTOP), the connection waiting for it gets no reply, while another connection
/// of the same event loop (there is one) is answered command after command, both for keys the front door's node
/// owns and for keys of a third node, forwarded by the same forwarding thread. Once the owner is woken the waiting
/// connection is answered (by the owner, or with an error once the forwarding client's deadline passed) and goes
/// on serving.
#[test]
fn a_frozen_owner_holds_up_only_the_commands_forwarded_to_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Leases far longer than the test, so that only the freeze holds up the owner: a lease lapsing on a loaded
    // machine would move the owner's keys, and the forwarded GET would rightly be answered by the new owner.
    let lease_ms = "20000";
    let mut cluster = Cluster::start_with_lease(&dir.path().join("pool"), "shared", 2, lease_ms)?;
    let front = kn_with(
        &cluster.dpm_addr,
        3,
        lease_ms,
        &["--resp-listen", "127.0.0.1:0"],
    )?;
    let resp_addr = front
        .banner
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().last())
        .expect("the RESP address in the banner")
        .to_string();
    cluster.nodes.push(front);
    let mut client = cluster.client()?;
    wait_for_ring(
        &mut client,
        |r| r.ring.len() == 3,
        "three nodes never joined",
    )?;
    // A key of the node to freeze (1), and keys of the live node (2) and the front door's node (3), in turn.
    let keys: Vec<String> = (0..600).map(|i| format!("key{i}")).collect();
    let far = keys
        .iter()
        .find(|k| client.owner(k.as_bytes()) == Some(1))
        .expect("node 1 owns a key")
        .clone();
    let owned_by = |node: u32| -> Vec<&String> {
        keys.iter()
            .filter(|k| client.owner(k.as_bytes()) == Some(node))
            .take(25)
            .collect()
    };
    let (live, own) = (owned_by(2), owned_by(3));
    anyhow::ensure!(live.len() == 25 && own.len() == 25, "too few keys per node");
    let mine = own[0].as_bytes().to_vec();
    let near: Vec<&String> = live
        .into_iter()
        .zip(own)
        .flat_map(|(a, b)| [a, b])
        .collect();
    client.set(far.as_bytes(), b"far")?;
    let epoch = client.routing().map(|r| r.epoch());
    for k in &near {
        client.set(k.as_bytes(), k.as_bytes())?;
    }

    let mut waiting = RespConn::open(&resp_addr)?;
    let mut other = RespConn::open(&resp_addr)?;
    let bulk = |b: &[u8]| Value::Bulk(b.to_vec());
    // Both connections are served: the RESP server and the forwarding client are warm.
    waiting.send(&[b"GET", far.as_bytes()])?;
    assert_eq!(waiting.read()?, bulk(b"far"));

    freeze(&cluster.nodes[0])?;
    let frozen_at = Instant::now();
    waiting.send(&[b"GET", far.as_bytes()])?;
    // The forwarding client gives up on the frozen owner after its deadline (5 s): every command of the other
    // connection is answered well before that, one at a time, each after the forwarded one was sent.
    for k in &near {
        other.send(&[b"GET", k.as_bytes()])?;
        assert_eq!(other.read()?, bulk(k.as_bytes()));
    }
    let served_in = frozen_at.elapsed();
    assert!(
        served_in < Duration::from_secs(4),
        "the other connection took {served_in:?}: it waited for the frozen owner"
    );
    let answered_while_frozen = waiting.has_input()?;
    client.refresh_routing();
    let epoch_now = client.routing().map(|r| r.epoch());
    assert_eq!(
        epoch_now, epoch,
        "the cluster was reconfigured during the test: the owner did not stay the owner"
    );
    assert!(
        !answered_while_frozen,
        "the forwarded GET was answered while its owner was frozen"
    );

    signal(&cluster.nodes[0], "CONT")?;
    let answer = waiting.read()?;
    assert!(
        answer == bulk(b"far") || matches!(&answer, Value::Error(e) if e.starts_with(b"ERR")),
        "the forwarded GET got {answer:?}"
    );
    waiting.send(&[b"PING"])?;
    assert_eq!(waiting.read()?, Value::Simple(b"PONG".to_vec()));

    // A transaction runs on the workers of the serving process: one with a key of another process is refused,
    // nothing of it applied; one on the front door's own keys runs.
    let queued = Value::Simple(b"QUEUED".to_vec());
    let ok = Value::Simple(b"OK".to_vec());
    for (args, reply) in [
        (vec![b"MULTI".as_slice()], ok.clone()),
        (vec![b"SET", &mine, b"in a transaction"], queued.clone()),
        (
            vec![b"SET", far.as_bytes(), b"in a transaction"],
            queued.clone(),
        ),
    ] {
        other.send(&args)?;
        assert_eq!(other.read()?, reply);
    }
    other.send(&[b"EXEC"])?;
    let refused = other.read()?;
    assert!(
        matches!(&refused, Value::Error(e) if e.starts_with(b"ERR the transaction did not run, nothing was applied: 1 of its 2 operations are on keys of KV nodes in other processes")),
        "{refused:?}"
    );
    other.send(&[b"GET", &mine])?;
    assert_eq!(other.read()?, bulk(mine.as_slice()));
    other.send(&[b"GET", far.as_bytes()])?;
    assert_eq!(other.read()?, bulk(b"far"));
    for (args, reply) in [
        (vec![b"MULTI".as_slice()], ok.clone()),
        (vec![b"APPEND", &mine, b"!"], queued.clone()),
    ] {
        other.send(&args)?;
        assert_eq!(other.read()?, reply);
    }
    other.send(&[b"EXEC"])?;
    assert_eq!(
        other.read()?,
        Value::Array(vec![Value::Integer(mine.len() as i64 + 1)])
    );
    eprintln!(
        "{} commands answered in {served_in:?} while the owner was frozen; the forwarded GET got {answer:?} after {:?}",
        near.len(),
        frozen_at.elapsed()
    );
    Ok(())
}
