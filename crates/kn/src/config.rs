use std::time::Duration;

use dinomo_cache::CacheConfig;

use crate::hotkeys::KeyStatsConfig;

/// Settings of a KV node. Configuration files give the node's identity with the cluster node's settings, so it is
/// left out here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnConfig {
    /// Identity of the node; its threads' logs are found by it after a restart (default 1).
    #[serde(skip)]
    pub node_id: u32,
    /// Worker threads, each owning a share of the keys (default 2).
    pub threads: usize,
    /// Cache of each worker thread; `budget_bytes` is per thread (default 64 MiB, DAC).
    pub cache: CacheConfig,
    /// Largest key in bytes (default 4 KiB; at most 65535).
    pub max_key_len: usize,
    /// Largest value in bytes (default 1 MiB). A key and value of the largest sizes must fit in one log segment;
    /// start-up fails with a clear error when they do not.
    pub max_value_len: usize,
    /// Sealed segments a thread may have waiting to be merged before its writes wait (default 2).
    pub max_unmerged_segments: usize,
    /// How long a write waits for the memory node to merge before it fails (default 10 s).
    #[serde(with = "humantime_serde")]
    pub merge_wait_timeout: Duration,
    /// Requests a worker takes from its queue for one group commit (default 128).
    pub max_batch: usize,
    /// Bytes a worker reads ahead for the lookups of a batch (default 1 MiB; 0: none): the index buckets of its
    /// uncached keys, walked side by side, then in one round trip the entries those walks found and those its
    /// cached shortcuts lead to. Each worker keeps a buffer of up to that size for them. Not over an in-process
    /// fabric without injected latency, where a round trip costs nothing.
    pub read_ahead_bytes: u64,
    /// Requests that may wait in a worker's queue (default 4096).
    pub queue_depth: usize,
    /// Attempts a write of a shared key makes before it gives up because other owners keep changing the key
    /// (default 64; each lost attempt costs a READ of the cell, maybe one of the entry, and a WRITE).
    pub shared_cas_attempts: u32,
    /// Per-epoch key-access statistics each worker keeps for the M-node's policy.
    pub key_stats: KeyStatsConfig,
}

impl Default for KnConfig {
    fn default() -> Self {
        KnConfig {
            node_id: 1,
            threads: 2,
            cache: CacheConfig::default(),
            max_key_len: 4096,
            max_value_len: 1 << 20,
            max_unmerged_segments: 2,
            merge_wait_timeout: Duration::from_secs(10),
            max_batch: 128,
            read_ahead_bytes: 1 << 20,
            queue_depth: 4096,
            shared_cas_attempts: 64,
            key_stats: KeyStatsConfig::default(),
        }
    }
}

impl KnConfig {
    /// Checks the settings that do not depend on the memory node.
    pub fn validate(&self) -> Result<(), crate::KnError> {
        let bad = |s: String| Err(crate::KnError::Config(s));
        if self.threads == 0 {
            return bad("threads must be at least 1".into());
        }
        if self.node_id > dinomo_dpm::MAX_NODE_ID {
            return bad(format!(
                "node_id {} is out of range: KV node ids go up to {}",
                self.node_id,
                dinomo_dpm::MAX_NODE_ID
            ));
        }
        if self.max_key_len > u16::MAX as usize {
            return bad(format!(
                "max_key_len {} exceeds the log format's limit of 65535",
                self.max_key_len
            ));
        }
        if self.max_value_len > u32::MAX as usize {
            return bad(format!(
                "max_value_len {} exceeds 4 GiB",
                self.max_value_len
            ));
        }
        // The memory node's index names an entry by an `EntryRef`, whose length field bounds an entry.
        let largest = dinomo_log::entry_len(self.max_key_len, self.max_value_len) as u64;
        if largest > dinomo_log::EntryRef::MAX_LEN {
            return bad(format!(
                "max_key_len {} + max_value_len {} need {largest} bytes per log entry, above the log format's \
                 limit of {} bytes",
                self.max_key_len,
                self.max_value_len,
                dinomo_log::EntryRef::MAX_LEN
            ));
        }
        if self.max_unmerged_segments == 0 || self.max_batch == 0 || self.queue_depth == 0 {
            return bad(
                "max_unmerged_segments, max_batch and queue_depth must be at least 1".into(),
            );
        }
        self.key_stats.validate().map_err(crate::KnError::Config)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_whose_entries_an_entry_ref_cannot_name_are_refused() {
        let fits = KnConfig {
            max_value_len: 64 << 20,
            ..KnConfig::default()
        };
        fits.validate().unwrap();
        // 1 GiB passes the 4 GiB bound of the value length, but an entry that large cannot be indexed.
        let too_large = KnConfig {
            max_value_len: 1 << 30,
            ..KnConfig::default()
        };
        let err = too_large.validate().unwrap_err().to_string();
        assert!(err.contains("limit of"), "{err}");
    }
}
