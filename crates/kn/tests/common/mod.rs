//! Setup shared by the integration tests.

use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_pool::Pool;

/// An in-process memory node over a small anonymous pool (64 MiB, 16 KiB segments), with its processor.
#[allow(dead_code)] // Not every test binary that includes this module uses each helper.
pub fn small_memory_node() -> anyhow::Result<(Arc<Processor>, Connector)> {
    let (_, processor, connector) = small_memory_node_with_pool()?;
    Ok((processor, connector))
}

/// [`small_memory_node`], and its pool.
pub fn small_memory_node_with_pool() -> anyhow::Result<(Arc<Pool>, Arc<Processor>, Connector)> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 16 << 10,
            ..ProcessorConfig::default()
        },
    )?;
    let node = MemoryNode::new(pool.clone(), NodeConfig::default());
    processor.serve(&node);
    Ok((pool, processor, Connector::new(Target::InProcess(node))))
}
