//! The RESP server: an accept thread and one thread per connection. A connection thread reads what arrived,
//! parses every complete request in it, runs their key operations together on the backend, and writes all the
//! replies with one system call (pipelining).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::backend::Backend;
use crate::parse::{ParseLimits, RequestParser};
use crate::session::{Flow, Session, Shared};

/// Default of [`ServerConfig::max_clients`] (Redis's `maxclients`).
pub const DEFAULT_MAX_CLIENTS: usize = 10_000;
/// Default of [`ServerConfig::max_pipeline`].
pub const DEFAULT_MAX_PIPELINE: usize = 1024;
/// Bytes asked for per read.
const READ_CHUNK: usize = 64 << 10;
/// Buffers that grew beyond this for one large request or reply are given back afterwards.
const KEEP_BUFFER: usize = 1 << 20;

/// Settings of a RESP server. In configuration files the address and the thread names are left out: whoever
/// starts the server sets them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default 127.0.0.1:6379.
    #[serde(skip)]
    pub listen: SocketAddr,
    /// The password of the `default` user (Redis's `requirepass`); `None` lets every client in. Default `None`.
    pub requirepass: Option<String>,
    /// Redis's protected mode: refuse to start on a non-loopback address without a password. Default on.
    pub protected_mode: bool,
    /// Connections served at once; one more gets `-ERR max number of clients reached` and is closed (Redis's
    /// `maxclients`). Default [`DEFAULT_MAX_CLIENTS`].
    pub max_clients: usize,
    /// Closes a connection idle this long (Redis's `timeout`); zero never does. Default 0.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Bounds on requests: argument length, argument count, inline length, request size.
    pub limits: ParseLimits,
    /// Requests of one pipeline run together before their replies are written (bounds the replies held back).
    /// Default [`DEFAULT_MAX_PIPELINE`].
    pub max_pipeline: usize,
    /// Prefix of thread names. Default `dinomo-resp`.
    #[serde(skip)]
    pub name: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 6379)),
            requirepass: None,
            protected_mode: true,
            max_clients: DEFAULT_MAX_CLIENTS,
            idle_timeout: Duration::ZERO,
            limits: ParseLimits::default(),
            max_pipeline: DEFAULT_MAX_PIPELINE,
            name: "dinomo-resp".into(),
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Protected mode refused a non-loopback address without a password.
    #[error(
        "protected mode: refusing to serve RESP on {0} without a password; set requirepass, listen on a loopback address, or turn protected mode off"
    )]
    ProtectedMode(SocketAddr),
    /// A setting is out of range.
    #[error("invalid RESP setting: {0}")]
    Config(String),
    /// Binding or starting threads failed.
    #[error("RESP server on {addr}: {error}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// What failed.
        error: std::io::Error,
    },
}

/// Counters of a running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub connected_clients: usize,
    /// Connections accepted since start.
    pub connections_received: u64,
    /// Connections refused by the client limit.
    pub rejected_connections: u64,
    /// Requests handled.
    pub commands_processed: u64,
    /// Error replies sent.
    pub error_replies: u64,
}

/// Reads a server's counters; see [`RespServer::stats_handle`]. After the server stops they stay as they were.
#[derive(Clone)]
pub struct StatsHandle(Arc<Shared>);

impl StatsHandle {
    /// The counters now.
    pub fn stats(&self) -> ServerStats {
        let k = &self.0.counters;
        ServerStats {
            connected_clients: k.connected_clients.load(Ordering::Acquire),
            connections_received: k.connections_received.load(Ordering::Relaxed),
            rejected_connections: k.rejected_connections.load(Ordering::Relaxed),
            commands_processed: k.commands_processed.load(Ordering::Relaxed),
            error_replies: k.error_replies.load(Ordering::Relaxed),
        }
    }
}

/// A running RESP server; dropping it stops accepting and closes every connection.
pub struct RespServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl RespServer {
    /// Binds `config.listen` and serves `backend` until dropped.
    pub fn start<B: Backend>(config: ServerConfig, backend: B) -> Result<RespServer, ServerError> {
        if config.protected_mode
            && config.requirepass.is_none()
            && !config.listen.ip().is_loopback()
        {
            return Err(ServerError::ProtectedMode(config.listen));
        }
        if config.max_clients == 0 || config.max_pipeline == 0 {
            return Err(ServerError::Config(
                "max_clients and max_pipeline must be at least 1".into(),
            ));
        }
        let io = |error| ServerError::Io {
            addr: config.listen,
            error,
        };
        let listener = TcpListener::bind(config.listen).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let shared = Arc::new(Shared::new(config.clone(), addr.port()));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
        let backend = Arc::new(backend);
        let accept = {
            let (shared, stop, conns) = (shared.clone(), stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name(format!("{}-accept", config.name))
                .spawn(move || accept_loop(listener, backend, shared, stop, conns))
                .map_err(io)?
        };
        info!(%addr, "RESP server listening");
        Ok(RespServer {
            addr,
            shared,
            stop,
            conns,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its counters.
    pub fn stats(&self) -> ServerStats {
        self.stats_handle().stats()
    }

    /// A handle that reads its counters, for whoever reports them without owning the server.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.shared.clone())
    }

    /// Closes every open connection (the listener keeps accepting).
    pub fn cut_all_connections(&self) {
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for RespServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.cut_all_connections();
    }
}

fn accept_loop<B: Backend>(
    listener: TcpListener,
    backend: Arc<B>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "accept failed");
                // Out of descriptors, typically: give connections a moment to close.
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        let k = &shared.counters;
        if k.connected_clients.load(Ordering::Acquire) >= shared.config.max_clients {
            k.rejected_connections.fetch_add(1, Ordering::Relaxed);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        k.connections_received.fetch_add(1, Ordering::Relaxed);
        k.connected_clients.fetch_add(1, Ordering::AcqRel);
        let guard = Connected {
            shared: shared.clone(),
            conns: conns.clone(),
            key: None,
        };
        let (backend, shared) = (backend.clone(), shared.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-conn", shared.config.name))
            .spawn(move || serve(stream, &*backend, shared, guard));
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a connection thread");
        }
    }
}

/// Undoes a connection's registration however its thread ends.
struct Connected {
    shared: Arc<Shared>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    key: Option<u64>,
}

impl Drop for Connected {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            self.conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&k);
        }
        self.shared
            .counters
            .connected_clients
            .fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve<B: Backend>(
    mut stream: TcpStream,
    backend: &B,
    shared: Arc<Shared>,
    mut guard: Connected,
) {
    let _ = stream.set_nodelay(true);
    let idle = shared.config.idle_timeout;
    if !idle.is_zero() {
        let _ = stream.set_read_timeout(Some(idle));
    }
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut session = Session::new(backend.connect(), shared.clone(), peer, local);
    if let Ok(c) = stream.try_clone() {
        let key = session.id();
        guard
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, c);
        guard.key = Some(key);
    }
    let mut parser = RequestParser::new(shared.config.limits.clone());
    let max_pipeline = shared.config.max_pipeline;
    let counters = &shared.counters;
    let mut input = Input::new();
    let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
    loop {
        let n = match stream.read(input.room()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                    debug!("closing an idle RESP connection");
                }
                break;
            }
        };
        input.filled(n);
        counters
            .net_input_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        let mut close = false;
        let mut batch = 0;
        loop {
            let (used, parsed) = parser.parse(input.pending(), session.authenticated());
            input.consume(used);
            match parsed {
                Ok(Some(args)) => {
                    if session.handle(args, &mut out) == Flow::Close {
                        close = true;
                        break;
                    }
                    batch += 1;
                    if batch >= max_pipeline {
                        session.flush(&mut out);
                        if !write_out(&mut stream, &mut out, counters) {
                            return;
                        }
                        batch = 0;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    debug!(error = %e, "protocol error; closing the connection");
                    session.protocol_error(&e, &mut out);
                    close = true;
                    break;
                }
            }
        }
        session.flush(&mut out);
        if !write_out(&mut stream, &mut out, counters) || close {
            break;
        }
        if out.capacity() > KEEP_BUFFER {
            out = Vec::with_capacity(16 << 10);
        }
        input.shrink();
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Received bytes not parsed yet, `data[start..end]`; the rest of `data` is room for the next read (zeroed once
/// when the buffer grows, not before every read).
struct Input {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl Input {
    fn new() -> Input {
        Input {
            data: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Room for at least [`READ_CHUNK`] more bytes.
    fn room(&mut self) -> &mut [u8] {
        if self.data.len() - self.end < READ_CHUNK {
            if self.start > 0 {
                self.data.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.data.len() - self.end < READ_CHUNK {
                self.data.resize(self.end + READ_CHUNK, 0);
            }
        }
        &mut self.data[self.end..]
    }

    fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// Gives back memory that grew for one large request.
    fn shrink(&mut self) {
        if self.start == self.end && self.data.len() > KEEP_BUFFER {
            *self = Input::new();
        }
    }
}

/// Writes and clears `out`; false when the connection is gone.
fn write_out(
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
    counters: &crate::session::Counters,
) -> bool {
    if out.is_empty() {
        return true;
    }
    let ok = stream.write_all(out).is_ok();
    counters
        .net_output_bytes
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    out.clear();
    ok
}
