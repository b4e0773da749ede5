//! The revoked KV-node incarnations, kept in the pool so that a memory node restarted on it still refuses them.
//!
//! A take-over revokes the incarnation it takes over ([`dinomo_fabric::Clients::revoke_node`]): its connections are
//! closed and it may never connect again, since its logs were sealed and their segments may be given to others. The
//! fabric keeps that set in memory; this table keeps it across restarts, up to the newest `capacity` of them.
//!
//! ```text
//! header (64 B): magic "DNMREVK1" | version u32 | reserved u32 | capacity u64 | crc32c u32 (over bytes 0..24)
//! entry i (24 B, at 64 + 24·i):
//!   0..8   sequence: 0 = empty, else the entry's place in the order of revocations (1, 2, ...)
//!   8..16  incarnation
//!   16..20 node id
//!   20..24 crc32c over bytes 0..20
//! ```
//! Entries are written in a ring, each with one write and one persist: a torn entry fails its checksum and is read
//! as empty, which forgets only the revocation being written (its take-over had not answered, so the management
//! node asks for it again). A table of another capacity is replaced whole: the new one is filled with the newest
//! entries before its root slot names it, and the old one freed after (or at the next start, after a crash).

use std::collections::VecDeque;
use std::sync::Arc;

use dinomo_fabric::ClientId;
use dinomo_pool::Pool;
use tracing::{error, info, warn};

use crate::ProcessorError;
use crate::table_header::{HEADER_LEN, TableKind};

/// Root slot of the revocation table.
pub const ROOT: usize = 6;
/// Allocation tag of the revocation table.
pub const TAG: u16 = 0x14;

const KIND: TableKind = TableKind {
    name: "revocation table",
    magic: *b"DNMREVK1",
    version: 1,
    root: ROOT,
    tag: TAG,
};
const ENTRY_LEN: u64 = 24;
/// Capacities are bounded so that a damaged header cannot make the processor read or allocate without end.
const MAX_CAPACITY: u64 = 1 << 24;

fn encode(seq: u64, id: ClientId) -> [u8; ENTRY_LEN as usize] {
    let mut e = [0u8; ENTRY_LEN as usize];
    e[0..8].copy_from_slice(&seq.to_le_bytes());
    e[8..16].copy_from_slice(&id.incarnation.to_le_bytes());
    e[16..20].copy_from_slice(&id.node.to_le_bytes());
    let crc = crc32c::crc32c(&e[..20]);
    e[20..24].copy_from_slice(&crc.to_le_bytes());
    e
}

/// What an entry holds: `Ok(None)` when empty, `Err(())` when it fails its checksum.
#[allow(clippy::result_unit_err)]
fn decode(e: &[u8]) -> Result<Option<(u64, ClientId)>, ()> {
    let word = |at: usize| u64::from_le_bytes(e[at..at + 8].try_into().expect("8 bytes"));
    let half = |at: usize| u32::from_le_bytes(e[at..at + 4].try_into().expect("4 bytes"));
    let seq = word(0);
    if seq == 0 && e.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    if crc32c::crc32c(&e[..20]) != half(20) || seq == 0 {
        return Err(());
    }
    Ok(Some((
        seq,
        ClientId {
            node: half(16),
            incarnation: word(8),
        },
    )))
}

/// What a pool's table holds, as read at open.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RevocationsRead {
    /// The revoked incarnations, oldest first.
    pub revoked: Vec<ClientId>,
    /// Entries that failed their checksum (read as empty).
    pub damaged: u64,
    /// The table's capacity (0: the pool has no table).
    pub capacity: u64,
}

/// Reads the table named by the root slot without changing anything.
pub fn read(pool: &Pool) -> Result<RevocationsRead, ProcessorError> {
    let read = read_entries(pool)?;
    Ok(RevocationsRead {
        revoked: read.entries.into_iter().map(|(_, id)| id).collect(),
        damaged: read.damaged,
        capacity: read.capacity,
    })
}

/// A table as read, its entries with their sequence numbers.
#[derive(Default)]
struct EntriesRead {
    /// Oldest first.
    entries: Vec<(u64, ClientId)>,
    damaged: u64,
    capacity: u64,
}

fn read_entries(pool: &Pool) -> Result<EntriesRead, ProcessorError> {
    let offset = pool.root(ROOT)?;
    if offset == 0 {
        return Ok(EntriesRead::default());
    }
    let (_, capacity) = KIND.read(pool, offset)?;
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(KIND.corrupt(offset, &format!("absurd capacity {capacity}")));
    }
    // Checked before the buffer is sized by it: the table is one allocation of the table's tag, long enough.
    let bytes = HEADER_LEN + capacity * ENTRY_LEN;
    if !pool
        .allocated()
        .iter()
        .any(|e| e.offset == offset && e.tag == TAG && e.len >= bytes)
    {
        return Err(KIND.corrupt(
            offset,
            &format!("no allocation of the table's tag holds its {capacity} entries"),
        ));
    }
    let mut body = vec![0u8; (capacity * ENTRY_LEN) as usize];
    pool.read(offset + HEADER_LEN, &mut body)?;
    let mut entries = Vec::new();
    let mut damaged = 0;
    for e in body.chunks_exact(ENTRY_LEN as usize) {
        match decode(e) {
            Ok(Some(entry)) => entries.push(entry),
            Ok(None) => {}
            Err(()) => damaged += 1,
        }
    }
    entries.sort_unstable_by_key(|(seq, _)| *seq);
    Ok(EntriesRead {
        entries,
        damaged,
        capacity,
    })
}

/// The table in the pool, with a copy of what it holds. Only the processor writes it, under its own lock.
pub struct RevocationTable {
    pool: Arc<Pool>,
    /// Pool offset of the table (0: none yet; it is formatted at the first revocation).
    offset: u64,
    capacity: u64,
    /// What it holds with their sequence numbers, oldest first.
    entries: VecDeque<(u64, ClientId)>,
    /// The sequence number of the next entry, written in slot `(next_seq - 1) % capacity`.
    next_seq: u64,
}

impl RevocationTable {
    /// Opens the table named by the root slot (none: an empty one, formatted at the first revocation) and frees any
    /// other revocation table a crash left allocated. Damaged entries are logged and forgotten. A damaged table is
    /// logged and replaced at the next revocation: the memory node still starts, with what its revocations guard
    /// against left to the KV nodes' leases, rather than serve nothing for want of this table.
    pub fn open(pool: Arc<Pool>) -> Result<RevocationTable, ProcessorError> {
        let root = pool.root(ROOT)?;
        let (read, offset) = match read_entries(&pool) {
            Ok(read) => (read, root),
            Err(ProcessorError::Corrupt(why)) => {
                error!(
                    %why,
                    "the revocation table is damaged: the KV-node incarnations revoked before this start are \
                     forgotten, and a new table is formatted at the next take-over"
                );
                (EntriesRead::default(), 0)
            }
            Err(e) => return Err(e),
        };
        let EntriesRead {
            entries,
            damaged,
            capacity,
        } = read;
        for ext in pool.allocated() {
            // Those of an interrupted replacement, and a damaged one (once a new one is named).
            if ext.tag == TAG && ext.offset != root {
                info!(
                    offset = ext.offset,
                    "freeing a revocation table left by an interrupted replacement"
                );
                pool.free(ext.offset)?;
            }
        }
        if damaged > 0 {
            warn!(
                damaged,
                "revocation table entries failed their checksum; those revocations are forgotten"
            );
        }
        Ok(RevocationTable {
            pool,
            offset,
            capacity,
            next_seq: entries.last().map_or(1, |(seq, _)| seq + 1),
            entries: entries.into(),
        })
    }

    /// The revoked incarnations the table holds, oldest first.
    pub fn revoked(&self) -> Vec<ClientId> {
        self.entries.iter().map(|(_, id)| *id).collect()
    }

    /// How many it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Its capacity (0 before the first revocation).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Records `ids` as revoked, in a table of `capacity` entries (the memory node's bound on revoked clients): the
    /// oldest are forgotten beyond it. Each is persisted before this returns; ids already held are not written
    /// again. (A take-over's few ids against a few thousand held: a scan, as rare as take-overs.)
    pub fn record(&mut self, ids: &[ClientId], capacity: usize) -> Result<(), ProcessorError> {
        let capacity = (capacity.max(1) as u64).min(MAX_CAPACITY);
        let mut new: Vec<ClientId> = Vec::new();
        for &id in ids {
            if !new.contains(&id) && !self.entries.iter().any(|&(_, held)| held == id) {
                new.push(id);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        if self.offset == 0 || capacity != self.capacity {
            self.replace(capacity, &new)?;
        } else {
            for id in new {
                self.append(id)?;
            }
        }
        Ok(())
    }

    /// Writes one entry in the next slot of the ring, over the entry written `capacity` entries before it.
    fn append(&mut self, id: ClientId) -> Result<(), ProcessorError> {
        let seq = self.next_seq;
        let slot = (seq - 1) % self.capacity;
        let at = self.offset + HEADER_LEN + slot * ENTRY_LEN;
        self.pool.write(at, &encode(seq, id))?;
        self.pool.persist(at, ENTRY_LEN);
        self.next_seq += 1;
        while self
            .entries
            .front()
            .is_some_and(|&(old_seq, _)| old_seq + self.capacity <= seq)
        {
            self.entries.pop_front();
        }
        self.entries.push_back((seq, id));
        Ok(())
    }

    /// Formats a table of `capacity` entries holding the newest of what this one holds plus `new`, publishes it,
    /// and frees this one.
    fn replace(&mut self, capacity: u64, new: &[ClientId]) -> Result<(), ProcessorError> {
        let mut entries: Vec<ClientId> = self
            .entries
            .iter()
            .map(|(_, id)| id)
            .chain(new)
            .copied()
            .collect();
        let forgotten = entries.len().saturating_sub(capacity as usize);
        entries.drain(..forgotten);
        // Sequence numbers restart at 1 in slot 0.
        let mut body = Vec::with_capacity(entries.len() * ENTRY_LEN as usize);
        for (i, id) in entries.iter().enumerate() {
            body.extend_from_slice(&encode(i as u64 + 1, *id));
        }
        let offset = KIND.format_filled(&self.pool, 0, capacity, capacity * ENTRY_LEN, &body)?;
        // The new table is the one named from here on, whether or not the old one can be freed now (the next start
        // frees it otherwise).
        let (old, old_capacity) = (self.offset, self.capacity);
        self.offset = offset;
        self.capacity = capacity;
        self.next_seq = entries.len() as u64 + 1;
        self.entries = (1..).zip(entries).collect();
        if old != 0 {
            self.pool.free(old)?;
            info!(
                from = old_capacity,
                to = capacity,
                "the revocation table was resized"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Arc<Pool> {
        Arc::new(Pool::anonymous(16 << 20, 1 << 20).unwrap())
    }

    fn id(node: u32, incarnation: u64) -> ClientId {
        ClientId { node, incarnation }
    }

    #[test]
    fn revocations_survive_a_reopen_oldest_first() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        assert_eq!(t.capacity(), 0, "no table before the first revocation");
        assert_eq!(pool.root(ROOT).unwrap(), 0);
        t.record(&[id(1, 10), id(2, 20)], 8).unwrap();
        t.record(&[id(1, 10), id(3, 30), id(3, 30)], 8).unwrap();
        assert_eq!(t.revoked(), &[id(1, 10), id(2, 20), id(3, 30)]);
        let again = RevocationTable::open(pool.clone()).unwrap();
        assert_eq!(again.revoked(), &[id(1, 10), id(2, 20), id(3, 30)]);
        assert_eq!(again.capacity(), 8);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_and_keeps_writing_in_order_after_a_reopen() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        for i in 0..7 {
            t.record(&[id(1, i)], 3).unwrap();
        }
        assert_eq!(t.revoked(), &[id(1, 4), id(1, 5), id(1, 6)]);
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        assert_eq!(t.revoked(), &[id(1, 4), id(1, 5), id(1, 6)]);
        for i in 7..9 {
            t.record(&[id(1, i)], 3).unwrap();
        }
        let t = RevocationTable::open(pool).unwrap();
        assert_eq!(t.revoked(), &[id(1, 6), id(1, 7), id(1, 8)]);
    }

    #[test]
    fn another_capacity_replaces_the_table_with_its_newest_entries_and_frees_the_old_one() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        for i in 0..5 {
            t.record(&[id(2, i)], 8).unwrap();
        }
        let first = pool.root(ROOT).unwrap();
        t.record(&[id(2, 5)], 3).unwrap();
        assert_ne!(pool.root(ROOT).unwrap(), first);
        let tables = pool
            .allocated()
            .into_iter()
            .filter(|e| e.tag == TAG)
            .count();
        assert_eq!(tables, 1, "the old table is freed");
        let t = RevocationTable::open(pool).unwrap();
        assert_eq!(t.revoked(), &[id(2, 3), id(2, 4), id(2, 5)]);
        assert_eq!(t.capacity(), 3);
    }

    #[test]
    fn a_table_left_by_an_interrupted_replacement_is_freed_at_open() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        t.record(&[id(1, 1)], 4).unwrap();
        let stray = pool.alloc_bytes(64, TAG).unwrap();
        RevocationTable::open(pool.clone()).unwrap();
        assert!(
            pool.allocated().iter().all(|e| e.offset != stray.offset),
            "the stray table is freed"
        );
        assert_eq!(read(&pool).unwrap().revoked, vec![id(1, 1)]);
    }

    #[test]
    fn a_damaged_entry_is_forgotten_and_the_others_kept() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        t.record(&[id(1, 1), id(1, 2), id(1, 3)], 4).unwrap();
        let offset = pool.root(ROOT).unwrap();
        // A torn write of the second entry: its incarnation half written.
        pool.write(offset + HEADER_LEN + ENTRY_LEN + 9, &[0xff])
            .unwrap();
        let r = read(&pool).unwrap();
        assert_eq!(r.revoked, vec![id(1, 1), id(1, 3)]);
        assert_eq!(r.damaged, 1);
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        t.record(&[id(1, 4)], 4).unwrap();
        assert_eq!(
            read(&pool).unwrap().revoked,
            vec![id(1, 1), id(1, 3), id(1, 4)]
        );
    }

    #[test]
    fn a_root_naming_memory_that_is_not_a_table_is_refused() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        t.record(&[id(1, 1)], 4).unwrap();
        let table = pool.root(ROOT).unwrap();
        let mut header = [0u8; HEADER_LEN as usize];
        pool.read(table, &mut header).unwrap();
        // A valid header copied into an extent of another owner.
        let other = pool.alloc_bytes(64, 0x77).unwrap();
        pool.write(other.offset, &header).unwrap();
        pool.set_root(ROOT, other.offset).unwrap();
        match read(&pool) {
            Err(ProcessorError::Corrupt(why)) => assert!(why.contains("allocation"), "{why}"),
            other => panic!("read a table outside its allocation: {other:?}"),
        }
    }

    #[test]
    fn a_corrupt_header_is_an_error_to_read_and_the_table_is_replaced() {
        let pool = pool();
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        t.record(&[id(1, 1)], 4).unwrap();
        let offset = pool.root(ROOT).unwrap();
        pool.write(offset + 16, &[9]).unwrap();
        match read(&pool) {
            Err(ProcessorError::Corrupt(why)) => {
                assert!(why.contains("revocation table"), "{why}")
            }
            other => panic!("read a corrupt table: {other:?}"),
        }
        // The memory node still starts; the next revocation formats a new table, and the start after frees the
        // damaged one.
        let mut t = RevocationTable::open(pool.clone()).unwrap();
        assert!(t.is_empty());
        t.record(&[id(1, 2)], 4).unwrap();
        assert_ne!(pool.root(ROOT).unwrap(), offset);
        RevocationTable::open(pool.clone()).unwrap();
        assert!(pool.allocated().iter().all(|e| e.offset != offset));
        assert_eq!(read(&pool).unwrap().revoked, vec![id(1, 2)]);
    }
}
