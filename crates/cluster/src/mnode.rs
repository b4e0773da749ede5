//! The management node: keeps the cluster record, watches KV-node leases, and reconfigures the cluster by moving
//! ownership (paper §3.5). One M-node leads (elected through the metadata store); standbys wait and take over
//! when the leader's lease lapses.
//!
//! Reconfiguration follows the paper's steps: the nodes that lose keys install the new table first (they commit
//! what is pending, have their logs merged when they hold unmerged writes of keys they lose, drop those keys from
//! their caches, and refuse them from then on); then the record is stored; then the nodes that gain keys install
//! it. No data moves. A failed node's logs are taken over by the memory node (fenced and merged) before its keys
//! are handed out.
//!
//! With a memory node partitioned per KV node (DINOMO-N, shared-nothing), data does move: once the keys' old owners
//! stopped serving them (and before the record names their new owners), the memory node copies their entries into
//! the new owners' partitions ([`proto::REBALANCE`]); each reconfiguration reports what moved.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use dinomo_dpm::{Partitioning, proto};
use dinomo_fabric::{Connector, Endpoint};
use dinomo_meta::{LeaseId, MetaError, MetaStore};
use dinomo_ring::{NodeId, Ring};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::client::call_each;
use crate::failures::{FailureStreak, Report};
use crate::stop::StopSignal;
use crate::wire::{ErrorKind, RequestBody, ResponseBody, Routing};
use crate::{ClusterError, ClusterRecord, MemberInfo, member_node};

/// The election M-nodes compete in.
pub const ELECTION: &str = "mnode";

/// Settings of an M-node.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MNodeConfig {
    /// This M-node's name in the election.
    pub name: String,
    /// Its leadership lease; a standby takes over this long after the leader stops renewing. Default 1 s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How often it checks leases and membership. Default 5 ms.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    /// Bound on installing a routing table at a KV node during reconfiguration, including asking again a node that
    /// refused for now (a late lease renewal). Default 10 s (a node may merge its log first).
    #[serde(with = "humantime_serde")]
    pub install_timeout: Duration,
    /// Virtual nodes per KV node in a new ring. Default [`dinomo_ring::DEFAULT_VNODES`].
    pub vnodes: u32,
    /// After it starts leading, how long ring members that are not registered get to come back before they are
    /// declared failed (a restarted cluster's nodes register one by one). Default 2 s.
    #[serde(with = "humantime_serde")]
    pub failure_grace: Duration,
    /// Longest pause between attempts of a reconfiguration step that keeps failing (a metadata store or memory
    /// node out of reach). The first retry comes after `check_interval`, and each failure in a row doubles the
    /// pause up to this, so that a lasting outage does not have a join and its rollback alternate every check
    /// (each join attempt has the old owners merge their logs). A node failure noticed meanwhile waits for the
    /// pause to end. Default 250 ms.
    #[serde(with = "humantime_serde")]
    pub max_retry_pause: Duration,
}

impl Default for MNodeConfig {
    fn default() -> Self {
        MNodeConfig {
            name: "mnode-1".into(),
            lease_ttl: Duration::from_secs(1),
            check_interval: Duration::from_millis(5),
            install_timeout: Duration::from_secs(10),
            vnodes: dinomo_ring::DEFAULT_VNODES,
            failure_grace: Duration::from_secs(2),
            max_retry_pause: Duration::from_millis(250),
        }
    }
}

/// Kinds of reconfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ReconfigKind {
    /// A node joined.
    Add,
    /// A node was removed.
    Remove,
    /// A node's lease expired.
    Failure,
    /// A key became shared by several nodes, or its number of owners changed (selective replication).
    Replicate,
    /// A shared key went back to one owner.
    Dereplicate,
}

/// One reconfiguration, as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct ReconfigEvent {
    /// What happened.
    pub kind: ReconfigKind,
    /// The node that joined, left or failed.
    pub node: NodeId,
    /// The epoch of the new table.
    pub epoch: u64,
    /// When the M-node noticed (since the M-node started).
    pub noticed_at: Duration,
    /// From noticing until every remaining node served under the new table.
    pub duration: Duration,
    /// Entries the memory node merged while taking over a failed node's logs.
    pub merged_entries: u64,
    /// Keys whose data was copied into another node's partition (shared-nothing layout; 0 otherwise).
    #[serde(default)]
    pub moved_keys: u64,
    /// Bytes of log entries written by those copies.
    #[serde(default)]
    pub moved_bytes: u64,
    /// How long moving the data took, as the M-node waited for it (part of `duration`).
    #[serde(default)]
    pub move_duration: Duration,
}

/// What moving data between partitions did (nothing, with the shared index).
#[derive(Debug, Default)]
struct MovedData {
    keys: u64,
    bytes: u64,
    took: Duration,
}

enum Admin {
    Remove(NodeId, Sender<Result<(), ClusterError>>),
    Replicate(Vec<u8>, u32, Sender<Result<(), ClusterError>>),
}

/// A running M-node.
pub struct MNode {
    started: Instant,
    admin: Sender<Admin>,
    events: Arc<Mutex<Vec<ReconfigEvent>>>,
    leading: Arc<AtomicBool>,
    failures: Arc<FailureStreak>,
    stop: Arc<StopSignal>,
    /// Whether stopping gives the leadership up at once (a crash leaves it to expire).
    resign: Arc<AtomicBool>,
    /// The cluster token, which the M-node presents to the KV nodes (the memory node's, which it shares).
    token: String,
    thread: Option<JoinHandle<()>>,
}

impl MNode {
    /// Starts the M-node's loop; it competes for leadership and, once leading, manages the cluster.
    pub fn start(
        config: MNodeConfig,
        meta: Arc<dyn MetaStore>,
        dpm: Connector,
    ) -> Result<MNode, ClusterError> {
        let (admin_tx, admin_rx) = unbounded();
        let events = Arc::new(Mutex::new(Vec::new()));
        let leading = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(FailureStreak::default());
        let stop = Arc::new(StopSignal::default());
        let resign = Arc::new(AtomicBool::new(true));
        let started = Instant::now();
        // Moving a shared-nothing cluster's data may take as long as an install.
        let mut dpm = dpm;
        dpm.config.timeout = dpm.config.timeout.max(config.install_timeout);
        let token = dpm.config.cluster_token.clone();
        let mut state = State {
            lease: meta.grant(config.lease_ttl)?,
            last_renewal: Instant::now(),
            cfg: config,
            meta,
            dpm,
            partitioning: None,
            pool: 0,
            dpm_epoch_floor: 0,
            ep: None,
            installed: HashMap::new(),
            record_cache: None,
            incarnations: HashMap::new(),
            seen: Default::default(),
            leading_since: Instant::now(),
            events: events.clone(),
            leading: leading.clone(),
            failures: failures.clone(),
            attempting: None,
            next_attempt: Instant::now(),
            join_backoff: None,
            started,
        };
        let thread = {
            let (stop, resign) = (stop.clone(), resign.clone());
            std::thread::Builder::new()
                .name("dinomo-mnode".into())
                .spawn(move || state.run(&stop, &resign, &admin_rx))
                .map_err(|e| ClusterError::Io(e.to_string()))?
        };
        Ok(MNode {
            started,
            admin: admin_tx,
            events,
            leading,
            failures,
            stop,
            resign,
            token,
            thread: Some(thread),
        })
    }

    /// The cluster token it presents to the KV nodes.
    pub fn cluster_token(&self) -> &str {
        &self.token
    }

    /// Whether this M-node leads now.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// Why its latest reconfiguration step failed, while none has succeeded since (the loop retries it every
    /// check interval).
    pub fn last_failure(&self) -> Option<String> {
        self.failures.latest()
    }

    /// Removes a node from the ring (it hands its keys over and may then be stopped). Waits until done. Once begun,
    /// a removal is carried through: should a step fail, the error is returned and the M-node retries it until the
    /// node has left (or failed).
    pub fn remove_node(&self, node: NodeId) -> Result<(), ClusterError> {
        let (tx, rx) = bounded(1);
        self.admin
            .send(Admin::Remove(node, tx))
            .map_err(|_| ClusterError::Reconfig("the M-node stopped".into()))?;
        rx.recv()
            .map_err(|_| ClusterError::Reconfig("the M-node stopped".into()))?
    }

    /// Sets the number of KV nodes that own `key` (selective replication, paper §3.4): with `factor` above 1 the
    /// key becomes shared: its value moves into an indirect cell in the pool, and its primary and the next
    /// `factor - 1` nodes on the ring serve it, reads and writes alike. A factor of 1 gives the key back to its
    /// primary alone. Waits until done.
    pub fn set_replication(&self, key: &[u8], factor: u32) -> Result<(), ClusterError> {
        let (tx, rx) = bounded(1);
        self.admin
            .send(Admin::Replicate(key.to_vec(), factor, tx))
            .map_err(|_| ClusterError::Reconfig("the M-node stopped".into()))?;
        rx.recv()
            .map_err(|_| ClusterError::Reconfig("the M-node stopped".into()))?
    }

    /// When it started: [`ReconfigEvent::noticed_at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The M-node's metrics, for a [`crate::metrics::MetricsServer`].
    pub fn metrics(&self) -> crate::metrics::MNodeMetrics {
        crate::metrics::MNodeMetrics {
            leading: self.leading.clone(),
            events: self.events.clone(),
            failures: self.failures.clone(),
        }
    }

    /// The reconfigurations so far.
    pub fn events(&self) -> Vec<ReconfigEvent> {
        self.events.lock().expect("events lock").clone()
    }

    /// Stops the loop and gives up leadership at once.
    pub fn stop(mut self) {
        self.halt();
    }

    /// Stops as if the process died: the leadership passes to a standby only when its lease expires.
    pub fn crash(mut self) {
        self.resign.store(false, Ordering::Release);
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MNode {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The pause after the `streak`-th failure in a row of a reconfiguration step: `check_interval` after the first,
/// doubling with each further one, at most `max_retry_pause` (and never below `check_interval`).
fn retry_pause(cfg: &MNodeConfig, streak: u64) -> Duration {
    let doublings = streak.saturating_sub(1).min(31) as u32;
    cfg.check_interval
        .saturating_mul(1u32 << doublings)
        .min(cfg.max_retry_pause)
        .max(cfg.check_interval)
}

/// The epoch the next change of `record` gets: past every epoch handed out, stored or not.
fn next_epoch(record: &ClusterRecord) -> u64 {
    record
        .reserved_epoch
        .max(record.routing.epoch())
        .saturating_add(1)
}

/// Gives `next`'s table the epoch reserved for its change (which moved the ring's own epoch by one at most), and
/// names the pool it was made on.
fn stamp(next: &mut ClusterRecord, epoch: u64, pool: u64) {
    next.routing.ring.set_epoch_at_least(epoch);
    next.reserved_epoch = epoch;
    next.pool_id = pool;
}

/// The first pause before a node that refused an install for now is asked again; each further pause doubles, up to
/// [`INSTALL_RETRY_MAX_PAUSE`].
const INSTALL_RETRY_PAUSE: Duration = Duration::from_millis(10);
const INSTALL_RETRY_MAX_PAUSE: Duration = Duration::from_millis(200);

/// A node's answer to an install that it did not refuse for good.
enum Installed {
    Done,
    /// It cannot install now, and says why; it may later.
    NotNow(String),
}

struct State {
    cfg: MNodeConfig,
    meta: Arc<dyn MetaStore>,
    dpm: Connector,
    ep: Option<Endpoint>,
    /// The memory node's index layout, once asked.
    partitioning: Option<Partitioning>,
    /// The pool the memory node serves (its superblock's `pool_id`), once connected; the records this M-node stores
    /// name it ([`State::check_pool`]).
    pool: u64,
    /// The newest management epoch the memory node reported when it refused a fence: a change reserves past it.
    /// Above the record's own epochs only when the pool outlived the metadata store that held the record.
    dpm_epoch_floor: u64,
    lease: LeaseId,
    /// When `lease` was last renewed (or granted).
    last_renewal: Instant,
    /// The epoch each node (incarnation) is known to serve under.
    installed: HashMap<NodeId, (u64, u64)>,
    /// The last record read, with its version.
    record_cache: Option<(u64, ClusterRecord)>,
    /// Incarnations of the nodes, as last read live: a node that died keeps its last one until its logs are taken
    /// over, which revokes that incarnation at the memory node.
    incarnations: HashMap<NodeId, u64>,
    /// Ring members seen live since this M-node leads (their disappearance is a failure at once).
    seen: std::collections::HashSet<NodeId>,
    leading_since: Instant,
    events: Arc<Mutex<Vec<ReconfigEvent>>>,
    leading: Arc<AtomicBool>,
    failures: Arc<FailureStreak>,
    /// The reconfiguration under way since its first attempt (a failed step is retried after a pause), so that
    /// its start is logged once.
    attempting: Option<(ReconfigKind, NodeId)>,
    /// When the next reconfiguration step may be tried: later than now while failures in a row back it off.
    next_attempt: Instant,
    /// A join that failed: the node, its failed attempts in a row, and when it may be tried again. A failed join
    /// is rolled back at the next check (the rollback succeeds, so failures in a row do not pile up there), but
    /// the join itself is put off by [`retry_pause`], so that a lasting outage does not have the old owners merge
    /// their logs for it every check.
    join_backoff: Option<(NodeId, u64, Instant)>,
    started: Instant,
}

impl State {
    fn run(&mut self, stop: &StopSignal, resign: &AtomicBool, admin: &Receiver<Admin>) {
        while !stop.is_stopped() {
            self.renew_lease_if_due();
            if !self.leading.load(Ordering::Acquire) {
                match self.meta.try_lead(ELECTION, &self.cfg.name, self.lease) {
                    Ok(true) => {
                        info!(name = %self.cfg.name, "leading the cluster");
                        self.installed.clear();
                        self.seen.clear();
                        self.leading_since = Instant::now();
                        self.next_attempt = self.leading_since;
                        self.leading.store(true, Ordering::Release);
                    }
                    Ok(false) => {}
                    Err(e) => warn!(error = %e, "election failed"),
                }
            }
            if self.leading.load(Ordering::Acquire) {
                while let Ok(cmd) = admin.try_recv() {
                    match cmd {
                        Admin::Remove(node, reply) => {
                            let _ = reply.send(self.remove(node));
                        }
                        Admin::Replicate(key, factor, reply) => {
                            let _ = reply.send(self.replicate(&key, factor));
                        }
                    }
                }
                if Instant::now() >= self.next_attempt {
                    self.reconcile_and_report();
                }
            } else {
                let standby = || Err(ClusterError::Reconfig("this M-node is a standby".into()));
                while let Ok(cmd) = admin.try_recv() {
                    let _ = match cmd {
                        Admin::Remove(_, reply) => reply.send(standby()),
                        Admin::Replicate(_, _, reply) => reply.send(standby()),
                    };
                }
            }
            if stop.wait(self.cfg.check_interval) {
                break;
            }
        }
        self.leading.store(false, Ordering::Release);
        if resign.load(Ordering::Acquire) {
            let _ = self.meta.revoke(self.lease);
        }
    }

    /// Renews the leadership lease once a quarter of its time to live has passed since the last renewal; an expired
    /// one ends the leadership and a fresh lease is taken to compete again. True while this M-node leads.
    fn renew_lease_if_due(&mut self) -> bool {
        if self.last_renewal.elapsed() >= self.cfg.lease_ttl / 4 {
            match self.meta.keep_alive(self.lease) {
                Ok(()) => self.last_renewal = Instant::now(),
                Err(MetaError::LeaseExpired(_)) => {
                    warn!(name = %self.cfg.name, "leadership lease expired");
                    self.leading.store(false, Ordering::Release);
                    match self.meta.grant(self.cfg.lease_ttl) {
                        Ok(l) => {
                            self.lease = l;
                            self.last_renewal = Instant::now();
                        }
                        Err(e) => warn!(error = %e, "cannot take a lease"),
                    }
                }
                Err(e) => warn!(error = %e, "cannot renew the leadership lease"),
            }
        }
        self.leading.load(Ordering::Acquire)
    }

    /// The stored record and its version (decoded again only when the version changed), or an empty one.
    fn record(&mut self) -> Result<(ClusterRecord, Option<u64>), ClusterError> {
        let known = self.record_cache.as_ref().map(|(v, _)| *v);
        // The store has no delete: once a record exists, "nothing new" means the cached one is current.
        if let Some((r, v)) = ClusterRecord::load_if_changed(&*self.meta, known)? {
            self.record_cache = Some((v, r));
        }
        Ok(match &self.record_cache {
            Some((v, r)) => (r.clone(), Some(*v)),
            None => (
                ClusterRecord {
                    routing: Routing {
                        ring: Ring::new(self.cfg.vnodes),
                        addrs: BTreeMap::new(),
                        cells: BTreeMap::new(),
                    },
                    retired: BTreeMap::new(),
                    reserved_epoch: 0,
                    pool_id: 0,
                },
                None,
            ),
        })
    }

    fn live(&self) -> Result<BTreeMap<NodeId, MemberInfo>, ClusterError> {
        Ok(self
            .meta
            .members("kn/")?
            .into_iter()
            .filter_map(|(name, info)| {
                let id = member_node(&name)?;
                let info: MemberInfo = postcard::from_bytes(&info).ok()?;
                Some((id, info))
            })
            .collect())
    }

    /// Whether this is the first attempt of reconfiguration `kind` for `node` (the last one completed or was
    /// another).
    fn first_attempt(&mut self, kind: ReconfigKind, node: NodeId) -> bool {
        self.attempting.replace((kind, node)) != Some((kind, node))
    }

    /// One [`State::reconcile`] step, logging a failure when it starts, changes or has lasted another
    /// [`crate::failures::REPEAT_EVERY`] and the recovery from one. A failure puts the next attempt off by
    /// [`retry_pause`].
    fn reconcile_and_report(&mut self) {
        match self.reconcile() {
            Ok(()) => {
                if let Some(r) = self.failures.succeeded(Instant::now()) {
                    info!(failures = r.failures, lasted = ?r.lasted, "reconfiguration succeeds again");
                }
            }
            Err(e) => {
                let now = Instant::now();
                let report = self.failures.failed(e.to_string(), now);
                let pause = retry_pause(&self.cfg, self.failures.streak());
                self.next_attempt = now + pause;
                if let Report::Log { unlogged } = report {
                    warn!(
                        error = %e,
                        repeats_not_logged = unlogged,
                        retry_in = ?pause,
                        "reconfiguration failed; retrying"
                    );
                }
            }
        }
    }

    /// One step toward the desired cluster: first failures, then removals under way (both override whatever a
    /// change left half done), then such a change is rolled back, then joins, then nodes lagging behind the record.
    fn reconcile(&mut self) -> Result<(), ClusterError> {
        let (record, version) = self.record()?;
        self.check_pool(&record)?;
        let live = self.live()?;
        let noticed = Instant::now();
        self.incarnations
            .extend(live.iter().map(|(id, i)| (*id, i.incarnation)));
        self.seen
            .extend(live.keys().filter(|id| record.routing.ring.contains(**id)));
        let in_grace = self.leading_since.elapsed() < self.cfg.failure_grace;
        let dead = record
            .routing
            .ring
            .nodes()
            .find(|n| !live.contains_key(n) && (self.seen.contains(n) || !in_grace));
        if let Some(dead) = dead {
            return self.fail(record, version, dead, noticed);
        }
        // A removal stored its intent and then failed: carried through, since the node's logs may be fenced.
        if let Some(leaving) = record.routing.ring.nodes().find(|n| {
            record
                .retired
                .get(n)
                .is_some_and(|inc| live.get(n).is_some_and(|i| i.incarnation == *inc))
        }) {
            return self.remove(leaving);
        }
        if record.change_under_way() {
            return self.roll_back(&record, version).map(|_| ());
        }
        let joining = live
            .iter()
            .find(|(id, info)| {
                !record.routing.ring.contains(**id)
                    && record.retired.get(id) != Some(&info.incarnation)
            })
            .map(|(id, info)| (*id, info.clone()));
        let put_off = |id: NodeId| {
            self.join_backoff
                .is_some_and(|(n, _, not_before)| n == id && noticed < not_before)
        };
        if let Some((id, info)) = joining.filter(|(id, _)| !put_off(*id)) {
            let joined = self.join(record, version, id, info, noticed);
            self.join_backoff = joined.is_err().then(|| {
                let failures = match self.join_backoff {
                    Some((n, failures, _)) if n == id => failures + 1,
                    _ => 1,
                };
                (
                    id,
                    failures,
                    Instant::now() + retry_pause(&self.cfg, failures),
                )
            });
            return joined;
        }
        // A ring member that restarted on another address.
        if let Some((&id, info)) = live.iter().find(|(id, info)| {
            record
                .routing
                .addrs
                .get(id)
                .is_some_and(|a| *a != info.addr)
        }) {
            let mut next = record.clone();
            next.routing.addrs.insert(id, info.addr.clone());
            // Nothing is installed before the store, which takes the epoch by itself.
            stamp(&mut next, next_epoch(&record), self.pool);
            next.store(&*self.meta, version)?;
            return Ok(());
        }
        // Step 6: nodes not involved in the last change catch up (also retries of failed installs).
        let lagging: Vec<NodeId> = record
            .routing
            .ring
            .nodes()
            .filter(|n| live.contains_key(n) && !self.is_installed(*n, record.routing.epoch()))
            .collect();
        if !lagging.is_empty() {
            self.install(&record.routing, &lagging)?;
        }
        Ok(())
    }

    fn fail(
        &mut self,
        record: ClusterRecord,
        version: Option<u64>,
        dead: NodeId,
        noticed: Instant,
    ) -> Result<(), ClusterError> {
        if self.first_attempt(ReconfigKind::Failure, dead) {
            info!(node = dead, "KV node failed; its logs are taken over");
        }
        let (epoch, record, version) = self.reserve(&record, version)?;
        let taken: proto::NodeTakenOver = self.dpm_call(
            proto::TAKE_OVER_NODE,
            &proto::TakeOverNode {
                node_id: dead,
                incarnation: self.incarnations.get(&dead).copied(),
                epoch,
            },
        )?;
        // A key the dead node was making shared when the record was not stored yet goes back to the index.
        let shared: Vec<u64> = record.routing.cells.values().copied().collect();
        let _: () = self.dpm_call(proto::SYNC_CELLS, &proto::SyncCells { shared, epoch })?;
        let mut next = record;
        next.routing.ring.remove_node(dead);
        next.routing.addrs.remove(&dead);
        stamp(&mut next, epoch, self.pool);
        let moved = self.move_data(&next.routing)?;
        next.store(&*self.meta, Some(version))?;
        self.installed.remove(&dead);
        self.seen.remove(&dead);
        self.incarnations.remove(&dead);
        // Nobody loses keys: every survivor may install at once.
        let survivors: Vec<NodeId> = next.routing.ring.nodes().collect();
        self.install(&next.routing, &survivors)?;
        self.note(
            ReconfigKind::Failure,
            dead,
            &next.routing,
            noticed,
            taken.merged_entries,
            &moved,
        );
        Ok(())
    }

    fn join(
        &mut self,
        record: ClusterRecord,
        version: Option<u64>,
        id: NodeId,
        info: MemberInfo,
        noticed: Instant,
    ) -> Result<(), ClusterError> {
        if self.first_attempt(ReconfigKind::Add, id) {
            info!(node = id, addr = %info.addr, "KV node joins");
        }
        let old: Vec<NodeId> = record.routing.ring.nodes().collect();
        let (epoch, record, version) = self.reserve(&record, version)?;
        let mut next = record;
        next.retired.remove(&id);
        next.routing.ring.add_node(id);
        next.routing.addrs.insert(id, info.addr);
        stamp(&mut next, epoch, self.pool);
        // The old owners give up the keys the new node takes before it may serve them.
        self.install(&next.routing, &old)?;
        let moved = self.move_data(&next.routing)?;
        next.store(&*self.meta, Some(version))?;
        self.install(&next.routing, &[id])?;
        self.note(ReconfigKind::Add, id, &next.routing, noticed, 0, &moved);
        Ok(())
    }

    fn remove(&mut self, id: NodeId) -> Result<(), ClusterError> {
        let noticed = Instant::now();
        let (record, version) = self.record()?;
        self.check_pool(&record)?;
        if !record.routing.ring.contains(id) {
            return Err(ClusterError::Reconfig(format!(
                "node {id} is not in the ring"
            )));
        }
        if record.routing.ring.len() == 1 {
            return Err(ClusterError::Reconfig(
                "the last KV node cannot be removed".into(),
            ));
        }
        let live = self.live()?;
        // The intent (the node's incarnation retired) is stored with the epoch: from the take-over on, the node's
        // logs are fenced, so a removal that fails after it must be carried through, not rolled back.
        let mut intent = record;
        if let Some(info) = live.get(&id) {
            intent.retired.insert(id, info.incarnation);
        }
        let (epoch, record, version) = self.reserve(&intent, version)?;
        let mut next = record;
        next.routing.ring.remove_node(id);
        next.routing.addrs.remove(&id);
        stamp(&mut next, epoch, self.pool);
        if let Some(info) = live.get(&id) {
            // The leaving node hands everything over (its log merged) before anyone else serves its keys.
            self.install_at(&next.routing, &[(id, info.addr.clone())])?;
        }
        // The node's logs get no writer again: fenced, they are given back to the memory node's directory once
        // their entries are superseded or cleaned (its ids are not reused, so nothing else would).
        let _: proto::NodeTakenOver = self.dpm_call(
            proto::TAKE_OVER_NODE,
            &proto::TakeOverNode {
                node_id: id,
                incarnation: live.get(&id).map(|i| i.incarnation),
                epoch,
            },
        )?;
        let moved = self.move_data(&next.routing)?;
        next.store(&*self.meta, Some(version))?;
        self.installed.remove(&id);
        self.seen.remove(&id);
        self.incarnations.remove(&id);
        let rest: Vec<NodeId> = next.routing.ring.nodes().collect();
        self.install(&next.routing, &rest)?;
        self.note(ReconfigKind::Remove, id, &next.routing, noticed, 0, &moved);
        Ok(())
    }

    /// Selective replication: see [`MNode::set_replication`].
    fn replicate(&mut self, key: &[u8], factor: u32) -> Result<(), ClusterError> {
        if self.partitioning()? == Partitioning::PerNode {
            return Err(ClusterError::Reconfig(
                "the memory node is partitioned per KV node (dinomo-n): keys cannot be shared by several nodes"
                    .into(),
            ));
        }
        let noticed = Instant::now();
        let (record, version) = self.record()?;
        self.check_pool(&record)?;
        if record.change_under_way() {
            return Err(ClusterError::Reconfig(
                "a change left half done is being rolled back; try again".into(),
            ));
        }
        let ring = &record.routing.ring;
        let Some(primary) = ring.primary(key) else {
            return Err(ClusterError::Reconfig("the ring is empty".into()));
        };
        let cell = record.routing.cells.get(key).copied();
        let old_owners: Vec<NodeId> = match cell {
            Some(_) => ring.owners(key).iter().collect(),
            None => vec![primary],
        };
        let mut next = record.clone();
        if factor > 1 {
            let changed = next.routing.ring.set_replication(key, factor);
            if !changed && cell.is_some() {
                return Ok(());
            }
            let (epoch, reserved, version) = self.reserve(&record, version)?;
            let cell = match cell {
                Some(c) => c,
                None => {
                    let r: proto::CellReserved = self.dpm_call(
                        proto::RESERVE_CELL,
                        &proto::ReserveCell {
                            key: key.to_vec(),
                            epoch,
                        },
                    )?;
                    r.cell
                }
            };
            next.routing.cells.insert(key.to_vec(), cell);
            stamp(&mut next, epoch, self.pool);
            // The nodes giving the key up install first; when the key becomes shared, that is its sole owner,
            // which moves the key's value into the cell before anyone else may serve it.
            let new_owners: Vec<NodeId> = next.routing.ring.owners(key).iter().collect();
            let first: Vec<NodeId> = if record.routing.cells.contains_key(key) {
                old_owners
                    .iter()
                    .copied()
                    .filter(|n| !new_owners.contains(n))
                    .collect()
            } else {
                vec![primary]
            };
            if let Err(e) = self.install(&next.routing, &first) {
                // Undone at the node (its value back in the index), a cell reserved for this change is freed.
                if let Some(epoch) = self.undo(&reserved, version, &first)
                    && !record.routing.cells.contains_key(key)
                    && let Err(e) = self
                        .dpm_call::<_, ()>(proto::RELEASE_CELL, &proto::ReleaseCell { cell, epoch })
                {
                    warn!(error = %e, "freeing the cell of a rolled-back sharing change failed");
                }
                return Err(e);
            }
            next.store(&*self.meta, Some(version))?;
            let all: Vec<NodeId> = next.routing.ring.nodes().collect();
            self.install(&next.routing, &all)?;
            self.note(
                ReconfigKind::Replicate,
                primary,
                &next.routing,
                noticed,
                0,
                &MovedData::default(),
            );
            return Ok(());
        }
        let Some(cell) = cell else {
            return Ok(());
        };
        next.routing.ring.set_replication(key, 1);
        next.routing.cells.remove(key);
        let (epoch, reserved, version) = self.reserve(&record, version)?;
        stamp(&mut next, epoch, self.pool);
        // Every other owner stops and merges its log first; then the primary moves the value back into the index.
        let others: Vec<NodeId> = old_owners
            .iter()
            .copied()
            .filter(|n| *n != primary)
            .collect();
        self.install(&next.routing, &others)?;
        if let Err(e) = self.install(&next.routing, &[primary]) {
            self.undo(&reserved, version, &[primary]);
            return Err(e);
        }
        next.store(&*self.meta, Some(version))?;
        let all: Vec<NodeId> = next.routing.ring.nodes().collect();
        self.install(&next.routing, &all)?;
        let _: () = self.dpm_call(proto::RELEASE_CELL, &proto::ReleaseCell { cell, epoch })?;
        self.note(
            ReconfigKind::Dereplicate,
            primary,
            &next.routing,
            noticed,
            0,
            &MovedData::default(),
        );
        Ok(())
    }

    /// Takes the next epoch for a change of `record` (at `version`). The memory node is fenced at that epoch first,
    /// so that it refuses the calls of every older change from then on; then the record is stored with its reserved
    /// epoch raised to it, before the change installs anything, so no other change (a stalled M-node's, say) gets
    /// the same epoch, and a change that never completes is known to need rolling back. A memory node that cannot
    /// be reached leaves the record as it was: nothing to roll back, and no store per attempt while it is away. A
    /// fence by an M-node whose store then fails (it no longer leads) raises the memory node at most to the epoch
    /// the leader reserves next, which the leader's own fence then takes again. Returns the epoch and the record as
    /// stored, with its version.
    fn reserve(
        &mut self,
        record: &ClusterRecord,
        version: Option<u64>,
    ) -> Result<(u64, ClusterRecord, u64), ClusterError> {
        // A second try reserves past the memory node's newest epoch, which the first refusal told.
        for _ in 0..2 {
            let epoch = next_epoch(record).max(self.dpm_epoch_floor.saturating_add(1));
            if !self.fence(epoch)? {
                continue;
            }
            let mut reserved = record.clone();
            reserved.reserved_epoch = epoch;
            reserved.pool_id = self.pool;
            let stored = reserved.store(&*self.meta, version)?;
            return Ok((epoch, reserved, stored));
        }
        Err(ClusterError::Reconfig(format!(
            "the memory node refused management epoch {} twice: another management node leads",
            self.dpm_epoch_floor
        )))
    }

    /// Raises the memory node's newest management epoch to `epoch`. False when it had a newer one, which is kept
    /// as the floor of the next reservation (the pool outlived the metadata store's record, or another M-node
    /// reserved a newer epoch meanwhile).
    fn fence(&mut self, epoch: u64) -> Result<bool, ClusterError> {
        let fenced: proto::Fenced = self.dpm_call(proto::FENCE, &proto::Fence { epoch })?;
        if fenced.newest == epoch {
            return Ok(true);
        }
        warn!(
            epoch,
            newest = fenced.newest,
            "the memory node acted on a newer management epoch; reserving past it"
        );
        self.dpm_epoch_floor = self.dpm_epoch_floor.max(fenced.newest);
        Ok(false)
    }

    /// A change reserved an epoch in `record` (at `version`) and was never stored: its M-node failed, stalled or
    /// lost the store halfway, and some nodes may serve under its table. The record's own table is stored again
    /// under a newer epoch; installing it everywhere (the catch-up step does) undoes whatever the change did at
    /// the nodes, since they refuse the older epoch from then on. Returns the record stored and its version.
    ///
    /// In the shared-nothing layout the change may have moved data: it is moved back first, while the keys' old
    /// owners still serve under the change's table, which left the keys to others. The rollback reserves its own
    /// epoch first, like a change, so that the memory node refuses the abandoned change's calls from then on.
    fn roll_back(
        &mut self,
        record: &ClusterRecord,
        version: Option<u64>,
    ) -> Result<(ClusterRecord, u64), ClusterError> {
        let (epoch, reserved, version) = self.reserve(record, version)?;
        let mut back = reserved;
        stamp(&mut back, epoch, self.pool);
        let moved = self.move_data(&back.routing)?;
        let stored = back.store(&*self.meta, Some(version))?;
        info!(
            abandoned = record.reserved_epoch,
            epoch = back.routing.epoch(),
            moved_keys = moved.keys,
            "a change left half done is rolled back"
        );
        Ok((back, stored))
    }

    /// [`State::roll_back`] of the change reserved in `reserved` at once, installing the table at `nodes` (those
    /// that may have served under the change). The rollback's epoch when every one of them did; otherwise `None`,
    /// and the catch-up step goes on trying.
    fn undo(&mut self, reserved: &ClusterRecord, version: u64, nodes: &[NodeId]) -> Option<u64> {
        let back = match self.roll_back(reserved, Some(version)) {
            Ok((back, _)) => back,
            Err(e) => {
                warn!(error = %e, "storing the rolled-back record failed");
                return None;
            }
        };
        match self.install(&back.routing, nodes) {
            Ok(()) => Some(back.routing.epoch()),
            Err(e) => {
                warn!(error = %e, "rolling back a sharing change failed");
                None
            }
        }
    }

    /// Has every node in `nodes` serve under `routing`, in parallel; fails if any could not.
    fn install(&mut self, routing: &Routing, nodes: &[NodeId]) -> Result<(), ClusterError> {
        let targets: Vec<(NodeId, String)> = nodes
            .iter()
            .filter_map(|n| routing.addrs.get(n).map(|a| (*n, a.clone())))
            .collect();
        self.install_at(routing, &targets)
    }

    /// Has every `(node, address)` serve under `routing`, in parallel (the table need not list them: a leaving
    /// node installs the table without itself); fails if any could not.
    ///
    /// A node that answers it cannot install now (its lease renewal came late, say, so its workers refused to
    /// merge) is asked again after a short pause, while it is still a live member under the incarnation that
    /// refused, every member of `routing` is live, this M-node still leads, and `install_timeout` has not passed
    /// since the first ask. A node that cannot be reached, or refuses for any other reason, fails the install at
    /// once: a dead node is failure handling's to deal with, and the install is retried by the next reconciliation.
    fn install_at(
        &mut self,
        routing: &Routing,
        targets: &[(NodeId, String)],
    ) -> Result<(), ClusterError> {
        let body = RequestBody::Install(routing.clone());
        let deadline = Instant::now() + self.cfg.install_timeout;
        let mut pending = targets.to_vec();
        let mut refused_by: HashMap<NodeId, u64> = HashMap::new();
        let mut pause = INSTALL_RETRY_PAUSE;
        let mut failed = Vec::new();
        loop {
            let timeout = deadline.saturating_duration_since(Instant::now());
            let results = call_each(
                &pending,
                (self.pool != 0).then_some(self.pool),
                &body,
                &self.dpm.config.cluster_token,
                timeout,
                |_, _, r| match r {
                    ResponseBody::Done => Ok(Installed::Done),
                    ResponseBody::Error {
                        kind: ErrorKind::Unavailable,
                        message,
                    } => Ok(Installed::NotNow(message)),
                    other => Err(format!("{other:?}")),
                },
            );
            let mut not_now = Vec::new();
            for ((n, addr), (_, r)) in pending.iter().zip(results) {
                match r {
                    Ok(Installed::Done) => self.mark_installed(*n, routing.epoch()),
                    Ok(Installed::NotNow(why)) => not_now.push((*n, addr.clone(), why)),
                    Err(e) => failed.push(format!("node {n}: {e}")),
                }
            }
            if not_now.is_empty() {
                break;
            }
            let live = self.live_if_worth_asking_again(routing, deadline, pause);
            pending.clear();
            for (n, addr, why) in not_now {
                // Asked again only while the incarnation that first refused is the live one.
                let same_incarnation = live.as_ref().and_then(|l| l.get(&n)).is_some_and(|info| {
                    *refused_by.entry(n).or_insert(info.incarnation) == info.incarnation
                });
                if same_incarnation {
                    debug!(node = n, epoch = routing.epoch(), reason = %why, "install refused for now; asking again");
                    pending.push((n, addr));
                } else {
                    failed.push(format!("node {n}: {why}"));
                }
            }
            if pending.is_empty() {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(INSTALL_RETRY_MAX_PAUSE);
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(ClusterError::Reconfig(format!(
                "installing epoch {} failed at {}",
                routing.epoch(),
                failed.join("; ")
            )))
        }
    }

    /// The live KV nodes, when nodes that refused an install of `routing` for now may be asked again after
    /// `pause`: this M-node leads, a pause leaves time before `deadline`, and every node of `routing` is live. A
    /// member that died meanwhile ends the asking: its failure comes first, and the next reconciliation handles it.
    fn live_if_worth_asking_again(
        &mut self,
        routing: &Routing,
        deadline: Instant,
        pause: Duration,
    ) -> Option<BTreeMap<NodeId, MemberInfo>> {
        if Instant::now() + pause >= deadline || !self.renew_lease_if_due() {
            return None;
        }
        let live = match self.live() {
            Ok(live) => live,
            Err(e) => {
                warn!(error = %e, "cannot read the live KV nodes to retry an install");
                return None;
            }
        };
        if let Some(dead) = routing.ring.nodes().find(|n| !live.contains_key(n)) {
            debug!(
                node = dead,
                "a ring member died during an install; not asking again"
            );
            return None;
        }
        Some(live)
    }

    fn mark_installed(&mut self, node: NodeId, epoch: u64) {
        let inc = self.incarnations.get(&node).copied().unwrap_or(0);
        self.installed.insert(node, (inc, epoch));
    }

    fn is_installed(&self, node: NodeId, epoch: u64) -> bool {
        let inc = self.incarnations.get(&node).copied().unwrap_or(0);
        self.installed
            .get(&node)
            .is_some_and(|&(i, e)| i == inc && e >= epoch)
    }

    /// Checks that `record` is of the pool the memory node serves (or names none yet), connecting first if need be.
    /// A record of another pool's cluster (the metadata store and the memory node belong to different clusters, or
    /// the pool was replaced under a store that kept the record) names cells, logs and epochs this pool does not
    /// have: nothing is changed by it.
    fn check_pool(&mut self, record: &ClusterRecord) -> Result<(), ClusterError> {
        self.pool = self.endpoint()?.pool_id();
        if record.pool_id != 0 && record.pool_id != self.pool {
            return Err(ClusterError::Reconfig(format!(
                "the cluster record in the metadata store belongs to pool {:#018x}, but the memory node serves \
                 pool {:#018x}: they are of different clusters, or the pool was replaced while the store kept \
                 the old record (delete that record to form a new cluster on this pool)",
                record.pool_id, self.pool
            )));
        }
        Ok(())
    }

    /// The endpoint to the memory node, connected first if need be (a failed call drops it).
    fn endpoint(&mut self) -> Result<&mut Endpoint, ClusterError> {
        if self.ep.is_none() {
            self.ep = Some(self.dpm.connect()?);
        }
        Ok(self.ep.as_mut().expect("connected above"))
    }

    fn dpm_call<Req: Serialize, Resp: serde::de::DeserializeOwned>(
        &mut self,
        method: u16,
        req: &Req,
    ) -> Result<Resp, ClusterError> {
        match self.endpoint()?.call(method, req) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.ep = None;
                Err(e.into())
            }
        }
    }

    /// The memory node's index layout (asked once: a pool keeps the layout it was formatted with).
    fn partitioning(&mut self) -> Result<Partitioning, ClusterError> {
        if let Some(p) = self.partitioning {
            return Ok(p);
        }
        let layout: proto::Layout = self.dpm_call(proto::LAYOUT, &())?;
        self.partitioning = Some(layout.partitioning);
        Ok(layout.partitioning)
    }

    /// Shared-nothing layout: has the memory node copy the data of every key whose owner under `routing` differs
    /// from the partition holding it into its owner's partition. The old owners must have stopped serving those
    /// keys (their logs merged), and the new owners must not serve them yet. With the shared index nothing moves
    /// and nothing is asked.
    fn move_data(&mut self, routing: &Routing) -> Result<MovedData, ClusterError> {
        if self.partitioning()? == Partitioning::Shared {
            return Ok(MovedData::default());
        }
        let started = Instant::now();
        let moved: proto::Rebalanced = self.dpm_call(
            proto::REBALANCE,
            &proto::Rebalance {
                ring: routing.ring.clone(),
            },
        )?;
        let took = started.elapsed();
        info!(
            keys = moved.keys,
            bytes = moved.bytes,
            ?took,
            "data moved between partitions"
        );
        Ok(MovedData {
            keys: moved.keys,
            bytes: moved.bytes,
            took,
        })
    }

    fn note(
        &mut self,
        kind: ReconfigKind,
        node: NodeId,
        routing: &Routing,
        noticed: Instant,
        merged: u64,
        moved: &MovedData,
    ) {
        let e = ReconfigEvent {
            kind,
            node,
            epoch: routing.epoch(),
            noticed_at: noticed.duration_since(self.started),
            duration: noticed.elapsed(),
            merged_entries: merged,
            moved_keys: moved.keys,
            moved_bytes: moved.bytes,
            move_duration: moved.took,
        };
        self.attempting = None;
        info!(?kind, node, epoch = e.epoch, took = ?e.duration, moved_bytes = e.moved_bytes, "reconfigured");
        self.events.lock().expect("events lock").push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_pause_doubles_from_the_check_interval_up_to_its_bound() {
        let cfg = MNodeConfig::default();
        let ms = Duration::from_millis;
        let pauses: Vec<Duration> = (1..=8).map(|n| retry_pause(&cfg, n)).collect();
        assert_eq!(
            pauses,
            [
                ms(5),
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(250),
                ms(250)
            ]
        );
        assert_eq!(retry_pause(&cfg, u64::MAX), ms(250));
        // A bound below the check interval leaves the check interval.
        let tight = MNodeConfig {
            max_retry_pause: ms(1),
            ..MNodeConfig::default()
        };
        assert_eq!(retry_pause(&tight, 3), ms(5));
    }
}
