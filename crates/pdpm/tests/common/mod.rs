//! Shared set-up: M memory nodes over anonymous pools, each reachable in-process and over loopback TCP.
#![allow(dead_code)]

use std::sync::Arc;

use dinomo_fabric::{
    Connector, CounterSnapshot, MemoryNode, NodeConfig, Server, ServerConfig, Target,
    counters::thread_snapshot,
};
use dinomo_pool::Pool;

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
            let node = MemoryNode::new(
                pool,
                NodeConfig {
                    cluster_token: TOKEN.into(),
                    ..NodeConfig::default()
                },
            );
            servers.push(
                Server::start(
                    node.clone(),
                    ServerConfig {
                        listen: "127.0.0.1:0".parse().unwrap(),
                        ..ServerConfig::default()
                    },
                )
                .unwrap(),
            );
            nodes.push(node);
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

pub fn connector(node: &Arc<MemoryNode>, server: &Server, tcp: bool) -> Connector {
    let mut c = Connector::new(if tcp {
        Target::Tcp(server.local_addr())
    } else {
        Target::InProcess(node.clone())
    });
    c.config.cluster_token = TOKEN.into();
    c
}

/// The fabric traffic of this thread while `f` runs.
pub fn traffic<T>(f: impl FnOnce() -> T) -> (T, CounterSnapshot) {
    let before = thread_snapshot();
    let r = f();
    (r, thread_snapshot() - before)
}
