//! Errors of the fabric, split into what one verb did wrong and what went wrong with the connection.

use crate::verbs::VerbKind;

/// Why the memory node refused one verb. The connection stays usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    /// The access does not lie inside the region.
    #[error("access outside the region's bounds")]
    OutOfBounds,
    /// The region key presented does not match the region.
    #[error("wrong region key")]
    BadKey,
    /// No region has this id.
    #[error("no such region")]
    NoSuchRegion,
    /// CAS and FAA need an 8-byte aligned address.
    #[error("atomic verb on an address that is not 8-byte aligned")]
    Misaligned,
    /// The region does not allow this kind of access.
    #[error("region does not permit this access")]
    AccessDenied,
    /// The verb moves more bytes than the node accepts in one message.
    #[error("verb larger than the node's message limit")]
    TooLarge,
    /// An earlier verb of the same batch failed, so this one was not executed.
    #[error("not executed: an earlier verb of the batch failed")]
    Skipped,
}

impl VerbError {
    /// The status byte of this refusal on the TCP wire.
    pub fn code(self) -> u8 {
        match self {
            VerbError::OutOfBounds => 1,
            VerbError::BadKey => 2,
            VerbError::NoSuchRegion => 3,
            VerbError::Misaligned => 4,
            VerbError::AccessDenied => 5,
            VerbError::TooLarge => 6,
            VerbError::Skipped => 7,
        }
    }

    /// The refusal a wire status byte stands for.
    pub fn from_code(code: u8) -> Option<VerbError> {
        Some(match code {
            1 => VerbError::OutOfBounds,
            2 => VerbError::BadKey,
            3 => VerbError::NoSuchRegion,
            4 => VerbError::Misaligned,
            5 => VerbError::AccessDenied,
            6 => VerbError::TooLarge,
            7 => VerbError::Skipped,
            _ => return None,
        })
    }
}

/// Why a two-sided call failed at the memory node's processor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// No handler is installed, or it does not know the method.
    #[error("unknown RPC method {0}")]
    UnknownMethod(u16),
    /// The handler returned an error.
    #[error("RPC failed at the memory node: {0}")]
    Failed(String),
    /// The handler needed pool space the memory node does not have; nothing was done.
    #[error("the memory node is out of space: {0}")]
    OutOfSpace(String),
    /// A body could not be encoded or decoded.
    #[error("RPC body could not be decoded: {0}")]
    Codec(String),
    /// The node's processor threads are gone (the node is shutting down).
    #[error("memory node processor is not running")]
    ProcessorDown,
}

/// Everything a fabric operation can return.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// Verb `index` of the round trip was refused; later verbs of the batch were skipped.
    #[error("{kind:?} verb #{index} refused: {error}")]
    Verb {
        /// Position in the batch (0 for a single verb).
        index: usize,
        /// The verb.
        kind: VerbKind,
        /// The reason.
        error: VerbError,
    },
    /// A two-sided call failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The connection is closed, cut, or broken by an earlier timeout; reconnect.
    #[error("fabric connection lost: {0}")]
    Disconnected(String),
    /// No response within the configured timeout (the connection is no longer usable).
    #[error("fabric round trip timed out")]
    Timeout,
    /// The memory node refused the connection (wrong token, version, or too many connections).
    #[error("fabric handshake refused: {0}")]
    Handshake(String),
    /// The memory node revoked this client (the cluster took over the KV node it names itself as): its
    /// connections were closed and it may not connect again. Reconnecting does not help; the process must restart
    /// (as a new incarnation).
    #[error("the memory node revoked this client: {0}")]
    Revoked(String),
    /// The peer sent something that is not this protocol.
    #[error("fabric protocol violation: {0}")]
    Protocol(String),
    /// A local argument error (buffer too large, bad address).
    #[error("invalid fabric request: {0}")]
    Invalid(String),
    /// The memory node now serves another pool than the one this connector's endpoints reached before (it was
    /// restarted on another file, or another memory node took its address). Nothing cached from the old pool means
    /// anything in this one, so the connection is refused rather than used; restart the process to use the new pool.
    #[error(
        "the memory node serves another pool (id {found:#018x}) than the one this process started with \
         (id {expected:#018x}): was it restarted on another pool file? restart this process to use the new pool"
    )]
    PoolReplaced {
        /// The pool this connector reached first.
        expected: u64,
        /// The pool the memory node serves now.
        found: u64,
    },
    /// Operating-system error.
    #[error("fabric I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl FabricError {
    /// True when the endpoint must be replaced by a new connection (for a revoked client, connecting again is
    /// refused with [`FabricError::Revoked`]).
    pub fn is_connection_lost(&self) -> bool {
        matches!(
            self,
            FabricError::Disconnected(_)
                | FabricError::Revoked(_)
                | FabricError::Timeout
                | FabricError::Io(_)
                | FabricError::Protocol(_)
        )
    }
}
