//! Log retirement: the directory descriptors of logs nothing needs any more go back to the directory.
//!
//! Every KV-node thread claims a log, named by its node id, and ids are not reused: an autoscaler that adds and
//! removes nodes for a long time leaves the logs of hundreds of departed nodes behind, and a fixed-size directory
//! would fill until no node could join. A log is retired once
//! - no writer holds its session: its node's logs were taken over (the node failed or was removed, or the memory
//!   node restarted and the node has not claimed them again), or the memory node's own migration or relocation
//!   writer let go of it;
//! - it has no segment left: each was recycled once every entry in it was superseded;
//! - everything it wrote is merged.
//!
//! Its descriptor then keeps the log's last sequence number for the next log to claim it, which numbers its entries
//! after it ([`crate::directory::Directory::release`]).
//!
//! A departed node's log that still holds live entries (keys written once and never again) keeps its descriptor
//! until the cleaner empties its segments. When a claim finds the directory full, [`Inner::empty_a_log`] does that
//! at once for the log without a writer that is cheapest to empty, and the claim takes its descriptor. The copies
//! go to the memory node's own relocation log, for which KV nodes' claims leave the last descriptor free while it
//! does not exist.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::{debug, info, warn};

use super::cleaner::{Cleaned, Kept};
use super::indexes::Indexes;
use super::{Inner, LogState, Partitioning};

/// How many logs a full directory's claim tries to empty before it gives up.
const EMPTY_TRIES: usize = 4;

impl Inner {
    /// Gives back the descriptor of log `log_id` when it has no writer, no segment and nothing unmerged; whether
    /// it did.
    pub(super) fn retire_if_unused(&self, log_id: u32) -> bool {
        let mut logs = self.logs.write().expect("logs lock");
        let Some(log) = logs.get(&log_id) else {
            return false;
        };
        let meta = log.meta.lock().expect("log lock");
        if meta.writer || !meta.segments.is_empty() || meta.merged_seq < meta.last_seq {
            return false;
        }
        // Every change of `merged_seq` is written to the descriptor, which so keeps the last sequence number.
        self.dir.release(log_id);
        debug!(
            log = log_id,
            node = super::owner_node(meta.owner),
            thread = meta.owner as u32,
            last_seq = meta.last_seq,
            "log retired"
        );
        drop(meta);
        logs.remove(&log_id);
        self.retired_logs.fetch_add(1, Ordering::Relaxed);
        if self.indexes.partitioning() == Partitioning::PerNode {
            // It may have been the last log merging into a departed node's partition.
            self.partitions_to_check.store(true, Ordering::Release);
        }
        true
    }

    /// Frees the partitions of departed nodes that are empty and that no log merges into any more, when a log
    /// retired or a node departed since the last look ([`super::indexes::Partitions::free_departed`]). Called
    /// where no lock is held: after a take-over, a rebalance, a round of cleaning, at the end of recovery and on
    /// the merge threads' idle ticks. A call that finds a rebalance or cleaning under way leaves the look to the
    /// next call.
    pub(super) fn free_departed_partitions(&self) {
        let Indexes::PerNode(partitions) = &self.indexes else {
            return;
        };
        if !self.partitions_to_check.swap(false, Ordering::AcqRel) {
            return;
        }
        // No rebalance or cleaning is under way: a partition being freed is not being emptied or cleaned.
        let Ok(_no_rebalance) = self.rebalance_lock.try_lock() else {
            self.partitions_to_check.store(true, Ordering::Release);
            return;
        };
        // Held throughout: a claim takes it (for writing) to add its log, and then finds a freed index not live.
        let logs = self.logs.read().expect("logs lock");
        let freed =
            partitions.free_departed(|index| logs.values().any(|l| Arc::ptr_eq(&l.index, index)));
        drop(logs);
        self.freed_partitions
            .fetch_add(freed.len() as u64, Ordering::Relaxed);
    }

    /// Marks `log` as without a writer when `session` is still its writer's, and retires it if that was all it
    /// waited for.
    pub(super) fn let_go(&self, log: &LogState, session: u64) {
        {
            let mut meta = log.meta.lock().expect("log lock");
            if meta.session != session {
                return;
            }
            meta.writer = false;
        }
        self.retire_if_unused(log.id);
    }

    /// Frees a directory descriptor for a claim that found the directory full: empties the log without a writer
    /// whose segments hold the fewest live entries, copying them to the relocation log as the cleaner does, and the
    /// log retires as its last segment is recycled. Only with one shared index: a departed node's partition in the
    /// shared-nothing layout is emptied by the rebalance that follows its departure. When no log retired, says
    /// why.
    pub(super) fn empty_a_log(&self) -> Result<(), String> {
        if self.indexes.partitioning() != Partitioning::Shared {
            return Err("in the shared-nothing layout a departed node's logs are emptied by the rebalance after \
                        its departure, not for a claim"
                .into());
        }
        let _no_rebalance = self.rebalance_lock.lock().expect("rebalance lock");
        let mut state = self.cleaner.lock().expect("cleaner lock");
        // Logs without a writer, all merged and sealed, with their segments.
        let mut candidates: Vec<(u32, Vec<u64>)> = Vec::new();
        let (mut logs, mut written, mut unsettled) = (0, 0, 0);
        for log in self.all_logs() {
            logs += 1;
            let meta = log.meta.lock().expect("log lock");
            let settled = meta
                .segments
                .iter()
                .all(|s| s.merged && s.sealed_len.is_some());
            if meta.writer {
                written += 1;
            } else if !settled {
                unsettled += 1;
            } else {
                candidates.push((log.id, meta.segments.iter().map(|s| s.offset).collect()));
            }
        }
        if candidates.is_empty() {
            return Err(format!(
                "no log could be emptied for it: of {logs} logs, {written} have a writer and {unsettled} have \
                 segments open or not merged"
            ));
        }
        let live_entries = |segments: &[u64]| -> u64 {
            let stats = self.stats_by_segment.lock().expect("segment stats lock");
            segments
                .iter()
                .filter_map(|o| stats.get(o))
                .map(|st| st.entries.saturating_sub(st.invalid))
                .sum()
        };
        candidates.sort_by_cached_key(|(id, segments)| (live_entries(segments), *id));
        let mut kept = Vec::new();
        for (log_id, segments) in candidates.into_iter().take(EMPTY_TRIES) {
            let mut held = None;
            for &segment in &segments {
                match self.clean_segment(&mut state, segment) {
                    Ok(Cleaned::Freed) => {}
                    // Recycled meanwhile (by a merge that superseded its last live entries): nothing to move.
                    Ok(Cleaned::Kept(Kept::Gone)) => {}
                    Ok(Cleaned::Kept(why)) => {
                        held = Some(format!("log {log_id}'s segment at {segment} stays: {why}"));
                        break;
                    }
                    Err(e) => {
                        warn!(log = log_id, segment, error = %e, "emptying a log for its descriptor failed");
                        held = Some(format!("emptying log {log_id} failed: {e}"));
                        break;
                    }
                }
            }
            if let Some(held) = held {
                kept.push(held);
                continue;
            }
            // The recycling of its last segment retired it; a log that had none retires here.
            let retired = self.retire_if_unused(log_id)
                || !self.logs.read().expect("logs lock").contains_key(&log_id);
            if retired {
                self.emptied_logs.fetch_add(1, Ordering::Relaxed);
                info!(
                    log = log_id,
                    segments = segments.len(),
                    "the log directory was full: a log without a writer was emptied and its descriptor reused"
                );
                return Ok(());
            }
            kept.push(format!("log {log_id} did not retire once emptied"));
        }
        debug!(reasons = ?kept, "no log could be emptied for a claim");
        Err(format!(
            "no log could be emptied for it: {}",
            kept.join("; ")
        ))
    }
}
