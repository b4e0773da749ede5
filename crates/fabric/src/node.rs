//! The memory node's side of the fabric: registered regions over a pool, verb execution (the "NIC"), and the
//! processor threads that serve two-sided calls.
//!
//! Both transports execute verbs through [`MemoryNode`], so they agree on every result and every refusal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use dinomo_pool::Pool;

use crate::clients::{ClientId, Clients};
use crate::error::{RpcError, VerbError};
use crate::verbs::{Access, RegionInfo, VerbKind};

/// Name of the region covering the pool's data segments.
pub const DATA_REGION: &str = "data";
/// Name of the read-only region covering the pool's root slots.
pub const ROOTS_REGION: &str = "roots";
/// Regions every memory node registers: the data area and the root slots.
const REGION_COUNT: usize = 2;

/// Whether a presented cluster token equals the expected one, in time that does not depend on where they differ
/// (the token is a secret; only its length can leak).
pub fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    if presented.len() != expected.len() {
        return false;
    }
    presented
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// Settings of a memory node's fabric side. Configuration files hold the cluster token elsewhere (it is shared
/// with the endpoints), so it is left out here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Shared secret every connection must present. Default: empty (accepted only on loopback listeners).
    #[serde(skip)]
    pub cluster_token: String,
    /// Largest payload of one verb or RPC body, in bytes. Default 64 MiB.
    pub max_message_len: u32,
    /// Threads serving two-sided calls (the memory node's processor). Default 2.
    pub rpc_threads: usize,
    /// Bound on queued two-sided calls before callers wait. Default 1024.
    pub rpc_queue: usize,
    /// Revoked clients (KV-node incarnations the cluster took over) remembered and refused when they connect
    /// again; the oldest is forgotten beyond this. The processor keeps as many in the pool, so that a restart
    /// refuses them too. Default 4096.
    pub max_revoked_clients: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cluster_token: String::new(),
            max_message_len: 64 << 20,
            rpc_threads: 2,
            rpc_queue: 1024,
            max_revoked_clients: 4096,
        }
    }
}

/// Serves two-sided calls on the memory node's processor threads.
pub trait RpcHandler: Send + Sync + 'static {
    /// Handles `method` with `request` from `caller` (`None`: a connection that did not name itself), appending
    /// the reply to `response`. A handler that refuses revoked clients ([`MemoryNode::clients`]) looks at the
    /// caller; most need not.
    fn handle(
        &self,
        caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError>;
}

struct RpcJob {
    caller: Option<ClientId>,
    method: u16,
    request: Vec<u8>,
    reply: crossbeam_channel::Sender<Result<Vec<u8>, RpcError>>,
}

/// A memory node: a pool, its registered regions and its processor.
pub struct MemoryNode {
    pool: Arc<Pool>,
    nic: Nic,
    regions: Vec<RegionInfo>,
    config: NodeConfig,
    handler: Arc<RwLock<Option<Arc<dyn RpcHandler>>>>,
    rpc_tx: crossbeam_channel::Sender<RpcJob>,
    rpc_threads: Vec<std::thread::JoinHandle<()>>,
    clients: Arc<Clients>,
}

impl std::fmt::Debug for MemoryNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNode")
            .field("regions", &self.regions)
            .finish()
    }
}

fn random_key() -> u64 {
    // Zero is never a valid key, so an all-zero frame can never pass the check.
    loop {
        let k: u64 = rand::random();
        if k != 0 {
            return k;
        }
    }
}

impl MemoryNode {
    /// Registers the pool's data area (read, write, atomics) and root slots (read only) with fresh random keys,
    /// and starts the processor threads.
    pub fn new(pool: Arc<Pool>, config: NodeConfig) -> Arc<MemoryNode> {
        let layout = *pool.layout();
        let regions: [RegionInfo; REGION_COUNT] = [
            RegionInfo {
                id: 0,
                name: DATA_REGION.to_string(),
                rkey: random_key(),
                start: layout.data_offset,
                len: layout.segment_count * layout.segment_size,
                access: Access::ALL,
            },
            RegionInfo {
                id: 1,
                name: ROOTS_REGION.to_string(),
                rkey: random_key(),
                start: layout.roots_offset,
                len: dinomo_pool::ROOT_SLOTS as u64 * 8,
                access: Access::READ,
            },
        ];
        let handler: Arc<RwLock<Option<Arc<dyn RpcHandler>>>> = Arc::new(RwLock::new(None));
        let (rpc_tx, rpc_rx) = crossbeam_channel::bounded::<RpcJob>(config.rpc_queue.max(1));
        let rpc_threads = (0..config.rpc_threads.max(1))
            .map(|i| {
                let rx = rpc_rx.clone();
                let handler = handler.clone();
                std::thread::Builder::new()
                    .name(format!("dpm-proc-{i}"))
                    .spawn(move || processor_loop(rx, handler))
                    .expect("spawning a processor thread")
            })
            .collect();
        let nic = Nic {
            base: pool.as_ptr(),
            bounds: regions.each_ref().map(|r| RegionBounds {
                rkey: r.rkey,
                start: r.start,
                end: r.start + r.len,
                access: r.access,
            }),
            max_len: config.max_message_len as u64,
            flush: pool
                .persist_mode()
                .flushes_on_persist()
                .then(|| pool.clone()),
        };
        let clients = Clients::new(config.max_revoked_clients);
        Arc::new(MemoryNode {
            clients,
            nic,
            pool,
            regions: regions.into(),
            config,
            handler,
            rpc_tx,
            rpc_threads,
        })
    }

    /// Installs the handler for two-sided calls (the memory node's processor logic).
    pub fn set_rpc_handler(&self, handler: Arc<dyn RpcHandler>) {
        *self.handler.write().unwrap_or_else(|e| e.into_inner()) = Some(handler);
    }

    /// The pool served.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Registered regions.
    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// The verb executor (shared by the TCP server's NIC threads and in-process endpoints).
    pub(crate) fn nic(&self) -> &Nic {
        &self.nic
    }

    /// Settings in force.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub(crate) fn token_matches(&self, presented: &[u8]) -> bool {
        token_matches(presented, self.config.cluster_token.as_bytes())
    }

    /// The clients that named themselves, and revocation ([`Clients::revoke_node`]).
    pub fn clients(&self) -> &Arc<Clients> {
        &self.clients
    }

    /// Runs a two-sided call from `caller` on a processor thread and waits for its reply.
    pub(crate) fn call(
        &self,
        caller: Option<ClientId>,
        method: u16,
        request: Vec<u8>,
    ) -> Result<Vec<u8>, RpcError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.rpc_tx
            .send(RpcJob {
                caller,
                method,
                request,
                reply: tx,
            })
            .map_err(|_| RpcError::ProcessorDown)?;
        rx.recv().map_err(|_| RpcError::ProcessorDown)?
    }
}

fn processor_loop(
    rx: crossbeam_channel::Receiver<RpcJob>,
    handler: Arc<RwLock<Option<Arc<dyn RpcHandler>>>>,
) {
    let mut response = Vec::new();
    while let Ok(job) = rx.recv() {
        let h = handler.read().unwrap_or_else(|e| e.into_inner()).clone();
        response.clear();
        let result = match h {
            None => Err(RpcError::UnknownMethod(job.method)),
            Some(h) => {
                // A handler bug must not take the memory node down.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    h.handle(job.caller, job.method, &job.request, &mut response)
                })) {
                    Ok(r) => r.map(|()| std::mem::take(&mut response)),
                    Err(_) => Err(RpcError::Failed(format!(
                        "handler panicked on method {}",
                        job.method
                    ))),
                }
            }
        };
        let _ = job.reply.send(result);
    }
}

impl Drop for MemoryNode {
    fn drop(&mut self) {
        // Closing the channel ends the processor threads.
        let (dead_tx, _) = crossbeam_channel::bounded(1);
        drop(std::mem::replace(&mut self.rpc_tx, dead_tx));
        for h in self.rpc_threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// Encodes a typed RPC body (postcard).
pub fn encode<T: serde::Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), RpcError> {
    let bytes = postcard::to_stdvec(value).map_err(|e| RpcError::Codec(e.to_string()))?;
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Decodes a typed RPC body (postcard).
pub fn decode<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, RpcError> {
    postcard::from_bytes(bytes).map_err(|e| RpcError::Codec(e.to_string()))
}

/// Bounds and key of one region, packed for the per-verb check.
#[derive(Debug, Clone, Copy)]
struct RegionBounds {
    rkey: u64,
    start: u64,
    end: u64,
    access: Access,
}

/// Executes one-sided verbs on the mapped pool: what a NIC does on a real memory node. Cloned into every
/// in-process endpoint so that the hot path never goes through the node, and used by the TCP server's threads.
#[derive(Clone)]
pub(crate) struct Nic {
    base: *mut u8,
    /// Held inline (not behind a pointer) so that the per-verb check loads the region's bounds straight from the
    /// endpoint.
    bounds: [RegionBounds; REGION_COUNT],
    max_len: u64,
    /// The pool, when its durability mode needs a flush before a write is acknowledged.
    flush: Option<Arc<Pool>>,
}

// SAFETY: `base` points into the pool's mapping, which the owning `MemoryNode` (held by every holder of a `Nic`) keeps
// alive; all access through it is bounds-checked and shared mutation is either atomic (CAS/FAA) or a DMA-like copy
// whose tearing the protocols above tolerate (they validate what they read).
unsafe impl Send for Nic {}
// SAFETY: as above.
unsafe impl Sync for Nic {}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("regions", &self.bounds)
            .finish()
    }
}

impl Nic {
    /// Validates a verb's target and returns a pointer to it.
    #[inline(always)]
    fn check(
        &self,
        kind: VerbKind,
        region: u32,
        rkey: u64,
        offset: u64,
        len: u64,
    ) -> Result<*mut u8, VerbError> {
        let r = self
            .bounds
            .get(region as usize)
            .ok_or(VerbError::NoSuchRegion)?;
        if r.rkey != rkey {
            return Err(VerbError::BadKey);
        }
        if !r.access.allows(Access::for_verb(kind)) {
            return Err(VerbError::AccessDenied);
        }
        if len > self.max_len {
            return Err(VerbError::TooLarge);
        }
        match offset.checked_add(len) {
            Some(end) if offset >= r.start && end <= r.end => {}
            _ => return Err(VerbError::OutOfBounds),
        }
        if matches!(kind, VerbKind::Cas | VerbKind::Faa) && offset % 8 != 0 {
            return Err(VerbError::Misaligned);
        }
        // SAFETY: offset + len lies within the region, which lies within the pool mapping.
        Ok(unsafe { self.base.add(offset as usize) })
    }

    #[inline(always)]
    fn persist(&self, offset: u64, len: u64) {
        if let Some(pool) = &self.flush {
            pool.persist(offset, len);
        }
    }

    /// READ into `dst`.
    #[inline(always)]
    pub(crate) fn read(
        &self,
        region: u32,
        rkey: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), VerbError> {
        let src = self.check(VerbKind::Read, region, rkey, offset, dst.len() as u64)?;
        // SAFETY: `src` is valid for dst.len() bytes (checked); `dst` is a distinct buffer.
        unsafe { copy_payload(src, dst.as_mut_ptr(), dst.len()) };
        // Verbs of a batch complete in order: a later READ must not observe memory older than an earlier one saw
        // (the index's readers depend on it). Free on x86; a real barrier on weaker memory models.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Ok(())
    }

    /// WRITE from `src`, persisted before return when the pool's mode asks for it.
    #[inline(always)]
    pub(crate) fn write(
        &self,
        region: u32,
        rkey: u64,
        offset: u64,
        src: &[u8],
    ) -> Result<(), VerbError> {
        let dst = self.check(VerbKind::Write, region, rkey, offset, src.len() as u64)?;
        // SAFETY: `dst` is valid for src.len() bytes (checked); `src` is a distinct buffer.
        unsafe { copy_payload(src.as_ptr(), dst, src.len()) };
        self.persist(offset, src.len() as u64);
        Ok(())
    }

    #[inline(always)]
    fn word(
        &self,
        kind: VerbKind,
        region: u32,
        rkey: u64,
        offset: u64,
    ) -> Result<&AtomicU64, VerbError> {
        let p = self.check(kind, region, rkey, offset, 8)?;
        // SAFETY: 8 bytes in bounds and 8-byte aligned (pool offsets of aligned words are aligned in memory because
        // the mapping is page aligned); all concurrent mutation of such words is atomic.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// CAS; returns the previous value (the swap happened iff it equals `expected`).
    #[inline(always)]
    pub(crate) fn cas(
        &self,
        region: u32,
        rkey: u64,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64, VerbError> {
        let w = self.word(VerbKind::Cas, region, rkey, offset)?;
        let prev = match w.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) | Err(v) => v,
        };
        if prev == expected {
            self.persist(offset, 8);
        }
        Ok(prev)
    }

    /// FAA; returns the previous value.
    #[inline(always)]
    pub(crate) fn faa(
        &self,
        region: u32,
        rkey: u64,
        offset: u64,
        add: u64,
    ) -> Result<u64, VerbError> {
        let w = self.word(VerbKind::Faa, region, rkey, offset)?;
        let prev = w.fetch_add(add, Ordering::AcqRel);
        self.persist(offset, 8);
        Ok(prev)
    }
}

/// Copies a verb's payload of `len` bytes. Payloads of 8 and 16 bytes (an index's `current` word, a lock word, a
/// counter) are copied inline as whole words, where a call to `memcpy` with a length known only at run time would
/// cost more than the copy itself. Every byte is stored exactly once: a WRITE that stored a word twice (say, as two
/// overlapping halves of a range) could undo a CAS another client made in between, such as the one taking a lock
/// this WRITE released.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the two do not overlap.
#[inline(always)]
unsafe fn copy_payload(src: *const u8, dst: *mut u8, len: usize) {
    use std::ptr::{read_unaligned, write_unaligned};
    // SAFETY: in every branch each access lies within the first `len` bytes of `src` or `dst` (the caller's
    // contract), unaligned accesses are allowed by `read_unaligned` and `write_unaligned`.
    unsafe {
        match len {
            8 => write_unaligned(dst.cast::<u64>(), read_unaligned(src.cast::<u64>())),
            16 => write_unaligned(dst.cast::<u128>(), read_unaligned(src.cast::<u128>())),
            _ => std::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_payload;

    /// Every length, at every misalignment of either side, copies exactly its bytes and nothing around them.
    #[test]
    fn payloads_of_every_small_length_copy_exactly_their_bytes() {
        let src: Vec<u8> = (1..=64).collect();
        for len in 0..=40 {
            for from in 0..8 {
                for to in 0..8 {
                    let mut dst = [0u8; 64];
                    // SAFETY: `from + len` and `to + len` stay within both 64-byte buffers, which are distinct.
                    unsafe { copy_payload(src[from..].as_ptr(), dst[to..].as_mut_ptr(), len) };
                    let mut expected = [0u8; 64];
                    expected[to..to + len].copy_from_slice(&src[from..from + len]);
                    assert_eq!(dst, expected, "len {len}, from {from}, to {to}");
                }
            }
        }
    }
}
