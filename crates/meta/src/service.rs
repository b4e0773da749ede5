//! The embedded store served over the fabric: RPC methods [`META_METHODS`] on the memory node's processor.
//!
//! Bodies are postcard ([`dinomo_fabric::encode`]); every reply is a `Result<T, MetaError>`, so a refusal of the
//! store reaches the client as the same [`MetaError`](crate::MetaError). Fabric-level failures (unknown method, undecodable body) are
//! [`RpcError`]s.
//!
//! Mutating calls that a client may resend after a lost connection (store, grant, revoke) carry a request id: the
//! service remembers the replies of the last [`DEFAULT_DEDUP_WINDOW`] such calls and answers a resent one with the
//! original reply instead of running it twice.

use std::collections::{HashMap, VecDeque};
use std::ops::RangeInclusive;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use dinomo_fabric::{ClientId, RpcError, RpcHandler, decode, encode};
use serde::{Deserialize, Serialize};

use crate::{EmbeddedMeta, LeaseId, MetaStore};

/// RPC methods reserved for the metadata store.
pub const META_METHODS: RangeInclusive<u16> = 100..=119;
/// [`MetaStore::load`]: `()` → `Result<Option<Versioned>, MetaError>`.
pub const META_LOAD: u16 = 100;
/// [`MetaStore::store`]: `StoreRequest` → `Result<u64, MetaError>`.
pub const META_STORE: u16 = 101;
/// [`MetaStore::grant`]: `GrantRequest` → `Result<LeaseId, MetaError>`.
pub const META_GRANT: u16 = 102;
/// [`MetaStore::keep_alive`]: `LeaseId` → `Result<(), MetaError>`.
pub const META_KEEP_ALIVE: u16 = 103;
/// [`MetaStore::revoke`]: `RevokeRequest` → `Result<(), MetaError>`.
pub const META_REVOKE: u16 = 104;
/// [`MetaStore::register`]: `RegisterRequest` → `Result<(), MetaError>`.
pub const META_REGISTER: u16 = 105;
/// [`MetaStore::members`]: prefix → `Result<Vec<(String, Vec<u8>)>, MetaError>`.
pub const META_MEMBERS: u16 = 106;
/// [`MetaStore::try_lead`]: `TryLeadRequest` → `Result<bool, MetaError>`.
pub const META_TRY_LEAD: u16 = 107;
/// [`MetaStore::leader`]: election → `Result<Option<String>, MetaError>`.
pub const META_LEADER: u16 = 108;

/// Replies of resendable calls remembered by default.
pub const DEFAULT_DEDUP_WINDOW: usize = 1024;

/// Request bodies, shared with the client.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoreRequest<'a> {
    pub request_id: u64,
    pub expected: Option<u64>,
    pub value: &'a [u8],
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GrantRequest {
    pub request_id: u64,
    pub ttl: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RevokeRequest {
    pub request_id: u64,
    pub lease: LeaseId,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RegisterRequest<'a> {
    pub member: &'a str,
    pub info: &'a [u8],
    pub lease: LeaseId,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TryLeadRequest<'a> {
    pub election: &'a str,
    pub candidate: &'a str,
    pub lease: LeaseId,
}

/// A remembered reply, or a call still running under that id.
enum Entry {
    Running,
    Done(Vec<u8>),
}

#[derive(Default)]
struct Dedup {
    entries: HashMap<(u16, u64), Entry>,
    /// Finished ids, oldest first, for eviction.
    order: VecDeque<(u16, u64)>,
}

/// Removes a `Running` entry if its call did not finish (an error or a panic), so that waiters run it themselves.
struct RunningGuard<'a> {
    service: &'a MetaService,
    key: (u16, u64),
    done: bool,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut d = self.service.dedup.lock().unwrap_or_else(|e| e.into_inner());
            d.entries.remove(&self.key);
            self.service.dedup_cv.notify_all();
        }
    }
}

/// Answers the metadata RPC methods with an [`EmbeddedMeta`]; install it on the memory node (or forward
/// [`META_METHODS`] to it).
pub struct MetaService {
    meta: Arc<EmbeddedMeta>,
    window: usize,
    dedup: Mutex<Dedup>,
    dedup_cv: Condvar,
}

impl std::fmt::Debug for MetaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaService")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl MetaService {
    /// Serves `meta`, remembering [`DEFAULT_DEDUP_WINDOW`] replies of resendable calls.
    pub fn new(meta: Arc<EmbeddedMeta>) -> MetaService {
        MetaService::with_dedup_window(meta, DEFAULT_DEDUP_WINDOW)
    }

    /// Serves `meta`, remembering `window` replies of resendable calls (at least 1).
    pub fn with_dedup_window(meta: Arc<EmbeddedMeta>, window: usize) -> MetaService {
        MetaService {
            meta,
            window: window.max(1),
            dedup: Mutex::new(Dedup::default()),
            dedup_cv: Condvar::new(),
        }
    }

    /// The store served.
    pub fn meta(&self) -> &Arc<EmbeddedMeta> {
        &self.meta
    }

    /// Handles one call of [`META_METHODS`], appending the reply to `response`.
    pub fn handle(
        &self,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        let m = &*self.meta;
        match method {
            META_LOAD => {
                decode::<()>(request)?;
                encode(&m.load(), response)
            }
            META_STORE => {
                let r: StoreRequest<'_> = decode(request)?;
                self.once(method, r.request_id, response, |out| {
                    encode(&m.store(r.expected, r.value), out)
                })
            }
            META_GRANT => {
                let r: GrantRequest = decode(request)?;
                self.once(method, r.request_id, response, |out| {
                    encode(&m.grant(r.ttl), out)
                })
            }
            META_KEEP_ALIVE => {
                let lease: LeaseId = decode(request)?;
                encode(&m.keep_alive(lease), response)
            }
            META_REVOKE => {
                let r: RevokeRequest = decode(request)?;
                self.once(method, r.request_id, response, |out| {
                    encode(&m.revoke(r.lease), out)
                })
            }
            META_REGISTER => {
                let r: RegisterRequest<'_> = decode(request)?;
                encode(&m.register(r.member, r.info, r.lease), response)
            }
            META_MEMBERS => {
                let prefix: &str = decode(request)?;
                encode(&m.members(prefix), response)
            }
            META_TRY_LEAD => {
                let r: TryLeadRequest<'_> = decode(request)?;
                encode(&m.try_lead(r.election, r.candidate, r.lease), response)
            }
            META_LEADER => {
                let election: &str = decode(request)?;
                encode(&m.leader(election), response)
            }
            _ => Err(RpcError::UnknownMethod(method)),
        }
    }

    /// Runs `call` once per `(method, id)`: a resent call gets the reply of the first (waiting for it if it is
    /// still running). Id 0 opts out.
    fn once(
        &self,
        method: u16,
        id: u64,
        response: &mut Vec<u8>,
        call: impl FnOnce(&mut Vec<u8>) -> Result<(), RpcError>,
    ) -> Result<(), RpcError> {
        if id == 0 {
            return call(response);
        }
        let key = (method, id);
        {
            let mut d = self.dedup.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                match d.entries.get(&key) {
                    Some(Entry::Done(reply)) => {
                        tracing::debug!(method, id, "answering a resent call with its first reply");
                        response.extend_from_slice(reply);
                        return Ok(());
                    }
                    Some(Entry::Running) => {
                        d = self.dedup_cv.wait(d).unwrap_or_else(|e| e.into_inner());
                    }
                    None => {
                        d.entries.insert(key, Entry::Running);
                        break;
                    }
                }
            }
        }
        let mut guard = RunningGuard {
            service: self,
            key,
            done: false,
        };
        let start = response.len();
        call(response)?;
        let mut d = self.dedup.lock().unwrap_or_else(|e| e.into_inner());
        d.entries
            .insert(key, Entry::Done(response[start..].to_vec()));
        d.order.push_back(key);
        while d.order.len() > self.window {
            if let Some(old) = d.order.pop_front() {
                d.entries.remove(&old);
            }
        }
        guard.done = true;
        self.dedup_cv.notify_all();
        Ok(())
    }
}

impl RpcHandler for MetaService {
    fn handle(
        &self,
        _caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        MetaService::handle(self, method, request, response)
    }
}
