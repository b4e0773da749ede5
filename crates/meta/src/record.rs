//! On-pool format of the cluster record.
//!
//! ```text
//! root slot CLUSTER_META_ROOT ──► header allocation (tag 0x30)
//!   0    magic "DNMOMETA"
//!   8    format version (u32 LE)
//!   12   CRC32C of bytes 0..12
//!   64   slot A ┐ each: version u64 | blob offset u64 | blob length u64 | blob CRC32C u32 | slot CRC32C u32
//!   128  slot B ┘      (slot CRC over the first 28 bytes; all zero = never written)
//! blob allocations (tag 0x30): the record bytes
//! ```
//!
//! A store writes and persists a new blob, then writes and persists the slot that does not hold the current record
//! (the commit point), then frees the blob that slot used to point at. Each slot keeps its blob, so the previous
//! record stays readable until the next store: a slot torn by a crash fails its CRC and the other slot wins, and a
//! damaged newest record falls back to the one before it.

/// First bytes of the header.
pub(crate) const MAGIC: [u8; 8] = *b"DNMOMETA";
/// Header format this build reads and writes.
pub(crate) const FORMAT: u32 = 1;
/// Bytes of the header that are used.
pub(crate) const HEADER_LEN: usize = 192;
/// Offsets of the two slots inside the header (each on its own cache line).
pub(crate) const SLOT_OFFSETS: [usize; 2] = [64, 128];
/// Bytes of one slot.
pub(crate) const SLOT_LEN: usize = 32;

/// What one slot says about a committed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotInfo {
    /// Version of the record (never 0).
    pub version: u64,
    /// Pool offset of the blob.
    pub offset: u64,
    /// Length of the record in bytes.
    pub len: u64,
    /// CRC32C of the record bytes.
    pub crc: u32,
}

/// A slot as read from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Never written.
    Empty,
    /// Fails its checksum: a write torn by a crash, or damage.
    Torn,
    /// A committed record (its blob still has to be checked).
    Written(SlotInfo),
}

/// The fixed start of a new header: magic, format, checksum; zeros up to the slots.
pub(crate) fn new_header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    let crc = crc32c::crc32c(&h[..12]);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks the fixed start of a header read from the pool.
pub(crate) fn check_header(h: &[u8]) -> Result<(), String> {
    if h.len() < HEADER_LEN {
        return Err(format!("header of {} bytes is too short", h.len()));
    }
    if h[..8] != MAGIC {
        return Err("bad magic in the cluster-metadata header".into());
    }
    let crc = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default());
    if crc != crc32c::crc32c(&h[..12]) {
        return Err("cluster-metadata header fails its checksum".into());
    }
    let format = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    if format != FORMAT {
        return Err(format!(
            "cluster-metadata format {format} is not supported (this build reads {FORMAT})"
        ));
    }
    Ok(())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The bytes of a slot describing `info`.
pub(crate) fn encode_slot(info: &SlotInfo) -> [u8; SLOT_LEN] {
    let mut s = [0u8; SLOT_LEN];
    s[0..8].copy_from_slice(&info.version.to_le_bytes());
    s[8..16].copy_from_slice(&info.offset.to_le_bytes());
    s[16..24].copy_from_slice(&info.len.to_le_bytes());
    s[24..28].copy_from_slice(&info.crc.to_le_bytes());
    let crc = crc32c::crc32c(&s[..28]);
    s[28..32].copy_from_slice(&crc.to_le_bytes());
    s
}

/// Reads slot `i` (0 or 1) of a header.
pub(crate) fn decode_slot(header: &[u8], i: usize) -> Slot {
    let s = &header[SLOT_OFFSETS[i]..SLOT_OFFSETS[i] + SLOT_LEN];
    if s.iter().all(|&b| b == 0) {
        return Slot::Empty;
    }
    if u32_at(s, 28) != crc32c::crc32c(&s[..28]) {
        return Slot::Torn;
    }
    let info = SlotInfo {
        version: u64_at(s, 0),
        offset: u64_at(s, 8),
        len: u64_at(s, 16),
        crc: u32_at(s, 24),
    };
    if info.version == 0 {
        return Slot::Torn;
    }
    Slot::Written(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_detect_damage() {
        let info = SlotInfo {
            version: 9,
            offset: 1 << 20,
            len: 77,
            crc: 0xdead_beef,
        };
        let mut h = new_header();
        assert!(check_header(&h).is_ok());
        assert_eq!(decode_slot(&h, 0), Slot::Empty);
        assert_eq!(decode_slot(&h, 1), Slot::Empty);
        h[SLOT_OFFSETS[1]..SLOT_OFFSETS[1] + SLOT_LEN].copy_from_slice(&encode_slot(&info));
        assert_eq!(decode_slot(&h, 1), Slot::Written(info));
        for byte in 0..SLOT_LEN {
            let mut d = h;
            d[SLOT_OFFSETS[1] + byte] ^= 0x40;
            assert_eq!(decode_slot(&d, 1), Slot::Torn, "byte {byte}");
        }
        let zero = SlotInfo { version: 0, ..info };
        h[SLOT_OFFSETS[0]..SLOT_OFFSETS[0] + SLOT_LEN].copy_from_slice(&encode_slot(&zero));
        assert_eq!(decode_slot(&h, 0), Slot::Torn);
    }

    #[test]
    fn header_checks() {
        let h = new_header();
        for byte in 0..16 {
            let mut d = h;
            d[byte] ^= 1;
            assert!(check_header(&d).is_err(), "byte {byte}");
        }
        assert!(check_header(&h[..100]).is_err());
        let mut other = h;
        other[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&other[..12]);
        other[12..16].copy_from_slice(&crc.to_le_bytes());
        assert!(check_header(&other).unwrap_err().contains("format 2"));
    }
}
