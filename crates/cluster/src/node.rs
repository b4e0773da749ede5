//! A KV node as a cluster member: its workers, its native-protocol server, its liveness lease and its view of
//! the routing table.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dinomo_fabric::{ClientId, Connector, Endpoint};
use dinomo_kn::{Command, KnConfig, KnError, KvNode, LeaseGate, Ownership, Submitter};
use dinomo_meta::{LeaseId, MetaError, MetaStore};
use dinomo_ring::{NodeId, Ring};
use tracing::{info, warn};

use crate::ClusterRecord;
use crate::server::{Server, ServerLimits};
use crate::stop::StopSignal;
use crate::wire::Routing;
use crate::{ClusterError, MemberInfo, member_name};

/// Settings of a cluster KV node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's id: it names the node in the ring and its logs on the memory node. A node that restarts with
    /// the same id takes its logs back (the memory node merges them first).
    pub node_id: NodeId,
    /// Where the native protocol listens. Default 127.0.0.1:0 (any free port).
    pub listen: SocketAddr,
    /// The address other processes use to reach it, when it differs from the bound one.
    pub advertise: Option<String>,
    /// Worker settings (`kn.node_id` is replaced by `node_id`); `workers` in configuration files.
    #[serde(rename = "workers")]
    pub kn: KnConfig,
    /// Liveness lease: a node that misses its heartbeats this long is declared failed, and it stops serving by
    /// itself once it could not renew for this long. Default 200 ms.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Heartbeat period; well under `lease_ttl`. Default 40 ms.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// How long a request that finds the lease lapsed (a renewal came late, as when the heartbeat thread was
    /// starved of CPU) waits for a renewal before it is refused; it is served if one comes. A node whose lease
    /// expired in the store never serves again, whatever this says. Zero refuses at once. Default 200 ms (one
    /// default lease).
    #[serde(with = "humantime_serde")]
    pub lease_wait: Duration,
    /// Server limits.
    pub limits: ServerLimits,
    /// Where the Redis protocol (RESP) listens; `None` (the default) serves no RESP.
    pub resp_listen: Option<SocketAddr>,
    /// Settings of the RESP server (its `listen` is replaced by `resp_listen`).
    pub resp: dinomo_resp::ServerConfig,
    /// Threads that forward the RESP connections' commands on keys other nodes own, each with one pipelined native
    /// client (which keeps a connection to every owner it reached, so this also bounds the connections a node
    /// opens to each other node). 0 (the default): one per RESP event loop (`resp.event_loops()`). At most 64.
    pub resp_forward_threads: usize,
    /// How long each worker serving part of a Redis transaction (`MULTI` ... `EXEC`) waits there for the
    /// transaction's other workers to reach it; past this the transaction is abandoned, nothing of it applied.
    /// Default 1 s.
    #[serde(with = "humantime_serde")]
    pub txn_wait: Duration,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            kn: KnConfig::default(),
            lease_ttl: Duration::from_millis(200),
            heartbeat: Duration::from_millis(40),
            lease_wait: Duration::from_millis(200),
            limits: ServerLimits::default(),
            resp_listen: None,
            resp: dinomo_resp::ServerConfig::default(),
            resp_forward_threads: 0,
            txn_wait: Duration::from_secs(1),
        }
    }
}

/// The ownership map of one node: the ring and the node's id in it.
pub(crate) struct RingOwnership {
    pub ring: Ring,
    pub node: NodeId,
    /// Shared keys and their cells.
    pub cells: BTreeMap<Vec<u8>, u64>,
}

impl Ownership for RingOwnership {
    fn epoch(&self) -> u64 {
        self.ring.epoch()
    }

    fn owns(&self, key: &[u8]) -> bool {
        // Only a key with a cell is served by more than its primary: without one, two owners' logs would race.
        if self.cells.contains_key(key) {
            self.ring.is_owner(self.node, key)
        } else {
            self.ring.primary(key) == Some(self.node)
        }
    }

    fn cell(&self, key: &[u8]) -> Option<u64> {
        self.cells.get(key).copied()
    }

    fn shared_keys(&self) -> Vec<(Vec<u8>, u64)> {
        self.cells.iter().map(|(k, c)| (k.clone(), *c)).collect()
    }
}

/// Why a KV node did not install a routing table.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstallError {
    /// The node serves under a newer table.
    #[error("epoch {offered} is older than the epoch {serving} this node serves under")]
    Older {
        /// The epoch of the table offered.
        offered: u64,
        /// The epoch served.
        serving: u64,
    },
    /// The node serves under another table of the same epoch.
    #[error("this node serves under another table of epoch {epoch}")]
    Conflicting {
        /// The epoch both tables carry.
        epoch: u64,
    },
    /// The workers could not take the table over (a merge failed, say); the node serves under it all the same.
    #[error(transparent)]
    Kn(#[from] KnError),
}

/// What a KV node answers a `Stats` request with (as JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeStats {
    /// The node.
    pub node_id: NodeId,
    /// The epoch of the routing table it serves under.
    pub epoch: u64,
    /// Its share of the ring.
    pub share: f64,
    /// Its workers' counters, in thread order (readers match threads across snapshots by position).
    pub threads: Vec<dinomo_kn::WorkerStats>,
}

/// Key bytes one `SCAN` step brings back from the memory node at most (far below the fabric's message limit).
const SCAN_REPLY_BYTES: u32 = 1 << 20;

/// A node's administrative calls to its memory node's processor (`DBSIZE`, `SCAN`, the memory node's statistics):
/// one fabric endpoint shared by whoever asks, connected on first use and again after a failure.
pub(crate) struct MemoryCalls {
    connector: Connector,
    endpoint: Mutex<Option<Endpoint>>,
}

impl MemoryCalls {
    fn new(connector: Connector) -> MemoryCalls {
        MemoryCalls {
            connector,
            endpoint: Mutex::new(None),
        }
    }

    /// Calls `method` with `req`; why it failed otherwise.
    pub(crate) fn call<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        method: u16,
        req: &Req,
    ) -> Result<Resp, String> {
        let mut endpoint = self.endpoint.lock().unwrap_or_else(|p| p.into_inner());
        let ep = match &mut *endpoint {
            Some(ep) => ep,
            None => endpoint.insert(
                self.connector
                    .connect()
                    .map_err(|e| format!("cannot reach the memory node: {e}"))?,
            ),
        };
        ep.call(method, req).map_err(|e| {
            *endpoint = None;
            e.to_string()
        })
    }
}

/// What the server threads of a node share.
pub(crate) struct NodeShared {
    pub id: NodeId,
    pub submitter: Submitter,
    routing: RwLock<Routing>,
    /// Serializes installs.
    install_lock: std::sync::Mutex<()>,
    /// Orders ownership changes against batches of requests queued together (RESP pipelines): an install
    /// queues its new ownership at the workers under the write side, a batch is queued under the read side, so
    /// every request of a batch meets the same ownership at its worker.
    pub(crate) queue_order: RwLock<()>,
    /// Latency reports and tracked keys for the M-node's policy.
    pub(crate) policy_stats: crate::stats::NodePolicyStats,
    /// The memory node, for the administrative requests that ask about it.
    pub(crate) memory: MemoryCalls,
    /// The memory node's pool (0 if unknown), which the native handshake names.
    pub(crate) pool_id: u64,
    /// Whether other nodes of this process may still queue operations at its workers ([`Peers`]); cleared under
    /// the write side of `queue_order` when the node stops, so that every operation a peer queued is ahead of the
    /// workers' stop and is answered.
    pub(crate) open_to_peers: AtomicBool,
    /// Operations the node's Redis front door sent to other nodes: queued at a peer's workers in this process, and
    /// forwarded over the network.
    pub(crate) resp_ops_to_peers: AtomicU64,
    pub(crate) resp_ops_forwarded: AtomicU64,
}

/// The KV nodes running in one process (a local cluster): a node's Redis front door queues an operation on a key
/// another of them owns straight at that node's workers, as it queues its own, instead of forwarding it through the
/// native protocol over loopback. The owner's workers check ownership as for any request, and one that refuses
/// hands the operation back to be forwarded.
#[derive(Default)]
pub(crate) struct Peers {
    nodes: RwLock<HashMap<NodeId, Arc<NodeShared>>>,
}

impl Peers {
    /// The running node `id`, if it runs in this process.
    pub(crate) fn get(&self, id: NodeId) -> Option<Arc<NodeShared>> {
        self.nodes.read().expect("peers lock").get(&id).cloned()
    }

    fn add(&self, node: Arc<NodeShared>) {
        self.nodes
            .write()
            .expect("peers lock")
            .insert(node.id, node);
    }

    /// Removes `node`, unless another incarnation of its id took its place.
    fn remove(&self, node: &Arc<NodeShared>) {
        let mut nodes = self.nodes.write().expect("peers lock");
        if nodes.get(&node.id).is_some_and(|n| Arc::ptr_eq(n, node)) {
            nodes.remove(&node.id);
        }
    }
}

impl NodeShared {
    pub(crate) fn routing(&self) -> Routing {
        self.routing.read().expect("routing lock").clone()
    }

    /// Runs `f` on the routing table without copying it.
    pub(crate) fn with_routing<R>(&self, f: impl FnOnce(&Routing) -> R) -> R {
        f(&self.routing.read().expect("routing lock"))
    }

    /// Serves under `routing` from now on: every worker commits what is pending, merges its log if it held
    /// writes of keys it loses, and drops lost keys from its cache before this returns.
    ///
    /// A table older than the one served is refused, and so is another table under the same epoch: epochs are
    /// never reused, so either comes from an M-node that lost its leadership mid-change, and following it could
    /// leave keys with no owner or with two. The same table again is installed again (the M-node retries an
    /// install that failed halfway).
    pub(crate) fn install(&self, routing: Routing) -> Result<(), InstallError> {
        let _one = self.install_lock.lock().expect("install lock");
        {
            let serving = self.routing.read().expect("routing lock");
            if routing.epoch() < serving.epoch() {
                return Err(InstallError::Older {
                    offered: routing.epoch(),
                    serving: serving.epoch(),
                });
            }
            if routing.epoch() == serving.epoch() && routing != *serving {
                return Err(InstallError::Conflicting {
                    epoch: routing.epoch(),
                });
            }
        }
        let own: Arc<dyn Ownership> = Arc::new(RingOwnership {
            ring: routing.ring.clone(),
            node: self.id,
            cells: routing.cells.clone(),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        {
            let _queued_alone = self.queue_order.write().expect("queue order lock");
            self.submitter
                .broadcast(|| Command::Own(own.clone()), 0, &tx)?;
        }
        let mut first_error = None;
        for _ in 0..self.submitter.threads() {
            match rx.recv() {
                Ok((_, Ok(_))) => {}
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(KnError::Stopped);
                }
            }
        }
        // The table is published even when a worker failed to merge: the workers already refuse what they lost,
        // and the M-node retries the install before it hands the keys to anyone.
        if let Err(e) = self.track_replicated(&routing) {
            first_error.get_or_insert(e);
        }
        *self.routing.write().expect("routing lock") = routing;
        first_error.map_or(Ok(()), |e| Err(InstallError::Kn(e)))
    }

    /// The memory node's statistics.
    pub(crate) fn memory_stats(&self) -> Result<dinomo_dpm::ProcessorStats, String> {
        self.memory.call(dinomo_dpm::proto::STATS, &())
    }

    /// One step of the memory node's walk over every key ([`dinomo_dpm::proto::ScanKeys`]); keys one step brings
    /// back are bounded by [`SCAN_REPLY_BYTES`].
    pub(crate) fn scan_keys(
        &self,
        cursor: u64,
        count: u32,
    ) -> Result<dinomo_dpm::proto::KeysPage, String> {
        let req = dinomo_dpm::proto::ScanKeys {
            cursor,
            count,
            max_bytes: SCAN_REPLY_BYTES,
        };
        self.memory.call(dinomo_dpm::proto::SCAN_KEYS, &req)
    }

    /// The node's statistics: its workers' counters, in thread order, and its place in the ring.
    pub(crate) fn stats(&self) -> Result<NodeStats, KnError> {
        let threads = self.submitter.handle().stats()?;
        let routing = self.routing();
        Ok(NodeStats {
            node_id: self.id,
            epoch: routing.epoch(),
            share: routing.ring.share(self.id),
            threads,
        })
    }
}

/// A running cluster KV node.
pub struct ClusterNode {
    /// What it was started with (its RESP address as configured, not as bound).
    config: NodeConfig,
    shared: Arc<NodeShared>,
    kv: Option<KvNode>,
    server: Option<Server>,
    resp: Option<dinomo_resp::RespServer>,
    addr: String,
    gate: Arc<LeaseGate>,
    meta: Arc<dyn MetaStore>,
    lease: LeaseId,
    /// This process's incarnation of the node id (registered with its address).
    incarnation: u64,
    stop_heartbeat: Arc<StopSignal>,
    /// Fault injection: while set, the heartbeat sends nothing ([`ClusterNode::hold_heartbeats`]).
    heartbeats_held: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
    crashed: bool,
    /// The other nodes of this process, which this one joined ([`Peers`]).
    peers: Option<Arc<Peers>>,
}

impl ClusterNode {
    /// Starts a node: takes a lease, starts the workers under the ownership the cluster record gives it (nothing
    /// until the M-node adds it), opens its server and registers itself as live.
    pub fn start(
        config: NodeConfig,
        connector: Connector,
        meta: Arc<dyn MetaStore>,
    ) -> Result<ClusterNode, ClusterError> {
        ClusterNode::start_among(config, connector, meta, None)
    }

    /// [`ClusterNode::start`], the node joining `peers`, the nodes of this process, once it runs.
    pub(crate) fn start_among(
        config: NodeConfig,
        connector: Connector,
        meta: Arc<dyn MetaStore>,
        peers: Option<Arc<Peers>>,
    ) -> Result<ClusterNode, ClusterError> {
        let mut t0 = Instant::now();
        let mut lease = meta.grant(config.lease_ttl)?;
        let gate = LeaseGate::with_wait(t0 + config.lease_ttl, config.lease_wait);
        // A node serves nothing until the M-node installs the current table at it: the M-node may still be
        // handing over this node id's keys from an earlier incarnation.
        let routing = Routing {
            ring: Ring::new(dinomo_ring::DEFAULT_VNODES),
            addrs: Default::default(),
            cells: Default::default(),
        };
        let own: Arc<dyn Ownership> = Arc::new(RingOwnership {
            ring: routing.ring.clone(),
            node: config.node_id,
            cells: routing.cells.clone(),
        });
        let kn = KnConfig {
            node_id: config.node_id,
            ..config.kn.clone()
        };
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 40);
        // Every connection of this process's node names it, so that the memory node can revoke them all when the
        // cluster takes the node over (and refuse them when they come back from behind a partition).
        let connector = connector.for_client(ClientId {
            node: config.node_id,
            incarnation,
        });
        let kv = KvNode::start_in_cluster(kn, connector.clone(), Some(own), Some(gate.clone()))?;
        let shared = Arc::new(NodeShared {
            id: config.node_id,
            submitter: kv.submitter(),
            routing: RwLock::new(routing),
            install_lock: std::sync::Mutex::new(()),
            queue_order: RwLock::new(()),
            policy_stats: Default::default(),
            memory: MemoryCalls::new(connector.clone()),
            pool_id: connector.pinned_pool().unwrap_or(0),
            open_to_peers: AtomicBool::new(true),
            resp_ops_to_peers: AtomicU64::new(0),
            resp_ops_forwarded: AtomicU64::new(0),
        });
        let server = Server::start(
            config.listen,
            config.limits.clone(),
            &connector.config.cluster_token,
            shared.clone(),
            &format!("dinomo-kn{}", config.node_id),
        )
        .map_err(|e| ClusterError::Io(format!("cannot listen on {}: {e}", config.listen)))?;
        let addr = config
            .advertise
            .clone()
            .unwrap_or_else(|| server.local_addr().to_string());
        let resp = match config.resp_listen {
            Some(listen) => Some(crate::resp::start(
                listen,
                &config,
                shared.clone(),
                peers.clone(),
                &connector.config.cluster_token,
                server.local_addr().to_string(),
            )?),
            None => None,
        };
        let info = postcard::to_allocvec(&MemberInfo {
            addr: addr.clone(),
            incarnation,
        })
        .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
        // On a starved machine starting can take longer than the lease: a lease that expired before the node
        // registered is replaced (nothing was served under it; the node owns nothing until the M-node says so).
        let mut fresh_leases = 0;
        loop {
            match meta.register(&member_name(config.node_id), &info, lease) {
                Ok(()) => break,
                Err(MetaError::LeaseExpired(_)) if fresh_leases < 3 => {
                    fresh_leases += 1;
                    t0 = Instant::now();
                    lease = meta.grant(config.lease_ttl)?;
                    gate.extend_to(t0 + config.lease_ttl);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let stop_heartbeat = Arc::new(StopSignal::default());
        let heartbeats_held = Arc::new(AtomicBool::new(false));
        let heartbeat = {
            let (meta, gate, stop) = (meta.clone(), gate.clone(), stop_heartbeat.clone());
            let held = heartbeats_held.clone();
            let (ttl, period, id) = (config.lease_ttl, config.heartbeat, config.node_id);
            std::thread::Builder::new()
                .name(format!("dinomo-kn{id}-heartbeat"))
                .spawn(move || {
                    heartbeat_loop(&*meta, lease, &gate, &stop, &held, t0, ttl, period, id);
                    gate.stop_renewals();
                })
                .map_err(|e| ClusterError::Io(format!("cannot start the heartbeat: {e}")))?
        };
        info!(node = config.node_id, %addr, resp = ?config.resp_listen, "KV node serving");
        if let Some(peers) = &peers {
            peers.add(shared.clone());
        }
        Ok(ClusterNode {
            config,
            shared,
            kv: Some(kv),
            server: Some(server),
            resp,
            addr,
            gate,
            meta,
            lease,
            incarnation,
            stop_heartbeat,
            heartbeats_held,
            heartbeat: Some(heartbeat),
            crashed: false,
            peers,
        })
    }

    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.config.node_id
    }

    /// The settings a new incarnation of this node starts with after it was fenced: the same id and settings, and
    /// the RESP address it bound, so clients find it where they did also when the system picked the port.
    pub fn restart_config(&self) -> NodeConfig {
        NodeConfig {
            resp_listen: self.resp_addr().or(self.config.resp_listen),
            ..self.config.clone()
        }
    }

    /// Whether `record` says the M-node removed this incarnation: it is retired and out of the ring, so it serves
    /// nothing again and may be stopped.
    pub fn is_removed_by(&self, record: &ClusterRecord) -> bool {
        record.retired.get(&self.id()) == Some(&self.incarnation)
            && !record.routing.ring.contains(self.id())
    }

    /// The native-protocol address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where it serves the Redis protocol, if it does.
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp.as_ref().map(dinomo_resp::RespServer::local_addr)
    }

    /// The routing table it serves under.
    pub fn routing(&self) -> Routing {
        self.shared.routing()
    }

    /// Whether its lease still allows it to serve.
    pub fn is_serving(&self) -> bool {
        self.gate.is_open()
    }

    /// Whether it stopped serving for good: its lease expired at the metadata store (the node was starved of CPU
    /// or cut off from the store for longer than the lease, and the cluster may already have handed its keys to
    /// others) or it crashed. Only a restart, which takes its logs back, brings its id into service again.
    pub fn is_fenced(&self) -> bool {
        self.gate.is_fenced()
    }

    /// Fault injection: while `held`, the heartbeat thread sends no renewal, as one that gets no CPU. The lease
    /// lapses at the node first, then expires at the store (the M-node fails the node); once released, the next
    /// renewal finds it expired and the node is fenced.
    pub fn hold_heartbeats(&self, held: bool) {
        self.heartbeats_held.store(held, Ordering::Release);
    }

    /// The liveness lease it keeps alive at the metadata store.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Waits for a lease renewal its requests (and group commits) began because they found the lease lapsed.
    pub fn lease_waits(&self) -> u64 {
        self.gate.waits()
    }

    /// The node's metrics, for a [`crate::metrics::MetricsServer`]; they read the node while it runs.
    pub fn metrics(&self) -> crate::metrics::NodeMetrics {
        crate::metrics::NodeMetrics {
            shared: self.shared.clone(),
            gate: self.gate.clone(),
            resp: self
                .resp
                .as_ref()
                .map(dinomo_resp::RespServer::stats_handle),
        }
    }

    /// The counters of the node's worker threads.
    pub fn worker_stats(&self) -> Result<Vec<dinomo_kn::WorkerStats>, KnError> {
        Ok(self.shared.stats()?.threads)
    }

    /// Handles for in-process use (the RESP front door).
    pub fn submitter(&self) -> Submitter {
        self.shared.submitter.clone()
    }

    /// Stops as if the process died: no more heartbeats, connections cut, nothing answered from now on. The
    /// cluster notices when the lease expires.
    pub fn crash(mut self) {
        self.crashed = true;
        self.gate.close();
        self.shutdown();
    }

    /// Stops cleanly: revokes the lease (a node the M-node removed first leaves without a failure).
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Stops a node the M-node has removed from the ring once it has drained: it keeps serving, refusing its former
    /// keys with NotOwner, until no request has reached it for `quiet` (or `max` has passed). Clients and forwarders
    /// still routing by the old table then learn the new one from its refusals, instead of writing a request into a
    /// connection that closes under it (a write whose outcome they could not know).
    pub fn retire(self, quiet: Duration, max: Duration) {
        let deadline = dinomo_kn::deadline_after(max);
        let mut seen = self.requests_seen();
        while Instant::now() < deadline {
            std::thread::sleep(quiet.min(deadline.saturating_duration_since(Instant::now())));
            let now = self.requests_seen();
            if now == seen {
                break;
            }
            seen = now;
        }
        self.stop();
    }

    /// Data requests its workers have taken so far, served or refused (`None` when they cannot say).
    fn requests_seen(&self) -> Option<u64> {
        let threads = self.shared.submitter.handle().stats().ok()?;
        Some(threads.iter().map(|t| t.ops.total() + t.not_owner).sum())
    }

    /// Stops heartbeats, server and workers; a clean stop (not a crash) also gives the lease back.
    fn shutdown(&mut self) {
        if let Some(peers) = self.peers.take() {
            // No peer queues anything at the workers from here on, and what peers queued before is ahead of the
            // workers' stop below.
            peers.remove(&self.shared);
            let _queued = self.shared.queue_order.write().expect("queue order lock");
            self.shared.open_to_peers.store(false, Ordering::Release);
        }
        self.stop_heartbeat.stop();
        self.resp.take();
        self.server.take();
        if let Some(t) = self.heartbeat.take() {
            let _ = t.join();
        }
        if let Some(kv) = self.kv.take() {
            kv.stop();
        }
        if !self.crashed {
            let _ = self.meta.revoke(self.lease);
        }
    }
}

/// Renews `lease` until `stop`, moving `gate`'s deadline with every renewal. A renewal is due one `period` after
/// the last one was sent (not after it returned) and never later than half the lease after it, so a heartbeat
/// thread that wakes late (starved of CPU) or a renewal that takes long leaves room before the gate lapses; a
/// failed renewal is retried after a quarter period rather than a whole one.
#[allow(clippy::too_many_arguments)]
fn heartbeat_loop(
    meta: &dyn MetaStore,
    lease: LeaseId,
    gate: &LeaseGate,
    stop: &StopSignal,
    held: &AtomicBool,
    granted: Instant,
    ttl: Duration,
    period: Duration,
    id: NodeId,
) {
    let interval = period.min(ttl / 2);
    let mut due = granted + interval;
    while !stop.is_stopped() {
        if gate.is_fenced() {
            // A worker found the node revoked by the memory node: renewing would only keep a node that cannot
            // serve in the ring.
            warn!(node = id, "fenced; this node no longer renews its lease");
            return;
        }
        let now = Instant::now();
        if held.load(Ordering::Acquire) {
            stop.wait(period);
            continue;
        }
        if now < due {
            // In steps of at most a period, so that holding heartbeats takes effect soon.
            stop.wait((due - now).min(period));
            continue;
        }
        // The deadline counts from before the renewal was sent: the store's own deadline is later.
        let sent = Instant::now();
        match meta.keep_alive(lease) {
            Ok(()) => {
                gate.extend_to(sent + ttl);
                due = sent + interval;
            }
            Err(MetaError::LeaseExpired(_)) => {
                warn!(node = id, "lease expired; this node no longer serves");
                gate.close();
                return;
            }
            Err(e) => {
                warn!(node = id, error = %e, "heartbeat failed");
                due = dinomo_kn::deadline_after(interval / 4);
            }
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}
