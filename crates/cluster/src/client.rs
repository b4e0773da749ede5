//! The native client: caches the routing table, sends each request to the key's owner, refreshes its table when
//! a node refuses a key, and retries until the operation's deadline.
//!
//! A request that was sent but whose reply never came (the node died or the connection broke) is not retried
//! when it changes data: its outcome is reported as [`ClientError::Indeterminate`], since the write may have been
//! applied. Reads are retried.
//!
//! The client measures every operation's latency and, at most once per report period, sends the interval's
//! histogram to the node it is talking to, written just before a data request so both go out together; the
//! M-node collects the reports for its latency SLOs. Every node that welcomes the client's protocol version takes
//! reports, so none is asked first.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use dinomo_kn::DataOp;
use dinomo_ring::NodeId;

use crate::latency::LatencyHistogram;
use crate::wire::{
    DEFAULT_MAX_FRAME, ErrorKind, FrameError, PROTOCOL_VERSION, RequestBody, RequestRef, Response,
    ResponseBody, Routing, Secret, read_frame, write_frame,
};

/// Largest answer to a handshake: a welcome or a refusal.
const MAX_HANDSHAKE_REPLY: u32 = 64 << 10;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Routing nodes (or any KV nodes) to fetch the routing table from.
    pub seeds: Vec<String>,
    /// The cluster token presented in every connection's handshake (`fabric.token`). Default: empty.
    pub token: Secret,
    /// How long one operation may take, retries included. Default 5 s.
    pub op_timeout: Duration,
    /// Bound on establishing a connection. Default 1 s.
    pub connect_timeout: Duration,
    /// Largest reply frame accepted. Default [`DEFAULT_MAX_FRAME`].
    pub max_frame: u32,
    /// Longest pause between retries (they start at 200 µs and double). Default 20 ms.
    pub max_retry_pause: Duration,
    /// Whether operation latencies are reported to the nodes for the M-node's SLOs. Default true.
    pub report_latency: bool,
    /// Least time between two latency reports. Default 1 s.
    pub latency_report_period: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            seeds: Vec::new(),
            token: Secret::default(),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            max_frame: DEFAULT_MAX_FRAME,
            max_retry_pause: Duration::from_millis(20),
            report_latency: true,
            latency_report_period: Duration::from_secs(1),
        }
    }
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// The request is wrong; retrying cannot help.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The write was sent but its outcome is unknown: it may or may not have been applied.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// No owner answered before the deadline; the request was not applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The store is full: the owner's memory node had no room for the write, which was not applied.
    #[error("{0}")]
    OutOfSpace(String),
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

/// A TCP connection to `addr` with Nagle's algorithm off (requests are small and latency-bound).
pub(crate) fn open_stream(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let sock = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("cannot resolve {addr}")))?;
    let s = TcpStream::connect_timeout(&sock, timeout)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// How a node's error answer of `kind` ends a request, in both the one-at-a-time and the pipelined client: the
/// error to return, or (`Err`) the message when another attempt, after a refresh of the table, may succeed.
pub(crate) fn final_error(
    kind: ErrorKind,
    message: String,
    write: bool,
) -> Result<ClientError, String> {
    match kind {
        ErrorKind::Invalid => Ok(ClientError::Invalid(message)),
        ErrorKind::Indeterminate if write => Ok(ClientError::Indeterminate(message)),
        // Another node would not help: they share the memory node.
        ErrorKind::OutOfSpace => Ok(ClientError::OutOfSpace(message)),
        _ => Err(message),
    }
}

/// Why a native-protocol session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The node could not be reached, or the connection failed before the handshake was answered.
    #[error("unreachable: {0}")]
    Io(#[from] std::io::Error),
    /// The node refused the handshake (a wrong cluster token, another protocol version); retrying cannot help.
    #[error("refused the connection: {0}")]
    Refused(String),
    /// The address answers for another server than the one meant (another node, or a node of another cluster,
    /// listens there now: the one meant stopped); the table that named it is stale.
    #[error("answers for someone else: {0}")]
    Elsewhere(String),
    /// The node cannot take the connection now (it serves as many as it allows); it may later.
    #[error("turned the connection away: {0}")]
    Busy(String),
}

/// Who a session is meant to reach; the server's welcome must agree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expected {
    /// The KV node; `None`: any server (a seed, which may be a routing node).
    pub node: Option<NodeId>,
    /// The pool of the memory node of the client's cluster, once known.
    pub pool: Option<u64>,
}

/// Who answered a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcomed {
    /// The KV node; `None` for a routing node.
    pub node: Option<NodeId>,
    /// Its cluster's pool (0 while the server does not know it).
    pub pool: u64,
}

/// Connects to the KV or routing node at `addr` and does the handshake: presents the protocol version and the
/// cluster `token`, and waits at most `timeout` for the welcome. The stream is then ready for requests.
pub fn open_session(addr: &str, timeout: Duration, token: &str) -> Result<TcpStream, SessionError> {
    open_session_expecting(addr, timeout, token, Expected::default()).map(|(stream, _)| stream)
}

/// Like [`open_session`], and the welcome must come from `expected`: a node that stopped may have left its address
/// to another server (of this cluster or another one with the same token), which must not answer for it.
pub fn open_session_expecting(
    addr: &str,
    timeout: Duration,
    token: &str,
    expected: Expected,
) -> Result<(TcpStream, Welcomed), SessionError> {
    let stream = open_stream(addr, timeout)?;
    let wait = Some(timeout.max(Duration::from_millis(1)));
    stream.set_read_timeout(wait)?;
    stream.set_write_timeout(wait)?;
    let hello = RequestBody::Hello {
        version: PROTOCOL_VERSION,
        token: Secret(token.to_string()),
    };
    let mut buf = Vec::new();
    write_frame(
        &mut &stream,
        &RequestRef {
            id: 0,
            body: &hello,
        },
        &mut buf,
    )?;
    // Unbuffered: nothing past the answer may be consumed from the stream.
    let answer = read_frame::<Response>(&mut &stream, &mut buf, MAX_HANDSHAKE_REPLY).map_err(
        |e| match e {
            FrameError::Io(e) => SessionError::Io(e),
            e => SessionError::Refused(format!("unreadable answer to the handshake: {e}")),
        },
    )?;
    let welcomed = match answer.body {
        ResponseBody::Welcome { node, pool, .. } => Welcomed { node, pool },
        ResponseBody::Error {
            kind: ErrorKind::Unavailable,
            message,
        } => return Err(SessionError::Busy(message)),
        ResponseBody::Error { message, .. } => return Err(SessionError::Refused(message)),
        other => {
            return Err(SessionError::Refused(format!(
                "unexpected answer to the handshake: {other:?}"
            )));
        }
    };
    if let Some(node) = expected.node
        && welcomed.node != Some(node)
    {
        return Err(SessionError::Elsewhere(format!(
            "{addr} is {}, not node {node}",
            match welcomed.node {
                Some(n) => format!("node {n}"),
                None => "a routing node".into(),
            }
        )));
    }
    if let Some(pool) = expected.pool
        && welcomed.pool != 0
        && welcomed.pool != pool
    {
        return Err(SessionError::Elsewhere(format!(
            "{addr} serves the cluster of pool {:#x}, not this one's ({pool:#x})",
            welcomed.pool
        )));
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok((stream, welcomed))
}

/// Whether the peer has closed or reset `stream`. A pooled connection found so carries nothing of the next request
/// yet, so that request can go on a new connection instead of being written into a dead one (where a write would
/// end with its outcome unknown). One non-blocking peek; bytes waiting (a late reply) mean the connection is open.
pub(crate) fn peer_closed(stream: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: `recv` writes at most one byte into `byte`, and the descriptor stays open (owned by `stream`) for the
    // duration of the call.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

impl Conn {
    fn on(s: TcpStream) -> Result<Conn, SessionError> {
        Ok(Conn {
            reader: BufReader::new(s.try_clone()?),
            writer: BufWriter::new(s),
        })
    }

    fn set_read_timeout(&self, t: Duration) {
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(t.max(Duration::from_millis(1))));
    }
}

/// What [`Client::fetch_routing`] got.
enum Fetched {
    /// A table at the epoch asked for, or newer.
    Current,
    /// None that new; why, from the last source asked.
    Missed(String),
    /// A source refused the handshake: retrying cannot help.
    Refused(String),
}

/// How one attempt ended.
enum Attempt {
    Done(ResponseBody),
    /// Not sent (or certainly not applied): try again. Why.
    Retry(String),
    /// Sent, no reply.
    Lost(String),
    /// The node refused the connection's handshake: retrying cannot help.
    Refused(String),
}

/// A client of a cluster. Not shared between threads: give each thread its own.
pub struct Client {
    cfg: ClientConfig,
    routing: Option<Routing>,
    conns: HashMap<String, Conn>,
    next_id: u64,
    buf: Vec<u8>,
    rng: u64,
    /// Latencies of the operations since the last report.
    latency: LatencyHistogram,
    latency_since: Instant,
    /// The pool of the cluster's memory node, from the first welcome that named it: a server of another cluster
    /// found at a stale address is not talked to.
    pool: Option<u64>,
}

impl Client {
    /// Fetches the routing table from the seeds.
    pub fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        if cfg.seeds.is_empty() {
            return Err(ClientError::Invalid("no seed addresses".into()));
        }
        let mut c = Client {
            rng: 0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64,
            cfg,
            routing: None,
            conns: HashMap::new(),
            next_id: 1,
            buf: Vec::new(),
            latency: LatencyHistogram::new(),
            latency_since: Instant::now(),
            pool: None,
        };
        let deadline = dinomo_kn::deadline_after(c.cfg.op_timeout);
        loop {
            match c.fetch_routing(0, None) {
                Fetched::Current => return Ok(c),
                Fetched::Refused(why) => return Err(ClientError::Invalid(why)),
                Fetched::Missed(why) if Instant::now() > deadline => {
                    return Err(ClientError::Unavailable(format!(
                        "no seed answered with a routing table ({why})"
                    )));
                }
                Fetched::Missed(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// The cached routing table.
    pub fn routing(&self) -> Option<&Routing> {
        self.routing.as_ref()
    }

    /// The value of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        match self.request(RequestBody::Data(DataOp::Get(key.to_vec())))? {
            ResponseBody::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `key` has a value (the value does not cross the network).
    pub fn exists(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        self.applied(RequestBody::Data(DataOp::Exists(key.to_vec())))
    }

    /// The length of the value at `key`, 0 when absent (the value does not cross the network).
    pub fn strlen(&mut self, key: &[u8]) -> Result<u64, ClientError> {
        self.count(RequestBody::Data(DataOp::Strlen(key.to_vec())))
    }

    /// Upsert.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        self.applied(RequestBody::Data(DataOp::Set(key.to_vec(), value.to_vec())))
            .map(|_| ())
    }

    /// Sets only when absent; whether it did.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, ClientError> {
        self.applied(RequestBody::Data(DataOp::Insert(
            key.to_vec(),
            value.to_vec(),
        )))
    }

    /// Sets only when present; whether it did.
    pub fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, ClientError> {
        self.applied(RequestBody::Data(DataOp::Update(
            key.to_vec(),
            value.to_vec(),
        )))
    }

    /// Removes; whether the key existed.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        self.applied(RequestBody::Data(DataOp::Delete(key.to_vec())))
    }

    /// Adds `delta` to the integer at `key`; the result.
    pub fn incr(&mut self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        self.int(RequestBody::Data(DataOp::Incr(key.to_vec(), delta)))
    }

    /// Removes `key`; the value it had (`GETDEL`).
    pub fn get_del(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        self.value(RequestBody::Data(DataOp::Take(key.to_vec())))
    }

    /// The bytes of the value at `key` from `start` to `end`, both included, negative positions counting from the
    /// end (`GETRANGE`; empty when absent). Only those bytes cross the network.
    pub fn get_range(&mut self, key: &[u8], start: i64, end: i64) -> Result<Vec<u8>, ClientError> {
        let op = DataOp::GetRange(key.to_vec(), start, end);
        Ok(self.value(RequestBody::Data(op))?.unwrap_or_default())
    }

    /// Writes `bytes` at `offset` of the value at `key`, zero-filling any gap (`SETRANGE`); the new length.
    pub fn set_range(&mut self, key: &[u8], offset: u64, bytes: &[u8]) -> Result<u64, ClientError> {
        self.count(RequestBody::Data(DataOp::SetRange(
            key.to_vec(),
            offset,
            bytes.to_vec(),
        )))
    }

    /// Adds `delta` to the number at `key` (absent = 0; `INCRBYFLOAT`); the result as stored.
    pub fn incr_by_float(&mut self, key: &[u8], delta: f64) -> Result<f64, ClientError> {
        let op = DataOp::IncrFloat(key.to_vec(), delta.to_string().into_bytes());
        let stored = self.value(RequestBody::Data(op))?.unwrap_or_default();
        dinomo_value::parse_float(&stored)
            .ok_or_else(|| ClientError::Unavailable("the KV node answered with no number".into()))
    }

    /// Sets (`bit`) or clears bit `i` of the value at `key` (bit 0: the first byte's most significant), growing it
    /// with zero bytes (`SETBIT`); the bit before.
    pub fn set_bit(&mut self, key: &[u8], i: u64, bit: bool) -> Result<bool, ClientError> {
        self.int(RequestBody::Data(DataOp::SetBit(key.to_vec(), i, bit)))
            .map(|b| b == 1)
    }

    /// Bit `i` of the value at `key`, false beyond its end or when absent (`GETBIT`).
    pub fn get_bit(&mut self, key: &[u8], i: u64) -> Result<bool, ClientError> {
        self.int(RequestBody::Data(DataOp::GetBit(key.to_vec(), i)))
            .map(|b| b == 1)
    }

    /// The set bits of the value at `key` (`BITCOUNT`), all of them or those of `range` (start and end positions,
    /// negative ones counting from the end, in bits when the flag is set, else in bytes). Only the count crosses
    /// the network.
    pub fn bit_count(
        &mut self,
        key: &[u8],
        range: Option<(i64, i64, bool)>,
    ) -> Result<u64, ClientError> {
        self.count(RequestBody::Data(DataOp::BitCount(key.to_vec(), range)))
    }

    fn int(&mut self, body: RequestBody) -> Result<i64, ClientError> {
        match self.request(body)? {
            ResponseBody::Int(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// An answer that is a length or a count: never negative.
    fn count(&mut self, body: RequestBody) -> Result<u64, ClientError> {
        let n = self.int(body)?;
        u64::try_from(n).map_err(|_| unexpected(ResponseBody::Int(n)))
    }

    fn value(&mut self, body: RequestBody) -> Result<Option<Vec<u8>>, ClientError> {
        match self.request(body)? {
            ResponseBody::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    fn applied(&mut self, body: RequestBody) -> Result<bool, ClientError> {
        match self.request(body)? {
            ResponseBody::Applied(a) => Ok(a),
            other => Err(unexpected(other)),
        }
    }

    /// Sends a data request to its key's owner, following refusals and failures until the deadline. Its latency,
    /// retries included, goes into the next latency report.
    pub fn request(&mut self, body: RequestBody) -> Result<ResponseBody, ClientError> {
        let started = Instant::now();
        let result = self.request_once(body);
        if self.cfg.report_latency {
            self.latency.record(started.elapsed().as_nanos() as u64);
        }
        result
    }

    /// Counts the latency of a request sent another way (pipelined, on behalf of this client) in the next report.
    pub(crate) fn record_latency(&mut self, latency: Duration) {
        if self.cfg.report_latency {
            self.latency.record(latency.as_nanos() as u64);
        }
    }

    fn request_once(&mut self, body: RequestBody) -> Result<ResponseBody, ClientError> {
        let key = body
            .key()
            .ok_or_else(|| ClientError::Invalid("not a data request".into()))?;
        let write = body.is_write();
        let deadline = dinomo_kn::deadline_after(self.cfg.op_timeout);
        let mut pause = Duration::from_micros(200).min(self.cfg.max_retry_pause);
        let mut last = String::from("no routing table");
        loop {
            if let Some((node, addr)) = self.target(key) {
                match self.attempt(&addr, Some(node), &body, deadline) {
                    Attempt::Done(ResponseBody::NotOwner { epoch }) => {
                        last = format!("node {node} refused the key at epoch {epoch}");
                        self.refresh_after_refusal(epoch, &addr);
                    }
                    Attempt::Done(ResponseBody::Error { kind, message }) => {
                        match final_error(kind, message, write) {
                            Ok(e) => return Err(e),
                            Err(message) => {
                                last = format!("node {node}: {message}");
                                self.refresh(0, None);
                            }
                        }
                    }
                    Attempt::Done(body) => return Ok(body),
                    Attempt::Retry(why) => {
                        last = format!("node {node} at {addr} {why}");
                        self.refresh(0, None);
                    }
                    Attempt::Refused(why) => return Err(ClientError::Invalid(why)),
                    Attempt::Lost(why) if write => return Err(ClientError::Indeterminate(why)),
                    Attempt::Lost(why) => {
                        last = why;
                        self.refresh(0, None);
                    }
                }
            } else {
                self.refresh(0, None);
            }
            if Instant::now() + pause > deadline {
                return Err(ClientError::Unavailable(last));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(self.cfg.max_retry_pause);
        }
    }

    /// The node to send a request on `key` to, and its address, under the cached table: the key's primary, or for
    /// a shared key (one with a cell) any of its owners, reads and writes alike.
    pub(crate) fn target(&mut self, key: &[u8]) -> Option<(NodeId, String)> {
        let r = self.routing.as_ref()?;
        // Any owner serves a shared key, reads and writes alike (writes CAS its cell).
        let pick = if r.cells.contains_key(key) {
            let owners = r.ring.owners(key);
            self.rng = self.rng.wrapping_mul(6364136223846793005).wrapping_add(1);
            let n = owners.len().max(1);
            *owners.as_slice().get((self.rng >> 33) as usize % n)?
        } else {
            r.ring.primary(key)?
        };
        r.addrs.get(&pick).map(|a| (pick, a.clone()))
    }

    /// One step of a walk over every key of the cluster, as Redis's `SCAN`: from `cursor` (0 starts a walk; the
    /// cursor returned is 0 once the walk is over), about `count` keys. A whole walk returns every key there from
    /// its start to its end, some perhaps twice, and none deleted before it started and not written again: the
    /// memory node names the keys, and the client asks each one's owner whether it is there, one request after
    /// another ([`crate::PipelinedClient::scan`] asks about them all at once).
    pub fn scan(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), ClientError> {
        let (cursor, named) = self.scan_step(cursor, count)?;
        Ok((cursor, self.present(named)?))
    }

    /// Every key of the cluster that matches `pattern` (Redis's glob patterns, as `KEYS`), sorted: a whole walk.
    pub fn keys(&mut self, pattern: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        walk_keys(self, pattern, Client::scan_step, Client::present)
    }

    /// The keys of `named` that have a value, asked of their owners one by one.
    fn present(&mut self, named: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, ClientError> {
        let mut there = Vec::with_capacity(named.len());
        for key in named {
            if self.exists(&key)? {
                there.push(key);
            }
        }
        Ok(there)
    }

    /// The keys the memory node names in one step of a walk, asked of any KV node: those of the routing table in
    /// turn, until one answers or the request deadline passes.
    pub(crate) fn scan_step(
        &mut self,
        cursor: u64,
        count: u32,
    ) -> Result<(u64, Vec<Vec<u8>>), ClientError> {
        let body = RequestBody::ScanKeys { cursor, count };
        let deadline = dinomo_kn::deadline_after(self.cfg.op_timeout);
        let mut pause = Duration::from_micros(200).min(self.cfg.max_retry_pause);
        let mut last = String::from("no routing table");
        loop {
            let nodes: Vec<(NodeId, String)> = self
                .routing
                .as_ref()
                .map(|r| r.addrs.iter().map(|(n, a)| (*n, a.clone())).collect())
                .unwrap_or_default();
            for (node, addr) in nodes {
                match self.attempt(&addr, Some(node), &body, deadline) {
                    Attempt::Done(ResponseBody::Keys { cursor, keys }) => {
                        return Ok((cursor, keys.into_iter().map(|k| k.into_vec()).collect()));
                    }
                    Attempt::Done(ResponseBody::Error { kind, message }) => {
                        match final_error(kind, message, false) {
                            Ok(e) => return Err(e),
                            Err(message) => last = format!("node {node}: {message}"),
                        }
                    }
                    Attempt::Done(other) => return Err(unexpected(other)),
                    Attempt::Refused(why) => return Err(ClientError::Invalid(why)),
                    Attempt::Retry(why) | Attempt::Lost(why) => {
                        last = format!("node {node} at {addr} {why}");
                    }
                }
            }
            self.refresh(0, None);
            if Instant::now() + pause > deadline {
                return Err(ClientError::Unavailable(last));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(self.cfg.max_retry_pause);
        }
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The statistics document of KV node `node` (workers' counters and cache statistics, as JSON), asked over
    /// this client's connection to it.
    pub fn node_stats(&mut self, node: NodeId) -> Result<String, ClientError> {
        let addr = self
            .routing
            .as_ref()
            .and_then(|r| r.addrs.get(&node).cloned())
            .ok_or_else(|| {
                ClientError::Invalid(format!("node {node} is not in the routing table"))
            })?;
        let deadline = dinomo_kn::deadline_after(self.cfg.op_timeout);
        match self.attempt(&addr, Some(node), &RequestBody::Stats, deadline) {
            Attempt::Done(ResponseBody::Stats(s)) => Ok(s),
            Attempt::Done(ResponseBody::Error { message, .. }) => {
                Err(ClientError::Unavailable(format!("node {node}: {message}")))
            }
            Attempt::Done(other) => Err(unexpected(other)),
            Attempt::Retry(why) => Err(ClientError::Unavailable(format!(
                "node {node} at {addr} {why}"
            ))),
            Attempt::Lost(why) => Err(ClientError::Unavailable(why)),
            Attempt::Refused(why) => Err(ClientError::Invalid(why)),
        }
    }

    /// Opens a session to `addr`, meant to reach KV node `node` (any server of the cluster when `None`).
    pub(crate) fn open_to(
        &mut self,
        addr: &str,
        node: Option<NodeId>,
    ) -> Result<TcpStream, SessionError> {
        let expected = Expected {
            node,
            pool: self.pool,
        };
        let (stream, welcomed) =
            open_session_expecting(addr, self.cfg.connect_timeout, &self.cfg.token.0, expected)?;
        if self.pool.is_none() && welcomed.pool != 0 {
            self.pool = Some(welcomed.pool);
        }
        Ok(stream)
    }

    /// Sends `body` to `addr`, meant to be KV node `node` (any server when `None`), and waits for its answer.
    fn attempt(
        &mut self,
        addr: &str,
        node: Option<NodeId>,
        body: &RequestBody,
        deadline: Instant,
    ) -> Attempt {
        if self
            .conns
            .get(addr)
            .is_some_and(|c| peer_closed(c.reader.get_ref()))
        {
            self.conns.remove(addr);
        }
        if !self.conns.contains_key(addr) {
            match self.open_to(addr, node).and_then(Conn::on) {
                Ok(c) => {
                    self.conns.insert(addr.to_string(), c);
                }
                Err(
                    e @ (SessionError::Io(_) | SessionError::Busy(_) | SessionError::Elsewhere(_)),
                ) => {
                    return Attempt::Retry(e.to_string());
                }
                Err(e @ SessionError::Refused(_)) => {
                    return Attempt::Refused(format!("{addr} {e}"));
                }
            }
        }
        if body.key().is_some() && !self.send_report_if_due(addr) {
            return Attempt::Retry("unreachable: a latency report could not be sent".into());
        }
        // After the report's id: replies to lower ids are skipped while waiting for this one.
        let id = self.next_id;
        self.next_id += 1;
        let conn = self.conns.get_mut(addr).expect("inserted above");
        let req = RequestRef { id, body };
        if write_frame(&mut conn.writer, &req, &mut self.buf).is_err()
            || conn.writer.flush().is_err()
        {
            // A frame cut short is never applied: the server cannot decode it.
            self.conns.remove(addr);
            return Attempt::Retry("unreachable: the request could not be sent".into());
        }
        conn.set_read_timeout(deadline.saturating_duration_since(Instant::now()));
        loop {
            match read_frame::<Response>(&mut conn.reader, &mut self.buf, self.cfg.max_frame) {
                Ok(r) if r.id == id => return Attempt::Done(r.body),
                // A reply to an earlier request that timed out: skip it.
                Ok(r) if r.id < id => continue,
                Ok(r) => {
                    self.conns.remove(addr);
                    return Attempt::Lost(format!("reply to unknown request {}", r.id));
                }
                Err(e) => {
                    self.conns.remove(addr);
                    return Attempt::Lost(format!("no reply from {addr}: {e}"));
                }
            }
        }
    }

    /// Writes the latency report to the open connection to `addr` if one is due; the request's flush sends both, and
    /// the report's answer is skipped while the request's is awaited. False when the request should be retried
    /// (the connection is gone; nothing of the request was sent).
    fn send_report_if_due(&mut self, addr: &str) -> bool {
        if !self.cfg.report_latency
            || self.latency.count() == 0
            || self.latency_since.elapsed() < self.cfg.latency_report_period
        {
            return true;
        }
        let id = self.next_id;
        self.next_id += 1;
        let body = RequestBody::LatencyReport(self.latency.summary());
        let conn = self.conns.get_mut(addr).expect("connected by the caller");
        if write_frame(
            &mut conn.writer,
            &RequestRef { id, body: &body },
            &mut self.buf,
        )
        .is_err()
        {
            self.conns.remove(addr);
            return false;
        }
        self.latency.clear();
        self.latency_since = Instant::now();
        true
    }

    /// After the node at `addr` refused a key under its table of `epoch`: fetches a table newer than both that one
    /// and the cached one. A node under an older table than the cached one lags behind, or the cached table is of a
    /// change that was rolled back since (the rollback's table is newer, and the node never installed the change):
    /// only a table newer than the cached one tells the second case, and waiting on the node would not.
    pub(crate) fn refresh_after_refusal(&mut self, epoch: u64, addr: &str) {
        let cached = self.routing.as_ref().map_or(0, Routing::epoch);
        self.refresh(epoch.max(cached.saturating_add(1)), Some(addr));
    }

    /// Fetches a routing table of at least epoch `min_epoch`, asking `hint` first, then the seeds; keeps the
    /// newest seen. Returns whether the cached table now reaches `min_epoch`.
    pub(crate) fn refresh(&mut self, min_epoch: u64, hint: Option<&str>) -> bool {
        matches!(self.fetch_routing(min_epoch, hint), Fetched::Current)
    }

    /// [`Client::refresh`], telling why the table does not reach `min_epoch` when it does not.
    fn fetch_routing(&mut self, min_epoch: u64, hint: Option<&str>) -> Fetched {
        let mut refused = None;
        let mut missed = String::from("no seed to ask");
        let mut sources: Vec<String> = hint.into_iter().map(str::to_string).collect();
        sources.extend(self.cfg.seeds.iter().cloned());
        let deadline = dinomo_kn::deadline_after(self.cfg.connect_timeout);
        for addr in sources {
            let r = match self.attempt(&addr, None, &RequestBody::Routing, deadline) {
                Attempt::Done(ResponseBody::Routing(r)) => r,
                Attempt::Refused(why) => {
                    refused = Some(why);
                    continue;
                }
                Attempt::Retry(why) => {
                    missed = format!("{addr} {why}");
                    continue;
                }
                Attempt::Lost(why) => {
                    missed = format!("{addr}: {why}");
                    continue;
                }
                Attempt::Done(other) => {
                    missed = format!("{addr} answered {other:?}");
                    continue;
                }
            };
            let newer = self
                .routing
                .as_ref()
                .is_none_or(|cur| r.epoch() > cur.epoch());
            if newer {
                // Connections to nodes that left are dropped.
                self.conns
                    .retain(|a, _| r.addrs.values().any(|x| x == a) || self.cfg.seeds.contains(a));
                self.routing = Some(r);
            }
            if self
                .routing
                .as_ref()
                .is_some_and(|cur| cur.epoch() >= min_epoch)
            {
                return Fetched::Current;
            }
            missed = format!("{addr} has an older table than epoch {min_epoch}");
        }
        refused.map_or(Fetched::Missed(missed), Fetched::Refused)
    }

    /// Fetches the newest routing table the seeds have (normally the client refreshes only when refused).
    pub fn refresh_routing(&mut self) -> bool {
        self.refresh(u64::MAX, None);
        self.routing.is_some()
    }

    /// The owner of `key` under the cached table.
    pub fn owner(&self, key: &[u8]) -> Option<NodeId> {
        self.routing.as_ref()?.ring.primary(key)
    }
}

/// Keys each step of a [`Client::keys`] walk is asked for.
const KEYS_STEP: u32 = 1000;

/// Keys, as a walk names them or a check keeps them.
type Keys = Vec<Vec<u8>>;

/// One step of a walk: where the next starts (0: the walk is over), and the keys it named.
type Page = (u64, Keys);

/// A whole walk over the keys (`KEYS`) through `client`: `step` names the keys of a walk step from a cursor, and
/// `present` keeps those that have a value. The keys that match `pattern`, sorted, each once.
pub(crate) fn walk_keys<C>(
    client: &mut C,
    pattern: &[u8],
    step: fn(&mut C, u64, u32) -> Result<Page, ClientError>,
    present: fn(&mut C, Keys) -> Result<Keys, ClientError>,
) -> Result<Keys, ClientError> {
    let pattern = dinomo_resp::glob::Pattern::new(pattern);
    let mut found = std::collections::BTreeSet::new();
    let mut cursor = 0;
    loop {
        let (next, named) = step(client, cursor, KEYS_STEP)?;
        // A key may be named by two steps of one walk: it is asked about once.
        let candidates = named
            .into_iter()
            .filter(|key| pattern.matches(key) && !found.contains(key))
            .collect();
        found.extend(present(client, candidates)?);
        cursor = next;
        if cursor == 0 {
            return Ok(found.into_iter().collect());
        }
    }
}

pub(crate) fn unexpected(body: ResponseBody) -> ClientError {
    ClientError::Invalid(format!("unexpected reply {body:?}"))
}

/// One request to one server on a fresh connection presenting `token`, with a deadline (the M-node's calls to KV
/// nodes); the server must be `expected`.
pub(crate) fn call_once(
    addr: &str,
    expected: Expected,
    body: &RequestBody,
    token: &str,
    timeout: Duration,
) -> Result<ResponseBody, String> {
    let mut conn = open_session_expecting(addr, timeout, token, expected)
        .and_then(|(s, _)| Conn::on(s))
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut buf = Vec::new();
    write_frame(&mut conn.writer, &RequestRef { id: 1, body }, &mut buf)
        .and_then(|_| conn.writer.flush())
        .map_err(|e| format!("{addr}: {e}"))?;
    conn.set_read_timeout(timeout);
    let r: Response = read_frame(&mut conn.reader, &mut buf, DEFAULT_MAX_FRAME)
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(r.body)
}

/// [`call_once`] to every `(node, address)` in parallel, each of which must be that node (of the cluster of `pool`,
/// when given); `answer` turns each node's reply into its result.
pub(crate) fn call_each<T: Send>(
    targets: &[(NodeId, String)],
    pool: Option<u64>,
    body: &RequestBody,
    token: &str,
    timeout: Duration,
    answer: impl Fn(NodeId, &str, ResponseBody) -> Result<T, String> + Sync,
) -> Vec<(NodeId, Result<T, String>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(n, addr)| {
                let answer = &answer;
                (
                    *n,
                    s.spawn(move || {
                        let expected = Expected {
                            node: Some(*n),
                            pool,
                        };
                        answer(*n, addr, call_once(addr, expected, body, token, timeout)?)
                    }),
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|(n, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err("call thread panicked".into()));
                (n, r)
            })
            .collect()
    })
}
