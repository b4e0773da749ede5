//! Shared set-up: a pool, a memory node over it, in-process and TCP endpoints, and entry references that encode
//! the key they stand for.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dinomo_fabric::{Connector, Endpoint, MemoryNode, NodeConfig, Server, ServerConfig, Target};
use dinomo_index::{EntryRef, IndexConfig};
use dinomo_pool::Pool;

pub const TOKEN: &str = "index-test-token";

/// An anonymous pool of `size` bytes with 4 KiB segments (so that small tables take little room).
pub fn anon_pool(size: u64) -> Arc<Pool> {
    Arc::new(Pool::anonymous(size, 4096).unwrap())
}

/// A memory node serving `pool`.
pub fn node(pool: &Arc<Pool>) -> Arc<MemoryNode> {
    MemoryNode::new(
        pool.clone(),
        NodeConfig {
            cluster_token: TOKEN.into(),
            rpc_threads: 1,
            ..NodeConfig::default()
        },
    )
}

/// An in-process endpoint to `node`.
pub fn in_process(node: &Arc<MemoryNode>) -> Endpoint {
    let mut c = Connector::new(Target::InProcess(node.clone()));
    c.config.cluster_token = TOKEN.into();
    c.connect().unwrap()
}

/// A loopback TCP server for `node`.
pub fn tcp_server(node: &Arc<MemoryNode>) -> Server {
    Server::start(
        node.clone(),
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .unwrap()
}

/// A TCP endpoint to `server`.
pub fn tcp_endpoint(server: &Server) -> Endpoint {
    let mut c = Connector::new(Target::Tcp(server.local_addr()));
    c.config.cluster_token = TOKEN.into();
    c.connect().unwrap()
}

/// Settings that make chains, overflow and resizes happen early.
pub fn tiny(overflow_per_bucket: f64) -> IndexConfig {
    IndexConfig {
        initial_buckets: 2,
        max_load: 0.75,
        overflow_per_bucket,
        retire_grace: Duration::ZERO,
    }
}

/// A (fake, never dereferenced) entry reference that encodes `key` and `version`.
pub fn eref(key: u64, version: u64) -> EntryRef {
    assert!(version < 1 << 12 && key < 1 << 26);
    EntryRef::new(8 * (1 + ((key << 12) | version)), 8).unwrap()
}

/// The key encoded by [`eref`].
pub fn key_of(r: EntryRef) -> u64 {
    (r.offset() / 8 - 1) >> 12
}

/// A well-mixed hash of key `k` (what callers use: XXH3 of the key bytes).
pub fn hash_of(k: u64) -> u64 {
    dinomo_log::key_hash(format!("key-{k}").as_bytes())
}
