//! `dinomo dpm` as a real process on loopback: SIGKILL and restart on the same pool file keeps every acknowledged
//! write; SIGTERM stops cleanly; bad pool files are refused untouched; a KV node refuses a memory node restarted on
//! another pool and goes on serving once it is back on its own.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dinomo_fabric::{Connector, DATA_REGION, Endpoint, Target};

const TOKEN: &str = "integration-token";

struct Dpm {
    child: Child,
    addr: SocketAddr,
    banner: String,
    stdout: BufReader<std::process::ChildStdout>,
}

/// A test that fails midway leaves no memory node running behind it.
impl Drop for Dpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A KV node of two workers with no cache: every read goes to the memory node (a cached value is answered without
/// it).
fn uncached_kn() -> dinomo_kn::KnConfig {
    dinomo_kn::KnConfig {
        threads: 2,
        max_value_len: 4096,
        cache: dinomo_cache::CacheConfig {
            budget_bytes: 0,
            ..Default::default()
        },
        ..dinomo_kn::KnConfig::default()
    }
}

/// A memory node serving raw registered memory (these tests use the pool directly).
fn start_dpm(pool: &Path) -> anyhow::Result<Dpm> {
    start_dpm_with(pool, &["--fabric-only"])
}

fn start_dpm_with(pool: &Path, extra: &[&str]) -> anyhow::Result<Dpm> {
    start_dpm_on(pool, "127.0.0.1:0", extra)
}

fn start_dpm_on(pool: &Path, listen: &str, extra: &[&str]) -> anyhow::Result<Dpm> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args([
            "dpm",
            "--listen",
            listen,
            "--size",
            "64MiB",
            "--segment-size",
            "1MiB",
            "--pool",
        ])
        .arg(pool)
        .args(extra)
        .env("DINOMO_CLUSTER_TOKEN", TOKEN)
        .env("DINOMO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut banner = String::new();
    stdout.read_line(&mut banner)?;
    let Some(addr) = banner.split_whitespace().nth(4) else {
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut err)?;
        let status = child.wait()?;
        anyhow::bail!("dpm did not start ({status}): {err}");
    };
    Ok(Dpm {
        addr: addr.parse()?,
        banner,
        child,
        stdout,
    })
}

/// A connector to the memory node at `addr` that presents the cluster token.
fn connector(addr: SocketAddr) -> Connector {
    let mut c = Connector::new(Target::Tcp(addr));
    c.config.cluster_token = TOKEN.into();
    c
}

fn connect(addr: SocketAddr) -> Endpoint {
    connector(addr).connect().expect("connect to dpm")
}

fn pattern(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i.wrapping_mul(31).wrapping_add(k as u64 * 7) % 251) as u8)
        .collect()
}

const BLOCK: usize = 512;

#[test]
fn every_acknowledged_write_survives_sigkill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("dpm.pool");
    let mut next = 0u64; // Next block index to write; blocks 0..acked are acknowledged.
    for round in 0..4 {
        let mut dpm = start_dpm(&pool).unwrap();
        if round > 0 {
            assert!(
                dpm.banner.contains("unclean"),
                "a SIGKILLed pool must be reported unclean: {}",
                dpm.banner
            );
        }
        let mut ep = connect(dpm.addr);
        let r = ep.region(DATA_REGION).unwrap().clone();
        let capacity = r.len / BLOCK as u64 - 1;
        // The counter at the region start counts blocks whose FAA landed. The FAA in flight at the kill may have
        // executed without being acknowledged, so the counter is the acknowledged count or one more; either way
        // each block it counts was written (and acknowledged) before its FAA was sent.
        let mut word = [0u8; 8];
        ep.read(r.at(r.start), &mut word).unwrap();
        let counted = u64::from_le_bytes(word);
        assert!(
            counted == next || counted == next + 1,
            "round {round}: counter {counted}, acknowledged {next}"
        );
        next = counted;
        let mut buf = vec![0u8; BLOCK];
        for i in 0..next {
            ep.read(r.at(r.start + 8 + i * BLOCK as u64), &mut buf)
                .unwrap();
            assert_eq!(
                buf,
                pattern(i, BLOCK),
                "block {i} lost after restart {round}"
            );
        }

        // Write at full speed from another thread; kill the process underneath it.
        let acked = Arc::new(AtomicU64::new(next));
        let stop = Arc::new(AtomicBool::new(false));
        // Connected before the kill timer starts: on a loaded machine a connect may take longer than the timer.
        let writer_ep = connect(dpm.addr);
        let writer = {
            let (acked, stop) = (acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut ep = writer_ep;
                let r = ep.region(DATA_REGION).unwrap().clone();
                let mut i = acked.load(Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(10);
                while !stop.load(Ordering::SeqCst) && i < capacity && Instant::now() < deadline {
                    if ep
                        .write(r.at(r.start + 8 + i * BLOCK as u64), &pattern(i, BLOCK))
                        .is_err()
                    {
                        return;
                    }
                    // The counter at the region start counts acknowledged blocks.
                    if ep.faa(r.at(r.start), 1).is_err() {
                        return;
                    }
                    i += 1;
                    acked.store(i, Ordering::SeqCst);
                }
            })
        };
        // The kill lands while the writer is writing: after its first acknowledgement (bounded wait).
        let started = Instant::now();
        while acked.load(Ordering::SeqCst) == next && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(30 + round * 20));
        dpm.child.kill().unwrap(); // SIGKILL
        dpm.child.wait().unwrap();
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        let now = acked.load(Ordering::SeqCst);
        assert!(now > next, "round {round}: the writer made no progress");
        next = now;
    }
    let dpm = start_dpm(&pool).unwrap();
    let mut ep = connect(dpm.addr);
    let r = ep.region(DATA_REGION).unwrap().clone();
    let mut word = [0u8; 8];
    ep.read(r.at(r.start), &mut word).unwrap();
    let counted = u64::from_le_bytes(word);
    assert!(
        counted == next || counted == next + 1,
        "counter {counted}, acknowledged {next}"
    );
    stop_with_sigterm(dpm);
}

fn stop_with_sigterm(mut dpm: Dpm) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(dpm.child.id() as i32, libc::SIGTERM) };
    let status = dpm.child.wait().unwrap();
    assert!(status.success(), "dpm exited with {status} on SIGTERM");
    let mut rest = String::new();
    let mut line = String::new();
    while dpm.stdout.read_line(&mut line).unwrap_or(0) > 0 {
        rest.push_str(&line);
        line.clear();
    }
    rest
}

#[test]
fn sigterm_stops_cleanly_and_the_restart_sees_a_clean_pool() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("clean.pool");
    let dpm = start_dpm(&pool).unwrap();
    let mut ep = connect(dpm.addr);
    let r = ep.region(DATA_REGION).unwrap().clone();
    ep.write(r.at(r.start + 4096), b"kept across a clean restart")
        .unwrap();
    drop(ep);
    let tail = stop_with_sigterm(dpm);
    assert!(tail.contains("stopped cleanly"), "{tail}");
    let dpm = start_dpm(&pool).unwrap();
    assert!(dpm.banner.contains("opened clean"), "{}", dpm.banner);
    let mut ep = connect(dpm.addr);
    let r = ep.region(DATA_REGION).unwrap().clone();
    let mut buf = vec![0u8; 27];
    ep.read(r.at(r.start + 4096), &mut buf).unwrap();
    assert_eq!(&buf, b"kept across a clean restart");
    stop_with_sigterm(dpm);
}

#[test]
fn a_corrupt_or_foreign_pool_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("bad.pool");
    std::fs::write(&pool, vec![0x42u8; 1 << 20]).unwrap();
    let before = std::fs::read(&pool).unwrap();
    let err = start_dpm(&pool).err().expect("must refuse");
    assert!(err.to_string().contains("not a dinomo pool"), "{err}");
    assert_eq!(std::fs::read(&pool).unwrap(), before);

    // A real pool with one flipped superblock bit.
    let good = dir.path().join("good.pool");
    stop_with_sigterm(start_dpm(&good).unwrap());
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[20] ^= 4;
    std::fs::write(&good, &bytes).unwrap();
    let err = start_dpm(&good).err().expect("must refuse");
    assert!(err.to_string().contains("corrupt superblock"), "{err}");
    assert_eq!(std::fs::read(&good).unwrap(), bytes);
}

#[test]
fn two_memory_nodes_cannot_share_a_pool_file() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("shared.pool");
    let first = start_dpm(&pool).unwrap();
    let err = start_dpm(&pool).err().expect("second must refuse");
    assert!(err.to_string().contains("locked"), "{err}");
    stop_with_sigterm(first);
}

/// A KV node over TCP writes through the data plane of a `dinomo dpm` process; the process is SIGKILLed without
/// the log ever being sealed, and after a restart every acknowledged write is there.
#[test]
fn kv_node_over_tcp_survives_a_memory_node_sigkill() {
    use dinomo_kn::{KnConfig, KvNode};
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("kv.pool");
    let extra = ["--log-segment-size", "1MiB", "--merge-threads", "2"];
    let mut dpm = start_dpm_with(&pool, &extra).unwrap();
    assert!(dpm.banner.contains("0 logs"), "{}", dpm.banner);
    let kn = KvNode::start(
        KnConfig {
            threads: 2,
            max_value_len: 4096,
            ..KnConfig::default()
        },
        connector(dpm.addr),
    )
    .unwrap();
    let h = kn.handle();
    for i in 0..500u32 {
        h.set(format!("key{i}").as_bytes(), &pattern(i as u64, 100))
            .unwrap();
    }
    assert!(h.delete(b"key7").unwrap());
    assert_eq!(h.get(b"key8").unwrap(), Some(pattern(8, 100)));
    dpm.child.kill().unwrap();
    dpm.child.wait().unwrap();
    // The KV node notices on its next round trip.
    assert!(h.get(b"never-written").is_err());
    kn.stop();

    let dpm = start_dpm_with(&pool, &extra).unwrap();
    assert!(
        dpm.banner.contains("after an unclean shutdown"),
        "{}",
        dpm.banner
    );
    assert!(
        dpm.banner
            .contains("2 logs, one shared index, 499 keys, 501 entries recovered"),
        "{}",
        dpm.banner
    );
    let kn = KvNode::start(uncached_kn(), connector(dpm.addr)).unwrap();
    let h = kn.handle();
    for i in 0..500u32 {
        let want = (i != 7).then(|| pattern(i as u64, 100));
        assert_eq!(h.get(format!("key{i}").as_bytes()).unwrap(), want, "key{i}");
    }
    kn.stop();
    stop_with_sigterm(dpm);
}

/// A KV node whose memory node comes back on another pool file at the same address refuses to serve from it (its
/// log, segments and cached pool offsets belong to the first pool), and serves again, in place, once the memory
/// node is back on its own pool (whose regions a restarted memory node registers under new keys).
#[test]
fn a_kv_node_refuses_a_memory_node_restarted_on_another_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (own, other) = (dir.path().join("own.pool"), dir.path().join("other.pool"));
    let extra = ["--log-segment-size", "1MiB", "--merge-threads", "2"];
    let mut dpm = start_dpm_with(&own, &extra).unwrap();
    let addr = dpm.addr;
    let node_connector = connector(addr);
    let kn = dinomo_kn::KvNode::start(uncached_kn(), node_connector.clone()).unwrap();
    let h = kn.handle();
    h.set(b"kept", b"in the node's own pool").unwrap();
    dpm.child.kill().unwrap();
    dpm.child.wait().unwrap();

    let listen = addr.to_string();
    let foreign = start_dpm_on(&other, &listen, &extra).unwrap();
    // A read of what the worker wrote last is answered from its open segment's copy, without a round trip; a
    // write goes to the memory node. The first write after the kill meets the dead connection; the next ones
    // reconnect and find the other pool.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        let e = h
            .set(b"new", b"value")
            .expect_err("must not write to another pool");
        if e.to_string().contains("another pool") {
            break e.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "never refused the other pool: {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(refusal.contains("restart this process"), "{refusal}");
    // Nothing is served now, reads included: what the node held came from its own pool.
    for key in [&b"kept"[..], b"new", b"never-written"] {
        let e = h.get(key).expect_err("must not serve from another pool");
        assert!(e.to_string().contains("another pool"), "{e}");
    }
    // A connector made from the same settings, not yet pinned, reaches the other pool; the node's own stays pinned.
    assert!(node_connector.pinned_pool().is_some());
    let ep = connector(addr).connect().unwrap();
    assert_ne!(Some(ep.pool_id()), node_connector.pinned_pool());
    drop(ep);
    stop_with_sigterm(foreign);

    // Back on its own pool at the same address: served again, with what was written before.
    let back = start_dpm_on(&own, &listen, &extra).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match h.get(b"kept") {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some(&b"in the node's own pool"[..]));
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "never served again: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    h.set(b"new", b"value").unwrap();
    kn.stop();
    stop_with_sigterm(back);
}

/// A KV node the cluster took over stays revoked across a SIGKILL and restart of the memory node: behind a
/// partition or a long pause, it would otherwise reconnect, claim back the logs the take-over sealed and write
/// into segments given to others since. A new incarnation of the same node is served, with what was written.
#[test]
fn a_revoked_kv_node_stays_revoked_after_the_memory_node_restarts() {
    use dinomo_dpm::proto;
    use dinomo_fabric::{ClientId, FabricError};
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("kv.pool");
    let extra = ["--log-segment-size", "1MiB", "--merge-threads", "2"];
    let mut dpm = start_dpm_with(&pool, &extra).unwrap();
    let addr = dpm.addr;
    let zombie = ClientId {
        node: 1,
        incarnation: 11,
    };
    let kn_config = dinomo_kn::KnConfig {
        node_id: 1,
        ..uncached_kn()
    };
    let kn =
        dinomo_kn::KvNode::start(kn_config.clone(), connector(addr).for_client(zombie)).unwrap();
    let h = kn.handle();
    h.set(b"k", b"before").unwrap();
    let taken: proto::NodeTakenOver = connect(addr)
        .call(
            proto::TAKE_OVER_NODE,
            &proto::TakeOverNode {
                node_id: 1,
                incarnation: Some(zombie.incarnation),
                epoch: 1,
            },
        )
        .unwrap();
    assert!(taken.revoked_connections >= 1, "{taken:?}");
    dpm.child.kill().unwrap();
    dpm.child.wait().unwrap();

    let dpm = start_dpm_on(&pool, &addr.to_string(), &extra).unwrap();
    let refused = connector(addr).for_client(zombie).connect();
    assert!(
        matches!(refused, Err(FabricError::Revoked(_))),
        "the revoked incarnation connected again: {refused:?}"
    );
    // The node itself: each write is refused, none acknowledged, whether it meets the dead connection or
    // reconnects.
    for _ in 0..3 {
        let late = h.set(b"k", b"after");
        assert!(late.is_err(), "a revoked node acknowledged a write");
    }
    let late = h.set(b"k", b"after");
    assert!(
        matches!(
            &late,
            Err(dinomo_kn::KnError::Fabric(FabricError::Revoked(_)))
        ),
        "{late:?}"
    );
    kn.stop();

    let next = ClientId {
        node: 1,
        incarnation: 12,
    };
    let kn = dinomo_kn::KvNode::start(kn_config, connector(addr).for_client(next)).unwrap();
    assert_eq!(
        kn.handle().get(b"k").unwrap().as_deref(),
        Some(&b"before"[..])
    );
    kn.stop();
    stop_with_sigterm(dpm);
}
