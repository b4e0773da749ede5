//! The memory node's TCP server. Each connection gets a "NIC" thread that executes one-sided verbs directly on the
//! pool; only RPCs reach the processor threads.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clients::{ClientId, Registration};
use crate::error::{RpcError, VerbError};
use crate::node::MemoryNode;
use crate::wire::{self, FLAG_LAST, HandshakeReply, REQ_HEADER, ReqHeader, RespHeader, op, status};

/// Settings of the TCP server.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default 127.0.0.1:7100.
    pub listen: SocketAddr,
    /// Listening beyond loopback must be asked for explicitly (and needs a cluster token). Default false.
    pub allow_non_loopback: bool,
    /// Connections served at once; more are refused in the handshake. Default 1024.
    pub max_connections: usize,
    /// Time a new connection has to complete its handshake. Default 2 s.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7100)),
            allow_non_loopback: false,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(2),
        }
    }
}

/// Why the server would not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unsafe or impossible.
    #[error("{0}")]
    Config(String),
    /// Binding failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

/// A served connection: a handle to close its socket and its NIC thread.
type Connection = (TcpStream, Option<JoinHandle<()>>);

struct Shared {
    node: Arc<MemoryNode>,
    config: ServerConfig,
    stop: AtomicBool,
    active: AtomicUsize,
    next_conn: AtomicU64,
    conns: Mutex<HashMap<u64, Connection>>,
}

/// A running memory-node server. Dropping it stops it.
pub struct Server {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds and starts accepting connections.
    pub fn start(node: Arc<MemoryNode>, config: ServerConfig) -> Result<Server, ServerError> {
        if !config.listen.ip().is_loopback() {
            if !config.allow_non_loopback {
                return Err(ServerError::Config(format!(
                    "refusing to listen on non-loopback address {} (set allow_non_loopback to serve other hosts)",
                    config.listen
                )));
            }
            if node.config().cluster_token.is_empty() {
                return Err(ServerError::Config(
                    "a cluster token is required to listen beyond loopback".into(),
                ));
            }
        }
        let listener = TcpListener::bind(config.listen).map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            node,
            config,
            stop: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            next_conn: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("dpm-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|source| ServerError::Bind {
                addr: local_addr,
                source,
            })?;
        tracing::info!(%local_addr, "memory node listening");
        Ok(Server {
            local_addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections being served.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Test hook: closes every client connection at once.
    pub fn cut_all_connections(&self) {
        let conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        for (stream, _) in conns.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Stops accepting, closes every connection and waits for the NIC threads.
    pub fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the acceptor.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(200));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let handles: Vec<_> = {
            let mut conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
            conns
                .drain()
                .filter_map(|(_, (stream, h))| {
                    let _ = stream.shutdown(Shutdown::Both);
                    h
                })
                .collect()
        };
        for h in handles {
            let _ = h.join();
        }
        tracing::info!(addr = %self.local_addr, "memory node server stopped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.active.load(Ordering::Acquire) >= shared.config.max_connections {
            let _ = refuse(&stream, "too many connections");
            continue;
        }
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        shared.active.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        let spawned = std::thread::Builder::new()
            .name(format!("dpm-nic-{id}"))
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = serve_connection(stream, &s) {
                    tracing::debug!(?peer, error = %e, "fabric connection ended");
                }
                s.active.fetch_sub(1, Ordering::AcqRel);
                s.conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            });
        match spawned {
            Ok(h) => {
                conns.insert(id, (registered, Some(h)));
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot spawn a connection thread");
                shared.active.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

fn refuse(stream: &TcpStream, why: &str) -> std::io::Result<()> {
    refuse_with(stream, wire::HANDSHAKE_REFUSED, why)
}

fn refuse_with(mut stream: &TcpStream, status: u8, why: &str) -> std::io::Result<()> {
    let mut reply = vec![status];
    reply.extend_from_slice(&(why.len() as u32).to_le_bytes());
    reply.extend_from_slice(why.as_bytes());
    stream.write_all(&reply)?;
    stream.shutdown(Shutdown::Both)
}

/// What a handshake ended in.
enum Handshake {
    /// Refused (the reply said why); close.
    Refused,
    /// Accepted; a client that named itself is registered for as long as this lives.
    Accepted(Option<Registration>),
}

fn handshake(mut stream: &TcpStream, shared: &Shared) -> std::io::Result<Handshake> {
    stream.set_read_timeout(Some(shared.config.handshake_timeout))?;
    stream.set_write_timeout(Some(shared.config.handshake_timeout))?;
    let mut hello = [0u8; 8];
    stream.read_exact(&mut hello)?;
    if hello[0..4] != wire::HANDSHAKE_MAGIC {
        refuse(stream, "not a dinomo fabric client (bad magic)")?;
        return Ok(Handshake::Refused);
    }
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if version != wire::PROTOCOL_VERSION {
        refuse(
            stream,
            &format!(
                "protocol version {version} not supported (node speaks {})",
                wire::PROTOCOL_VERSION
            ),
        )?;
        return Ok(Handshake::Refused);
    }
    let token_len = u16::from_le_bytes([hello[6], hello[7]]) as usize;
    if token_len > wire::MAX_TOKEN_LEN {
        refuse(stream, "cluster token too long")?;
        return Ok(Handshake::Refused);
    }
    let mut rest = vec![0u8; token_len + wire::HANDSHAKE_IDENTITY];
    stream.read_exact(&mut rest)?;
    let (token, identity) = rest.split_at(token_len);
    if !shared.node.token_matches(token) {
        refuse(stream, "wrong cluster token")?;
        return Ok(Handshake::Refused);
    }
    let identity = identity.try_into().expect("split at the token's end");
    let registration = match wire::decode_identity(identity) {
        Ok(None) => None,
        // Registered before the reply: a client is never served unregistered, so a revocation that begins after
        // this either finds the connection or refused it here.
        Ok(Some(id)) => match shared
            .node
            .clients()
            .register(id, Some(stream.try_clone()?))
        {
            Ok(r) => Some(r),
            Err(refused) => {
                tracing::info!(client = %id, "refused a revoked client");
                refuse_with(stream, wire::HANDSHAKE_REVOKED, &refused.to_string())?;
                return Ok(Handshake::Refused);
            }
        },
        Err(flag) => {
            refuse(
                stream,
                &format!("bad identity flag {flag} in the handshake"),
            )?;
            return Ok(Handshake::Refused);
        }
    };
    let reply = HandshakeReply {
        pool_id: shared.node.pool().superblock().pool_id,
        regions: shared.node.regions().to_vec(),
        max_message_len: shared.node.config().max_message_len,
    };
    let body = postcard::to_stdvec(&reply).map_err(std::io::Error::other)?;
    let mut out = vec![status::OK];
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    stream.write_all(&out)?;
    // Established connections wait as long as the client likes.
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(Handshake::Accepted(registration))
}

/// Largest output buffered before it is sent even though more requests are queued.
const FLUSH_THRESHOLD: usize = 1 << 20;

fn serve_connection(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let registration = match handshake(&stream, shared)? {
        Handshake::Refused => return Ok(()),
        Handshake::Accepted(r) => r,
    };
    let gate = registration.as_ref().map(Registration::gate);
    let caller = registration.as_ref().map(Registration::id);
    let node = &shared.node;
    let max = node.config().max_message_len as usize;
    let mut rbuf = vec![0u8; 64 << 10];
    let (mut start, mut end) = (0usize, 0usize);
    let mut out: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut batch_failed = false;
    // A named client's verbs execute while its gate is held; it is let go before anything that may block (an RPC,
    // a send), so that a revocation never waits on the network or on the processor.
    let mut entered = None;
    loop {
        // Execute every complete request in the buffer.
        loop {
            let avail = end - start;
            if avail < REQ_HEADER {
                break;
            }
            let h = ReqHeader::decode(
                rbuf[start..start + REQ_HEADER]
                    .try_into()
                    .expect("48 bytes"),
            );
            if !matches!(h.op, op::READ | op::WRITE | op::CAS | op::FAA | op::RPC) {
                reply(&mut out, h.id, status::BAD_REQUEST, 0, &[]);
                stream.write_all(&out)?;
                return Ok(());
            }
            let payload = h.payload_len();
            if payload > max {
                // We will not read an absurd payload; the stream cannot be resynchronised, so close after saying why.
                reply(&mut out, h.id, VerbError::TooLarge.code(), 0, &[]);
                stream.write_all(&out)?;
                return Ok(());
            }
            if avail < REQ_HEADER + payload {
                let need = REQ_HEADER + payload;
                if rbuf.len() < need {
                    rbuf.copy_within(start..end, 0);
                    end -= start;
                    start = 0;
                    // Grow with the bytes that arrive, not with what a header announces: a header alone must not
                    // commit a whole payload's worth of memory per connection.
                    if end == rbuf.len() {
                        rbuf.resize(need.min(rbuf.len() * 2), 0);
                    }
                }
                break;
            }
            if let Some(gate) = gate {
                if h.op == op::RPC {
                    entered = None;
                    if gate.is_revoked() {
                        return revoked(caller);
                    }
                } else if entered.is_none() {
                    match gate.enter() {
                        Some(g) => entered = Some(g),
                        None => return revoked(caller),
                    }
                }
            }
            let body = &rbuf[start + REQ_HEADER..start + REQ_HEADER + payload];
            execute(node, caller, &h, body, &mut out, &mut batch_failed);
            start += REQ_HEADER + payload;
            if out.len() >= FLUSH_THRESHOLD {
                entered = None;
                stream.write_all(&out)?;
                out.clear();
            }
        }
        entered = None;
        if !out.is_empty() {
            stream.write_all(&out)?;
            out.clear();
        }
        if start == end {
            start = 0;
            end = 0;
        } else if start > 0 && rbuf.len() - end < REQ_HEADER {
            rbuf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let n = match stream.read(&mut rbuf[end..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        end += n;
    }
}

/// Ends a revoked client's connection: nothing it sent after the revocation is executed or answered.
fn revoked(caller: Option<ClientId>) -> std::io::Result<()> {
    tracing::info!(client = ?caller, "connection revoked; its remaining requests are dropped");
    Ok(())
}

#[inline]
fn reply(out: &mut Vec<u8>, id: u32, status: u8, value: u64, payload: &[u8]) {
    RespHeader {
        id,
        status,
        len: payload.len() as u32,
        value,
    }
    .encode(out);
    out.extend_from_slice(payload);
}

#[inline]
fn execute(
    node: &MemoryNode,
    caller: Option<ClientId>,
    h: &ReqHeader,
    body: &[u8],
    out: &mut Vec<u8>,
    batch_failed: &mut bool,
) {
    let last = h.flags & FLAG_LAST != 0;
    if h.op == op::RPC {
        // Method ids are 16-bit; a larger target names no method (rather than one it would truncate to).
        let Ok(method) = u16::try_from(h.target) else {
            reply(out, h.id, status::RPC_UNKNOWN, 0, &[]);
            return;
        };
        match node.call(caller, method, body.to_vec()) {
            Ok(resp) => reply(out, h.id, status::OK, 0, &resp),
            Err(RpcError::UnknownMethod(_)) => reply(out, h.id, status::RPC_UNKNOWN, 0, &[]),
            Err(RpcError::Failed(m)) => reply(out, h.id, status::RPC_FAILED, 0, m.as_bytes()),
            Err(RpcError::OutOfSpace(m)) => reply(out, h.id, status::RPC_NO_SPACE, 0, m.as_bytes()),
            Err(RpcError::Codec(m)) => reply(out, h.id, status::RPC_CODEC, 0, m.as_bytes()),
            Err(RpcError::ProcessorDown) => reply(out, h.id, status::RPC_DOWN, 0, &[]),
        }
        return;
    }
    // Ok(Some(v)): reply with value v; Ok(None): the reply (READ data) is already in `out`.
    let result = if *batch_failed {
        Err(VerbError::Skipped)
    } else {
        match h.op {
            op::READ => read_into(node, h, out).map(|()| None),
            op::WRITE => node
                .nic()
                .write(h.target, h.rkey, h.offset, body)
                .map(|()| Some(0)),
            op::CAS => node
                .nic()
                .cas(h.target, h.rkey, h.offset, h.arg0, h.arg1)
                .map(Some),
            _ => node.nic().faa(h.target, h.rkey, h.offset, h.arg0).map(Some),
        }
    };
    match result {
        Ok(Some(value)) => reply(out, h.id, status::OK, value, &[]),
        Ok(None) => {}
        Err(e) => {
            *batch_failed = true;
            reply(out, h.id, e.code(), 0, &[]);
        }
    }
    if last {
        *batch_failed = false;
    }
}

/// Appends a READ's reply header and data straight from the pool to `out`, or nothing if refused.
#[inline]
fn read_into(node: &MemoryNode, h: &ReqHeader, out: &mut Vec<u8>) -> Result<(), VerbError> {
    // Refuse before growing the buffer: the length comes from the network.
    if h.len > node.config().max_message_len {
        return Err(VerbError::TooLarge);
    }
    let at = out.len();
    RespHeader {
        id: h.id,
        status: status::OK,
        len: h.len,
        value: 0,
    }
    .encode(out);
    out.resize(at + wire::RESP_HEADER + h.len as usize, 0);
    let r = node.nic().read(
        h.target,
        h.rkey,
        h.offset,
        &mut out[at + wire::RESP_HEADER..],
    );
    if r.is_err() {
        out.truncate(at);
    }
    r
}
