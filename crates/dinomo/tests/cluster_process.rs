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
    let mut child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(args)
        .env("DINOMO_LOG", "warn")
        .env("DINOMO_CLUSTER_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut banner = String::new();
    stdout.read_line(&mut banner)?;
    anyhow::ensure!(
        !banner.is_empty(),
        "dinomo {args:?} exited without a banner: {:?}",
        child.wait()?
    );
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in stdout.lines() {});
    Ok(Proc { child, banner })
}

fn dpm(pool: &Path, partitioning: &str) -> anyhow::Result<(Proc, String)> {
    let p = start(&[
        "dpm",
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
    ])?;
    let addr = p
        .banner
        .split_whitespace()
        .nth(4)
        .expect("address in banner")
        .to_string();
    Ok((p, addr))
}

fn kn(dpm: &str, id: u32) -> anyhow::Result<Proc> {
    start(&[
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
        "300",
        "--heartbeat-ms",
        "20",
    ])
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
}

impl Cluster {
    fn start(pool: &Path, partitioning: &str, kns: u32) -> anyhow::Result<Cluster> {
        let (dpm, dpm_addr) = dpm(pool, partitioning)?;
        let mnode = start(&["mnode", "--dpm", &dpm_addr, "--lease-ms", "500"])?;
        let rn = start(&["rn", "--dpm", &dpm_addr, "--listen", "127.0.0.1:0"])?;
        let rn_addr = rn
            .banner
            .split_whitespace()
            .nth(4)
            .expect("address")
            .to_string();
        let nodes = (1..=kns)
            .map(|id| kn(&dpm_addr, id))
            .collect::<Result<_, _>>()?;
        Ok(Cluster {
            nodes,
            _rn: rn,
            rn_addr,
            _mnode: mnode,
            dpm,
            dpm_addr,
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
    signal(&cluster.nodes[idx], "STOP")?;
    wait_for_ring(
        &mut client,
        |r| !r.ring.contains(frozen),
        "the frozen node was never declared failed",
    )?;
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
