//! A memory node, its processor and one KV node in one process, connected by the in-process fabric: the
//! embedded store used by tests, benchmarks and `dinomo up`.

use std::path::PathBuf;
use std::sync::Arc;

use dinomo_dpm::{Processor, ProcessorConfig, ProcessorStats};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_pool::{OpenReport, PersistMode, Pool, PoolOptions};

use crate::{KnConfig, KnError, KvHandle, KvNode};

/// Settings of an embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// Pool file; `None` keeps the pool in anonymous memory (nothing survives the process).
    pub pool_path: Option<PathBuf>,
    /// Pool size when it is created (default 1 GiB).
    pub pool_size: u64,
    /// Pool allocation unit when it is created (default 1 MiB).
    pub pool_segment_size: u64,
    /// Durability of the pool (default periodic msync every second).
    pub persist: PersistMode,
    /// Bytes of the lowest free pool space kept faulted in ahead of the log writers (see
    /// [`Pool::start_prefaulter`]); 0 turns it off. Default [`dinomo_pool::DEFAULT_PREFAULT_AHEAD`].
    pub prefault_ahead: u64,
    /// Memory-node processor settings.
    pub processor: ProcessorConfig,
    /// KV-node settings.
    pub kn: KnConfig,
    /// Busy-wait added to every round trip, to emulate a microsecond fabric (default 0).
    pub injected_latency_ns: u64,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            pool_path: None,
            pool_size: 1 << 30,
            pool_segment_size: 1 << 20,
            persist: PersistMode::default(),
            prefault_ahead: dinomo_pool::DEFAULT_PREFAULT_AHEAD,
            processor: ProcessorConfig::default(),
            kn: KnConfig::default(),
            injected_latency_ns: 0,
        }
    }
}

/// An embedded store. Dropping it stops the KV node, then the processor, then closes the pool cleanly.
pub struct Embedded {
    kn: Option<KvNode>,
    processor: Arc<Processor>,
    node: Arc<MemoryNode>,
    pool: Arc<Pool>,
    report: Option<OpenReport>,
}

impl Embedded {
    /// Opens (or creates) the pool, recovers the data plane, and starts the KV node.
    pub fn open(cfg: &EmbeddedConfig) -> Result<Embedded, KnError> {
        let pool_err = |e: dinomo_pool::PoolError| KnError::Config(e.to_string());
        let (pool, report) = match &cfg.pool_path {
            Some(path) => {
                let opts = PoolOptions {
                    size: cfg.pool_size,
                    segment_size: cfg.pool_segment_size,
                    persist: cfg.persist,
                };
                let (p, r) = Pool::open_or_create(path, &opts).map_err(pool_err)?;
                (p, Some(r))
            }
            None => (
                Pool::anonymous(cfg.pool_size, cfg.pool_segment_size).map_err(pool_err)?,
                None,
            ),
        };
        let pool = Arc::new(pool);
        pool.start_prefaulter(cfg.prefault_ahead)
            .map_err(pool_err)?;
        let processor = Processor::start(pool.clone(), &cfg.processor)
            .map_err(|e| KnError::Refused(e.to_string()))?;
        let node = MemoryNode::new(pool.clone(), NodeConfig::default());
        processor.serve(&node);
        let mut connector = Connector::new(Target::InProcess(node.clone()));
        connector.config.injected_latency_ns = cfg.injected_latency_ns;
        let kn = KvNode::start(cfg.kn.clone(), connector)?;
        Ok(Embedded {
            kn: Some(kn),
            processor,
            node,
            pool,
            report,
        })
    }

    /// A handle for requests.
    pub fn handle(&self) -> KvHandle {
        self.kn.as_ref().expect("running").handle()
    }

    /// A way to keep many requests in flight (see [`crate::KvNode::submitter`]).
    pub fn submitter(&self) -> crate::Submitter {
        self.kn.as_ref().expect("running").submitter()
    }

    /// The memory-node processor.
    pub fn processor(&self) -> &Arc<Processor> {
        &self.processor
    }

    /// Processor statistics.
    pub fn processor_stats(&self) -> ProcessorStats {
        self.processor.stats()
    }

    /// The memory node.
    pub fn memory_node(&self) -> &Arc<MemoryNode> {
        &self.node
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// How the pool file was found when opened (`None` for an anonymous pool).
    pub fn open_report(&self) -> Option<&OpenReport> {
        self.report.as_ref()
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(kn) = self.kn.take() {
            kn.stop();
        }
        self.processor.shutdown();
        if let Err(e) = self.pool.close() {
            tracing::warn!(error = %e, "closing the pool");
        }
    }
}
