//! A log segment: a pool extent holding one KV-node thread's entries in order.
//!
//! ```text
//! 0..8    magic "DNMSEG01"
//! 8..12   log_id u32
//! 12..16  crc32c u32 over log_id, first_seq and capacity: the fields written once, when the segment is formatted
//! 16..24  first_seq u64: sequence number of the first entry
//! 24..32  older u64: pool offset of the previous segment of the same log (0: none)
//! 32..40  sealed_len u64: bytes of entries, once the writer moved on (0 while open)
//! 40..48  capacity u64: bytes of the segment, header included
//! 48..64  reserved
//! 64..    entries
//! ```
//! Only the memory node writes the header, so its bookkeeping is never overwritten by a KV node's WRITE. Entries are
//! written by the owning KV node only; a segment reused after recycling may still hold older entries past the new
//! ones, which [`scan`] rejects by log id and sequence number.

use crate::entry::{EntryError, EntryView};

/// Bytes before the first entry.
pub const SEGMENT_HEADER_LEN: usize = 64;
/// Magic at the start of every segment header.
pub const SEGMENT_MAGIC: [u8; 8] = *b"DNMSEG01";

/// Byte offsets of the header fields (each an aligned u64 or u32 that the memory node updates in place).
pub mod field {
    /// `log_id`.
    pub const LOG_ID: u64 = 8;
    /// `first_seq`.
    pub const FIRST_SEQ: u64 = 16;
    /// `older`.
    pub const OLDER: u64 = 24;
    /// `sealed_len`.
    pub const SEALED_LEN: u64 = 32;
    /// `capacity`.
    pub const CAPACITY: u64 = 40;
}

/// The decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Log that owns the segment.
    pub log_id: u32,
    /// Sequence number of the first entry.
    pub first_seq: u64,
    /// Previous segment of the log (0: none).
    pub older: u64,
    /// Bytes of entries once sealed (0 while open).
    pub sealed_len: u64,
    /// Size of the segment with its header.
    pub capacity: u64,
}

impl SegmentHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&self.log_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.older.to_le_bytes());
        b[32..40].copy_from_slice(&self.sealed_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.capacity.to_le_bytes());
        let crc = fixed_fields_crc(&b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header; `None` when the magic or the checksum is wrong or the lengths are impossible.
    pub fn decode(b: &[u8]) -> Option<SegmentHeader> {
        if b.len() < SEGMENT_HEADER_LEN || b[0..8] != SEGMENT_MAGIC {
            return None;
        }
        // A damaged first_seq would make every entry look out of sequence, and the segment would read as empty.
        if u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) != fixed_fields_crc(b) {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let h = SegmentHeader {
            log_id: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            first_seq: u64_at(16),
            older: u64_at(24),
            sealed_len: u64_at(32),
            capacity: u64_at(40),
        };
        let room = h.capacity.checked_sub(SEGMENT_HEADER_LEN as u64)?;
        (h.sealed_len <= room).then_some(h)
    }

    /// Bytes available for entries.
    pub fn data_capacity(&self) -> u64 {
        self.capacity - SEGMENT_HEADER_LEN as u64
    }
}

/// The checksum of the header fields written once (`log_id`, `first_seq`, `capacity`); `older` and `sealed_len`
/// change in place, each with one aligned 8-byte store.
fn fixed_fields_crc(b: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&b[8..12]);
    let crc = crc32c::crc32c_append(crc, &b[16..24]);
    crc32c::crc32c_append(crc, &b[40..48])
}

/// Where a scan of a segment's entries stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// Every byte up to the given limit was a valid entry.
    Complete,
    /// Stopped at this byte offset (within the entry area) because the bytes there are not the next entry.
    Stopped {
        /// Offset of the first byte that is not a valid next entry.
        at: usize,
        /// Why.
        reason: StopReason,
    },
}

/// Why a scan stopped before the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The bytes are not an entry (torn, never written, truncated).
    Invalid(EntryError),
    /// A valid entry, but of another log: left over from an earlier use of the segment.
    ForeignLog(u32),
    /// A valid entry of this log, but not the next sequence number: left over from an earlier use.
    OutOfSequence {
        /// The sequence number the scan expected.
        expected: u64,
        /// The one it found.
        found: u64,
    },
}

/// Walks the entries in `data` (a segment's entry area) that belong to `log_id` and continue the sequence from
/// `first_seq`, calling `visit(offset_in_data, entry)` for each; returns where and why it stopped.
pub fn scan(
    data: &[u8],
    log_id: u32,
    first_seq: u64,
    mut visit: impl FnMut(usize, &EntryView<'_>),
) -> (usize, ScanEnd) {
    let mut at = 0;
    let mut expected = first_seq;
    while at < data.len() {
        let e = match EntryView::parse(&data[at..]) {
            Ok(e) => e,
            Err(err) => {
                return (
                    at,
                    ScanEnd::Stopped {
                        at,
                        reason: StopReason::Invalid(err),
                    },
                );
            }
        };
        if e.header.log_id != log_id {
            return (
                at,
                ScanEnd::Stopped {
                    at,
                    reason: StopReason::ForeignLog(e.header.log_id),
                },
            );
        }
        if e.header.seq != expected {
            return (
                at,
                ScanEnd::Stopped {
                    at,
                    reason: StopReason::OutOfSequence {
                        expected,
                        found: e.header.seq,
                    },
                },
            );
        }
        visit(at, &e);
        at += e.len();
        // The last sequence number ends the log: nothing can follow it.
        let Some(next) = expected.checked_add(1) else {
            return (at, ScanEnd::Complete);
        };
        expected = next;
    }
    (at, ScanEnd::Complete)
}

/// A stretch of a segment's entry area that holds no valid entry of the log although later bytes do: damage (the
/// entries there are lost), or, in a segment whose writer died, a write that completed out of order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// Offset of the stretch within the entry area.
    pub at: usize,
    /// Its length: the next valid entry starts at `at + len`.
    pub len: usize,
    /// Why its first bytes are not the next entry.
    pub reason: StopReason,
}

/// What [`scan_through`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanThrough {
    /// One past the last valid entry.
    pub end: usize,
    /// Stretches skipped before `end`, in order.
    pub gaps: Vec<Gap>,
    /// Why the bytes from `end` on hold no further entry ([`ScanEnd::Complete`] when `end` is the limit).
    pub tail: ScanEnd,
}

/// Like [`scan`], but a stretch that is not a valid next entry does not end the walk when a valid entry of the log
/// follows it: the walk goes on from that entry, and the stretch is reported as a [`Gap`]. So damage in the middle of
/// a segment costs the entries it hit, not every entry after it.
///
/// The entry found after a stretch must belong to `log_id` and carry a sequence number past the last one visited,
/// no further past it than the stretch could hold entries (each takes at least a header): entries left over from an
/// earlier use of the segment have lower numbers or another log's id, and are never taken.
pub fn scan_through(
    data: &[u8],
    log_id: u32,
    first_seq: u64,
    mut visit: impl FnMut(usize, &EntryView<'_>),
) -> ScanThrough {
    let mut gaps = Vec::new();
    let mut start = 0;
    let mut expected = first_seq;
    loop {
        let mut next = None;
        let (end, how) = scan(&data[start..], log_id, expected, |at, e| {
            next = e.header.seq.checked_add(1);
            visit(start + at, e);
        });
        let end = start + end;
        let reason = match how {
            ScanEnd::Complete => {
                return ScanThrough {
                    end,
                    gaps,
                    tail: ScanEnd::Complete,
                };
            }
            ScanEnd::Stopped { reason, .. } => reason,
        };
        // (An entry numbered u64::MAX completes the scan, so a stop after visited entries always has a next.)
        if let Some(n) = next {
            expected = n;
        }
        match next_entry_after(data, end, log_id, expected) {
            Some((at, seq)) => {
                gaps.push(Gap {
                    at: end,
                    len: at - end,
                    reason,
                });
                start = at;
                expected = seq;
            }
            None => {
                return ScanThrough {
                    end,
                    gaps,
                    tail: ScanEnd::Stopped { at: end, reason },
                };
            }
        }
    }
}

/// The first valid entry of `log_id` after `from` (8-byte aligned, as entries are) whose sequence number is at least
/// `expected` and could follow it: at most one more per header's worth of bytes skipped. Its offset and number.
fn next_entry_after(data: &[u8], from: usize, log_id: u32, expected: u64) -> Option<(usize, u64)> {
    let mut at = from + 8;
    while at + crate::ENTRY_HEADER_LEN <= data.len() {
        let h = &data[at..];
        let id = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        let skipped = ((at - from) / crate::ENTRY_HEADER_LEN) as u64;
        if id == log_id
            && seq >= expected
            && seq - expected <= skipped
            && EntryView::parse(h).is_ok()
        {
            return Some((at, seq));
        }
        at += 8;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{ENTRY_HEADER_LEN, Op, encode_entry};

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = SegmentHeader {
            log_id: 7,
            first_seq: 42,
            older: 4096,
            sealed_len: 100,
            capacity: 1 << 20,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()), Some(h));
        assert_eq!(SegmentHeader::decode(&[0u8; 64]), None);
        // Any flipped bit of a field written once is refused; the fields changed in place are not covered.
        for byte in (8..12).chain(12..16).chain(16..24).chain(40..48) {
            let mut b = h.encode();
            b[byte] ^= 0x04;
            assert_eq!(SegmentHeader::decode(&b), None, "byte {byte}");
        }
        let mut b = h.encode();
        b[field::OLDER as usize..][..8].copy_from_slice(&8192u64.to_le_bytes());
        b[field::SEALED_LEN as usize..][..8].copy_from_slice(&200u64.to_le_bytes());
        assert_eq!(
            SegmentHeader::decode(&b),
            Some(SegmentHeader {
                older: 8192,
                sealed_len: 200,
                ..h
            })
        );
        let bad = SegmentHeader {
            sealed_len: 1 << 21,
            ..h
        };
        assert_eq!(SegmentHeader::decode(&bad.encode()), None);
    }

    #[test]
    fn the_last_sequence_number_ends_a_scan() {
        // Sequence numbers come from the pool, which any client may write: an entry numbered u64::MAX is valid,
        // and nothing can follow it.
        let mut data = Vec::new();
        encode_entry(&mut data, Op::Put, 1, u64::MAX, b"k", b"v");
        let first_len = data.len();
        encode_entry(&mut data, Op::Put, 1, 0, b"k2", b"v2");
        let mut seen = Vec::new();
        let (end, how) = scan(&data, 1, u64::MAX, |_, e| seen.push(e.header.seq));
        assert_eq!(seen, vec![u64::MAX]);
        assert_eq!((end, how), (first_len, ScanEnd::Complete));
    }

    #[test]
    fn scan_stops_at_stale_entries_of_an_earlier_use() {
        // An earlier use of the segment by log 9 left entries with seq 50.., then log 3 wrote seq 1 and 2 over it.
        let mut old = Vec::new();
        for s in 50..60 {
            encode_entry(&mut old, Op::Put, 9, s, b"old", b"value");
        }
        let mut new = Vec::new();
        encode_entry(&mut new, Op::Put, 3, 1, b"old", b"value");
        encode_entry(&mut new, Op::Put, 3, 2, b"old", b"value");
        let mut data = old.clone();
        data[..new.len()].copy_from_slice(&new);
        let mut seen = Vec::new();
        let (end, why) = scan(&data, 3, 1, |_, e| seen.push(e.header.seq));
        assert_eq!(seen, vec![1, 2]);
        assert_eq!(end, new.len());
        assert_eq!(
            why,
            ScanEnd::Stopped {
                at: new.len(),
                reason: StopReason::ForeignLog(9)
            }
        );

        // Same log, older sequence numbers left behind.
        let mut old = Vec::new();
        for s in 1..10 {
            encode_entry(&mut old, Op::Put, 3, s, b"k", b"v");
        }
        let mut new = Vec::new();
        encode_entry(&mut new, Op::Put, 3, 20, b"k", b"v");
        old[..new.len()].copy_from_slice(&new);
        let (end, why) = scan(&old, 3, 20, |_, _| {});
        assert_eq!(end, new.len());
        assert_eq!(
            why,
            ScanEnd::Stopped {
                at: new.len(),
                reason: StopReason::OutOfSequence {
                    expected: 21,
                    found: 2
                }
            }
        );
    }

    #[test]
    fn scan_stops_at_a_torn_entry() {
        let mut data = Vec::new();
        encode_entry(&mut data, Op::Put, 1, 1, b"a", b"1");
        let first = data.len();
        encode_entry(&mut data, Op::Put, 1, 2, b"b", &[7; 100]);
        data[first + 40] ^= 0xff;
        data.extend_from_slice(&[0; 64]);
        let (end, why) = scan(&data, 1, 1, |_, _| {});
        assert_eq!(end, first);
        assert!(matches!(
            why,
            ScanEnd::Stopped {
                reason: StopReason::Invalid(EntryError::BadChecksum),
                ..
            }
        ));
    }

    /// Entries of log 1 numbered from `first`, with keys `k<seq>` and values of varying length: the bytes and where
    /// each entry starts.
    fn log_of(first: u64, n: u64) -> (Vec<u8>, Vec<usize>) {
        let mut data = Vec::new();
        let mut starts = Vec::new();
        for seq in first..first + n {
            starts.push(data.len());
            let value = vec![seq as u8; (seq as usize * 13) % 70];
            encode_entry(
                &mut data,
                Op::Put,
                1,
                seq,
                format!("k{seq}").as_bytes(),
                &value,
            );
        }
        (data, starts)
    }

    #[test]
    fn scan_through_steps_over_a_damaged_entry_and_keeps_the_rest() {
        let (mut data, starts) = log_of(1, 6);
        data[starts[2] + 30] ^= 0x10;
        data.extend_from_slice(&[0; 40]);
        let mut seen = Vec::new();
        let found = scan_through(&data, 1, 1, |at, e| seen.push((at, e.header.seq)));
        assert_eq!(
            seen,
            vec![
                (starts[0], 1),
                (starts[1], 2),
                (starts[3], 4),
                (starts[4], 5),
                (starts[5], 6)
            ]
        );
        assert_eq!(
            found.gaps,
            vec![Gap {
                at: starts[2],
                len: starts[3] - starts[2],
                reason: StopReason::Invalid(EntryError::BadChecksum)
            }]
        );
        assert_eq!(found.end, data.len() - 40);
        assert!(matches!(
            found.tail,
            ScanEnd::Stopped {
                reason: StopReason::Invalid(EntryError::BadOp(0)),
                ..
            }
        ));
        // The strict scan stops at the damage.
        assert_eq!(scan(&data, 1, 1, |_, _| {}).0, starts[2]);
    }

    #[test]
    fn scan_through_never_takes_entries_of_an_earlier_use() {
        // Log 1 used the segment before, up to seq 40; now it writes seq 100 and 101 over the start, and a damaged
        // 102 ends it. What lies beyond is older and must not be taken for entries after the damage.
        let (mut data, _) = log_of(30, 11);
        let (new, new_starts) = log_of(100, 3);
        data[..new.len()].copy_from_slice(&new);
        data[new_starts[2] + 4] ^= 1;
        let mut seen = Vec::new();
        let found = scan_through(&data, 1, 100, |_, e| seen.push(e.header.seq));
        assert_eq!(seen, vec![100, 101]);
        assert!(found.gaps.is_empty());
        assert_eq!(found.end, new_starts[2]);
        // Nor another log's entries.
        let mut other = Vec::new();
        encode_entry(&mut other, Op::Put, 1, 1, b"a", b"b");
        let first = other.len();
        encode_entry(&mut other, Op::Put, 1, 2, b"a", b"b");
        other[first + 1] ^= 1;
        encode_entry(&mut other, Op::Put, 2, 3, b"a", b"b");
        let found = scan_through(&other, 1, 1, |_, _| {});
        assert_eq!((found.end, found.gaps.len()), (first, 0));
    }

    #[test]
    fn scan_through_does_not_take_a_number_the_gap_cannot_explain() {
        // Seq 2 is damaged; the entry after it claims seq 50, more than the skipped bytes could have held.
        let mut data = Vec::new();
        encode_entry(&mut data, Op::Put, 1, 1, b"a", b"1");
        let second = data.len();
        encode_entry(&mut data, Op::Put, 1, 2, b"b", b"2");
        encode_entry(&mut data, Op::Put, 1, 50, b"c", b"3");
        data[second] ^= 1;
        let found = scan_through(&data, 1, 1, |_, _| {});
        assert_eq!((found.end, found.gaps.len()), (second, 0));
    }

    proptest::proptest! {
        /// Whatever bits are flipped, the walk visits, in order, exactly the entries whose checksummed bytes are
        /// intact: a damaged entry costs itself only. Undamaged, it is the strict scan.
        #[test]
        fn scan_through_keeps_every_intact_entry(
            n in 1u64..40,
            flips in proptest::collection::vec((0usize..4000, 0u8..8), 0..6),
        ) {
            let (mut data, starts) = log_of(1, n);
            let pristine = data.clone();
            for (at, bit) in flips {
                let at = at % data.len();
                data[at] ^= 1 << bit;
            }
            // An entry is damaged when a flip hit what its checksum covers (its padding is not covered).
            let covered = |i: usize| {
                let e = EntryView::parse(&pristine[starts[i]..]).expect("pristine entry");
                starts[i]..starts[i] + ENTRY_HEADER_LEN + e.key.len() + e.value.len()
            };
            let intact: Vec<(usize, u64)> = (0..starts.len())
                .filter(|&i| data[covered(i)] == pristine[covered(i)])
                .map(|i| (starts[i], i as u64 + 1))
                .collect();
            let mut seen = Vec::new();
            let found = scan_through(&data, 1, 1, |at, e| seen.push((at, e.header.seq)));
            proptest::prop_assert_eq!(&seen, &intact);
            if intact.len() == starts.len() {
                proptest::prop_assert!(found.gaps.is_empty());
                proptest::prop_assert_eq!(found.end, pristine.len());
            }
        }
    }
}
