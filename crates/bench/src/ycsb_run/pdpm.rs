//! The pDPM baselines ([`dinomo_pdpm`]) as a benchmark target: DirectDS, DirectDS-C, CentralDS and Clover (SepDS),
//! started in this process.
//!
//! **Layout.** `memory_nodes` in-process memory nodes, each over its own anonymous pool formatted by the store's
//! `format` (a DirectDS slot table or a CentralDS block area) with slots sized for the workload's key and value
//! sizes; CentralDS adds a coordinator, and Clover its metadata server, on a memory node of its own (its RPCs run on
//! that node's processor threads, whose CPU time is reported as the memory node's RPC time). Clover's memory nodes
//! hold shortcut cells for twice the keys (spread over their home nodes) and data slots for twice the live
//! versions and the clients' granted slots, so that retired versions waiting out the reclaim lease rarely make a
//! writer wait for space. Every copy of a value lives on `replication` distinct
//! memory nodes. Clients reach memory nodes in process, with the injected per-round-trip latency, as DINOMO's KV
//! nodes do.
//!
//! **Compute nodes.** Every benchmark session is one pDPM client: one compute-node thread with its own endpoints.
//! `kns` is the number of compute nodes: sessions are spread over them in turn, and the report's per-node figures
//! (and `kv_nodes`, `kn_threads`) are per compute node. The client threads themselves do the compute nodes' work,
//! so their CPU time is the compute nodes' CPU time.
//!
//! **Operations** run synchronously inside [`Session::submit`] (the clients post one verb batch at a time; there is
//! nothing to pipeline), so `outstanding` above 1 only queues completions.
//!
//! **Counters.** Round trips and bytes are this thread's fabric counters around each operation, summed per compute
//! node. A Clover client's background thread (slot refills and records for the metadata server, off the write
//! path as in the paper) is not in them. The baselines have no cache: the report's cache section is absent, not zero. A store's refusal (a lock
//! not acquired in time, a read that kept seeing a torn copy, a full slot table) is a failed operation, counted as
//! unavailable.
//!
//! **Locks.** No client crashes in a benchmark, so DirectDS's lock lease (after which a lock counts as a crashed
//! client's and is taken over) is twice the operation timeout, longer than any scheduling stall, and a lock is
//! waited for as long as the operation timeout.
//!
//! **Clover's lease.** The metadata server's reclaim lease and the clients' read timeout are
//! `clover_reclaim_lease_ms` and `clover_read_timeout_ms` (the store's 100 ms and 50 ms by default: the lease bounds
//! how many retired slots wait, so it sets the space a write rate needs). A read whose round trip, scheduling
//! stalls of the client thread included, outlasts the timeout starts over (one more round trip, never a wrong
//! value); runs that count round trips exactly set both long.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use dinomo_fabric::counters::thread_snapshot;
use dinomo_fabric::{Connector, CounterSnapshot, MemoryNode, NodeConfig, Target};
use dinomo_kn::WorkerStats;
use dinomo_pdpm::central::{CentralLayout, CentralSettings, Coordinator, CoordinatorConfig};
use dinomo_pdpm::clover::{CloverLayout, CloverSettings, MetadataConfig, MetadataServer};
use dinomo_pdpm::direct::{DirectLayout, DirectSettings, Flavor};
use dinomo_pdpm::{ClientSettings, FailureKind, Layout, PdpmError, PdpmStore};
use dinomo_pool::Pool;

use super::resources::{CpuTimes, NodeCounters, Snapshot};
use super::target::{Session, Store, StoreError, StoreOp, StoreReply};
use super::{InProcessOptions, System, YcsbOptions};
use dinomo_dpm::ProcessorStats;

/// The cache policy the baselines report: they have no cache.
pub const NO_CACHE: &str = "none";

/// Most memory nodes a run may start.
pub const MAX_MEMORY_NODES: usize = 64;

/// Pool segment size of the memory nodes.
const SEGMENT: u64 = 1 << 20;

/// Pool of the coordinator's (or metadata server's) own memory node (it holds no data; the fabric needs a pool
/// behind every node).
pub(crate) const COORDINATOR_POOL: u64 = 4 << 20;

/// Checks the settings of a pDPM run.
pub(crate) fn validate(opts: &YcsbOptions, p: &InProcessOptions) -> anyhow::Result<()> {
    ensure!(
        p.policy == NO_CACHE,
        "{} has no cache: --policy does not apply (got {})",
        opts.system,
        p.policy
    );
    ensure!(
        (1..=MAX_MEMORY_NODES).contains(&p.memory_nodes),
        "--memory-nodes must be 1 to {MAX_MEMORY_NODES} (got {})",
        p.memory_nodes
    );
    ensure!(
        p.replication >= 1 && p.replication as usize <= p.memory_nodes,
        "--replication must be 1 to the number of memory nodes ({}) (got {})",
        p.memory_nodes,
        p.replication
    );
    ensure!(p.pdpm_keys != Some(0), "--pdpm-keys must be at least 1");
    if opts.system == System::Clover {
        ensure!(
            p.clover_read_timeout_ms >= 1
                && p.clover_read_timeout_ms.saturating_mul(2) <= p.clover_reclaim_lease_ms,
            "--clover-read-timeout-ms must be at least 1 and at most half --clover-reclaim-lease-ms (got {} and {})",
            p.clover_read_timeout_ms,
            p.clover_reclaim_lease_ms
        );
    }
    Ok(())
}

/// Keys the store is sized for.
fn capacity(opts: &YcsbOptions, p: &InProcessOptions) -> u64 {
    p.pdpm_keys.unwrap_or_else(|| {
        let more = opts.ops.unwrap_or(opts.records);
        opts.records.saturating_add(more).max(1024)
    })
}

/// An anonymous pool holding an extent of `bytes` and the pool's own metadata.
pub(crate) fn pool_for(bytes: u64) -> anyhow::Result<Arc<Pool>> {
    let size = bytes
        .div_ceil(SEGMENT)
        .saturating_add(2)
        .saturating_mul(SEGMENT);
    Ok(Arc::new(Pool::anonymous(size, SEGMENT).with_context(
        || format!("creating a memory node's pool of {size} bytes"),
    )?))
}

/// One compute node's counters, summed over its clients.
#[derive(Debug, Default)]
struct ComputeCounters {
    gets: AtomicU64,
    puts: AtomicU64,
    round_trips: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
}

impl ComputeCounters {
    fn add(&self, spent: &CounterSnapshot) {
        self.round_trips
            .fetch_add(spent.round_trips, Ordering::Relaxed);
        self.bytes_out.fetch_add(spent.bytes_out, Ordering::Relaxed);
        self.bytes_in.fetch_add(spent.bytes_in, Ordering::Relaxed);
    }

    /// As a KV-node worker's statistics: gets are lookups, puts are writes each committed on its own.
    fn stats(&self) -> WorkerStats {
        let puts = self.puts.load(Ordering::Relaxed);
        WorkerStats {
            lookups: self.gets.load(Ordering::Relaxed),
            writes: puts,
            commits: puts,
            round_trips: self.round_trips.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            ..WorkerStats::default()
        }
    }
}

/// The server of a store that has one (CentralDS's coordinator, Clover's metadata server), only kept alive.
type Server = Arc<dyn std::any::Any + Send + Sync>;

/// A pDPM baseline started in this process.
pub struct PdpmTarget {
    system: System,
    /// Kept alive for the run.
    _memory_nodes: Vec<Arc<MemoryNode>>,
    /// CentralDS's coordinator or Clover's metadata server, and its node.
    _server: Option<(Arc<MemoryNode>, Server)>,
    connectors: Vec<Connector>,
    clients: ClientSettings,
    compute_nodes: Vec<Arc<ComputeCounters>>,
    threads_per_node: usize,
    next_session: AtomicUsize,
}

impl std::fmt::Debug for PdpmTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdpmTarget")
            .field("system", &self.system)
            .field("memory_nodes", &self.connectors.len())
            .field("compute_nodes", &self.compute_nodes.len())
            .finish()
    }
}

impl PdpmTarget {
    /// Formats `p.memory_nodes` memory nodes for `opts.system` with slots for `opts`'s keys and values, and starts
    /// CentralDS's coordinator.
    pub fn start(opts: &YcsbOptions, p: &InProcessOptions) -> anyhow::Result<PdpmTarget> {
        validate(opts, p)?;
        let m = p.memory_nodes;
        let replication = p.replication;
        let keys = capacity(opts, p);
        let max_key = u32::try_from(opts.key_bytes).context("key size")?;
        let max_value = u32::try_from(opts.value_bytes).context("value size")?;
        let mut nodes = Vec::with_capacity(m);
        let mut connectors = Vec::with_capacity(m);
        let node_config = NodeConfig::default();
        let central_settings = CentralSettings::default();
        let lock_wait = opts.op_timeout();
        let geometry = match opts.system {
            System::DirectDs | System::DirectDsC => {
                // A key's slot is on its primary: about keys/M per node, at a load factor of 1/2 for linear probing.
                let slots = keys.saturating_mul(2).div_ceil(m as u64).max(64);
                Layout::Direct(DirectLayout {
                    flavor: if opts.system == System::DirectDsC {
                        Flavor::Crc
                    } else {
                        Flavor::Markers
                    },
                    slots,
                    max_key,
                    max_value,
                    replication,
                })
            }
            System::CentralDs => {
                // Every key holds R blocks; every client may hold a grant of R-block locations (loaders and
                // clients both). Allocation balances the nodes; a quarter more covers the imbalance.
                let sessions = (opts.clients as u64).saturating_mul(2);
                let blocks = keys
                    .saturating_add(sessions.saturating_mul(central_settings.grant_batch as u64))
                    .saturating_mul(replication as u64)
                    .div_ceil(m as u64);
                Layout::Central(CentralLayout {
                    blocks: blocks.saturating_add(blocks / 4).saturating_add(64),
                    max_key,
                    max_value,
                })
            }
            System::Clover => {
                let r = replication as u64;
                let sessions = (opts.clients as u64).saturating_mul(2);
                let granted = sessions.saturating_mul(CloverSettings::default().grant_batch as u64);
                let slots = keys
                    .saturating_add(granted)
                    .saturating_mul(2 * r)
                    .div_ceil(m as u64)
                    .max(8192);
                Layout::Clover(CloverLayout {
                    cells: keys.saturating_mul(2).div_ceil(m as u64).max(64),
                    slots,
                    max_key,
                    max_value,
                    replication,
                })
            }
            other => bail!("{other} is not a pDPM baseline"),
        };
        for _ in 0..m {
            let pool = pool_for(geometry.area_len())?;
            geometry
                .format(&pool)
                .with_context(|| format!("formatting a {} memory node", opts.system))?;
            let node = MemoryNode::new(pool, node_config.clone());
            connectors.push(connector(&node, p.latency_ns));
            nodes.push(node);
        }
        let (clients, coordinator) = match geometry {
            Layout::Direct(_) => (
                ClientSettings::Direct(DirectSettings {
                    lock_lease: lock_wait.saturating_mul(2),
                    lock_wait,
                    ..DirectSettings::default()
                }),
                None,
            ),
            Layout::Central(_) => {
                let coordinator = Coordinator::new(
                    &connectors,
                    CoordinatorConfig {
                        replication,
                        ..CoordinatorConfig::default()
                    },
                )
                .context("starting the CentralDS coordinator")?;
                let host = MemoryNode::new(pool_for(COORDINATOR_POOL)?, node_config);
                coordinator.serve(&host);
                let coordinator_connector = connector(&host, p.latency_ns);
                (
                    ClientSettings::Central {
                        coordinator: coordinator_connector,
                        settings: central_settings,
                    },
                    Some((host, coordinator as Server)),
                )
            }
            Layout::Clover(_) => {
                let ms = MetadataServer::new(
                    &connectors,
                    MetadataConfig {
                        reclaim_lease: Duration::from_millis(p.clover_reclaim_lease_ms),
                        ..MetadataConfig::default()
                    },
                )
                .context("starting Clover's metadata server")?;
                let host = MemoryNode::new(pool_for(COORDINATOR_POOL)?, node_config);
                ms.serve(&host);
                let ms_connector = connector(&host, p.latency_ns);
                (
                    ClientSettings::Clover {
                        metadata_server: ms_connector,
                        settings: CloverSettings {
                            read_timeout: Duration::from_millis(p.clover_read_timeout_ms),
                            ..CloverSettings::default()
                        },
                    },
                    Some((host, ms as Server)),
                )
            }
        };
        let compute = p.kns.clamp(1, opts.clients.max(1));
        Ok(PdpmTarget {
            system: opts.system,
            _memory_nodes: nodes,
            _server: coordinator,
            connectors,
            clients,
            compute_nodes: (0..compute).map(|_| Arc::default()).collect(),
            threads_per_node: opts.clients.div_ceil(compute),
            next_session: AtomicUsize::new(0),
        })
    }
}

pub(crate) fn connector(node: &Arc<MemoryNode>, latency_ns: u64) -> Connector {
    let mut c = Connector::new(Target::InProcess(node.clone()));
    c.config.injected_latency_ns = latency_ns;
    c
}

impl Store for PdpmTarget {
    fn session(&self) -> anyhow::Result<Box<dyn Session>> {
        let client = self
            .clients
            .connect(&self.connectors)
            .with_context(|| format!("connecting a {} client", self.system))?;
        let n = self.next_session.fetch_add(1, Ordering::Relaxed) % self.compute_nodes.len();
        Ok(Box::new(PdpmSession {
            client,
            counters: self.compute_nodes[n].clone(),
            done: VecDeque::new(),
        }))
    }

    fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let nodes = self
            .compute_nodes
            .iter()
            .enumerate()
            .map(|(i, c)| NodeCounters {
                node_id: i as u32,
                // Compute nodes own no part of the key space.
                share: 0.0,
                threads: vec![c.stats()],
            })
            .collect();
        Ok(Snapshot {
            nodes: Some(nodes),
            memory: None,
            cpu: CpuTimes::read(),
            caches: false,
            fabric: None,
        })
    }

    fn memory_stats(&self) -> Option<ProcessorStats> {
        None
    }

    fn layout(&self) -> (Option<usize>, Option<usize>) {
        (Some(self.compute_nodes.len()), Some(self.threads_per_node))
    }
}

/// One pDPM client: operations run when submitted.
struct PdpmSession {
    client: Box<dyn PdpmStore + Send>,
    counters: Arc<ComputeCounters>,
    done: VecDeque<(u64, Result<StoreReply, StoreError>)>,
}

/// A store's error as the benchmark counts it: a request beyond the store's limits is invalid; a write whose
/// fabric failed midway has an unknown outcome; everything else (lock timeouts, torn reads, a full table, a
/// coordinator's refusal) left nothing applied, as a full dinomo store does.
fn store_error(e: PdpmError, write: bool) -> StoreError {
    match e.kind(write) {
        FailureKind::Invalid => StoreError::Invalid(e.to_string()),
        FailureKind::Indeterminate => StoreError::Indeterminate(e.to_string()),
        FailureKind::NotApplied | FailureKind::OutOfSpace => StoreError::Unavailable(e.to_string()),
    }
}

impl Session for PdpmSession {
    fn submit(&mut self, tag: u64, op: StoreOp<'_>) -> Result<(), StoreError> {
        let before = thread_snapshot();
        let result = match op {
            StoreOp::Get(key) => {
                self.counters.gets.fetch_add(1, Ordering::Relaxed);
                self.client
                    .get(key)
                    .map(StoreReply::Value)
                    .map_err(|e| store_error(e, false))
            }
            StoreOp::Set(key, value) => {
                self.counters.puts.fetch_add(1, Ordering::Relaxed);
                self.client
                    .put(key, value)
                    .map(|()| StoreReply::Stored)
                    .map_err(|e| store_error(e, true))
            }
        };
        self.counters.add(&(thread_snapshot() - before));
        self.done.push_back((tag, result));
        Ok(())
    }

    fn next_completion(&mut self) -> Option<(u64, Result<StoreReply, StoreError>)> {
        self.done.pop_front()
    }

    fn outstanding(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_refusals_are_failed_operations_not_invalid_requests() {
        let timeout = PdpmError::LockTimeout {
            node: 0,
            slot: 1,
            waited_ms: 5,
        };
        assert!(matches!(
            store_error(timeout, true),
            StoreError::Unavailable(_)
        ));
        let full = PdpmError::TableFull { probes: 64 };
        assert!(matches!(
            store_error(full, true),
            StoreError::Unavailable(_)
        ));
        let torn = PdpmError::Contended {
            node: 0,
            slot: 1,
            attempts: 3,
        };
        assert!(matches!(
            store_error(torn, false),
            StoreError::Unavailable(_)
        ));
        let big = PdpmError::ValueTooLarge { len: 9, max: 8 };
        assert!(matches!(store_error(big, true), StoreError::Invalid(_)));
    }

    #[test]
    fn sizing_follows_records_and_operations() {
        let opts = YcsbOptions {
            records: 10_000,
            ops: Some(500),
            ..YcsbOptions::default()
        };
        let p = InProcessOptions::default();
        assert_eq!(capacity(&opts, &p), 10_500);
        let small = YcsbOptions {
            records: 10,
            ..YcsbOptions::default()
        };
        assert_eq!(capacity(&small, &p), 1024);
        let fixed = InProcessOptions {
            pdpm_keys: Some(7),
            ..InProcessOptions::default()
        };
        assert_eq!(capacity(&opts, &fixed), 7);
    }
}
