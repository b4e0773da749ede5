//! The elastic cluster (paper §3.4–3.5): KV nodes that serve only the keys they own, routing nodes that tell
//! clients who owns what, a native client that caches routing and follows refusals, and the management node that
//! moves ownership (never data) when nodes join, leave or fail. The same parts run the paper's variants
//! ([`Variant`]): DINOMO-S (shortcut-only caches) and DINOMO-N (shared-nothing, where the M-node has the memory
//! node move the data of the keys that change owner).
//!
//! The cluster record — the ring with its epoch and the nodes' addresses — lives in a [`dinomo_meta::MetaStore`]:
//! embedded (served by the memory node and persisted in its pool) or etcd.

mod autoscale;
mod client;
mod failures;
mod forward;
pub mod latency;
mod local;
pub mod metrics;
mod mnode;
mod node;
mod pipeline;
pub mod policy;
mod resp;
mod rn;
mod server;
mod stats;
pub mod status;
mod stop;
mod variant;
pub mod wire;

use dinomo_meta::{MetaError, MetaStore};
use dinomo_ring::NodeId;
use serde::{Deserialize, Serialize};

pub use autoscale::{
    ActionOutcome, Actuator, AutoscaleConfig, Autoscaler, ManualScaler, PolicyEvent, Scaler, act,
};
pub use client::{Client, ClientConfig, ClientError, SessionError, open_session};
pub use local::{LocalCluster, LocalClusterConfig, MemoryNodeRpc, resp_address};
pub use mnode::{MNode, MNodeConfig, ReconfigEvent, ReconfigKind};
pub use node::{ClusterNode, NodeConfig, NodeStats};
pub use pipeline::{Completion, PipelinedClient};
pub use resp::process_fabric_counts;
pub use rn::RoutingNode;
pub use server::{
    DEFAULT_CONTROL_THREADS, DEFAULT_IO_THREADS, MAX_SERVER_THREADS, Server, ServerLimits,
};
pub use stats::{NodeEpochStats, SampleWindow};
pub use variant::Variant;
pub use wire::Routing;

/// What can go wrong running a cluster component.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Meta(#[from] MetaError),
    /// The KV node failed to start or serve.
    #[error("KV node: {0}")]
    Kn(#[from] dinomo_kn::KnError),
    /// The memory node failed.
    #[error("memory node: {0}")]
    Fabric(#[from] dinomo_fabric::FabricError),
    /// Sockets or threads.
    #[error("{0}")]
    Io(String),
    /// The cluster record does not decode.
    #[error("corrupt cluster record: {0}")]
    Corrupt(String),
    /// A reconfiguration could not complete.
    #[error("reconfiguration: {0}")]
    Reconfig(String),
}

/// The persistent cluster record kept in the metadata store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// The routing table (the ring, its epoch, the nodes' addresses).
    pub routing: Routing,
    /// Node incarnations the M-node removed: they stay out of the ring while that process lives, even though it
    /// is still registered (a restarted node has a new incarnation and may join again).
    pub retired: std::collections::BTreeMap<NodeId, u64>,
}

/// What a KV node publishes about itself while its lease lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its native-protocol address.
    pub addr: String,
    /// Distinguishes processes that used the same node id.
    pub incarnation: u64,
}

impl ClusterRecord {
    /// The record and its version, if one was stored.
    pub fn load(meta: &dyn MetaStore) -> Result<Option<(ClusterRecord, u64)>, ClusterError> {
        ClusterRecord::load_if_changed(meta, None)
    }

    /// Like [`ClusterRecord::load`], but `None` also when the stored version is still `known`: pollers skip
    /// decoding (and rebuilding the ring) when nothing changed.
    pub fn load_if_changed(
        meta: &dyn MetaStore,
        known: Option<u64>,
    ) -> Result<Option<(ClusterRecord, u64)>, ClusterError> {
        match meta.load()? {
            Some(v) if Some(v.version) != known => {
                let r = postcard::from_bytes(&v.value)
                    .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
                Ok(Some((r, v.version)))
            }
            _ => Ok(None),
        }
    }

    /// Stores the record if the stored version is still `expected`.
    pub fn store(&self, meta: &dyn MetaStore, expected: Option<u64>) -> Result<u64, ClusterError> {
        let bytes =
            postcard::to_allocvec(self).map_err(|e| ClusterError::Corrupt(e.to_string()))?;
        Ok(meta.store(expected, &bytes)?)
    }
}

/// The member name a KV node registers under.
pub fn member_name(node: NodeId) -> String {
    format!("kn/{node:08}")
}

/// The node id in a member name.
pub fn member_node(name: &str) -> Option<NodeId> {
    name.strip_prefix("kn/")?.parse().ok()
}
