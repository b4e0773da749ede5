//! Shared set-up: M memory nodes over anonymous pools, each reachable in-process and over loopback TCP.
#![allow(dead_code)]

use std::sync::Arc;

use dinomo_fabric::{
    Connector, CounterSnapshot, MemoryNode, NodeConfig, Server, ServerConfig, Target,
    counters::thread_snapshot,
};
use dinomo_pdpm::central::{
    self, CentralClient, CentralLayout, CentralSettings, Coordinator, CoordinatorConfig,
};
use dinomo_pdpm::clover::{
    self, CloverClient, CloverLayout, CloverSettings, MetadataConfig, MetadataServer,
};
use dinomo_pdpm::{Change, PdpmStore};
use dinomo_pool::Pool;
use proptest::prelude::*;

pub const TOKEN: &str = "pdpm-test-token";

pub struct Nodes {
    pub nodes: Vec<Arc<MemoryNode>>,
    pub servers: Vec<Server>,
}

impl Nodes {
    /// `count` memory nodes, each with a pool prepared by `format`.
    pub fn new(count: usize, format: impl Fn(&Pool)) -> Nodes {
        let mut nodes = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..count {
            let pool = Arc::new(Pool::anonymous(32 << 20, 1 << 20).unwrap());
            format(&pool);
            let (node, server) = start_node(pool, NodeConfig::default());
            nodes.push(node);
            servers.push(server);
        }
        Nodes { nodes, servers }
    }

    pub fn connectors(&self, tcp: bool) -> Vec<Connector> {
        self.nodes
            .iter()
            .zip(&self.servers)
            .map(|(n, s)| connector(n, s, tcp))
            .collect()
    }
}

/// A memory node over `pool` with `config` (and the tests' cluster token), served on 127.0.0.1.
pub fn start_node(pool: Arc<Pool>, config: NodeConfig) -> (Arc<MemoryNode>, Server) {
    let node = MemoryNode::new(
        pool,
        NodeConfig {
            cluster_token: TOKEN.into(),
            ..config
        },
    );
    let server = Server::start(
        node.clone(),
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    (node, server)
}

pub fn connector(node: &Arc<MemoryNode>, server: &Server, tcp: bool) -> Connector {
    let mut c = Connector::new(if tcp {
        Target::Tcp(server.local_addr())
    } else {
        Target::InProcess(node.clone())
    });
    c.config.cluster_token = TOKEN.into();
    c
}

/// A memory node of its own for a server behind RPC (a coordinator, a metadata server): its `rpc_threads`
/// processor threads are the server's thread pool.
pub fn rpc_host(rpc_threads: usize) -> (Arc<MemoryNode>, Server) {
    start_node(
        Arc::new(Pool::anonymous(4 << 20, 1 << 20).unwrap()),
        NodeConfig {
            rpc_threads,
            ..NodeConfig::default()
        },
    )
}

/// Serves `coordinator` on a memory node of its own with `rpc_threads` threads.
pub fn serve_coordinator(
    coordinator: &Arc<Coordinator>,
    rpc_threads: usize,
) -> (Arc<MemoryNode>, Server) {
    let (host, server) = rpc_host(rpc_threads);
    coordinator.serve(&host);
    (host, server)
}

/// Serves `ms` on a memory node of its own with `rpc_threads` threads.
pub fn serve_metadata(ms: &Arc<MetadataServer>, rpc_threads: usize) -> (Arc<MemoryNode>, Server) {
    let (host, server) = rpc_host(rpc_threads);
    ms.serve(&host);
    (host, server)
}

/// CentralDS: memory nodes with block areas and a coordinator over them (connected in-process), served on a node
/// of its own.
pub struct Central {
    pub memory: Nodes,
    pub coordinator: Arc<Coordinator>,
    pub host: Arc<MemoryNode>,
    pub host_server: Server,
}

impl Central {
    /// `memory_nodes` nodes formatted with `layout`; the coordinator has `rpc_threads` threads.
    pub fn new(
        memory_nodes: usize,
        layout: &CentralLayout,
        config: CoordinatorConfig,
        rpc_threads: usize,
    ) -> Central {
        let memory = Nodes::new(memory_nodes, |pool| central::format(pool, layout).unwrap());
        let coordinator = Coordinator::new(&memory.connectors(false), config).unwrap();
        let (host, host_server) = serve_coordinator(&coordinator, rpc_threads);
        Central {
            memory,
            coordinator,
            host,
            host_server,
        }
    }

    pub fn coordinator_connector(&self, tcp: bool) -> Connector {
        connector(&self.host, &self.host_server, tcp)
    }

    pub fn client(&self, tcp: bool, settings: CentralSettings) -> CentralClient {
        CentralClient::connect(
            &self.coordinator_connector(tcp),
            &self.memory.connectors(tcp),
            settings,
        )
        .unwrap()
    }
}

/// The fabric traffic of this thread while `f` runs.
pub fn traffic<T>(f: impl FnOnce() -> T) -> (T, CounterSnapshot) {
    let before = thread_snapshot();
    let r = f();
    (r, thread_snapshot() - before)
}

/// One operation of a model test, on one of 12 keys.
#[derive(Debug, Clone)]
pub enum Op {
    Put(u8, Vec<u8>),
    Get(u8),
    Delete(u8),
    /// A read-modify-write by [`change`] with this byte.
    Update(u8, u8),
}

/// The read-modify-write of the model tests: create, append, keep or delete, depending on the value.
pub fn change(old: Option<&[u8]>, byte: u8) -> Change {
    match old {
        None => Change::Put(vec![byte]),
        Some(v) if v.len() >= 8 => Change::Delete,
        Some(_) if byte % 4 == 0 => Change::Keep,
        Some(v) => Change::Put([v, &[byte]].concat()),
    }
}

/// [`change`] applied to a model map.
pub fn apply(model: &mut std::collections::HashMap<Vec<u8>, Vec<u8>>, key: Vec<u8>, byte: u8) {
    match change(model.get(&key).map(Vec::as_slice), byte) {
        Change::Keep => {}
        Change::Put(v) => {
            model.insert(key, v);
        }
        Change::Delete => {
            model.remove(&key);
        }
    }
}

/// Adds one to the little-endian counter in the first 8 bytes (none = 0), as a value of `len` bytes.
pub fn increment(old: Option<&[u8]>, len: usize) -> Change {
    let n = old.map_or(0, |b| u64::from_le_bytes(b[..8].try_into().unwrap()));
    let mut v = (n + 1).to_le_bytes().to_vec();
    v.resize(len, 0xab);
    Change::Put(v)
}

/// `threads` threads, each with a client from `connect`, add one to the counter under `key` `increments` times
/// each through `update` ([`increment`], 24-byte values).
pub fn increment_from_threads<C: PdpmStore>(
    threads: usize,
    increments: usize,
    key: &[u8],
    connect: impl Fn() -> anyhow::Result<C> + Sync,
) -> anyhow::Result<()> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    let mut c = connect()?;
                    for _ in 0..increments {
                        c.update(key, &mut |old| increment(old, 24))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap()?;
        }
        Ok(())
    })
}

/// The counter [`increment`] keeps.
pub fn counter(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |b| u64::from_le_bytes(b[..8].try_into().unwrap()))
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(k, v)| Op::Put(k, v)),
        (0u8..12).prop_map(Op::Get),
        (0u8..12).prop_map(Op::Delete),
        (0u8..12, any::<u8>()).prop_map(|(k, b)| Op::Update(k, b)),
    ]
}

/// Clover: memory nodes with Clover areas and a metadata server over them (connected in-process), served with two
/// RPC threads on a node of its own.
pub struct Clover {
    pub memory: Nodes,
    pub ms: Arc<MetadataServer>,
    pub host: Arc<MemoryNode>,
    pub host_server: Server,
}

impl Clover {
    /// `memory_nodes` nodes formatted with `layout`; the MS has `config`.
    pub fn new(memory_nodes: usize, layout: &CloverLayout, config: MetadataConfig) -> Clover {
        let memory = Nodes::new(memory_nodes, |pool| clover::format(pool, layout).unwrap());
        let ms = MetadataServer::new(&memory.connectors(false), config).unwrap();
        let (host, host_server) = serve_metadata(&ms, 2);
        Clover {
            memory,
            ms,
            host,
            host_server,
        }
    }

    pub fn ms_connector(&self, tcp: bool) -> Connector {
        connector(&self.host, &self.host_server, tcp)
    }

    pub fn client(&self, tcp: bool, settings: CloverSettings) -> CloverClient {
        CloverClient::connect(
            &self.ms_connector(tcp),
            &self.memory.connectors(tcp),
            settings,
        )
        .unwrap()
    }
}

/// A whole walk over `store`'s keys in steps of about `count` (`SCAN`): every key named, and those of them with a
/// value now.
pub fn walk(
    store: &mut impl PdpmStore,
    count: u32,
) -> (
    std::collections::BTreeSet<Vec<u8>>,
    std::collections::BTreeSet<Vec<u8>>,
) {
    let mut named = std::collections::BTreeSet::new();
    let mut cursor = 0;
    for _ in 0..1_000_000 {
        let (next, keys) = store.scan_keys(cursor, count).expect("a walk step");
        named.extend(keys);
        cursor = next;
        if cursor == 0 {
            let there = named
                .iter()
                .filter(|k| store.get(k).expect("a read").is_some())
                .cloned()
                .collect();
            return (named, there);
        }
    }
    panic!("the walk does not end");
}
