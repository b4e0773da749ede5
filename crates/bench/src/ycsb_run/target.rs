//! The store under test, as the benchmark sees it: sessions that pipeline gets and sets, and snapshots of the
//! counters the store keeps. DINOMO over its native protocol implements it, started in this process or running
//! elsewhere; any server speaking the Redis protocol implements them in [`super::resp`], the pDPM baselines in
//! [`super::pdpm`], and another system would implement [`Store`] and [`Session`] the same way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow};
use dinomo_cluster::wire::{RequestBody, ResponseBody};
use dinomo_cluster::{
    Client, ClientConfig, ClientError, LocalCluster, LocalClusterConfig, NodeConfig, NodeStats,
    PipelinedClient,
};
use dinomo_dpm::{Processor, ProcessorConfig, ProcessorStats};
use dinomo_fabric::{Connector, Endpoint, Target};
use dinomo_kn::{DataOp, KnConfig};

use super::pdpm::PdpmTarget;
use super::resources::{CpuTimes, NodeCounters, Snapshot};
use super::resp::RespStore;
use super::{InProcessOptions, NativeOptions, Progress, TargetOptions, YcsbOptions};

/// One operation a benchmark client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp<'a> {
    /// Read a record.
    Get(&'a [u8]),
    /// Write a record (insert or overwrite).
    Set(&'a [u8], &'a [u8]),
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreReply {
    /// A read's value, or `None` when the key is absent.
    Value(Option<Vec<u8>>),
    /// A write was applied.
    Stored,
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The request is wrong (a limit of the store); retrying cannot help.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A write was sent but its outcome is unknown.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// No node served it before the operation's deadline.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// One client's connection to the store, with many operations in flight. Used by one thread.
pub trait Session: Send {
    /// Sends an operation under `tag`; its completion comes back from [`Session::next_completion`].
    fn submit(&mut self, tag: u64, op: StoreOp<'_>) -> Result<(), StoreError>;
    /// The next operation to complete, waiting for one; `None` when nothing is in flight.
    fn next_completion(&mut self) -> Option<(u64, Result<StoreReply, StoreError>)>;
    /// Operations submitted and not yet returned by [`Session::next_completion`].
    fn outstanding(&self) -> usize;
}

/// What the server under test says it is, when the target can ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    /// "dinomo", "redis", or "resp" for a server that does not say.
    pub system: String,
    /// Its version, as it reports it.
    pub version: Option<String>,
}

/// The store under test.
pub trait Store: Send + Sync {
    /// A new client session.
    fn session(&self) -> anyhow::Result<Box<dyn Session>>;
    /// The store's counters now: every KV node's workers, the memory node's processor and the process's thread
    /// CPU times, each where it can be read.
    fn snapshot(&self) -> anyhow::Result<Snapshot>;
    /// The memory node's processor statistics alone (cheap; sampled every second), if they can be read.
    fn memory_stats(&self) -> Option<ProcessorStats>;
    /// How many KV nodes serve, and with how many worker threads each, where known.
    fn layout(&self) -> (Option<usize>, Option<usize>);
    /// What the server says it is; `None` when the target is known without asking (DINOMO over its own protocol).
    fn identity(&self) -> Option<ServerIdentity> {
        None
    }
}

/// Starts or reaches the store `opts` asks for.
pub fn open(
    opts: &YcsbOptions,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<Box<dyn Store>> {
    let client = ClientConfig {
        op_timeout: opts.op_timeout(),
        max_retry_pause: Duration::from_millis(5),
        ..ClientConfig::default()
    };
    match &opts.target {
        TargetOptions::InProcess(p) if opts.system.is_pdpm() => {
            progress(Progress::Phase(format!(
                "starting an in-process {}: {} memory node(s), replication {}, {} compute node(s)",
                opts.system, p.memory_nodes, p.replication, p.kns
            )));
            Ok(Box::new(PdpmTarget::start(opts, p)?))
        }
        TargetOptions::InProcess(p) => {
            progress(Progress::Phase(format!(
                "starting an in-process {} cluster: {} KV node(s) of {} worker(s)",
                opts.system, p.kns, p.kn_threads
            )));
            Ok(Box::new(DinomoStore::in_process(p, opts, client)?))
        }
        TargetOptions::Native(n) => {
            progress(Progress::Phase(format!(
                "connecting to the cluster at {}",
                n.seeds.join(", ")
            )));
            Ok(Box::new(DinomoStore::native(n, client)?))
        }
        TargetOptions::Resp(r) => {
            progress(Progress::Phase(format!(
                "connecting to the RESP server at {}",
                r.addrs.join(", ")
            )));
            Ok(Box::new(RespStore::open(
                r,
                opts.op_timeout(),
                opts.value_bytes,
            )?))
        }
    }
}

/// Where the memory node's statistics come from.
enum MemorySource {
    None,
    Local(Arc<Processor>),
    Remote(Mutex<Endpoint>),
}

/// DINOMO reached over its native protocol.
pub struct DinomoStore {
    client: ClientConfig,
    /// A one-at-a-time client for statistics requests.
    stats: Mutex<Client>,
    memory: MemorySource,
    /// Thread CPU times are read only when the whole cluster runs in this process.
    cpu: bool,
    kn_threads: Option<usize>,
    /// Kept running for the run; stopped when the store is dropped.
    cluster: Option<LocalCluster>,
}

impl DinomoStore {
    /// Starts an in-process cluster with `p`'s settings, sized for `opts`'s records.
    pub fn in_process(
        p: &InProcessOptions,
        opts: &YcsbOptions,
        client: ClientConfig,
    ) -> anyhow::Result<DinomoStore> {
        let policy: dinomo_cache::Policy = p
            .policy
            .parse()
            .map_err(|e| anyhow!("--policy {}: {e}", p.policy))?;
        let variant = opts
            .system
            .variant()
            .ok_or_else(|| anyhow!("{} does not run on a DINOMO cluster", opts.system))?;
        let policy = variant
            .cache_policy(Some(policy))
            .map_err(|e| anyhow!("--policy: {e}"))?;
        let entry = (opts.key_bytes + opts.value_bytes + 64) as u64;
        let pool_size = p
            .pool_bytes
            .unwrap_or_else(|| (opts.records.saturating_mul(entry).saturating_mul(4)).max(1 << 30));
        let threads = p.kn_threads.max(1);
        let mut cfg = LocalClusterConfig {
            pool_size,
            processor: ProcessorConfig {
                merge_threads: p.merge_threads,
                ..ProcessorConfig::default()
            },
            kns: p.kns,
            node: NodeConfig {
                kn: KnConfig {
                    threads,
                    cache: dinomo_cache::CacheConfig {
                        budget_bytes: p.cache_bytes / threads as u64,
                        policy,
                        remember_absent: p.remember_absent,
                        ..dinomo_cache::CacheConfig::default()
                    },
                    read_ahead_bytes: p.read_ahead_bytes,
                    max_key_len: opts.key_bytes.max(KnConfig::default().max_key_len),
                    max_value_len: opts.value_bytes.max(64 << 10),
                    ..KnConfig::default()
                },
                lease_ttl: Duration::from_millis(p.lease_ms),
                heartbeat: Duration::from_millis(p.lease_ms / 10),
                ..NodeConfig::default()
            },
            injected_latency_ns: p.latency_ns,
            ..LocalClusterConfig::default()
        };
        variant.configure(&mut cfg);
        let cluster = LocalCluster::start(cfg).context("starting the in-process cluster")?;
        // The caller's settings, with the cluster's seed and token.
        let ClientConfig { seeds, token, .. } = cluster.client_config();
        let client = ClientConfig {
            seeds,
            token,
            ..client
        };
        let stats = Client::connect(client.clone()).context("connecting to the cluster")?;
        Ok(DinomoStore {
            client,
            stats: Mutex::new(stats),
            memory: MemorySource::Local(cluster.processor().clone()),
            cpu: true,
            kn_threads: Some(threads),
            cluster: Some(cluster),
        })
    }

    /// Reaches a running cluster through `n.seeds`; with `n.dpm`, also its memory node's statistics.
    pub fn native(n: &NativeOptions, client: ClientConfig) -> anyhow::Result<DinomoStore> {
        let client = ClientConfig {
            seeds: n.seeds.clone(),
            token: n.token.clone().into(),
            ..client
        };
        let stats = Client::connect(client.clone())
            .with_context(|| format!("connecting to the cluster at {}", n.seeds.join(", ")))?;
        let memory = match &n.dpm {
            None => MemorySource::None,
            Some(addr) => {
                let sock = std::net::ToSocketAddrs::to_socket_addrs(addr.as_str())
                    .with_context(|| format!("--dpm {addr}"))?
                    .next()
                    .ok_or_else(|| anyhow!("--dpm {addr}: no address"))?;
                let mut c = Connector::new(Target::Tcp(sock));
                c.config.cluster_token = n.token.clone();
                let ep = c
                    .connect()
                    .with_context(|| format!("connecting to the memory node at {addr}"))?;
                MemorySource::Remote(Mutex::new(ep))
            }
        };
        Ok(DinomoStore {
            client,
            stats: Mutex::new(stats),
            memory,
            cpu: false,
            kn_threads: None,
            cluster: None,
        })
    }
}

impl Store for DinomoStore {
    fn session(&self) -> anyhow::Result<Box<dyn Session>> {
        let c = PipelinedClient::connect(self.client.clone()).context("connecting a client")?;
        Ok(Box::new(NativeSession { client: c }))
    }

    fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let cpu = self.cpu.then(CpuTimes::read).flatten();
        let mut stats = self.stats.lock().map_err(|_| anyhow!("stats lock"))?;
        stats.refresh_routing();
        let nodes: Vec<u32> = stats
            .routing()
            .map(|r| r.ring.nodes().collect())
            .unwrap_or_default();
        let mut counters = Vec::with_capacity(nodes.len());
        for node in nodes {
            let doc = stats
                .node_stats(node)
                .with_context(|| format!("statistics of KV node {node}"))?;
            let doc: NodeStats = serde_json::from_str(&doc)
                .with_context(|| format!("statistics of KV node {node} do not decode"))?;
            counters.push(NodeCounters {
                node_id: doc.node_id,
                share: doc.share,
                threads: doc.threads,
            });
        }
        drop(stats);
        Ok(Snapshot {
            nodes: Some(counters),
            memory: self.memory_stats(),
            cpu,
            caches: true,
            fabric: None,
        })
    }

    fn memory_stats(&self) -> Option<ProcessorStats> {
        match &self.memory {
            MemorySource::None => None,
            MemorySource::Local(p) => Some(p.stats()),
            MemorySource::Remote(ep) => {
                let mut ep = ep.lock().ok()?;
                ep.call(dinomo_dpm::proto::STATS, &()).ok()
            }
        }
    }

    fn layout(&self) -> (Option<usize>, Option<usize>) {
        let nodes = self
            .stats
            .lock()
            .ok()
            .and_then(|s| s.routing().map(|r| r.ring.len()));
        (nodes, self.kn_threads)
    }
}

impl Drop for DinomoStore {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            c.stop();
        }
    }
}

/// A session over the native protocol.
struct NativeSession {
    client: PipelinedClient,
}

fn store_error(e: ClientError) -> StoreError {
    match e {
        ClientError::Invalid(m) => StoreError::Invalid(m),
        ClientError::Indeterminate(m) => StoreError::Indeterminate(m),
        ClientError::Unavailable(m) | ClientError::OutOfSpace(m) => StoreError::Unavailable(m),
    }
}

impl Session for NativeSession {
    fn submit(&mut self, tag: u64, op: StoreOp<'_>) -> Result<(), StoreError> {
        let body = match op {
            StoreOp::Get(k) => RequestBody::Data(DataOp::Get(k.to_vec())),
            StoreOp::Set(k, v) => RequestBody::Data(DataOp::Set(k.to_vec(), v.to_vec())),
        };
        self.client.submit(tag, body).map_err(store_error)
    }

    fn next_completion(&mut self) -> Option<(u64, Result<StoreReply, StoreError>)> {
        let c = self.client.next_completion()?;
        let result = match c.result {
            Ok(ResponseBody::Value(v)) => Ok(StoreReply::Value(v)),
            Ok(ResponseBody::Applied(_)) => Ok(StoreReply::Stored),
            Ok(other) => Err(StoreError::Invalid(format!("unexpected reply {other:?}"))),
            Err(e) => Err(store_error(e)),
        };
        Some((c.tag, result))
    }

    fn outstanding(&self) -> usize {
        self.client.outstanding()
    }
}
