//! A whole cluster in one process: a memory node (pool file, processor, metadata service), KV nodes, a routing
//! node and the M-node. What `dinomo up` runs, and what the tests and benchmarks drive.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{
    Connector, MemoryNode, NodeConfig as FabricNodeConfig, RpcError, RpcHandler, Target,
};
use dinomo_meta::{EmbeddedMeta, META_METHODS, MetaConfig, MetaService, MetaStore};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_ring::NodeId;

use crate::{
    ClusterError, ClusterNode, ClusterRecord, MNode, MNodeConfig, NodeConfig, RoutingNode,
    ServerLimits,
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
    fn handle(&self, method: u16, request: &[u8], response: &mut Vec<u8>) -> Result<(), RpcError> {
        if META_METHODS.contains(&method) {
            self.meta.handle(method, request, response)
        } else {
            self.data.handle(method, request, response)
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
    /// Injected fabric latency per round trip (ns), to emulate a µs-scale network. Default 0.
    pub injected_latency_ns: u64,
    /// Where the KV nodes serve the Redis protocol, in the order they start: the i-th node started listens on
    /// `resp_listen[i]`, later ones on the ports after the last address (all on any free port when its port is
    /// 0). Empty (the default): no RESP. Other RESP settings come from `node.resp`.
    pub resp_listen: Vec<SocketAddr>,
}

impl Default for LocalClusterConfig {
    fn default() -> Self {
        LocalClusterConfig {
            pool_path: None,
            pool_size: 1 << 30,
            persist: PersistMode::default(),
            processor: ProcessorConfig::default(),
            kns: 2,
            node: NodeConfig::default(),
            mnode: MNodeConfig::default(),
            rn_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            injected_latency_ns: 0,
            resp_listen: Vec::new(),
        }
    }
}

/// A running in-process cluster.
pub struct LocalCluster {
    cfg: LocalClusterConfig,
    pool: Arc<Pool>,
    memory: Arc<MemoryNode>,
    processor: Arc<Processor>,
    meta: Arc<EmbeddedMeta>,
    nodes: Vec<ClusterNode>,
    rn: Option<RoutingNode>,
    mnode: Option<MNode>,
    next_id: NodeId,
    /// KV nodes started so far (picks each one's RESP address).
    started: usize,
}

impl LocalCluster {
    /// Opens (or creates) the pool, starts the memory node, the M-node, the routing node and `kns` KV nodes, and
    /// waits until all of them serve.
    pub fn start(cfg: LocalClusterConfig) -> Result<LocalCluster, ClusterError> {
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
        let processor = Processor::start(pool.clone(), &cfg.processor)
            .map_err(|e| ClusterError::Io(format!("memory node: {e}")))?;
        let meta = EmbeddedMeta::open(pool.clone(), MetaConfig::default())?;
        let memory = MemoryNode::new(pool.clone(), FabricNodeConfig::default());
        memory.set_rpc_handler(Arc::new(MemoryNodeRpc::new(
            processor.rpc_handler(),
            meta.clone(),
        )));
        let mut c = LocalCluster {
            pool,
            memory,
            processor,
            meta,
            nodes: Vec::new(),
            rn: None,
            mnode: None,
            next_id: 1,
            started: 0,
            cfg,
        };
        c.mnode = Some(MNode::start(
            c.cfg.mnode.clone(),
            c.meta_store(),
            c.connector(),
        )?);
        c.rn = Some(RoutingNode::start(
            c.cfg.rn_listen,
            c.meta_store(),
            Duration::from_millis(2),
            ServerLimits::default(),
        )?);
        // Nodes of an earlier run come back with their ids (and so their logs).
        let known: Vec<NodeId> = ClusterRecord::load(&*c.meta)?
            .map(|(r, _)| r.routing.ring.nodes().collect())
            .unwrap_or_default();
        c.next_id = known.iter().max().map_or(1, |m| m + 1);
        for i in 0..c.cfg.kns {
            let id = known.get(i).copied().unwrap_or_else(|| {
                let id = c.next_id;
                c.next_id += 1;
                id
            });
            c.start_node_with_id(id)?;
        }
        c.wait_until_serving(Duration::from_secs(30))?;
        Ok(c)
    }

    fn connector(&self) -> Connector {
        let mut c = Connector::new(Target::InProcess(self.memory.clone()));
        c.config.injected_latency_ns = self.cfg.injected_latency_ns;
        c
    }

    /// The metadata store.
    pub fn meta_store(&self) -> Arc<dyn MetaStore> {
        self.meta.clone()
    }

    fn start_node_with_id(&mut self, id: NodeId) -> Result<NodeId, ClusterError> {
        let cfg = NodeConfig {
            node_id: id,
            resp_listen: resp_address(&self.cfg.resp_listen, self.started)?,
            ..self.cfg.node.clone()
        };
        let node = ClusterNode::start(cfg, self.connector(), self.meta_store())?;
        self.started += 1;
        self.nodes.push(node);
        Ok(id)
    }

    /// Starts one more KV node; the M-node adds it to the ring. Returns its id once it serves.
    pub fn add_node(&mut self) -> Result<NodeId, ClusterError> {
        let id = self.next_id;
        self.next_id += 1;
        self.start_node_with_id(id)?;
        self.wait_until_serving(Duration::from_secs(30))?;
        Ok(id)
    }

    /// Has the M-node remove `node` from the ring, then stops it.
    pub fn remove_node(&mut self, node: NodeId) -> Result<(), ClusterError> {
        self.mnode().remove_node(node)?;
        if let Some(i) = self.nodes.iter().position(|n| n.id() == node) {
            self.nodes.remove(i).stop();
        }
        Ok(())
    }

    /// Stops `node` as if its process died; the M-node notices when its lease expires.
    pub fn crash_node(&mut self, node: NodeId) -> Result<(), ClusterError> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.id() == node)
            .ok_or_else(|| ClusterError::Reconfig(format!("no node {node}")))?;
        self.nodes.remove(i).crash();
        Ok(())
    }

    /// Waits until the record's ring holds exactly the running nodes and every one of them serves under it.
    pub fn wait_until_serving(&self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((r, _)) = ClusterRecord::load(&*self.meta)? {
                let ring: Vec<NodeId> = r.routing.ring.nodes().collect();
                let mut running: Vec<NodeId> = self.nodes.iter().map(ClusterNode::id).collect();
                running.sort_unstable();
                let all_installed = self
                    .nodes
                    .iter()
                    .all(|n| n.routing().epoch() == r.routing.epoch());
                if ring == running && all_installed {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Reconfig(format!(
                    "the cluster did not converge within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The routing node's address (a client seed).
    pub fn rn_addr(&self) -> SocketAddr {
        self.rn.as_ref().expect("running").local_addr()
    }

    /// The KV nodes running.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The M-node.
    pub fn mnode(&self) -> &MNode {
        self.mnode.as_ref().expect("running")
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

    /// Stops everything cleanly.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // The M-node first, so stopping nodes is not taken for failures.
        self.mnode.take();
        self.rn.take();
        for n in self.nodes.drain(..) {
            n.stop();
        }
        self.processor.shutdown();
        let _ = self.pool.sync_all();
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
