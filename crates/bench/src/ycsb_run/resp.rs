//! Any server that speaks the Redis protocol as the store under test: `dinomo up`'s RESP port, or a plain
//! `redis-server`, measured by the same driver with the same settings as the native target.
//!
//! Each [`Session`] is one connection, to the addresses in turn. Requests are written to a buffer as they are
//! submitted and sent together when the client waits for a completion, so a client's `outstanding` requests travel
//! as one pipeline; RESP answers in request order, so completions come back in submission order. A read is `GET`,
//! a write `SET` (a read-modify-write is a `GET`, then a `SET`, as the driver issues it).
//!
//! What the server keeps to itself is not measured: a RESP server does not publish cache hits or merge backlogs,
//! so a run through this target reports them as absent, never as zero. dinomo's servers (`dinomo up`, `dinomo kn`)
//! publish their process's fabric counters in `INFO fabric`: the report's `server_fabric` is their change over
//! the measured phase, every thread of the server processes included (absent for a server without them).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use dinomo_dpm::ProcessorStats;
use dinomo_resp::encode_request;
use dinomo_resp::value::{Value, ValueLimits};

use super::RespOptions;
use super::resources::{FabricTotals, Snapshot};
use super::target::{ServerIdentity, Session, Store, StoreError, StoreOp, StoreReply};

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 << 10;
/// Requests buffered beyond this many bytes are sent at once rather than when the client next waits.
const SEND_AT: usize = 256 << 10;
/// A connection that cannot be opened is tried again after this pause, until the operation's timeout.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// A RESP server reached over TCP.
pub struct RespStore {
    addrs: Vec<SocketAddr>,
    password: Option<String>,
    timeout: Duration,
    limits: ValueLimits,
    /// The address the next session connects to.
    next: AtomicUsize,
    identity: ServerIdentity,
}

impl RespStore {
    /// Resolves `opts`' addresses and asks the first one what it is (`INFO server`), which also checks that it
    /// answers and accepts the password.
    pub fn open(
        opts: &RespOptions,
        timeout: Duration,
        value_bytes: usize,
    ) -> anyhow::Result<RespStore> {
        let mut addrs = Vec::with_capacity(opts.addrs.len());
        for a in &opts.addrs {
            let addr = a
                .to_socket_addrs()
                .with_context(|| format!("--resp {a}"))?
                .next()
                .ok_or_else(|| anyhow!("--resp {a}: no address"))?;
            addrs.push(addr);
        }
        let first = *addrs
            .first()
            .ok_or_else(|| anyhow!("--resp needs an address"))?;
        let password = (!opts.password.is_empty()).then(|| opts.password.clone());
        let limits = ValueLimits {
            // A value read back is at most what the workload writes; anything far larger is not a reply to it.
            max_bulk_len: value_bytes.max(1 << 20).saturating_mul(4),
            ..ValueLimits::default()
        };
        let mut probe =
            Conn::open(first, password.as_deref(), timeout, &limits).map_err(|e| anyhow!("{e}"))?;
        let info = match probe.call(&[b"INFO".as_slice(), b"server"]) {
            Ok(Value::Bulk(text) | Value::Verbatim(_, text)) => text,
            Ok(Value::Error(e)) => bail!("INFO server at {first}: {}", String::from_utf8_lossy(&e)),
            Ok(other) => bail!("INFO server at {first}: unexpected reply {other:?}"),
            Err(e) => bail!("INFO server at {first}: {e}"),
        };
        Ok(RespStore {
            addrs,
            password,
            timeout,
            limits,
            next: AtomicUsize::new(0),
            identity: identify(&info),
        })
    }
}

impl RespStore {
    /// The fabric counters of every server process behind the addresses (`INFO fabric`, each process counted
    /// once however many of its ports are listed); `None` when one of them does not publish them.
    fn fabric(&self) -> anyhow::Result<Option<FabricTotals>> {
        let mut seen: Vec<(std::net::IpAddr, String)> = Vec::new();
        let mut sum = FabricTotals::default();
        for &addr in &self.addrs {
            let mut conn = Conn::open(addr, self.password.as_deref(), self.timeout, &self.limits)
                .map_err(|e| anyhow!("{e}"))?;
            let text = match conn.call(&[b"INFO".as_slice(), b"server", b"fabric"]) {
                Ok(Value::Bulk(text) | Value::Verbatim(_, text)) => text,
                Ok(Value::Error(e)) => bail!("INFO at {addr}: {}", String::from_utf8_lossy(&e)),
                Ok(other) => bail!("INFO at {addr}: unexpected reply {other:?}"),
                Err(e) => bail!("INFO at {addr}: {e}"),
            };
            let text = String::from_utf8_lossy(&text);
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(str::trim)
            };
            let number = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
            let (Some(round_trips), Some(bytes_out), Some(bytes_in)) = (
                number("fabric_round_trips"),
                number("fabric_bytes_out"),
                number("fabric_bytes_in"),
            ) else {
                return Ok(None);
            };
            // The counters are the whole process's: one process's ports count once.
            let process = (
                addr.ip(),
                field("process_id").unwrap_or_default().to_string(),
            );
            if seen.contains(&process) {
                continue;
            }
            seen.push(process);
            sum.round_trips += round_trips;
            sum.bytes_out += bytes_out;
            sum.bytes_in += bytes_in;
        }
        Ok(Some(sum))
    }
}

/// What `INFO server` says the server is: dinomo names itself in `dinomo_version`, Redis in `redis_version`.
fn identify(info: &[u8]) -> ServerIdentity {
    let text = String::from_utf8_lossy(info);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    match (field("dinomo_version"), field("redis_version")) {
        (Some(v), _) => ServerIdentity {
            system: "dinomo".into(),
            version: Some(v),
        },
        (None, Some(v)) => ServerIdentity {
            system: "redis".into(),
            version: Some(v),
        },
        (None, None) => ServerIdentity {
            system: "resp".into(),
            version: None,
        },
    }
}

impl Store for RespStore {
    fn session(&self) -> anyhow::Result<Box<dyn Session>> {
        let addr = self.addrs[self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len()];
        let conn = Conn::open(addr, self.password.as_deref(), self.timeout, &self.limits)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Box::new(RespSession {
            addr,
            password: self.password.clone(),
            timeout: self.timeout,
            limits: self.limits.clone(),
            conn: Some(conn),
            in_flight: VecDeque::new(),
            failed: VecDeque::new(),
        }))
    }

    fn snapshot(&self) -> anyhow::Result<Snapshot> {
        // Nothing else the report's resources are made of can be read through RESP.
        Ok(Snapshot {
            fabric: self.fabric()?,
            ..Snapshot::default()
        })
    }

    fn memory_stats(&self) -> Option<ProcessorStats> {
        None
    }

    fn layout(&self) -> (Option<usize>, Option<usize>) {
        (None, None)
    }

    fn identity(&self) -> Option<ServerIdentity> {
        Some(self.identity.clone())
    }
}

/// One blocking connection: requests are buffered until [`Conn::flush`], replies parsed as they arrive.
struct Conn {
    addr: SocketAddr,
    stream: TcpStream,
    out: Vec<u8>,
    /// Received bytes in `..filled`; the room after them is kept for the next read, so it is zeroed only when
    /// the buffer grows.
    input: Vec<u8>,
    filled: usize,
    /// Where the next reply starts in `input`.
    start: usize,
    limits: ValueLimits,
}

impl Conn {
    /// Connects, and authenticates when there is a password.
    fn open(
        addr: SocketAddr,
        password: Option<&str>,
        timeout: Duration,
        limits: &ValueLimits,
    ) -> Result<Conn, StoreError> {
        let unavailable = |what: &str, e: std::io::Error| {
            StoreError::Unavailable(format!("{what} the RESP server at {addr}: {e}"))
        };
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| unavailable("cannot connect to", e))?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(timeout)))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|e| unavailable("cannot set up the connection to", e))?;
        let mut conn = Conn {
            addr,
            stream,
            out: Vec::new(),
            input: Vec::new(),
            filled: 0,
            start: 0,
            limits: limits.clone(),
        };
        if let Some(p) = password {
            match conn.call(&[b"AUTH".as_slice(), p.as_bytes()])? {
                Value::Simple(ok) if ok == b"OK" => {}
                Value::Error(e) => {
                    return Err(StoreError::Invalid(format!(
                        "the RESP server at {addr} refused the password: {}",
                        String::from_utf8_lossy(&e)
                    )));
                }
                other => {
                    return Err(StoreError::Invalid(format!(
                        "the RESP server at {addr} answered AUTH with {other:?}"
                    )));
                }
            }
        }
        Ok(conn)
    }

    fn queue(&mut self, args: &[&[u8]]) {
        encode_request(args, &mut self.out);
    }

    fn flush(&mut self) -> Result<(), String> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.stream.write_all(&self.out);
        self.out.clear();
        r.map_err(|e| format!("sending to the RESP server at {}: {e}", self.addr))
    }

    /// The next reply, reading until it has arrived.
    fn read(&mut self) -> Result<Value, String> {
        loop {
            match Value::parse(&self.input[self.start..self.filled], &self.limits) {
                Ok(Some((v, used))) => {
                    self.start += used;
                    if self.start == self.filled {
                        self.filled = 0;
                        self.start = 0;
                    }
                    return Ok(v);
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(format!(
                        "the RESP server at {} sent something that is not a reply: {e}",
                        self.addr
                    ));
                }
            }
            // Consumed replies are dropped before the buffer grows.
            if self.start > 0 {
                self.input.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            }
            if self.input.len() < self.filled + READ_CHUNK {
                self.input.resize(self.filled + READ_CHUNK, 0);
            }
            match self.stream.read(&mut self.input[self.filled..]) {
                Ok(0) => {
                    return Err(format!(
                        "the RESP server at {} closed the connection",
                        self.addr
                    ));
                }
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(format!(
                        "no reply from the RESP server at {} within the operation timeout",
                        self.addr
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "reading from the RESP server at {}: {e}",
                        self.addr
                    ));
                }
            }
        }
    }

    /// Sends one request and waits for its reply.
    fn call(&mut self, args: &[&[u8]]) -> Result<Value, StoreError> {
        self.queue(args);
        self.flush().map_err(StoreError::Unavailable)?;
        self.read().map_err(StoreError::Unavailable)
    }
}

/// What a request in flight was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Get,
    Set,
}

/// One client's connection, with many requests in flight.
struct RespSession {
    addr: SocketAddr,
    password: Option<String>,
    timeout: Duration,
    limits: ValueLimits,
    /// `None` after the connection failed; the next submit opens a new one.
    conn: Option<Conn>,
    /// Requests sent or buffered, in order: RESP answers them in this order.
    in_flight: VecDeque<(u64, Sent)>,
    /// Completions of requests that failed without an answer.
    failed: VecDeque<(u64, Result<StoreReply, StoreError>)>,
}

impl RespSession {
    /// Every request in flight failed with the connection: a write's outcome is unknown, a read was not served.
    fn fail_connection(&mut self, why: &str) {
        self.conn = None;
        while let Some((tag, sent)) = self.in_flight.pop_front() {
            let e = match sent {
                Sent::Set => StoreError::Indeterminate(why.to_string()),
                Sent::Get => StoreError::Unavailable(why.to_string()),
            };
            self.failed.push_back((tag, Err(e)));
        }
    }

    /// Opens a connection again, trying until the operation timeout.
    fn reconnect(&mut self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match Conn::open(
                self.addr,
                self.password.as_deref(),
                self.timeout,
                &self.limits,
            ) {
                Ok(c) => {
                    self.conn = Some(c);
                    return Ok(());
                }
                Err(e @ StoreError::Invalid(_)) => return Err(e),
                Err(e) if Instant::now() + RECONNECT_PAUSE >= deadline => return Err(e),
                Err(_) => std::thread::sleep(RECONNECT_PAUSE),
            }
        }
    }
}

/// What an error reply means for the benchmark. Requests that can never succeed (no password, a command the
/// server does not know, a value over its limit) are invalid and stop the run; dinomo's "write outcome unknown"
/// is indeterminate; anything else is counted as unavailable.
fn error_reply(addr: SocketAddr, text: &[u8]) -> StoreError {
    let text = String::from_utf8_lossy(text).into_owned();
    let code = text.split(' ').next().unwrap_or("");
    let message = format!("the RESP server at {addr} answered: {text}");
    if text.starts_with("ERR write outcome unknown") {
        StoreError::Indeterminate(message)
    } else if matches!(
        code,
        "NOAUTH" | "WRONGPASS" | "NOPERM" | "WRONGTYPE" | "NOPROTO"
    ) || [
        "ERR unknown command",
        "ERR wrong number of arguments",
        "ERR Protocol error",
    ]
    .iter()
    .any(|p| text.starts_with(p))
        || text.contains("exceeds the limit")
    {
        StoreError::Invalid(message)
    } else {
        StoreError::Unavailable(message)
    }
}

/// The completion of a request from its reply.
fn completion(addr: SocketAddr, sent: Sent, reply: Value) -> Result<StoreReply, StoreError> {
    match (sent, reply) {
        (_, Value::Error(e) | Value::BulkError(e)) => Err(error_reply(addr, &e)),
        (Sent::Get, Value::Bulk(v)) => Ok(StoreReply::Value(Some(v))),
        (Sent::Get, Value::NullBulk | Value::Null) => Ok(StoreReply::Value(None)),
        (Sent::Set, Value::Simple(ok)) if ok == b"OK" => Ok(StoreReply::Stored),
        (sent, other) => Err(StoreError::Invalid(format!(
            "the RESP server at {addr} answered {} with {other:?}",
            match sent {
                Sent::Get => "GET",
                Sent::Set => "SET",
            }
        ))),
    }
}

impl Session for RespSession {
    fn submit(&mut self, tag: u64, op: StoreOp<'_>) -> Result<(), StoreError> {
        if self.conn.is_none()
            && let Err(e) = self.reconnect()
        {
            // Not sent: whatever it was, it did not happen.
            let e = match e {
                StoreError::Indeterminate(m) => StoreError::Unavailable(m),
                other => other,
            };
            self.failed.push_back((tag, Err(e)));
            return Ok(());
        }
        let conn = self.conn.as_mut().expect("connected above");
        let sent = match op {
            StoreOp::Get(k) => {
                conn.queue(&[b"GET".as_slice(), k]);
                Sent::Get
            }
            StoreOp::Set(k, v) => {
                conn.queue(&[b"SET".as_slice(), k, v]);
                Sent::Set
            }
        };
        self.in_flight.push_back((tag, sent));
        if conn.out.len() >= SEND_AT
            && let Err(why) = conn.flush()
        {
            self.fail_connection(&why);
        }
        Ok(())
    }

    fn next_completion(&mut self) -> Option<(u64, Result<StoreReply, StoreError>)> {
        if let Some(done) = self.failed.pop_front() {
            return Some(done);
        }
        let &(tag, sent) = self.in_flight.front()?;
        let Some(conn) = self.conn.as_mut() else {
            // Unreachable: requests are in flight only on a live connection.
            self.fail_connection("the connection is gone");
            return self.failed.pop_front();
        };
        let reply = conn.flush().and_then(|()| conn.read());
        match reply {
            Ok(v) => {
                let addr = conn.addr;
                self.in_flight.pop_front();
                Some((tag, completion(addr, sent, v)))
            }
            Err(why) => {
                self.fail_connection(&why);
                self.failed.pop_front()
            }
        }
    }

    fn outstanding(&self) -> usize {
        self.in_flight.len() + self.failed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 6379))
    }

    #[test]
    fn info_names_the_server() {
        let redis = identify(b"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n");
        assert_eq!(
            (redis.system.as_str(), redis.version.as_deref()),
            ("redis", Some("7.0.15"))
        );
        let dinomo = identify(b"# Server\r\nredis_version:7.0.0\r\ndinomo_version:0.1.0\r\n");
        assert_eq!(
            (dinomo.system.as_str(), dinomo.version.as_deref()),
            ("dinomo", Some("0.1.0"))
        );
        let other = identify(b"# Server\r\nuptime:3\r\n");
        assert_eq!((other.system.as_str(), other.version), ("resp", None));
    }

    #[test]
    fn replies_become_completions() {
        let a = addr();
        assert_eq!(
            completion(a, Sent::Get, Value::Bulk(b"v".to_vec())),
            Ok(StoreReply::Value(Some(b"v".to_vec())))
        );
        assert_eq!(
            completion(a, Sent::Get, Value::NullBulk),
            Ok(StoreReply::Value(None))
        );
        assert_eq!(
            completion(a, Sent::Get, Value::Null),
            Ok(StoreReply::Value(None))
        );
        assert_eq!(
            completion(a, Sent::Set, Value::Simple(b"OK".to_vec())),
            Ok(StoreReply::Stored)
        );
        // A reply of the wrong kind means the two sides disagree on the protocol: the run stops.
        assert!(matches!(
            completion(a, Sent::Set, Value::Integer(1)),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            completion(a, Sent::Get, Value::Simple(b"OK".to_vec())),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn error_replies_are_classified() {
        let a = addr();
        let e =
            |t: &str| completion(a, Sent::Set, Value::Error(t.as_bytes().to_vec())).unwrap_err();
        assert!(matches!(
            e("ERR write outcome unknown, it may or may not have been applied: lease lost"),
            StoreError::Indeterminate(_)
        ));
        for fatal in [
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "ERR unknown command 'SET', with args beginning with: ",
            "ERR value of 2048 bytes exceeds the limit of 1024 bytes",
        ] {
            assert!(matches!(e(fatal), StoreError::Invalid(_)), "{fatal}");
        }
        for transient in [
            "LOADING Redis is loading the dataset in memory",
            "ERR no KV node serves the key",
        ] {
            assert!(
                matches!(e(transient), StoreError::Unavailable(_)),
                "{transient}"
            );
        }
        let text = e("BUSY script").to_string();
        assert!(
            text.contains("127.0.0.1:6379") && text.contains("BUSY script"),
            "{text}"
        );
    }
}
