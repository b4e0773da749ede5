//! The server's connected clients, for `CLIENT LIST` and `CLIENT KILL`: each connection's card (who it is, what it
//! last ran, when) and, for connections of a running server, a handle on its socket that another connection's
//! `CLIENT KILL` shuts down. The connection's own event loop then sees the socket close and drops it.

use std::collections::BTreeMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What `CLIENT LIST` shows of one connection.
#[derive(Debug)]
pub(crate) struct ClientCard {
    pub id: u64,
    pub peer: String,
    pub local: String,
    pub created: Instant,
    /// When the connection last had input, in milliseconds after `created` (its event loop's clock reading, which
    /// the idle timeout goes by too).
    last_active_ms: AtomicU64,
    state: Mutex<CardState>,
}

/// The parts of a card that change while the connection lives.
#[derive(Debug)]
struct CardState {
    name: Option<Vec<u8>>,
    lib_name: Option<Vec<u8>>,
    lib_ver: Option<Vec<u8>>,
    last_command: &'static str,
    resp: i64,
}

impl ClientCard {
    pub(crate) fn new(id: u64, peer: String, local: String) -> ClientCard {
        ClientCard {
            id,
            peer,
            local,
            created: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            state: Mutex::new(CardState {
                name: None,
                lib_name: None,
                lib_ver: None,
                last_command: "NULL",
                resp: 2,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, CardState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The names the client gave itself (`CLIENT SETNAME`, `CLIENT SETINFO`, `HELLO ... SETNAME`).
    pub(crate) fn set_names(
        &self,
        name: &Option<Vec<u8>>,
        lib_name: &Option<Vec<u8>>,
        lib_ver: &Option<Vec<u8>>,
    ) {
        let mut s = self.state();
        s.name.clone_from(name);
        s.lib_name.clone_from(lib_name);
        s.lib_ver.clone_from(lib_ver);
    }

    /// The command the client ran last and its protocol version.
    pub(crate) fn ran(&self, command: &'static str, resp: i64) {
        let mut s = self.state();
        s.last_command = command;
        s.resp = resp;
    }

    /// The connection had input at `now`.
    pub(crate) fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.created).as_millis();
        self.last_active_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long the connection has had no input, at `now`.
    pub(crate) fn idle(&self, now: Instant) -> Duration {
        let active = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(self.created)
            .saturating_sub(active)
    }

    /// Its `CLIENT LIST` / `CLIENT INFO` line, with the fields Redis 7.0 shows that apply here.
    pub(crate) fn line(&self) -> String {
        let s = self.state();
        let show = |v: &Option<Vec<u8>>| {
            v.as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        format!(
            "id={} addr={} laddr={} name={} age={} idle={} flags=N db=0 sub=0 psub=0 multi=-1 cmd={} user=default \
             resp={} lib-name={} lib-ver={}\n",
            self.id,
            self.peer,
            self.local,
            show(&s.name),
            self.created.elapsed().as_secs(),
            self.idle(Instant::now()).as_secs(),
            s.last_command,
            s.resp,
            show(&s.lib_name),
            show(&s.lib_ver),
        )
    }
}

/// One registered connection.
#[derive(Debug)]
struct Entry {
    card: Arc<ClientCard>,
    /// A handle on the connection's socket (none for a session without one, as in tests).
    socket: Option<TcpStream>,
}

/// Every connection of a server, by client id (the order of `CLIENT LIST`).
#[derive(Debug, Default)]
pub(crate) struct Clients(Mutex<BTreeMap<u64, Entry>>);

/// Which clients a `CLIENT KILL` names: every filter given must match.
#[derive(Debug, Default)]
pub(crate) struct KillFilter {
    pub id: Option<u64>,
    pub addr: Option<Vec<u8>>,
    pub laddr: Option<Vec<u8>>,
    /// Only connections older than this many seconds.
    pub max_age: Option<u64>,
    /// Whether the asking client is spared.
    pub skip: Option<u64>,
    /// A `TYPE` other than `normal` or a `USER` other than `default`: no client here is of it.
    pub none: bool,
}

impl Clients {
    fn map(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(&self, card: Arc<ClientCard>) {
        self.map().insert(card.id, Entry { card, socket: None });
    }

    /// Gives the registered client `id` its socket, which a `CLIENT KILL` shuts down.
    pub(crate) fn attach(&self, id: u64, socket: TcpStream) {
        if let Some(e) = self.map().get_mut(&id) {
            e.socket = Some(socket);
        }
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.map().remove(&id);
    }

    /// The `CLIENT LIST` lines of the clients `keep` accepts, in id order.
    pub(crate) fn list(&self, keep: impl Fn(u64) -> bool) -> String {
        let cards: Vec<Arc<ClientCard>> = self
            .map()
            .values()
            .filter(|e| keep(e.card.id))
            .map(|e| e.card.clone())
            .collect();
        cards.iter().map(|c| c.line()).collect()
    }

    /// Shuts down the sockets of the clients `filter` names; the ids of those it named (a client without a socket
    /// included: it is closed by whoever serves it).
    pub(crate) fn kill(&self, filter: &KillFilter) -> Vec<u64> {
        if filter.none {
            return Vec::new();
        }
        let mut killed = Vec::new();
        for e in self.map().values() {
            let c = &e.card;
            let named = filter.id.is_none_or(|id| id == c.id)
                && filter
                    .addr
                    .as_deref()
                    .is_none_or(|a| a == c.peer.as_bytes())
                && filter
                    .laddr
                    .as_deref()
                    .is_none_or(|a| a == c.local.as_bytes())
                && filter
                    .max_age
                    .is_none_or(|age| c.created.elapsed().as_secs() > age)
                && filter.skip != Some(c.id);
            if named {
                if let Some(s) = &e.socket {
                    let _ = s.shutdown(Shutdown::Both);
                }
                killed.push(c.id);
            }
        }
        killed
    }

    /// Shuts down every connection's socket.
    pub(crate) fn cut_all(&self) {
        for e in self.map().values() {
            if let Some(s) = &e.socket {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}
