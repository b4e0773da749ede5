//! A whole cluster in one process: a memory node (pool file, processor, metadata service), KV nodes, a routing
//! node and the M-node. What `dinomo up` runs, and what the tests and benchmarks drive.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{
    ClientId, Connector, MemoryNode, NodeConfig as FabricNodeConfig, RpcError, RpcHandler, Target,
};
use dinomo_meta::{EmbeddedMeta, META_METHODS, MetaConfig, MetaService, MetaStore};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_ring::NodeId;
use tracing::{debug, info, warn};

use crate::node::Peers;
use crate::stop::StopSignal;
use crate::{
    Actuator, AutoscaleConfig, Autoscaler, ClientConfig, ClusterError, ClusterNode, ClusterRecord,
    MNode, MNodeConfig, NodeConfig, RoutingNode, Scaler, ServerLimits,
};

/// One memory node's RPCs: the processor's data-plane calls and the metadata service.
pub struct MemoryNodeRpc {
    data: Arc<dyn RpcHandler>,
    meta: MetaService,
}

impl MemoryNodeRpc {
    /// Routes metadata methods to `meta` and everything else to `data`.
    pub fn new(data: Arc<dyn RpcHandler>, meta: Arc<EmbeddedMeta>) -> MemoryNodeRpc {
        MemoryNodeRpc {
            data,
            meta: MetaService::new(meta),
        }
    }
}

impl RpcHandler for MemoryNodeRpc {
    fn handle(
        &self,
        caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        if META_METHODS.contains(&method) {
            self.meta.handle(method, request, response)
        } else {
            // The data plane refuses a revoked client's claims, so it must know who calls.
            self.data.handle(caller, method, request, response)
        }
    }
}

/// Settings of an in-process cluster.
#[derive(Debug, Clone)]
pub struct LocalClusterConfig {
    /// Pool file; `None` keeps the data in anonymous memory (lost at exit).
    pub pool_path: Option<PathBuf>,
    /// Pool size when it is created. Default 1 GiB.
    pub pool_size: u64,
    /// How writes reach the pool file.
    pub persist: PersistMode,
    /// Bytes of the lowest free pool space kept faulted in ahead of the log writers (see
    /// [`Pool::start_prefaulter`]); 0 turns it off. Default [`dinomo_pool::DEFAULT_PREFAULT_AHEAD`].
    pub pool_prefault_ahead: u64,
    /// The memory node's processor.
    pub processor: ProcessorConfig,
    /// KV nodes to start.
    pub kns: usize,
    /// Settings of every KV node (`node_id` and `listen` are set per node).
    pub node: NodeConfig,
    /// The M-node.
    pub mnode: MNodeConfig,
    /// Routing node address. Default 127.0.0.1:0.
    pub rn_listen: SocketAddr,
    /// How often the routing node re-reads the cluster record. Default 2 ms.
    pub rn_refresh: Duration,
    /// The routing node's server limits.
    pub rn_limits: ServerLimits,
    /// The memory node's fabric side (message limit, processor threads) and the cluster token, which every part
    /// presents: the KV nodes to the memory node, the M-node and clients to the KV and routing nodes.
    pub memory_node: FabricNodeConfig,
    /// Limits of the cluster record kept in the pool.
    pub meta: MetaConfig,
    /// Injected fabric latency per round trip (ns), to emulate a µs-scale network. Default 0.
    pub injected_latency_ns: u64,
    /// Where the KV nodes serve the Redis protocol, in the order they start: the i-th node started listens on
    /// `resp_listen[i]`, later ones on the ports after the last address (all on any free port when its port is
    /// 0). Empty (the default): no RESP. Other RESP settings come from `node.resp`.
    pub resp_listen: Vec<SocketAddr>,
    /// The M-node's policy loop (off by default); it starts and stops KV nodes of this cluster.
    pub autoscale: AutoscaleConfig,
    /// How long starting a node may take until it serves: each of the `kns` at the start (all together), one
    /// added later (by [`LocalCluster::add_node`] or the autoscaler). Default 30 s.
    pub node_start_timeout: Duration,
    /// A node removed from the ring keeps answering (refusing its former keys) until no request has reached it for
    /// this long, so that clients still routing to it learn the new table before it closes. Default 50 ms.
    pub retire_quiet: Duration,
    /// The longest a removed node drains before it stops, requests or not. Default 2 s.
    pub retire_max: Duration,
}

impl Default for LocalClusterConfig {
    fn default() -> Self {
        LocalClusterConfig {
            pool_path: None,
            pool_size: 1 << 30,
            persist: PersistMode::default(),
            pool_prefault_ahead: dinomo_pool::DEFAULT_PREFAULT_AHEAD,
            processor: ProcessorConfig::default(),
            kns: 2,
            node: NodeConfig::default(),
            mnode: MNodeConfig::default(),
            rn_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rn_refresh: Duration::from_millis(2),
            rn_limits: ServerLimits::default(),
            memory_node: FabricNodeConfig::default(),
            meta: MetaConfig::default(),
            injected_latency_ns: 0,
            resp_listen: Vec::new(),
            autoscale: AutoscaleConfig::default(),
            node_start_timeout: Duration::from_secs(30),
            retire_quiet: Duration::from_millis(50),
            retire_max: Duration::from_secs(2),
        }
    }
}

/// An endpoint factory for the in-process memory node: the cluster token and the injected latency of `cfg`.
fn in_process_connector(memory: &Arc<MemoryNode>, cfg: &LocalClusterConfig) -> Connector {
    let mut c = Connector::new(Target::InProcess(memory.clone()));
    c.config.cluster_token = cfg.memory_node.cluster_token.clone();
    c.config.injected_latency_ns = cfg.injected_latency_ns;
    c
}

/// A running in-process cluster.
pub struct LocalCluster {
    cfg: LocalClusterConfig,
    pool: Arc<Pool>,
    memory: Arc<MemoryNode>,
    processor: Arc<Processor>,
    meta: Arc<EmbeddedMeta>,
    /// The KV nodes and how to start more; shared with the autoscaler.
    scaler: Arc<LocalScaler>,
    rn: Option<RoutingNode>,
    mnode: Option<Arc<MNode>>,
    autoscaler: Option<Autoscaler>,
    /// Restarts KV nodes whose lease expired ([`LocalScaler::restart_fenced`]).
    supervisor: Option<std::thread::JoinHandle<()>>,
}

impl LocalCluster {
    /// Opens (or creates) the pool, starts the memory node, the M-node, the routing node and `kns` KV nodes, and
    /// waits until all of them serve.
    pub fn start(cfg: LocalClusterConfig) -> Result<LocalCluster, ClusterError> {
        // Refused before anything starts: with no node to form it, the cluster would only time out.
        if cfg.kns == 0 {
            return Err(ClusterError::Config(
                "a local cluster needs at least one KV node (kns is 0)".into(),
            ));
        }
        let pool = match &cfg.pool_path {
            Some(p) => {
                let opts = PoolOptions {
                    persist: cfg.persist,
                    segment_size: cfg
                        .processor
                        .segment_size
                        .min(dinomo_pool::DEFAULT_SEGMENT_SIZE),
                    ..PoolOptions::with_size(cfg.pool_size)
                };
                Pool::open_or_create(p, &opts)
                    .map_err(|e| ClusterError::Io(e.to_string()))?
                    .0
            }
            None => Pool::anonymous(
                cfg.pool_size,
                cfg.processor
                    .segment_size
                    .min(dinomo_pool::DEFAULT_SEGMENT_SIZE),
            )
            .map_err(|e| ClusterError::Io(e.to_string()))?,
        };
        let pool = Arc::new(pool);
        pool.start_prefaulter(cfg.pool_prefault_ahead)
            .map_err(|e| ClusterError::Io(e.to_string()))?;
        let processor = Processor::start(pool.clone(), &cfg.processor)
            .map_err(|e| ClusterError::Io(format!("memory node: {e}")))?;
        let meta = EmbeddedMeta::open(pool.clone(), cfg.meta.clone())?;
        let memory = MemoryNode::new(pool.clone(), cfg.memory_node.clone());
        memory.set_rpc_handler(Arc::new(MemoryNodeRpc::new(
            processor.rpc_handler(&memory),
            meta.clone(),
        )));
        let connector = in_process_connector(&memory, &cfg);
        let scaler = Arc::new(LocalScaler {
            nodes: Mutex::new(Vec::new()),
            next_id: AtomicU32::new(1),
            node: cfg.node.clone(),
            connector,
            meta: meta.clone(),
            start_timeout: cfg.node_start_timeout,
            retire: (cfg.retire_quiet, cfg.retire_max),
            stopping: StopSignal::default(),
            resp_listen: cfg.resp_listen.clone(),
            started: std::sync::atomic::AtomicUsize::new(0),
            restarted: Mutex::new(Vec::new()),
            removing: Mutex::new(Default::default()),
            peers: Default::default(),
        });
        let mut c = LocalCluster {
            pool,
            memory,
            processor,
            meta,
            scaler,
            rn: None,
            mnode: None,
            autoscaler: None,
            supervisor: None,
            cfg,
        };
        c.mnode = Some(Arc::new(MNode::start(
            c.cfg.mnode.clone(),
            c.meta_store(),
            c.connector(),
        )?));
        c.rn = Some(RoutingNode::start(
            c.cfg.rn_listen,
            c.meta_store(),
            c.cfg.rn_refresh,
            c.cfg.rn_limits.clone(),
            &c.cfg.memory_node.cluster_token,
        )?);
        // Nodes of an earlier run come back with their ids (and so their logs).
        let known: Vec<NodeId> = ClusterRecord::load(&*c.meta)?
            .map(|(r, _)| r.routing.ring.nodes().collect())
            .unwrap_or_default();
        let next_id = match known.iter().max() {
            None => 1,
            Some(m) => m.checked_add(1).ok_or_else(|| {
                ClusterError::Corrupt(format!(
                    "the stored ring names node {m}, leaving no id for a new node"
                ))
            })?,
        };
        c.scaler.next_id.store(next_id, Ordering::Release);
        for i in 0..c.cfg.kns {
            let id = known
                .get(i)
                .copied()
                .unwrap_or_else(|| c.scaler.next_id.fetch_add(1, Ordering::AcqRel));
            c.scaler.start_node_with_id(id)?;
        }
        c.wait_until_serving(c.cfg.node_start_timeout)?;
        c.supervisor = Some({
            let (scaler, period) = (c.scaler.clone(), c.cfg.node.heartbeat);
            std::thread::Builder::new()
                .name("dinomo-kn-supervisor".into())
                .spawn(move || {
                    // Stopped nodes waiting to start again.
                    let mut to_restart = Vec::new();
                    // The version of the cluster record last looked at.
                    let mut record_version = None;
                    while !scaler.stopping.is_stopped() {
                        scaler.restart_fenced(&mut to_restart);
                        scaler.retire_removed(&mut record_version);
                        if scaler.stopping.wait(period) {
                            break;
                        }
                    }
                })
                .map_err(|e| ClusterError::Io(format!("cannot start the node supervisor: {e}")))?
        });
        if c.cfg.autoscale.enabled {
            let actuator: Arc<dyn Actuator> = c.mnode.clone().expect("started above");
            c.autoscaler = Some(Autoscaler::start(
                c.cfg.autoscale.clone(),
                c.meta_store(),
                actuator,
                c.scaler.clone(),
            )?);
        }
        Ok(c)
    }

    fn connector(&self) -> Connector {
        in_process_connector(&self.memory, &self.cfg)
    }

    /// Settings for a native client of this cluster: its routing node as the seed, and the cluster token.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            seeds: vec![self.rn_addr().to_string()],
            token: self.cfg.memory_node.cluster_token.clone().into(),
            ..ClientConfig::default()
        }
    }

    /// The metadata store.
    pub fn meta_store(&self) -> Arc<dyn MetaStore> {
        self.meta.clone()
    }

    /// Starts one more KV node; the M-node adds it to the ring. Returns its id once it serves.
    pub fn add_node(&mut self) -> Result<NodeId, ClusterError> {
        let id = self.scaler.next_id.fetch_add(1, Ordering::AcqRel);
        self.scaler.start_node_with_id(id)?;
        self.wait_until_serving(self.cfg.node_start_timeout)?;
        Ok(id)
    }

    /// Has the M-node remove `node` from the ring, then stops it once it has drained
    /// ([`LocalClusterConfig::retire_quiet`]).
    pub fn remove_node(&mut self, node: NodeId) -> Result<(), ClusterError> {
        // A removal that failed may still be carried through by the M-node: the supervisor then stops the node.
        crate::autoscale::remove_then_stop(
            &*self.scaler,
            node,
            || self.mnode().remove_node(node),
            || {
                self.scaler.retire(node);
                Ok(())
            },
        )
    }

    /// The ids of the KV nodes restarted because their lease expired while they ran, in restart order (an id
    /// appears once per restart).
    pub fn restarted_nodes(&self) -> Vec<NodeId> {
        self.scaler
            .restarted
            .lock()
            .expect("restarted lock")
            .clone()
    }

    /// Stops `node` as if its process died; the M-node notices when its lease expires.
    pub fn crash_node(&mut self, node: NodeId) -> Result<(), ClusterError> {
        self.scaler
            .take(node)
            .ok_or_else(|| ClusterError::Reconfig(format!("no node {node}")))?
            .crash();
        Ok(())
    }

    /// Waits until the record's ring holds exactly the running nodes, every one of them serves under it, and the
    /// routing node hands it out.
    pub fn wait_until_serving(&self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = dinomo_kn::deadline_after(timeout);
        loop {
            if let Some((r, _)) = ClusterRecord::load(&*self.meta)? {
                let ring: Vec<NodeId> = r.routing.ring.nodes().collect();
                let nodes = self.nodes();
                let mut running: Vec<NodeId> = nodes.iter().map(ClusterNode::id).collect();
                running.sort_unstable();
                let all_installed = nodes
                    .iter()
                    .all(|n| n.routing().epoch() == r.routing.epoch() && !n.is_fenced());
                drop(nodes);
                // A client seeded with the routing node must get this table, not the one before it: the routing
                // node catches up on its own schedule (step 7).
                let routed = self
                    .rn
                    .as_ref()
                    .is_none_or(|rn| rn.epoch() >= Some(r.routing.epoch()));
                if ring == running && all_installed && routed {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                // The M-node retries a failing step until it works; its cause is what the operator needs.
                let cause = match self.mnode.as_ref().and_then(|m| m.last_failure()) {
                    Some(why) => format!(": the M-node's last reconfiguration step failed: {why}"),
                    None => String::new(),
                };
                return Err(ClusterError::Reconfig(format!(
                    "the cluster did not converge within {timeout:?}{cause}"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The routing node's address (a client seed).
    pub fn rn_addr(&self) -> SocketAddr {
        self.rn.as_ref().expect("running").local_addr()
    }

    /// The KV nodes running (locked while the guard lives: the autoscaler may start and stop nodes).
    pub fn nodes(&self) -> MutexGuard<'_, Vec<ClusterNode>> {
        self.scaler.nodes()
    }

    /// The M-node.
    pub fn mnode(&self) -> &MNode {
        self.mnode.as_ref().expect("running")
    }

    /// The policy loop, when [`LocalClusterConfig::autoscale`] enabled it.
    pub fn autoscaler(&self) -> Option<&Autoscaler> {
        self.autoscaler.as_ref()
    }

    /// The memory node's processor.
    pub fn processor(&self) -> &Arc<Processor> {
        &self.processor
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// A connector to the memory node (in-process).
    pub fn memory_connector(&self) -> Connector {
        self.connector()
    }

    /// Metrics of the whole cluster: every KV node running now, the memory node, the cluster record's ring, the
    /// M-node and this process's fabric counters.
    pub fn metrics(&self) -> Vec<Arc<dyn crate::metrics::MetricsSource>> {
        use crate::metrics::{ClientMetrics, FabricMetrics, ProcessorMetrics, RecordMetrics};
        vec![
            Arc::new(LocalNodeMetrics(self.scaler.clone())),
            Arc::new(ProcessorMetrics(self.processor.clone())),
            Arc::new(ClientMetrics(self.memory.clone())),
            Arc::new(RecordMetrics(self.meta_store())),
            Arc::new(self.mnode().metrics()),
            Arc::new(FabricMetrics),
        ]
    }

    /// Stops everything cleanly.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // The policy loop first (it may be starting a node), then the M-node, so stopping nodes is not taken for
        // failures.
        self.scaler.stopping.stop();
        if let Some(s) = self.supervisor.take() {
            let _ = s.join();
        }
        self.autoscaler.take();
        self.mnode.take();
        self.rn.take();
        let nodes: Vec<ClusterNode> = self.scaler.nodes().drain(..).collect();
        for n in nodes {
            n.stop();
        }
        self.processor.shutdown();
        let _ = self.pool.sync_all();
    }
}

/// The metrics of the KV nodes of a local cluster, whichever run at the time of a scrape.
struct LocalNodeMetrics(Arc<LocalScaler>);

impl crate::metrics::MetricsSource for LocalNodeMetrics {
    fn collect(&self, out: &mut crate::metrics::Exposition) {
        // Read outside the lock, so a scrape never holds up starting or stopping a node.
        let nodes: Vec<_> = self.0.nodes().iter().map(ClusterNode::metrics).collect();
        for n in nodes {
            n.collect(out);
        }
    }
}

/// The RESP address of the `ordinal`-th node started; see [`LocalClusterConfig::resp_listen`].
pub fn resp_address(
    list: &[SocketAddr],
    ordinal: usize,
) -> Result<Option<SocketAddr>, ClusterError> {
    let Some(last) = list.last() else {
        return Ok(None);
    };
    if let Some(a) = list.get(ordinal) {
        return Ok(Some(*a));
    }
    if last.port() == 0 {
        return Ok(Some(*last));
    }
    let port = usize::from(last.port()) + ordinal + 1 - list.len();
    let port = u16::try_from(port).map_err(|_| {
        ClusterError::Io(format!(
            "no RESP port left after {last} for KV node {}",
            ordinal + 1
        ))
    })?;
    Ok(Some(SocketAddr::new(last.ip(), port)))
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts and stops the KV nodes of a [`LocalCluster`] (for the cluster itself and its autoscaler).
struct LocalScaler {
    nodes: Mutex<Vec<ClusterNode>>,
    next_id: AtomicU32,
    node: NodeConfig,
    connector: Connector,
    meta: Arc<EmbeddedMeta>,
    start_timeout: Duration,
    /// How a removed node drains: [`LocalClusterConfig::retire_quiet`] and [`LocalClusterConfig::retire_max`].
    retire: (Duration, Duration),
    /// Set when the cluster stops: a node being added stops waiting for its join.
    stopping: StopSignal,
    /// Where the KV nodes serve the Redis protocol ([`LocalClusterConfig::resp_listen`]).
    resp_listen: Vec<SocketAddr>,
    /// KV nodes started so far (picks each one's RESP address).
    started: std::sync::atomic::AtomicUsize,
    /// Every restart so far, by node id.
    restarted: Mutex<Vec<NodeId>>,
    /// Nodes whose removal a caller is driving, and which it stops itself once the removal succeeds.
    removing: Mutex<std::collections::HashSet<NodeId>>,
    /// The running nodes, as their Redis front doors reach each other ([`Peers`]).
    peers: Arc<Peers>,
}

impl LocalScaler {
    fn nodes(&self) -> MutexGuard<'_, Vec<ClusterNode>> {
        self.nodes.lock().expect("nodes lock")
    }

    fn start_node_with_id(&self, id: NodeId) -> Result<(), ClusterError> {
        let ordinal = self.started.fetch_add(1, Ordering::AcqRel);
        let cfg = NodeConfig {
            node_id: id,
            resp_listen: resp_address(&self.resp_listen, ordinal)?,
            ..self.node.clone()
        };
        let node = ClusterNode::start_among(
            cfg,
            self.connector.clone(),
            self.meta.clone(),
            Some(self.peers.clone()),
        )?;
        self.nodes().push(node);
        Ok(())
    }

    /// Restarts, with its id and its RESP address, every node that stopped serving because its lease expired while
    /// it ran (starved of CPU or cut off from the metadata store for longer than the lease), as a supervisor
    /// restarts a process: the new incarnation takes its logs back and the M-node gives it keys again. Without
    /// this, a loaded machine that starves every node at once would leave the cluster with no node serving.
    /// A start that fails (its port not free yet) stays in `to_restart` for the next call.
    fn restart_fenced(&self, to_restart: &mut Vec<NodeConfig>) {
        let fenced = {
            let mut nodes = self.nodes();
            if !nodes.iter().any(ClusterNode::is_fenced) {
                Vec::new() // The usual tick: nothing to take out, nothing allocated.
            } else {
                let (fenced, running): (Vec<ClusterNode>, _) = std::mem::take(&mut *nodes)
                    .into_iter()
                    .partition(ClusterNode::is_fenced);
                *nodes = running;
                fenced
            }
        };
        for old in fenced {
            warn!(
                node = old.id(),
                "KV node's lease expired while it ran (starved of CPU or cut off from the metadata store); \
                 restarting it with its id"
            );
            to_restart.push(old.restart_config());
            old.crash();
        }
        to_restart.retain(|cfg| {
            if self.stopping.is_stopped() {
                return false;
            }
            match ClusterNode::start_among(
                cfg.clone(),
                self.connector.clone(),
                self.meta.clone(),
                Some(self.peers.clone()),
            ) {
                Ok(node) => {
                    self.nodes().push(node);
                    self.restarted
                        .lock()
                        .expect("restarted lock")
                        .push(cfg.node_id);
                    false
                }
                Err(e) => {
                    warn!(node = cfg.node_id, error = %e, "restarting a KV node failed; retrying");
                    true
                }
            }
        });
    }

    /// Stops, after their drain, the nodes the M-node removed while whoever asked for the removal was told it
    /// failed (a step failed, and the M-node carried the removal through later): out of the ring for good, they
    /// would otherwise run idle until the cluster stops. Looks at the cluster record when it changed since
    /// `known` (its version).
    fn retire_removed(&self, known: &mut Option<u64>) {
        let record = match ClusterRecord::load_if_changed(&*self.meta, *known) {
            Ok(Some((record, version))) => {
                *known = Some(version);
                record
            }
            Ok(None) => return,
            Err(e) => {
                debug!(error = %e, "cannot read the cluster record");
                return;
            }
        };
        let removed: Vec<ClusterNode> = {
            let removing = self.removing.lock().expect("removing lock");
            let is_removed =
                |n: &ClusterNode| n.is_removed_by(&record) && !removing.contains(&n.id());
            let mut nodes = self.nodes();
            if !nodes.iter().any(is_removed) {
                // Looked at again when it changes, or once a removal in a caller's hands ends.
                if nodes.iter().any(|n| n.is_removed_by(&record)) {
                    *known = None;
                }
                return;
            }
            let (removed, running) = std::mem::take(&mut *nodes)
                .into_iter()
                .partition(is_removed);
            *nodes = running;
            removed
        };
        let (quiet, max) = self.retire;
        for n in removed {
            info!(
                node = n.id(),
                "KV node removed from the ring; stopping it once drained"
            );
            n.retire(quiet, max);
        }
    }

    /// Stops `node`, removed from the ring, after its drain; false when no such node runs.
    fn retire(&self, node: NodeId) -> bool {
        let Some(n) = self.take(node) else {
            return false;
        };
        let (quiet, max) = self.retire;
        n.retire(quiet, max);
        true
    }

    /// Takes `node` out of the running set (the caller stops it, outside the lock).
    fn take(&self, node: NodeId) -> Option<ClusterNode> {
        let mut nodes = self.nodes();
        let i = nodes.iter().position(|n| n.id() == node)?;
        Some(nodes.remove(i))
    }
}

impl Scaler for LocalScaler {
    /// Starts a node and waits until the M-node has it in the ring and it serves under the current table.
    fn add_node(&self) -> Result<NodeId, ClusterError> {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel);
        self.start_node_with_id(id)?;
        let deadline = dinomo_kn::deadline_after(self.start_timeout);
        loop {
            if let Some((r, _)) = ClusterRecord::load(&*self.meta)?
                && r.routing.ring.contains(id)
                && self
                    .nodes()
                    .iter()
                    .any(|n| n.id() == id && n.routing().epoch() >= r.routing.epoch())
            {
                return Ok(id);
            }
            if self.stopping.is_stopped() {
                return Err(ClusterError::Reconfig("the cluster is stopping".into()));
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Reconfig(format!(
                    "node {id} did not join within {:?}",
                    self.start_timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops a node the autoscaler had the M-node remove, once it has drained.
    fn stop_node(&self, node: NodeId) -> Result<(), ClusterError> {
        if !self.retire(node) {
            return Err(ClusterError::Reconfig(format!("no node {node} is running")));
        }
        Ok(())
    }

    fn set_removing(&self, node: NodeId, removing: bool) {
        let mut set = self.removing.lock().expect("removing lock");
        if removing {
            set.insert(node);
        } else {
            set.remove(&node);
        }
    }
}
