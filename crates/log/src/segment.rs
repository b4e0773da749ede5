//! A log segment: a pool extent holding one KV-node thread's entries in order.
//!
//! ```text
//! 0..8    magic "DNMSEG02" ("DNMSEG01": a segment formatted before the in-place fields carried a check)
//! 8..12   log_id u32
//! 12..16  crc32c u32 over log_id, first_seq and capacity: the fields written once, when the segment is formatted
//! 16..24  first_seq u64: sequence number of the first entry
//! 24..32  older: pool offset of the previous segment of the same log (0: none)
//! 32..40  sealed_len: bytes of entries, once the writer moved on (0 while open)
//! 40..48  capacity u64: bytes of the segment, header included
//! 48..56  stepped_over: bytes without a valid entry that a start stepped over when it sealed the segment after a
//!         crash (writes the crash cut short, or damage it reported then); 0, a zero word, when none
//! 56..64  reserved
//! 64..    entries
//! ```
//! Only the memory node writes the header, so its bookkeeping is never overwritten by a KV node's WRITE. Entries are
//! written by the owning KV node only; a segment reused after recycling may still hold older entries past the new
//! ones, which [`scan`] rejects by log id and sequence number.
//!
//! `older`, `sealed_len` and `stepped_over` change in place, each with one aligned 8-byte store, so a crash leaves
//! either the old or the new word. In a `DNMSEG02` segment each word carries its own check: the value in the low 48
//! bits (pool offsets and lengths are below 2^48, [`MAX_FIELD_VALUE`]) and 16 check bits above it, which find every
//! one- and two-bit flip of the word. A `DNMSEG01` segment's words are plain values; such segments are still read and written as
//! they are.

use crate::entry::{EntryError, EntryView};

/// Bytes before the first entry.
pub const SEGMENT_HEADER_LEN: usize = 64;
/// Magic at the start of every segment header this version formats.
pub const SEGMENT_MAGIC: [u8; 8] = *b"DNMSEG02";
/// Magic of segments formatted by earlier versions, whose in-place fields carry no check.
pub const SEGMENT_MAGIC_UNCHECKED: [u8; 8] = *b"DNMSEG01";
/// The largest value an in-place field of a checked segment holds (2^48 − 1: 256 TiB).
pub const MAX_FIELD_VALUE: u64 = (1 << VALUE_BITS) - 1;
const VALUE_BITS: u32 = 48;

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
    /// `stepped_over`.
    pub const STEPPED_OVER: u64 = 48;
}

/// How a segment stores its in-place fields, by its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFormat {
    /// `DNMSEG02`: each in-place word carries a check.
    Checked,
    /// `DNMSEG01`: plain words.
    Unchecked,
}

/// A header field the memory node changes in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// The link to the log's previous segment.
    Older,
    /// The length of the entries once sealed.
    SealedLen,
    /// The bytes a start stepped over when it sealed the segment after a crash.
    SteppedOver,
}

impl InPlace {
    /// Where the field lies in the header.
    pub fn offset(self) -> u64 {
        match self {
            InPlace::Older => field::OLDER,
            InPlace::SealedLen => field::SEALED_LEN,
            InPlace::SteppedOver => field::STEPPED_OVER,
        }
    }

    fn tag(self) -> u8 {
        match self {
            InPlace::Older => 1,
            InPlace::SealedLen => 2,
            InPlace::SteppedOver => 3,
        }
    }
}

/// An in-place field whose word fails its check (or, for a sealed length, exceeds the segment): its value is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DamagedField {
    /// The word as found.
    pub word: u64,
}

impl std::fmt::Display for DamagedField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the word {:#018x} fails its check", self.word)
    }
}

impl SegmentFormat {
    /// The magic of segments of this format.
    pub fn magic(self) -> [u8; 8] {
        match self {
            SegmentFormat::Checked => SEGMENT_MAGIC,
            SegmentFormat::Unchecked => SEGMENT_MAGIC_UNCHECKED,
        }
    }

    /// The format whose magic `magic` (a header's first 8 bytes) is; `None` when it is no segment's.
    pub fn of_magic(magic: &[u8]) -> Option<SegmentFormat> {
        [SegmentFormat::Checked, SegmentFormat::Unchecked]
            .into_iter()
            .find(|f| f.magic() == magic)
    }

    /// The word that stores `value` in `field`; `None` when a checked word cannot hold it (over
    /// [`MAX_FIELD_VALUE`]).
    pub fn word(self, field: InPlace, value: u64) -> Option<u64> {
        // A segment formatted before `stepped_over` holds zeros there, which read as none.
        if field == InPlace::SteppedOver && value == 0 {
            return Some(0);
        }
        match self {
            SegmentFormat::Unchecked => Some(value),
            SegmentFormat::Checked => (value <= MAX_FIELD_VALUE)
                .then(|| value | u64::from(check(field, value)) << VALUE_BITS),
        }
    }

    /// The value `word` stores in `field`.
    pub fn value(self, field: InPlace, word: u64) -> Result<u64, DamagedField> {
        if field == InPlace::SteppedOver && word == 0 {
            return Ok(0);
        }
        match self {
            SegmentFormat::Unchecked => Ok(word),
            SegmentFormat::Checked => {
                let value = word & MAX_FIELD_VALUE;
                if (word >> VALUE_BITS) as u16 == check(field, value) {
                    Ok(value)
                } else {
                    Err(DamagedField { word })
                }
            }
        }
    }
}

/// The check bits of `value` in `field`: CRC32C of the field's tag and the value's six bytes, folded to 16 bits.
/// The field's tag keeps one field's word from passing as the other's.
fn check(field: InPlace, value: u64) -> u16 {
    let mut b = [0u8; 7];
    b[0] = field.tag();
    b[1..].copy_from_slice(&value.to_le_bytes()[..6]);
    let crc = crc32c::crc32c(&b);
    (crc ^ (crc >> 16)) as u16
}

/// The decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// How the in-place fields are stored.
    pub format: SegmentFormat,
    /// Log that owns the segment.
    pub log_id: u32,
    /// Sequence number of the first entry.
    pub first_seq: u64,
    /// Previous segment of the log (0: none).
    pub older: Result<u64, DamagedField>,
    /// Bytes of entries once sealed (0 while open).
    pub sealed_len: Result<u64, DamagedField>,
    /// Size of the segment with its header.
    pub capacity: u64,
    /// Bytes without a valid entry that a start stepped over when it sealed the segment after a crash (0: none).
    pub stepped_over: Result<u64, DamagedField>,
}

impl SegmentHeader {
    /// The header of a segment being formatted now: open, in the checked format.
    pub fn open(log_id: u32, first_seq: u64, older: u64, capacity: u64) -> SegmentHeader {
        SegmentHeader {
            format: SegmentFormat::Checked,
            log_id,
            first_seq,
            older: Ok(older),
            sealed_len: Ok(0),
            capacity,
            stepped_over: Ok(0),
        }
    }

    /// Encodes the header; `None` when a checked in-place field cannot hold its value. A damaged field is written
    /// back as the word it was found as.
    pub fn encode(&self) -> Option<[u8; SEGMENT_HEADER_LEN]> {
        let word = |field, v: Result<u64, DamagedField>| match v {
            Ok(v) => self.format.word(field, v),
            Err(d) => Some(d.word),
        };
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[0..8].copy_from_slice(&self.format.magic());
        b[8..12].copy_from_slice(&self.log_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_seq.to_le_bytes());
        b[24..32].copy_from_slice(&word(InPlace::Older, self.older)?.to_le_bytes());
        b[32..40].copy_from_slice(&word(InPlace::SealedLen, self.sealed_len)?.to_le_bytes());
        b[40..48].copy_from_slice(&self.capacity.to_le_bytes());
        b[48..56].copy_from_slice(&word(InPlace::SteppedOver, self.stepped_over)?.to_le_bytes());
        let crc = fixed_fields_crc(&b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        Some(b)
    }

    /// Decodes a header; `None` when the magic or the checksum of the fields written once is wrong, or the capacity
    /// cannot hold a header. An in-place field that fails its check, or a sealed length beyond the segment, decodes
    /// as [`DamagedField`]: the rest of the header is still good.
    pub fn decode(b: &[u8]) -> Option<SegmentHeader> {
        if b.len() < SEGMENT_HEADER_LEN {
            return None;
        }
        let format = SegmentFormat::of_magic(&b[0..8])?;
        // A damaged first_seq would make every entry look out of sequence, and the segment would read as empty.
        if u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) != fixed_fields_crc(b) {
            return None;
        }
        let u64_at = |o: u64| {
            let o = o as usize;
            u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
        };
        let capacity = u64_at(field::CAPACITY);
        let room = capacity.checked_sub(SEGMENT_HEADER_LEN as u64)?;
        let sealed_word = u64_at(field::SEALED_LEN);
        let sealed_len = format
            .value(InPlace::SealedLen, sealed_word)
            .and_then(|len| {
                if len <= room {
                    Ok(len)
                } else {
                    Err(DamagedField { word: sealed_word })
                }
            });
        Some(SegmentHeader {
            format,
            log_id: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            first_seq: u64_at(field::FIRST_SEQ),
            older: format.value(InPlace::Older, u64_at(field::OLDER)),
            sealed_len,
            capacity,
            stepped_over: format.value(InPlace::SteppedOver, u64_at(field::STEPPED_OVER)),
        })
    }

    /// Bytes available for entries.
    pub fn data_capacity(&self) -> u64 {
        self.capacity - SEGMENT_HEADER_LEN as u64
    }
}

/// The checksum of the header fields written once (`log_id`, `first_seq`, `capacity`); `older` and `sealed_len`
/// change in place and carry their own checks.
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
    /// The sequence number the scan expected at `at`: the first entry the stretch held.
    pub expected_seq: u64,
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

impl ScanThrough {
    /// Bytes of all the gaps.
    pub fn gap_bytes(&self) -> u64 {
        self.gaps.iter().map(|g| g.len as u64).sum()
    }
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
                    expected_seq: expected,
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
            sealed_len: Ok(100),
            ..SegmentHeader::open(7, 42, 4096, 1 << 20)
        };
        let b = h.encode().unwrap();
        assert_eq!(&b[..8], b"DNMSEG02");
        assert_eq!(SegmentHeader::decode(&b), Some(h));
        assert_eq!(SegmentHeader::decode(&[0u8; 64]), None);
        assert_eq!(SegmentHeader::decode(&b[..63]), None);
        // Any flipped bit of the magic or of a field written once refuses the header.
        for byte in (0..8)
            .chain(8..12)
            .chain(12..16)
            .chain(16..24)
            .chain(40..48)
        {
            let mut b = b;
            b[byte] ^= 0x04;
            assert_eq!(SegmentHeader::decode(&b), None, "byte {byte}");
        }
        // One of an in-place field's word damages that field only.
        for bit in 0..64 {
            let mut b = b;
            b[field::OLDER as usize + bit / 8] ^= 1 << (bit % 8);
            let d = SegmentHeader::decode(&b).unwrap();
            assert!(d.older.is_err(), "bit {bit} of older");
            assert_eq!(d.sealed_len, Ok(100));
            let mut b = h.encode().unwrap();
            b[field::SEALED_LEN as usize + bit / 8] ^= 1 << (bit % 8);
            let d = SegmentHeader::decode(&b).unwrap();
            assert!(d.sealed_len.is_err(), "bit {bit} of sealed_len");
            assert_eq!(d.older, Ok(4096));
        }
        // A sealed length beyond the segment is damage too, with a valid check.
        let over = SegmentHeader {
            sealed_len: Ok(1 << 20),
            ..h
        };
        let word = SegmentFormat::Checked
            .word(InPlace::SealedLen, 1 << 20)
            .unwrap();
        assert_eq!(
            SegmentHeader::decode(&over.encode().unwrap())
                .unwrap()
                .sealed_len,
            Err(DamagedField { word })
        );
        // A damaged field encodes as the word it was found as.
        let mut b = b;
        b[field::OLDER as usize] ^= 1;
        let damaged = SegmentHeader::decode(&b).unwrap();
        assert_eq!(damaged.encode().unwrap(), b);
        // No bytes stepped over is a zero word (as in a segment formatted before the field); a count carries its
        // check, and a flipped bit of it damages that field only.
        let at = field::STEPPED_OVER as usize;
        assert_eq!(h.encode().unwrap()[at..at + 8], [0; 8]);
        let stepped = SegmentHeader {
            stepped_over: Ok(328),
            ..h
        };
        let b = stepped.encode().unwrap();
        assert_eq!(SegmentHeader::decode(&b), Some(stepped));
        for bit in 0..64 {
            let mut b = b;
            b[at + bit / 8] ^= 1 << (bit % 8);
            let d = SegmentHeader::decode(&b).unwrap();
            assert!(d.stepped_over.is_err(), "bit {bit} of stepped_over");
            assert_eq!((d.older, d.sealed_len), (Ok(4096), Ok(100)));
        }
    }

    #[test]
    fn the_memory_node_rewrites_in_place_fields_with_single_words() {
        let h = SegmentHeader::open(3, 1, 0, 1 << 16);
        let mut b = h.encode().unwrap();
        let f = SegmentFormat::Checked;
        assert_eq!(SegmentHeader::decode(&b).unwrap().sealed_len, Ok(0));
        // Neither word of a freshly formatted segment is zero: a zeroed word is damage, not "open" or "none".
        assert_ne!(f.word(InPlace::SealedLen, 0), Some(0));
        assert_ne!(f.word(InPlace::Older, 0), Some(0));
        let seal = f.word(InPlace::SealedLen, 4000).unwrap();
        b[field::SEALED_LEN as usize..][..8].copy_from_slice(&seal.to_le_bytes());
        let relink = f.word(InPlace::Older, 8192).unwrap();
        b[field::OLDER as usize..][..8].copy_from_slice(&relink.to_le_bytes());
        let d = SegmentHeader::decode(&b).unwrap();
        assert_eq!((d.older, d.sealed_len), (Ok(8192), Ok(4000)));
        // One field's word does not pass as the other's.
        b[field::OLDER as usize..][..8].copy_from_slice(&seal.to_le_bytes());
        assert!(SegmentHeader::decode(&b).unwrap().older.is_err());
        assert_eq!(f.word(InPlace::Older, MAX_FIELD_VALUE + 1), None);
        assert!(f.word(InPlace::Older, MAX_FIELD_VALUE).is_some());
    }

    #[test]
    fn every_one_and_two_bit_flip_of_a_checked_word_is_found() {
        let f = SegmentFormat::Checked;
        for field in [InPlace::Older, InPlace::SealedLen] {
            for value in [0, 1, 64, 4096, 0x1234_5678, 1 << 40, MAX_FIELD_VALUE] {
                let word = f.word(field, value).unwrap();
                assert_eq!(f.value(field, word), Ok(value));
                for i in 0..64 {
                    let one = word ^ (1 << i);
                    assert!(f.value(field, one).is_err(), "{field:?} {value}: bit {i}");
                    for j in i + 1..64 {
                        let two = one ^ (1 << j);
                        assert!(
                            f.value(field, two).is_err(),
                            "{field:?} {value}: bits {i} and {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn segments_of_the_unchecked_format_read_and_write_plain_words() {
        let h = SegmentHeader {
            format: SegmentFormat::Unchecked,
            older: Ok(8192),
            sealed_len: Ok(200),
            ..SegmentHeader::open(7, 42, 0, 1 << 20)
        };
        let b = h.encode().unwrap();
        assert_eq!(&b[..8], b"DNMSEG01");
        assert_eq!(
            u64::from_le_bytes(b[field::OLDER as usize..][..8].try_into().unwrap()),
            8192
        );
        assert_eq!(
            u64::from_le_bytes(b[field::SEALED_LEN as usize..][..8].try_into().unwrap()),
            200
        );
        assert_eq!(SegmentHeader::decode(&b), Some(h));
        assert_eq!(
            SegmentFormat::Unchecked.word(InPlace::Older, u64::MAX),
            Some(u64::MAX)
        );
        // Only a sealed length beyond the segment is seen as damage there.
        let over = SegmentHeader {
            sealed_len: Ok(1 << 21),
            ..h
        };
        assert!(
            SegmentHeader::decode(&over.encode().unwrap())
                .unwrap()
                .sealed_len
                .is_err()
        );
    }

    proptest::proptest! {
        #[test]
        fn checked_words_round_trip(value in 0..=MAX_FIELD_VALUE, older in proptest::bool::ANY) {
            let field = if older { InPlace::Older } else { InPlace::SealedLen };
            let f = SegmentFormat::Checked;
            let word = f.word(field, value).unwrap();
            proptest::prop_assert_eq!(word & MAX_FIELD_VALUE, value);
            proptest::prop_assert_eq!(f.value(field, word), Ok(value));
        }
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
                expected_seq: 3,
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
