//! Finding a key in a thread's unmerged log segments, which the thread keeps as local copies.
//!
//! Each segment copy has a bloom filter over the hashes of the keys written into it, so a lookup skips the
//! segments that cannot hold the key with one cheap test each, and a compact locator from key hash to the newest
//! entry with that hash (older entries with the same hash are chained), so that a segment that may hold the key
//! is searched without a scan. Keys are not copied: a candidate entry's key is compared in the segment copy.

use std::collections::HashMap;

use dinomo_log::EntryView;
use fastbloom::BloomFilter;

const NONE: u32 = u32::MAX;

/// Keys of one segment copy.
pub(crate) struct SegmentKeys {
    bloom: BloomFilter,
    /// Key hash → index in `entries` of the newest entry with that hash.
    newest: HashMap<u64, u32>,
    /// (offset of the entry in the segment, index of the previous entry with the same hash or NONE).
    entries: Vec<(u32, u32)>,
}

impl SegmentKeys {
    /// Sized for a segment of `capacity` bytes of entries.
    pub(crate) fn new(capacity: usize) -> SegmentKeys {
        // Entries of a 64-byte value with a short key: the bloom filter stays accurate up to about that density.
        let expected = (capacity / 96).max(16);
        SegmentKeys {
            bloom: BloomFilter::with_false_pos(0.01).expected_items(expected),
            newest: HashMap::new(),
            entries: Vec::new(),
        }
    }

    /// Records that the entry at `at` carries a key hashing to `hash`.
    pub(crate) fn insert(&mut self, hash: u64, at: u32) {
        self.bloom.insert(&hash);
        let idx = self.entries.len() as u32;
        let prev = self.newest.insert(hash, idx).unwrap_or(NONE);
        self.entries.push((at, prev));
    }

    /// Offset of the newest entry for `key` in `buf` (the segment copy), if any.
    pub(crate) fn find(&self, hash: u64, key: &[u8], buf: &[u8]) -> Option<u32> {
        if !self.bloom.contains(&hash) {
            return None;
        }
        let mut idx = *self.newest.get(&hash)?;
        while idx != NONE {
            let (at, prev) = self.entries[idx as usize];
            if EntryView::parse(&buf[at as usize..]).is_ok_and(|e| e.key == key) {
                return Some(at);
            }
            idx = prev;
        }
        None
    }

    /// Offsets of the entries recorded, in the order they were.
    pub(crate) fn offsets(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().map(|&(at, _)| at)
    }

    /// Entries recorded.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes this structure holds (approximately: the table's slots and the entry list).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bloom.num_bits() / 8 + self.newest.capacity() * 13 + self.entries.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_log::{Op, encode_entry};
    use proptest::prelude::*;

    proptest! {
        /// Whatever keys and hash collisions, `find` returns the newest entry of the key, or nothing.
        #[test]
        fn finds_the_newest_entry_of_each_key(writes in proptest::collection::vec(0u8..20, 1..200)) {
            let mut buf = Vec::new();
            let mut keys = SegmentKeys::new(1 << 16);
            let mut newest = std::collections::HashMap::new();
            for (i, k) in writes.iter().enumerate() {
                let key = vec![*k; 1 + (*k % 5) as usize];
                let at = buf.len() as u32;
                encode_entry(&mut buf, Op::Put, 1, i as u64 + 1, &key, &[i as u8]);
                // A test hash with many collisions: five keys share each hash.
                let hash = (*k as u64 % 4) * 10;
                keys.insert(hash, at);
                newest.insert(key, (hash, at));
            }
            for k in 0u8..20 {
                let key = vec![k; 1 + (k % 5) as usize];
                let hash = (k as u64 % 4) * 10;
                prop_assert_eq!(keys.find(hash, &key, &buf), newest.get(&key).map(|x| x.1));
            }
            prop_assert_eq!(keys.len(), writes.len());
        }
    }
}
