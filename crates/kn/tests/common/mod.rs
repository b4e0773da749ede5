//! Setup shared by the integration tests.

use std::path::Path;
use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
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
    let processor = Processor::start(pool.clone(), config)?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    Ok((processor, Connector::new(Target::InProcess(node))))
}
