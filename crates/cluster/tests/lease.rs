//! A KV node whose heartbeat is starved: its lease lapses at the node although the store still holds it. Requests
//! that arrive meanwhile wait for the late renewal and are served by the same node, with no failover; when the
//! store's lease did run out, the node never serves again and the client finds the keys' new owner.
//!
//! The starvation is simulated deterministically: a metadata store whose keep-alive replies are held back on
//! request (the store itself is renewed or not, as the case needs), instead of loading the machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{HookedMeta, MetaHooks, small_cluster};
use dinomo_cluster::{
    Client, ClientConfig, ClusterNode, LocalCluster, LocalClusterConfig, NodeConfig,
};
use dinomo_meta::{LeaseId, MetaError, MetaStore};
use dinomo_ring::NodeId;

mod common;

/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(20);

/// Hooks that hold a metadata store's keep-alive replies back, like those of a heartbeat thread that gets no CPU.
struct Held {
    held: Mutex<bool>,
    released: Condvar,
    /// Whether the store's lease is kept alive while replies are held (the node's thread is slow, the store is
    /// renewed) or left to expire (the node is gone as far as the store knows).
    renew_while_held: AtomicBool,
}

/// The store of the starved node.
type HeldMeta = HookedMeta<Held>;

impl Held {
    fn hold(&self, renew: bool) {
        self.renew_while_held.store(renew, Ordering::Release);
        *self.held.lock().unwrap() = true;
    }

    /// While replies stay held, stops renewing the store's lease too: it runs out, as a node's that died.
    fn stop_renewing(&self) {
        self.renew_while_held.store(false, Ordering::Release);
    }

    fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.released.notify_all();
    }
}

impl MetaHooks for Held {
    fn keep_alive(&self, inner: &dyn MetaStore, lease: LeaseId) -> Result<(), MetaError> {
        let mut held = self.held.lock().unwrap();
        if !*held {
            return inner.keep_alive(lease);
        }
        let start = Instant::now();
        while *held && start.elapsed() < PATIENCE {
            // Looked at on every turn: a test may stop the renewals while replies are held.
            if self.renew_while_held.load(Ordering::Acquire) {
                inner.keep_alive(lease)?;
            }
            held = self
                .released
                .wait_timeout(held, Duration::from_millis(10))
                .unwrap()
                .0;
        }
        drop(held);
        // The reply that finally gets through: the store's answer now.
        inner.keep_alive(lease)
    }
}

const STARVED: NodeId = 50;

/// A one-node cluster joined by node [`STARVED`], whose metadata store is a [`HeldMeta`]; it waits (up to
/// `lease_wait`) for late renewals.
fn start(
    lease_wait: Duration,
) -> anyhow::Result<(LocalCluster, ClusterNode, Arc<HeldMeta>, Client)> {
    start_with(small_cluster(1), lease_wait)
}

/// [`start`] with the cluster `cfg`.
fn start_with(
    cfg: LocalClusterConfig,
    lease_wait: Duration,
) -> anyhow::Result<(LocalCluster, ClusterNode, Arc<HeldMeta>, Client)> {
    let c = LocalCluster::start(cfg.clone())?;
    let meta = Arc::new(HookedMeta {
        inner: c.meta_store(),
        hooks: Held {
            held: Mutex::new(false),
            released: Condvar::new(),
            renew_while_held: AtomicBool::new(true),
        },
    });
    let node = ClusterNode::start(
        NodeConfig {
            node_id: STARVED,
            lease_wait,
            ..cfg.node.clone()
        },
        c.memory_connector(),
        meta.clone(),
    )?;
    // The M-node adds the new member; wait until it serves under a table that has it.
    let start = Instant::now();
    while !node.routing().ring.contains(STARVED) {
        anyhow::ensure!(start.elapsed() < PATIENCE, "node {STARVED} never joined");
        std::thread::sleep(Duration::from_millis(5));
    }
    let client = Client::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        // Requests may wait at the starved node for as long as the test holds its heartbeat.
        op_timeout: PATIENCE,
        ..ClientConfig::default()
    })?;
    Ok((c, node, meta, client))
}

/// A key the starved node owns.
fn owned_key(node: &ClusterNode) -> Vec<u8> {
    let ring = node.routing().ring;
    (0..)
        .map(|i| format!("key-{i}").into_bytes())
        .find(|k| ring.primary(k) == Some(STARVED))
        .expect("the node owns some key")
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn requests_that_meet_a_lapsed_lease_are_served_after_the_late_renewal() -> anyhow::Result<()> {
    // A wait far beyond the test: only the renewal can end it.
    let (c, node, meta, mut client) = start(Duration::from_secs(60))?;
    let key = owned_key(&node);
    client.set(&key, b"before")?;
    let epoch = node.routing().epoch();

    // The heartbeat's replies stop getting through; the store is still renewed, so nobody fails the node.
    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let (k, waits) = (key.clone(), node.lease_waits());
    let write = std::thread::spawn(move || -> anyhow::Result<Option<Vec<u8>>> {
        client.set(&k, b"after")?;
        Ok(client.get(&k)?)
    });
    until("the write waiting for the lease", || {
        node.lease_waits() > waits
    });
    assert!(!write.is_finished(), "answered while the lease had lapsed");
    meta.release();

    assert_eq!(
        write.join().expect("client thread")?,
        Some(b"after".to_vec())
    );
    assert!(node.is_serving());
    // Served by the same node under the same table: no failover happened.
    assert_eq!(node.routing().epoch(), epoch);
    assert!(
        node.worker_stats()?
            .iter()
            .map(|t| t.lease_waits_served)
            .sum::<u64>()
            >= 1
    );
    node.stop();
    c.stop();
    Ok(())
}

#[test]
fn a_node_whose_lease_expired_never_serves_and_the_client_finds_the_new_owner() -> anyhow::Result<()>
{
    let (c, node, meta, mut client) = start(Duration::from_secs(60))?;
    let key = owned_key(&node);
    client.set(&key, b"before")?;

    // The node is silent long enough for the store's lease to run out: the M-node hands its keys over.
    meta.hold(false);
    until("the lease lapsing at the node", || !node.is_serving());
    let k = key.clone();
    let write = std::thread::spawn(move || -> anyhow::Result<Option<Vec<u8>>> {
        client.set(&k, b"after")?;
        Ok(client.get(&k)?)
    });
    until("the failover", || {
        c.nodes()[0].routing().ring.primary(&key) != Some(STARVED)
    });
    // The late reply says the lease expired: the node is fenced, and what waited there is refused (not applied),
    // so the client retries at the new owner.
    meta.release();
    until("the node being fenced", || {
        node.worker_stats()
            .is_ok_and(|s| s.iter().map(|t| t.lease_refusals).sum::<u64>() >= 1)
    });
    assert_eq!(
        write.join().expect("client thread")?,
        Some(b"after".to_vec())
    );
    assert!(!node.is_serving());
    node.crash();
    c.stop();
    Ok(())
}

#[test]
fn an_install_refused_while_the_lease_lapsed_is_asked_again_until_the_late_renewal()
-> anyhow::Result<()> {
    // No waiting at the node: whatever finds the lease lapsed, an install included, is refused at once.
    let (c, node, meta, mut client) = start(Duration::ZERO)?;
    let key = owned_key(&node);
    client.set(&key, b"v")?;

    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let release = {
        let meta = meta.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let released_at = Instant::now();
            meta.release();
            released_at
        })
    };
    // Sharing the key installs first at its owner, the starved node: refused until the renewal gets through, then
    // done, within the M-node's install timeout.
    c.mnode().set_replication(&key, 2)?;
    let done_at = Instant::now();
    let released_at = release.join().expect("release thread");
    assert!(
        done_at >= released_at,
        "the install was done while the node's lease had lapsed"
    );
    assert!(node.is_serving());
    assert!(node.routing().cells.contains_key(&key));
    assert_eq!(client.get(&key)?, Some(b"v".to_vec()));
    node.stop();
    c.stop();
    Ok(())
}

#[test]
fn an_install_refused_by_a_node_whose_lease_then_expires_fails_without_waiting_out_the_install_timeout()
-> anyhow::Result<()> {
    let mut cfg = small_cluster(1);
    // Far beyond the test: only the node's death may end the asking.
    cfg.mnode.install_timeout = Duration::from_secs(120);
    let (c, node, meta, mut client) = start_with(cfg, Duration::ZERO)?;
    let key = owned_key(&node);
    client.set(&key, b"v")?;

    // The node's lease lapses while the store's is renewed: the node stays a live member (the key's owner) and
    // refuses the install for now, so the M-node asks it again.
    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let refusals = || {
        node.worker_stats()
            .map_or(0, |s| s.iter().map(|t| t.lease_refusals).sum::<u64>())
    };
    let refused_before = refusals();
    let asked = Instant::now();
    let shared = std::thread::scope(|s| {
        let sharing = s.spawn(|| c.mnode().set_replication(&key, 2));
        until("the install refused at the node", || {
            refusals() > refused_before
        });
        // Silent for good: the store's lease runs out too, and the node is gone as far as the cluster knows.
        meta.stop_renewing();
        sharing.join().expect("sharing thread")
    });
    assert!(
        asked.elapsed() < PATIENCE,
        "the M-node kept asking a dead node for {:?}",
        asked.elapsed()
    );
    let e = shared.expect_err("a node whose lease expired installed a table");
    assert!(e.to_string().contains("node 50"), "{e}");
    // Failure handling goes on: the key gets a new owner, which serves it.
    until("the failover", || {
        c.nodes()[0].routing().ring.primary(&key) != Some(STARVED)
    });
    assert_eq!(client.get(&key)?, Some(b"v".to_vec()));
    meta.release();
    node.crash();
    c.stop();
    Ok(())
}
