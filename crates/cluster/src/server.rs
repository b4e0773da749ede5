//! A KV node's (or routing node's) native-protocol server: a few event-loop threads, each serving many
//! connections (epoll through `mio`). A loop reads what arrived on every ready connection, decodes every complete
//! frame and queues its data requests at the workers, tagged with their request id; the workers post their
//! replies to the loop's mailbox, which wakes the loop only when it is waiting, and the loop writes each
//! connection's replies with one system call. No thread per connection, and no thread between a worker and the
//! socket: a request costs one hand-off to its worker and one back. Requests that may wait on something (the
//! statistics of every worker, an ownership install, the memory node) go to a few control threads, so a slow
//! one never holds up the loop's other connections.

use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use dinomo_kn::{Command, DataOp, KnError, Reply, ReplySink};
use dinomo_ring::NodeId;
use dinomo_sync::{Inbox, Mailbox};
use mio::{Events, Interest, Poll, Token};
use tracing::{debug, warn};

use crate::node::NodeShared;
use crate::wire::{
    ErrorKind, FrameError, PROTOCOL_VERSION, Request, RequestBody, Response, ResponseBody,
    append_frame, write_frame,
};

/// Largest first frame of a connection: a `Hello` carries a version and a token, nothing more.
const MAX_HELLO_FRAME: u32 = 64 << 10;
/// Default of [`ServerLimits::io_threads`].
pub const DEFAULT_IO_THREADS: usize = 2;
/// Default of [`ServerLimits::control_threads`].
pub const DEFAULT_CONTROL_THREADS: usize = 2;
/// The most event-loop or control threads a server starts.
pub const MAX_SERVER_THREADS: usize = 1024;
/// Readiness events taken from the kernel per wait.
const EVENTS_PER_POLL: usize = 1024;
/// The token of a loop's waker (connections are numbered from 0).
const WAKER: Token = Token(usize::MAX);
/// Bytes asked for per read, and the room a connection's input buffer starts with.
const READ_CHUNK: usize = 16 << 10;
/// A connection whose unwritten replies exceed this is not read until the socket takes them (a client that sends
/// without reading cannot make the server hold its replies without bound).
const OUT_HIGH_WATER: usize = 4 << 20;
/// Buffers that grew beyond this for one large frame are given back afterwards.
const KEEP_BUFFER: usize = 1 << 20;
/// Replies taken from the mailbox per loop iteration, so that input is read between long runs of replies.
const REPLIES_PER_ROUND: usize = 4096;

/// Limits and threads of a server.
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
    /// Event-loop threads serving the connections (each connection stays on one). Default
    /// [`DEFAULT_IO_THREADS`], at most [`MAX_SERVER_THREADS`].
    pub io_threads: usize,
    /// Threads answering the requests that may wait (statistics, ownership installs, the memory node's
    /// statistics), away from the event loops. Default [`DEFAULT_CONTROL_THREADS`], at most
    /// [`MAX_SERVER_THREADS`].
    pub control_threads: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_frame: crate::wire::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(5),
            io_threads: DEFAULT_IO_THREADS,
            control_threads: DEFAULT_CONTROL_THREADS,
        }
    }
}

/// Something a server can answer requests for.
pub(crate) trait Service: Send + Sync + 'static {
    /// Answers a request that is not queued at a worker (on a control thread, or on the event loop for the
    /// requests [`answered_on_the_loop`] names, which must not wait).
    fn answer(&self, body: RequestBody) -> ResponseBody;
    /// Queues a data operation; its reply goes to `sink` tagged with `id`. Returns the immediate answer when it
    /// cannot be queued. Runs on the event loop: it may wait only for room in a worker's queue.
    fn submit(&self, id: u64, op: DataOp, sink: Arc<dyn ReplySink>) -> Option<ResponseBody>;
    /// Who answers, for the handshake's welcome: the KV node (`None` for a routing node) and the pool of its
    /// cluster's memory node (0 while not known).
    fn identity(&self) -> (Option<NodeId>, u64);
}

/// Requests every service answers at once, without waiting on anything: the event loop answers them itself.
fn answered_on_the_loop(body: &RequestBody) -> bool {
    matches!(body, RequestBody::Ping | RequestBody::Routing)
}

/// A listening server; dropping it stops accepting and closes every connection.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    loops: Vec<(Replies, Option<JoinHandle<()>>)>,
}

/// An event loop's mailbox, where its connections' replies are posted.
type Replies = Arc<Mailbox<Delivery>>;

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
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if token.is_empty() && !listen.ip().is_loopback() {
            return Err(invalid(format!(
                "refusing to serve the native protocol on non-loopback address {listen} without a cluster \
                 token (set fabric.token or DINOMO_CLUSTER_TOKEN)"
            )));
        }
        for (what, n) in [
            ("io_threads", limits.io_threads),
            ("control_threads", limits.control_threads),
        ] {
            if !(1..=MAX_SERVER_THREADS).contains(&n) {
                return Err(invalid(format!(
                    "the native server's {what} must be 1 to {MAX_SERVER_THREADS}, not {n}"
                )));
            }
        }
        let token: Arc<str> = token.into();
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (control_tx, control_rx) = unbounded::<ControlJob>();
        for n in 0..limits.control_threads {
            let (service, jobs) = (service.clone(), control_rx.clone());
            std::thread::Builder::new()
                .name(format!("dinomo-conn-ctl{n}"))
                // Ends when the loops, which hold the senders, are gone.
                .spawn(move || {
                    for job in jobs {
                        let body = service.answer(job.body);
                        job.sink.post(job.id, Outcome::Answer(body));
                    }
                })?;
        }
        let mut loops = Vec::with_capacity(limits.io_threads);
        let mut handoffs = Vec::with_capacity(limits.io_threads);
        for n in 0..limits.io_threads {
            let poll = Poll::new()?;
            let (mailbox, inbox) = Mailbox::new(&poll, WAKER)?;
            let (incoming_tx, incoming) = unbounded();
            let event_loop = EventLoop {
                poll,
                incoming,
                mailbox: mailbox.clone(),
                inbox,
                ctx: Context {
                    service: service.clone(),
                    control: control_tx.clone(),
                    limits: limits.clone(),
                    token: token.clone(),
                },
                stop: stop.clone(),
                slots: Vec::new(),
                free: Vec::new(),
                ungreeted: 0,
                touched: Vec::new(),
                settling: Vec::new(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("dinomo-conn-io{n}"))
                .spawn(move || event_loop.run())?;
            handoffs.push((incoming_tx, mailbox.clone()));
            loops.push((mailbox, Some(thread)));
        }
        drop(control_tx);
        let live = Arc::new(AtomicUsize::new(0));
        let accept = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || accept_loop(listener, &stop, &live, &limits, &handoffs))?
        };
        Ok(Server {
            addr,
            stop,
            accept: Some(accept),
            loops,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
        // Each loop wakes, sees the stop flag and ends, closing its connections.
        for (mailbox, thread) in &mut self.loops {
            let _ = mailbox.wake();
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A new connection for an event loop, with its place in the count of live ones.
type Handoff = (Sender<(TcpStream, LiveSlot)>, Replies);

fn accept_loop(
    listener: TcpListener,
    stop: &AtomicBool,
    live: &Arc<AtomicUsize>,
    limits: &ServerLimits,
    loops: &[Handoff],
) {
    let mut next = 0usize;
    accept_until_stopped(&listener, stop, "native", |stream| {
        if live.load(Ordering::Acquire) >= limits.max_connections {
            debug!("connection limit reached; turning a new connection away");
            turn_away(stream, limits.max_connections);
            return;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            debug!(error = %e, "cannot make a connection non-blocking; closing it");
            return;
        }
        let _ = stream.set_nodelay(true);
        live.fetch_add(1, Ordering::AcqRel);
        let slot = LiveSlot(live.clone());
        // Round robin: every loop gets its share of the connections.
        let (tx, mailbox) = &loops[next % loops.len()];
        next = next.wrapping_add(1);
        if tx.send((stream, slot)).is_err() || mailbox.wake().is_err() {
            warn!("an event loop of the native server is gone; connection dropped");
        }
    });
}

/// Hands each connection `listener` accepts to `serve` until `stop` is set (whoever sets it then connects once,
/// to wake the accept). `what` names the server in logs.
pub(crate) fn accept_until_stopped(
    listener: &TcpListener,
    stop: &AtomicBool,
    what: &str,
    mut serve: impl FnMut(TcpStream),
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match stream {
            Ok(s) => serve(s),
            Err(e) => {
                debug!(error = %e, server = what, "accept failed");
                // Out of descriptors, typically: give connections a moment to close.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// A served connection's place in the count of live ones, given back however it ends.
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

/// What comes back to an event loop for a request of one of its connections.
enum Outcome {
    /// A worker's reply to a data request.
    Worker(Result<Reply, KnError>),
    /// A control thread's answer.
    Answer(ResponseBody),
}

/// A reply on its way to connection `conn` (slot and generation, see [`conn_key`]) of an event loop.
struct Delivery {
    conn: u64,
    id: u64,
    outcome: Outcome,
}

/// Where the replies of one connection's requests go. The workers and control threads hold a clone for every
/// request they have not answered, and answer every request they take: a node's workers stop only after its
/// server is gone (`ClusterNode::shutdown`), and control threads only once the loops are.
struct ConnSink {
    conn: u64,
    mailbox: Replies,
}

impl ConnSink {
    fn post(&self, id: u64, outcome: Outcome) -> bool {
        self.mailbox.post(Delivery {
            conn: self.conn,
            id,
            outcome,
        })
    }
}

impl ReplySink for ConnSink {
    fn deliver(&self, tag: u64, reply: Result<Reply, KnError>) -> bool {
        self.post(tag, Outcome::Worker(reply))
    }
}

/// A request for a control thread.
struct ControlJob {
    sink: Arc<ConnSink>,
    id: u64,
    body: RequestBody,
}

/// A connection's key: its slot in the loop (low 32 bits) and the slot's generation (high 32 bits), so that a
/// late reply for a closed connection is never written to the next one in its slot.
fn conn_key(slot: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | slot as u64
}

/// One event-loop thread and the connections it serves, numbered by their slot.
struct EventLoop {
    poll: Poll,
    incoming: Receiver<(TcpStream, LiveSlot)>,
    /// Workers and control threads post replies here.
    mailbox: Replies,
    inbox: Inbox<Delivery>,
    ctx: Context,
    stop: Arc<AtomicBool>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Connections that have not completed their handshake, whose timeout the loop must watch.
    ungreeted: usize,
    /// Connections with output to write or a close to consider, this iteration.
    touched: Vec<usize>,
    /// The ones being settled (a buffer kept between iterations).
    settling: Vec<usize>,
}

/// What an event loop serves its connections' requests with.
struct Context {
    service: Arc<dyn Service>,
    control: Sender<ControlJob>,
    limits: ServerLimits,
    token: Arc<str>,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

/// One client connection of an event loop.
struct Conn {
    stream: mio::net::TcpStream,
    sink: Arc<ConnSink>,
    /// Received bytes not decoded yet: `input[start..end]`.
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Replies not written yet: `out[written..]`.
    out: Vec<u8>,
    written: usize,
    /// No `Hello` yet: the handshake timeout runs from `accepted`.
    awaiting_hello: bool,
    accepted: Instant,
    /// The peer sent its last byte (or the server stopped reading after a bad frame): the connection closes once
    /// every request in flight is answered and written.
    done_reading: bool,
    /// Requests queued at a worker or a control thread whose reply the loop has not taken yet.
    in_flight: usize,
    /// Input waits because the replies held back reached [`OUT_HIGH_WATER`].
    read_paused: bool,
    /// The connection is unusable: close it now.
    broken: bool,
    _live: LiveSlot,
}

impl EventLoop {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        // Connections that have not said Hello are looked at a few times per handshake timeout.
        let sweep_every = (self.ctx.limits.handshake_timeout / 4)
            .clamp(Duration::from_millis(1), Duration::from_millis(250));
        let mut last_sweep = Instant::now();
        loop {
            // Wait only with nothing left to settle (and no reply waiting, see `Inbox::poll`).
            let timeout = (self.ungreeted > 0).then_some(sweep_every);
            let polled = self.inbox.poll(
                &mut self.poll,
                &mut events,
                self.touched.is_empty(),
                timeout,
            );
            if let Err(e) = polled {
                if e.kind() == IoErrorKind::Interrupted {
                    continue;
                }
                warn!(error = %e, "native event loop failed; closing its connections");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            for event in events.iter() {
                if event.token() == WAKER {
                    self.adopt();
                    continue;
                }
                let slot = event.token().0;
                if self.slots.get(slot).is_none_or(|s| s.conn.is_none()) {
                    continue;
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    self.serve_input(slot, event.is_read_closed() || event.is_error());
                }
                self.touched.push(slot);
            }
            self.take_replies();
            self.settle_touched();
            if self.ungreeted > 0 && last_sweep.elapsed() >= sweep_every {
                last_sweep = Instant::now();
                self.close_silent_handshakes();
            }
        }
    }

    /// Appends up to [`REPLIES_PER_ROUND`] posted replies to their connections' output.
    fn take_replies(&mut self) {
        for delivery in self.inbox.take().take(REPLIES_PER_ROUND) {
            let slot = (delivery.conn & u64::from(u32::MAX)) as usize;
            let Some(s) = self.slots.get_mut(slot) else {
                continue;
            };
            if conn_key(slot, s.generation) != delivery.conn {
                continue;
            }
            let Some(conn) = s.conn.as_mut() else {
                continue;
            };
            conn.in_flight -= 1;
            let body = match delivery.outcome {
                Outcome::Worker(r) => reply_body(r),
                Outcome::Answer(body) => body,
            };
            conn.push(&Response {
                id: delivery.id,
                body,
            });
            self.touched.push(slot);
        }
    }

    /// Writes the output of every touched connection and closes those that are done. Settling may read paused
    /// input and so touch connections again: their new replies are written in a second pass, and anything after
    /// that waits for the next iteration.
    fn settle_touched(&mut self) {
        for _ in 0..2 {
            let mut settling = std::mem::take(&mut self.settling);
            std::mem::swap(&mut settling, &mut self.touched);
            settling.sort_unstable();
            settling.dedup();
            for slot in settling.drain(..) {
                self.settle(slot);
            }
            self.settling = settling;
        }
    }

    /// Writes what `slot` has to write; reads input that waited for the output to drain.
    fn settle(&mut self, slot: usize) {
        let Some(conn) = self.slots.get_mut(slot).and_then(|s| s.conn.as_mut()) else {
            return;
        };
        if !conn.broken && conn.write_out().is_err() {
            conn.broken = true;
        }
        if conn.broken {
            self.close(slot);
            return;
        }
        if conn.written < conn.out.len() {
            // The socket is full: its writable event brings the connection back.
            return;
        }
        conn.shrink();
        if conn.read_paused {
            conn.read_paused = false;
            self.serve_input(slot, false);
            self.touched.push(slot);
        } else if conn.done_reading && conn.in_flight == 0 {
            self.close(slot);
        }
    }

    /// Closes the connections that did not complete their handshake in time.
    fn close_silent_handshakes(&mut self) {
        let now = Instant::now();
        let timeout = self.ctx.limits.handshake_timeout;
        for slot in 0..self.slots.len() {
            if let Some(conn) = &self.slots[slot].conn
                && conn.awaiting_hello
                && now.duration_since(conn.accepted) >= timeout
            {
                debug!("closing a native connection that sent no handshake in time");
                self.close(slot);
            }
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        if let Some(mut conn) = s.conn.take() {
            conn.hello_wait_over(&mut self.ungreeted);
            let _ = self.poll.registry().deregister(&mut conn.stream);
            let _ = conn.stream.shutdown(Shutdown::Both);
            s.generation = s.generation.wrapping_add(1);
            self.free.push(slot);
        }
    }

    /// Takes the connections the accept thread handed over.
    fn adopt(&mut self) {
        while let Ok((stream, live)) = self.incoming.try_recv() {
            let slot = self.free.pop().unwrap_or_else(|| {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            });
            let key = conn_key(slot, self.slots[slot].generation);
            let mut stream = mio::net::TcpStream::from_std(stream);
            // Edge-triggered: readable when input arrives, writable when a full socket takes more again.
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(slot),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                warn!(error = %e, "cannot watch a native connection; closing it");
                self.free.push(slot);
                continue;
            }
            self.slots[slot].conn = Some(Conn {
                stream,
                sink: Arc::new(ConnSink {
                    conn: key,
                    mailbox: self.mailbox.clone(),
                }),
                input: vec![0; READ_CHUNK],
                start: 0,
                end: 0,
                out: Vec::new(),
                written: 0,
                awaiting_hello: true,
                accepted: Instant::now(),
                done_reading: false,
                in_flight: 0,
                read_paused: false,
                broken: false,
                _live: live,
            });
            self.ungreeted += 1;
        }
    }

    /// Reads what arrived on `slot` and handles every complete frame. `hup`: the peer closed its side, so reading
    /// goes on to the end of its input.
    fn serve_input(&mut self, slot: usize, hup: bool) {
        let Some(conn) = self.slots.get_mut(slot).and_then(|s| s.conn.as_mut()) else {
            return;
        };
        loop {
            self.ctx.handle_frames(conn, &mut self.ungreeted);
            if conn.done_reading || conn.broken {
                return;
            }
            if conn.out.len() - conn.written >= OUT_HIGH_WATER {
                conn.read_paused = true;
                return;
            }
            match conn.read_more() {
                Ok((0, _)) => {
                    conn.done_reading = true;
                    return;
                }
                Ok((n, asked)) => {
                    // A short read emptied the socket (what arrives later raises a new event): handle what it
                    // brought and stop there, saving the read that would find nothing.
                    if n < asked && !hup {
                        self.ctx.handle_frames(conn, &mut self.ungreeted);
                        return;
                    }
                }
                Err(e) if e.kind() == IoErrorKind::Interrupted => {}
                Err(e) if e.kind() == IoErrorKind::WouldBlock => return,
                Err(_) => {
                    conn.broken = true;
                    return;
                }
            }
        }
    }
}

impl Context {
    /// Handles every complete frame `conn` holds: its handshake first, then requests.
    fn handle_frames(&self, conn: &mut Conn, ungreeted: &mut usize) {
        while !conn.done_reading && !conn.broken {
            let max = if conn.awaiting_hello {
                MAX_HELLO_FRAME
            } else {
                self.limits.max_frame
            };
            match conn.next_frame(max) {
                Ok(None) => return,
                Ok(Some(req)) if !conn.awaiting_hello => self.handle(conn, req),
                Ok(Some(req)) => {
                    conn.hello_wait_over(ungreeted);
                    if !self.handshake(conn, req) {
                        conn.done_reading = true;
                    }
                }
                Err(e) => {
                    // The stream cannot be resynchronised after a bad frame: answer and close.
                    let body = if conn.awaiting_hello {
                        conn.hello_wait_over(ungreeted);
                        refusal(conn, format!("no handshake: {e}"))
                    } else {
                        ResponseBody::Error {
                            kind: ErrorKind::Invalid,
                            message: e.to_string(),
                        }
                    };
                    conn.push(&Response { id: u64::MAX, body });
                    conn.done_reading = true;
                }
            }
        }
    }

    /// Answers a connection's first frame, which must be a `Hello` of this protocol version with the cluster
    /// token. False when the connection must close (the refusal is queued).
    fn handshake(&self, conn: &mut Conn, req: Request) -> bool {
        let (id, message) = match req {
            Request {
                id,
                body:
                    RequestBody::Hello {
                        version,
                        token: presented,
                    },
            } => {
                if version != PROTOCOL_VERSION {
                    (
                        id,
                        format!(
                            "native protocol version {version} is not spoken here (this node speaks \
                             {PROTOCOL_VERSION})"
                        ),
                    )
                } else if !dinomo_fabric::token_matches(presented.0.as_bytes(), self.token.as_bytes())
                {
                    (id, "wrong cluster token".to_string())
                } else {
                    let (node, pool) = self.service.identity();
                    conn.push(&Response {
                        id,
                        body: ResponseBody::Welcome {
                            version: PROTOCOL_VERSION,
                            node,
                            pool,
                        },
                    });
                    return true;
                }
            }
            Request { id, .. } => (
                id,
                "the first request on a connection must be Hello, with the protocol version and the cluster token"
                    .to_string(),
            ),
        };
        let body = refusal(conn, message);
        conn.push(&Response { id, body });
        false
    }

    /// Serves one request of a greeted connection.
    fn handle(&self, conn: &mut Conn, req: Request) {
        let Request { id, body } = req;
        let immediate = match body {
            RequestBody::Data(op) => {
                let refused = self.service.submit(id, op, conn.sink.clone());
                if refused.is_none() {
                    conn.in_flight += 1;
                }
                refused
            }
            RequestBody::Hello { .. } => Some(ResponseBody::Error {
                kind: ErrorKind::Invalid,
                message: "this connection's handshake is done already".into(),
            }),
            body if answered_on_the_loop(&body) => Some(self.service.answer(body)),
            body => {
                let job = ControlJob {
                    sink: conn.sink.clone(),
                    id,
                    body,
                };
                match self.control.send(job) {
                    Ok(()) => {
                        conn.in_flight += 1;
                        None
                    }
                    Err(_) => Some(ResponseBody::Error {
                        kind: ErrorKind::Unavailable,
                        message: "the server is stopping".into(),
                    }),
                }
            }
        };
        if let Some(body) = immediate {
            conn.push(&Response { id, body });
        }
    }
}

/// A refused handshake's answer, logged.
fn refusal(conn: &Conn, message: String) -> ResponseBody {
    warn!(peer = ?conn.stream.peer_addr().ok(), reason = %message, "refused a native-protocol connection");
    ResponseBody::Error {
        kind: ErrorKind::Refused,
        message,
    }
}

impl Conn {
    /// Ends the wait for this connection's `Hello` (answered, refused or closed), once: `ungreeted` counts the
    /// loop's connections still waiting.
    fn hello_wait_over(&mut self, ungreeted: &mut usize) {
        if std::mem::take(&mut self.awaiting_hello) {
            *ungreeted -= 1;
        }
    }

    /// The next complete frame of at most `max` bytes, if one has arrived.
    fn next_frame(&mut self, max: u32) -> Result<Option<Request>, FrameError> {
        let pending = &self.input[self.start..self.end];
        let Some(prefix) = pending.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*prefix);
        if len > max {
            return Err(FrameError::TooLarge { len, max });
        }
        let total = 4 + len as usize;
        if pending.len() < total {
            return Ok(None);
        }
        let decoded = postcard::from_bytes(&pending[4..total])
            .map_err(|e| FrameError::Malformed(e.to_string()));
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        decoded.map(Some)
    }

    /// Reads what the socket holds into the input buffer: the bytes read and the room they were read into.
    fn read_more(&mut self) -> std::io::Result<(usize, usize)> {
        self.reserve_room();
        let room = &mut self.input[self.end..];
        let asked = room.len();
        let n = self.stream.read(room)?;
        self.end += n;
        Ok((n, asked))
    }

    /// Room for the next read: at least [`READ_CHUNK`] bytes, more for a large frame, but never more than what has
    /// arrived of it again (a peer that sends only a length must not make the connection hold the length).
    fn reserve_room(&mut self) {
        let pending = self.end - self.start;
        let want = READ_CHUNK.max(pending);
        if self.input.len() - self.end < want {
            if self.start > 0 {
                self.input.copy_within(self.start..self.end, 0);
                self.end = pending;
                self.start = 0;
            }
            if self.input.len() - self.end < want {
                self.input.resize(self.end + want, 0);
            }
        }
    }

    /// Queues `response` for writing.
    fn push(&mut self, response: &Response) {
        if append_frame(&mut self.out, response).is_err() {
            self.broken = true;
        }
    }

    /// Writes what `out` holds until the socket is full; `Err` when the connection is gone.
    fn write_out(&mut self) -> Result<(), ()> {
        while self.written < self.out.len() {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => return Err(()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == IoErrorKind::Interrupted => {}
                Err(e) if e.kind() == IoErrorKind::WouldBlock => return Ok(()),
                Err(_) => return Err(()),
            }
        }
        self.out.clear();
        self.written = 0;
        Ok(())
    }

    /// Gives back memory that grew for one large frame.
    fn shrink(&mut self) {
        if self.start == self.end && self.input.len() > KEEP_BUFFER {
            self.input = vec![0; READ_CHUNK];
            self.start = 0;
            self.end = 0;
        }
        if self.out.is_empty() && self.out.capacity() > KEEP_BUFFER {
            self.out = Vec::new();
        }
    }
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
        | KnError::NotAFloat
        | KnError::NotFinite
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
                Err(crate::node::InstallError::Kn(e)) => error_body(e),
                // Asking again cannot help: the M-node that sent it no longer decides.
                Err(e) => ResponseBody::Error {
                    kind: ErrorKind::Invalid,
                    message: e.to_string(),
                },
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
            RequestBody::ScanKeys { cursor, count } => match self.scan_keys(cursor, count) {
                Ok(page) => ResponseBody::Keys {
                    cursor: page.cursor,
                    keys: page
                        .keys
                        .into_iter()
                        .map(serde_bytes::ByteBuf::from)
                        .collect(),
                },
                Err(message) => ResponseBody::Error {
                    kind: ErrorKind::Unavailable,
                    message: format!("the memory node did not list the keys: {message}"),
                },
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

    fn submit(&self, id: u64, op: DataOp, sink: Arc<dyn ReplySink>) -> Option<ResponseBody> {
        match self.submitter.submit_to(Command::Data(op), id, sink) {
            Ok(()) => None,
            Err(e) => Some(error_body(e)),
        }
    }

    fn identity(&self) -> (Option<NodeId>, u64) {
        (Some(self.id), self.pool_id)
    }
}
