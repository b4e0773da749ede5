//! The metadata store on an etcd cluster (cargo feature `etcd`).
//!
//! Layout under a prefix (default `/dinomo/`):
//! - `<prefix>record`: the cluster record; its version is the key's `mod_revision`, and a store is a transaction
//!   comparing it (`create_revision == 0` when no record is expected).
//! - `<prefix>members/<name>`: a member's info, put with its lease (etcd deletes it when the lease ends).
//! - `<prefix>election/<name>`: the leader's name, put with its lease by the transaction
//!   "`create_revision == 0` → put".
//!
//! Leases are etcd leases. Their TTL is whole seconds, rounded up, and at least [`EtcdConfig::min_ttl`]: etcd itself
//! raises TTLs below its minimum (1.5 × the election timeout, 2 s with default settings) and expires leases with a
//! granularity of about half a second.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use crate::{LeaseId, MetaConfig, MetaError, MetaStore, Versioned};

/// Settings of an [`EtcdMeta`].
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the etcd cluster, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix of everything this store writes. Default `/dinomo/`.
    pub prefix: String,
    /// Time limit of connecting and of every operation. Default 5 s.
    pub timeout: Duration,
    /// Smallest lease TTL requested from etcd. Default 2 s (etcd's minimum with default election settings).
    pub min_ttl: Duration,
    /// Size and name limits (etcd applies its own limits on lease counts and request sizes, 1.5 MiB by default).
    pub limits: MetaConfig,
}

impl EtcdConfig {
    /// The TTL requested from etcd for `ttl`: whole seconds, rounded up, at least `min_ttl`.
    pub fn etcd_ttl(&self, ttl: Duration) -> i64 {
        let ttl = ttl.max(self.min_ttl);
        let whole = ttl
            .as_secs()
            .saturating_add(u64::from(ttl.subsec_nanos() > 0));
        i64::try_from(whole).unwrap_or(i64::MAX)
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/dinomo/".into(),
            timeout: Duration::from_secs(5),
            min_ttl: Duration::from_secs(2),
            limits: MetaConfig::default(),
        }
    }
}

/// [`MetaStore`] on etcd. Owns a small tokio runtime and blocks on it for each call, so the trait stays
/// synchronous; do not call it from inside another tokio runtime.
pub struct EtcdMeta {
    runtime: tokio::runtime::Runtime,
    client: Client,
    config: EtcdConfig,
}

impl std::fmt::Debug for EtcdMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMeta")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Maps an etcd error: a missing lease is [`MetaError::LeaseExpired`], an oversized request is
/// [`MetaError::Invalid`], anything else [`MetaError::Unavailable`].
fn map_err(lease: Option<LeaseId>, e: etcd_client::Error) -> MetaError {
    let text = e.to_string();
    match lease {
        Some(id) if text.contains("lease not found") => MetaError::LeaseExpired(id),
        _ if text.contains("request is too large") || text.contains("message length too large") => {
            MetaError::Invalid(format!("etcd refused the request as too large: {text}"))
        }
        _ => MetaError::Unavailable(format!("etcd: {text}")),
    }
}

fn lease_i64(lease: LeaseId) -> Result<i64, MetaError> {
    i64::try_from(lease).map_err(|_| MetaError::LeaseExpired(lease))
}

impl EtcdMeta {
    /// Connects to `endpoints` with keys under `prefix`; `timeout` bounds connecting and every operation.
    pub fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
    ) -> Result<EtcdMeta, MetaError> {
        EtcdMeta::connect_with(EtcdConfig {
            endpoints: endpoints.to_vec(),
            prefix: prefix.to_string(),
            timeout,
            ..EtcdConfig::default()
        })
    }

    /// Connects with every setting given; fails unless the cluster answers within the timeout.
    pub fn connect_with(config: EtcdConfig) -> Result<EtcdMeta, MetaError> {
        if config.endpoints.is_empty() {
            return Err(MetaError::Invalid("no etcd endpoints given".into()));
        }
        if config.prefix.is_empty() {
            return Err(MetaError::Invalid(
                "the etcd key prefix must not be empty".into(),
            ));
        }
        if config.timeout.is_zero() {
            return Err(MetaError::Invalid("the etcd timeout is zero".into()));
        }
        // One worker keeps the gRPC connection's background work going between calls.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dinomo-etcd")
            .enable_all()
            .build()
            .map_err(|e| MetaError::Unavailable(format!("cannot start the etcd runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            .with_timeout(config.timeout);
        let endpoints = config.endpoints.clone();
        let client = runtime
            .block_on(async {
                tokio::time::timeout(config.timeout, Client::connect(endpoints, Some(options)))
                    .await
            })
            .map_err(|_| MetaError::Unavailable("connecting to etcd timed out".into()))?
            .map_err(|e| map_err(None, e))?;
        let meta = EtcdMeta {
            runtime,
            client,
            config,
        };
        // Connecting is lazy: make sure the cluster answers now rather than at the first real call.
        meta.load()?;
        tracing::info!(endpoints = ?meta.config.endpoints, prefix = %meta.config.prefix, "connected to etcd");
        Ok(meta)
    }

    /// Settings in force.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    fn record_key(&self) -> String {
        format!("{}record", self.config.prefix)
    }

    fn member_key(&self, name: &str) -> String {
        format!("{}members/{name}", self.config.prefix)
    }

    fn election_key(&self, name: &str) -> String {
        format!("{}election/{name}", self.config.prefix)
    }

    /// Runs one operation on the runtime, bounded by the timeout.
    fn run<T, F>(&self, f: impl FnOnce(Client) -> F) -> Result<T, MetaError>
    where
        F: Future<Output = Result<T, MetaError>>,
    {
        let fut = f(self.client.clone());
        self.runtime
            .block_on(async { tokio::time::timeout(self.config.timeout, fut).await })
            .map_err(|_| {
                MetaError::Unavailable(format!(
                    "etcd did not answer within {:?}",
                    self.config.timeout
                ))
            })?
    }
}

impl MetaStore for EtcdMeta {
    fn load(&self) -> Result<Option<Versioned>, MetaError> {
        let key = self.record_key();
        self.run(|mut c| async move {
            let resp = c.get(key, None).await.map_err(|e| map_err(None, e))?;
            Ok(resp.kvs().first().map(|kv| Versioned {
                version: kv.mod_revision() as u64,
                value: kv.value().to_vec(),
            }))
        })
    }

    fn store(&self, expected: Option<u64>, value: &[u8]) -> Result<u64, MetaError> {
        self.config.limits.check_record(value.len())?;
        let key = self.record_key();
        let compare = match expected {
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            // Version 0 is never given out, and a missing key's mod_revision reads as 0: never let it match.
            Some(0) => {
                return Err(MetaError::Conflict {
                    current: self.load()?.map(|v| v.version),
                });
            }
            Some(v) => match i64::try_from(v) {
                Ok(v) => Compare::mod_revision(key.clone(), CompareOp::Equal, v),
                Err(_) => {
                    return Err(MetaError::Conflict {
                        current: self.load()?.map(|v| v.version),
                    });
                }
            },
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.clone(), value, None)])
            .or_else([TxnOp::get(key, None)]);
        self.run(|mut c| async move {
            let resp = c.txn(txn).await.map_err(|e| map_err(None, e))?;
            if resp.succeeded() {
                let revision = resp
                    .header()
                    .map(|h| h.revision())
                    .ok_or_else(|| MetaError::Unavailable("etcd reply without a header".into()))?;
                return Ok(revision as u64);
            }
            let current = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().first().map(|kv| kv.mod_revision() as u64)),
                _ => None,
            });
            Err(MetaError::Conflict {
                current: current.flatten(),
            })
        })
    }

    fn grant(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        self.config.limits.check_ttl(ttl)?;
        let secs = self.config.etcd_ttl(ttl);
        self.run(|mut c| async move {
            let resp = c
                .lease_grant(secs, None)
                .await
                .map_err(|e| map_err(None, e))?;
            if !resp.error().is_empty() {
                return Err(MetaError::Unavailable(format!(
                    "etcd refused the lease: {}",
                    resp.error()
                )));
            }
            u64::try_from(resp.id())
                .ok()
                .filter(|&id| id != 0)
                .ok_or_else(|| {
                    MetaError::Unavailable(format!("etcd granted lease id {}", resp.id()))
                })
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        let id = lease_i64(lease)?;
        self.run(|mut c| async move {
            // Opening the keep-alive stream sends one keep-alive and checks its answer (TTL 0: expired).
            match c.lease_keep_alive(id).await {
                Ok(_) => Ok(()),
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                    Err(MetaError::LeaseExpired(lease))
                }
                Err(e) => Err(map_err(Some(lease), e)),
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), MetaError> {
        let id = lease_i64(lease)?;
        self.run(|mut c| async move {
            c.lease_revoke(id)
                .await
                .map(|_| ())
                .map_err(|e| map_err(Some(lease), e))
        })
    }

    fn register(&self, member: &str, info: &[u8], lease: LeaseId) -> Result<(), MetaError> {
        self.config.limits.check_name("member", member)?;
        self.config.limits.check_info(info.len())?;
        let id = lease_i64(lease)?;
        let key = self.member_key(member);
        let info = info.to_vec();
        self.run(|mut c| async move {
            c.put(key, info, Some(PutOptions::new().with_lease(id)))
                .await
                .map(|_| ())
                .map_err(|e| map_err(Some(lease), e))
        })
    }

    fn members(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        self.config.limits.check_prefix("member", prefix)?;
        let base = self.member_key("");
        let key = self.member_key(prefix);
        self.run(|mut c| async move {
            let resp = c
                .get(key, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| map_err(None, e))?;
            let mut out = resp
                .kvs()
                .iter()
                .map(|kv| {
                    let name = kv
                        .key()
                        .strip_prefix(base.as_bytes())
                        .and_then(|n| std::str::from_utf8(n).ok())
                        .ok_or_else(|| {
                            MetaError::Corrupt(format!(
                                "member key {:?} is not valid UTF-8 under {base:?}",
                                String::from_utf8_lossy(kv.key())
                            ))
                        })?;
                    Ok((name.to_string(), kv.value().to_vec()))
                })
                .collect::<Result<Vec<_>, MetaError>>()?;
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn try_lead(&self, election: &str, candidate: &str, lease: LeaseId) -> Result<bool, MetaError> {
        self.config.limits.check_name("election", election)?;
        self.config.limits.check_name("candidate", candidate)?;
        let id = lease_i64(lease)?;
        let key = self.election_key(election);
        let candidate = candidate.to_string();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                candidate.clone(),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([TxnOp::get(key, None)]);
        self.run(|mut c| async move {
            let resp = c.txn(txn).await.map_err(|e| map_err(Some(lease), e))?;
            if resp.succeeded() {
                tracing::info!(candidate = %candidate, lease, "won an etcd election");
                return Ok(true);
            }
            // Somebody leads; the caller's lease must still be alive, as when it would have won.
            let ttl = c
                .lease_time_to_live(id, None)
                .await
                .map_err(|e| map_err(Some(lease), e))?;
            if ttl.ttl() <= 0 {
                return Err(MetaError::LeaseExpired(lease));
            }
            // The leader is the candidate holding the lease it won with (see the soft store's `try_lead`).
            let leader = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => {
                    g.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease()))
                }
                _ => None,
            });
            Ok(leader.is_some_and(|(name, held)| name == candidate.as_bytes() && held == id))
        })
    }

    fn leader(&self, election: &str) -> Result<Option<String>, MetaError> {
        self.config.limits.check_name("election", election)?;
        let key = self.election_key(election);
        self.run(|mut c| async move {
            let resp = c.get(key, None).await.map_err(|e| map_err(None, e))?;
            resp.kvs()
                .first()
                .map(|kv| {
                    String::from_utf8(kv.value().to_vec()).map_err(|_| {
                        MetaError::Corrupt("the leader's name is not valid UTF-8".into())
                    })
                })
                .transpose()
        })
    }
}
