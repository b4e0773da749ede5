//! Setup shared by the integration tests.

use std::path::Path;
use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, EndpointConfig, MemoryNode, NodeConfig, Target};
use dinomo_kn::{EmbeddedConfig, KnConfig};
use dinomo_pool::Pool;

/// Bytes of a log segment (and of the pool's allocation unit) in [`small_file_store`].
#[allow(dead_code)]
pub const SMALL_SEGMENT: u64 = 64 << 10;

/// An embedded store on the pool file at `path`: `pool_size` bytes in 64 KiB segments, `threads` workers, values
/// up to 4 KiB (so that an entry fits in a segment).
#[allow(dead_code)]
pub fn small_file_store(path: &Path, pool_size: u64, threads: usize) -> EmbeddedConfig {
    EmbeddedConfig {
        pool_path: Some(path.to_path_buf()),
        pool_size,
        pool_segment_size: SMALL_SEGMENT,
        processor: ProcessorConfig {
            segment_size: SMALL_SEGMENT,
            ..ProcessorConfig::default()
        },
        kn: KnConfig {
            threads,
            max_value_len: 4096,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    }
}

/// An in-process memory node over a small anonymous pool (64 MiB, 16 KiB segments), with its processor.
#[allow(dead_code)] // Not every test binary that includes this module uses each helper.
pub fn small_memory_node() -> anyhow::Result<(Arc<Processor>, Connector)> {
    let (_, processor, connector) = small_memory_node_with_pool()?;
    Ok((processor, connector))
}

/// [`small_memory_node`], and its pool.
#[allow(dead_code)]
pub fn small_memory_node_with_pool() -> anyhow::Result<(Arc<Pool>, Arc<Processor>, Connector)> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let config = ProcessorConfig {
        segment_size: 16 << 10,
        ..ProcessorConfig::default()
    };
    let (processor, connector) = serve_pool(pool.clone(), &config)?;
    Ok((pool, processor, connector))
}

/// A memory node serving `pool` in process, its processor started with `config`, and a connector to it.
#[allow(dead_code)]
pub fn serve_pool(
    pool: Arc<Pool>,
    config: &ProcessorConfig,
) -> anyhow::Result<(Arc<Processor>, Connector)> {
    serve_pool_with(pool, config, EndpointConfig::default())
}

/// [`serve_pool`], its connector's endpoints made with `endpoint`.
#[allow(dead_code)]
pub fn serve_pool_with(
    pool: Arc<Pool>,
    config: &ProcessorConfig,
    endpoint: EndpointConfig,
) -> anyhow::Result<(Arc<Processor>, Connector)> {
    let processor = Processor::start(pool.clone(), config)?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    Ok((
        processor,
        Connector::with_config(Target::InProcess(node), endpoint),
    ))
}

/// A log's open segment, as read from a pool file.
#[allow(dead_code)]
pub struct OpenHead {
    /// Its offset in the file.
    pub at: usize,
    /// Its header.
    pub header: dinomo_log::SegmentHeader,
    /// The offset in the file of each of its entries, with its sequence number.
    pub entries: Vec<(usize, u64)>,
    /// Where its entries end, in the file.
    pub end: usize,
}

/// The open segment of log `log_id` (its head) in the pool file at `path`.
#[allow(dead_code)]
pub fn open_head(path: &Path, log_id: u32) -> anyhow::Result<OpenHead> {
    let bytes = std::fs::read(path)?;
    let pool = Arc::new(Pool::open_snapshot(path)?.0);
    let dir = dinomo_dpm::directory::Directory::open(pool)?
        .ok_or_else(|| anyhow::anyhow!("the pool has no log directory"))?;
    let head = dir.head(log_id) as usize;
    let h = dinomo_log::SegmentHeader::decode(&bytes[head..])
        .ok_or_else(|| anyhow::anyhow!("log {log_id}: no segment header at its head {head:#x}"))?;
    anyhow::ensure!(
        h.log_id == log_id && h.sealed_len == Ok(0),
        "log {log_id}: its head {head:#x} is not its open segment: {h:?}"
    );
    let data_at = head + dinomo_log::SEGMENT_HEADER_LEN;
    let mut entries = Vec::new();
    let (len, _) = dinomo_log::segment::scan(
        &bytes[data_at..head + h.capacity as usize],
        log_id,
        h.first_seq,
        |at, e| entries.push((data_at + at, e.header.seq)),
    );
    Ok(OpenHead {
        at: head,
        header: h,
        entries,
        end: data_at + len,
    })
}

/// A copy of the pool file `image`, written to `out`, in which the open segment of log `log_id` holds two more
/// entries past its last, the first without its header: what a write cut short by a stop can leave, as a write's
/// bytes land in any order. Returns the bytes of the entry cut, or `None` (writing nothing) when the segment has no
/// room left for the two.
#[allow(dead_code)]
pub fn with_write_cut_short(image: &Path, out: &Path, log_id: u32) -> anyhow::Result<Option<u64>> {
    use dinomo_log::{ENTRY_HEADER_LEN, Op, encode_entry};
    let OpenHead {
        at: head,
        header: h,
        entries,
        end,
    } = open_head(image, log_id)?;
    let next_seq = entries.last().map_or(h.first_seq, |&(_, seq)| seq + 1);
    let mut torn = Vec::new();
    let cut = encode_entry(&mut torn, Op::Put, log_id, next_seq, b"cut", &[7; 8]);
    encode_entry(&mut torn, Op::Put, log_id, next_seq + 1, b"landed", &[8; 8]);
    if end + torn.len() > head + h.capacity as usize {
        return Ok(None);
    }
    torn[..ENTRY_HEADER_LEN].fill(0xa5);
    let mut bytes = std::fs::read(image)?;
    bytes[end..end + torn.len()].copy_from_slice(&torn);
    std::fs::write(out, &bytes)?;
    Ok(Some(cut as u64))
}

/// One node owning every key; `shared` lists keys shared through a cell (selective replication).
#[allow(dead_code)]
pub struct SharingTable {
    pub epoch: u64,
    pub shared: Vec<(Vec<u8>, u64)>,
}

impl dinomo_kn::Ownership for SharingTable {
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn owns(&self, _key: &[u8]) -> bool {
        true
    }
    fn cell(&self, key: &[u8]) -> Option<u64> {
        self.shared
            .iter()
            .find(|(k, _)| k.as_slice() == key)
            .map(|(_, c)| *c)
    }
    fn shared_keys(&self) -> Vec<(Vec<u8>, u64)> {
        self.shared.clone()
    }
}

/// Installs on every worker of `kn` a [`SharingTable`] of `epoch` sharing the keys of `shared` through their
/// cells; the first worker's refusal, if any.
#[allow(dead_code)]
pub fn install_sharing(
    kn: &dinomo_kn::KvNode,
    epoch: u64,
    shared: &[(&[u8], u64)],
) -> Result<(), dinomo_kn::KnError> {
    use dinomo_kn::{Command, KnError, Ownership};
    let own: Arc<dyn Ownership> = Arc::new(SharingTable {
        epoch,
        shared: shared.iter().map(|(k, c)| (k.to_vec(), *c)).collect(),
    });
    let (tx, rx) = crossbeam_channel::unbounded();
    kn.submitter()
        .broadcast(|| Command::Own(own.clone()), 0, &tx)?;
    let mut result = Ok(());
    for _ in 0..kn.threads() {
        if let (_, Err(e)) = rx.recv().map_err(|_| KnError::Stopped)? {
            result = Err(e);
        }
    }
    result
}

/// Has the memory node behind `connector` reserve a cell for `key`; its offset.
#[allow(dead_code)]
pub fn reserve_cell(connector: &Connector, key: &[u8]) -> anyhow::Result<u64> {
    let mut ep = connector.connect()?;
    let r: dinomo_dpm::proto::CellReserved = ep.call(
        dinomo_dpm::proto::RESERVE_CELL,
        &dinomo_dpm::proto::ReserveCell {
            key: key.to_vec(),
            // No management node acts in these tests.
            epoch: 0,
        },
    )?;
    Ok(r.cell)
}

/// A KV node on `connector` with one worker and no cache (every read goes to the pool), values up to
/// `max_value_len` bytes.
#[allow(dead_code)]
pub fn cacheless_kv_node(
    connector: Connector,
    max_value_len: usize,
) -> Result<dinomo_kn::KvNode, dinomo_kn::KnError> {
    dinomo_kn::KvNode::start(
        KnConfig {
            threads: 1,
            max_value_len,
            cache: dinomo_cache::CacheConfig {
                budget_bytes: 0,
                ..dinomo_cache::CacheConfig::default()
            },
            ..KnConfig::default()
        },
        connector,
    )
}

/// What the checker found in log `log_id` of `report`.
#[allow(dead_code)]
pub fn log_check(
    report: &dinomo_dpm::check::PoolCheck,
    log_id: u32,
) -> &dinomo_dpm::check::LogCheck {
    report
        .logs
        .iter()
        .find(|l| l.log == log_id)
        .expect("the log is in the report")
}

/// The bytes the checker counted as cut short and as damaged in log `log_id` of `report`.
#[allow(dead_code)]
pub fn cut_short_and_damaged(report: &dinomo_dpm::check::PoolCheck, log_id: u32) -> (u64, u64) {
    let l = log_check(report, log_id);
    (l.cut_short_bytes, l.damaged_bytes)
}

/// An in-memory embedded store whose 16 KiB log segments a few hundred writes seal several of, so that the open
/// segment, the merge backlog and the index all hold entries: two workers, one merge thread, values up to 2 KiB.
#[allow(dead_code)]
pub fn small_segments_store() -> anyhow::Result<dinomo_kn::Embedded> {
    Ok(dinomo_kn::Embedded::open(&EmbeddedConfig {
        pool_size: 64 << 20,
        pool_segment_size: 16 << 10,
        processor: ProcessorConfig {
            segment_size: 16 << 10,
            merge_threads: 1,
            ..ProcessorConfig::default()
        },
        kn: KnConfig {
            threads: 2,
            max_value_len: 2048,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    })?)
}

/// A whole walk over the memory node's keys (`SCAN`) in steps of `count` keys and replies of at most `max_bytes`,
/// calling `between(step)` between steps; every key named, as often as named. Fails when a step names a key twice
/// or the walk does not end.
#[allow(dead_code)]
pub fn walk(
    processor: &Processor,
    count: u32,
    max_bytes: u32,
    mut between: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut named = Vec::new();
    let mut cursor = 0;
    for step in 0.. {
        anyhow::ensure!(step < 100_000, "the walk does not end");
        let page = processor.scan_keys(&dinomo_dpm::proto::ScanKeys {
            cursor,
            count,
            max_bytes,
        })?;
        anyhow::ensure!(
            page.keys
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                == page.keys.len(),
            "a step names a key twice"
        );
        named.extend(page.keys);
        cursor = page.cursor;
        if cursor == 0 {
            break;
        }
        between(step)?;
    }
    Ok(named)
}
