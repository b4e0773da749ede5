//! The memory fabric: the one place that knows how a KV node reaches a memory node.
//!
//! One-sided verbs (READ, WRITE, 8-byte CAS and FAA) run against registered regions of a memory node's pool
//! without involving its processor; two-sided RPCs run on the processor's threads. A [`Batch`] of verbs costs one
//! round trip. Two transports give the same results:
//! - **in-process** ([`Target::InProcess`]): verbs are direct copies and atomics on the mapped pool;
//! - **TCP** ([`Target::Tcp`] and [`Server`]): a handshake with a cluster token, then fixed binary headers with
//!   pipelined, id-checked requests; per-connection "NIC" threads execute verbs.
//!
//! Every round trip is counted per thread ([`counters`]); an injected per-round-trip latency emulates a
//! microsecond fabric on one host; [`FaultHooks`] drop, delay or cut an endpoint's traffic in tests.

mod clients;
pub mod counters;
mod endpoint;
mod error;
mod faults;
mod node;
mod server;
mod verbs;
pub mod wire;

pub use clients::{ClientId, Clients, Revocation};
pub use counters::CounterSnapshot;
pub use endpoint::{Connector, Endpoint, EndpointConfig, Target};
pub use error::{FabricError, RpcError, VerbError};
pub use faults::{FaultHooks, MAX_PAUSE, spin_for};
pub use node::{
    DATA_REGION, MemoryNode, NodeConfig, ROOTS_REGION, RpcHandler, decode, encode, token_matches,
};
pub use server::{Server, ServerConfig, ServerError};
pub use verbs::{Access, Batch, RegionInfo, RemoteAddr, Slot, VerbKind};
