//! Crash-safe segment allocator.
//!
//! The persistent state is the allocation table: one 8-byte word per segment. A word is either free, the *head* of
//! an extent (tag + length in segments) or a *continuation* (distance back to its head). Allocation writes the
//! continuations first and the head last; freeing clears the head first. The head word is therefore the commit
//! point: after a crash, continuations without a matching head are orphans and are reclaimed on the next open.
//! A head whose continuations read free is completed instead: in a persist mode that orders nothing (`periodic`,
//! where pages reach the file when the background msync writes them), a power loss can keep the page holding the
//! head and lose the next one, which held its continuations.
//! The free map in DRAM is rebuilt from the table at open.

use crate::PoolError;

const KIND_SHIFT: u32 = 62;
const KIND_FREE: u64 = 0;
const KIND_HEAD: u64 = 1;
const KIND_CONT: u64 = 2;
const TAG_SHIFT: u32 = 32;
const LOW_MASK: u64 = 0xFFFF_FFFF;
/// Bits 48..62 must be zero in every valid word.
const RESERVED_MASK: u64 = ((1u64 << KIND_SHIFT) - 1) & !((1u64 << 48) - 1);

/// Largest extent, in segments, one allocation may ask for.
pub const MAX_EXTENT_SEGMENTS: u64 = LOW_MASK;

/// One decoded allocation-table word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Free,
    Head { tag: u16, segments: u64 },
    Continuation { back: u64 },
}

impl Entry {
    pub(crate) fn encode(self) -> u64 {
        match self {
            Entry::Free => 0,
            Entry::Head { tag, segments } => {
                (KIND_HEAD << KIND_SHIFT) | ((tag as u64) << TAG_SHIFT) | (segments & LOW_MASK)
            }
            Entry::Continuation { back } => (KIND_CONT << KIND_SHIFT) | (back & LOW_MASK),
        }
    }

    pub(crate) fn decode(word: u64) -> Option<Entry> {
        if word & RESERVED_MASK != 0 {
            return None;
        }
        match word >> KIND_SHIFT {
            KIND_FREE if word == 0 => Some(Entry::Free),
            KIND_HEAD => {
                let segments = word & LOW_MASK;
                (segments > 0).then_some(Entry::Head {
                    tag: ((word >> TAG_SHIFT) & 0xFFFF) as u16,
                    segments,
                })
            }
            KIND_CONT if (word >> TAG_SHIFT) & 0xFFFF == 0 && word & LOW_MASK > 0 => {
                Some(Entry::Continuation {
                    back: word & LOW_MASK,
                })
            }
            _ => None,
        }
    }
}

/// An allocated run of contiguous segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Extent {
    /// Pool offset of the first byte.
    pub offset: u64,
    /// Length in segments.
    pub segments: u64,
    /// Length in bytes.
    pub len: u64,
    /// The owner's tag given at allocation.
    pub tag: u16,
}

/// Result of scanning the table at open.
pub(crate) struct Scan {
    pub free: FreeMap,
    /// Segment indices of continuations whose head is missing (to be cleared).
    pub orphans: Vec<u64>,
    /// Continuations a head needs that read free: (segment index, distance back to the head), to be written.
    pub missing: Vec<(u64, u64)>,
}

/// Validates the whole table before anything is written, so a corrupt file is rejected untouched.
pub(crate) fn scan(words: &[u64]) -> Result<Scan, String> {
    let n = words.len() as u64;
    let mut free = FreeMap::new(n);
    let mut orphans = Vec::new();
    let mut missing = Vec::new();
    let mut i = 0u64;
    while i < n {
        let entry = Entry::decode(words[i as usize]).ok_or_else(|| {
            format!(
                "segment {i}: invalid allocation word {:#018x}",
                words[i as usize]
            )
        })?;
        match entry {
            Entry::Free => {
                i += 1;
            }
            Entry::Head { segments, .. } => {
                if i + segments > n {
                    return Err(format!(
                        "segment {i}: extent of {segments} segments runs past the end ({n})"
                    ));
                }
                for j in 1..segments {
                    let w = words[(i + j) as usize];
                    match Entry::decode(w) {
                        Some(Entry::Continuation { back }) if back == j => {}
                        // The head, the commit point, reached the file and its continuation did not.
                        Some(Entry::Free) => missing.push((i + j, j)),
                        _ => {
                            return Err(format!(
                                "segment {}: expected continuation of extent at {i}, found {w:#018x}",
                                i + j
                            ));
                        }
                    }
                }
                free.mark_used(i, segments);
                i += segments;
            }
            Entry::Continuation { .. } => {
                // A continuation not covered by a head: an allocation that crashed before its commit, or a free that
                // crashed after clearing the head.
                orphans.push(i);
                i += 1;
            }
        }
    }
    Ok(Scan {
        free,
        orphans,
        missing,
    })
}

/// DRAM bitmap of free segments with first-fit search.
#[derive(Debug, Clone)]
pub(crate) struct FreeMap {
    used: Vec<u64>,
    len: u64,
    free: u64,
    /// Every segment below this index is used; where the search starts.
    first_maybe_free: u64,
    /// A run (first segment, count) that [`FreeMap::find`] treats as used; [`FreeMap::find_last`] does not.
    kept: Option<(u64, u64)>,
    /// Segments whose pages were faulted in since the pool was mapped: used ones, and free ones handed to the
    /// prefaulter. A bit is never cleared (a freed segment keeps its pages).
    primed: Vec<u64>,
}

impl FreeMap {
    pub(crate) fn new(len: u64) -> FreeMap {
        FreeMap {
            used: vec![0; len.div_ceil(64) as usize],
            len,
            free: len,
            first_maybe_free: 0,
            kept: None,
            primed: vec![0; len.div_ceil(64) as usize],
        }
    }

    /// Keeps the run of `count` segments at `start` out of [`FreeMap::find`] (see `Pool::keep_for_high`); false
    /// when another run is kept.
    pub(crate) fn keep(&mut self, start: u64, count: u64) -> bool {
        if self.kept.is_some() || start.checked_add(count).is_none_or(|end| end > self.len) {
            return false;
        }
        self.kept = Some((start, count));
        true
    }

    /// Ends [`FreeMap::keep`].
    pub(crate) fn release_kept(&mut self) {
        self.kept = None;
    }

    fn kept_contains(&self, i: u64) -> bool {
        self.kept.is_some_and(|(s, c)| (s..s + c).contains(&i))
    }

    fn is_used(&self, i: u64) -> bool {
        self.used[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub(crate) fn mark_used(&mut self, start: u64, count: u64) {
        for i in start..start + count {
            debug_assert!(!self.is_used(i));
            self.used[(i / 64) as usize] |= 1 << (i % 64);
            self.primed[(i / 64) as usize] |= 1 << (i % 64);
        }
        self.free -= count;
    }

    pub(crate) fn mark_free(&mut self, start: u64, count: u64) {
        for i in start..start + count {
            debug_assert!(self.is_used(i));
            self.used[(i / 64) as usize] &= !(1 << (i % 64));
        }
        self.free += count;
        self.first_maybe_free = self.first_maybe_free.min(start);
    }

    pub(crate) fn free_count(&self) -> u64 {
        self.free
    }

    /// First run of `count` free segments outside the kept run.
    pub(crate) fn find(&mut self, count: u64) -> Option<u64> {
        if count == 0 || count > self.free {
            return None;
        }
        let mut i = self.first_maybe_free;
        // Skip whole used words quickly.
        while i < self.len && i % 64 == 0 && self.used[(i / 64) as usize] == u64::MAX {
            i += 64;
        }
        self.first_maybe_free = i;
        let mut run_start = i;
        let mut run = 0;
        while i < self.len {
            if i % 64 == 0 && self.used[(i / 64) as usize] == u64::MAX {
                run = 0;
                i += 64;
                run_start = i;
                continue;
            }
            if self.is_used(i) || self.kept_contains(i) {
                run = 0;
                run_start = i + 1;
            } else {
                run += 1;
                if run == count {
                    return Some(run_start);
                }
            }
            i += 1;
        }
        None
    }

    /// Of the first `ahead` free segments outside the kept run, lowest first (those [`FreeMap::find`] hands out
    /// next, one at a time), the ones not primed yet: marks them primed and appends them to `out`.
    pub(crate) fn claim_unprimed_ahead(&mut self, ahead: u64, out: &mut Vec<u64>) {
        let mut seen = 0;
        let mut word = (self.first_maybe_free / 64) as usize;
        while word < self.used.len() && seen < ahead {
            // Free segments of this word, the kept run and the bits past the last segment left out, a word at a
            // time: a full pool's scan is a few thousand words, not a bit per segment.
            let base = word as u64 * 64;
            let mut free = !self.used[word] & range_mask(base, 0, self.len);
            if let Some((start, count)) = self.kept {
                free &= !range_mask(base, start, start + count);
            }
            while free != 0 && seen < ahead {
                let bit = free.trailing_zeros();
                free &= free - 1;
                seen += 1;
                if self.primed[word] & (1 << bit) == 0 {
                    self.primed[word] |= 1 << bit;
                    out.push(base + u64::from(bit));
                }
            }
            word += 1;
        }
    }

    /// Last (highest) run of `count` free segments, the kept run included.
    pub(crate) fn find_last(&self, count: u64) -> Option<u64> {
        if count == 0 || count > self.free {
            return None;
        }
        // Walk down from the top; `i` is one past the segment looked at next.
        let mut i = self.len;
        let mut run = 0;
        while i > 0 {
            if i % 64 == 0 && self.used[(i / 64 - 1) as usize] == u64::MAX {
                run = 0;
                i -= 64;
                continue;
            }
            i -= 1;
            if self.is_used(i) {
                run = 0;
            } else {
                run += 1;
                if run == count {
                    return Some(i);
                }
            }
        }
        None
    }
}

/// The bits of the 64-segment word starting at segment `base` that lie in segments `start..end`.
fn range_mask(base: u64, start: u64, end: u64) -> u64 {
    let lo = start.clamp(base, base + 64) - base;
    let hi = end.clamp(base, base + 64) - base;
    if hi <= lo {
        0
    } else if hi - lo == 64 {
        u64::MAX
    } else {
        ((1u64 << (hi - lo)) - 1) << lo
    }
}

/// Validates a request before touching anything.
pub(crate) fn check_request(segments: u64, total: u64) -> Result<(), PoolError> {
    if segments == 0 || segments > MAX_EXTENT_SEGMENTS || segments > total {
        return Err(PoolError::OutOfSpace {
            wanted: segments,
            free: total,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entry_roundtrip() {
        for e in [
            Entry::Free,
            Entry::Head {
                tag: 0,
                segments: 1,
            },
            Entry::Head {
                tag: u16::MAX,
                segments: MAX_EXTENT_SEGMENTS,
            },
            Entry::Continuation { back: 1 },
            Entry::Continuation { back: 77 },
        ] {
            assert_eq!(Entry::decode(e.encode()), Some(e));
        }
        assert_eq!(Entry::decode(u64::MAX), None);
        assert_eq!(
            Entry::decode(KIND_HEAD << KIND_SHIFT),
            None,
            "zero-length head"
        );
        assert_eq!(Entry::decode(1), None, "free word with garbage");
    }

    #[test]
    fn scan_finds_orphans_and_rejects_broken_extents() {
        let h = Entry::Head {
            tag: 3,
            segments: 3,
        }
        .encode();
        let c1 = Entry::Continuation { back: 1 }.encode();
        let c2 = Entry::Continuation { back: 2 }.encode();
        let s = scan(&[h, c1, c2, 0, c1, 0]).unwrap();
        assert_eq!(s.orphans, vec![4]);
        assert_eq!(s.free.free_count(), 3);
        // A continuation that reads free is written again; one that reads as anything else is damage.
        let s = scan(&[h, c1, 0, 0]).unwrap();
        assert_eq!(s.missing, vec![(2, 2)]);
        assert_eq!(s.free.free_count(), 1);
        assert_eq!(scan(&[h, 0, 0]).unwrap().missing, vec![(1, 1), (2, 2)]);
        assert!(
            scan(&[h, c2, c2]).is_err(),
            "a continuation naming another head"
        );
        assert!(scan(&[h, c1, h]).is_err(), "another head inside the extent");
        assert!(scan(&[h, c1]).is_err(), "runs past the end");
        assert!(scan(&[0xdead_beef]).is_err(), "garbage word");
    }

    proptest! {
        /// The free map agrees with a plain Vec<bool> model under random alloc/free.
        #[test]
        fn free_map_matches_model(ops in proptest::collection::vec((any::<bool>(), 1u64..6, any::<prop::sample::Index>()), 1..200)) {
            let n = 150;
            let mut fm = FreeMap::new(n);
            let mut model = vec![false; n as usize];
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, count, pick) in ops {
                if alloc || live.is_empty() {
                    let fits = |s: &u64| (*s..*s + count).all(|i| !model[i as usize]);
                    let highest = (0..=n.saturating_sub(count)).rev().find(fits);
                    prop_assert_eq!(fm.find_last(count), highest);
                    let high = count % 2 == 0;
                    // Now and then a run is kept out of low allocations for a while.
                    let kept = (pick.index(7) == 0).then(|| (pick.index(n as usize) as u64, count * 3));
                    let kept = kept.filter(|&(s, c)| s + c <= n && fm.keep(s, c));
                    let outside = |s: &u64| kept.is_none_or(|(k, c)| *s + count <= k || *s >= k + c);
                    let lowest = (0..=n.saturating_sub(count)).filter(outside).find(fits);
                    let (expect, got) = if high {
                        (highest, fm.find_last(count))
                    } else {
                        (lowest, fm.find(count))
                    };
                    fm.release_kept();
                    prop_assert_eq!(got, expect);
                    if let Some(s) = got {
                        fm.mark_used(s, count);
                        for i in s..s + count { model[i as usize] = true; }
                        live.push((s, count));
                    }
                } else {
                    let (s, c) = live.swap_remove(pick.index(live.len()));
                    fm.mark_free(s, c);
                    for i in s..s + c { model[i as usize] = false; }
                }
                prop_assert_eq!(fm.free_count(), model.iter().filter(|u| !**u).count() as u64);
            }
        }

        /// The prefaulter is handed the lowest free segments, each once, never a used or kept one, and no more than
        /// `ahead` of the first free ones.
        #[test]
        fn prefault_claims_match_model(ops in proptest::collection::vec((0u8..4, 1u64..6, any::<prop::sample::Index>()), 1..200)) {
            let n = 150;
            let mut fm = FreeMap::new(n);
            let mut used = vec![false; n as usize];
            let mut primed = vec![false; n as usize];
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (op, count, pick) in ops {
                match op {
                    0 | 1 => {
                        if let Some(s) = fm.find(count) {
                            fm.mark_used(s, count);
                            for i in s..s + count {
                                used[i as usize] = true;
                                primed[i as usize] = true;
                            }
                            live.push((s, count));
                        }
                    }
                    2 if !live.is_empty() => {
                        let (s, c) = live.swap_remove(pick.index(live.len()));
                        fm.mark_free(s, c);
                        for i in s..s + c { used[i as usize] = false; }
                    }
                    _ => {
                        let ahead = count * 2;
                        let kept = (pick.index(3) == 0).then(|| (pick.index(n as usize) as u64, count * 4));
                        let kept = kept.filter(|&(s, c)| s + c <= n && fm.keep(s, c));
                        let outside = |i: &u64| kept.is_none_or(|(k, c)| *i < k || *i >= k + c);
                        let expect: Vec<u64> = (0..n)
                            .filter(|&i| !used[i as usize])
                            .filter(outside)
                            .take(ahead as usize)
                            .filter(|&i| !primed[i as usize])
                            .collect();
                        let mut got = Vec::new();
                        fm.claim_unprimed_ahead(ahead, &mut got);
                        fm.release_kept();
                        prop_assert_eq!(&got, &expect);
                        for i in got { primed[i as usize] = true; }
                        let mut again = Vec::new();
                        fm.claim_unprimed_ahead(ahead, &mut again);
                        prop_assert!(kept.is_some() || again.is_empty(), "claimed twice: {:?}", again);
                        for i in again { primed[i as usize] = true; }
                    }
                }
            }
        }
    }
}
