//! A KV node's native-protocol server: one reader and one writer thread per connection; data requests go to the
//! workers' queues tagged with their request id, replies are written back as the workers produce them.

use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, select, unbounded};
use dinomo_kn::{Command, DataOp, KnError, Reply, Tagged};
use tracing::{debug, warn};

use crate::node::NodeShared;
use crate::wire::{
    ErrorKind, FrameError, PROTOCOL_VERSION, Request, RequestBody, Response, ResponseBody,
    read_frame, write_frame,
};

/// Largest first frame of a connection: a `Hello` carries a version and a token, nothing more.
const MAX_HELLO_FRAME: u32 = 64 << 10;

/// Limits of a server.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerLimits {
    /// Largest request frame accepted. Default [`crate::wire::DEFAULT_MAX_FRAME`].
    pub max_frame: u32,
    /// Connections served at once; one more is told so (an `Unavailable` error, which clients retry) and closed
    /// right after accept. Default 1024.
    pub max_connections: usize,
    /// How long a new connection may take to send its `Hello` before it is closed. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_frame: crate::wire::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// Something a server can answer requests for.
pub(crate) trait Service: Send + Sync + 'static {
    /// Handles a request that is not queued at a worker: answers right away (on the reader thread).
    fn answer(&self, body: RequestBody) -> ResponseBody;
    /// Queues a data operation; its reply arrives on `replies` tagged with `id`. Returns the immediate answer when
    /// it cannot be queued.
    fn submit(&self, id: u64, op: DataOp, replies: &Sender<Tagged>) -> Option<ResponseBody>;
}

/// A listening server; dropping it stops accepting and closes every connection.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `service` on `listen` to connections that present `token` in their handshake. Like Redis's protected
    /// mode, a non-loopback address needs a token: without one, anyone who reaches the port could change the
    /// cluster's ownership.
    pub(crate) fn start(
        listen: SocketAddr,
        limits: ServerLimits,
        token: &str,
        service: Arc<dyn Service>,
        name: &str,
    ) -> std::io::Result<Server> {
        if token.is_empty() && !listen.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "refusing to serve the native protocol on non-loopback address {listen} without a cluster \
                     token (set fabric.token or DINOMO_CLUSTER_TOKEN)"
                ),
            ));
        }
        let token: Arc<str> = token.into();
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(AtomicUsize::new(0));
        let accept = {
            let (stop, conns) = (stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let stream = match stream {
                            Ok(s) => s,
                            Err(e) => {
                                debug!(error = %e, "accept failed");
                                // Out of descriptors, typically: give connections a moment to close.
                                std::thread::sleep(Duration::from_millis(5));
                                continue;
                            }
                        };
                        if live.load(Ordering::Acquire) >= limits.max_connections {
                            debug!("connection limit reached; turning a new connection away");
                            turn_away(stream, limits.max_connections);
                            continue;
                        }
                        let _ = stream.set_nodelay(true);
                        if let Ok(c) = stream.try_clone() {
                            let mut all = conns.lock().expect("connections lock");
                            all.retain(|s| s.peer_addr().is_ok());
                            all.push(c);
                        }
                        live.fetch_add(1, Ordering::AcqRel);
                        let slot = LiveSlot(live.clone());
                        let (service, limits, token) =
                            (service.clone(), limits.clone(), token.clone());
                        let spawned = std::thread::Builder::new()
                            .name("dinomo-conn".into())
                            .spawn(move || {
                                let _slot = slot;
                                serve_connection(stream, &*service, &limits, &token);
                            });
                        if spawned.is_err() {
                            warn!("cannot start a connection thread");
                        }
                    }
                })?
        };
        Ok(Server {
            addr,
            stop,
            conns,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection (the listener keeps accepting).
    pub fn cut_all_connections(&self) {
        for c in self.conns.lock().expect("connections lock").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Server {
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

/// A served connection's place in the count of live ones, given back however its thread ends, or when the
/// thread could not be started.
struct LiveSlot(Arc<AtomicUsize>);

impl Drop for LiveSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tells a connection beyond the limit of `limit` why it is closed, so that its client can say so and try again
/// later. The accept loop runs this: it waits at most a moment on the write and reads nothing.
fn turn_away(stream: TcpStream, limit: usize) {
    let busy = Response {
        id: 0,
        body: ResponseBody::Error {
            kind: ErrorKind::Unavailable,
            message: format!("the node serves at most {limit} connections at once"),
        },
    };
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = write_frame(&mut &stream, &busy, &mut Vec::new());
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads a connection's first frame, which must be a `Hello` of this protocol version with the cluster token, and
/// answers it. False when the connection must close: refused (the refusal is sent), or gone.
fn handshake(
    stream: &TcpStream,
    reader: &mut BufReader<&TcpStream>,
    buf: &mut Vec<u8>,
    limits: &ServerLimits,
    token: &str,
) -> bool {
    let wait = Some(limits.handshake_timeout.max(Duration::from_millis(1)));
    if stream.set_read_timeout(wait).is_err() || stream.set_write_timeout(wait).is_err() {
        return false;
    }
    let (id, message) = match read_frame::<Request>(reader, buf, MAX_HELLO_FRAME) {
        // Gone, or silent for the whole timeout.
        Err(FrameError::Io(_)) => return false,
        Err(e) => (u64::MAX, format!("no handshake: {e}")),
        Ok(Request {
            id,
            body:
                RequestBody::Hello {
                    version,
                    token: presented,
                },
        }) => {
            if version != PROTOCOL_VERSION {
                (
                    id,
                    format!(
                        "native protocol version {version} is not spoken here (this node speaks \
                         {PROTOCOL_VERSION})"
                    ),
                )
            } else if !dinomo_fabric::token_matches(presented.0.as_bytes(), token.as_bytes()) {
                (id, "wrong cluster token".to_string())
            } else {
                let welcome = Response {
                    id,
                    body: ResponseBody::Welcome {
                        version: PROTOCOL_VERSION,
                    },
                };
                return write_frame(&mut &*stream, &welcome, buf).is_ok()
                    && stream.set_read_timeout(None).is_ok()
                    && stream.set_write_timeout(None).is_ok();
            }
        }
        Ok(Request { id, .. }) => (
            id,
            "the first request on a connection must be Hello, with the protocol version and the cluster token"
                .to_string(),
        ),
    };
    warn!(peer = ?stream.peer_addr().ok(), reason = %message, "refused a native-protocol connection");
    let refusal = Response {
        id,
        body: ResponseBody::Error {
            kind: ErrorKind::Refused,
            message,
        },
    };
    let _ = write_frame(&mut &*stream, &refusal, buf);
    false
}

fn serve_connection(stream: TcpStream, service: &dyn Service, limits: &ServerLimits, token: &str) {
    let mut reader = BufReader::new(&stream);
    let mut buf = Vec::new();
    if !handshake(&stream, &mut reader, &mut buf, limits, token) {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let (direct_tx, direct_rx) = unbounded::<Response>();
    let (tagged_tx, tagged_rx) = unbounded::<Tagged>();
    let writer = std::thread::Builder::new()
        .name("dinomo-conn-w".into())
        .spawn(move || write_loop(write_half, direct_rx, tagged_rx));
    let Ok(writer) = writer else { return };
    loop {
        let req: Request = match read_frame(&mut reader, &mut buf, limits.max_frame) {
            Ok(r) => r,
            Err(FrameError::Io(_)) => break,
            Err(e) => {
                // The stream cannot be resynchronised after a bad frame: answer and close.
                let _ = direct_tx.send(Response {
                    id: u64::MAX,
                    body: ResponseBody::Error {
                        kind: ErrorKind::Invalid,
                        message: e.to_string(),
                    },
                });
                break;
            }
        };
        let id = req.id;
        let immediate = match req.body {
            RequestBody::Data(op) => service.submit(id, op, &tagged_tx),
            RequestBody::Hello { .. } => Some(ResponseBody::Error {
                kind: ErrorKind::Invalid,
                message: "this connection's handshake is done already".into(),
            }),
            other => Some(service.answer(other)),
        };
        if let Some(body) = immediate
            && direct_tx.send(Response { id, body }).is_err()
        {
            break;
        }
    }
    drop(direct_tx);
    drop(tagged_tx);
    // The writer ends once every queued request has been answered.
    let _ = writer.join();
    let _ = stream.shutdown(Shutdown::Both);
}

fn write_loop(stream: TcpStream, direct: Receiver<Response>, tagged: Receiver<Tagged>) {
    let mut w = BufWriter::new(stream);
    let mut buf = Vec::new();
    let (mut direct_open, mut tagged_open) = (true, true);
    let (never_direct, never_tagged) = (crossbeam_channel::never(), crossbeam_channel::never());
    while direct_open || tagged_open {
        let resp = select! {
            recv(if direct_open { &direct } else { &never_direct }) -> r => match r {
                Ok(r) => r,
                Err(_) => { direct_open = false; continue; }
            },
            recv(if tagged_open { &tagged } else { &never_tagged }) -> r => match r {
                Ok((id, r)) => Response { id, body: reply_body(r) },
                Err(_) => { tagged_open = false; continue; }
            },
        };
        if write_frame(&mut w, &resp, &mut buf).is_err() {
            return;
        }
        // Flush when nothing else is ready, so pipelined replies share a system call.
        if direct.is_empty() && tagged.is_empty() && w.flush().is_err() {
            return;
        }
    }
    let _ = w.flush();
}

/// A worker's reply in protocol terms.
pub(crate) fn reply_body(r: Result<Reply, KnError>) -> ResponseBody {
    match r {
        Ok(Reply::Value(v)) => ResponseBody::Value(v),
        Ok(Reply::Applied(a)) => ResponseBody::Applied(a),
        Ok(Reply::Int(n)) => ResponseBody::Int(n),
        Ok(Reply::Stats(s)) => ResponseBody::Stats(serde_json::to_string(&s).unwrap_or_default()),
        Ok(Reply::Epoch(s)) => ResponseBody::Stats(serde_json::to_string(&s).unwrap_or_default()),
        Err(KnError::NotOwner { epoch, .. }) => ResponseBody::NotOwner { epoch },
        Err(e) => error_body(e),
    }
}

/// An error in protocol terms.
pub(crate) fn error_body(e: KnError) -> ResponseBody {
    let kind = match &e {
        KnError::KeyTooLarge { .. }
        | KnError::ValueTooLarge { .. }
        | KnError::NotAnInteger
        | KnError::IncrOverflow
        | KnError::Config(_) => ErrorKind::Invalid,
        // Not applied: the client may try again.
        KnError::Contended { .. } => ErrorKind::Unavailable,
        KnError::OutOfSpace(_) => ErrorKind::OutOfSpace,
        e if e.is_indeterminate() => ErrorKind::Indeterminate,
        _ => ErrorKind::Unavailable,
    };
    ResponseBody::Error {
        kind,
        message: e.to_string(),
    }
}

impl Service for NodeShared {
    fn answer(&self, body: RequestBody) -> ResponseBody {
        match body {
            RequestBody::Routing => ResponseBody::Routing(self.routing()),
            RequestBody::Stats => match self.stats() {
                Ok(s) => ResponseBody::Stats(serde_json::to_string(&s).unwrap_or_default()),
                Err(e) => error_body(e),
            },
            RequestBody::Install(routing) => match self.install(routing) {
                Ok(()) => ResponseBody::Done,
                Err(e) => error_body(e),
            },
            RequestBody::Ping => ResponseBody::Done,
            RequestBody::LatencyReport(report) => match self.record_latency(&report) {
                Ok(()) => ResponseBody::Done,
                Err(message) => ResponseBody::Error {
                    kind: ErrorKind::Invalid,
                    message,
                },
            },
            RequestBody::EpochStats => match self.epoch_stats() {
                Ok(s) => ResponseBody::EpochStats(Box::new(s)),
                Err(e) => error_body(e),
            },
            RequestBody::MemoryStats => match self.memory_stats() {
                Ok(s) => ResponseBody::Stats(serde_json::to_string(&s).unwrap_or_default()),
                Err(message) => ResponseBody::Error {
                    kind: ErrorKind::Unavailable,
                    message: format!("the memory node's statistics: {message}"),
                },
            },
            other => ResponseBody::Error {
                kind: ErrorKind::Invalid,
                message: format!("unexpected request {other:?}"),
            },
        }
    }

    fn submit(&self, id: u64, op: DataOp, replies: &Sender<Tagged>) -> Option<ResponseBody> {
        match self.submitter.submit(Command::Data(op), id, replies) {
            Ok(()) => None,
            Err(e) => Some(error_body(e)),
        }
    }
}
