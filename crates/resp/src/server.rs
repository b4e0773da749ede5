//! The RESP server: an accept thread and a few event-loop threads, each serving many connections (epoll through
//! `mio`), as Redis serves them. A loop thread reads what arrived on every ready connection, parses every complete
//! request and starts the key operations at the backend, without waiting for them: while a store's worker
//! threads run one connection's operations, the loop serves the others. The backend rings the connection's
//! [`Wake`] as results come; the loop then completes the operations and writes the connection's replies with one
//! system call (pipelining). A connection has one batch of operations running at a time, so its replies keep the
//! order of its requests; what it sends meanwhile is read once the batch is answered.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use tracing::{debug, info, warn};

use crate::backend::{Backend, BackendConn};
use crate::parse::{ParseLimits, RequestParser};
use crate::session::{Flow, Session, Shared};
use crate::wake::Wake;
use crossbeam_utils::Backoff;
use dinomo_sync::{Inbox, Mailbox};

/// Default of [`ServerConfig::max_clients`] (Redis's `maxclients`).
pub const DEFAULT_MAX_CLIENTS: usize = 10_000;
/// Default of [`ServerConfig::max_pipeline`].
pub const DEFAULT_MAX_PIPELINE: usize = 1024;
/// Default of [`ServerConfig::max_keys_reply`].
pub const DEFAULT_MAX_KEYS_REPLY: usize = 1_000_000;
/// Default of [`ServerConfig::io_threads`]: 0, sized to the machine ([`ServerConfig::event_loops`]).
pub const DEFAULT_IO_THREADS: usize = 0;
/// With `io_threads` 0, one event loop per this many cores the process may run on: the loops read, parse and
/// write for the workers, and the rest of the cores are left to the workers, the merge threads and the clients.
pub const CORES_PER_EVENT_LOOP: usize = 4;
/// With `io_threads` 0, at most this many event loops.
pub const MAX_AUTO_EVENT_LOOPS: usize = 8;
/// The most [`ServerConfig::io_threads`] a server starts.
pub const MAX_IO_THREADS: usize = 1024;
/// Readiness events taken from the kernel per wait.
const EVENTS_PER_POLL: usize = 1024;
/// The token of a loop's waker (connections are numbered from 0).
const WAKER: Token = Token(usize::MAX);
/// Bytes asked for per read.
const READ_CHUNK: usize = 64 << 10;
/// Buffers that grew beyond this for one large request or reply are given back afterwards.
const KEEP_BUFFER: usize = 1 << 20;
/// How often a loop with operations running asks the backend about them even if not rung: a store that gives up
/// on its operations after a time limit reports them failed by then.
const RUNNING_CHECK: Duration = Duration::from_secs(1);

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
    /// Event-loop threads serving the connections (each connection stays on one; Redis's `io-threads`, but
    /// each thread also runs the commands). 0: one per [`CORES_PER_EVENT_LOOP`] available cores, at least 1 and
    /// at most [`MAX_AUTO_EVENT_LOOPS`]. Default [`DEFAULT_IO_THREADS`], at most [`MAX_IO_THREADS`].
    pub io_threads: usize,
    /// The most keys `KEYS` answers with; a pattern matching more gets an error that points to `SCAN`, so that
    /// one command cannot hold the whole keyspace in memory. Default [`DEFAULT_MAX_KEYS_REPLY`].
    pub max_keys_reply: usize,
    /// Prefix of thread names. Default `dinomo-resp`.
    #[serde(skip)]
    pub name: String,
    /// What `SHUTDOWN` calls to stop the serving process cleanly (the `dinomo` commands raise SIGTERM, as a
    /// supervisor would); `None` (the default, as for a server embedded in another program) refuses `SHUTDOWN`.
    #[serde(skip)]
    pub shutdown: Option<ShutdownHook>,
}

/// How `SHUTDOWN` stops the process that serves ([`ServerConfig::shutdown`]).
#[derive(Clone)]
pub struct ShutdownHook(Arc<dyn Fn() + Send + Sync>);

impl ShutdownHook {
    /// A hook that runs `stop`.
    pub fn new(stop: impl Fn() + Send + Sync + 'static) -> ShutdownHook {
        ShutdownHook(Arc::new(stop))
    }

    /// Starts the shutdown.
    pub fn run(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for ShutdownHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShutdownHook")
    }
}

impl PartialEq for ShutdownHook {
    fn eq(&self, other: &ShutdownHook) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
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
            io_threads: DEFAULT_IO_THREADS,
            max_keys_reply: DEFAULT_MAX_KEYS_REPLY,
            name: "dinomo-resp".into(),
            shutdown: None,
        }
    }
}

impl ServerConfig {
    /// The event loops the server starts: `io_threads`, or for 0 as many as the cores this process may run on
    /// call for ([`auto_event_loops`]).
    pub fn event_loops(&self) -> usize {
        match self.io_threads {
            0 => auto_event_loops(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            ),
            n => n,
        }
    }
}

/// The event loops `io_threads = 0` starts on a machine of `cores`: one per [`CORES_PER_EVENT_LOOP`], at least 1
/// and at most [`MAX_AUTO_EVENT_LOOPS`].
pub fn auto_event_loops(cores: usize) -> usize {
    (cores / CORES_PER_EVENT_LOOP).clamp(1, MAX_AUTO_EVENT_LOOPS)
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
    accept: Option<JoinHandle<()>>,
    loops: Arc<Vec<LoopHandle>>,
}

/// How the accept thread and the server reach an event loop.
struct LoopHandle {
    /// New connections for the loop.
    tx: Sender<(TcpStream, Connected)>,
    /// Where the loop's connections are rung; its wake tells the loop of a new connection or a stop.
    mailbox: Arc<Mailbox<usize>>,
    thread: Option<JoinHandle<()>>,
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
        if config.io_threads > MAX_IO_THREADS {
            return Err(ServerError::Config(format!(
                "io_threads {} is above the maximum of {MAX_IO_THREADS}",
                config.io_threads
            )));
        }
        let io = |error| ServerError::Io {
            addr: config.listen,
            error,
        };
        let listener = TcpListener::bind(config.listen).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let shared = Arc::new(Shared::new(config.clone(), addr.port()));
        let stop = Arc::new(AtomicBool::new(false));
        let backend = Arc::new(backend);
        let event_loops = config.event_loops();
        let mut loops = Vec::with_capacity(event_loops);
        for n in 0..event_loops {
            let poll = Poll::new().map_err(io)?;
            let (mailbox, rung) = Mailbox::new(&poll, WAKER).map_err(io)?;
            let (tx, rx) = channel();
            let event_loop = EventLoop {
                poll,
                incoming: rx,
                mailbox: mailbox.clone(),
                rung,
                backend: backend.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
                slots: Vec::new(),
                free: Vec::new(),
                running: 0,
                started: Vec::new(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("{}-io{n}", config.name))
                .spawn(move || event_loop.run())
                .map_err(io)?;
            loops.push(LoopHandle {
                tx,
                mailbox,
                thread: Some(thread),
            });
        }
        let loops = Arc::new(loops);
        let accept = {
            let (shared, stop, loops) = (shared.clone(), stop.clone(), loops.clone());
            std::thread::Builder::new()
                .name(format!("{}-accept", config.name))
                .spawn(move || accept_loop(listener, shared, stop, &loops))
                .map_err(io)?
        };
        info!(%addr, "RESP server listening");
        Ok(RespServer {
            addr,
            shared,
            stop,
            accept: Some(accept),
            loops,
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
        self.shared.clients.cut_all();
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
        // The accept thread is gone, so this is the only holder of the loops' handles: each loop is woken, sees
        // the stop flag and closes its connections.
        if let Some(loops) = Arc::get_mut(&mut self.loops) {
            for l in loops.iter_mut() {
                let _ = l.mailbox.wake();
                if let Some(t) = l.thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    loops: &[LoopHandle],
) {
    let mut next = 0;
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
        if let Err(e) = stream.set_nonblocking(true) {
            debug!(error = %e, "cannot make a connection non-blocking; closing it");
            continue;
        }
        let _ = stream.set_nodelay(true);
        k.connections_received.fetch_add(1, Ordering::Relaxed);
        k.connected_clients.fetch_add(1, Ordering::AcqRel);
        let guard = Connected {
            shared: shared.clone(),
        };
        // Round robin: every loop gets its share of the connections.
        let l = &loops[next % loops.len()];
        next = next.wrapping_add(1);
        if l.tx.send((stream, guard)).is_err() || l.mailbox.wake().is_err() {
            warn!("an event loop of the RESP server is gone; connection dropped");
        }
    }
}

/// Counts a connection out however it ends (its session takes itself off the client list).
struct Connected {
    shared: Arc<Shared>,
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.shared
            .counters
            .connected_clients
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// One event-loop thread and the connections it serves, numbered by their slot.
struct EventLoop<B: Backend> {
    poll: Poll,
    incoming: Receiver<(TcpStream, Connected)>,
    /// Where the backend rings connections whose operations made progress (by slot).
    mailbox: Arc<Mailbox<usize>>,
    rung: Inbox<usize>,
    backend: Arc<B>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    slots: Vec<Option<Conn<B::Conn>>>,
    free: Vec<usize>,
    /// Connections whose started operations have not completed.
    running: usize,
    /// Connections that started operations this iteration, looked at once every ready connection's are started:
    /// the store then has all of them to run at once, and a look finds more of them done.
    started: Vec<usize>,
}

/// What serving a connection's input left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Its key operations were started: complete them (once they are done) and write the replies.
    Started,
    /// Nothing more now.
    Wait,
    /// Replies wait for the socket to take them.
    Blocked,
    /// Close it now.
    Close,
}

impl<B: Backend> EventLoop<B> {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        let idle = self.shared.config.idle_timeout;
        // Idle connections are looked for a few times per timeout.
        let sweep_every = (!idle.is_zero()).then(|| (idle / 4).max(Duration::from_millis(10)));
        let mut last_sweep = Instant::now();
        let mut last_check = Instant::now();
        loop {
            // Results of running operations are often microseconds away: look for a ring a little before sleeping
            // in `poll`, whose wake-up costs the ringing thread a system call and this one a reschedule.
            if self.running > 0 {
                let backoff = Backoff::new();
                while !self.rung.has_news() && !backoff.is_completed() {
                    backoff.snooze();
                }
            }
            // Sleep only with nothing started to look at (and no ring, see `Inbox::poll`).
            let timeout = if self.running > 0 {
                Some(sweep_every.map_or(RUNNING_CHECK, |s| s.min(RUNNING_CHECK)))
            } else {
                sweep_every
            };
            let polled = self.rung.poll(
                &mut self.poll,
                &mut events,
                self.started.is_empty(),
                timeout,
            );
            if let Err(e) = polled {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                warn!(error = %e, "RESP event loop failed; closing its connections");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            // Every ready connection's input: its requests parsed, its key operations started.
            for event in events.iter() {
                if event.token() == WAKER {
                    self.adopt();
                    continue;
                }
                let slot = event.token().0;
                let Some(Some(conn)) = self.slots.get_mut(slot) else {
                    continue;
                };
                conn.session.card().touch(now);
                // The peer hung up: read to the end, never trusting a short read to have emptied the socket.
                conn.hup |= event.is_read_closed() || event.is_error();
                if conn.running {
                    // Its requests wait until the running batch is answered (events are edge-triggered: remember).
                    conn.unread = true;
                    continue;
                }
                let step = if conn.out.is_empty() {
                    conn.serve_input(&self.shared)
                } else {
                    // Blocked on output: finish writing, then read what waited.
                    match conn.write_out(&self.shared) {
                        Ok(true) if conn.closing => Step::Close,
                        Ok(true) => match conn.reregister(self.poll.registry(), slot, false) {
                            Ok(()) => conn.serve_input(&self.shared),
                            Err(_) => Step::Close,
                        },
                        Ok(false) => Step::Wait,
                        Err(()) => Step::Close,
                    }
                };
                self.settle(slot, step);
            }
            // Then the connections that started operations, and those whose operations the backend rang about
            // (in one buffer kept between iterations; a look may start operations again, for the next one).
            let mut looking = std::mem::take(&mut self.started);
            looking.extend(self.rung.take());
            for slot in looking.drain(..) {
                self.look(slot);
            }
            if self.started.is_empty() {
                self.started = looking;
            }
            if self.running > 0 && now.duration_since(last_check) >= RUNNING_CHECK {
                last_check = now;
                for slot in 0..self.slots.len() {
                    self.look(slot);
                }
            }
            if let Some(every) = sweep_every
                && now.duration_since(last_sweep) >= every
            {
                last_sweep = now;
                for slot in 0..self.slots.len() {
                    // A connection waiting for its operations is not idle.
                    if let Some(conn) = &self.slots[slot]
                        && !conn.running
                        && conn.session.card().idle(now) >= idle
                    {
                        debug!("closing an idle RESP connection");
                        self.close(slot);
                    }
                }
            }
        }
    }

    /// Acts on what serving `slot` left to do. Started operations are looked at once the iteration's ready
    /// connections are served; until they are answered the connection's input waits.
    fn settle(&mut self, slot: usize, step: Step) {
        match step {
            Step::Started => {
                if let Some(Some(conn)) = self.slots.get_mut(slot)
                    && !conn.running
                {
                    conn.running = true;
                    self.running += 1;
                    self.started.push(slot);
                }
            }
            Step::Wait => {}
            Step::Blocked => {
                if let Some(Some(conn)) = self.slots.get_mut(slot)
                    && conn.reregister(self.poll.registry(), slot, true).is_err()
                {
                    self.close(slot);
                }
            }
            Step::Close => self.close(slot),
        }
    }

    /// Completes `slot`'s running operations if they are done, writes their replies and serves the input that
    /// arrived meanwhile. Does nothing for a connection with none running (one both started and rung about is
    /// looked at twice).
    fn look(&mut self, slot: usize) {
        let Some(Some(conn)) = self.slots.get_mut(slot) else {
            return;
        };
        if !conn.running || !conn.session.ops_done() {
            return;
        }
        conn.running = false;
        self.running -= 1;
        let step = match conn.reply(&self.shared) {
            Step::Wait if conn.unread => {
                conn.unread = false;
                conn.serve_input(&self.shared)
            }
            step => step,
        };
        self.settle(slot, step);
    }

    /// Takes the connections the accept thread handed over.
    fn adopt(&mut self) {
        while let Ok((stream, guard)) = self.incoming.try_recv() {
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let local = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let slot = self.free.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            let wake = Wake::new(self.mailbox.clone(), slot);
            let session =
                Session::new(self.backend.connect(wake), self.shared.clone(), peer, local);
            // A handle on the socket, which `CLIENT KILL` and `cut_all_connections` shut down.
            if let Ok(c) = stream.try_clone() {
                self.shared.clients.attach(session.id(), c);
            }
            let mut stream = mio::net::TcpStream::from_std(stream);
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut stream, Token(slot), Interest::READABLE)
            {
                warn!(error = %e, "cannot watch a RESP connection; closing it");
                self.free.push(slot);
                continue;
            }
            self.slots[slot] = Some(Conn {
                stream,
                session,
                parser: RequestParser::new(self.shared.config.limits.clone()),
                input: Input::new(),
                out: Vec::with_capacity(16 << 10),
                written: 0,
                closing: false,
                hup: false,
                running: false,
                unread: false,
                _guard: guard,
            });
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut conn) = self.slots.get_mut(slot).and_then(Option::take) {
            if conn.running {
                self.running -= 1;
            }
            let _ = self.poll.registry().deregister(&mut conn.stream);
            let _ = conn.stream.shutdown(Shutdown::Both);
            self.free.push(slot);
        }
    }
}

/// One client connection of an event loop.
struct Conn<C: BackendConn> {
    stream: mio::net::TcpStream,
    session: Session<C>,
    parser: RequestParser,
    input: Input,
    /// Replies not written yet: `out[written..]`.
    out: Vec<u8>,
    written: usize,
    /// Closes once `out` is written (the client quit, sent malformed input, or hung up).
    closing: bool,
    /// The peer closed its side: reading goes on to the end of its input, never trusting a short read to have
    /// emptied the socket.
    hup: bool,
    /// Its started key operations have not completed.
    running: bool,
    /// Input arrived while operations ran; it is read once they are answered.
    unread: bool,
    _guard: Connected,
}

impl<C: BackendConn> Conn<C> {
    /// Reads what arrived and handles every complete request; the key operations of the last ones are started,
    /// not waited for. Stops early, leaving the rest unread, when the socket does not take the replies of a full
    /// pipeline ([`ServerConfig::max_pipeline`]).
    fn serve_input(&mut self, shared: &Shared) -> Step {
        let hup = self.hup;
        let max_pipeline = shared.config.max_pipeline;
        let mut batch = 0;
        let mut drained = false;
        loop {
            // What is buffered first, then more from the socket.
            loop {
                let (used, parsed) = self
                    .parser
                    .parse(self.input.pending(), self.session.authenticated());
                self.input.consume(used);
                match parsed {
                    Ok(Some(args)) => {
                        match self.session.handle(args, &mut self.out) {
                            Flow::Close => {
                                self.closing = true;
                                return self.started();
                            }
                            // What is buffered is handled once the batch so far completed.
                            Flow::Pause => {
                                self.unread = true;
                                return self.started();
                            }
                            Flow::Continue => {}
                        }
                        batch += 1;
                        if batch >= max_pipeline {
                            batch = 0;
                            self.session.flush(&mut self.out);
                            match self.write_out(shared) {
                                Ok(true) => {}
                                // The rest waits until the socket takes these replies.
                                Ok(false) => return Step::Blocked,
                                Err(()) => return Step::Close,
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        debug!(error = %e, "protocol error; closing the connection");
                        self.session.protocol_error(&e, &mut self.out);
                        self.closing = true;
                        return self.started();
                    }
                }
            }
            if drained {
                return self.started();
            }
            let room = self.input.room();
            let asked = room.len();
            match self.stream.read(room) {
                Ok(0) => {
                    self.closing = true;
                    return self.started();
                }
                Ok(n) => {
                    self.input.filled(n);
                    shared
                        .counters
                        .net_input_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    // A short read emptied the socket (what arrives later raises a new event): parse what it
                    // brought, and stop there, saving the read that would find nothing.
                    drained = n < asked && !hup;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return self.started(),
                Err(_) => return Step::Close,
            }
        }
    }

    /// Starts the key operations handled so far, if any.
    fn started(&mut self) -> Step {
        self.session.start_ops();
        Step::Started
    }

    /// Completes the started operations and writes every reply.
    fn reply(&mut self, shared: &Shared) -> Step {
        self.session.flush(&mut self.out);
        match self.write_out(shared) {
            Ok(true) if self.closing => Step::Close,
            Ok(true) => {
                self.input.shrink();
                if self.out.capacity() > KEEP_BUFFER {
                    self.out = Vec::with_capacity(16 << 10);
                }
                Step::Wait
            }
            // The socket is full: wait until it takes more.
            Ok(false) => Step::Blocked,
            Err(()) => Step::Close,
        }
    }

    /// Writes what `out` holds; true when all of it went, false when the socket is full, `Err` when the connection
    /// is gone.
    fn write_out(&mut self, shared: &Shared) -> Result<bool, ()> {
        while self.written < self.out.len() {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    self.written += n;
                    shared
                        .counters
                        .net_output_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(_) => return Err(()),
            }
        }
        self.out.clear();
        self.written = 0;
        Ok(true)
    }

    /// Watches for room to write (`true`) or for input only.
    fn reregister(
        &mut self,
        registry: &mio::Registry,
        slot: usize,
        writable: bool,
    ) -> std::io::Result<()> {
        let interest = if writable {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        registry.reregister(&mut self.stream, Token(slot), interest)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_event_loops_follow_the_cores() {
        assert_eq!(auto_event_loops(1), 1);
        assert_eq!(auto_event_loops(2), 1);
        assert_eq!(auto_event_loops(7), 1);
        assert_eq!(auto_event_loops(8), 2);
        assert_eq!(auto_event_loops(16), 4);
        assert_eq!(auto_event_loops(1024), MAX_AUTO_EVENT_LOOPS);
        let explicit = ServerConfig {
            io_threads: 3,
            ..ServerConfig::default()
        };
        assert_eq!(explicit.event_loops(), 3);
        let automatic = ServerConfig::default();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(automatic.event_loops(), auto_event_loops(cores));
    }
}
