//! The embedded store: the cluster record persisted in the memory node's pool, leases and elections in DRAM.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dinomo_pool::{Pool, PoolError};

use crate::record::{self, HEADER_LEN, SLOT_LEN, SLOT_OFFSETS, Slot, SlotInfo};
use crate::soft::Soft;
use crate::{
    CLUSTER_META_ROOT, CLUSTER_META_TAG, LeaseId, MetaConfig, MetaError, MetaStore, Versioned,
};

/// What the store knows about one header slot.
#[derive(Debug, Clone, Copy, Default)]
struct SlotState {
    /// Pool offset of the blob this slot holds alive, if its record is readable.
    blob: Option<u64>,
}

/// The persistent part, guarded by one lock (stores are rare; loads are served from the cached copy).
struct RecordState {
    /// Pool offset of the header (None before the first store).
    header: Option<u64>,
    slots: [SlotState; 2],
    /// Slot holding the current record.
    active: Option<usize>,
    /// The current record, cached.
    current: Option<Versioned>,
    /// Largest version ever committed that the header still shows: the next store goes above it, even when that
    /// record itself was unreadable at open.
    floor: u64,
}

/// The default metadata store, hosted by the memory node.
///
/// The cluster record is persisted crash-safely in the pool under root slot [`CLUSTER_META_ROOT`] (format in the
/// `record` module: a header with two checksummed slots, each pointing at a blob). Leases, members and elections
/// are soft state in DRAM, expired lazily by deadline on every call.
///
/// At most one `EmbeddedMeta` may be open on a pool at a time (the memory node owns it).
pub struct EmbeddedMeta {
    pool: Arc<Pool>,
    config: MetaConfig,
    record: Mutex<RecordState>,
    soft: Mutex<Soft>,
}

impl std::fmt::Debug for EmbeddedMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedMeta")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn pool_err(what: &str) -> impl Fn(PoolError) -> MetaError + '_ {
    move |e| MetaError::Unavailable(format!("{what}: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What open found in one slot.
enum Found {
    Empty,
    Torn,
    /// Committed, but the blob is missing or fails its checksum.
    Damaged(SlotInfo),
    Valid(SlotInfo, Vec<u8>),
}

impl EmbeddedMeta {
    /// Opens the store on `pool`, recovering the cluster record written by an earlier run.
    ///
    /// Leftovers of an interrupted store (tagged allocations that no slot holds) are freed. A header that is not
    /// one (bad root, magic, checksum or format), or a committed record none of whose copies is readable, gives
    /// [`MetaError::Corrupt`] and leaves the pool untouched.
    pub fn open(pool: Arc<Pool>, config: MetaConfig) -> Result<Arc<EmbeddedMeta>, MetaError> {
        let root = pool
            .root(CLUSTER_META_ROOT)
            .map_err(|e| MetaError::Corrupt(e.to_string()))?;
        let tagged: Vec<_> = pool
            .allocated()
            .into_iter()
            .filter(|e| e.tag == CLUSTER_META_TAG)
            .collect();
        let mut state = RecordState {
            header: None,
            slots: [SlotState::default(); 2],
            active: None,
            current: None,
            floor: 0,
        };
        let mut keep: HashSet<u64> = HashSet::new();
        if root != 0 {
            let header_ext = tagged.iter().find(|e| e.offset == root).ok_or_else(|| {
                MetaError::Corrupt(format!(
                    "root slot {CLUSTER_META_ROOT} points at pool offset {root}, which is not a cluster-metadata allocation"
                ))
            })?;
            if header_ext.len < HEADER_LEN as u64 {
                return Err(MetaError::Corrupt(format!(
                    "cluster-metadata header allocation of {} bytes is too small",
                    header_ext.len
                )));
            }
            let mut header = [0u8; HEADER_LEN];
            pool.read(root, &mut header)
                .map_err(|e| MetaError::Corrupt(e.to_string()))?;
            record::check_header(&header).map_err(MetaError::Corrupt)?;
            let found: [Found; 2] = std::array::from_fn(|i| {
                match record::decode_slot(&header, i) {
                    Slot::Empty => Found::Empty,
                    Slot::Torn => Found::Torn,
                    Slot::Written(info) => {
                        // The blob must be one of our allocations (not the header) and hold the checksummed bytes.
                        let fits = tagged.iter().any(|e| {
                            e.offset == info.offset && e.offset != root && info.len <= e.len
                        });
                        let mut buf = Vec::new();
                        let readable =
                            fits && usize::try_from(info.len).is_ok_and(|len| {
                                buf.resize(len, 0);
                                pool.read(info.offset, &mut buf).is_ok()
                            }) && crc32c::crc32c(&buf) == info.crc;
                        if readable {
                            Found::Valid(info, buf)
                        } else {
                            Found::Damaged(info)
                        }
                    }
                }
            });
            let committed = |f: &Found| match f {
                Found::Valid(i, _) | Found::Damaged(i) => Some(i.version),
                _ => None,
            };
            let floor = found.iter().filter_map(committed).max().unwrap_or(0);
            let best = (0..2)
                .filter_map(|i| match &found[i] {
                    Found::Valid(info, _) => Some((info.version, i)),
                    _ => None,
                })
                .max();
            match best {
                None => {
                    if floor > 0 {
                        return Err(MetaError::Corrupt(format!(
                            "cluster record version {floor} is damaged and no earlier copy is readable"
                        )));
                    }
                    if matches!(found, [Found::Torn, Found::Torn]) {
                        return Err(MetaError::Corrupt(
                            "both cluster-metadata slots fail their checksums".into(),
                        ));
                    }
                    // Only a first store torn by a crash: there is no record yet.
                }
                Some((version, i)) => {
                    if version < floor {
                        tracing::warn!(
                            damaged = floor,
                            recovered = version,
                            "newest cluster record is damaged; falling back to the previous one"
                        );
                    }
                    if let Found::Valid(_, value) = &found[i] {
                        state.current = Some(Versioned {
                            version,
                            value: value.clone(),
                        });
                    }
                    state.active = Some(i);
                }
            }
            for (i, f) in found.iter().enumerate() {
                if let Found::Valid(info, _) = f {
                    state.slots[i].blob = Some(info.offset);
                }
            }
            if state.slots[0].blob.is_some() && state.slots[0].blob == state.slots[1].blob {
                // Both slots name one blob only through damage; it then belongs to the active slot alone.
                state.slots[1 - state.active.unwrap_or(0)].blob = None;
            }
            keep.extend(state.slots.iter().filter_map(|s| s.blob));
            state.floor = floor;
            state.header = Some(root);
            keep.insert(root);
        }
        // Validation is complete: from here on the pool may be written.
        for e in tagged.iter().filter(|e| !keep.contains(&e.offset)) {
            tracing::info!(
                offset = e.offset,
                len = e.len,
                "freeing a cluster-metadata allocation left by an interrupted store"
            );
            pool.free(e.offset)
                .map_err(pool_err("freeing a stray cluster-metadata allocation"))?;
        }
        if let Some(v) = &state.current {
            tracing::info!(
                version = v.version,
                len = v.value.len(),
                "recovered the cluster record"
            );
        }
        Ok(Arc::new(EmbeddedMeta {
            pool,
            config,
            record: Mutex::new(state),
            soft: Mutex::new(Soft::new()),
        }))
    }

    /// Limits in force.
    pub fn config(&self) -> &MetaConfig {
        &self.config
    }

    /// The pool the record is persisted in.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Leases alive now.
    pub fn live_leases(&self) -> usize {
        let mut soft = lock(&self.soft);
        soft.expire(Instant::now());
        soft.lease_count()
    }

    /// Allocates and initialises the header, then publishes it in the root slot.
    fn create_header(&self) -> Result<u64, MetaError> {
        let ext = self
            .pool
            .alloc_bytes(HEADER_LEN as u64, CLUSTER_META_TAG)
            .map_err(pool_err("allocating the cluster-metadata header"))?;
        let init = || -> Result<(), PoolError> {
            self.pool.write(ext.offset, &record::new_header())?;
            self.pool.persist(ext.offset, HEADER_LEN as u64);
            self.pool.set_root(CLUSTER_META_ROOT, ext.offset)
        };
        if let Err(e) = init() {
            let _ = self.pool.free(ext.offset);
            return Err(pool_err("initialising the cluster-metadata header")(e));
        }
        Ok(ext.offset)
    }
}

impl MetaStore for EmbeddedMeta {
    fn load(&self) -> Result<Option<Versioned>, MetaError> {
        Ok(lock(&self.record).current.clone())
    }

    fn store(&self, expected: Option<u64>, value: &[u8]) -> Result<u64, MetaError> {
        self.config.check_record(value.len())?;
        let mut st = lock(&self.record);
        let current = st.current.as_ref().map(|v| v.version);
        if current != expected {
            return Err(MetaError::Conflict { current });
        }
        let version = st
            .floor
            .checked_add(1)
            .ok_or_else(|| MetaError::Corrupt("record version space exhausted".into()))?;
        let header = match st.header {
            Some(h) => h,
            None => {
                let h = self.create_header()?;
                st.header = Some(h);
                h
            }
        };
        let len = value.len() as u64;
        let blob = self
            .pool
            .alloc_bytes(len.max(1), CLUSTER_META_TAG)
            .map_err(pool_err("allocating the cluster record"))?;
        if let Err(e) = self.pool.write(blob.offset, value) {
            let _ = self.pool.free(blob.offset);
            return Err(pool_err("writing the cluster record")(e));
        }
        self.pool.persist(blob.offset, len);
        let target = st.active.map_or(0, |a| 1 - a);
        let slot = record::encode_slot(&SlotInfo {
            version,
            offset: blob.offset,
            len,
            crc: crc32c::crc32c(value),
        });
        let at = header + SLOT_OFFSETS[target] as u64;
        if let Err(e) = self.pool.write(at, &slot) {
            let _ = self.pool.free(blob.offset);
            return Err(pool_err("writing the cluster-metadata slot")(e));
        }
        // The commit point: once this slot is durable, the new record is the one recovered.
        self.pool.persist(at, SLOT_LEN as u64);
        let old = st.slots[target].blob.replace(blob.offset);
        st.active = Some(target);
        st.floor = version;
        st.current = Some(Versioned {
            version,
            value: value.to_vec(),
        });
        // The slot that now holds the previous record keeps its blob; the one overwritten lets its blob go.
        if let Some(old) = old.filter(|&o| Some(o) != st.slots[1 - target].blob) {
            if let Err(e) = self.pool.free(old) {
                // Not fatal: the next open frees allocations that no slot holds.
                tracing::warn!(offset = old, error = %e, "could not free the superseded cluster record");
            }
        }
        tracing::debug!(version, len, "stored the cluster record");
        Ok(version)
    }

    fn grant(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        lock(&self.soft).grant(&self.config, Instant::now(), ttl)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        lock(&self.soft).keep_alive(Instant::now(), lease)
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), MetaError> {
        lock(&self.soft).revoke(Instant::now(), lease)
    }

    fn register(&self, member: &str, info: &[u8], lease: LeaseId) -> Result<(), MetaError> {
        lock(&self.soft).register(&self.config, Instant::now(), member, info, lease)
    }

    fn members(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        lock(&self.soft).members(&self.config, Instant::now(), prefix)
    }

    fn try_lead(&self, election: &str, candidate: &str, lease: LeaseId) -> Result<bool, MetaError> {
        lock(&self.soft).try_lead(&self.config, Instant::now(), election, candidate, lease)
    }

    fn leader(&self, election: &str) -> Result<Option<String>, MetaError> {
        lock(&self.soft).leader(&self.config, Instant::now(), election)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_pool::{PersistMode, PoolOptions};

    const SEGMENT: u64 = 64 << 10;

    fn create(dir: &tempfile::TempDir) -> (std::path::PathBuf, Arc<Pool>) {
        let path = dir.path().join("pool");
        let pool = Pool::create(
            &path,
            &PoolOptions {
                size: 8 << 20,
                segment_size: SEGMENT,
                persist: PersistMode::Durable,
            },
        )
        .unwrap();
        (path, Arc::new(pool))
    }

    fn reopen(path: &std::path::Path) -> Arc<Pool> {
        Arc::new(Pool::open(path, PersistMode::Durable).unwrap().0)
    }

    fn open(pool: &Arc<Pool>) -> Result<Arc<EmbeddedMeta>, MetaError> {
        EmbeddedMeta::open(pool.clone(), MetaConfig::default())
    }

    fn tagged(pool: &Pool) -> Vec<u64> {
        pool.allocated()
            .iter()
            .filter(|e| e.tag == CLUSTER_META_TAG)
            .map(|e| e.offset)
            .collect()
    }

    fn image(pool: &Pool) -> Vec<u8> {
        let mut v = vec![0u8; pool.len() as usize];
        pool.read(0, &mut v).unwrap();
        v
    }

    fn slot_at(pool: &Pool, i: usize) -> u64 {
        pool.root(CLUSTER_META_ROOT).unwrap() + SLOT_OFFSETS[i] as u64
    }

    fn versioned(version: u64, value: &[u8]) -> Option<Versioned> {
        Some(Versioned {
            version,
            value: value.to_vec(),
        })
    }

    #[test]
    fn the_record_survives_reopening_the_pool_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, pool) = create(&dir);
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), None);
        let v1 = meta.store(None, b"ring epoch 1").unwrap();
        let v2 = meta.store(Some(v1), b"ring epoch 2").unwrap();
        // Soft state does not survive.
        let lease = meta.grant(Duration::from_secs(60)).unwrap();
        meta.register("kn/1", b"x", lease).unwrap();
        drop(meta);
        drop(pool);

        let pool = reopen(&path);
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), versioned(v2, b"ring epoch 2"));
        assert!(meta.members("").unwrap().is_empty());
        assert_eq!(meta.keep_alive(lease), Err(MetaError::LeaseExpired(lease)));
        // Versions keep increasing across restarts.
        assert_eq!(
            meta.store(Some(v1), b"stale"),
            Err(MetaError::Conflict { current: Some(v2) })
        );
        let v3 = meta.store(Some(v2), b"ring epoch 3").unwrap();
        assert!(v3 > v2);
        drop(meta);
        drop(pool);
        let pool = reopen(&path);
        assert_eq!(
            open(&pool).unwrap().load().unwrap(),
            versioned(v3, b"ring epoch 3")
        );
    }

    #[test]
    fn a_torn_newest_slot_falls_back_to_the_previous_record() {
        let dir = tempfile::tempdir().unwrap();
        let (path, pool) = create(&dir);
        let meta = open(&pool).unwrap();
        let v1 = meta.store(None, b"one").unwrap();
        let v2 = meta.store(Some(v1), b"two").unwrap();
        let newest = meta.record.lock().unwrap().active.unwrap();
        drop(meta);
        // A crash in the middle of writing the slot: its checksum fails.
        let at = slot_at(&pool, newest);
        pool.write(at + 3, &[0xAB, 0xCD]).unwrap();
        drop(pool);

        let pool = reopen(&path);
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), versioned(v1, b"one"));
        // The blob only the torn slot named is freed: header + one blob remain.
        assert_eq!(tagged(&pool).len(), 2);
        // The next store reuses the torn slot and still moves forward.
        let v = meta.store(Some(v1), b"three").unwrap();
        assert!(v > v1);
        drop(meta);
        drop(pool);
        let pool = reopen(&path);
        assert_eq!(open(&pool).unwrap().load().unwrap(), versioned(v, b"three"));
        let _ = v2;
    }

    #[test]
    fn a_damaged_newest_record_falls_back_and_is_never_reversioned() {
        let dir = tempfile::tempdir().unwrap();
        let (path, pool) = create(&dir);
        let meta = open(&pool).unwrap();
        let v1 = meta.store(None, b"one").unwrap();
        let v2 = meta.store(Some(v1), b"two").unwrap();
        let newest = {
            let st = meta.record.lock().unwrap();
            st.slots[st.active.unwrap()].blob.unwrap()
        };
        drop(meta);
        pool.write(newest, b"TWO").unwrap();
        drop(pool);

        let pool = reopen(&path);
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), versioned(v1, b"one"));
        // v2 was committed (its slot is intact) and may have been seen: the next version is above it.
        let v3 = meta.store(Some(v1), b"three").unwrap();
        assert!(v3 > v2);
    }

    #[test]
    fn garbage_header_is_corrupt_and_leaves_the_pool_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (path, pool) = create(&dir);
        let meta = open(&pool).unwrap();
        meta.store(None, b"one").unwrap();
        drop(meta);
        let header = pool.root(CLUSTER_META_ROOT).unwrap();
        pool.write(header, b"garbage!garbage!").unwrap();
        drop(pool);

        let pool = reopen(&path);
        let before = image(&pool);
        match open(&pool) {
            Err(MetaError::Corrupt(m)) => assert!(m.contains("magic"), "{m}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(image(&pool) == before, "a rejected open changed the pool");
        assert_eq!(tagged(&pool).len(), 2);
    }

    #[test]
    fn a_root_that_is_not_a_header_is_corrupt() {
        let pool = Arc::new(Pool::anonymous(4 << 20, SEGMENT).unwrap());
        let stray = pool.alloc(1, CLUSTER_META_TAG).unwrap();
        let other = pool.alloc(1, 0x99).unwrap();
        pool.set_root(CLUSTER_META_ROOT, other.offset).unwrap();
        let before = image(&pool);
        assert!(matches!(open(&pool), Err(MetaError::Corrupt(_))));
        pool.set_root(CLUSTER_META_ROOT, other.offset + 8).unwrap();
        assert!(matches!(open(&pool), Err(MetaError::Corrupt(_))));
        pool.set_root(CLUSTER_META_ROOT, other.offset).unwrap();
        assert!(image(&pool) == before);
        assert_eq!(tagged(&pool), vec![stray.offset]);
    }

    #[test]
    fn both_slots_unreadable_is_corrupt() {
        let pool = Arc::new(Pool::anonymous(4 << 20, SEGMENT).unwrap());
        let meta = open(&pool).unwrap();
        let v1 = meta.store(None, b"one").unwrap();
        meta.store(Some(v1), b"two").unwrap();
        let blobs: Vec<u64> = meta
            .record
            .lock()
            .unwrap()
            .slots
            .iter()
            .map(|s| s.blob.unwrap())
            .collect();
        drop(meta);
        // Damage both records.
        for b in &blobs {
            pool.write(*b, b"X").unwrap();
        }
        let before = image(&pool);
        assert!(matches!(open(&pool), Err(MetaError::Corrupt(_))));
        assert!(image(&pool) == before);
        // Two torn slots are just as fatal.
        for i in 0..2 {
            pool.write(slot_at(&pool, i), &[0xFF]).unwrap();
        }
        assert!(matches!(open(&pool), Err(MetaError::Corrupt(_))));
    }

    #[test]
    fn interrupted_stores_leave_only_strays_that_open_frees() {
        let pool = Arc::new(Pool::anonymous(4 << 20, SEGMENT).unwrap());
        let free_at_start = pool.space().free_segments;
        // A first store that crashed after allocating the header, before publishing it.
        pool.alloc(1, CLUSTER_META_TAG).unwrap();
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), None);
        assert!(tagged(&pool).is_empty());
        assert_eq!(pool.space().free_segments, free_at_start);
        let v1 = meta.store(None, b"one").unwrap();
        drop(meta);
        // A store that crashed after writing its blob, before its slot.
        let stray = pool.alloc(2, CLUSTER_META_TAG).unwrap();
        pool.write(stray.offset, b"half").unwrap();
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), versioned(v1, b"one"));
        assert!(!tagged(&pool).contains(&stray.offset));
        assert_eq!(tagged(&pool).len(), 2);
        drop(meta);
        // A first store whose slot write was torn: header published, one slot garbage, the other empty.
        let pool = Arc::new(Pool::anonymous(4 << 20, SEGMENT).unwrap());
        let meta = open(&pool).unwrap();
        meta.create_header().unwrap();
        let blob = pool.alloc(1, CLUSTER_META_TAG).unwrap();
        drop(meta);
        pool.write(slot_at(&pool, 0), &[1, 2, 3]).unwrap();
        let meta = open(&pool).unwrap();
        assert_eq!(meta.load().unwrap(), None);
        assert!(!tagged(&pool).contains(&blob.offset));
        let v = meta.store(None, b"first").unwrap();
        assert!(v >= 1);
    }

    #[test]
    fn repeated_stores_do_not_leak_pool_space() {
        let pool = Arc::new(Pool::anonymous(8 << 20, SEGMENT).unwrap());
        let meta = open(&pool).unwrap();
        let mut v = meta.store(None, &[0u8; 100]).unwrap();
        v = meta.store(Some(v), &[1u8; 100]).unwrap();
        let free = pool.space().free_segments;
        for i in 0..200u32 {
            // Sizes vary from one segment to three.
            let len = 1 + (i as usize * 7919) % (3 * SEGMENT as usize - 1);
            v = meta.store(Some(v), &vec![i as u8; len]).unwrap();
        }
        v = meta.store(Some(v), &[2u8; 100]).unwrap();
        meta.store(Some(v), &[3u8; 100]).unwrap();
        assert_eq!(pool.space().free_segments, free);
        assert_eq!(tagged(&pool).len(), 3);
    }

    #[test]
    fn a_full_pool_refuses_the_store_and_keeps_the_record() {
        let pool = Arc::new(Pool::anonymous(1 << 20, SEGMENT).unwrap());
        let meta = open(&pool).unwrap();
        let v = meta.store(None, b"small").unwrap();
        let too_big = vec![7u8; (pool.space().free_segments as usize + 1) * SEGMENT as usize];
        assert!(matches!(
            meta.store(Some(v), &too_big),
            Err(MetaError::Unavailable(_))
        ));
        assert_eq!(meta.load().unwrap(), versioned(v, b"small"));
        drop(meta);
        assert_eq!(open(&pool).unwrap().load().unwrap(), versioned(v, b"small"));
    }
}
