//! The native client with many requests in flight: requests go to their keys' owners as soon as they are
//! submitted, replies are matched to them by id in whatever order they come, and a refusal or a lost connection is
//! handled per request exactly as [`Client`] handles it for one.
//!
//! One thread drives a [`PipelinedClient`]: [`PipelinedClient::submit`] queues a request (frames bound for one
//! node share a system call when they are flushed), [`PipelinedClient::next_completion`] flushes, then waits on
//! every connection at once (`poll`) until some request completes.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{Client, ClientConfig, ClientError, SessionError, final_error, peer_closed};
use crate::wire::{RequestBody, RequestRef, Response, ResponseBody, write_frame};
use dinomo_kn::DataOp;

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The tag it was submitted with.
    pub tag: u64,
    /// The reply, or why there is none (the same outcomes as [`Client::request`]).
    pub result: Result<ResponseBody, ClientError>,
}

/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 << 10;

/// One connection with requests in flight.
struct PipeConn {
    stream: TcpStream,
    /// Received bytes not yet decoded; `rpos` marks where the undecoded part starts.
    rbuf: Vec<u8>,
    rpos: usize,
    /// Encoded frames not yet written: all of them until a flush, then what the socket had no room for.
    wbuf: Vec<u8>,
    /// Since when the node has taken none of the bytes left in `wbuf` (a frozen node's socket buffer fills); a
    /// connection stalled for the request deadline is dropped.
    stalled_since: Option<Instant>,
    /// Requests in flight on this connection.
    in_flight: usize,
}

/// A request sent and not answered yet.
struct InFlight {
    tag: u64,
    body: RequestBody,
    addr: String,
    deadline: Instant,
    /// The pause before the next retry, doubled on each.
    pause: Duration,
}

/// A request waiting to be (re)sent.
struct Pending {
    at: Instant,
    tag: u64,
    body: RequestBody,
    deadline: Instant,
    pause: Duration,
    /// Why it is not done yet; the error it gets at its deadline. Borrowed for the common case of a new request,
    /// so submitting allocates no text.
    last: Cow<'static, str>,
}

/// A client of a cluster that keeps many requests in flight. Not shared between threads.
pub struct PipelinedClient {
    client: Client,
    /// By owner address, shared (not copied) with every wait set that names the connection.
    conns: HashMap<Arc<str>, PipeConn>,
    in_flight: HashMap<u64, InFlight>,
    pending: Vec<Pending>,
    done: VecDeque<Completion>,
    next_id: u64,
    scratch: Vec<u8>,
    /// Where a socket read lands before it is appended to its connection's buffer.
    chunk: Vec<u8>,
}

impl PipelinedClient {
    /// Fetches the routing table from the seeds (like [`Client::connect`]).
    pub fn connect(cfg: ClientConfig) -> Result<PipelinedClient, ClientError> {
        Ok(PipelinedClient::from_client(Client::connect(cfg)?))
    }

    /// Pipelines on top of `client`, which keeps the routing table (and its own connections for one-at-a-time
    /// calls, such as [`Client::node_stats`]).
    pub fn from_client(client: Client) -> PipelinedClient {
        PipelinedClient {
            client,
            conns: HashMap::new(),
            in_flight: HashMap::new(),
            pending: Vec::new(),
            done: VecDeque::new(),
            next_id: 1,
            scratch: Vec::new(),
            chunk: vec![0; READ_CHUNK],
        }
    }

    /// One step of a walk over every key of the cluster, as [`Client::scan`], with the owners asked about every
    /// named key at once (pipelined). Needs a client with no request outstanding.
    pub fn scan(&mut self, cursor: u64, count: u32) -> Result<(u64, Vec<Vec<u8>>), ClientError> {
        let (cursor, named) = self.client.scan_step(cursor, count)?;
        Ok((cursor, self.present(named)?))
    }

    /// Every key that matches `pattern`, sorted, as [`Client::keys`], each step's keys asked about at once.
    /// Needs a client with no request outstanding.
    pub fn keys(&mut self, pattern: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        crate::client::walk_keys(
            self,
            pattern,
            |p, cursor, count| p.client.scan_step(cursor, count),
            PipelinedClient::present,
        )
    }

    /// The keys of `named` that have a value, asked of their owners all at once. Every request is waited for,
    /// even after one failed, so that none is left outstanding.
    fn present(&mut self, named: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, ClientError> {
        if self.outstanding() > 0 {
            return Err(ClientError::Invalid(
                "listing keys needs a pipelined client with no request outstanding".into(),
            ));
        }
        for (i, key) in named.iter().enumerate() {
            self.submit(i as u64, RequestBody::Data(DataOp::Exists(key.clone())))?;
        }
        let mut there = vec![false; named.len()];
        let mut failure = None;
        while let Some(c) = self.next_completion() {
            match c.result {
                Ok(ResponseBody::Applied(a)) => {
                    if let Some(slot) = there.get_mut(c.tag as usize) {
                        *slot = a;
                    }
                }
                Ok(other) => failure = failure.or(Some(crate::client::unexpected(other))),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(named
            .into_iter()
            .zip(there)
            .filter_map(|(key, present)| present.then_some(key))
            .collect())
    }

    /// The one-at-a-time client underneath (routing table, statistics).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Requests submitted whose completion has not been returned yet.
    pub fn outstanding(&self) -> usize {
        self.in_flight.len() + self.pending.len() + self.done.len()
    }

    /// Queues a data request under `tag` (any number the caller likes; it comes back in the [`Completion`]). It is
    /// written to its owner's connection when the caller next waits. Fails only for a request that is not a data
    /// request.
    pub fn submit(&mut self, tag: u64, body: RequestBody) -> Result<(), ClientError> {
        if body.key().is_none() {
            return Err(ClientError::Invalid("not a data request".into()));
        }
        let now = Instant::now();
        let deadline = now + self.client.config().op_timeout;
        let pause = Duration::from_micros(200).min(self.client.config().max_retry_pause);
        self.send(Pending {
            at: now,
            tag,
            body,
            deadline,
            pause,
            last: Cow::Borrowed("no routing table"),
        });
        Ok(())
    }

    /// The next request to complete, waiting for one if none has; `None` when nothing is outstanding. Every
    /// request completes by its deadline ([`ClientConfig::op_timeout`] after it was submitted).
    pub fn next_completion(&mut self) -> Option<Completion> {
        loop {
            if let Some(c) = self.done.pop_front() {
                return Some(c);
            }
            if self.in_flight.is_empty() && self.pending.is_empty() {
                return None;
            }
            self.flush();
            if !self.done.is_empty() {
                continue;
            }
            self.wait_and_read();
            self.expire();
        }
    }

    /// Sends what was submitted and the retries now due. With [`PipelinedClient::wait_set`],
    /// [`PipelinedClient::read_ready`], [`PipelinedClient::expire`] and [`PipelinedClient::take_completion`], the
    /// steps of [`PipelinedClient::next_completion`] for a caller that waits itself (on more than this client's
    /// sockets, or sending from one thread and waiting on another).
    pub(crate) fn flush(&mut self) {
        self.resend_due();
        self.flush_all();
    }

    /// A request that completed, if one has.
    pub(crate) fn take_completion(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Whether a request submitted now goes out on a connection already open, to whichever owner it goes, so that
    /// submitting it never waits to connect.
    pub(crate) fn connected_to_all(&self) -> bool {
        self.client.routing().is_some_and(|r| {
            r.addrs
                .values()
                .all(|a| self.conns.contains_key(a.as_str()))
        })
    }

    /// Whether a connection has requests in flight but is not among `watched` (the descriptors a waiting thread
    /// polls).
    pub(crate) fn in_flight_beyond(&self, watched: &[std::os::fd::RawFd]) -> bool {
        self.conns
            .values()
            .any(|c| c.in_flight > 0 && !watched.contains(&c.stream.as_raw_fd()))
    }

    /// Whether requests wait to be sent again (their time is kept by whoever waits on the client).
    pub(crate) fn has_retries(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether a flush left bytes a node's socket had no room for: whoever waits on the client must wait for that
    /// socket to take more ([`PipelinedClient::wait_set`] asks for it).
    pub(crate) fn has_unsent(&self) -> bool {
        self.conns.values().any(|c| !c.wbuf.is_empty())
    }

    /// The connections with requests in flight, to wait on for reading, and for writing those with bytes left to
    /// send (`fds`, and their owners' addresses in `addrs`, in the same order), and when the next retry or
    /// deadline is due. After the wait, [`readable`] tells which to [`PipelinedClient::read_ready`]; the next
    /// [`PipelinedClient::flush`] sends to the writable ones.
    pub(crate) fn wait_set(
        &self,
        fds: &mut Vec<libc::pollfd>,
        addrs: &mut Vec<Arc<str>>,
    ) -> Option<Instant> {
        for (addr, conn) in &self.conns {
            if conn.in_flight > 0 || !conn.wbuf.is_empty() {
                addrs.push(addr.clone());
                let events = if conn.wbuf.is_empty() {
                    libc::POLLIN
                } else {
                    libc::POLLIN | libc::POLLOUT
                };
                fds.push(libc::pollfd {
                    fd: conn.stream.as_raw_fd(),
                    events,
                    revents: 0,
                });
            }
        }
        self.pending
            .iter()
            .map(|p| p.at)
            .chain(self.in_flight.values().map(|f| f.deadline))
            .min()
    }

    /// Routes `p` and queues its frame on the owner's connection, or parks it for a retry.
    fn send(&mut self, mut p: Pending) {
        let key = p.body.key().expect("data requests only");
        let Some((node, addr)) = self.client.target(key) else {
            self.client.refresh(0, None);
            self.retry_later(p);
            return;
        };
        // An idle connection the node has closed since (it stopped, or crashed) is replaced before anything is
        // queued on it; one with requests in flight fails them as it would anyway.
        if self
            .conns
            .get(addr.as_str())
            .is_some_and(|c| c.in_flight == 0 && c.wbuf.is_empty() && peer_closed(&c.stream))
        {
            self.conns.remove(addr.as_str());
        }
        if !self.conns.contains_key(addr.as_str()) {
            // Sends and reads never wait: a flush writes what the socket takes (a node that stops reading must not
            // hold up the caller), and a read follows a poll that found the socket readable.
            let opened = self
                .client
                .open_to(&addr, Some(node))
                .and_then(|s| s.set_nonblocking(true).map(|()| s).map_err(Into::into));
            match opened {
                Ok(stream) => {
                    self.conns.insert(
                        Arc::from(addr.as_str()),
                        PipeConn {
                            stream,
                            rbuf: Vec::new(),
                            rpos: 0,
                            wbuf: Vec::new(),
                            stalled_since: None,
                            in_flight: 0,
                        },
                    );
                }
                Err(e @ SessionError::Refused(_)) => {
                    self.done.push_back(Completion {
                        tag: p.tag,
                        result: Err(ClientError::Invalid(format!("{addr} {e}"))),
                    });
                    return;
                }
                Err(e) => {
                    p.last = format!("node {node} at {addr} {e}").into();
                    self.client.refresh(0, None);
                    self.retry_later(p);
                    return;
                }
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let conn = self.conns.get_mut(addr.as_str()).expect("inserted above");
        let before = conn.wbuf.len();
        // Frames are encoded into `scratch`, then appended: write_frame clears the buffer it is given.
        if let Err(e) = write_frame(
            &mut conn.wbuf,
            &RequestRef { id, body: &p.body },
            &mut self.scratch,
        ) {
            conn.wbuf.truncate(before);
            self.done.push_back(Completion {
                tag: p.tag,
                result: Err(ClientError::Invalid(format!(
                    "cannot encode the request: {e}"
                ))),
            });
            return;
        }
        conn.in_flight += 1;
        self.in_flight.insert(
            id,
            InFlight {
                tag: p.tag,
                body: p.body,
                addr,
                deadline: p.deadline,
                pause: p.pause,
            },
        );
    }

    /// Parks `p` until its pause has passed, or completes it as unavailable when that would pass its deadline.
    fn retry_later(&mut self, mut p: Pending) {
        let now = Instant::now();
        if now + p.pause > p.deadline {
            self.done.push_back(Completion {
                tag: p.tag,
                result: Err(ClientError::Unavailable(p.last.into_owned())),
            });
            return;
        }
        p.at = now + p.pause;
        p.pause = (p.pause * 2).min(self.client.config().max_retry_pause);
        self.pending.push(p);
    }

    fn resend_due(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].at <= now {
                let p = self.pending.swap_remove(i);
                self.send(p);
            } else {
                i += 1;
            }
        }
    }

    /// Writes each connection's queued frames as far as its socket takes them now, never waiting: a node that
    /// stops reading (frozen, or starved) must not hold up the caller, who may serve other nodes' answers or other
    /// clients. What is left goes with the next flush, once the socket is writable.
    fn flush_all(&mut self) {
        let mut broken = Vec::new();
        for (addr, conn) in &mut self.conns {
            if conn.wbuf.is_empty() {
                continue;
            }
            match send_now(&conn.stream, &conn.wbuf) {
                Ok(n) if n == conn.wbuf.len() => {
                    conn.wbuf.clear();
                    conn.stalled_since = None;
                }
                Ok(n) => {
                    conn.wbuf.drain(..n);
                    if n > 0 || conn.stalled_since.is_none() {
                        conn.stalled_since = Some(Instant::now());
                    }
                }
                Err(_) => broken.push(addr.clone()),
            }
        }
        for addr in broken {
            self.lose_connection(&addr, "the connection failed while sending");
        }
    }

    /// Waits until a connection with requests in flight is readable (or the next retry or deadline is due), then
    /// reads and decodes whatever arrived.
    fn wait_and_read(&mut self) {
        let mut addrs = Vec::with_capacity(self.conns.len());
        let mut fds = Vec::with_capacity(self.conns.len());
        let next = self.wait_set(&mut fds, &mut addrs);
        let timeout = next.map_or(Duration::from_millis(100), |t| {
            t.saturating_duration_since(Instant::now())
        });
        if fds.is_empty() {
            std::thread::sleep(timeout.min(Duration::from_millis(100)));
            return;
        }
        if poll_fds(&mut fds, timeout) <= 0 {
            // A timeout, or an interrupted call: the caller checks deadlines and retries.
            return;
        }
        // A writable socket is written to by the next flush.
        for (fd, addr) in fds.iter().zip(addrs) {
            if readable(fd) {
                self.read_ready(&addr);
            }
        }
    }

    /// Reads what `addr` has sent (one read: poll said it would not block) and handles every whole frame.
    pub(crate) fn read_ready(&mut self, addr: &str) {
        let max_frame = self.client.config().max_frame;
        let Some(conn) = self.conns.get_mut(addr) else {
            return;
        };
        let n = match conn.stream.read(&mut self.chunk) {
            Ok(0) => {
                self.lose_connection(addr, "the node closed the connection");
                return;
            }
            Ok(n) => n,
            Err(e)
                if e.kind() == IoErrorKind::Interrupted || e.kind() == IoErrorKind::WouldBlock =>
            {
                return;
            }
            Err(e) => {
                self.lose_connection(addr, &format!("no reply from {addr}: {e}"));
                return;
            }
        };
        if conn.rpos > 0 {
            conn.rbuf.drain(..conn.rpos);
            conn.rpos = 0;
        }
        conn.rbuf.extend_from_slice(&self.chunk[..n]);
        let mut replies = Vec::new();
        let mut bad = None;
        loop {
            let rest = &conn.rbuf[conn.rpos..];
            if rest.len() < 4 {
                break;
            }
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            if len > max_frame {
                bad = Some(format!(
                    "a reply of {len} bytes exceeds the limit of {max_frame} bytes"
                ));
                break;
            }
            let end = 4 + len as usize;
            if rest.len() < end {
                break;
            }
            match postcard::from_bytes::<Response>(&rest[4..end]) {
                Ok(r) => replies.push(r),
                Err(e) => {
                    bad = Some(format!("malformed reply: {e}"));
                    break;
                }
            }
            conn.rpos += end;
        }
        if conn.rpos == conn.rbuf.len() {
            conn.rbuf.clear();
            conn.rpos = 0;
        }
        for r in replies {
            self.handle_reply(addr, r);
        }
        if let Some(why) = bad {
            self.lose_connection(addr, &why);
        }
    }

    fn handle_reply(&mut self, addr: &str, r: Response) {
        // A reply to a request already given up (its deadline passed) is dropped.
        let Some(f) = self.in_flight.remove(&r.id) else {
            return;
        };
        self.left(&f.addr);
        let write = f.body.is_write();
        let retry = |f: InFlight, last: Cow<'static, str>| Pending {
            at: Instant::now(),
            tag: f.tag,
            body: f.body,
            deadline: f.deadline,
            pause: f.pause,
            last,
        };
        match r.body {
            ResponseBody::NotOwner { epoch } => {
                self.client.refresh_after_refusal(epoch, addr);
                let p = retry(f, format!("{addr} refused the key at epoch {epoch}").into());
                self.send(p);
            }
            ResponseBody::Error { kind, message } => match final_error(kind, message, write) {
                Ok(e) => self.done.push_back(Completion {
                    tag: f.tag,
                    result: Err(e),
                }),
                Err(message) => {
                    self.client.refresh(0, None);
                    let p = retry(f, format!("{addr}: {message}").into());
                    self.retry_later(p);
                }
            },
            body => self.done.push_back(Completion {
                tag: f.tag,
                result: Ok(body),
            }),
        }
    }

    /// Counts a request on `addr` as no longer in flight there.
    fn left(&mut self, addr: &str) {
        if let Some(c) = self.conns.get_mut(addr) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
    }

    /// Drops the connection to `addr`: its writes in flight may or may not have been applied, its reads are sent
    /// again.
    fn lose_connection(&mut self, addr: &str, why: &str) {
        self.conns.remove(addr);
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.addr == addr)
            .map(|(&id, _)| id)
            .collect();
        if ids.is_empty() {
            return;
        }
        self.client.refresh(0, None);
        for id in ids {
            let f = self.in_flight.remove(&id).expect("listed above");
            if f.body.is_write() {
                self.done.push_back(Completion {
                    tag: f.tag,
                    result: Err(ClientError::Indeterminate(why.to_string())),
                });
            } else {
                self.retry_later(Pending {
                    at: Instant::now(),
                    tag: f.tag,
                    body: f.body,
                    deadline: f.deadline,
                    pause: f.pause,
                    last: why.to_string().into(),
                });
            }
        }
    }

    /// Completes the requests whose deadline passed without a reply: writes as indeterminate (they were sent),
    /// reads as unavailable.
    pub(crate) fn expire(&mut self) {
        let now = Instant::now();
        // A node that took none of a connection's queued bytes for a whole request deadline is not reading: the
        // connection goes, with what it held (the queue does not grow for ever behind a frozen node).
        let op_timeout = self.client.config().op_timeout;
        let stalled: Vec<Arc<str>> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.stalled_since
                    .is_some_and(|t| now.duration_since(t) >= op_timeout)
            })
            .map(|(addr, _)| addr.clone())
            .collect();
        for addr in stalled {
            let why = format!("{addr} took none of its requests for {op_timeout:?}");
            self.lose_connection(&addr, &why);
        }
        let late: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            let f = self.in_flight.remove(&id).expect("listed above");
            self.left(&f.addr);
            let why = format!("no reply from {} before the deadline", f.addr);
            let result = if f.body.is_write() {
                Err(ClientError::Indeterminate(why))
            } else {
                Err(ClientError::Unavailable(why))
            };
            self.done.push_back(Completion { tag: f.tag, result });
        }
        // A connection left with bytes to send but nothing in flight holds only requests given up: they are not
        // sent late, and the stream (perhaps cut inside a frame) is not used again.
        let idle_unsent: Vec<Arc<str>> = self
            .conns
            .iter()
            .filter(|(_, c)| c.in_flight == 0 && !c.wbuf.is_empty())
            .map(|(addr, _)| addr.clone())
            .collect();
        for addr in idle_unsent {
            self.conns.remove(&*addr);
        }
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].deadline <= now {
                let p = self.pending.swap_remove(i);
                self.done.push_back(Completion {
                    tag: p.tag,
                    result: Err(ClientError::Unavailable(p.last.into_owned())),
                });
            } else {
                i += 1;
            }
        }
    }
}

/// Whether a connection [`PipelinedClient::wait_set`] named has something to read (or has failed, which the read
/// finds) after the wait.
pub(crate) fn readable(fd: &libc::pollfd) -> bool {
    fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// Writes as much of `bytes` to the (non-blocking) `stream` as its socket takes now: the bytes written (fewer than
/// all when the socket is full), or the error that broke the connection.
fn send_now(mut stream: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    let mut sent = 0;
    while sent < bytes.len() {
        match stream.write(&bytes[sent..]) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(e) if e.kind() == IoErrorKind::Interrupted => {}
            Err(e) if e.kind() == IoErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// poll(2) on `fds` for up to `timeout` (rounded up to a whole millisecond, so that a wait for an instant less than a
/// millisecond away does not spin): how many are ready, 0 on a timeout, negative on an interrupted call.
pub(crate) fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) -> i32 {
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()` initialised pollfd structures, which is
    // what poll(2) reads and writes; the caller keeps the descriptors open for the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use dinomo_kn::DataOp;

    use super::*;
    use crate::{LocalCluster, LocalClusterConfig};

    /// A node that stops reading (frozen, starved) fills its socket: a flush sends what the socket takes and
    /// returns, keeping the rest, and once the node has taken nothing for the request deadline its connection goes
    /// and every request on it completes.
    #[test]
    fn a_node_that_stops_reading_holds_up_no_flush_and_its_connection_goes() {
        let cluster = LocalCluster::start(LocalClusterConfig {
            pool_size: 64 << 20,
            kns: 1,
            ..LocalClusterConfig::default()
        })
        .expect("cluster");
        let op_timeout = Duration::from_secs(1);
        let mut cl = PipelinedClient::connect(ClientConfig {
            seeds: vec![cluster.nodes()[0].addr().to_string()],
            op_timeout,
            ..ClientConfig::default()
        })
        .expect("client");
        // One request opens the connection to the node.
        cl.submit(0, RequestBody::Data(DataOp::Get(b"k".to_vec())))
            .expect("submit");
        let first = cl.next_completion().expect("a completion");
        assert_eq!(first.result, Ok(ResponseBody::Value(None)));
        // The node stops reading: its connection's socket now leads to a peer that never reads.
        let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
        let never_read = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        never_read
            .set_nonblocking(true)
            .expect("non-blocking, as the client's own");
        let (_held, _) = listener.accept().expect("accept");
        let addr = cl.conns.keys().next().expect("a connection").clone();
        cl.conns.get_mut(&addr).expect("connection").stream = never_read;
        // 32 MiB of writes: more than a loopback socket's buffers take.
        let requests = 512u64;
        for i in 0..requests {
            let op = DataOp::Set(format!("k{i}").into_bytes(), vec![b'v'; 64 << 10]);
            cl.submit(i, RequestBody::Data(op)).expect("submit");
        }
        cl.flush();
        assert!(
            cl.has_unsent(),
            "the flush returned with everything sent, or dropped it"
        );
        assert!(cl.conns.contains_key(&addr), "the connection went at once");
        // Each write completes as indeterminate (part went out), by the deadline.
        let mut completed = 0;
        while let Some(c) = cl.next_completion() {
            assert!(
                matches!(c.result, Err(ClientError::Indeterminate(_))),
                "{:?}",
                c.result
            );
            completed += 1;
        }
        assert_eq!(completed, requests);
        // The stalled connection went with its queue: nothing is left to send.
        assert!(!cl.has_unsent());
        // The client goes on: a new connection serves the next request.
        cl.submit(1, RequestBody::Data(DataOp::Get(b"k".to_vec())))
            .expect("submit");
        let next = cl.next_completion().expect("a completion");
        assert_eq!(next.result, Ok(ResponseBody::Value(None)));
    }
}
