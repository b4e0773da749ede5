//! Durability levels for `Pool::persist`.

use serde::{Deserialize, Serialize};

/// What `persist(range)` does, and so what survives which failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode", deny_unknown_fields)]
pub enum PersistMode {
    /// Nothing: the shared file mapping already survives a killed process; a power loss may lose recent writes.
    Volatile,
    /// Like `Volatile`, plus a background msync of the whole pool every `interval_ms` (Redis's
    /// `appendfsync everysec`). The default, with one second.
    Periodic {
        /// Milliseconds between background msyncs.
        interval_ms: u64,
    },
    /// msync of every persisted range before it is acknowledged: power-safe on a plain file, and slow.
    Durable,
    /// Cache-line flush and store fence of every persisted range: power-safe on a DAX-mapped persistent memory
    /// device, and cheap there.
    Dax,
}

impl Default for PersistMode {
    fn default() -> Self {
        PersistMode::Periodic { interval_ms: 1000 }
    }
}

impl std::str::FromStr for PersistMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "volatile" => Ok(PersistMode::Volatile),
            "periodic" => Ok(PersistMode::default()),
            "durable" => Ok(PersistMode::Durable),
            "dax" => Ok(PersistMode::Dax),
            other => Err(format!(
                "unknown persist mode {other:?} (expected volatile, periodic, durable or dax)"
            )),
        }
    }
}

impl PersistMode {
    /// True when `persist` must run before a write is acknowledged.
    pub fn flushes_on_persist(&self) -> bool {
        matches!(self, PersistMode::Durable | PersistMode::Dax)
    }
}

const CACHE_LINE: usize = 64;

/// Flushes every cache line of `[ptr, ptr + len)` and fences.
///
/// # Safety
/// The range must be mapped.
pub(crate) unsafe fn flush_cache_lines(ptr: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_clflush, _mm_sfence};
        let start = (ptr as usize) & !(CACHE_LINE - 1);
        let end = ptr as usize + len;
        let mut line = start;
        while line < end {
            // SAFETY: the line overlaps the mapped range (caller's contract); clflush needs SSE2, part of x86_64.
            unsafe { _mm_clflush(line as *const u8) };
            line += CACHE_LINE;
        }
        // SAFETY: sfence has no preconditions.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ptr, len, CACHE_LINE);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}
