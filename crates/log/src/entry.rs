//! One logged write.
//!
//! ```text
//! 0..4    crc32c   over bytes 4..24 of the header, then key and value (not the padding): the commit marker
//! 4       op       1 = put, 2 = delete
//! 5       reserved 0
//! 6..8    key_len  u16 little-endian
//! 8..12   val_len  u32 little-endian (0 for a delete)
//! 12..16  log_id   u32: the log that wrote it
//! 16..24  seq      u64: position in that log; consecutive within a log, starting at 1
//! 24..    key, value, zero padding to a multiple of 8
//! ```
//! A torn or stale entry fails the CRC, the op check, the log id or the sequence check and is never served.

use thiserror::Error;

/// Length of an entry header.
pub const ENTRY_HEADER_LEN: usize = 24;

/// What an entry does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Set the key to the value (insert or update).
    Put = 1,
    /// Remove the key.
    Delete = 2,
}

/// Why bytes are not a valid entry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EntryError {
    /// Fewer bytes than the header or than the lengths it announces.
    #[error("entry truncated: {have} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        have: usize,
        /// Bytes the entry needs.
        need: usize,
    },
    /// The op byte is not a known operation (never-written space reads as op 0).
    #[error("unknown entry op {0}")]
    BadOp(u8),
    /// The checksum does not match: a torn or overwritten entry.
    #[error("entry checksum mismatch")]
    BadChecksum,
}

/// Total bytes an entry with these lengths occupies (header, key, value, padding to 8).
#[inline]
pub const fn entry_len(key_len: usize, value_len: usize) -> usize {
    (ENTRY_HEADER_LEN + key_len + value_len + 7) & !7
}

/// The fixed fields of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Operation.
    pub op: Op,
    /// Key length.
    pub key_len: u16,
    /// Value length.
    pub value_len: u32,
    /// Log that wrote the entry.
    pub log_id: u32,
    /// Sequence number within that log.
    pub seq: u64,
}

impl EntryHeader {
    /// Bytes of the whole entry.
    pub fn entry_len(&self) -> usize {
        entry_len(self.key_len as usize, self.value_len as usize)
    }

    /// Reads the header fields without checking the CRC (which needs the payload).
    pub fn parse(bytes: &[u8]) -> Result<EntryHeader, EntryError> {
        let h: &[u8; ENTRY_HEADER_LEN] = bytes
            .get(..ENTRY_HEADER_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or(EntryError::Truncated {
                have: bytes.len(),
                need: ENTRY_HEADER_LEN,
            })?;
        let op = match h[4] {
            1 => Op::Put,
            2 => Op::Delete,
            other => return Err(EntryError::BadOp(other)),
        };
        Ok(EntryHeader {
            op,
            key_len: u16::from_le_bytes([h[6], h[7]]),
            value_len: u32::from_le_bytes([h[8], h[9], h[10], h[11]]),
            log_id: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
            seq: u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// A validated entry borrowed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryView<'a> {
    /// The fixed fields.
    pub header: EntryHeader,
    /// The key.
    pub key: &'a [u8],
    /// The value (empty for a delete).
    pub value: &'a [u8],
}

impl<'a> EntryView<'a> {
    /// Parses and checks the entry at the start of `bytes` (which may continue past it).
    pub fn parse(bytes: &'a [u8]) -> Result<EntryView<'a>, EntryError> {
        let header = EntryHeader::parse(bytes)?;
        let key_end = ENTRY_HEADER_LEN + header.key_len as usize;
        let value_end = key_end + header.value_len as usize;
        if bytes.len() < value_end {
            return Err(EntryError::Truncated {
                have: bytes.len(),
                need: value_end,
            });
        }
        let stored = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&bytes[4..value_end]) != stored {
            return Err(EntryError::BadChecksum);
        }
        Ok(EntryView {
            header,
            key: &bytes[ENTRY_HEADER_LEN..key_end],
            value: &bytes[key_end..value_end],
        })
    }

    /// Bytes of the whole entry, padding included.
    pub fn len(&self) -> usize {
        self.header.entry_len()
    }

    /// Never true: an entry has at least a header.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Appends an entry to `out` (which should be 8-byte aligned in length for the entry to be aligned in its segment)
/// and returns its length. Key and value lengths are checked by the caller against its limits; this refuses only
/// what the format cannot hold.
///
/// # Panics
/// When the key is longer than `u16::MAX` or the value longer than `u32::MAX` bytes: callers enforce smaller
/// configured limits first.
pub fn encode_entry(
    out: &mut Vec<u8>,
    op: Op,
    log_id: u32,
    seq: u64,
    key: &[u8],
    value: &[u8],
) -> usize {
    let key_len =
        u16::try_from(key.len()).expect("key length checked against the configured limit");
    let value_len =
        u32::try_from(value.len()).expect("value length checked against the configured limit");
    let start = out.len();
    let len = entry_len(key.len(), value.len());
    out.extend_from_slice(&[0; 4]);
    out.push(op as u8);
    out.push(0);
    out.extend_from_slice(&key_len.to_le_bytes());
    out.extend_from_slice(&value_len.to_le_bytes());
    out.extend_from_slice(&log_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    out.resize(start + len, 0);
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(key in proptest::collection::vec(any::<u8>(), 0..300),
                       value in proptest::collection::vec(any::<u8>(), 0..2000),
                       delete in any::<bool>(), log_id in any::<u32>(), seq in any::<u64>(), lead in 0usize..4) {
            let mut buf = vec![0u8; lead * 8];
            let op = if delete { Op::Delete } else { Op::Put };
            let len = encode_entry(&mut buf, op, log_id, seq, &key, &value);
            prop_assert_eq!(len % 8, 0);
            prop_assert_eq!(buf.len(), lead * 8 + len);
            let v = EntryView::parse(&buf[lead * 8..]).unwrap();
            prop_assert_eq!(v.header.op, op);
            prop_assert_eq!(v.header.log_id, log_id);
            prop_assert_eq!(v.header.seq, seq);
            prop_assert_eq!(v.key, &key[..]);
            prop_assert_eq!(v.value, &value[..]);
            prop_assert_eq!(v.len(), len);
        }

        #[test]
        fn any_flipped_bit_is_caught(key in proptest::collection::vec(any::<u8>(), 0..40),
                                     value in proptest::collection::vec(any::<u8>(), 0..100),
                                     bit in any::<proptest::sample::Index>()) {
            let mut buf = Vec::new();
            encode_entry(&mut buf, Op::Put, 3, 9, &key, &value);
            let payload_bits = (ENTRY_HEADER_LEN + key.len() + value.len()) * 8;
            let b = bit.index(payload_bits);
            buf[b / 8] ^= 1 << (b % 8);
            prop_assert!(EntryView::parse(&buf).is_err());
        }

        #[test]
        fn truncation_is_caught(value in proptest::collection::vec(any::<u8>(), 1..100), cut in any::<proptest::sample::Index>()) {
            let mut buf = Vec::new();
            encode_entry(&mut buf, Op::Put, 1, 1, b"key", &value);
            let keep = cut.index(ENTRY_HEADER_LEN + 3 + value.len());
            prop_assert!(EntryView::parse(&buf[..keep]).is_err());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = EntryView::parse(&bytes);
        }
    }

    #[test]
    fn zeroed_space_is_not_an_entry() {
        assert_eq!(EntryView::parse(&[0u8; 64]), Err(EntryError::BadOp(0)));
    }
}
