//! Operations that take their time at the store: the event loop serves other connections meanwhile, answers the
//! waiting connection in order once the store rings, completes operations whose store never rings once it reports
//! them done, and does not take a connection that waits for its store for an idle one.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dinomo_resp::value::Value;
use dinomo_resp::{
    Backend, BackendConn, BackendError, MemoryBackend, Op, OpResult, RespServer, ServerConfig, Wake,
};

/// A store whose operations on keys starting with `slow` complete only when the test opens its gate (or, for a
/// store that never rings, once `silent_after` has passed since they started). Others complete at once.
#[derive(Clone)]
struct Gated {
    store: MemoryBackend,
    gate: Arc<Gate>,
    /// Never ring: report slow operations complete this long after they started.
    silent_after: Option<Duration>,
}

struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    /// The wakes of connections with slow operations started, rung when the gate opens.
    waiting: Mutex<Vec<Wake>>,
}

impl Gated {
    fn new(silent_after: Option<Duration>) -> Gated {
        Gated {
            store: MemoryBackend::new(),
            gate: Arc::new(Gate {
                open: Mutex::new(false),
                opened: Condvar::new(),
                waiting: Mutex::new(Vec::new()),
            }),
            silent_after,
        }
    }

    fn open(&self) {
        *self.gate.open.lock().unwrap() = true;
        self.gate.opened.notify_all();
        for w in self.gate.waiting.lock().unwrap().drain(..) {
            w.wake();
        }
    }
}

struct GatedConn {
    backend: Gated,
    wake: Wake,
    /// When the started slow operations began.
    slow_since: Option<Instant>,
}

impl GatedConn {
    /// Whether the started slow operations are done, `open` being the gate.
    fn slow_done(&self, open: bool) -> bool {
        let Some(since) = self.slow_since else {
            return true;
        };
        match self.backend.silent_after {
            Some(after) => since.elapsed() >= after,
            None => open,
        }
    }
}

impl Backend for Gated {
    type Conn = GatedConn;

    fn connect(&self, wake: Wake) -> GatedConn {
        GatedConn {
            backend: self.clone(),
            wake,
            slow_since: None,
        }
    }
}

impl BackendConn for GatedConn {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.start(ops);
        self.finish(ops, results);
    }

    fn start(&mut self, ops: &mut Vec<Op>) {
        if ops.iter().any(|op| op.key().starts_with(b"slow")) {
            self.slow_since = Some(Instant::now());
            if self.backend.silent_after.is_none() {
                self.backend
                    .gate
                    .waiting
                    .lock()
                    .unwrap()
                    .push(self.wake.clone());
            }
        }
    }

    fn is_complete(&mut self, _ops: &mut Vec<Op>) -> bool {
        let open = *self.backend.gate.open.lock().unwrap();
        self.slow_done(open)
    }

    fn finish(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        // Waits as a store's `finish` does for operations still running, but not for ever: a server that waited
        // here fails the tests instead of hanging them.
        let give_up = Instant::now() + Duration::from_secs(15);
        let mut open = self.backend.gate.open.lock().unwrap();
        while !self.slow_done(*open) && Instant::now() < give_up {
            open = self
                .backend
                .gate
                .opened
                .wait_timeout(open, Duration::from_millis(10))
                .unwrap()
                .0;
        }
        drop(open);
        self.slow_since = None;
        self.backend.store.execute(ops, results);
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        self.backend.store.dbsize()
    }
}

mod common;

use common::Conn;

fn server(backend: Gated, config: ServerConfig) -> RespServer {
    RespServer::start(
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            // One loop serves every connection, so a loop that waited for one would stall the others.
            io_threads: 1,
            ..config
        },
        backend,
    )
    .expect("start")
}

fn ok() -> Value {
    Value::Simple("OK".into())
}

fn bulk(b: &[u8]) -> Value {
    Value::Bulk(b.to_vec())
}

#[test]
fn a_connection_waiting_for_its_store_does_not_hold_up_others() {
    let backend = Gated::new(None);
    let s = server(backend.clone(), ServerConfig::default());
    let mut waiting = Conn::open(s.local_addr());
    let mut other = Conn::open(s.local_addr());
    // A pipeline whose first command waits at the store, and a command that needs none behind it.
    waiting.send(&[b"SET", b"slow:1", b"v1"]);
    waiting.send(&[b"PING"]);
    assert!(
        waiting.silent_for(Duration::from_millis(200)),
        "answered before the store completed the write"
    );
    // Meanwhile another connection is served, many times over.
    for i in 0..50u32 {
        let value = i.to_string();
        assert_eq!(other.call(&[b"SET", b"k", value.as_bytes()]), ok());
        assert_eq!(other.call(&[b"GET", b"k"]), bulk(value.as_bytes()));
    }
    // What the waiting connection sends meanwhile is answered after the batch it waits for.
    waiting.send(&[b"GET", b"slow:1"]);
    assert!(waiting.silent_for(Duration::from_millis(100)));
    backend.open();
    assert_eq!(waiting.read(), Some(ok()));
    assert_eq!(waiting.read(), Some(Value::Simple("PONG".into())));
    assert_eq!(waiting.read(), Some(bulk(b"v1")));
    assert_eq!(waiting.call(&[b"GET", b"k"]), bulk(b"49"));
}

#[test]
fn operations_whose_store_never_rings_are_completed_once_it_reports_them_done() {
    let after = Duration::from_millis(300);
    let s = server(Gated::new(Some(after)), ServerConfig::default());
    let mut c = Conn::open(s.local_addr());
    let begun = Instant::now();
    assert_eq!(c.call(&[b"SET", b"slow:2", b"v"]), ok());
    let took = begun.elapsed();
    assert!(
        took >= after,
        "answered after {took:?}, before the store was done"
    );
    // The loop looks at running operations about once a second when nothing rings.
    assert!(
        took < Duration::from_secs(5),
        "answered only after {took:?}"
    );
    assert_eq!(c.call(&[b"GET", b"slow:2"]), bulk(b"v"));
}

#[test]
fn a_connection_waiting_for_its_store_is_not_idle() {
    let backend = Gated::new(None);
    let s = server(
        backend.clone(),
        ServerConfig {
            idle_timeout: Duration::from_millis(100),
            ..ServerConfig::default()
        },
    );
    let mut c = Conn::open(s.local_addr());
    c.send(&[b"SET", b"slow:3", b"v"]);
    // Several idle timeouts pass while the write waits.
    std::thread::sleep(Duration::from_millis(500));
    backend.open();
    assert_eq!(c.read(), Some(ok()));
    // Idle afterwards, it is closed.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.read(), None);
}
