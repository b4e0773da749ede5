//! Ownership epochs are never reused, and a change left half done is rolled back under a newer one.
//!
//! A reconfiguration installs its table at the nodes that lose keys before the record is stored. If it stops
//! there (its store fails, its M-node stalls past its lease), those nodes have given keys up that nobody else
//! serves. Each change therefore reserves its epoch in the record first; a record whose reserved epoch is ahead of
//! its table is rolled back under a newer epoch, and nodes refuse tables older than theirs or different from
//! theirs under the same epoch.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use common::{HookedMeta, MetaHooks, raw_call, small_cluster};
use dinomo_cluster::wire::{ErrorKind, RequestBody, ResponseBody};
use dinomo_cluster::{
    Client, ClientConfig, ClusterNode, ClusterRecord, LocalCluster, LocalClusterConfig, MNode,
    MNodeConfig, MemoryNodeRpc, NodeConfig, Routing, Variant,
};
use dinomo_dpm::{Processor, proto};
use dinomo_fabric::{Connector, FaultHooks, MemoryNode, NodeConfig as FabricNodeConfig, Target};
use dinomo_meta::{EmbeddedMeta, MetaConfig, MetaError, MetaStore};
use dinomo_ring::NodeId;

mod common;

const TOKEN: &str = "epochs-test-token";
const KEYS: u32 = 300;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    format!("value-{i}").into_bytes()
}

fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > timeout {
            bail!("timed out waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn load(meta: &dyn MetaStore) -> Result<(ClusterRecord, u64)> {
    ClusterRecord::load(meta)?.ok_or_else(|| anyhow::anyhow!("no cluster record"))
}

/// A record the M-node finished with: nothing reserved past its table, which every node in `nodes` serves.
fn settled(meta: &dyn MetaStore, nodes: &[&ClusterNode]) -> Result<bool> {
    let Some((r, _)) = ClusterRecord::load(meta)? else {
        return Ok(false);
    };
    let ring: BTreeSet<NodeId> = r.routing.ring.nodes().collect();
    let running: BTreeSet<NodeId> = nodes.iter().map(|n| n.id()).collect();
    Ok(!r.change_under_way()
        && ring == running
        && nodes
            .iter()
            .all(|n| n.routing().epoch() == r.routing.epoch()))
}

/// Writes the first [`KEYS`] keys.
fn write_all(cl: &mut Client) -> Result<()> {
    for i in 0..KEYS {
        cl.set(&key(i), &value(i))?;
    }
    Ok(())
}

/// A local cluster of two KV nodes holding the first [`KEYS`] keys, its cluster token and a client.
fn two_loaded_nodes() -> Result<(LocalCluster, String, Client)> {
    let c = LocalCluster::start(small_cluster(2))?;
    let token = c.mnode().cluster_token().to_string();
    let mut cl = Client::connect(c.client_config())?;
    write_all(&mut cl)?;
    Ok((c, token, cl))
}

/// Every key of the first [`KEYS`] reads back as written; a key nobody serves fails the client's bounded retries.
fn check_all(cl: &mut Client) -> Result<()> {
    for i in 0..KEYS {
        ensure!(cl.get(&key(i))? == Some(value(i)), "key {i}");
    }
    Ok(())
}

/// Hooks that fail the stores of the records a test picks, like a store that became unreachable just then.
#[derive(Default)]
struct Flaky {
    #[allow(clippy::type_complexity)]
    refuse: Mutex<Option<Box<dyn Fn(&ClusterRecord) -> bool + Send>>>,
    /// Stores refused so far, and the record of the last.
    refused: Mutex<(u64, Option<ClusterRecord>)>,
}

impl Flaky {
    fn refuse_stores_of(&self, which: impl Fn(&ClusterRecord) -> bool + Send + 'static) {
        *self.refuse.lock().unwrap() = Some(Box::new(which));
    }

    fn heal(&self) {
        *self.refuse.lock().unwrap() = None;
    }

    fn refused(&self) -> u64 {
        self.refused.lock().unwrap().0
    }

    fn last_refused(&self) -> Option<ClusterRecord> {
        self.refused.lock().unwrap().1.clone()
    }
}

impl MetaHooks for Flaky {
    fn store(
        &self,
        inner: &dyn MetaStore,
        expected: Option<u64>,
        value: &[u8],
    ) -> Result<u64, MetaError> {
        if let Some(refuse) = &*self.refuse.lock().unwrap()
            && let Ok(record) = postcard::from_bytes::<ClusterRecord>(value)
            && refuse(&record)
        {
            let mut refused = self.refused.lock().unwrap();
            *refused = (refused.0 + 1, Some(record));
            return Err(MetaError::Unavailable("store refused by the test".into()));
        }
        inner.store(expected, value)
    }
}

/// A memory node with the embedded metadata store, KV nodes on the plain store and an M-node on a store with
/// [`Flaky`] hooks.
struct Harness {
    /// The variant's settings.
    cfg: LocalClusterConfig,
    processor: Arc<Processor>,
    connector: Connector,
    meta: Arc<dyn MetaStore>,
    flaky: Arc<HookedMeta<Flaky>>,
    /// The fault hooks of the M-node's fabric connections.
    mnode_fabric: Arc<FaultHooks>,
    mnode: Option<MNode>,
    nodes: Vec<ClusterNode>,
}

impl Harness {
    fn start(kns: NodeId, variant: Variant) -> Result<Harness> {
        Harness::start_with(kns, variant, |_| Ok(()))
    }

    /// [`Harness::start`], `before_mnode` done with a connector to the memory node before the M-node starts.
    fn start_with(
        kns: NodeId,
        variant: Variant,
        before_mnode: impl FnOnce(&Connector) -> Result<()>,
    ) -> Result<Harness> {
        let mut cfg = small_cluster(0);
        variant.configure(&mut cfg);
        let pool = Arc::new(dinomo_pool::Pool::anonymous(256 << 20, 1 << 20)?);
        let processor = Processor::start(pool.clone(), &cfg.processor)?;
        let meta = EmbeddedMeta::open(pool.clone(), MetaConfig::default())?;
        let memory = MemoryNode::new(
            pool,
            FabricNodeConfig {
                cluster_token: TOKEN.into(),
                ..FabricNodeConfig::default()
            },
        );
        memory.set_rpc_handler(Arc::new(MemoryNodeRpc::new(
            processor.rpc_handler(&memory),
            meta.clone(),
        )));
        let mut connector = Connector::new(Target::InProcess(memory));
        connector.config.cluster_token = TOKEN.into();
        let meta: Arc<dyn MetaStore> = meta;
        let flaky = Arc::new(HookedMeta {
            inner: meta.clone(),
            hooks: Flaky::default(),
        });
        before_mnode(&connector)?;
        // The M-node's own connector, so that a test can cut the M-node off the memory node alone.
        let mut mnode_connector = connector.clone();
        let mnode_fabric = mnode_connector.share_fault_hooks();
        let mnode = MNode::start(
            MNodeConfig {
                install_timeout: Duration::from_secs(5),
                ..MNodeConfig::default()
            },
            flaky.clone(),
            mnode_connector,
        )?;
        let mut h = Harness {
            cfg,
            processor,
            connector,
            meta,
            flaky,
            mnode_fabric,
            mnode: Some(mnode),
            nodes: Vec::new(),
        };
        for id in 1..=kns {
            h.start_node(id)?;
        }
        h.wait_settled()?;
        Ok(h)
    }

    fn start_node(&mut self, id: NodeId) -> Result<()> {
        let cfg = NodeConfig {
            node_id: id,
            ..self.cfg.node.clone()
        };
        self.nodes.push(ClusterNode::start(
            cfg,
            self.connector.clone(),
            self.meta.clone(),
        )?);
        Ok(())
    }

    fn wait_settled(&self) -> Result<()> {
        let nodes: Vec<&ClusterNode> = self.nodes.iter().collect();
        wait("the record settles", Duration::from_secs(20), || {
            settled(&*self.meta, &nodes)
        })
    }

    fn mnode(&self) -> &MNode {
        self.mnode.as_ref().expect("running")
    }

    fn client(&self) -> Result<Client> {
        Ok(Client::connect(ClientConfig {
            seeds: self.nodes.iter().map(|n| n.addr().to_string()).collect(),
            token: TOKEN.into(),
            op_timeout: Duration::from_secs(3),
            ..ClientConfig::default()
        })?)
    }

    fn stop(mut self) {
        if let Some(m) = self.mnode.take() {
            m.stop();
        }
        for n in self.nodes.drain(..) {
            n.stop();
        }
        self.processor.shutdown();
    }
}

/// A join whose record cannot be stored after the old owners gave keys up, and whose node then dies: the keys it
/// was to take are served by their old owners again, under a newer epoch.
#[test]
fn a_join_aborted_after_the_old_owners_installed_leaves_no_key_without_an_owner() -> Result<()> {
    aborted_join(Variant::Dinomo)
}

/// The same in the shared-nothing layout, where the join had moved the keys' data into the new node's partition:
/// the rollback moves it back before the old owners serve the keys again.
#[test]
fn a_join_aborted_after_the_data_moved_leaves_no_key_without_its_data() -> Result<()> {
    aborted_join(Variant::DinomoN)
}

fn aborted_join(variant: Variant) -> Result<()> {
    let mut h = Harness::start(2, variant)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    let (before, _) = load(&*h.meta)?;
    h.flaky
        .refuse_stores_of(|r: &ClusterRecord| r.routing.ring.contains(3));
    h.start_node(3)?;
    // The join gets as far as its store (the old owners installed its table), over and over.
    wait("the join's store fails", Duration::from_secs(20), || {
        Ok(h.flaky.refused() >= 2)
    })?;
    let joining = h.nodes.pop().expect("node 3");
    joining.crash();
    wait(
        "the dead joiner is no longer a member",
        Duration::from_secs(20),
        || {
            Ok(!h
                .meta
                .members("kn/")?
                .iter()
                .any(|(m, _)| m.ends_with("03")))
        },
    )?;
    h.flaky.heal();
    // Every key is served again (the client retries a refusal within its bounded time).
    check_all(&mut cl)?;
    h.wait_settled()?;
    let (after, _) = load(&*h.meta)?;
    // Each attempt of the join had an epoch of its own, and the rollback a newer one.
    let attempted = h.flaky.last_refused().expect("a refused store");
    assert!(attempted.routing.ring.contains(3));
    assert!(after.routing.epoch() > attempted.routing.epoch());
    assert_eq!(
        after.routing.ring.nodes().collect::<Vec<_>>(),
        before.routing.ring.nodes().collect::<Vec<_>>()
    );
    h.stop();
    Ok(())
}

/// Checks that over a second the M-node tries again the change whose stores the test refuses, but backs off: pauses
/// of 5, 10, 20, ... ms up to 250 (`max_retry_pause`) fit about eight attempts in a second, where one every 5 ms
/// check would be some hundred.
fn assert_backs_off(h: &Harness, what: &str) {
    let first = h.flaky.refused();
    std::thread::sleep(Duration::from_secs(1));
    let attempts = h.flaky.refused() - first;
    assert!(
        (1..=15).contains(&attempts),
        "{attempts} {what} in a second"
    );
}

/// While the store keeps refusing a join's record, each attempt is rolled back at once (the old owners serve the
/// keys they gave up again), and the join is tried again after pauses that double: a handful of attempts in a
/// second, each of which has the old owners merge their logs, not one every check interval. Once the store works
/// again, the join completes.
#[test]
fn a_join_whose_store_keeps_failing_is_put_off_longer_each_time() -> Result<()> {
    let mut h = Harness::start(2, Variant::Dinomo)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    h.flaky
        .refuse_stores_of(|r: &ClusterRecord| r.routing.ring.contains(3));
    h.start_node(3)?;
    wait("the join's store fails", Duration::from_secs(20), || {
        Ok(h.flaky.refused() >= 1)
    })?;
    assert_backs_off(&h, "attempts of the join");
    // A client may have learned the table of an attempt from an old owner that installed it before the store failed:
    // catch one (the old owners hand it out until the rollback, a check later). The nodes it names as owners then
    // refuse, node 3 under no table at all, and the client must find the rollback's newer table rather than wait
    // on them.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !cl.routing().is_some_and(|r| r.ring.contains(3)) {
        cl.refresh_routing();
    }
    assert!(
        cl.routing().is_some_and(|r| r.ring.contains(3)),
        "no attempt's table seen in 5 s"
    );
    // Every key is served meanwhile, by its old owner.
    check_all(&mut cl)?;
    h.flaky.heal();
    h.wait_settled()?;
    let (after, _) = load(&*h.meta)?;
    assert!(after.routing.ring.contains(3));
    check_all(&mut cl)?;
    h.stop();
    Ok(())
}

/// A removal whose record cannot be stored after the node handed its keys over (and its logs were fenced): the
/// M-node carries it through once the store works again, rather than giving the node back keys it cannot write,
/// retrying it meanwhile after pauses that double.
#[test]
fn a_removal_whose_store_fails_is_carried_through() -> Result<()> {
    let mut h = Harness::start(3, Variant::Dinomo)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    h.flaky
        .refuse_stores_of(|r: &ClusterRecord| !r.routing.ring.contains(3));
    let e = h.mnode().remove_node(3).expect_err("the store was refused");
    assert!(e.to_string().contains("refused by the test"), "{e}");
    let (during, _) = load(&*h.meta)?;
    assert!(during.routing.ring.contains(3));
    assert!(during.retired.contains_key(&3));
    // The retries fail in a row, so each waits twice as long as the last (up to `max_retry_pause`).
    assert_backs_off(&h, "retries of the removal");
    h.flaky.heal();
    let leaving = h.nodes.pop().expect("node 3");
    wait("the removal completes", Duration::from_secs(20), || {
        let nodes: Vec<&ClusterNode> = h.nodes.iter().collect();
        Ok(settled(&*h.meta, &nodes)? && !leaving.routing().ring.contains(3))
    })?;
    let (after, _) = load(&*h.meta)?;
    // The M-node retries the removal from the moment it failed: the retry that completed it may be the one whose
    // reservation was read above.
    assert!(after.routing.epoch() >= during.reserved_epoch);
    assert_eq!(after.routing.ring.nodes().collect::<Vec<_>>(), vec![1, 2]);
    leaving.stop();
    cl.refresh_routing();
    check_all(&mut cl)?;
    write_all(&mut cl)?;
    h.stop();
    Ok(())
}

/// A key made shared whose record cannot be stored after its owner moved the value into the cell: the owner
/// takes the value back, no write made meanwhile or after is lost, and sharing it later works.
#[test]
fn a_sharing_change_whose_store_fails_is_rolled_back_and_loses_no_write() -> Result<()> {
    let h = Harness::start(2, Variant::Dinomo)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    let hot = key(7);
    {
        let hot = hot.clone();
        h.flaky
            .refuse_stores_of(move |r: &ClusterRecord| r.routing.cells.contains_key(&hot));
    }
    let e = h
        .mnode()
        .set_replication(&hot, 2)
        .expect_err("the store was refused");
    assert!(e.to_string().contains("refused by the test"), "{e}");
    h.flaky.heal();
    h.wait_settled()?;
    let (r, _) = load(&*h.meta)?;
    assert!(r.routing.cells.is_empty());
    cl.refresh_routing();
    cl.set(&hot, b"after the failed change")?;
    assert_eq!(
        cl.get(&hot)?.as_deref(),
        Some(&b"after the failed change"[..])
    );
    h.mnode().set_replication(&hot, 2)?;
    cl.refresh_routing();
    assert_eq!(
        cl.get(&hot)?.as_deref(),
        Some(&b"after the failed change"[..])
    );
    cl.set(&hot, b"shared")?;
    h.mnode().set_replication(&hot, 1)?;
    cl.refresh_routing();
    assert_eq!(cl.get(&hot)?.as_deref(), Some(&b"shared"[..]));
    for i in (0..KEYS).filter(|i| *i != 7) {
        assert_eq!(cl.get(&key(i))?, Some(value(i)), "key {i}");
    }
    h.stop();
    Ok(())
}

/// A late call of the M-node's change before the last, as from an M-node that stalled and no longer leads.
fn stale_call<Req: serde::Serialize>(h: &Harness, method: u16, req: &Req) -> Result<String> {
    match h
        .connector
        .connect()?
        .call::<_, serde::de::IgnoredAny>(method, req)
    {
        Ok(_) => bail!("a call of an older management epoch was taken"),
        Err(e) => Ok(e.to_string()),
    }
}

/// Every change the M-node makes fences the memory node at its epoch first, even one that sends it nothing else
/// (a join, with the shared index): after a key was made shared, a stalled M-node's late calls of the change
/// before (its record's cells do not have the key; the node it took for dead is alive) are refused, and the key
/// stays shared and served.
#[test]
fn a_stalled_m_nodes_late_calls_are_refused_once_a_newer_change_reserved() -> Result<()> {
    let h = Harness::start(2, Variant::Dinomo)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    let (joined, _) = load(&*h.meta)?;
    assert_eq!(h.processor.stats().manager_epoch, joined.routing.epoch());
    let hot = key(7);
    h.mnode().set_replication(&hot, 2)?;
    let (shared, _) = load(&*h.meta)?;
    assert!(shared.routing.cells.contains_key(&hot));
    assert_eq!(h.processor.stats().manager_epoch, shared.routing.epoch());
    assert_eq!(h.processor.stats().shared_keys, 1);

    let stale = joined.routing.epoch();
    let refused = stale_call(
        &h,
        proto::SYNC_CELLS,
        &proto::SyncCells {
            shared: joined.routing.cells.values().copied().collect(),
            epoch: stale,
        },
    )?;
    assert!(
        refused.contains("SYNC_CELLS of management epoch"),
        "{refused}"
    );
    let refused = stale_call(
        &h,
        proto::TAKE_OVER_NODE,
        &proto::TakeOverNode {
            node_id: 1,
            incarnation: None,
            epoch: stale,
        },
    )?;
    assert!(
        refused.contains("TAKE_OVER_NODE of management epoch"),
        "{refused}"
    );
    assert_eq!(h.processor.stats().stale_manager_calls, 2);
    assert_eq!(h.processor.stats().shared_keys, 1);
    cl.refresh_routing();
    cl.set(&hot, b"shared and written")?;
    assert_eq!(cl.get(&hot)?.as_deref(), Some(&b"shared and written"[..]));
    for i in (0..KEYS).filter(|i| *i != 7) {
        assert_eq!(cl.get(&key(i))?, Some(value(i)), "key {i}");
    }
    h.stop();
    Ok(())
}

/// An M-node that cannot reach the memory node makes no change: each attempt of a join fails at its fence and
/// stores nothing (no reservation left to roll back, no store per attempt), and the join completes once the
/// memory node is reachable again.
#[test]
fn a_change_the_memory_node_cannot_be_fenced_for_stores_nothing() -> Result<()> {
    let mut h = Harness::start(2, Variant::Dinomo)?;
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    let (_, version) = load(&*h.meta)?;
    h.mnode_fabric.drop_next(u32::MAX);
    let begun = h.mnode_fabric.round_trips_begun();
    h.start_node(3)?;
    wait(
        "the join has been tried a few times",
        Duration::from_secs(20),
        || Ok(h.mnode_fabric.round_trips_begun() >= begun + 5),
    )?;
    let (during, version_during) = load(&*h.meta)?;
    assert_eq!(version_during, version, "the record was stored: {during:?}");
    assert!(!during.change_under_way());
    h.mnode_fabric.drop_next(0);
    h.wait_settled()?;
    let (after, _) = load(&*h.meta)?;
    assert!(after.routing.ring.contains(3));
    assert_eq!(h.processor.stats().manager_epoch, after.routing.epoch());
    cl.refresh_routing();
    check_all(&mut cl)?;
    h.stop();
    Ok(())
}

/// A pool that outlived the metadata store holding its cluster record has acted on newer management epochs than
/// the fresh record's: the M-node, refused at its first fence, reserves past the pool's epoch and the cluster
/// forms.
#[test]
fn an_m_node_whose_record_is_behind_the_pool_reserves_past_it() -> Result<()> {
    const POOL_EPOCH: u64 = 100;
    let h = Harness::start_with(2, Variant::Dinomo, |connector| {
        let f: proto::Fenced = connector
            .connect()?
            .call(proto::FENCE, &proto::Fence { epoch: POOL_EPOCH })?;
        ensure!(f.newest == POOL_EPOCH);
        Ok(())
    })?;
    let (r, _) = load(&*h.meta)?;
    assert!(r.routing.epoch() > POOL_EPOCH, "{}", r.routing.epoch());
    assert_eq!(h.processor.stats().manager_epoch, r.routing.epoch());
    let mut cl = h.client()?;
    write_all(&mut cl)?;
    check_all(&mut cl)?;
    h.stop();
    Ok(())
}

/// `routing` as a raw install at the node at `addr`.
fn install(addr: &str, token: &str, routing: &Routing) -> Result<ResponseBody> {
    raw_call(addr, token, RequestBody::Install(routing.clone()))
}

fn refused_as(reply: ResponseBody, what: &str) {
    match reply {
        ResponseBody::Error {
            kind: ErrorKind::Invalid,
            message,
        } => assert!(message.contains(what), "{message}"),
        other => panic!("expected a refusal ({what}), got {other:?}"),
    }
}

/// A node refuses a table older than its own and another table under its own epoch, and takes its own again.
#[test]
fn a_node_refuses_an_older_table_and_another_table_of_its_epoch() -> Result<()> {
    let (c, token, mut cl) = two_loaded_nodes()?;
    let (node, addr) = {
        let nodes = c.nodes();
        (nodes[0].id(), nodes[0].addr().to_string())
    };
    let serving = c.nodes()[0].routing();
    let mut older = serving.clone();
    older.ring = dinomo_ring::Ring::with_nodes(serving.ring.vnodes(), [node]);
    assert!(older.epoch() < serving.epoch());
    refused_as(install(&addr, &token, &older)?, "older");
    let mut other = serving.clone();
    other.addrs.insert(node, "127.0.0.1:9".into());
    refused_as(install(&addr, &token, &other)?, "another table");
    assert_eq!(install(&addr, &token, &serving)?, ResponseBody::Done);
    assert_eq!(c.nodes()[0].routing(), serving);
    check_all(&mut cl)?;
    c.stop();
    Ok(())
}

/// An M-node that reserved an epoch and installed its change at the nodes losing keys, then stalled: the leader
/// rolls the change back, every key is served again, and the stalled M-node's late install is refused.
#[test]
fn a_change_a_stalled_m_node_left_half_done_is_rolled_back() -> Result<()> {
    let (c, token, mut cl) = two_loaded_nodes()?;
    let meta = c.meta_store();
    let (record, version) = load(&*meta)?;
    let epoch = record.reserved_epoch.max(record.routing.epoch()) + 1;
    // The stalled M-node's change: a node joins that never comes (its table is installed at the old owners).
    let mut change = record.clone();
    change.routing.ring.add_node(77);
    change.routing.addrs.insert(77, "127.0.0.1:9".into());
    change.routing.ring.set_epoch_at_least(epoch);
    let addrs: Vec<String> = c.nodes().iter().map(|n| n.addr().to_string()).collect();
    // Installed before the reservation is stored (an M-node reserves first): so the leader cannot roll back
    // before the table is in place.
    for a in &addrs {
        assert_eq!(install(a, &token, &change.routing)?, ResponseBody::Done);
    }
    let mut reserved = record.clone();
    reserved.reserved_epoch = epoch;
    reserved.store(&*meta, Some(version))?;
    wait("the change is rolled back", Duration::from_secs(20), || {
        let nodes = c.nodes();
        settled(&*meta, &nodes.iter().collect::<Vec<_>>())
    })?;
    let (after, _) = load(&*meta)?;
    assert!(after.routing.epoch() > epoch);
    assert!(!after.routing.ring.contains(77));
    for a in &addrs {
        refused_as(install(a, &token, &change.routing)?, "older");
    }
    cl.refresh_routing();
    check_all(&mut cl)?;
    c.stop();
    Ok(())
}

/// The record names the pool its cluster runs on. An M-node whose metadata store holds the record of another pool
/// (the store and the memory node belong to different clusters, or the pool was replaced under a store that kept
/// the record) changes nothing and says why; with the record of its own pool it goes on.
#[test]
fn an_m_node_changes_nothing_under_the_record_of_another_pool() -> Result<()> {
    let mut h = Harness::start(2, Variant::Dinomo)?;
    let pool = h.connector.connect()?.pool_id();
    let (own, version) = load(&*h.meta)?;
    assert_eq!(own.pool_id, pool, "the record names its pool");
    h.mnode.take().expect("running").stop();
    // The record of another pool's cluster, as a store of another cluster would hold.
    let foreign = ClusterRecord {
        pool_id: pool ^ 0x5a5a,
        ..own.clone()
    };
    let version = foreign.store(&*h.meta, Some(version))?;
    h.mnode = Some(MNode::start(
        MNodeConfig::default(),
        h.flaky.clone(),
        h.connector.clone(),
    )?);
    h.start_node(3)?;
    wait(
        "the M-node names the other pool",
        Duration::from_secs(20),
        || {
            Ok(h.mnode()
                .last_failure()
                .is_some_and(|f| f.contains("belongs to pool")))
        },
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let (now, still) = load(&*h.meta)?;
    assert_eq!((now, still), (foreign, version), "nothing was stored");
    // The record of this pool again: node 3 joins.
    own.store(&*h.meta, Some(version))?;
    h.wait_settled()?;
    let (after, _) = load(&*h.meta)?;
    assert!(after.routing.ring.contains(3));
    assert_eq!(after.pool_id, pool);
    h.stop();
    Ok(())
}
