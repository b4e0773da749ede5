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
pub use client::{
    Client, ClientConfig, ClientError, Expected, SessionError, Welcomed, open_session,
    open_session_expecting,
};
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
    /// Settings that cannot work.
    #[error("settings: {0}")]
    Config(String),
}

/// The persistent cluster record kept in the metadata store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// The routing table (the ring, its epoch, the nodes' addresses).
    pub routing: Routing,
    /// Node incarnations the M-node removed: they stay out of the ring while that process lives, even though it
    /// is still registered (a restarted node has a new incarnation and may join again).
    pub retired: std::collections::BTreeMap<NodeId, u64>,
    /// The highest epoch handed to a reconfiguration. The M-node stores it before a change installs anything, so
    /// no two changes (of one M-node or of a stalled one and its successor) ever share an epoch. Above
    /// `routing`'s epoch, a change was begun and not stored: some nodes may serve under its table, and the M-node
    /// rolls it back under a newer epoch before anything else. Records stored before this field existed read it as
    /// their routing epoch.
    pub reserved_epoch: u64,
    /// The pool of the memory node this cluster runs on (its superblock's `pool_id`), which the M-node checks before
    /// it changes anything: a record of another pool's cluster names cells, logs and epochs this pool does not
    /// have. 0 until the M-node first stores a change, and in records stored before this field existed.
    pub pool_id: u64,
}

/// A record as stored before [`ClusterRecord::pool_id`] existed.
#[derive(Deserialize)]
struct RecordWithoutPool {
    routing: Routing,
    retired: std::collections::BTreeMap<NodeId, u64>,
    reserved_epoch: u64,
}

/// A record as stored before [`ClusterRecord::reserved_epoch`] existed.
#[derive(Deserialize)]
struct RecordWithoutReservations {
    routing: Routing,
    retired: std::collections::BTreeMap<NodeId, u64>,
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
    /// Whether a change reserved an epoch past the table and was never stored ([`ClusterRecord::reserved_epoch`]).
    pub fn change_under_way(&self) -> bool {
        self.reserved_epoch > self.routing.epoch()
    }

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
            Some(v) if Some(v.version) != known => Ok(Some((decode(&v.value)?, v.version))),
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

/// A stored record: the current layout, or one stored before [`ClusterRecord::pool_id`] or before
/// [`ClusterRecord::reserved_epoch`] existed (each ends where the newer fields would begin).
fn decode(bytes: &[u8]) -> Result<ClusterRecord, ClusterError> {
    use postcard::Error::DeserializeUnexpectedEnd as Ended;
    let corrupt = |e: postcard::Error| ClusterError::Corrupt(e.to_string());
    match postcard::from_bytes::<ClusterRecord>(bytes) {
        Ok(r) => Ok(r),
        Err(Ended) => match postcard::from_bytes::<RecordWithoutPool>(bytes) {
            Ok(old) => Ok(ClusterRecord {
                routing: old.routing,
                retired: old.retired,
                reserved_epoch: old.reserved_epoch,
                pool_id: 0,
            }),
            Err(Ended) => {
                let old: RecordWithoutReservations =
                    postcard::from_bytes(bytes).map_err(corrupt)?;
                Ok(ClusterRecord {
                    reserved_epoch: old.routing.epoch(),
                    routing: old.routing,
                    retired: old.retired,
                    pool_id: 0,
                })
            }
            Err(e) => Err(corrupt(e)),
        },
        Err(e) => Err(corrupt(e)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(nodes: &[NodeId]) -> Routing {
        Routing {
            ring: dinomo_ring::Ring::with_nodes(8, nodes.iter().copied()),
            addrs: nodes
                .iter()
                .map(|n| (*n, format!("127.0.0.1:{n}")))
                .collect(),
            cells: [(b"hot".to_vec(), 4096)].into_iter().collect(),
        }
    }

    #[test]
    fn a_record_round_trips_with_its_reserved_epoch_and_pool() {
        let r = ClusterRecord {
            routing: routing(&[1, 2]),
            retired: [(3, 77)].into_iter().collect(),
            reserved_epoch: 9,
            pool_id: 0x5eed,
        };
        assert_eq!(decode(&postcard::to_allocvec(&r).unwrap()).unwrap(), r);
    }

    #[test]
    fn a_record_stored_before_pools_were_named_reads_pool_zero() {
        #[derive(Serialize)]
        struct Old {
            routing: Routing,
            retired: std::collections::BTreeMap<NodeId, u64>,
            reserved_epoch: u64,
        }
        let old = Old {
            routing: routing(&[1, 2]),
            retired: [(3, 77)].into_iter().collect(),
            reserved_epoch: 9,
        };
        let r = decode(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(
            (r.routing, r.retired, r.reserved_epoch, r.pool_id),
            (old.routing, old.retired, 9, 0)
        );
    }

    #[test]
    fn a_record_stored_before_reservations_reads_its_routing_epoch_as_reserved() {
        #[derive(Serialize)]
        struct Old {
            routing: Routing,
            retired: std::collections::BTreeMap<NodeId, u64>,
        }
        let mut routing = routing(&[1, 2, 5]);
        routing.ring.set_epoch_at_least(41);
        let old = Old {
            routing: routing.clone(),
            retired: [(4, 12)].into_iter().collect(),
        };
        let r = decode(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(r.routing, routing);
        assert_eq!(r.retired, old.retired);
        assert_eq!(r.reserved_epoch, 41);
    }

    #[test]
    fn a_truncated_or_garbled_record_is_corrupt() {
        let r = ClusterRecord {
            routing: routing(&[1, 2]),
            retired: Default::default(),
            reserved_epoch: 3,
            pool_id: 0x5eed,
        };
        let bytes = postcard::to_allocvec(&r).unwrap();
        for cut in [0, 1, bytes.len() / 2] {
            assert!(
                matches!(decode(&bytes[..cut]), Err(ClusterError::Corrupt(_))),
                "cut at {cut}"
            );
        }
        assert!(matches!(decode(&[0xff; 16]), Err(ClusterError::Corrupt(_))));
    }
}
