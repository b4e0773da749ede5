//! A client of a [`crate::MetaService`]: the embedded store reached over the fabric.

use std::sync::Mutex;
use std::time::Duration;

use dinomo_fabric::{Connector, Endpoint, FabricError, VerbError, decode, encode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::service::{
    GrantRequest, META_GRANT, META_KEEP_ALIVE, META_LEADER, META_LOAD, META_MEMBERS, META_REGISTER,
    META_REVOKE, META_STORE, META_TRY_LEAD, RegisterRequest, RevokeRequest, StoreRequest,
    TryLeadRequest,
};
use crate::{LeaseId, MetaError, MetaStore, Versioned};

/// [`MetaStore`] by RPC to the memory node that hosts the embedded store.
///
/// One connection, opened at the first call and shared by all threads (calls are serialised; metadata traffic is
/// light). A call whose connection turns out to be lost is sent once more on a new connection; resendable
/// mutations carry a request id so the service runs them only once. Everything the fabric reports is
/// [`MetaError::Unavailable`], except a request too large for the fabric, which is [`MetaError::Invalid`].
pub struct RemoteMeta {
    connector: Connector,
    endpoint: Mutex<Option<Endpoint>>,
}

impl std::fmt::Debug for RemoteMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMeta")
            .field("target", &self.connector.target)
            .finish_non_exhaustive()
    }
}

fn request_id() -> u64 {
    // 0 would opt out of duplicate suppression.
    rand::random::<u64>().max(1)
}

impl RemoteMeta {
    /// A client reaching the store through `connector`; connects lazily.
    pub fn new(connector: Connector) -> RemoteMeta {
        RemoteMeta {
            connector,
            endpoint: Mutex::new(None),
        }
    }

    fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u16,
        request: &Req,
    ) -> Result<Resp, MetaError> {
        let mut body = Vec::new();
        encode(request, &mut body)
            .map_err(|e| MetaError::Invalid(format!("request cannot be encoded: {e}")))?;
        let mut reply = Vec::new();
        let mut slot = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        for attempt in 0..2 {
            let ep = match slot.as_mut() {
                Some(ep) => ep,
                None => slot.insert(self.connector.connect().map_err(|e| {
                    MetaError::Unavailable(format!("cannot reach the metadata store: {e}"))
                })?),
            };
            match ep.rpc(method, &body, &mut reply) {
                Ok(()) => {
                    let r: Result<Resp, MetaError> = decode(&reply).map_err(|e| {
                        MetaError::Unavailable(format!("undecodable metadata reply: {e}"))
                    })?;
                    return r;
                }
                Err(e) if e.is_connection_lost() => {
                    *slot = None;
                    if attempt == 0 {
                        tracing::debug!(method, error = %e, "metadata connection lost; reconnecting");
                        continue;
                    }
                    return Err(MetaError::Unavailable(format!(
                        "metadata store connection lost: {e}"
                    )));
                }
                Err(FabricError::Verb {
                    error: VerbError::TooLarge,
                    ..
                }) => {
                    return Err(MetaError::Invalid(format!(
                        "request of {} bytes exceeds the fabric's message limit",
                        body.len()
                    )));
                }
                Err(e) => {
                    return Err(MetaError::Unavailable(format!(
                        "metadata call {method} failed: {e}"
                    )));
                }
            }
        }
        Err(MetaError::Unavailable(
            "metadata store connection lost".into(),
        ))
    }
}

impl MetaStore for RemoteMeta {
    fn load(&self) -> Result<Option<Versioned>, MetaError> {
        self.call(META_LOAD, &())
    }

    fn store(&self, expected: Option<u64>, value: &[u8]) -> Result<u64, MetaError> {
        self.call(
            META_STORE,
            &StoreRequest {
                request_id: request_id(),
                expected,
                value,
            },
        )
    }

    fn grant(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        self.call(
            META_GRANT,
            &GrantRequest {
                request_id: request_id(),
                ttl,
            },
        )
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.call(META_KEEP_ALIVE, &lease)
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.call(
            META_REVOKE,
            &RevokeRequest {
                request_id: request_id(),
                lease,
            },
        )
    }

    fn register(&self, member: &str, info: &[u8], lease: LeaseId) -> Result<(), MetaError> {
        self.call(
            META_REGISTER,
            &RegisterRequest {
                member,
                info,
                lease,
            },
        )
    }

    fn members(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        self.call(META_MEMBERS, &prefix)
    }

    fn try_lead(&self, election: &str, candidate: &str, lease: LeaseId) -> Result<bool, MetaError> {
        self.call(
            META_TRY_LEAD,
            &TryLeadRequest {
                election,
                candidate,
                lease,
            },
        )
    }

    fn leader(&self, election: &str) -> Result<Option<String>, MetaError> {
        self.call(META_LEADER, &election)
    }
}
