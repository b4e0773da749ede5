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
}
