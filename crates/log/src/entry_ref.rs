/// A pointer to a log entry in the pool: its offset and its length, packed in 64 bits so that the index can swap it
/// with one atomic store and a KV node can fetch the whole entry with one READ.
///
/// Bits 0..40 hold `offset / 8` (entries are 8-byte aligned; pools up to 8 TiB), bits 40..64 hold `len / 8`
/// (entries up to 128 MiB). Zero is the null reference (offset 0 is the superblock, never an entry).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EntryRef(u64);

const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

impl EntryRef {
    /// Largest pool offset an entry may start at.
    pub const MAX_OFFSET: u64 = OFFSET_MASK << 3;
    /// Largest entry length.
    pub const MAX_LEN: u64 = ((1u64 << (64 - OFFSET_BITS)) - 1) << 3;
    /// The null reference.
    pub const NULL: EntryRef = EntryRef(0);

    /// A reference to the entry of `len` bytes at `offset`; `None` when either is unaligned, zero or too large.
    pub fn new(offset: u64, len: u64) -> Option<EntryRef> {
        if offset == 0
            || offset % 8 != 0
            || len % 8 != 0
            || offset > Self::MAX_OFFSET
            || len > Self::MAX_LEN
        {
            return None;
        }
        Some(EntryRef((offset >> 3) | ((len >> 3) << OFFSET_BITS)))
    }

    /// Rebuilds a reference from its raw word (as stored in the index); `None` for the null word.
    pub fn from_raw(raw: u64) -> Option<EntryRef> {
        (raw != 0).then_some(EntryRef(raw))
    }

    /// The raw word.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// True for [`EntryRef::NULL`].
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// Pool offset of the entry.
    pub fn offset(self) -> u64 {
        (self.0 & OFFSET_MASK) << 3
    }

    /// Length of the entry in bytes (header, key, value and padding).
    pub fn len(self) -> u64 {
        (self.0 >> OFFSET_BITS) << 3
    }

    /// True when the entry has no bytes (only the null reference).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for EntryRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EntryRef({:#x}+{})", self.offset(), self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn packs_and_unpacks(off in 1u64..(EntryRef::MAX_OFFSET >> 3), len in 0u64..(EntryRef::MAX_LEN >> 3)) {
            let r = EntryRef::new(off << 3, len << 3).unwrap();
            prop_assert_eq!(r.offset(), off << 3);
            prop_assert_eq!(r.len(), len << 3);
            prop_assert_eq!(EntryRef::from_raw(r.raw()), Some(r));
        }
    }

    #[test]
    fn refuses_what_does_not_fit() {
        assert!(EntryRef::new(0, 8).is_none());
        assert!(EntryRef::new(12, 8).is_none());
        assert!(EntryRef::new(16, 12).is_none());
        assert!(EntryRef::new(EntryRef::MAX_OFFSET + 8, 8).is_none());
        assert!(EntryRef::new(8, EntryRef::MAX_LEN + 8).is_none());
        assert!(EntryRef::from_raw(0).is_none());
    }
}
