use dinomo_fabric::FabricError;

/// What a KV-node operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum KnError {
    /// The key is longer than `max_key_len`.
    #[error("key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge {
        /// Length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value is longer than `max_value_len`.
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// Length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Reaching the memory node failed; a write that reports it may or may not have been applied.
    #[error("memory node unreachable: {0}")]
    Fabric(#[from] FabricError),
    /// The memory node refused a call (out of space, log taken over by a newer session, ...).
    #[error("memory node refused: {0}")]
    Refused(String),
    /// The memory node has no room for the write: no log segment for it, or no room in the index for new keys
    /// (its table cannot grow). The write was not applied; space comes back as deletes and overwrites are merged
    /// and the segments they supersede are recycled.
    #[error("out of memory-node space, the write was not applied: {0}")]
    OutOfSpace(String),
    /// The memory node did not merge the log in time, so the write could not get log space.
    #[error(
        "the memory node has not merged this thread's log for {0:?}; the write was not applied"
    )]
    MergeStalled(std::time::Duration),
    /// Data read from the memory node failed its checks.
    #[error("corrupt data on the memory node: {0}")]
    Corrupt(String),
    /// A setting is out of range or the settings do not fit together.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The node is shutting down.
    #[error("the KV node is stopped")]
    Stopped,
    /// This node does not own the key under its ownership map of `epoch`; the client should refresh its routing.
    #[error("not the owner of this key (ownership epoch {epoch})")]
    NotOwner {
        /// The epoch of this node's ownership map.
        epoch: u64,
        /// The refused operation, handed back untouched (nothing of it was applied), so a caller that forwards it
        /// to the owner need not have kept a copy. `None` when the request was not a [`crate::DataOp`].
        refused: Option<Box<crate::DataOp>>,
    },
    /// The node's liveness lease lapsed while a write was in flight and was not renewed in time, so the cluster
    /// may already have handed its keys to other nodes. The write may or may not have been applied.
    #[error("this KV node's lease lapsed while the write was in flight")]
    Fenced,
    /// The node's liveness lease had lapsed (or expired for good) and was not renewed within the wait, so the node
    /// did not serve the request; nothing was applied. The key may have a new owner: refresh the routing and retry.
    #[error(
        "this KV node's lease lapsed, so it did not serve the request (nothing was applied); retry: the key may have a new owner"
    )]
    LeaseLapsed,
    /// A transaction did not run: one of its parts may not run here, or not every part reached its worker in
    /// time. Nothing of it was applied.
    #[error("the transaction did not run, nothing was applied: {0}")]
    TxnAborted(String),
    /// A transaction did not run because a key it watched (`WATCH`) no longer had the value it had. Nothing of it
    /// was applied.
    #[error("a watched key changed, so the transaction did not run (nothing was applied)")]
    TxnChanged,
    /// The key kept changing under the request: other owners of a shared key won every attempt's CAS, or the
    /// index slots of a key's hash changed on every walk of a read. Nothing was applied.
    #[error("the key changed under {attempts} attempts in a row; nothing was applied")]
    Contended {
        /// Attempts made.
        attempts: u32,
    },
    /// The stored value is not a decimal 64-bit integer (Redis's text, which the RESP front door answers with).
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    /// An increment whose result does not fit in 64 bits; nothing was written (Redis's text).
    #[error("increment or decrement would overflow")]
    IncrOverflow,
    /// The stored value or the increment of a float increment is not a number (Redis's text).
    #[error("value is not a valid float")]
    NotAFloat,
    /// A float increment whose result would be infinite; nothing was written (Redis's text).
    #[error("increment would produce NaN or Infinity")]
    NotFinite,
}

impl From<dinomo_value::ValueError> for KnError {
    fn from(e: dinomo_value::ValueError) -> KnError {
        use dinomo_value::ValueError;
        match e {
            ValueError::NotAnInteger => KnError::NotAnInteger,
            ValueError::IntegerOverflow => KnError::IncrOverflow,
            ValueError::NotAFloat => KnError::NotAFloat,
            ValueError::NotFinite => KnError::NotFinite,
            ValueError::TooLong { len, max } => KnError::ValueTooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max,
            },
        }
    }
}

impl KnError {
    /// Whether a write that failed with this error may nevertheless have been applied (the client cannot know).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, KnError::Fabric(_) | KnError::Fenced)
    }
}
