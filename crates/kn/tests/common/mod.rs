//! Setup shared by the integration tests.

use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_pool::Pool;

/// An in-process memory node over a small anonymous pool (64 MiB, 16 KiB segments), with its processor.
pub fn small_memory_node() -> anyhow::Result<(Arc<Processor>, Connector)> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 16 << 10,
            ..ProcessorConfig::default()
        },
    )?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    Ok((processor, Connector::new(Target::InProcess(node))))
}
