//! Shared set-up: one memory node over an anonymous pool, reachable in-process and over loopback TCP.
#![allow(dead_code)]

use std::sync::Arc;

use dinomo_fabric::{
    Connector, DATA_REGION, Endpoint, MemoryNode, NodeConfig, Server, ServerConfig, Target,
};
use dinomo_pool::Pool;

pub const TOKEN: &str = "test-token";

pub struct Harness {
    pub node: Arc<MemoryNode>,
    pub server: Server,
}

impl Harness {
    pub fn new(pool_size: u64, segment_size: u64) -> Harness {
        let pool = Arc::new(Pool::anonymous(pool_size, segment_size).unwrap());
        let node = MemoryNode::new(
            pool,
            NodeConfig {
                cluster_token: TOKEN.into(),
                max_message_len: 1 << 20,
                ..NodeConfig::default()
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
        Harness { node, server }
    }

    pub fn connector(&self, tcp: bool) -> Connector {
        let mut c = Connector::new(if tcp {
            Target::Tcp(self.server.local_addr())
        } else {
            Target::InProcess(self.node.clone())
        });
        c.config.cluster_token = TOKEN.into();
        c
    }

    pub fn connect(&self, tcp: bool) -> Endpoint {
        self.connector(tcp).connect().unwrap()
    }

    /// A copy of the whole data region, read locally.
    pub fn data_image(&self) -> Vec<u8> {
        let r = self
            .node
            .regions()
            .iter()
            .find(|r| r.name == DATA_REGION)
            .unwrap()
            .clone();
        let mut v = vec![0u8; r.len as usize];
        self.node.pool().read(r.start, &mut v).unwrap();
        v
    }
}
