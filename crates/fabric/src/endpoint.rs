//! Client endpoints: the fabric as a KV-node thread sees it (one endpoint per thread, like an RDMA queue pair).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clients::{ClientId, Refused, Registration};
use crate::counters;
use crate::error::{FabricError, RpcError, VerbError};
use crate::faults::{Fault, FaultHooks, spin_for};
use crate::node::{MemoryNode, Nic};
use crate::verbs::{Batch, RegionInfo, RemoteAddr, VerbKind};
use crate::wire::{
    self, FLAG_LAST, HandshakeReply, REQ_HEADER, RESP_HEADER, ReqHeader, RespHeader, op, status,
};

/// Settings of a client endpoint. Configuration files hold the cluster token elsewhere (it is shared with the
/// memory node), so it is left out here.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Secret presented in the handshake. Default: empty.
    #[serde(skip)]
    pub cluster_token: String,
    /// Busy-wait added to every round trip, to emulate a microsecond-scale fabric on one host. Default 0.
    pub injected_latency_ns: u64,
    /// How long a round trip may take before the endpoint gives up on the connection. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How long connecting and the handshake may take. Default 2 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            cluster_token: String::new(),
            injected_latency_ns: 0,
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Where the memory node is.
#[derive(Debug, Clone)]
pub enum Target {
    /// In this process: verbs become direct atomic and copy operations on the mapped pool.
    InProcess(Arc<MemoryNode>),
    /// A `dinomo dpm` server.
    Tcp(SocketAddr),
}

/// Makes endpoints to one memory node.
///
/// A connector remembers the pool its first endpoint reached (the pool's random identity, from the handshake), and
/// so do its clones, made before or after: an endpoint that finds another pool behind the memory node's address
/// later is refused ([`FabricError::PoolReplaced`]), since the pool offsets, region keys and log positions its users
/// hold belong to the first one.
#[derive(Debug, Clone)]
pub struct Connector {
    /// Where.
    pub target: Target,
    /// How.
    pub config: EndpointConfig,
    /// The identity of the pool the first endpoint reached, shared with every clone.
    pinned_pool: Arc<OnceLock<u64>>,
    /// Fault hooks every endpoint connected from now on shares (tests: see [`Connector::share_fault_hooks`]).
    shared_hooks: Option<Arc<FaultHooks>>,
    /// Who the endpoints say they are in the handshake, if anyone.
    client: Option<ClientId>,
}

impl Connector {
    /// A connector with default settings.
    pub fn new(target: Target) -> Connector {
        Connector::with_config(target, EndpointConfig::default())
    }

    /// A connector with `config`.
    pub fn with_config(target: Target, config: EndpointConfig) -> Connector {
        Connector {
            target,
            config,
            pinned_pool: Arc::new(OnceLock::new()),
            shared_hooks: None,
            client: None,
        }
    }

    /// A connector whose endpoints name themselves as `client` (a KV node's id and incarnation) to the memory
    /// node, which may then revoke them ([`crate::Clients::revoke_node`]) when the cluster takes that node over:
    /// from then on their verbs fail, and so does connecting again ([`FabricError::Revoked`]). It holds to the
    /// same pool as `self`.
    pub fn for_client(&self, client: ClientId) -> Connector {
        Connector {
            client: Some(client),
            ..self.clone()
        }
    }

    /// Makes every endpoint this connector (or a clone made after this call) connects from now on share one set of
    /// fault hooks, returned here: a test's way to delay or cut the round trips of endpoints that code it drives
    /// opens for itself.
    pub fn share_fault_hooks(&mut self) -> Arc<FaultHooks> {
        self.shared_hooks
            .get_or_insert_with(|| Arc::new(FaultHooks::default()))
            .clone()
    }

    /// The pool this connector's endpoints reach, once one has connected.
    pub fn pinned_pool(&self) -> Option<u64> {
        self.pinned_pool.get().copied()
    }

    /// Opens a new endpoint (a new connection for TCP).
    pub fn connect(&self) -> Result<Endpoint, FabricError> {
        let ep = self.connect_any_pool()?;
        let expected = *self.pinned_pool.get_or_init(|| ep.pool_id);
        if ep.pool_id != expected {
            return Err(FabricError::PoolReplaced {
                expected,
                found: ep.pool_id,
            });
        }
        Ok(ep)
    }

    fn connect_any_pool(&self) -> Result<Endpoint, FabricError> {
        let (transport, regions, pool_id, max_message_len) = match &self.target {
            Target::InProcess(node) => {
                if !node.token_matches(self.config.cluster_token.as_bytes()) {
                    return Err(FabricError::Handshake("wrong cluster token".into()));
                }
                let registration = match self.client {
                    Some(id) => Some(Box::new(node.clients().register(id, None)?)),
                    None => None,
                };
                (
                    Transport::InProcess(node.clone(), node.nic().clone(), registration),
                    node.regions().to_vec(),
                    node.pool().superblock().pool_id,
                    node.config().max_message_len,
                )
            }
            Target::Tcp(addr) => {
                let (conn, reply) = TcpConn::connect(*addr, &self.config, self.client)?;
                (
                    Transport::Tcp(Box::new(conn)),
                    reply.regions,
                    reply.pool_id,
                    reply.max_message_len,
                )
            }
        };
        let mut ep = Endpoint {
            transport,
            regions,
            pool_id,
            max_message_len,
            hooks: self.shared_hooks.clone().unwrap_or_default(),
            latency_ns: 0,
            broken: None,
            slow: false,
        };
        ep.set_injected_latency(self.config.injected_latency_ns);
        Ok(ep)
    }
}

enum Transport {
    /// The node is kept alive by the endpoint; verbs go straight to the executor. A named client's endpoint is
    /// registered with the node: its verbs that change the pool run under its gate.
    InProcess(Arc<MemoryNode>, Nic, Option<Box<Registration>>),
    Tcp(Box<TcpConn>),
}

/// One connection to a memory node. Not shared between threads: each thread opens its own.
pub struct Endpoint {
    transport: Transport,
    regions: Vec<RegionInfo>,
    pool_id: u64,
    max_message_len: u32,
    hooks: Arc<FaultHooks>,
    latency_ns: u64,
    broken: Option<String>,
    /// True when a broken connection or an injected latency must be handled: `broken.is_some() || latency_ns > 0`,
    /// kept in one flag so the per-verb check reads one byte.
    slow: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("transport", &self.transport_name())
            .field("regions", &self.regions)
            .finish()
    }
}

impl Endpoint {
    /// "in-process" or "tcp".
    pub fn transport_name(&self) -> &'static str {
        match self.transport {
            Transport::InProcess(..) => "in-process",
            Transport::Tcp(_) => "tcp",
        }
    }

    /// True for an in-process endpoint without injected latency: a round trip is a function call on the mapped
    /// pool, so avoiding one saves next to nothing (less than keeping a record that avoids it may cost).
    pub fn round_trips_are_free(&self) -> bool {
        matches!(self.transport, Transport::InProcess(..)) && self.latency_ns == 0
    }

    /// Regions of the memory node, with their keys.
    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> Option<&RegionInfo> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// Identity of the pool behind this endpoint.
    pub fn pool_id(&self) -> u64 {
        self.pool_id
    }

    /// Largest payload of one verb or call.
    pub fn max_message_len(&self) -> u32 {
        self.max_message_len
    }

    /// Fault hooks of this endpoint (tests).
    pub fn hooks(&self) -> &Arc<FaultHooks> {
        &self.hooks
    }

    /// Changes the injected per-round-trip latency.
    pub fn set_injected_latency(&mut self, ns: u64) {
        self.latency_ns = ns;
        self.refresh_slow();
    }

    /// Marks the endpoint broken: every later round trip fails fast with `why`.
    fn set_broken(&mut self, why: String) {
        self.broken = Some(why);
        self.refresh_slow();
    }

    fn refresh_slow(&mut self) {
        self.slow = self.broken.is_some() || self.latency_ns > 0;
    }

    /// True when a round trip needs no fault, latency or broken-connection handling.
    #[inline(always)]
    fn ready(&self) -> bool {
        !self.slow && !self.hooks.is_armed()
    }

    /// Starts a round trip: refuses on a broken endpoint, applies faults and injected latency.
    #[inline]
    fn begin(&mut self) -> Result<(), FabricError> {
        if let Some(e) = self.revocation() {
            return Err(e);
        }
        if let Some(why) = &self.broken {
            return Err(FabricError::Disconnected(why.clone()));
        }
        match self.hooks.before_round_trip() {
            Fault::None => {}
            Fault::Drop => {
                self.set_broken("an earlier round trip timed out".into());
                return Err(FabricError::Timeout);
            }
            Fault::Cut => {
                if let Transport::Tcp(c) = &self.transport {
                    let _ = c.stream.shutdown(Shutdown::Both);
                }
                self.set_broken("connection cut".into());
                return Err(FabricError::Disconnected("connection cut".into()));
            }
        }
        if self.latency_ns > 0 {
            spin_for(self.latency_ns);
        }
        Ok(())
    }

    /// The error of an in-process endpoint whose client the memory node revoked.
    fn revocation(&self) -> Option<FabricError> {
        match &self.transport {
            Transport::InProcess(_, _, Some(r)) if r.gate().is_revoked() => {
                Some(revoked_error(r.id()))
            }
            _ => None,
        }
    }

    /// Records a transport failure so that later calls fail fast.
    fn fail(&mut self, e: FabricError) -> FabricError {
        if e.is_connection_lost() && self.broken.is_none() {
            self.set_broken(e.to_string());
        }
        e
    }

    /// Refuses a payload larger than the node accepts, before anything is sent.
    fn check_len(&self, kind: VerbKind, len: usize) -> Result<u32, FabricError> {
        if len > self.max_message_len as usize {
            return Err(FabricError::Verb {
                index: 0,
                kind,
                error: VerbError::TooLarge,
            });
        }
        Ok(len as u32)
    }

    /// The executor, when a single verb of `kind` with `len` payload bytes can go straight to it (in process, with
    /// no fault, latency or broken connection to handle), its round trip counted; anything else takes
    /// [`Endpoint::verb_slow`]. Each verb spells out its fast path without closures so that it inlines into the
    /// caller whole.
    #[inline(always)]
    fn fast_path(&self, kind: VerbKind, len: usize) -> Option<&Nic> {
        match &self.transport {
            Transport::InProcess(_, nic, None) if self.ready() => {
                counters::record_single(kind, len as u64);
                Some(nic)
            }
            // A named client's READ changes nothing in the pool: it need not hold the gate, only see a revocation.
            Transport::InProcess(_, nic, Some(r))
                if kind == VerbKind::Read && self.ready() && !r.gate().is_revoked() =>
            {
                counters::record_single(kind, len as u64);
                Some(nic)
            }
            _ => None,
        }
    }

    /// One verb in one round trip through the full path: faults, injected latency, length limit, either transport.
    /// `len` is the payload length; `buf` (the verb's buffer, if any) goes to whichever of `local` and `remote` runs.
    /// Callers pass `move` closures: built only on this path, they copy the verb's arguments, where closures
    /// borrowing them would make the fast path store the arguments to the stack on every verb.
    #[inline(never)]
    fn verb_slow<B, T>(
        &mut self,
        kind: VerbKind,
        len: usize,
        buf: B,
        local: impl FnOnce(&Nic, B) -> Result<T, VerbError>,
        remote: impl FnOnce(&mut TcpConn, u32, B) -> Result<T, FabricError>,
    ) -> Result<T, FabricError> {
        self.begin()?;
        // Atomics carry no payload; READ and WRITE payloads must fit in one message.
        let len = match kind {
            VerbKind::Read | VerbKind::Write => self.check_len(kind, len)?,
            VerbKind::Cas | VerbKind::Faa => len as u32,
        };
        let r = match &mut self.transport {
            Transport::InProcess(_, nic, registration) => {
                as_client(registration.as_deref(), kind != VerbKind::Read, || {
                    local(nic, buf)
                })
                .and_then(|r| r.map_err(|e| verb_err(kind, e)))
            }
            Transport::Tcp(c) => remote(c, len, buf),
        };
        counters::record_single(kind, len as u64);
        r.map_err(|e| self.fail(e))
    }

    /// One-sided READ of `buf.len()` bytes at `addr`.
    #[inline(always)]
    pub fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        if let Some(nic) = self.fast_path(VerbKind::Read, buf.len()) {
            return nic
                .read(addr.region, addr.rkey, addr.offset, buf)
                .map_err(|e| verb_err(VerbKind::Read, e));
        }
        self.verb_slow(
            VerbKind::Read,
            buf.len(),
            buf,
            move |nic, buf| nic.read(addr.region, addr.rkey, addr.offset, buf),
            move |c, len, buf| {
                c.single(VerbKind::Read, addr, len, 0, 0, &[], Some(buf))
                    .map(|_| ())
            },
        )
    }

    /// One-sided WRITE of `data` at `addr`; returns once the write is complete (and persisted, when the node's
    /// durability mode flushes).
    #[inline(always)]
    pub fn write(&mut self, addr: RemoteAddr, data: &[u8]) -> Result<(), FabricError> {
        if let Some(nic) = self.fast_path(VerbKind::Write, data.len()) {
            return nic
                .write(addr.region, addr.rkey, addr.offset, data)
                .map_err(|e| verb_err(VerbKind::Write, e));
        }
        self.verb_slow(
            VerbKind::Write,
            data.len(),
            data,
            move |nic, data| nic.write(addr.region, addr.rkey, addr.offset, data),
            move |c, len, data| {
                c.single(VerbKind::Write, addr, len, 0, 0, data, None)
                    .map(|_| ())
            },
        )
    }

    /// 8-byte compare-and-swap; returns the previous value (the swap happened iff it equals `expected`).
    #[inline(always)]
    pub fn cas(&mut self, addr: RemoteAddr, expected: u64, new: u64) -> Result<u64, FabricError> {
        if let Some(nic) = self.fast_path(VerbKind::Cas, 8) {
            return nic
                .cas(addr.region, addr.rkey, addr.offset, expected, new)
                .map_err(|e| verb_err(VerbKind::Cas, e));
        }
        self.verb_slow(
            VerbKind::Cas,
            8,
            (),
            move |nic, ()| nic.cas(addr.region, addr.rkey, addr.offset, expected, new),
            move |c, len, ()| c.single(VerbKind::Cas, addr, len, expected, new, &[], None),
        )
    }

    /// 8-byte fetch-and-add (wrapping); returns the previous value.
    #[inline(always)]
    pub fn faa(&mut self, addr: RemoteAddr, add: u64) -> Result<u64, FabricError> {
        if let Some(nic) = self.fast_path(VerbKind::Faa, 8) {
            return nic
                .faa(addr.region, addr.rkey, addr.offset, add)
                .map_err(|e| verb_err(VerbKind::Faa, e));
        }
        self.verb_slow(
            VerbKind::Faa,
            8,
            (),
            move |nic, ()| nic.faa(addr.region, addr.rkey, addr.offset, add),
            move |c, len, ()| c.single(VerbKind::Faa, addr, len, add, 0, &[], None),
        )
    }

    /// Posts every verb of `batch` in one round trip and waits for all completions. Verbs execute in order; the
    /// first refused verb is returned as the error and the verbs after it are skipped.
    pub fn post(&mut self, batch: &mut Batch<'_>) -> Result<(), FabricError> {
        batch.failed = None;
        if batch.is_empty() {
            return Ok(());
        }
        if !self.ready() {
            self.begin()?;
        }
        let r = match &mut self.transport {
            // The executor's own length limit is the node's message limit, which the endpoint took at connect.
            Transport::InProcess(_, nic, registration) => {
                // A batch of READs changes nothing: like a single READ, it only needs to see a revocation.
                let reads = batch.tally().only_kind(batch.len()) == Some(VerbKind::Read);
                as_client(registration.as_deref(), !reads, || {
                    exec_batch_in_process(nic, batch)
                })
            }
            Transport::Tcp(c) => c.batch(batch),
        };
        counters::record_batch(batch.tally());
        r.map_err(|e| self.fail(e))?;
        match batch.first_error() {
            Some((index, kind, error)) => Err(FabricError::Verb { index, kind, error }),
            None => Ok(()),
        }
    }

    /// Two-sided call to the memory node's processor: `method` with `request`; the reply replaces `response`.
    pub fn rpc(
        &mut self,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), FabricError> {
        self.begin()?;
        // The request goes out as a payload, like a WRITE's.
        self.check_len(VerbKind::Write, request.len())?;
        let r = match &mut self.transport {
            Transport::InProcess(node, _, registration) => match node.call(
                registration.as_ref().map(|r| r.id()),
                method,
                request.to_vec(),
            ) {
                Ok(v) => {
                    *response = v;
                    Ok(())
                }
                Err(e) => Err(FabricError::Rpc(e)),
            },
            Transport::Tcp(c) => c.rpc(method, request, response),
        };
        let reply_len = if r.is_ok() { response.len() } else { 0 };
        counters::record_rpc(
            (REQ_HEADER + request.len()) as u64,
            (RESP_HEADER + reply_len) as u64,
        );
        r.map_err(|e| self.fail(e))
    }

    /// Typed two-sided call: postcard-encodes `request` and decodes the reply.
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        method: u16,
        request: &Req,
    ) -> Result<Resp, FabricError> {
        let body = postcard::to_stdvec(request).map_err(|e| RpcError::Codec(e.to_string()))?;
        let mut reply = Vec::new();
        self.rpc(method, &body, &mut reply)?;
        Ok(postcard::from_bytes(&reply).map_err(|e| RpcError::Codec(e.to_string()))?)
    }
}

fn revoked_error(id: ClientId) -> FabricError {
    Refused(id).into()
}

/// Runs `f` as a named client's in-process endpoint may: a round trip that changes the pool (`mutates`) under the
/// client's gate, so that a revocation waits for it; one that only reads with the revocation mark checked (a stale
/// READ changes nothing). Without a registration, `f` just runs.
#[inline]
fn as_client<T>(
    registration: Option<&Registration>,
    mutates: bool,
    f: impl FnOnce() -> T,
) -> Result<T, FabricError> {
    let Some(r) = registration else {
        return Ok(f());
    };
    if !mutates {
        if r.gate().is_revoked() {
            return Err(revoked_error(r.id()));
        }
        return Ok(f());
    }
    let _entered = r.gate().enter().ok_or_else(|| revoked_error(r.id()))?;
    Ok(f())
}

#[inline]
fn verb_err(kind: VerbKind, error: VerbError) -> FabricError {
    FabricError::Verb {
        index: 0,
        kind,
        error,
    }
}

/// Runs every verb of `batch` on the executor in one pass, stopping at the first refused verb (the batch keeps it; the
/// verbs after it are skipped).
#[inline]
fn exec_batch_in_process(nic: &Nic, batch: &mut Batch<'_>) {
    // A batch of one kind of verb (the common case) runs a loop compiled for that kind, without a dispatch per verb:
    // `kind` is a constant there, and the op's own kind only for a mixed batch.
    match batch.tally().only_kind(batch.len()) {
        Some(VerbKind::Read) => exec_ops(nic, batch, |_| VerbKind::Read),
        Some(VerbKind::Write) => exec_ops(nic, batch, |_| VerbKind::Write),
        Some(VerbKind::Cas) => exec_ops(nic, batch, |_| VerbKind::Cas),
        Some(VerbKind::Faa) => exec_ops(nic, batch, |_| VerbKind::Faa),
        None => exec_ops(nic, batch, |k| k),
    }
}

#[inline(always)]
fn exec_ops(nic: &Nic, batch: &mut Batch<'_>, kind: impl Fn(VerbKind) -> VerbKind) {
    let Batch {
        ops,
        out,
        data_in,
        failed,
        ..
    } = batch;
    for (index, op) in ops.iter_mut().enumerate() {
        let r = match kind(op.kind) {
            VerbKind::Cas => nic.cas(op.region, op.rkey, op.offset, op.arg0, op.arg1),
            VerbKind::Faa => nic.faa(op.region, op.rkey, op.offset, op.arg0),
            VerbKind::Read => nic
                .read(
                    op.region,
                    op.rkey,
                    op.offset,
                    &mut data_in[op.arg0 as usize..][..op.len as usize],
                )
                .map(|()| 0),
            VerbKind::Write => nic
                .write(op.region, op.rkey, op.offset, op.payload(out))
                .map(|()| 0),
        };
        match r {
            Ok(result) => op.result = result,
            Err(e) => {
                *failed = Some((index as u32, e));
                return;
            }
        }
    }
}

/// Client side of a TCP connection to a memory node.
struct TcpConn {
    stream: TcpStream,
    out: Vec<u8>,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    next_id: u32,
    max_message_len: u32,
}

const MIN_RBUF: usize = 64 << 10;

impl TcpConn {
    fn connect(
        addr: SocketAddr,
        cfg: &EndpointConfig,
        client: Option<ClientId>,
    ) -> Result<(TcpConn, HandshakeReply), FabricError> {
        let stream = TcpStream::connect_timeout(&addr, cfg.connect_timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(cfg.connect_timeout))?;
        stream.set_write_timeout(Some(cfg.connect_timeout))?;
        let token = cfg.cluster_token.as_bytes();
        if token.len() > wire::MAX_TOKEN_LEN {
            return Err(FabricError::Invalid(
                "cluster token longer than 1024 bytes".into(),
            ));
        }
        let mut hello = Vec::with_capacity(8 + token.len() + wire::HANDSHAKE_IDENTITY);
        hello.extend_from_slice(&wire::HANDSHAKE_MAGIC);
        hello.extend_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
        hello.extend_from_slice(&(token.len() as u16).to_le_bytes());
        hello.extend_from_slice(token);
        hello.extend_from_slice(&wire::encode_identity(client));
        let mut s = &stream;
        s.write_all(&hello)?;
        let mut head = [0u8; 5];
        s.read_exact(&mut head).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                FabricError::Handshake("the memory node closed the connection".into())
            }
            _ => FabricError::Io(e),
        })?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > 1 << 20 {
            return Err(FabricError::Protocol(format!(
                "handshake reply of {len} bytes"
            )));
        }
        let mut body = vec![0u8; len];
        s.read_exact(&mut body)?;
        let why = || String::from_utf8_lossy(&body).into_owned();
        match head[0] {
            status::OK => {}
            wire::HANDSHAKE_REVOKED => return Err(FabricError::Revoked(why())),
            _ => return Err(FabricError::Handshake(why())),
        }
        let reply: HandshakeReply = postcard::from_bytes(&body)
            .map_err(|e| FabricError::Protocol(format!("bad handshake reply: {e}")))?;
        stream.set_read_timeout(Some(cfg.timeout))?;
        stream.set_write_timeout(Some(cfg.timeout))?;
        Ok((
            TcpConn {
                stream,
                out: Vec::with_capacity(4096),
                rbuf: vec![0; MIN_RBUF],
                rpos: 0,
                rlen: 0,
                next_id: 1,
                max_message_len: reply.max_message_len,
            },
            reply,
        ))
    }

    #[inline]
    fn header(
        &mut self,
        kind_op: u8,
        addr: RemoteAddr,
        len: u32,
        arg0: u64,
        arg1: u64,
        flags: u8,
    ) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        ReqHeader {
            op: kind_op,
            flags,
            target: addr.region,
            rkey: addr.rkey,
            offset: addr.offset,
            len,
            id,
            arg0,
            arg1,
        }
        .encode(&mut self.out);
        id
    }

    fn send(&mut self) -> Result<(), FabricError> {
        let r = self.stream.write_all(&self.out);
        self.out.clear();
        r.map_err(io_to_fabric)
    }

    /// Makes at least `n` unread bytes available in `rbuf[rpos..]`.
    fn fill(&mut self, n: usize) -> Result<(), FabricError> {
        if self.rlen - self.rpos >= n {
            return Ok(());
        }
        if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
        if self.rbuf.len() < n {
            self.rbuf.resize(n.max(MIN_RBUF), 0);
        }
        while self.rlen < n {
            match self.stream.read(&mut self.rbuf[self.rlen..]) {
                Ok(0) => {
                    return Err(FabricError::Disconnected(
                        "the memory node closed the connection".into(),
                    ));
                }
                Ok(k) => self.rlen += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_to_fabric(e)),
            }
        }
        Ok(())
    }

    /// Reads one response header, checking its id, and makes its payload available.
    fn response(&mut self, id: u32) -> Result<(RespHeader, usize), FabricError> {
        self.fill(RESP_HEADER)?;
        let h = RespHeader::decode(
            self.rbuf[self.rpos..self.rpos + RESP_HEADER]
                .try_into()
                .expect("24 bytes"),
        );
        self.rpos += RESP_HEADER;
        if h.id != id {
            return Err(FabricError::Protocol(format!(
                "response id {} for request {id}",
                h.id
            )));
        }
        if h.len > self.max_message_len.saturating_add(4096) {
            return Err(FabricError::Protocol(format!(
                "response payload of {} bytes",
                h.len
            )));
        }
        let len = h.len as usize;
        self.fill(len)?;
        let at = self.rpos;
        self.rpos += len;
        Ok((h, at))
    }

    fn status_to_error(&self, kind: VerbKind, h: &RespHeader) -> FabricError {
        match VerbError::from_code(h.status) {
            Some(e) => verb_err(kind, e),
            None => FabricError::Protocol(format!("unknown status {}", h.status)),
        }
    }

    /// One verb, one round trip. For READ, the data lands in `into`.
    #[allow(clippy::too_many_arguments)]
    fn single(
        &mut self,
        kind: VerbKind,
        addr: RemoteAddr,
        len: u32,
        arg0: u64,
        arg1: u64,
        payload: &[u8],
        into: Option<&mut [u8]>,
    ) -> Result<u64, FabricError> {
        let id = self.header(wire::opcode(kind), addr, len, arg0, arg1, FLAG_LAST);
        self.out.extend_from_slice(payload);
        self.send()?;
        let (h, at) = self.response(id)?;
        if h.status != status::OK {
            return Err(self.status_to_error(kind, &h));
        }
        if let Some(buf) = into {
            if h.len as usize != buf.len() {
                return Err(FabricError::Protocol(format!(
                    "READ returned {} bytes, asked {}",
                    h.len,
                    buf.len()
                )));
            }
            buf.copy_from_slice(&self.rbuf[at..at + buf.len()]);
        }
        Ok(h.value)
    }

    fn batch(&mut self, batch: &mut Batch<'_>) -> Result<(), FabricError> {
        // A READ or WRITE larger than the node's message limit is refused here, as a single verb is, rather than sent
        // (the node would drop the connection): the verbs before it go out, the rest are skipped.
        let max = self.max_message_len;
        let oversized = batch
            .ops
            .iter()
            .position(|op| matches!(op.kind, VerbKind::Read | VerbKind::Write) && op.len > max);
        let n = oversized.unwrap_or(batch.ops.len());
        if n > 0 {
            self.batch_prefix(batch, n)?;
        }
        if let Some(at) = oversized
            && batch.failed.is_none()
        {
            batch.failed = Some((at as u32, VerbError::TooLarge));
        }
        Ok(())
    }

    /// Sends the first `n` verbs of `batch` (at least one) in one round trip and takes their results.
    fn batch_prefix(&mut self, batch: &mut Batch<'_>, n: usize) -> Result<(), FabricError> {
        let first_id = self.next_id;
        for (i, op) in batch.ops[..n].iter().enumerate() {
            let flags = if i + 1 == n { FLAG_LAST } else { 0 };
            // A READ's arg0 is local (where its bytes land) and a WRITE's carries no meaning on the wire.
            let (arg0, arg1) = match op.kind {
                VerbKind::Cas | VerbKind::Faa => (op.arg0, op.arg1),
                VerbKind::Read | VerbKind::Write => (0, 0),
            };
            self.header(wire::opcode(op.kind), op.addr(), op.len, arg0, arg1, flags);
            if op.kind == VerbKind::Write {
                self.out.extend_from_slice(op.payload(&batch.out));
            }
        }
        self.send()?;
        for (i, op) in batch.ops[..n].iter_mut().enumerate() {
            let (h, at) = self.response(first_id.wrapping_add(i as u32))?;
            if h.status != status::OK {
                let e = VerbError::from_code(h.status)
                    .ok_or_else(|| FabricError::Protocol(format!("unknown status {}", h.status)))?;
                // The node skips every verb after the first it refuses.
                if batch.failed.is_none() {
                    batch.failed = Some((i as u32, e));
                }
                continue;
            }
            if batch.failed.is_some() {
                return Err(FabricError::Protocol(format!(
                    "verb {i} of a batch ran after an earlier one was refused"
                )));
            }
            op.result = h.value;
            if op.kind == VerbKind::Read {
                if h.len != op.len {
                    return Err(FabricError::Protocol(format!(
                        "READ returned {} bytes, asked {}",
                        h.len, op.len
                    )));
                }
                batch.data_in[op.arg0 as usize..][..op.len as usize]
                    .copy_from_slice(&self.rbuf[at..at + op.len as usize]);
            }
        }
        Ok(())
    }

    fn rpc(
        &mut self,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), FabricError> {
        let addr = RemoteAddr {
            region: method as u32,
            rkey: 0,
            offset: 0,
        };
        let id = self.header(op::RPC, addr, request.len() as u32, 0, 0, FLAG_LAST);
        self.out.extend_from_slice(request);
        self.send()?;
        let (h, at) = self.response(id)?;
        let body = &self.rbuf[at..at + h.len as usize];
        match h.status {
            status::OK => {
                response.clear();
                response.extend_from_slice(body);
                Ok(())
            }
            status::RPC_UNKNOWN => Err(RpcError::UnknownMethod(method).into()),
            status::RPC_FAILED => {
                Err(RpcError::Failed(String::from_utf8_lossy(body).into_owned()).into())
            }
            status::RPC_CODEC => {
                Err(RpcError::Codec(String::from_utf8_lossy(body).into_owned()).into())
            }
            status::RPC_NO_SPACE => {
                Err(RpcError::OutOfSpace(String::from_utf8_lossy(body).into_owned()).into())
            }
            status::RPC_DOWN => Err(RpcError::ProcessorDown.into()),
            other => Err(match VerbError::from_code(other) {
                Some(VerbError::TooLarge) => verb_err(VerbKind::Write, VerbError::TooLarge),
                _ => FabricError::Protocol(format!("unknown RPC status {other}")),
            }),
        }
    }
}

fn io_to_fabric(e: std::io::Error) -> FabricError {
    use std::io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => FabricError::Timeout,
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected => {
            FabricError::Disconnected(e.to_string())
        }
        _ => FabricError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{DATA_REGION, NodeConfig};
    use crate::verbs::Slot;
    use dinomo_pool::Pool;

    fn in_process_endpoint() -> (Arc<MemoryNode>, Endpoint, RegionInfo) {
        let pool = Arc::new(Pool::anonymous(1 << 20, 1 << 16).unwrap());
        let node = MemoryNode::new(pool, NodeConfig::default());
        let ep = Connector::new(Target::InProcess(node.clone()))
            .connect()
            .unwrap();
        let region = ep.region(DATA_REGION).unwrap().clone();
        (node, ep, region)
    }

    #[test]
    fn endpoints_connected_after_hooks_are_shared_obey_them_and_count_their_round_trips() {
        let pool = Arc::new(Pool::anonymous(1 << 20, 1 << 16).unwrap());
        let node = MemoryNode::new(pool, NodeConfig::default());
        let mut c = Connector::new(Target::InProcess(node));
        let before = c.connect().unwrap();
        let hooks = c.share_fault_hooks();
        // A clone made after sharing shares them too.
        let (mut a, mut b) = (c.connect().unwrap(), c.clone().connect().unwrap());
        let r = a.region(DATA_REGION).unwrap().clone();
        let w = r.at(r.start);
        assert!(Arc::ptr_eq(a.hooks(), &hooks) && Arc::ptr_eq(b.hooks(), &hooks));
        assert!(!Arc::ptr_eq(before.hooks(), &hooks));
        hooks.set_delay(Duration::from_micros(1));
        assert_eq!(a.faa(w, 1).unwrap(), 0);
        assert_eq!(b.faa(w, 1).unwrap(), 1);
        assert_eq!(hooks.round_trips_begun(), 2);
        hooks.cut();
        assert!(a.faa(w, 1).is_err() && b.faa(w, 1).is_err());
        assert_eq!(hooks.round_trips_begun(), 4);
    }

    #[test]
    fn a_connector_refuses_a_pool_other_than_the_one_it_reached_first() {
        let pool = || Arc::new(Pool::anonymous(1 << 20, 1 << 16).unwrap());
        let (first, second) = (pool(), pool());
        let node = |p: &Arc<Pool>| MemoryNode::new(p.clone(), NodeConfig::default());
        let mut c = Connector::new(Target::InProcess(node(&first)));
        let clone_before = c.clone();
        assert_eq!(c.pinned_pool(), None);
        let id = c.connect().unwrap().pool_id();
        assert_eq!(id, first.superblock().pool_id);
        assert_eq!(
            (c.pinned_pool(), clone_before.pinned_pool()),
            (Some(id), Some(id))
        );
        // The same pool behind a new memory node (a restart on the same file) is the same pool.
        c.target = Target::InProcess(node(&first));
        c.connect().unwrap();
        // Another pool is refused, through every clone, made before the first connection or after it.
        let other = second.superblock().pool_id;
        for mut k in [clone_before, c.clone()] {
            k.target = Target::InProcess(node(&second));
            match k.connect() {
                Err(e @ FabricError::PoolReplaced { .. }) => {
                    assert!(
                        matches!(e, FabricError::PoolReplaced { expected, found } if expected == id && found == other)
                    );
                    assert!(e.to_string().contains("another pool"), "{e}");
                }
                r => panic!("expected a refusal, got {r:?}"),
            }
        }
        // A connector of its own reaches the other pool.
        let fresh = Connector::new(Target::InProcess(node(&second)));
        assert_eq!(fresh.connect().unwrap().pool_id(), other);
    }

    #[test]
    fn a_reused_batch_reads_fresh_data_and_refuses_from_the_first_bad_verb() {
        let (_node, mut ep, r) = in_process_endpoint();
        let at = |i: u64| r.at(r.start + 64 * i);
        let mut batch = Batch::new();
        for round in 0..3u8 {
            ep.write(at(0), &[round; 8]).unwrap();
            ep.write(at(1), &[round + 10; 32]).unwrap();
            batch.clear();
            let a = batch.read(at(0), 8);
            // Larger READs than any earlier use of the batch grow its buffer.
            let b = batch.read(at(1), 8 + 8 * round as u32);
            let c = batch.faa(at(2), 1);
            ep.post(&mut batch).unwrap();
            assert_eq!(batch.read_data(a), &[round; 8]);
            assert_eq!(
                batch.read_data(b),
                &vec![round + 10; 8 + 8 * round as usize][..]
            );
            assert_eq!(batch.old_value(c), round as u64);
        }
        // A refusal in the middle: the verbs before it ran, the ones after it were skipped and did not run, and all
        // of them were counted in one round trip.
        batch.clear();
        let ok = batch.faa(at(2), 1);
        let bad = batch.faa(r.at(r.start + 3), 1);
        let skipped = batch.faa(at(2), 1);
        let before = counters::thread_snapshot();
        let e = ep.post(&mut batch).unwrap_err();
        let d = counters::thread_snapshot() - before;
        assert!(matches!(
            e,
            FabricError::Verb {
                index: 1,
                kind: VerbKind::Faa,
                error: VerbError::Misaligned
            }
        ));
        assert_eq!((d.round_trips, d.faa), (1, 3));
        assert_eq!(batch.status(ok), Ok(()));
        assert_eq!(batch.old_value(ok), 3);
        assert_eq!(batch.status(bad), Err(VerbError::Misaligned));
        assert_eq!(batch.status(skipped), Err(VerbError::Skipped));
        assert_eq!(batch.old_value(Slot(2)), 0);
        assert_eq!(ep.faa(at(2), 0).unwrap(), 4);
    }

    #[test]
    fn latency_switches_the_slow_path_on_and_off_but_a_broken_endpoint_stays_broken() {
        let (_node, mut ep, r) = in_process_endpoint();
        let w = r.at(r.start);
        ep.set_injected_latency(1_000);
        assert!(ep.slow);
        let before = counters::thread_snapshot();
        assert_eq!(ep.faa(w, 1).unwrap(), 0);
        ep.set_injected_latency(0);
        assert!(!ep.slow);
        assert_eq!(ep.faa(w, 1).unwrap(), 1);
        let d = counters::thread_snapshot() - before;
        assert_eq!((d.round_trips, d.faa), (2, 2));
        // A lost request breaks the endpoint; clearing the latency must not mend it.
        ep.hooks().drop_next(1);
        assert!(matches!(ep.faa(w, 1), Err(FabricError::Timeout)));
        ep.set_injected_latency(0);
        assert!(ep.slow);
        assert!(matches!(ep.faa(w, 1), Err(FabricError::Disconnected(_))));
        let mut batch = Batch::new();
        batch.faa(w, 1);
        assert!(matches!(
            ep.post(&mut batch),
            Err(FabricError::Disconnected(_))
        ));
    }
}
