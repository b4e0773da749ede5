//! `dinomo up --system directds|directds-c|centralds|clover`: a pDPM baseline in one process, serving the Redis protocol
//! as DINOMO's KV nodes do, so the systems can be run and compared with the same Redis clients.
//!
//! The memory nodes are fabric [`MemoryNode`]s over pool files in the data directory (`SYSTEM-I.pool`, formatted
//! for the baseline on first start and reopened after), reached in process. CentralDS's coordinator and Clover's
//! metadata server run on a memory node of their own and rebuild their metadata from the memory nodes at every
//! start (the coordinator from the blocks' stamps, the metadata server from the chains reachable from the key
//! cells: see `dinomo_pdpm::clover`). Each Redis
//! connection is one compute-node thread: it gets its own pDPM client ([`PdpmBackend`]), connected on its first
//! command.
//!
//! This lives in the `dinomo` command rather than in `dinomo-pdpm` or `dinomo-resp` so that neither library
//! depends on the other: the baselines stay protocol-free, and the Redis front door store-agnostic.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use dinomo_fabric::{Connector, EndpointConfig, MemoryNode, NodeConfig, Target};
use dinomo_pdpm::central::{CentralLayout, CentralSettings, Coordinator, CoordinatorConfig};
use dinomo_pdpm::clover::{CloverLayout, CloverSettings, MetadataConfig, MetadataServer};
use dinomo_pdpm::direct::{DirectClient, DirectLayout, DirectSettings, Flavor};
use dinomo_pdpm::{Change, ClientSettings, FailureKind, Layout, PdpmError, PdpmStore};
use dinomo_pool::{PersistMode, Pool, PoolOptions};
use dinomo_resp::{Backend, BackendConn, BackendError, Effect, Op, OpResult, Output, outcome};
use serde::{Deserialize, Serialize};

/// A pDPM baseline `dinomo up` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Baseline {
    /// DirectDS: one-sided access under per-key locks; reads lock too.
    DirectDs,
    /// DirectDS-C: DirectDS with CRC-checked, lock-free reads.
    DirectDsC,
    /// CentralDS: a coordinator holds the metadata and serializes writes.
    CentralDs,
    /// Clover (SepDS): one-sided reads and writes along per-key version chains; a metadata server for space.
    Clover,
}

impl Baseline {
    /// Every baseline.
    pub const ALL: [Baseline; 4] = [
        Baseline::DirectDs,
        Baseline::DirectDsC,
        Baseline::CentralDs,
        Baseline::Clover,
    ];

    /// Its name on the command line and in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::DirectDs => "directds",
            Baseline::DirectDsC => "directds-c",
            Baseline::CentralDs => "centralds",
            Baseline::Clover => "clover",
        }
    }
}

impl std::fmt::Display for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `up.pdpm`: how `dinomo up` runs a pDPM baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PdpmUpConfig {
    /// Memory nodes (each a pool file in the data directory). Default 1.
    pub memory_nodes: usize,
    /// Copies of every value, on distinct memory nodes (at most `memory_nodes`). Default 1.
    pub replication: u32,
    /// Keys the memory nodes are sized for when they are formatted. Default 16384.
    pub keys: u64,
    /// Longest key in bytes (at most 65535). Default 64.
    pub max_key: u32,
    /// Longest value in bytes. Default 1024.
    pub max_value: u32,
    /// CentralDS and Clover: blocks (slots) per memory node kept for the grants of this many connected clients.
    /// Default 64.
    pub grant_clients: u64,
    /// CentralDS's coordinator and Clover's metadata server: RPC threads. Default 4.
    pub coordinator_threads: usize,
    /// CentralDS: shards of the coordinator's key map. Default 64.
    pub coordinator_shards: usize,
    /// CentralDS: most locations one grant hands out. Default 1024.
    pub max_grant: u32,
    /// DirectDS and DirectDS-C clients.
    pub direct: DirectSettings,
    /// CentralDS clients.
    pub central: CentralSettings,
    /// Clover's metadata server.
    pub metadata: MetadataConfig,
    /// Clover clients.
    pub clover: CloverSettings,
}

impl Default for PdpmUpConfig {
    fn default() -> Self {
        let coordinator = CoordinatorConfig::default();
        PdpmUpConfig {
            memory_nodes: 1,
            replication: 1,
            keys: 16384,
            max_key: 64,
            max_value: 1024,
            grant_clients: 64,
            coordinator_threads: 4,
            coordinator_shards: coordinator.shards,
            max_grant: coordinator.max_grant,
            direct: DirectSettings::default(),
            central: CentralSettings::default(),
            metadata: MetadataConfig::default(),
            clover: CloverSettings::default(),
        }
    }
}

impl PdpmUpConfig {
    /// What is wrong with these settings, each naming its key (under `up.pdpm`).
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.memory_nodes == 0 || self.memory_nodes > u16::MAX as usize {
            errors.push("up.pdpm.memory_nodes: must be 1 to 65535".into());
        }
        if self.replication == 0 || self.replication as usize > self.memory_nodes {
            errors.push(format!(
                "up.pdpm.replication: must be 1 to up.pdpm.memory_nodes ({})",
                self.memory_nodes
            ));
        }
        if self.keys == 0 {
            errors.push("up.pdpm.keys: must be at least 1".into());
        }
        // Clover's cells store a key's length + 1 in 16 bits.
        if self.max_key == 0 || self.max_key >= u16::MAX as u32 {
            errors.push("up.pdpm.max_key: must be 1 to 65534".into());
        }
        if self.coordinator_threads == 0 {
            errors.push("up.pdpm.coordinator_threads: must be at least 1".into());
        }
        if self.coordinator_shards == 0 {
            errors.push("up.pdpm.coordinator_shards: must be at least 1".into());
        }
        if self.max_grant == 0 {
            errors.push("up.pdpm.max_grant: must be at least 1".into());
        }
        if self.central.grant_batch == 0 {
            errors.push("up.pdpm.central.grant_batch: must be at least 1".into());
        }
        if self.direct.max_probe == 0 {
            errors.push("up.pdpm.direct.max_probe: must be at least 1".into());
        }
        let (clover, ms) = (&self.clover, &self.metadata);
        if clover.grant_batch == 0 || clover.refill_at > clover.grant_batch {
            errors.push(
                "up.pdpm.clover.grant_batch: must be at least 1 and at least up.pdpm.clover.refill_at".into(),
            );
        }
        if clover.cursor_capacity == 0 || clover.max_hops == 0 {
            errors.push("up.pdpm.clover.cursor_capacity and max_hops: must be at least 1".into());
        }
        if clover.read_timeout.saturating_mul(2) > ms.reclaim_lease {
            errors.push(format!(
                "up.pdpm.clover.read_timeout: must be at most half up.pdpm.metadata.reclaim_lease ({:?})",
                ms.reclaim_lease
            ));
        }
        if clover.cursor_idle >= ms.wrap_park {
            errors.push(format!(
                "up.pdpm.clover.cursor_idle: must be below up.pdpm.metadata.wrap_park ({:?})",
                ms.wrap_park
            ));
        }
        if ms.max_probe == 0 || ms.max_grant == 0 || ms.max_walk == 0 {
            errors.push(
                "up.pdpm.metadata.max_probe, max_grant and max_walk: must be at least 1".into(),
            );
        }
        errors
    }

    /// What `system`'s memory nodes are formatted with.
    fn geometry(&self, system: Baseline) -> Layout {
        match system {
            Baseline::DirectDs => Layout::Direct(self.direct_layout(Flavor::Markers)),
            Baseline::DirectDsC => Layout::Direct(self.direct_layout(Flavor::Crc)),
            Baseline::CentralDs => Layout::Central(self.central_layout()),
            Baseline::Clover => Layout::Clover(self.clover_layout()),
        }
    }

    fn direct_layout(&self, flavor: Flavor) -> DirectLayout {
        // A key's slot is on its primary: about keys/M per node, at a load factor of 1/2 for linear probing.
        let slots = self
            .keys
            .saturating_mul(2)
            .div_ceil(self.memory_nodes as u64)
            .max(64);
        DirectLayout {
            flavor,
            slots,
            max_key: self.max_key,
            max_value: self.max_value,
            replication: self.replication,
        }
    }

    fn clover_layout(&self) -> CloverLayout {
        // A key's cell is on its home node: about keys/M per node, at a load factor of 1/2 for linear probing.
        // Every key holds R live copies; superseded versions wait out the reclaim lease, and the clients' grants
        // come on top: twice the live copies and the grants, spread over the nodes.
        let m = self.memory_nodes as u64;
        let r = self.replication as u64;
        let grants = self
            .grant_clients
            .saturating_mul(self.clover.grant_batch as u64);
        CloverLayout {
            cells: self.keys.saturating_mul(2).div_ceil(m).max(64),
            slots: self
                .keys
                .saturating_add(grants)
                .saturating_mul(2 * r)
                .div_ceil(m)
                .max(1024),
            max_key: self.max_key,
            max_value: self.max_value,
            replication: self.replication,
        }
    }

    fn central_layout(&self) -> CentralLayout {
        // Every key holds R blocks, spread over the nodes; a quarter more covers the imbalance, and the grants of
        // `grant_clients` connected clients come on top.
        let r = self.replication as u64;
        let m = self.memory_nodes as u64;
        let keys = self.keys.saturating_mul(r).div_ceil(m);
        let grants = self
            .grant_clients
            .saturating_mul(self.central.grant_batch as u64)
            .saturating_mul(r)
            .div_ceil(m);
        CentralLayout {
            blocks: keys
                .saturating_add(keys / 4)
                .saturating_add(grants)
                .saturating_add(64),
            max_key: self.max_key,
            max_value: self.max_value,
        }
    }
}

/// A running baseline: its memory nodes, CentralDS's coordinator or Clover's metadata server, and the Redis
/// listener.
pub struct RunningBaseline {
    resp: dinomo_resp::RespServer,
    /// CentralDS and Clover: the coordinator's (metadata server's) node (it holds it as its RPC handler).
    _coordinator: Option<Arc<MemoryNode>>,
    _memory_nodes: Vec<Arc<MemoryNode>>,
    pools: Vec<Arc<Pool>>,
}

impl std::fmt::Debug for RunningBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningBaseline")
            .field("resp", &self.resp.local_addr())
            .field("memory_nodes", &self.pools.len())
            .finish()
    }
}

/// What [`start`] opened, for the banner.
#[derive(Debug)]
pub struct MemoryNodeReport {
    /// The pool file.
    pub path: PathBuf,
    /// Whether it was formatted now (else reopened).
    pub formatted: bool,
}

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The baseline.
    pub system: Baseline,
    /// Its settings.
    pub pdpm: PdpmUpConfig,
    /// Where the pool files live.
    pub data_dir: PathBuf,
    /// Their durability.
    pub persist: PersistMode,
    /// The fabric endpoints' settings (injected latency, timeouts).
    pub endpoint: EndpointConfig,
    /// The memory nodes' fabric settings.
    pub node: NodeConfig,
    /// The Redis listener (address, password, limits).
    pub resp: dinomo_resp::ServerConfig,
}

/// The pool file of memory node `i`.
pub fn pool_path(data_dir: &Path, system: Baseline, i: usize) -> PathBuf {
    data_dir.join(format!("{system}-{i}.pool"))
}

impl RunningBaseline {
    /// Where the Redis protocol is served.
    pub fn resp_addr(&self) -> std::net::SocketAddr {
        self.resp.local_addr()
    }

    /// Stops serving and closes the pools cleanly.
    pub fn stop(self) -> anyhow::Result<()> {
        let RunningBaseline {
            resp,
            _coordinator,
            _memory_nodes,
            pools,
        } = self;
        // The listener and every connection (and so every client) first, then the nodes they reach.
        drop(resp);
        drop(_coordinator);
        drop(_memory_nodes);
        for pool in pools {
            pool.close().context("closing a memory node's pool")?;
        }
        Ok(())
    }
}

/// Opens (formatting on first start) the memory nodes, starts CentralDS's coordinator or Clover's metadata server,
/// and the Redis listener.
pub fn start(opts: StartOptions) -> anyhow::Result<(RunningBaseline, Vec<MemoryNodeReport>)> {
    let cfg = &opts.pdpm;
    let errors = cfg.validate();
    anyhow::ensure!(errors.is_empty(), "{}", errors.join("; "));
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("creating {}", opts.data_dir.display()))?;
    let beyond = pool_path(&opts.data_dir, opts.system, cfg.memory_nodes);
    anyhow::ensure!(
        !beyond.exists(),
        "{} exists: the data directory holds more memory nodes than up.pdpm.memory_nodes = {} (a baseline's \
         placement depends on the count; start it with the count it was formatted with)",
        beyond.display(),
        cfg.memory_nodes
    );
    let geometry = cfg.geometry(opts.system);
    let area = geometry.area_len();
    const SEGMENT: u64 = 1 << 20;
    // The area, the pool's own header and allocation table, and a segment of rounding.
    let pool_size = area
        .checked_add(4 * SEGMENT)
        .map(|n| n.next_multiple_of(SEGMENT))
        .context("the memory nodes' size does not fit 64 bits")?;
    let mut pools = Vec::with_capacity(cfg.memory_nodes);
    let mut nodes = Vec::with_capacity(cfg.memory_nodes);
    let mut reports = Vec::with_capacity(cfg.memory_nodes);
    for i in 0..cfg.memory_nodes {
        let path = pool_path(&opts.data_dir, opts.system, i);
        let options = PoolOptions {
            size: pool_size,
            segment_size: SEGMENT,
            persist: opts.persist,
        };
        let (pool, _) = Pool::open_or_create(&path, &options)
            .with_context(|| format!("opening {}", path.display()))?;
        let formatted = pool.root(geometry.root())? == 0;
        if formatted {
            geometry
                .format(&pool)
                .with_context(|| format!("formatting {} for {}", path.display(), opts.system))?;
        }
        let pool = Arc::new(pool);
        nodes.push(MemoryNode::new(pool.clone(), opts.node.clone()));
        pools.push(pool);
        reports.push(MemoryNodeReport { path, formatted });
    }
    // Every node of this process is reached in process, with the endpoints' settings.
    let in_process = |node: &Arc<MemoryNode>| {
        Connector::with_config(Target::InProcess(node.clone()), opts.endpoint.clone())
    };
    let connectors: Vec<Connector> = nodes.iter().map(in_process).collect();
    let mismatch = |stored: &dyn std::fmt::Debug, wanted: &dyn std::fmt::Debug| {
        anyhow::anyhow!(
            "the memory nodes in {} were formatted as {stored:?}, the settings ask for {wanted:?} (a memory node \
             keeps the geometry it was formatted with: start with the same up.pdpm settings, or another data \
             directory)",
            opts.data_dir.display()
        )
    };
    // CentralDS's coordinator and Clover's metadata server hold no data: their metadata is rebuilt at every start,
    // so their own node needs no persistent pool.
    let server_node = || -> anyhow::Result<Arc<MemoryNode>> {
        Ok(MemoryNode::new(
            Arc::new(Pool::anonymous(4 * SEGMENT, SEGMENT)?),
            NodeConfig {
                rpc_threads: cfg.coordinator_threads,
                ..opts.node.clone()
            },
        ))
    };
    let (clients, coordinator) = match geometry {
        Layout::Direct(wanted) => {
            // Connecting checks that every node has a table and that they agree.
            let probe = DirectClient::connect(&connectors, cfg.direct.clone())
                .context("opening the memory nodes")?;
            if *probe.layout() != wanted {
                return Err(mismatch(probe.layout(), &wanted));
            }
            (ClientSettings::Direct(cfg.direct.clone()), None)
        }
        Layout::Central(central) => {
            let coordinator = Coordinator::new(
                &connectors,
                CoordinatorConfig {
                    replication: cfg.replication,
                    shards: cfg.coordinator_shards,
                    max_grant: cfg.max_grant,
                },
            )
            .context("starting the CentralDS coordinator")?;
            if *coordinator.layout() != central {
                return Err(mismatch(coordinator.layout(), &central));
            }
            let host = server_node()?;
            coordinator.serve(&host);
            let clients = ClientSettings::Central {
                coordinator: in_process(&host),
                settings: cfg.central.clone(),
            };
            (clients, Some(host))
        }
        Layout::Clover(wanted) => {
            let ms = MetadataServer::new(&connectors, cfg.metadata.clone())
                .context("starting Clover's metadata server")?;
            if *ms.layout() != wanted {
                return Err(mismatch(ms.layout(), &wanted));
            }
            let recovered = ms.recovered();
            tracing::info!(
                keys = recovered.keys,
                live_slots = recovered.live,
                broken_chains = recovered.broken_chains,
                "Clover metadata server started"
            );
            let host = server_node()?;
            ms.serve(&host);
            let clients = ClientSettings::Clover {
                metadata_server: in_process(&host),
                settings: cfg.clover.clone(),
            };
            (clients, Some(host))
        }
    };
    let resp = dinomo_resp::RespServer::start(
        dinomo_resp::ServerConfig {
            name: format!("dinomo-{}-resp", opts.system),
            ..opts.resp.clone()
        },
        PdpmBackend {
            connect: connect_each(clients, connectors),
        },
    )
    .with_context(|| format!("serving the Redis protocol on {}", opts.resp.listen))?;
    Ok((
        RunningBaseline {
            resp,
            _coordinator: coordinator,
            _memory_nodes: nodes,
            pools,
        },
        reports,
    ))
}

/// Makes one compute-node thread's client.
type Connect = Arc<dyn Fn() -> Result<Box<dyn PdpmStore + Send>, PdpmError> + Send + Sync>;

/// Connects a new client of `clients` to `memory_nodes` at each call.
fn connect_each(clients: ClientSettings, memory_nodes: Vec<Connector>) -> Connect {
    Arc::new(move || clients.connect(&memory_nodes))
}

/// The Redis front door's backend over a pDPM baseline: every connection gets its own client.
pub struct PdpmBackend {
    connect: Connect,
}

impl Backend for PdpmBackend {
    type Conn = PdpmConn;

    fn connect(&self, _wake: dinomo_resp::Wake) -> PdpmConn {
        PdpmConn {
            connect: self.connect.clone(),
            client: None,
        }
    }
}

/// One Redis connection's pDPM client, connected on first use (and again after a failed connect).
pub struct PdpmConn {
    connect: Connect,
    client: Option<Box<dyn PdpmStore + Send>>,
}

impl PdpmConn {
    fn client(&mut self) -> Result<&mut (dyn PdpmStore + Send), BackendError> {
        let client = match self.client.take() {
            Some(c) => c,
            None => (self.connect)().map_err(|e| {
                BackendError::Unavailable(format!("connecting to the memory nodes: {e}"))
            })?,
        };
        Ok(self.client.insert(client).as_mut())
    }

    fn run_op(&mut self, op: Op) -> OpResult {
        let write = op.is_write();
        let c = self.client()?;
        let failed = |e: PdpmError| store_error(e, write);
        let max = c.max_value_len();
        match &op {
            // A blind write: the store's put, without reading the value first.
            Op::Set(k, v) => c.put(k, v).map(|()| Output::Applied(true)).map_err(failed),
            // A read: the committed value, as a GET reads it.
            _ if !write => {
                let current = c.get(op.key()).map_err(failed)?;
                Ok(outcome(&op, current.as_deref(), max)?.0)
            }
            // Every other write is the store's atomic read-modify-write. The store may run the closure more than
            // once (see `PdpmStore::update`): the answer of its last run is the one applied.
            _ => {
                let mut answer = Err(BackendError::Unavailable("the store ran no update".into()));
                c.update(op.key(), &mut |old| match outcome(&op, old, max) {
                    Ok((output, effect)) => {
                        answer = Ok(output);
                        match effect {
                            Effect::Keep => Change::Keep,
                            Effect::Put(v) => Change::Put(v),
                            Effect::Delete => Change::Delete,
                        }
                    }
                    Err(e) => {
                        answer = Err(e);
                        Change::Keep
                    }
                })
                .map_err(failed)?;
                answer
            }
        }
    }
}

impl BackendConn for PdpmConn {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        results.clear();
        // One compute-node thread: the ops run one after another, in order.
        for op in ops.drain(..) {
            let r = self.run_op(op);
            results.push(r);
        }
    }

    /// Every thread of this process: the connections' clients (the compute nodes), and CentralDS's coordinator or
    /// Clover's metadata server.
    fn fabric_counts(&mut self) -> Option<dinomo_resp::FabricCounts> {
        Some(dinomo_cluster::process_fabric_counts())
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        self.client()?
            .key_count()
            .map_err(|e| store_error(e, false))
    }

    fn scan(&mut self, cursor: u64, count: u32) -> Result<dinomo_resp::KeysPage, BackendError> {
        let (cursor, keys) = self
            .client()?
            .scan_keys(cursor, count)
            .map_err(|e| store_error(e, false))?;
        Ok(dinomo_resp::KeysPage { cursor, keys })
    }
}

/// A store's error as a Redis error: a request beyond the store's limits is invalid; a write whose fabric failed
/// midway has an unknown outcome; a full table or no free blocks is `-OOM`; everything else (a lock wait, a
/// coordinator's refusal) left nothing applied.
fn store_error(e: PdpmError, write: bool) -> BackendError {
    match e.kind(write) {
        FailureKind::Invalid => BackendError::Invalid(e.to_string()),
        FailureKind::Indeterminate => BackendError::Indeterminate(e.to_string()),
        FailureKind::NotApplied => BackendError::Unavailable(e.to_string()),
        FailureKind::OutOfSpace => BackendError::OutOfSpace(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend over one in-process memory node of `system`, and the node.
    fn backend(system: Baseline) -> (PdpmBackend, Vec<Arc<MemoryNode>>) {
        let cfg = PdpmUpConfig {
            keys: 64,
            max_key: 16,
            max_value: 32,
            ..PdpmUpConfig::default()
        };
        let pool = Arc::new(Pool::anonymous(8 << 20, 1 << 20).unwrap());
        let node = MemoryNode::new(pool.clone(), NodeConfig::default());
        let connectors = vec![Connector::new(Target::InProcess(node.clone()))];
        let mut keep = vec![node];
        let mut server_node = || {
            let host = MemoryNode::new(
                Arc::new(Pool::anonymous(4 << 20, 1 << 20).unwrap()),
                NodeConfig::default(),
            );
            keep.push(host.clone());
            host
        };
        cfg.geometry(system).format(&pool).unwrap();
        let clients = match system {
            Baseline::DirectDs | Baseline::DirectDsC => {
                ClientSettings::Direct(DirectSettings::default())
            }
            Baseline::CentralDs => {
                let coordinator =
                    Coordinator::new(&connectors, CoordinatorConfig::default()).unwrap();
                let host = server_node();
                coordinator.serve(&host);
                ClientSettings::Central {
                    coordinator: Connector::new(Target::InProcess(host)),
                    settings: CentralSettings::default(),
                }
            }
            Baseline::Clover => {
                let ms = MetadataServer::new(&connectors, MetadataConfig::default()).unwrap();
                let host = server_node();
                ms.serve(&host);
                ClientSettings::Clover {
                    metadata_server: Connector::new(Target::InProcess(host)),
                    settings: CloverSettings::default(),
                }
            }
        };
        let connect = connect_each(clients, connectors);
        (PdpmBackend { connect }, keep)
    }

    #[test]
    fn every_op_behaves_as_redis_does() {
        for system in Baseline::ALL {
            let (b, _nodes) = backend(system);
            let mut c = b.connect(dinomo_resp::Wake::none());
            assert_eq!(c.get(b"k"), Ok(None), "{system}");
            assert_eq!(c.insert(b"k", b"1"), Ok(true));
            assert_eq!(c.insert(b"k", b"2"), Ok(false));
            assert_eq!(c.update(b"k", b"10"), Ok(true));
            assert_eq!(c.update(b"absent", b"x"), Ok(false));
            assert_eq!(c.exists(b"absent"), Ok(false));
            assert_eq!(c.incr(b"k", 5), Ok(15));
            assert_eq!(c.incr(b"new", -2), Ok(-2));
            assert_eq!(c.get_set(b"k", b"word"), Ok(Some(b"15".to_vec())));
            assert_eq!(c.incr(b"k", 1), Err(BackendError::NotAnInteger));
            c.set(b"max", i64::MAX.to_string().as_bytes()).unwrap();
            assert_eq!(c.incr(b"max", 1), Err(BackendError::Overflow));
            assert_eq!(c.append(b"k", b"s"), Ok(5));
            assert_eq!(c.strlen(b"k"), Ok(5));
            assert_eq!(c.get(b"k"), Ok(Some(b"words".to_vec())));
            assert_eq!(c.dbsize(), Ok(3));
            assert_eq!(c.delete(b"k"), Ok(true));
            assert_eq!(c.delete(b"k"), Ok(false));
            assert_eq!(c.dbsize(), Ok(2));
            // Limits are the store's, with its own message.
            assert!(matches!(
                c.set(b"v", &[0; 33]),
                Err(BackendError::Invalid(m)) if m.contains("limit of 32 bytes")
            ));
            assert!(matches!(
                c.append(b"new", &[b'x'; 40]),
                Err(BackendError::Invalid(_))
            ));
            assert!(matches!(c.get(&[b'k'; 17]), Err(BackendError::Invalid(_))));
            // Another connection sees the same data.
            let mut other = b.connect(dinomo_resp::Wake::none());
            assert_eq!(other.get(b"new"), Ok(Some(b"-2".to_vec())));
        }
    }

    #[test]
    fn the_string_commands_of_redis_6_and_7_behave_as_redis_does() {
        for system in Baseline::ALL {
            let (b, _nodes) = backend(system);
            let mut c = b.connect(dinomo_resp::Wake::none());
            let value = |o: OpResult| match o {
                Ok(Output::Value(v)) => v,
                other => panic!("{system}: {other:?}"),
            };
            c.set(b"s", b"This is a string").unwrap();
            let range = c.run(Op::GetRange(b"s".to_vec(), -3, -1));
            assert_eq!(value(range), Some(b"ing".to_vec()), "{system}");
            let absent = c.run(Op::GetRange(b"none".to_vec(), 0, -1));
            assert_eq!(value(absent), Some(Vec::new()));
            assert_eq!(
                c.run(Op::SetRange(b"s".to_vec(), 10, b"STRING".to_vec())),
                Ok(Output::Int(16))
            );
            assert_eq!(c.get(b"s"), Ok(Some(b"This is a STRING".to_vec())));
            assert_eq!(
                c.run(Op::SetRange(b"pad".to_vec(), 2, b"x".to_vec())),
                Ok(Output::Int(3))
            );
            assert_eq!(c.get(b"pad"), Ok(Some(b"\0\0x".to_vec())));
            // The store's own limit (32 bytes here) is applied before the value is built.
            assert!(matches!(
                c.run(Op::SetRange(
                    b"pad".to_vec(),
                    u64::from(u32::MAX),
                    b"x".to_vec()
                )),
                Err(BackendError::Invalid(_))
            ));
            assert_eq!(
                value(c.run(Op::Take(b"pad".to_vec()))),
                Some(b"\0\0x".to_vec())
            );
            assert_eq!(value(c.run(Op::Take(b"pad".to_vec()))), None);
            assert_eq!(c.exists(b"pad"), Ok(false));
            let sum = c.run(Op::IncrFloat(b"f".to_vec(), b"10.5".to_vec()));
            assert_eq!(value(sum), Some(b"10.5".to_vec()));
            let sum = c.run(Op::IncrFloat(b"f".to_vec(), b"0.1".to_vec()));
            assert_eq!(value(sum), Some(b"10.6".to_vec()));
            assert!(matches!(
                c.run(Op::IncrFloat(b"s".to_vec(), b"1".to_vec())),
                Err(BackendError::Invalid(m)) if m == "value is not a valid float"
            ));
            let nx = c.run(Op::InsertGet(b"f".to_vec(), b"x".to_vec()));
            assert_eq!(value(nx), Some(b"10.6".to_vec()));
            let nx = c.run(Op::InsertGet(b"g".to_vec(), b"x".to_vec()));
            assert_eq!(value(nx), None);
            let xx = c.run(Op::UpdateGet(b"g".to_vec(), b"y".to_vec()));
            assert_eq!(value(xx), Some(b"x".to_vec()));
            let xx = c.run(Op::UpdateGet(b"h".to_vec(), b"y".to_vec()));
            assert_eq!(value(xx), None);
            assert_eq!(c.get(b"g"), Ok(Some(b"y".to_vec())));
            assert_eq!(c.exists(b"h"), Ok(false));
            assert_eq!(
                c.run(Op::SetBit(b"b".to_vec(), 9, true)),
                Ok(Output::Int(0))
            );
            assert_eq!(
                c.run(Op::SetBit(b"b".to_vec(), 9, true)),
                Ok(Output::Int(1))
            );
            assert_eq!(c.get(b"b"), Ok(Some(vec![0, 0x40])));
            assert_eq!(c.run(Op::GetBit(b"b".to_vec(), 9)), Ok(Output::Int(1)));
            assert_eq!(c.run(Op::BitCount(b"b".to_vec(), None)), Ok(Output::Int(1)));
            let pos = c.run(Op::BitPos(b"b".to_vec(), true, Some((1, None, false))));
            assert_eq!(pos, Ok(Output::Int(9)));
            assert!(matches!(
                c.run(Op::SetBit(b"b".to_vec(), 8 * 32, true)),
                Err(BackendError::Invalid(_))
            ));
        }
    }

    /// New keys beyond what the memory nodes hold are refused as out of space (`-OOM` on RESP), as a full dinomo
    /// store refuses them; what was stored is still read.
    #[test]
    fn a_full_store_refuses_new_keys_as_out_of_space() {
        for system in Baseline::ALL {
            let (b, _nodes) = backend(system);
            let mut c = b.connect(dinomo_resp::Wake::none());
            let mut stored = 0u32;
            let refusal = loop {
                assert!(stored < 100_000, "{system}: the store never filled up");
                match c.set(format!("k{stored}").as_bytes(), &stored.to_le_bytes()) {
                    Ok(()) => stored += 1,
                    Err(e) => break e,
                }
            };
            assert!(
                matches!(refusal, BackendError::OutOfSpace(_)),
                "{system}: {refusal:?}"
            );
            assert!(stored >= 32, "{system}: only {stored} keys fit");
            for i in (0..stored).step_by(7) {
                assert_eq!(
                    c.get(format!("k{i}").as_bytes()),
                    Ok(Some(i.to_le_bytes().to_vec())),
                    "{system}: k{i}"
                );
            }
        }
    }
}
