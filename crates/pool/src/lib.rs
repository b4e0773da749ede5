//! The persistent pool of a memory node.
//!
//! A pool is a memory-mapped file (or an anonymous mapping for tests and volatile runs) holding a checksummed
//! superblock, a set of root slots, a crash-safe segment allocator and the data segments themselves. Everything the
//! memory node stores (log segments, the index, cluster metadata) lives in extents allocated here and is addressed by
//! *pool offset*, so pointers stay valid across restarts and across processes that map the same file.
//!
//! Durability is a setting ([`PersistMode`]): the mapped file alone survives a killed process; `durable` msyncs each
//! persisted range (power-safe on a plain file); `dax` flushes cache lines and fences (power-safe on a DAX device).

mod alloc;
mod layout;
mod persist;
mod prefault;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use alloc::{Extent, MAX_EXTENT_SEGMENTS};
pub use layout::{FORMAT_VERSION, Layout, MAGIC, PAGE, ROOT_SLOTS, Superblock};
pub use persist::PersistMode;

use alloc::{Entry, FreeMap};
use layout::{STATE_OFFSET, decode_state, state_word};
use prefault::Prefaulter;

/// Default allocation unit: one log segment of 8 MiB.
pub const DEFAULT_SEGMENT_SIZE: u64 = 8 << 20;

/// Default of how much of the lowest free space [`Pool::start_prefaulter`] keeps faulted in: 32 MiB.
pub const DEFAULT_PREFAULT_AHEAD: u64 = 32 << 20;

/// Everything that can go wrong with a pool. Opening never modifies a file it rejects.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// An operating-system error on the pool file.
    #[error("pool file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not start with the pool magic.
    #[error("{path} is not a dinomo pool file (bad magic or too short)")]
    NotAPool {
        /// The file.
        path: String,
    },
    /// The file was written by an incompatible format.
    #[error(
        "{path}: pool format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The file.
        path: String,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The superblock failed its checksum or consistency checks.
    #[error("{path}: corrupt superblock: {reason}")]
    CorruptSuperblock {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The allocation table holds an impossible word.
    #[error("{path}: corrupt allocation table: {reason}")]
    CorruptAllocTable {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
    /// Options that cannot describe a pool.
    #[error("invalid pool options: {0}")]
    InvalidOptions(String),
    /// `create` refuses to overwrite.
    #[error("pool file {0} already exists")]
    AlreadyExists(String),
    /// No free run of the requested length.
    #[error("out of pool space: asked for {wanted} contiguous segments, {free} free")]
    OutOfSpace {
        /// Segments requested.
        wanted: u64,
        /// Segments free.
        free: u64,
    },
    /// An access outside the pool.
    #[error("access out of bounds: offset {offset} length {len} in a pool of {size} bytes")]
    OutOfBounds {
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Pool size.
        size: u64,
    },
    /// An 8-byte atomic at an offset that is not 8-byte aligned.
    #[error("atomic access at offset {0} is not 8-byte aligned")]
    Misaligned(u64),
    /// `free` of something that is not the start of an allocated extent.
    #[error("no allocated extent starts at pool offset {0}")]
    NotAllocated(u64),
    /// Root slot index out of range.
    #[error("root slot {0} does not exist (there are {ROOT_SLOTS})")]
    BadRoot(usize),
}

/// How to create a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Total size of the pool file in bytes (a multiple of 4 KiB).
    pub size: u64,
    /// Allocation unit in bytes (a multiple of 4 KiB). Default 8 MiB.
    pub segment_size: u64,
    /// Durability of `persist`. Default: periodic msync every second.
    pub persist: PersistMode,
}

impl PoolOptions {
    /// Options for a pool of `size` bytes with the defaults for everything else.
    pub fn with_size(size: u64) -> PoolOptions {
        PoolOptions {
            size,
            segment_size: DEFAULT_SEGMENT_SIZE,
            persist: PersistMode::default(),
        }
    }
}

/// What `open` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// The previous user closed the pool cleanly; when false, higher layers run their recovery.
    pub was_clean: bool,
    /// How many times the pool has been opened, this time included.
    pub generation: u32,
    /// Continuation words of interrupted allocations that were reclaimed.
    pub reclaimed_orphans: usize,
    /// Continuation words of allocated extents that read free (lost with a page a power loss kept from the file)
    /// and were written again.
    pub completed_continuations: usize,
}

/// Free and used space, in segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Space {
    /// Allocation unit in bytes.
    pub segment_size: u64,
    /// Segments in the data area.
    pub total_segments: u64,
    /// Segments not allocated.
    pub free_segments: u64,
}

impl Space {
    /// Bytes allocated.
    pub fn used_bytes(&self) -> u64 {
        (self.total_segments - self.free_segments) * self.segment_size
    }
    /// Bytes free.
    pub fn free_bytes(&self) -> u64 {
        self.free_segments * self.segment_size
    }
}

/// The mapping itself, shared with the background sync thread.
struct Mapping {
    raw: memmap2::MmapRaw,
    len: u64,
    file_backed: bool,
    /// A copy-on-write mapping of a file: a write fault copies the page.
    private_copy: bool,
}

impl Mapping {
    fn ptr(&self) -> *mut u8 {
        self.raw.as_mut_ptr()
    }

    /// The aligned word at `offset`. Callers check bounds and alignment.
    fn word(&self, offset: u64) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: in bounds and aligned (checked by callers); the mapping lives as long as `self`, and all shared
        // mutation of pool words goes through atomics.
        unsafe { AtomicU64::from_ptr(self.ptr().add(offset as usize).cast::<u64>()) }
    }

    /// Faults in the pages of `len` bytes at `offset` without changing them. A file's pages are faulted in for
    /// reading: the kernel finds or zero-fills them in the page cache and maps them, which is the cost, and leaves
    /// them clean, so a background msync does not write back pages nobody wrote (a writer's first store still
    /// marks its page dirty, a cheap fault). Anonymous memory is faulted in for writing, since reading it would
    /// only map the shared zero page.
    fn populate(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let advice = if self.file_backed {
            memmap2::Advice::PopulateRead
        } else {
            memmap2::Advice::PopulateWrite
        };
        self.raw.advise_range(advice, offset as usize, len as usize)
    }

    fn msync(&self, offset: u64, len: u64) -> std::io::Result<()> {
        if self.file_backed && len > 0 {
            self.raw.flush_range(offset as usize, len as usize)
        } else {
            Ok(())
        }
    }
}

/// Background msync for [`PersistMode::Periodic`].
struct Syncer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Syncer {
    fn start(map: Arc<Mapping>, every: Duration) -> std::io::Result<Syncer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("pool-sync".into())
            .spawn(move || {
                let (lock, cv) = &*stop2;
                let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let (guard, _) = cv
                        .wait_timeout(stopped, every)
                        .unwrap_or_else(|e| e.into_inner());
                    stopped = guard;
                    if *stopped {
                        return;
                    }
                    if let Err(e) = map.msync(0, map.len) {
                        tracing::warn!(error = %e, "periodic pool msync failed");
                    }
                }
            })?;
        Ok(Syncer {
            stop,
            handle: Some(handle),
        })
    }

    fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A mapped persistent pool. Share it as `Arc<Pool>`.
pub struct Pool {
    map: Arc<Mapping>,
    superblock: Superblock,
    mode: PersistMode,
    path: Option<PathBuf>,
    free: Mutex<FreeMap>,
    syncer: Mutex<Option<Syncer>>,
    /// Set once, by [`Pool::start_prefaulter`]; low allocations hand it segments.
    prefaulter: std::sync::OnceLock<Prefaulter>,
    closed: AtomicBool,
    /// A recovery of the layers above was begun and has not ended ([`Pool::begin_recovery`]).
    recovering: AtomicBool,
    // Keeps the file (and its advisory lock) open while mapped.
    _file: Option<File>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.path)
            .field("layout", &self.superblock.layout)
            .field("mode", &self.mode)
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How long opening waits for another holder of the pool lock to let go before reporting it as locked.
///
/// A lock can be held briefly by a process that is not a memory node at all: `flock` belongs to the open file
/// description, and a child forked by any thread of this process shares our descriptors until its `exec` closes
/// them. Waiting rides out that window; a real second memory node still gets a clear error.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Takes an exclusive advisory lock so two memory nodes never map the same pool file.
fn lock_exclusive(file: &File, path: &Path) -> Result<(), PoolError> {
    lock(file, path, libc::LOCK_EX)
}

/// Takes `how` (`LOCK_EX` or `LOCK_SH`) on the pool file, waiting up to [`LOCK_WAIT`] for another holder.
fn lock(file: &File, path: &Path, how: libc::c_int) -> Result<(), PoolError> {
    use std::os::fd::AsRawFd;
    let started = std::time::Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        // SAFETY: flock on a valid open descriptor has no memory-safety preconditions.
        let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::WouldBlock || started.elapsed() >= LOCK_WAIT {
            return Err(PoolError::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(
                    err.kind(),
                    format!("pool file is locked by another process ({err})"),
                ),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// How [`Pool::open`] and [`Pool::open_snapshot`] map the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Shared mapping under an exclusive lock: writes reach the file.
    Exclusive,
    /// Private (copy-on-write) mapping of a read-only file under a shared lock: writes stay in this process.
    Snapshot,
}

impl Pool {
    /// Creates a new pool file; refuses to overwrite an existing one.
    pub fn create(path: impl AsRef<Path>, opts: &PoolOptions) -> Result<Pool, PoolError> {
        let path = path.as_ref();
        let layout = Layout::compute(opts.size, opts.segment_size)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    PoolError::AlreadyExists(path.display().to_string())
                } else {
                    io_err(path)(e)
                }
            })?;
        lock_exclusive(&file, path)?;
        let init = || -> Result<Pool, PoolError> {
            file.set_len(opts.size).map_err(io_err(path))?;
            let raw = memmap2::MmapOptions::new()
                .len(opts.size as usize)
                .map_raw(&file)
                .map_err(io_err(path))?;
            let map = Arc::new(Mapping {
                raw,
                len: opts.size,
                file_backed: true,
                private_copy: false,
            });
            let superblock = Superblock {
                layout,
                pool_id: rand::random(),
                created_unix_secs: now_secs(),
            };
            let pool = Pool::assemble(
                map,
                superblock,
                opts.persist,
                Some(path.to_path_buf()),
                None,
            )?;
            pool.write_superblock();
            pool.map
                .word(STATE_OFFSET)
                .store(state_word(false, 1), Ordering::Release);
            pool.map.msync(0, pool.map.len).map_err(io_err(path))?;
            Ok(pool)
        };
        match init() {
            Ok(mut pool) => {
                pool._file = Some(file);
                pool.start_syncer()?;
                tracing::info!(path = %path.display(), size = opts.size, segments = layout.segment_count, "created pool");
                Ok(pool)
            }
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Opens an existing pool file. A file of another format, a corrupt superblock or a corrupt allocation table
    /// is rejected with a clear error before anything is written.
    pub fn open(
        path: impl AsRef<Path>,
        mode: PersistMode,
    ) -> Result<(Pool, OpenReport), PoolError> {
        Pool::open_with(path.as_ref(), mode, Access::Exclusive)
    }

    /// Opens a pool file for inspection without changing it: the file is opened read-only and mapped
    /// copy-on-write, so whatever this pool is used for (a recovery run included) stays in this process's memory.
    /// It runs the same checks as [`Pool::open`] and holds a shared lock, so it fails while a memory node serves
    /// the file, and a memory node cannot start on the file while it is held.
    pub fn open_snapshot(path: impl AsRef<Path>) -> Result<(Pool, OpenReport), PoolError> {
        Pool::open_with(path.as_ref(), PersistMode::Volatile, Access::Snapshot)
    }

    fn open_with(
        path: &Path,
        mode: PersistMode,
        access: Access,
    ) -> Result<(Pool, OpenReport), PoolError> {
        let shown = path.display().to_string();
        let mut file = OpenOptions::new()
            .read(true)
            .write(access == Access::Exclusive)
            .open(path)
            .map_err(io_err(path))?;
        match access {
            Access::Exclusive => lock_exclusive(&file, path)?,
            Access::Snapshot => lock(&file, path, libc::LOCK_SH)?,
        }
        let file_len = file.metadata().map_err(io_err(path))?.len();
        let mut page = vec![0u8; PAGE as usize];
        let n = read_up_to(&mut file, &mut page).map_err(io_err(path))?;
        let superblock = Superblock::decode(&page[..n], file_len, &shown)?;
        let layout = superblock.layout;
        // The file is locked (no memory node writes it while we hold the lock); the length was validated against
        // the file.
        let mut options = memmap2::MmapOptions::new();
        options.len(file_len as usize);
        let raw = match access {
            Access::Exclusive => options.map_raw(&file),
            // SAFETY: a private mapping of a locked file: no memory node changes the file under it, and our writes
            // go to private pages; the mapping is only reached through the bounds-checked accessors.
            Access::Snapshot => unsafe { options.map_copy(&file) }.map(memmap2::MmapRaw::from),
        }
        .map_err(io_err(path))?;
        let map = Arc::new(Mapping {
            raw,
            len: file_len,
            // A private mapping is never written back: no msync, and closing it marks nothing.
            file_backed: access == Access::Exclusive,
            private_copy: access == Access::Snapshot,
        });
        let words: Vec<u64> = (0..layout.segment_count)
            .map(|i| {
                map.word(layout.alloc_table_offset + i * 8)
                    .load(Ordering::Acquire)
            })
            .collect();
        let scan = alloc::scan(&words).map_err(|reason| PoolError::CorruptAllocTable {
            path: shown.clone(),
            reason,
        })?;
        // Validation is complete: from here on the file may be written.
        let (was_clean, generation) = decode_state(map.word(STATE_OFFSET).load(Ordering::Acquire));
        let generation = generation.wrapping_add(1);
        let mut pool = Pool::assemble(
            map,
            superblock,
            mode,
            Some(path.to_path_buf()),
            Some(scan.free),
        )?;
        let set_table_word = |i: u64, w: u64| {
            pool.map
                .word(layout.alloc_table_offset + i * 8)
                .store(w, Ordering::Release)
        };
        for &i in &scan.orphans {
            set_table_word(i, 0);
        }
        for &(i, back) in &scan.missing {
            set_table_word(i, alloc::Entry::Continuation { back }.encode());
        }
        if !scan.missing.is_empty() {
            tracing::warn!(
                path = %shown,
                words = scan.missing.len(),
                "allocated extents whose continuation words read free were completed (a power loss kept the page \
                 holding their heads, not the next)"
            );
        }
        pool.persist_table(0, layout.segment_count);
        pool.map
            .word(STATE_OFFSET)
            .store(state_word(false, generation), Ordering::Release);
        pool.map.msync(0, PAGE).map_err(io_err(path))?;
        pool._file = Some(file);
        if let Err(e) = pool.start_syncer() {
            // Refused after marking the file in use: it stays so (a clean mark now would hide a crash before).
            pool.closed.store(true, Ordering::Release);
            return Err(e);
        }
        let report = OpenReport {
            was_clean,
            generation,
            reclaimed_orphans: scan.orphans.len(),
            completed_continuations: scan.missing.len(),
        };
        tracing::info!(path = %shown, ?report, "opened pool");
        Ok((pool, report))
    }

    /// Opens `path` if it exists, else creates it with `opts`. An existing pool keeps its own size and segment size.
    pub fn open_or_create(
        path: impl AsRef<Path>,
        opts: &PoolOptions,
    ) -> Result<(Pool, OpenReport), PoolError> {
        let path = path.as_ref();
        if path.exists() {
            Pool::open(path, opts.persist)
        } else {
            let pool = Pool::create(path, opts)?;
            Ok((
                pool,
                OpenReport {
                    was_clean: true,
                    generation: 1,
                    reclaimed_orphans: 0,
                    completed_continuations: 0,
                },
            ))
        }
    }

    /// A pool in anonymous memory: same layout and allocator, nothing survives the process.
    pub fn anonymous(size: u64, segment_size: u64) -> Result<Pool, PoolError> {
        let layout = Layout::compute(size, segment_size)?;
        let mm = memmap2::MmapOptions::new()
            .len(size as usize)
            .map_anon()
            .map_err(io_err(Path::new("<anonymous>")))?;
        let map = Arc::new(Mapping {
            raw: memmap2::MmapRaw::from(mm),
            len: size,
            file_backed: false,
            private_copy: false,
        });
        let superblock = Superblock {
            layout,
            pool_id: rand::random(),
            created_unix_secs: now_secs(),
        };
        let pool = Pool::assemble(map, superblock, PersistMode::Volatile, None, None)?;
        pool.write_superblock();
        Ok(pool)
    }

    fn assemble(
        map: Arc<Mapping>,
        superblock: Superblock,
        mode: PersistMode,
        path: Option<PathBuf>,
        free: Option<FreeMap>,
    ) -> Result<Pool, PoolError> {
        let layout = superblock.layout;
        Ok(Pool {
            free: Mutex::new(free.unwrap_or_else(|| FreeMap::new(layout.segment_count))),
            map,
            superblock,
            mode,
            path,
            syncer: Mutex::new(None),
            prefaulter: std::sync::OnceLock::new(),
            closed: AtomicBool::new(false),
            recovering: AtomicBool::new(false),
            _file: None,
        })
    }

    fn start_syncer(&self) -> Result<(), PoolError> {
        if let PersistMode::Periodic { interval_ms } = self.mode {
            let s = Syncer::start(self.map.clone(), Duration::from_millis(interval_ms.max(1)))
                .map_err(io_err(self.path.as_deref().unwrap_or(Path::new("<pool>"))))?;
            *self.syncer.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        }
        Ok(())
    }

    /// Starts a thread that keeps the pages of the lowest `ahead_bytes` of free space (rounded up to whole
    /// segments) faulted in, so that the threads writing new log segments do not take those page faults (see the
    /// `prefault` module). False when it does nothing: `ahead_bytes` is 0, the pool is a read-only snapshot or
    /// closed, or a prefaulter runs already.
    pub fn start_prefaulter(&self, ahead_bytes: u64) -> Result<bool, PoolError> {
        let ahead = ahead_bytes.div_ceil(self.superblock.layout.segment_size);
        if ahead == 0 || self.map.private_copy || self.closed.load(Ordering::Acquire) {
            return Ok(false);
        }
        if self.prefaulter.get().is_some() {
            return Ok(false);
        }
        let p = Prefaulter::start(self.map.clone(), ahead)
            .map_err(io_err(self.path.as_deref().unwrap_or(Path::new("<pool>"))))?;
        // A caller that started one meanwhile keeps its own; ours stops before it was handed anything.
        if let Err(ours) = self.prefaulter.set(p) {
            ours.stop();
            return Ok(false);
        }
        let p = self.prefaulter.get().expect("set above");
        self.prefault_ahead(p, &mut self.free.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(true)
    }

    /// Segments the prefaulter has faulted in since it started.
    pub fn prefaulted_segments(&self) -> u64 {
        self.prefaulter
            .get()
            .map_or(0, Prefaulter::faulted_segments)
    }

    /// Hands the prefaulter the lowest free segments it has not had yet. Under the free-map lock, so that claims
    /// follow allocations in order.
    fn prefault_ahead(&self, p: &Prefaulter, free: &mut FreeMap) {
        let mut claimed = Vec::new();
        free.claim_unprimed_ahead(p.ahead, &mut claimed);
        let layout = self.superblock.layout;
        p.want(
            claimed
                .into_iter()
                .map(|i| (layout.segment_offset(i), layout.segment_size)),
        );
    }

    fn write_superblock(&self) {
        let header = self.superblock.encode();
        // SAFETY: page 0 is inside the mapping and no one else writes the header.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), self.map.ptr(), header.len()) };
    }

    /// The pool's layout.
    pub fn layout(&self) -> &Layout {
        &self.superblock.layout
    }

    /// The superblock read at open.
    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// Durability mode in force.
    pub fn persist_mode(&self) -> PersistMode {
        self.mode
    }

    /// Total size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len
    }

    /// Always false: a pool holds at least one segment.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The file backing the pool, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Base address of the mapping, for the fabric's one-sided verbs. Accesses through it must stay within
    /// `len()` bytes; concurrent plain copies may observe torn data, exactly like DMA on a real NIC.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Checks that `[offset, offset + len)` lies inside the pool.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<(), PoolError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.map.len => Ok(()),
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                size: self.map.len,
            }),
        }
    }

    /// Copies bytes out of the pool.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        self.check_range(offset, buf.len() as u64)?;
        // SAFETY: range checked; `buf` is a distinct local buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr().add(offset as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    /// Copies bytes into the pool (not persisted; call [`Pool::persist`]).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        self.check_range(offset, data.len() as u64)?;
        // SAFETY: range checked; `data` is a distinct local buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.ptr().add(offset as usize),
                data.len(),
            )
        };
        Ok(())
    }

    /// The 8-byte word at `offset` as an atomic.
    pub fn atomic_u64(&self, offset: u64) -> Result<&AtomicU64, PoolError> {
        self.check_range(offset, 8)?;
        if offset % 8 != 0 {
            return Err(PoolError::Misaligned(offset));
        }
        Ok(self.map.word(offset))
    }

    /// Makes `[offset, offset + len)` durable according to the pool's [`PersistMode`].
    pub fn persist(&self, offset: u64, len: u64) {
        if len == 0 || self.check_range(offset, len).is_err() {
            return;
        }
        match self.mode {
            PersistMode::Volatile | PersistMode::Periodic { .. } => {}
            PersistMode::Durable => {
                if let Err(e) = self.map.msync(offset, len) {
                    tracing::error!(error = %e, offset, len, "msync failed");
                }
            }
            PersistMode::Dax => {
                // SAFETY: range checked above.
                unsafe {
                    persist::flush_cache_lines(self.map.ptr().add(offset as usize), len as usize)
                }
            }
        }
    }

    /// Writes everything to the file now (used at clean shutdown and by tools).
    pub fn sync_all(&self) -> Result<(), PoolError> {
        self.map
            .msync(0, self.map.len)
            .map_err(io_err(self.path.as_deref().unwrap_or(Path::new("<pool>"))))
    }

    fn persist_table(&self, first: u64, count: u64) {
        self.persist(
            self.superblock.layout.alloc_table_offset + first * 8,
            count * 8,
        );
    }

    fn table_word(&self, index: u64) -> &AtomicU64 {
        self.map
            .word(self.superblock.layout.alloc_table_offset + index * 8)
    }

    /// Allocates `segments` contiguous segments tagged with `tag` (an owner id chosen by the caller, returned by
    /// [`Pool::allocated`] so that owners can find their extents after a restart). The content is not zeroed.
    pub fn alloc(&self, segments: u64, tag: u16) -> Result<Extent, PoolError> {
        self.alloc_placed(segments, tag, Placement::Lowest)
    }

    /// Like [`Pool::alloc`], from the highest free run instead of the lowest. For structures that grow by doubling
    /// and need one contiguous run (index tables): kept at the top, away from the segments taken and freed all the
    /// time at the bottom (log segments), they find a run long enough while the pool has room, where first fit
    /// would leave the free space in pieces between log segments.
    pub fn alloc_high(&self, segments: u64, tag: u16) -> Result<Extent, PoolError> {
        self.alloc_placed(segments, tag, Placement::Highest)
    }

    fn alloc_placed(
        &self,
        segments: u64,
        tag: u16,
        placement: Placement,
    ) -> Result<Extent, PoolError> {
        let layout = self.superblock.layout;
        alloc::check_request(segments, layout.segment_count)?;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let found = match placement {
            Placement::Lowest => free.find(segments),
            Placement::Highest => free.find_last(segments),
        };
        let start = found.ok_or(PoolError::OutOfSpace {
            wanted: segments,
            free: free.free_count(),
        })?;
        free.mark_used(start, segments);
        if let (Placement::Lowest, Some(p)) = (placement, self.prefaulter.get()) {
            self.prefault_ahead(p, &mut free);
        }
        for j in 1..segments {
            self.table_word(start + j)
                .store(Entry::Continuation { back: j }.encode(), Ordering::Release);
        }
        if segments > 1 {
            self.persist_table(start + 1, segments - 1);
        }
        // The head word commits the allocation.
        self.table_word(start)
            .store(Entry::Head { tag, segments }.encode(), Ordering::Release);
        self.persist_table(start, 1);
        Ok(Extent {
            offset: layout.segment_offset(start),
            segments,
            len: segments * layout.segment_size,
            tag,
        })
    }

    /// Allocates enough segments for `bytes` bytes.
    pub fn alloc_bytes(&self, bytes: u64, tag: u16) -> Result<Extent, PoolError> {
        self.alloc(self.segments_for(bytes), tag)
    }

    /// Allocates enough segments for `bytes` bytes, from the top (see [`Pool::alloc_high`]).
    pub fn alloc_bytes_high(&self, bytes: u64, tag: u16) -> Result<Extent, PoolError> {
        self.alloc_high(self.segments_for(bytes), tag)
    }

    /// Keeps the run of `segments` segments starting at pool offset `offset` out of [`Pool::alloc`] (log segments)
    /// until the returned guard drops, while [`Pool::alloc_high`] may still take it: a run being emptied for an
    /// index table is not refilled by what emptying it writes elsewhere. In memory only (a restart forgets it).
    /// `None` when another run is kept or the run does not lie in the pool.
    pub fn keep_for_high(&self, offset: u64, segments: u64) -> Option<KeptRun<'_>> {
        let layout = self.superblock.layout;
        let start = layout
            .segment_index(offset)
            .filter(|&i| layout.segment_offset(i) == offset)?;
        let kept = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keep(start, segments);
        // Not `then_some`: a guard built and dropped on refusal would release the run another caller keeps.
        kept.then(|| KeptRun { pool: self })
    }

    fn segments_for(&self, bytes: u64) -> u64 {
        bytes.max(1).div_ceil(self.superblock.layout.segment_size)
    }

    /// Frees the extent starting at pool offset `offset`.
    pub fn free(&self, offset: u64) -> Result<(), PoolError> {
        let layout = self.superblock.layout;
        let index = match layout.segment_index(offset) {
            Some(i) if layout.segment_offset(i) == offset => i,
            _ => return Err(PoolError::NotAllocated(offset)),
        };
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let segments = match Entry::decode(self.table_word(index).load(Ordering::Acquire)) {
            Some(Entry::Head { segments, .. }) => segments,
            _ => return Err(PoolError::NotAllocated(offset)),
        };
        // Clearing the head commits the free; leftover continuations are reclaimed at the next open if we crash.
        self.table_word(index).store(0, Ordering::Release);
        self.persist_table(index, 1);
        for j in 1..segments {
            self.table_word(index + j).store(0, Ordering::Release);
        }
        if segments > 1 {
            self.persist_table(index + 1, segments - 1);
        }
        free.mark_free(index, segments);
        Ok(())
    }

    /// Every allocated extent, in pool order.
    pub fn allocated(&self) -> Vec<Extent> {
        let layout = self.superblock.layout;
        let _guard = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut i = 0;
        while i < layout.segment_count {
            match Entry::decode(self.table_word(i).load(Ordering::Acquire)) {
                Some(Entry::Head { tag, segments }) => {
                    out.push(Extent {
                        offset: layout.segment_offset(i),
                        segments,
                        len: segments * layout.segment_size,
                        tag,
                    });
                    i += segments;
                }
                _ => i += 1,
            }
        }
        out
    }

    /// Free and used space.
    pub fn space(&self) -> Space {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        Space {
            segment_size: self.superblock.layout.segment_size,
            total_segments: self.superblock.layout.segment_count,
            free_segments: free.free_count(),
        }
    }

    fn root_word(&self, slot: usize) -> Result<&AtomicU64, PoolError> {
        if slot >= ROOT_SLOTS {
            return Err(PoolError::BadRoot(slot));
        }
        Ok(self
            .map
            .word(self.superblock.layout.roots_offset + slot as u64 * 8))
    }

    /// Reads root slot `slot` (0 when never set).
    pub fn root(&self, slot: usize) -> Result<u64, PoolError> {
        Ok(self.root_word(slot)?.load(Ordering::Acquire))
    }

    /// Sets root slot `slot` and persists it.
    pub fn set_root(&self, slot: usize, value: u64) -> Result<(), PoolError> {
        self.root_word(slot)?.store(value, Ordering::Release);
        self.persist(self.superblock.layout.roots_offset + slot as u64 * 8, 8);
        Ok(())
    }

    /// Compare-and-swap on root slot `slot`; returns the previous value.
    pub fn cas_root(&self, slot: usize, expected: u64, new: u64) -> Result<u64, PoolError> {
        let prev = match self.root_word(slot)?.compare_exchange(
            expected,
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(v) | Err(v) => v,
        };
        if prev == expected {
            self.persist(self.superblock.layout.roots_offset + slot as u64 * 8, 8);
        }
        Ok(prev)
    }

    /// Tells the pool that the layers above begin to recover (or format) their structures in it: until
    /// [`Pool::end_recovery`], closing it flushes everything but leaves it marked as not closed cleanly, so a start
    /// that fails halfway leaves the pool as after a crash, for the next start to recover and for a check to read
    /// as such.
    pub fn begin_recovery(&self) {
        self.recovering.store(true, Ordering::Release);
    }

    /// The recovery begun with [`Pool::begin_recovery`] completed: closing the pool marks it cleanly closed again.
    pub fn end_recovery(&self) {
        self.recovering.store(false, Ordering::Release);
    }

    /// Flushes everything and marks the pool cleanly closed, unless a recovery begun in it has not ended
    /// ([`Pool::begin_recovery`]). Also done on drop.
    pub fn close(&self) -> Result<(), PoolError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(p) = self.prefaulter.get() {
            p.stop();
        }
        if let Some(mut s) = self.syncer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            s.stop();
        }
        if !self.map.file_backed {
            return Ok(());
        }
        self.sync_all()?;
        if self.recovering.load(Ordering::Acquire) {
            tracing::warn!(
                path = ?self.path,
                "pool closed before the recovery in it completed: left marked as not closed cleanly"
            );
            return Ok(());
        }
        let (_, generation) = decode_state(self.map.word(STATE_OFFSET).load(Ordering::Acquire));
        self.map
            .word(STATE_OFFSET)
            .store(state_word(true, generation), Ordering::Release);
        self.map
            .msync(0, PAGE)
            .map_err(io_err(self.path.as_deref().unwrap_or(Path::new("<pool>"))))?;
        tracing::info!(path = ?self.path, "closed pool cleanly");
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "closing pool failed");
        }
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Which free run an allocation takes.
#[derive(Clone, Copy, Debug)]
enum Placement {
    Lowest,
    Highest,
}

/// A run kept out of low allocations (see [`Pool::keep_for_high`]); released when dropped.
#[derive(Debug)]
pub struct KeptRun<'a> {
    pool: &'a Pool,
}

impl Drop for KeptRun<'_> {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release_kept();
    }
}
