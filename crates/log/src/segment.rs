//! A log segment: a pool extent holding one KV-node thread's entries in order.
//!
//! ```text
//! 0..8    magic "DNMSEG01"
//! 8..12   log_id u32
//! 12..16  reserved
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
        b
    }

    /// Decodes a header; `None` when the magic is wrong or the lengths are impossible.
    pub fn decode(b: &[u8]) -> Option<SegmentHeader> {
        if b.len() < SEGMENT_HEADER_LEN || b[0..8] != SEGMENT_MAGIC {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Op, encode_entry};

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
}
