//! A routing node: serves the routing table to clients. It follows the cluster record in the metadata store (the
//! M-node updates the record; routing nodes catch up asynchronously, step 7 of the reconfiguration protocol).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use dinomo_kn::{DataOp, ReplySink};
use dinomo_meta::MetaStore;
use dinomo_ring::NodeId;
use tracing::warn;

use crate::server::{Server, ServerLimits, Service};
use crate::stop::StopSignal;
use crate::wire::{ErrorKind, RequestBody, ResponseBody, Routing};
use crate::{ClusterError, ClusterRecord};

pub(crate) struct RoutingService {
    routing: RwLock<Option<Routing>>,
    /// The record's pool (0 until the M-node stored one), for the handshake's welcome.
    pool_id: std::sync::atomic::AtomicU64,
}

impl RoutingService {
    /// The table it serves now.
    pub(crate) fn current(&self) -> Option<Routing> {
        self.routing.read().expect("routing lock").clone()
    }
}

impl Service for RoutingService {
    fn answer(&self, body: RequestBody) -> ResponseBody {
        match body {
            RequestBody::Routing => match self.routing.read().expect("routing lock").clone() {
                Some(r) => ResponseBody::Routing(r),
                None => ResponseBody::Error {
                    kind: ErrorKind::Unavailable,
                    message: "no cluster record yet".into(),
                },
            },
            RequestBody::Ping => ResponseBody::Done,
            other => ResponseBody::Error {
                kind: ErrorKind::Invalid,
                message: format!("a routing node serves routing only, not {other:?}"),
            },
        }
    }

    /// A routing node owns no key, so it refuses every data request as a KV node refuses a key it does not own,
    /// with the epoch of its table. A client sends one here only from a stale table whose KV-node address a
    /// routing node now listens on (a freed port taken again); the refusal makes it fetch the table and go to the
    /// key's owner, where an error would have failed the request.
    fn submit(&self, _id: u64, _op: DataOp, _: Arc<dyn ReplySink>) -> Option<ResponseBody> {
        let epoch = self.current().map_or(0, |r| r.epoch());
        Some(ResponseBody::NotOwner { epoch })
    }

    fn identity(&self) -> (Option<NodeId>, u64) {
        (None, self.pool_id.load(Ordering::Relaxed))
    }
}

/// A running routing node.
pub struct RoutingNode {
    service: Arc<RoutingService>,
    server: Option<Server>,
    stop: Arc<StopSignal>,
    poller: Option<JoinHandle<()>>,
}

impl RoutingNode {
    /// Starts serving on `listen` to clients presenting the cluster token `token`, refreshing from `meta` every
    /// `refresh`.
    pub fn start(
        listen: SocketAddr,
        meta: Arc<dyn MetaStore>,
        refresh: Duration,
        limits: ServerLimits,
        token: &str,
    ) -> Result<RoutingNode, ClusterError> {
        let record = ClusterRecord::load(&*meta)?.map(|(r, _)| r);
        let service = Arc::new(RoutingService {
            pool_id: record.as_ref().map_or(0, |r| r.pool_id).into(),
            routing: RwLock::new(record.map(|r| r.routing)),
        });
        let server = Server::start(listen, limits, token, service.clone(), "dinomo-rn")
            .map_err(|e| ClusterError::Io(format!("cannot listen on {listen}: {e}")))?;
        let stop = Arc::new(StopSignal::default());
        let poller = {
            let (stop, service) = (stop.clone(), service.clone());
            std::thread::Builder::new()
                .name("dinomo-rn-refresh".into())
                .spawn(move || {
                    let mut known = None;
                    while !stop.is_stopped() {
                        match ClusterRecord::load_if_changed(&*meta, known) {
                            Ok(Some((r, version))) => {
                                known = Some(version);
                                if r.pool_id != 0 {
                                    service.pool_id.store(r.pool_id, Ordering::Relaxed);
                                }
                                let mut cur = service.routing.write().expect("routing lock");
                                if cur.as_ref().is_none_or(|c| r.routing.epoch() >= c.epoch()) {
                                    *cur = Some(r.routing);
                                }
                            }
                            Ok(None) => {}
                            Err(e) => warn!(error = %e, "cannot read the cluster record"),
                        }
                        if stop.wait(refresh) {
                            break;
                        }
                    }
                })
                .map_err(|e| ClusterError::Io(e.to_string()))?
        };
        Ok(RoutingNode {
            service,
            server: Some(server),
            stop,
            poller: Some(poller),
        })
    }

    /// The routing node's metrics, for a [`crate::metrics::MetricsServer`].
    pub fn metrics(&self) -> crate::metrics::RoutingMetrics {
        crate::metrics::RoutingMetrics(self.service.clone())
    }

    /// The epoch of the table it serves now (none before it has read a cluster record).
    pub fn epoch(&self) -> Option<u64> {
        self.service.current().map(|r| r.epoch())
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").local_addr()
    }
}

impl Drop for RoutingNode {
    fn drop(&mut self) {
        self.stop.stop();
        self.server.take();
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
    }
}
