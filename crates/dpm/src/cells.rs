//! Indirect cells of shared keys (paper §3.4, selective replication).
//!
//! A hot key may be owned by several KV nodes at once. Its value then lives behind an *indirect cell*: an 8-byte
//! word in the pool holding the [`dinomo_log::EntryRef`] of the key's newest log entry (0 = absent). Owners read
//! the cell and then the entry, and write by appending an entry to their own log and CASing the cell from the
//! reference they read to the new one. While a key is shared, merges leave it out of the index: the cell is the
//! only reference to its value.
//!
//! ```text
//! header (64 B): magic "DNMCELL1" | version u32 | slot size u32 | capacity u64 | crc32c u32
//! slot i (at 64 + slot_size·i):
//!   0..8    the cell: EntryRef word (0: absent; RETIRED: the value went back to the index)
//!   8       state: 0 free, 1 reserved, 2 active, 3 retired
//!   10..12  key length
//!   12..16  crc32c of state, key length and key
//!   16..    the key
//! ```
//! Only the processor writes the slots' descriptions; KV nodes READ and CAS the cells with one-sided verbs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dinomo_log::EntryRef;
use dinomo_pool::Pool;

use crate::ProcessorError;
use crate::table_header::{HEADER_LEN, TableKind};

const SLOT_HEADER_LEN: u64 = 16;

/// The cell word of a key whose value went back to the index: readers and writers that still hold an old routing
/// table see it and refuse the key, so they refresh their routing.
pub const RETIRED: u64 = u64::MAX;

/// Pool root slot of the cell table.
pub const ROOT: usize = 4;
/// Allocation tag of the cell table.
pub const TAG: u16 = 0x12;

const KIND: TableKind = TableKind {
    name: "cell table",
    magic: *b"DNMCELL1",
    version: 1,
    root: ROOT,
    tag: TAG,
};

/// Where a cell is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellState {
    /// Unused.
    Free = 0,
    /// Set aside for a key that is about to be shared; merges still put the key in the index.
    Reserved = 1,
    /// The key is shared: the cell holds its value and merges leave it out of the index.
    Active = 2,
    /// The key's value went back to the index; the slot is freed once the cluster record says so.
    Retired = 3,
}

impl CellState {
    fn from_byte(b: u8) -> Option<CellState> {
        Some(match b {
            0 => CellState::Free,
            1 => CellState::Reserved,
            2 => CellState::Active,
            3 => CellState::Retired,
            _ => return None,
        })
    }
}

/// What the processor knows about one used slot.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Slot number.
    pub slot: u32,
    /// The key.
    pub key: Vec<u8>,
    /// Its state.
    pub state: CellState,
    /// While active: the entry the cell pointed to when it was last looked at by a merge. The segment holding it
    /// must not be recycled; once the cell moves on, it counts as superseded.
    pub live: Option<EntryRef>,
}

/// The table of cells in the pool, and the used slots by key.
pub struct CellTable {
    pool: Arc<Pool>,
    offset: u64,
    slot_size: u64,
    capacity: u32,
    by_key: HashMap<Vec<u8>, u32>,
    slots: HashMap<u32, Cell>,
}

impl CellTable {
    /// Opens the table named by the root slot, or formats one with `capacity` slots for keys of up to `max_key`
    /// bytes.
    pub fn open_or_create(
        pool: Arc<Pool>,
        capacity: u32,
        max_key: u32,
    ) -> Result<CellTable, ProcessorError> {
        let offset = pool.root(ROOT)?;
        if offset != 0 {
            return CellTable::open(pool, offset);
        }
        if capacity == 0 {
            return Err(ProcessorError::Config(
                "shared_key_capacity must be at least 1".into(),
            ));
        }
        let slot_size = (SLOT_HEADER_LEN + max_key as u64).next_multiple_of(64);
        let offset = KIND.format(
            &pool,
            slot_size as u32,
            u64::from(capacity),
            capacity as u64 * slot_size,
        )?;
        Ok(CellTable {
            pool,
            offset,
            slot_size,
            capacity,
            by_key: HashMap::new(),
            slots: HashMap::new(),
        })
    }

    fn open(pool: Arc<Pool>, offset: u64) -> Result<CellTable, ProcessorError> {
        let corrupt = |why: String| KIND.corrupt(offset, &why);
        let (slot_size, capacity) = KIND.read(&pool, offset)?;
        let slot_size = u64::from(slot_size);
        if slot_size < SLOT_HEADER_LEN + 1 || capacity == 0 || capacity > u32::MAX as u64 {
            return Err(corrupt(format!(
                "slot size {slot_size} / capacity {capacity} out of range"
            )));
        }
        pool.check_range(offset, HEADER_LEN + capacity * slot_size)
            .map_err(|_| corrupt("runs past the pool".into()))?;
        let mut table = CellTable {
            pool,
            offset,
            slot_size,
            capacity: capacity as u32,
            by_key: HashMap::new(),
            slots: HashMap::new(),
        };
        let mut buf = vec![0u8; slot_size as usize];
        for slot in 0..table.capacity {
            table.pool.read(table.slot_offset(slot), &mut buf)?;
            let state = CellState::from_byte(buf[8])
                .ok_or_else(|| corrupt(format!("slot {slot}: unknown state {}", buf[8])))?;
            if state == CellState::Free {
                continue;
            }
            let key_len = u16::from_le_bytes([buf[10], buf[11]]) as u64;
            if SLOT_HEADER_LEN + key_len > slot_size {
                return Err(corrupt(format!("slot {slot}: key length {key_len}")));
            }
            let key = buf[16..16 + key_len as usize].to_vec();
            let crc = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
            if crc != slot_crc(state, &key) {
                return Err(corrupt(format!("slot {slot}: checksum mismatch")));
            }
            let ptr = u64::from_le_bytes(buf[0..8].try_into().expect("8 bytes"));
            let live = (state == CellState::Active)
                .then(|| EntryRef::from_raw(ptr))
                .flatten();
            table.by_key.insert(key.clone(), slot);
            table.slots.insert(
                slot,
                Cell {
                    slot,
                    key,
                    state,
                    live,
                },
            );
        }
        Ok(table)
    }

    fn slot_offset(&self, slot: u32) -> u64 {
        self.offset + HEADER_LEN + slot as u64 * self.slot_size
    }

    /// Pool offset of the cell word of `slot`.
    pub fn cell_offset(&self, slot: u32) -> u64 {
        self.slot_offset(slot)
    }

    /// The slot whose cell word is at pool offset `cell`.
    pub fn slot_at(&self, cell: u64) -> Option<u32> {
        let rel = cell.checked_sub(self.offset + HEADER_LEN)?;
        (rel % self.slot_size == 0 && rel / self.slot_size < self.capacity as u64)
            .then(|| (rel / self.slot_size) as u32)
    }

    /// The longest key a slot holds.
    pub fn max_key(&self) -> usize {
        (self.slot_size - SLOT_HEADER_LEN) as usize
    }

    /// The used slot of `key`.
    pub fn by_key(&self, key: &[u8]) -> Option<&Cell> {
        self.slots.get(self.by_key.get(key)?)
    }

    /// The used slot `slot`.
    pub fn get(&self, slot: u32) -> Option<&Cell> {
        self.slots.get(&slot)
    }

    /// The used slot `slot`, to update its in-memory bookkeeping.
    pub fn get_mut(&mut self, slot: u32) -> Option<&mut Cell> {
        self.slots.get_mut(&slot)
    }

    /// Every used slot.
    pub fn cells(&self) -> impl Iterator<Item = &Cell> {
        self.slots.values()
    }

    /// Active slots.
    pub fn active(&self) -> usize {
        self.slots
            .values()
            .filter(|c| c.state == CellState::Active)
            .count()
    }

    /// The cell word of `slot`.
    pub fn word(&self, slot: u32) -> Result<&AtomicU64, ProcessorError> {
        Ok(self.pool.atomic_u64(self.slot_offset(slot))?)
    }

    /// Sets the cell word of `slot` (persisted).
    pub fn set_word(&self, slot: u32, value: u64) -> Result<(), ProcessorError> {
        self.word(slot)?.store(value, Ordering::Release);
        self.persist_word(slot);
        Ok(())
    }

    /// Persists the cell word of `slot` after it was changed in place.
    pub fn persist_word(&self, slot: u32) {
        self.pool.persist(self.slot_offset(slot), 8);
    }

    /// Sets `key` aside in a slot (the same one again if it has one); returns the slot.
    pub fn reserve(&mut self, key: &[u8]) -> Result<u32, ProcessorError> {
        if let Some(&slot) = self.by_key.get(key) {
            return Ok(slot);
        }
        if key.len() > self.max_key() {
            return Err(ProcessorError::Config(format!(
                "a key of {} bytes cannot be shared: cells hold keys of up to {} bytes",
                key.len(),
                self.max_key()
            )));
        }
        let slot = (0..self.capacity)
            .find(|s| !self.slots.contains_key(s))
            .ok_or_else(|| {
                ProcessorError::Config(format!(
                    "every one of the {} cells for shared keys is in use",
                    self.capacity
                ))
            })?;
        let at = self.slot_offset(slot);
        self.set_word(slot, 0)?;
        self.pool.write(at + SLOT_HEADER_LEN, key)?;
        self.pool
            .write(at + 10, &(key.len() as u16).to_le_bytes())?;
        self.pool
            .persist(at + 10, SLOT_HEADER_LEN - 10 + key.len() as u64);
        self.by_key.insert(key.to_vec(), slot);
        self.slots.insert(
            slot,
            Cell {
                slot,
                key: key.to_vec(),
                state: CellState::Free,
                live: None,
            },
        );
        self.set_state(slot, CellState::Reserved)?;
        Ok(slot)
    }

    /// Moves `slot` to `state` (persisted); freeing forgets it.
    pub fn set_state(&mut self, slot: u32, state: CellState) -> Result<(), ProcessorError> {
        let at = self.slot_offset(slot);
        let Some(cell) = self.slots.get_mut(&slot) else {
            return Err(ProcessorError::Corrupt(format!("cell slot {slot} is free")));
        };
        cell.state = state;
        let crc = slot_crc(state, &cell.key);
        self.pool.write(at + 12, &crc.to_le_bytes())?;
        self.pool.write(at + 8, &[state as u8])?;
        self.pool.persist(at + 8, 8);
        if state == CellState::Free {
            let key = cell.key.clone();
            self.slots.remove(&slot);
            self.by_key.remove(&key);
        }
        Ok(())
    }
}

/// The checksum of a slot's description. The state byte is covered so that a torn state change is detected.
fn slot_crc(state: CellState, key: &[u8]) -> u32 {
    let mut h = [0u8; 3];
    h[0] = state as u8;
    h[1..3].copy_from_slice(&(key.len() as u16).to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&h), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Arc<Pool> {
        Arc::new(Pool::anonymous(64 << 20, 1 << 20).unwrap())
    }

    #[test]
    fn a_table_the_pool_has_no_room_for_is_refused_naming_it_and_nothing_is_published() {
        let pool = Arc::new(Pool::anonymous(4 << 20, 1 << 20).unwrap());
        while pool.alloc(1, 0x77).is_ok() {}
        let err = CellTable::open_or_create(pool.clone(), 1024, 32)
            .err()
            .expect("no room");
        assert!(
            matches!(&err, ProcessorError::NoRoom { what, .. } if what == "the cell table of 1024 entries"),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("does not fit in the pool"),
            "{err}"
        );
        assert_eq!(pool.root(ROOT).unwrap(), 0, "no table is named");
    }

    #[test]
    fn reserve_is_idempotent_and_survives_reopen() {
        let pool = pool();
        let mut t = CellTable::open_or_create(pool.clone(), 8, 32).unwrap();
        let a = t.reserve(b"alpha").unwrap();
        assert_eq!(t.reserve(b"alpha").unwrap(), a);
        let b = t.reserve(b"beta").unwrap();
        assert_ne!(a, b);
        t.set_state(b, CellState::Active).unwrap();
        t.set_word(b, 0x1234_5678).unwrap();
        drop(t);
        let t = CellTable::open_or_create(pool, 8, 32).unwrap();
        assert_eq!(t.by_key(b"alpha").unwrap().state, CellState::Reserved);
        let cell = t.by_key(b"beta").unwrap();
        assert_eq!(cell.state, CellState::Active);
        assert_eq!(cell.live, EntryRef::from_raw(0x1234_5678));
        assert_eq!(t.slot_at(t.cell_offset(b)), Some(b));
        assert_eq!(t.slot_at(t.cell_offset(b) + 8), None);
    }

    #[test]
    fn freeing_makes_room_and_limits_are_errors() {
        let pool = pool();
        let mut t = CellTable::open_or_create(pool, 2, 16).unwrap();
        let a = t.reserve(b"a").unwrap();
        t.reserve(b"b").unwrap();
        assert!(t.reserve(b"c").is_err(), "full");
        assert!(t.reserve(&[7u8; 200]).is_err(), "key too long");
        t.set_state(a, CellState::Free).unwrap();
        assert!(t.by_key(b"a").is_none());
        assert_eq!(t.reserve(b"c").unwrap(), a);
    }

    #[test]
    fn a_corrupt_slot_is_an_error() {
        let pool = pool();
        let mut t = CellTable::open_or_create(pool.clone(), 4, 16).unwrap();
        let s = t.reserve(b"key").unwrap();
        let at = t.cell_offset(s);
        drop(t);
        pool.write(at + 16, b"kez").unwrap();
        let err = CellTable::open_or_create(pool, 4, 16).err().unwrap();
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
