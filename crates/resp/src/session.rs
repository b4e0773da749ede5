//! One client connection's state and its commands. Key operations of a pipeline are collected and run together
//! by the backend; replies are written in request order when the pipeline is flushed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::backend::{BackendConn, BackendError, Op, OpResult, Output};
use crate::clients::{ClientCard, Clients, KillFilter};
use crate::command::{self, CommandId, CommandSpec};
use crate::glob::Pattern;
use crate::parse::{ProtocolError, parse_i64};
use crate::reply::{Protocol, ReplyWriter};
use crate::server::ServerConfig;

/// The Redis version whose protocol and commands the server follows; `HELLO` and `INFO` report it so client
/// libraries that gate features on the version behave as with that Redis.
pub const REDIS_COMPAT_VERSION: &str = "7.0.0";
/// Keys a `SCAN` step is asked for without `COUNT` (Redis's default).
const DEFAULT_SCAN_COUNT: u32 = 10;
/// Keys each step of a `KEYS` walk (and of a `FLUSHDB`) is asked for.
const KEYS_STEP: u32 = 1000;
/// The reply to a bit offset that is not an integer, is negative or lies beyond `proto-max-bulk-len` bytes.
const BAD_BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";
/// The reply to `SET ... EX` and `GETEX ... EX` (and their other expiry options).
const NO_EXPIRY: &str =
    "ERR dinomo keeps keys until they are deleted: expiry (EX, PX, EXAT, PXAT) is not supported";

/// Counters shared by every connection of a server.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections_received: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub commands_processed: AtomicU64,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    pub error_replies: AtomicU64,
    pub connected_clients: AtomicUsize,
}

/// What every connection of a server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: ServerConfig,
    /// The bound port (`INFO`, `CONFIG GET port`).
    pub port: u16,
    pub started: Instant,
    pub run_id: String,
    pub next_client_id: AtomicU64,
    pub counters: Counters,
    /// The connected clients (`CLIENT LIST`, `CLIENT KILL`).
    pub clients: Clients,
}

impl Shared {
    pub(crate) fn new(config: ServerConfig, port: u16) -> Shared {
        Shared {
            config,
            port,
            started: Instant::now(),
            run_id: run_id(),
            next_client_id: AtomicU64::new(1),
            counters: Counters::default(),
            clients: Clients::default(),
        }
    }
}

/// 40 hex digits that differ between server starts.
fn run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut id = String::with_capacity(40);
    let mut n = 0u64;
    while id.len() < 40 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        id.push_str(&format!("{:016x}", h.finish()));
        n += 1;
    }
    id.truncate(40);
    id
}

/// Whether the connection goes on after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// Close once the replies so far are written (`QUIT`, a protocol error).
    Close,
    /// Handle nothing more until the operations handled so far are started and have completed (`EXEC`: its
    /// transaction runs as a batch of its own).
    Pause,
}

/// How a command's reply is made from its ops' results.
#[derive(Debug, Clone, Copy)]
enum Deferred {
    /// A value or null (`GET`, `GETSET`, `SET ... GET`); `GET` counts hits and misses.
    Value { counts_hits: bool },
    /// `+OK` if applied, else null (`SET` with or without `NX`/`XX`).
    OkOrNull,
    /// `:1` or `:0` (`SETNX`).
    Flag,
    /// How many applied (`DEL`, `EXISTS`).
    Count,
    /// An array of values (`MGET`).
    Values,
    /// `+OK` once all applied (`MSET`).
    AllOk,
    /// A number (`INCR`, `APPEND`, `STRLEN`).
    Int,
    /// `+string` if the key has a value, else `+none` (`TYPE`).
    Type,
    /// `:-1` (no expiry) if the key has a value, else `:-2` (`TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`): no key
    /// here ever has an expiry.
    NoExpiry,
}

enum Pending {
    /// A reply already encoded, in `stash`.
    Ready(usize, usize),
    /// A reply to make from the results of `count` ops starting at `first`.
    Ops {
        reply: Deferred,
        first: usize,
        count: usize,
        proto: Protocol,
    },
    /// `EXEC`'s reply, made from the transaction in `Session::running_txn` and the outcome of its batch.
    Exec(Protocol),
}

/// Per-connection counts, added to the shared counters once per flush.
#[derive(Default)]
struct LocalCounts {
    commands: u64,
    hits: u64,
    misses: u64,
    errors: u64,
}

/// One client connection.
pub(crate) struct Session<C: BackendConn> {
    conn: C,
    shared: Arc<Shared>,
    id: u64,
    proto: Protocol,
    authenticated: bool,
    name: Option<Vec<u8>>,
    lib_name: Option<Vec<u8>>,
    lib_ver: Option<Vec<u8>>,
    /// What `CLIENT LIST` shows of this connection, registered with the server's clients while it lives.
    card: Arc<ClientCard>,
    /// The command and protocol version last written to the card: it is written again only when they change.
    on_card: (&'static str, i64),
    last_command: &'static str,
    ops: Vec<Op>,
    /// `ops` were started at the backend ([`Session::start_ops`]) and await their completion.
    started: bool,
    pending: Vec<Pending>,
    stash: Vec<u8>,
    results: Vec<OpResult>,
    counts: LocalCounts,
    /// The transaction opened by `MULTI`, until `EXEC`, `DISCARD` or `RESET`.
    multi: Option<Transaction>,
    /// A queued command is being turned into operations and replies: every reply it makes is stashed (it belongs
    /// to `EXEC`'s array), even with nothing pending.
    queuing: bool,
    /// The transaction `EXEC` made the pending batch of (`ops` are its operations), and how that batch ended once
    /// it ran.
    running_txn: Option<Box<Transaction>>,
    txn_outcome: Option<Result<bool, BackendError>>,
    /// The keys `WATCH`ed since the last `EXEC`, `DISCARD`, `UNWATCH` or `RESET`, each with the digest of the value
    /// it had then ([`dinomo_value::digest`]): the next `EXEC` runs only if every one still has it.
    watched: Vec<(Vec<u8>, Option<u128>)>,
}

/// The commands queued since `MULTI`: their operations and their replies (made as a pipeline's are, from the
/// operations' results), run by `EXEC`.
#[derive(Default)]
struct Transaction {
    ops: Vec<Op>,
    pending: Vec<Pending>,
    stash: Vec<u8>,
    /// A command was refused while queuing (unknown, wrong arity, not allowed here): `EXEC` runs nothing.
    refused: bool,
}

impl<C: BackendConn> Drop for Session<C> {
    fn drop(&mut self) {
        self.shared.clients.unregister(self.id);
    }
}

impl<C: BackendConn> Session<C> {
    pub(crate) fn new(conn: C, shared: Arc<Shared>, peer: String, local: String) -> Session<C> {
        let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let card = Arc::new(ClientCard::new(id, peer, local));
        shared.clients.register(card.clone());
        Session {
            conn,
            authenticated: shared.config.requirepass.is_none(),
            shared,
            id,
            proto: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_ver: None,
            card,
            on_card: ("NULL", 2),
            last_command: "NULL",
            ops: Vec::new(),
            started: false,
            pending: Vec::new(),
            stash: Vec::new(),
            results: Vec::new(),
            counts: LocalCounts::default(),
            multi: None,
            queuing: false,
            running_txn: None,
            txn_outcome: None,
            watched: Vec::new(),
        }
    }

    /// What `CLIENT LIST` shows of this connection.
    pub(crate) fn card(&self) -> &ClientCard {
        &self.card
    }

    /// The client id (`CLIENT ID`), unique in the server.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether the client may send what Redis allows only after authentication.
    pub(crate) fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Replies to a malformed request (the connection is closed afterwards).
    pub(crate) fn protocol_error(&mut self, e: &ProtocolError, out: &mut Vec<u8>) {
        self.flush(out);
        let mut text = b"ERR ".to_vec();
        text.extend_from_slice(&e.reply_text());
        self.error_bytes(out, &text);
        self.flush(out);
    }

    /// Handles one request; its reply goes to `out` now or, behind pending key operations, at the next
    /// [`Session::flush`].
    pub(crate) fn handle(&mut self, args: Vec<Vec<u8>>, out: &mut Vec<u8>) -> Flow {
        self.counts.commands += 1;
        let Some(spec) = self.checked(&args, out) else {
            // As in Redis, a command refused while a transaction is open makes its EXEC run nothing.
            if let Some(t) = &mut self.multi {
                t.refused = true;
            }
            return Flow::Continue;
        };
        self.last_command = spec.name;
        if self.multi.is_some() {
            return self.queue(spec, args, out);
        }
        self.run(spec, args, out)
    }

    /// The command `args` names, once it passed the checks every command meets (known, arity, authentication);
    /// `None` with the error replied.
    fn checked(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) -> Option<&'static CommandSpec> {
        let Some(mut spec) = command::lookup(&args[0]) else {
            let text = unknown_command(args);
            self.error_bytes(out, &text);
            return None;
        };
        if spec.is_container() && args.len() >= 2 {
            match command::lookup_subcommand(spec, &args[1]) {
                Some(sub) => spec = sub,
                None => {
                    let text = format!(
                        "ERR unknown subcommand '{}'. Try {} HELP.",
                        String::from_utf8_lossy(&args[1][..args[1].len().min(128)]),
                        spec.name.to_ascii_uppercase()
                    );
                    self.error(out, &text);
                    return None;
                }
            }
        }
        if !spec.arity_ok(args.len()) {
            self.arity_error(out, spec);
            return None;
        }
        if !self.authenticated && !spec.has_flag("no_auth") {
            self.error(out, "NOAUTH Authentication required.");
            return None;
        }
        Some(spec)
    }

    /// A command while a transaction is open: `EXEC`, `DISCARD` and the connection's own commands run now; a
    /// command on keys (or `PING`, `ECHO`, `TIME`) is queued, answered `+QUEUED`, its operations and reply kept for
    /// `EXEC`; any other is refused, and `EXEC` will run nothing.
    fn queue(&mut self, spec: &'static CommandSpec, args: Vec<Vec<u8>>, out: &mut Vec<u8>) -> Flow {
        match spec.id {
            CommandId::Exec => return self.exec(out),
            CommandId::Discard => {
                self.multi = None;
                self.watched.clear();
                self.reply(out, |w| w.ok());
                return Flow::Continue;
            }
            CommandId::Multi => {
                self.error(out, "ERR MULTI calls can not be nested");
                return Flow::Continue;
            }
            CommandId::Watch => {
                self.error(out, "ERR WATCH inside MULTI is not allowed");
                return Flow::Continue;
            }
            CommandId::Quit | CommandId::Reset => return self.run(spec, args, out),
            _ => {}
        }
        let queueable = spec.first_key > 0
            || matches!(
                spec.id,
                CommandId::Ping | CommandId::Echo | CommandId::Time | CommandId::Unwatch
            );
        // As in Redis, an UNWATCH inside the transaction runs at EXEC, after the watched keys were checked: it
        // changes nothing but its `+OK` in the array.
        let unwatch = spec.id == CommandId::Unwatch;
        // The walks over every key (KEYS, SCAN, FLUSHDB, DBSIZE) and the connection's and server's commands run
        // outside transactions here.
        if !queueable {
            if let Some(t) = &mut self.multi {
                t.refused = true;
            }
            let text = format!(
                "ERR Command not allowed inside a transaction here: '{}'",
                spec.name
            );
            self.error(out, &text);
            return Flow::Continue;
        }
        let mut t = self.multi.take().unwrap_or_default();
        self.swap_transaction(&mut t);
        self.queuing = true;
        let flow = if unwatch {
            self.reply(out, |w| w.ok());
            Flow::Continue
        } else {
            self.run(spec, args, out)
        };
        self.queuing = false;
        self.swap_transaction(&mut t);
        self.multi = Some(t);
        self.reply(out, |w| w.simple(b"QUEUED"));
        flow
    }

    /// `WATCH`: reads the keys' values after everything sent before it, and keeps their digests for the next
    /// `EXEC`. A key watched twice keeps the digest of its first `WATCH`.
    fn watch(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        self.flush(out);
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for k in args.drain(1..) {
            if !keys.contains(&k) && !self.watched.iter().any(|(w, _)| *w == k) {
                keys.push(k);
            }
        }
        let read = self.run_ops(keys.iter().cloned().map(Op::Get).collect());
        match read {
            Ok(values) => {
                for (k, v) in keys.into_iter().zip(values) {
                    let Output::Value(v) = v else {
                        return self.error(out, "ERR the store answered GET without a value");
                    };
                    self.watched.push((k, dinomo_value::digest(v.as_deref())));
                }
                self.reply(out, |w| w.ok());
            }
            Err(e) => self.backend_error(out, &e),
        }
    }

    /// Swaps the connection's pipeline (operations, replies to make, stashed replies) with `t`'s.
    fn swap_transaction(&mut self, t: &mut Transaction) {
        std::mem::swap(&mut self.ops, &mut t.ops);
        std::mem::swap(&mut self.pending, &mut t.pending);
        std::mem::swap(&mut self.stash, &mut t.stash);
    }

    /// `EXEC`: makes the queued commands' operations, and the watched keys' checks, the connection's next batch,
    /// run as one transaction after everything the connection sent before it (a key's operations apply in order);
    /// its reply is the array of the commands' replies. Nothing more is handled until it completed.
    fn exec(&mut self, out: &mut Vec<u8>) -> Flow {
        let Some(mut t) = self.multi.take() else {
            self.error(out, "ERR EXEC without MULTI");
            return Flow::Continue;
        };
        let watched = std::mem::take(&mut self.watched);
        if t.refused {
            self.error(
                out,
                "EXECABORT Transaction discarded because of previous errors.",
            );
            return Flow::Continue;
        }
        // The watched keys' checks go after the commands' operations, whose results the replies index.
        t.ops
            .extend(watched.into_iter().map(|(k, d)| Op::Unchanged(k, d)));
        // The commands before EXEC run first, in a batch of their own, and their replies go out first.
        self.flush(out);
        self.ops = std::mem::take(&mut t.ops);
        self.pending.push(Pending::Exec(self.proto));
        self.running_txn = Some(Box::new(t));
        if self.ops.is_empty() {
            // Nothing to run: the replies are all made already.
            self.flush(out);
            return Flow::Continue;
        }
        Flow::Pause
    }

    /// `EXEC`'s reply from its transaction and the outcome of its batch.
    fn compose_exec(&mut self, proto: Protocol, out: &mut Vec<u8>) {
        let (Some(mut t), outcome) = (self.running_txn.take(), self.txn_outcome.take()) else {
            self.counts.errors += 1;
            return ReplyWriter::new(out, proto).err("EXEC's transaction went missing");
        };
        match outcome.unwrap_or(Ok(true)) {
            Ok(true) => {
                ReplyWriter::new(out, proto).array(t.pending.len());
                std::mem::swap(&mut self.stash, &mut t.stash);
                self.write_replies(&t.pending, out);
                std::mem::swap(&mut self.stash, &mut t.stash);
            }
            // A watched key changed: nothing ran, as in Redis.
            Ok(false) => ReplyWriter::new(out, proto).null_array(),
            Err(e) => {
                self.counts.errors += 1;
                let text = format!(
                    "ERR the transaction did not run, nothing was applied: {}",
                    error_text(&e).trim_start_matches("ERR ")
                );
                ReplyWriter::new(out, proto).error(text.as_bytes());
            }
        }
    }

    fn run(
        &mut self,
        spec: &'static CommandSpec,
        mut args: Vec<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Flow {
        match spec.id {
            CommandId::Get => {
                let key = take(&mut args, 1);
                self.defer(Deferred::Value { counts_hits: true }, [Op::Get(key)]);
            }
            CommandId::Set => self.set(args, out),
            CommandId::SetNx => {
                let (key, value) = (take(&mut args, 1), take(&mut args, 2));
                self.defer(Deferred::Flag, [Op::Insert(key, value)]);
            }
            CommandId::GetSet => {
                let (key, value) = (take(&mut args, 1), take(&mut args, 2));
                self.defer(
                    Deferred::Value { counts_hits: false },
                    [Op::GetSet(key, value)],
                );
            }
            CommandId::Del | CommandId::Unlink => {
                self.defer(Deferred::Count, args.drain(1..).map(Op::Delete));
            }
            CommandId::Exists => self.defer(Deferred::Count, args.drain(1..).map(Op::Exists)),
            CommandId::MGet => self.defer(Deferred::Values, args.drain(1..).map(Op::Get)),
            CommandId::MSet => {
                if args.len() % 2 == 0 {
                    self.arity_error(out, spec);
                } else {
                    let mut rest = args.drain(1..);
                    let mut ops = Vec::with_capacity(rest.len() / 2);
                    while let (Some(k), Some(v)) = (rest.next(), rest.next()) {
                        ops.push(Op::Set(k, v));
                    }
                    drop(rest);
                    self.defer(Deferred::AllOk, ops);
                }
            }
            CommandId::Incr | CommandId::Decr => {
                let delta = if spec.id == CommandId::Incr { 1 } else { -1 };
                let key = take(&mut args, 1);
                self.defer(Deferred::Int, [Op::Incr(key, delta)]);
            }
            CommandId::IncrBy | CommandId::DecrBy => match parse_i64(&args[2]) {
                None => self.error(out, "ERR value is not an integer or out of range"),
                Some(i64::MIN) if spec.id == CommandId::DecrBy => {
                    self.error(out, "ERR decrement would overflow")
                }
                Some(n) => {
                    let delta = if spec.id == CommandId::IncrBy { n } else { -n };
                    let key = take(&mut args, 1);
                    self.defer(Deferred::Int, [Op::Incr(key, delta)]);
                }
            },
            CommandId::Append => {
                let (key, value) = (take(&mut args, 1), take(&mut args, 2));
                self.defer(Deferred::Int, [Op::Append(key, value)]);
            }
            CommandId::Strlen => {
                let key = take(&mut args, 1);
                self.defer(Deferred::Int, [Op::Strlen(key)]);
            }
            CommandId::GetDel => {
                let key = take(&mut args, 1);
                self.defer(Deferred::Value { counts_hits: true }, [Op::Take(key)]);
            }
            CommandId::GetRange => match (parse_i64(&args[2]), parse_i64(&args[3])) {
                (Some(start), Some(end)) => {
                    let key = take(&mut args, 1);
                    self.defer(
                        Deferred::Value { counts_hits: false },
                        [Op::GetRange(key, start, end)],
                    );
                }
                _ => self.error(out, "ERR value is not an integer or out of range"),
            },
            CommandId::SetRange => self.set_range(args, out),
            CommandId::IncrByFloat => {
                if dinomo_value::parse_float(&args[2]).is_none() {
                    self.error(out, "ERR value is not a valid float");
                } else {
                    let (key, delta) = (take(&mut args, 1), take(&mut args, 2));
                    self.defer(
                        Deferred::Value { counts_hits: false },
                        [Op::IncrFloat(key, delta)],
                    );
                }
            }
            CommandId::GetEx => self.get_ex(args, out),
            CommandId::Ttl => {
                let key = take(&mut args, 1);
                self.defer(Deferred::NoExpiry, [Op::Exists(key)]);
            }
            // There is no expiry to remove, whether the key exists or not.
            CommandId::Persist => self.reply(out, |w| w.integer(0)),
            CommandId::Touch => self.defer(Deferred::Count, args.drain(1..).map(Op::Exists)),
            CommandId::Time => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                self.reply(out, |w| {
                    w.array(2);
                    w.bulk(now.as_secs().to_string().as_bytes());
                    w.bulk(now.subsec_micros().to_string().as_bytes());
                });
            }
            CommandId::FlushDb => self.flush_db(&args, out),
            CommandId::SetBit => match (self.bit_offset(&args[2]), parse_i64(&args[3])) {
                (None, _) => self.error(out, BAD_BIT_OFFSET),
                (Some(i), Some(bit @ (0 | 1))) => {
                    let key = take(&mut args, 1);
                    self.defer(Deferred::Int, [Op::SetBit(key, i, bit == 1)]);
                }
                (Some(_), _) => self.error(out, "ERR bit is not an integer or out of range"),
            },
            CommandId::GetBit => match self.bit_offset(&args[2]) {
                None => self.error(out, BAD_BIT_OFFSET),
                Some(i) => {
                    let key = take(&mut args, 1);
                    self.defer(Deferred::Int, [Op::GetBit(key, i)]);
                }
            },
            CommandId::BitCount => self.bit_count(args, out),
            CommandId::BitPos => self.bit_pos(args, out),
            CommandId::Multi => {
                self.multi = Some(Transaction::default());
                self.reply(out, |w| w.ok());
            }
            CommandId::Exec => self.error(out, "ERR EXEC without MULTI"),
            CommandId::Discard => self.error(out, "ERR DISCARD without MULTI"),
            CommandId::Watch => self.watch(args, out),
            CommandId::Unwatch => {
                self.watched.clear();
                self.reply(out, |w| w.ok());
            }
            CommandId::Reset => {
                self.multi = None;
                self.watched.clear();
                self.name = None;
                self.card.set_names(&self.name, &self.lib_name, &self.lib_ver);
                self.proto = Protocol::Resp2;
                self.authenticated = self.shared.config.requirepass.is_none();
                self.reply(out, |w| w.simple(b"RESET"));
            }
            CommandId::Ping => match args.len() {
                1 => self.reply(out, |w| w.simple(b"PONG")),
                2 => self.reply(out, |w| w.bulk(&args[1])),
                _ => self.arity_error(out, spec),
            },
            CommandId::Echo => self.reply(out, |w| w.bulk(&args[1])),
            CommandId::Select => match parse_i64(&args[1]) {
                Some(n) if i32::try_from(n).is_err() => {
                    self.error(out, "ERR value is not an integer or out of range")
                }
                None => self.error(out, "ERR value is not an integer or out of range"),
                Some(0) => self.reply(out, |w| w.ok()),
                Some(_) => self.error(out, "ERR DB index is out of range"),
            },
            CommandId::Quit => {
                self.reply(out, |w| w.ok());
                return Flow::Close;
            }
            CommandId::Auth => self.auth(&args, out),
            CommandId::Hello => self.hello(&args, out),
            CommandId::Info => self.info(&args, out),
            CommandId::DbSize => {
                self.flush(out);
                match self.conn.dbsize() {
                    Ok(n) => self.reply(out, |w| w.integer(n as i64)),
                    Err(e) => self.backend_error(out, &e),
                }
            }
            CommandId::Scan => self.scan(&args, out),
            CommandId::Keys => self.keys(&args[1], out),
            CommandId::Type => {
                let key = take(&mut args, 1);
                self.defer(Deferred::Type, [Op::Exists(key)]);
            }
            CommandId::ClientId => {
                let id = self.id as i64;
                self.reply(out, |w| w.integer(id));
            }
            CommandId::ClientGetName => {
                let name = self.name.clone();
                self.reply(out, |w| match &name {
                    Some(n) => w.bulk(n),
                    None => w.null(),
                });
            }
            CommandId::ClientSetName => {
                if self.set_name(&args[2], out) {
                    self.reply(out, |w| w.ok());
                }
            }
            CommandId::ClientSetInfo => self.set_info(&args, out),
            CommandId::ClientInfo => {
                let line = self.client_info();
                self.reply(out, |w| w.verbatim(b"txt", line.as_bytes()));
            }
            CommandId::Shutdown => return self.shutdown(&args, out),
            CommandId::ClientList => self.client_list(&args, out),
            CommandId::ClientKill => return self.client_kill(&args, out),
            CommandId::ClientHelp => self.help(
                out,
                "CLIENT",
                &[
                    "GETNAME",
                    "    Return the name of the current connection.",
                    "ID",
                    "    Return the ID of the current connection.",
                    "INFO",
                    "    Return information about the current client connection.",
                    "KILL <ip:port>",
                    "    Kill connection made from <ip:port>.",
                    "KILL <option> <value> [<option> <value> [...]]",
                    "    Kill connections. Options are: ID <client-id>, ADDR <ip:port>, LADDR <ip:port>,",
                    "    TYPE normal|master|replica|pubsub, USER <username>, SKIPME yes|no, MAXAGE <seconds>.",
                    "LIST [TYPE normal|master|replica|pubsub] [ID <client-id> [<client-id> ...]]",
                    "    Return information about client connections.",
                    "SETINFO <option> <value>",
                    "    Set client meta attr. Options are: LIB-NAME, LIB-VER.",
                    "SETNAME <name>",
                    "    Assign the name <name> to the current connection.",
                ],
            ),
            CommandId::Command => self.reply(out, |w| {
                w.array(command::commands().len());
                command::commands().iter().for_each(|c| c.write_info(w));
            }),
            CommandId::CommandCount => {
                self.reply(out, |w| w.integer(command::commands().len() as i64))
            }
            CommandId::CommandInfo => self.reply(out, |w| {
                if args.len() == 2 {
                    w.array(command::commands().len());
                    command::commands().iter().for_each(|c| c.write_info(w));
                } else {
                    w.array(args.len() - 2);
                    for name in &args[2..] {
                        match command::lookup_full(name) {
                            Some(c) => c.write_info(w),
                            None => w.null_array(),
                        }
                    }
                }
            }),
            CommandId::CommandDocs => self.reply(out, |w| {
                let found: Vec<&CommandSpec> = if args.len() == 2 {
                    command::commands().iter().collect()
                } else {
                    args[2..]
                        .iter()
                        .filter_map(|n| command::lookup_full(n))
                        .collect()
                };
                w.map(found.len());
                for c in found {
                    w.bulk(c.name.as_bytes());
                    c.write_docs(w);
                }
            }),
            CommandId::CommandList => self.reply(out, |w| {
                // Subcommands are listed too, as in Redis.
                let all: Vec<&CommandSpec> = command::commands()
                    .iter()
                    .flat_map(|c| std::iter::once(c).chain(c.subcommands))
                    .collect();
                w.array(all.len());
                all.iter().for_each(|c| w.bulk(c.name.as_bytes()));
            }),
            CommandId::CommandHelp => self.help(
                out,
                "COMMAND",
                &[
                    "(no subcommand)",
                    "    Return details about all commands.",
                    "COUNT",
                    "    Return the total number of commands in this server.",
                    "LIST",
                    "    Return a list of all commands in this server.",
                    "INFO [<command-name> ...]",
                    "    Return details about multiple commands.",
                    "DOCS [<command-name> ...]",
                    "    Return documentation details about multiple commands.",
                ],
            ),
            CommandId::ConfigGet => self.config_get(&args[2..], out),
            CommandId::ConfigHelp => self.help(
                out,
                "CONFIG",
                &[
                    "GET <pattern>",
                    "    Return parameters matching the glob-like <pattern> and their values.",
                    "Settings are fixed when the server starts; CONFIG SET is not supported.",
                ],
            ),
            CommandId::Client | CommandId::Config => self.arity_error(out, spec),
        }
        Flow::Continue
    }

    /// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]`, options parsed as Redis 7.0 does.
    fn set(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        #[derive(PartialEq, Clone, Copy)]
        enum Expiry {
            Ex,
            Px,
            ExAt,
            PxAt,
        }
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expiry: Option<(Expiry, usize)> = None;
        let mut i = 3;
        while i < args.len() {
            let opt = args[i].to_ascii_lowercase();
            let has_next = i + 1 < args.len();
            let kind = match opt.as_slice() {
                b"ex" => Some(Expiry::Ex),
                b"px" => Some(Expiry::Px),
                b"exat" => Some(Expiry::ExAt),
                b"pxat" => Some(Expiry::PxAt),
                _ => None,
            };
            match (opt.as_slice(), kind) {
                (b"nx", _) if !xx => nx = true,
                (b"xx", _) if !nx => xx = true,
                (b"get", _) => get = true,
                (b"keepttl", _) if expiry.is_none() => keepttl = true,
                (_, Some(k)) if !keepttl && has_next && expiry.is_none_or(|(e, _)| e == k) => {
                    expiry = Some((k, i + 1));
                    i += 1;
                }
                _ => return self.error(out, "ERR syntax error"),
            }
            i += 1;
        }
        if let Some((_, at)) = expiry {
            match parse_i64(&args[at]) {
                None => self.error(out, "ERR value is not an integer or out of range"),
                Some(n) if n <= 0 => self.error(out, "ERR invalid expire time in 'set' command"),
                Some(_) => self.error(out, NO_EXPIRY),
            }
            return;
        }
        let (key, value) = (take(&mut args, 1), take(&mut args, 2));
        match (nx, xx, get) {
            (false, false, false) => self.defer(Deferred::OkOrNull, [Op::Set(key, value)]),
            (true, _, false) => self.defer(Deferred::OkOrNull, [Op::Insert(key, value)]),
            (_, true, false) => self.defer(Deferred::OkOrNull, [Op::Update(key, value)]),
            (false, false, true) => self.defer(
                Deferred::Value { counts_hits: false },
                [Op::GetSet(key, value)],
            ),
            (true, _, true) => self.defer(
                Deferred::Value { counts_hits: false },
                [Op::InsertGet(key, value)],
            ),
            (_, true, true) => self.defer(
                Deferred::Value { counts_hits: false },
                [Op::UpdateGet(key, value)],
            ),
        }
    }

    /// `SETRANGE key offset value`, its offset and length checked as Redis checks them, against
    /// `proto-max-bulk-len` (the store then applies its own value limit).
    fn set_range(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let offset = match parse_i64(&args[2]) {
            None => return self.error(out, "ERR value is not an integer or out of range"),
            Some(n) if n < 0 => return self.error(out, "ERR offset is out of range"),
            Some(n) => n as u64,
        };
        let len = args[3].len() as u64;
        if len > 0 && offset.saturating_add(len) > self.shared.config.limits.max_bulk_len as u64 {
            return self.error(
                out,
                "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
            );
        }
        let (key, value) = (take(&mut args, 1), take(&mut args, 3));
        self.defer(Deferred::Int, [Op::SetRange(key, offset, value)]);
    }

    /// `GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST]`, options parsed as Redis 7.0 does. Without an expiry to
    /// set it is a `GET` (`PERSIST` has no expiry to remove); setting one is refused as for `SET`.
    fn get_ex(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let mut expiry: Option<usize> = None;
        let mut persist = false;
        let mut i = 2;
        while i < args.len() {
            let opt = args[i].to_ascii_lowercase();
            let has_next = i + 1 < args.len();
            match opt.as_slice() {
                b"ex" | b"px" | b"exat" | b"pxat" if has_next && expiry.is_none() && !persist => {
                    expiry = Some(i + 1);
                    i += 1;
                }
                b"persist" if expiry.is_none() && !persist => persist = true,
                _ => return self.error(out, "ERR syntax error"),
            }
            i += 1;
        }
        if let Some(at) = expiry {
            return match parse_i64(&args[at]) {
                None => self.error(out, "ERR value is not an integer or out of range"),
                Some(n) if n <= 0 => self.error(out, "ERR invalid expire time in 'getex' command"),
                Some(_) => self.error(out, NO_EXPIRY),
            };
        }
        let key = take(&mut args, 1);
        self.defer(Deferred::Value { counts_hits: true }, [Op::Get(key)]);
    }

    /// A bit offset as `SETBIT` and `GETBIT` take it: an integer from 0 to 8 × `proto-max-bulk-len` - 1.
    fn bit_offset(&self, arg: &[u8]) -> Option<u64> {
        let i = u64::try_from(parse_i64(arg)?).ok()?;
        ((i >> 3) < self.shared.config.limits.max_bulk_len as u64).then_some(i)
    }

    /// `BITCOUNT key [start end [BYTE|BIT]]`, its arguments checked before the key is looked up (as Redis 7.2 does;
    /// 7.0 answers 0 for a key without a value before it reads the range).
    fn bit_count(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let range = match &args[2..] {
            [] => None,
            [start, end, unit @ ..] if unit.len() <= 1 => {
                match (parse_i64(start), parse_i64(end), bit_unit(unit.first())) {
                    (Some(s), Some(e), Some(bits)) => Some((s, e, bits)),
                    (Some(_), Some(_), None) => return self.error(out, "ERR syntax error"),
                    _ => return self.error(out, "ERR value is not an integer or out of range"),
                }
            }
            _ => return self.error(out, "ERR syntax error"),
        };
        let key = take(&mut args, 1);
        self.defer(Deferred::Int, [Op::BitCount(key, range)]);
    }

    /// `BITPOS key bit [start [end [BYTE|BIT]]]`, its arguments checked before the key is looked up (as Redis 7.2
    /// does; 7.0 answers a key without a value before it reads the range).
    fn bit_pos(&mut self, mut args: Vec<Vec<u8>>, out: &mut Vec<u8>) {
        let bit = match parse_i64(&args[2]) {
            None => return self.error(out, "ERR value is not an integer or out of range"),
            Some(b @ (0 | 1)) => b == 1,
            Some(_) => return self.error(out, "ERR The bit argument must be 1 or 0."),
        };
        let range = match &args[3..] {
            [] => None,
            [start, rest @ ..] if rest.len() <= 2 => {
                let Some(start) = parse_i64(start) else {
                    return self.error(out, "ERR value is not an integer or out of range");
                };
                let Some(bits) = bit_unit(rest.get(1)) else {
                    return self.error(out, "ERR syntax error");
                };
                let end = match rest.first() {
                    None => None,
                    Some(end) => match parse_i64(end) {
                        Some(end) => Some(end),
                        None => {
                            return self.error(out, "ERR value is not an integer or out of range");
                        }
                    },
                };
                Some((start, end, bits))
            }
            _ => return self.error(out, "ERR syntax error"),
        };
        let key = take(&mut args, 1);
        self.defer(Deferred::Int, [Op::BitPos(key, bit, range)]);
    }

    /// `FLUSHDB` and `FLUSHALL` `[ASYNC|SYNC]`: a walk over every key (as `KEYS` makes), each named key deleted
    /// at its owner. Every key there when it starts and not written while it runs is gone when it replies; a key
    /// written meanwhile may stay. Both modes run to the end before the reply, as `SYNC` does in Redis.
    fn flush_db(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        match args {
            [_] => {}
            [_, mode]
                if mode.eq_ignore_ascii_case(b"async") || mode.eq_ignore_ascii_case(b"sync") => {}
            _ => return self.error(out, "ERR syntax error"),
        }
        self.flush(out);
        let walked = self.walk_keys(|s, named| {
            s.run_ops(named.into_iter().map(Op::Delete).collect())
                .map(drop)
                .map_err(|e| error_text(&e))
        });
        match walked {
            Ok(()) => self.reply(out, |w| w.ok()),
            Err(text) => self.error(out, &text),
        }
    }

    /// A whole walk over the store's keys, `KEYS_STEP` at a time, handing each step's keys to `step`; the error
    /// reply that ended it, if one did.
    fn walk_keys(
        &mut self,
        mut step: impl FnMut(&mut Self, Vec<Vec<u8>>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut cursor = 0;
        loop {
            let page = self
                .conn
                .scan(cursor, KEYS_STEP)
                .map_err(|e| error_text(&e))?;
            step(self, page.keys)?;
            cursor = page.cursor;
            if cursor == 0 {
                return Ok(());
            }
        }
    }

    /// Runs `ops` on the store together; their outputs in order, or the first error.
    fn run_ops(&mut self, mut ops: Vec<Op>) -> Result<Vec<Output>, BackendError> {
        let asked = ops.len();
        let mut results = Vec::with_capacity(asked);
        self.conn.execute(&mut ops, &mut results);
        if results.len() != asked {
            return Err(BackendError::Unavailable(
                "the store returned fewer results than operations".into(),
            ));
        }
        results.into_iter().collect()
    }

    fn auth(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        if args.len() > 3 {
            return self.error(out, "ERR syntax error");
        }
        let (user, pass) = if args.len() == 2 {
            if self.shared.config.requirepass.is_none() {
                return self.error(
                    out,
                    "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                );
            }
            (b"default".as_slice(), args[1].as_slice())
        } else {
            (args[1].as_slice(), args[2].as_slice())
        };
        if self.check_password(user, pass) {
            self.authenticated = true;
            self.reply(out, |w| w.ok());
        } else {
            self.error(
                out,
                "WRONGPASS invalid username-password pair or user is disabled.",
            );
        }
    }

    /// The `default` user is the only one; without `requirepass` it takes any password, as in Redis.
    fn check_password(&self, user: &[u8], pass: &[u8]) -> bool {
        if user != b"default" {
            return false;
        }
        match &self.shared.config.requirepass {
            None => true,
            Some(want) => constant_time_eq(want.as_bytes(), pass),
        }
    }

    fn hello(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let mut version = None;
        let mut next = 1;
        if args.len() >= 2 {
            match parse_i64(&args[1]) {
                None => {
                    return self.error(
                        out,
                        "ERR Protocol version is not an integer or out of range",
                    );
                }
                Some(v @ (2 | 3)) => version = Some(v),
                Some(_) => return self.error(out, "NOPROTO unsupported protocol version"),
            }
            next = 2;
        }
        let (mut credentials, mut name) = (None, None);
        let mut j = next;
        while j < args.len() {
            let more = args.len() - 1 - j;
            let opt = &args[j];
            if opt.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
                credentials = Some((&args[j + 1], &args[j + 2]));
                j += 3;
            } else if opt.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
                name = Some(&args[j + 1]);
                j += 2;
            } else {
                let text = format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(opt)
                );
                return self.error(out, &text);
            }
        }
        if let Some((user, pass)) = credentials {
            if !self.check_password(user, pass) {
                return self.error(
                    out,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                );
            }
            self.authenticated = true;
        }
        if !self.authenticated {
            return self.error(
                out,
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
        }
        if let Some(n) = name
            && !self.set_name(n, out)
        {
            return;
        }
        match version {
            Some(3) => self.proto = Protocol::Resp3,
            Some(_) => self.proto = Protocol::Resp2,
            None => {}
        }
        let (id, proto) = (self.id as i64, self.proto.version());
        self.reply(out, |w| {
            w.map(7);
            w.bulk(b"server");
            w.bulk(b"dinomo");
            w.bulk(b"version");
            w.bulk(REDIS_COMPAT_VERSION.as_bytes());
            w.bulk(b"proto");
            w.integer(proto);
            w.bulk(b"id");
            w.integer(id);
            w.bulk(b"mode");
            w.bulk(b"standalone");
            w.bulk(b"role");
            w.bulk(b"master");
            w.bulk(b"modules");
            w.array(0);
        });
    }

    /// Sets (or, with an empty name, clears) the connection's name; replies with the error and returns false
    /// when the name is not allowed.
    fn set_name(&mut self, name: &[u8], out: &mut Vec<u8>) -> bool {
        if !name.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
            self.error(
                out,
                "ERR Client names cannot contain spaces, newlines or special characters.",
            );
            return false;
        }
        self.name = (!name.is_empty()).then(|| name.to_vec());
        self.card
            .set_names(&self.name, &self.lib_name, &self.lib_ver);
        true
    }

    /// `CLIENT SETINFO LIB-NAME|LIB-VER value` (Redis 7.2; client libraries send it while connecting).
    fn set_info(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let (attr, value) = (&args[2], &args[3]);
        let is_name = attr.eq_ignore_ascii_case(b"lib-name");
        if !is_name && !attr.eq_ignore_ascii_case(b"lib-ver") {
            let text = format!(
                "ERR Unrecognized option '{}'",
                String::from_utf8_lossy(attr)
            );
            return self.error(out, &text);
        }
        if !value.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
            let text = format!(
                "ERR {} cannot contain spaces, newlines or special characters.",
                String::from_utf8_lossy(attr).to_ascii_lowercase()
            );
            return self.error(out, &text);
        }
        let v = (!value.is_empty()).then(|| value.clone());
        if is_name {
            self.lib_name = v;
        } else {
            self.lib_ver = v;
        }
        self.card
            .set_names(&self.name, &self.lib_name, &self.lib_ver);
        self.reply(out, |w| w.ok());
    }

    /// Brings this connection's card up to date (the command now running, the protocol) and returns its
    /// `CLIENT INFO` line.
    fn client_info(&mut self) -> String {
        self.publish_card();
        self.card.line()
    }

    /// `CLIENT LIST [TYPE normal|master|replica|pubsub] [ID id ...]`: every client here is a normal one.
    fn client_list(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let mut ids: Option<Vec<u64>> = None;
        let mut normal = true;
        let mut rest = &args[2..];
        while let [option, tail @ ..] = rest {
            if option.eq_ignore_ascii_case(b"type") && !tail.is_empty() {
                match is_normal_client_type(&tail[0]) {
                    Ok(is_normal) => normal &= is_normal,
                    Err(text) => return self.error(out, &text),
                }
                rest = &tail[1..];
            } else if option.eq_ignore_ascii_case(b"id") && !tail.is_empty() {
                let mut listed = Vec::new();
                for id in tail {
                    match parse_i64(id) {
                        Some(n) if n > 0 => listed.push(n as u64),
                        _ => return self.error(out, "ERR Invalid client ID"),
                    }
                }
                ids = Some(listed);
                rest = &[];
            } else {
                return self.error(out, "ERR syntax error");
            }
        }
        self.publish_card();
        let text = if normal {
            self.shared
                .clients
                .list(|id| ids.as_ref().is_none_or(|ids| ids.contains(&id)))
        } else {
            String::new()
        };
        self.reply(out, |w| w.verbatim(b"txt", text.as_bytes()));
    }

    /// `CLIENT KILL ip:port` (the old form: `+OK`, or an error when no client has that address) and `CLIENT KILL
    /// <filter> <value> ...` (`ID`, `ADDR`, `LADDR`, `TYPE`, `USER`, `SKIPME`, `MAXAGE`: the number of clients
    /// closed). A killed connection's socket is shut down, and its own event loop drops it; this connection, if
    /// named, closes after its reply.
    fn client_kill(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) -> Flow {
        if args.len() == 3 {
            let filter = KillFilter {
                addr: Some(args[2].clone()),
                ..KillFilter::default()
            };
            let killed = self.shared.clients.kill(&filter);
            if killed.is_empty() {
                self.error(out, "ERR No such client");
                return Flow::Continue;
            }
            self.reply(out, |w| w.ok());
            return self.closes_if_named(&killed);
        }
        let mut filter = KillFilter {
            skip: Some(self.id),
            ..KillFilter::default()
        };
        for pair in args[2..].chunks(2) {
            let [name, value] = pair else {
                self.error(out, "ERR syntax error");
                return Flow::Continue;
            };
            let name = name.to_ascii_lowercase();
            match name.as_slice() {
                b"id" => match parse_i64(value) {
                    Some(n) if n > 0 => filter.id = Some(n as u64),
                    _ => {
                        self.error(out, "ERR client-id should be greater than 0");
                        return Flow::Continue;
                    }
                },
                b"addr" => filter.addr = Some(value.clone()),
                b"laddr" => filter.laddr = Some(value.clone()),
                b"maxage" => match parse_i64(value) {
                    Some(n) if n >= 0 => filter.max_age = Some(n as u64),
                    _ => {
                        self.error(out, "ERR value is not an integer or out of range");
                        return Flow::Continue;
                    }
                },
                b"type" => match is_normal_client_type(value) {
                    Ok(is_normal) => filter.none |= !is_normal,
                    Err(text) => {
                        self.error(out, &text);
                        return Flow::Continue;
                    }
                },
                b"user" => filter.none |= value.as_slice() != b"default",
                b"skipme" => match value.to_ascii_lowercase().as_slice() {
                    b"yes" => filter.skip = Some(self.id),
                    b"no" => filter.skip = None,
                    _ => {
                        self.error(out, "ERR syntax error");
                        return Flow::Continue;
                    }
                },
                _ => {
                    self.error(out, "ERR syntax error");
                    return Flow::Continue;
                }
            }
        }
        let killed = self.shared.clients.kill(&filter);
        let n = killed.len() as i64;
        self.reply(out, |w| w.integer(n));
        self.closes_if_named(&killed)
    }

    /// `SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE] [ABORT]`: stops the serving process through its hook, and closes this
    /// connection without a reply, as Redis does. Every acknowledged write is already in the memory node's pool,
    /// so `SAVE` and `NOSAVE` change nothing, and no shutdown waits to be aborted.
    fn shutdown(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) -> Flow {
        let (mut save, mut nosave, mut abort) = (false, false, false);
        for option in &args[1..] {
            match option.to_ascii_lowercase().as_slice() {
                b"save" => save = true,
                b"nosave" => nosave = true,
                b"now" | b"force" => {}
                b"abort" => abort = true,
                _ => {
                    self.error(out, "ERR syntax error");
                    return Flow::Continue;
                }
            }
        }
        if (save && nosave) || (abort && args.len() > 2) {
            self.error(out, "ERR syntax error");
            return Flow::Continue;
        }
        if abort {
            self.error(out, "ERR No shutdown in progress.");
            return Flow::Continue;
        }
        let Some(hook) = self.shared.config.shutdown.clone() else {
            self.error(
                out,
                "ERR SHUTDOWN is not enabled in this server (stop the process that serves it)",
            );
            return Flow::Continue;
        };
        // What was asked before goes out first; then the connection closes without a reply of its own.
        self.flush(out);
        tracing::warn!(client = self.id, "SHUTDOWN asked by a client; stopping");
        hook.run();
        Flow::Close
    }

    /// Closes this connection after its replies when a `CLIENT KILL` named it.
    fn closes_if_named(&mut self, killed: &[u64]) -> Flow {
        if killed.contains(&self.id) {
            Flow::Close
        } else {
            Flow::Continue
        }
    }

    fn help(&mut self, out: &mut Vec<u8>, container: &str, lines: &[&str]) {
        let head = format!("{container} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:");
        self.reply(out, |w| {
            w.array(lines.len() + 3);
            w.simple(head.as_bytes());
            for l in lines {
                w.simple(l.as_bytes());
            }
            w.simple(b"HELP");
            w.simple(b"    Prints this help.");
        });
    }

    /// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`: one step of the store's walk over its keys, less
    /// the keys that do not match and those no longer there.
    fn scan(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        let Some(cursor) = parse_cursor(&args[1]) else {
            return self.error(out, "ERR invalid cursor");
        };
        let mut pattern = None;
        let mut count = DEFAULT_SCAN_COUNT;
        let mut strings = true;
        for option in args[2..].chunks(2) {
            let [name, value] = option else {
                return self.error(out, "ERR syntax error");
            };
            if name.eq_ignore_ascii_case(b"match") {
                pattern = Some(Pattern::new(value));
            } else if name.eq_ignore_ascii_case(b"count") {
                match parse_i64(value) {
                    None => return self.error(out, "ERR value is not an integer or out of range"),
                    Some(n) if n < 1 => return self.error(out, "ERR syntax error"),
                    Some(n) => count = u32::try_from(n).unwrap_or(u32::MAX),
                }
            } else if name.eq_ignore_ascii_case(b"type") {
                // Every value here is a string; another type has no keys.
                let known = ["string", "list", "set", "zset", "hash", "stream"];
                if !known
                    .iter()
                    .any(|t| value.eq_ignore_ascii_case(t.as_bytes()))
                {
                    let text =
                        format!("ERR unknown type name '{}'", String::from_utf8_lossy(value));
                    return self.error(out, &text);
                }
                strings = value.eq_ignore_ascii_case(b"string");
            } else {
                return self.error(out, "ERR syntax error");
            }
        }
        self.flush(out);
        let page = match self.conn.scan(cursor, count) {
            Ok(page) => page,
            Err(e) => return self.backend_error(out, &e),
        };
        let keys = if strings {
            self.present(page.keys, pattern.as_ref())
        } else {
            Ok(Vec::new())
        };
        match keys {
            Ok(keys) => self.reply(out, |w| {
                w.array(2);
                w.bulk(page.cursor.to_string().as_bytes());
                w.array(keys.len());
                keys.iter().for_each(|k| w.bulk(k));
            }),
            Err(e) => self.backend_error(out, &e),
        }
    }

    /// `KEYS pattern`: a whole walk over the keys, at most [`ServerConfig::max_keys_reply`] of them.
    fn keys(&mut self, pattern: &[u8], out: &mut Vec<u8>) {
        let pattern = Pattern::new(pattern);
        let limit = self.shared.config.max_keys_reply;
        self.flush(out);
        let mut found: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        let walked = self.walk_keys(|s, mut named| {
            // A key may be named by two steps of one walk: it is asked about once.
            named.retain(|k| !found.contains(k));
            found.extend(s.present(named, Some(&pattern)).map_err(|e| error_text(&e))?);
            if found.len() > limit {
                return Err(format!(
                    "ERR KEYS matches more than {limit} keys (the server's max_keys_reply); use SCAN"
                ));
            }
            Ok(())
        });
        match walked {
            Ok(()) => self.reply(out, |w| {
                w.array(found.len());
                found.iter().for_each(|k| w.bulk(k));
            }),
            Err(text) => self.error(out, &text),
        }
    }

    /// The keys of `named` that match `pattern` and have a value now, asked of the store together.
    fn present(
        &mut self,
        named: Vec<Vec<u8>>,
        pattern: Option<&Pattern>,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let candidates: Vec<Vec<u8>> = named
            .into_iter()
            .filter(|k| pattern.is_none_or(|p| p.matches(k)))
            .collect();
        if candidates.is_empty() {
            return Ok(candidates);
        }
        let outputs = self.run_ops(candidates.iter().cloned().map(Op::Exists).collect())?;
        Ok(candidates
            .into_iter()
            .zip(outputs)
            .filter_map(|(key, there)| (there == Output::Applied(true)).then_some(key))
            .collect())
    }

    /// `CONFIG GET pattern...`: the settings that exist here, plus what redis-benchmark and client libraries
    /// ask about at start (`save`: dinomo takes no snapshots, `appendonly`: it keeps no append-only file; every
    /// write is logged in the memory node's pool instead).
    fn config_get(&mut self, patterns: &[Vec<u8>], out: &mut Vec<u8>) {
        let c = &self.shared.config;
        let params: Vec<(&str, String)> = vec![
            ("save", String::new()),
            ("appendonly", "no".into()),
            ("databases", "1".into()),
            ("maxclients", c.max_clients.to_string()),
            ("timeout", c.idle_timeout.as_secs().to_string()),
            ("proto-max-bulk-len", c.limits.max_bulk_len.to_string()),
            (
                "client-query-buffer-limit",
                c.limits.max_request_bytes.to_string(),
            ),
            (
                "protected-mode",
                if c.protected_mode { "yes" } else { "no" }.into(),
            ),
            ("requirepass", c.requirepass.clone().unwrap_or_default()),
            ("port", self.shared.port.to_string()),
            ("bind", c.listen.ip().to_string()),
        ];
        // A parameter named without wildcards is answered under the name as given, as Redis does.
        let globs: Vec<Pattern> = patterns.iter().map(|p| Pattern::ignoring_case(p)).collect();
        let mut found: Vec<(&[u8], &str)> = Vec::new();
        for (name, value) in &params {
            let as_named = patterns.iter().find(|p| {
                !p.iter().any(|b| b"*?[\\".contains(b)) && p.eq_ignore_ascii_case(name.as_bytes())
            });
            if let Some(p) = as_named {
                found.push((p, value));
            } else if globs.iter().any(|g| g.matches(name.as_bytes())) {
                found.push((name.as_bytes(), value));
            }
        }
        self.reply(out, |w| {
            w.map(found.len());
            for (name, value) in found {
                w.bulk(name);
                w.bulk(value.as_bytes());
            }
        });
    }

    fn info(&mut self, args: &[Vec<u8>], out: &mut Vec<u8>) {
        const ALL: [&str; 5] = ["server", "clients", "stats", "fabric", "keyspace"];
        let wanted: Vec<&str> = if args.len() == 1 {
            ALL.to_vec()
        } else {
            let asked: Vec<Vec<u8>> = args[1..].iter().map(|a| a.to_ascii_lowercase()).collect();
            let everything = asked
                .iter()
                .any(|a| matches!(a.as_slice(), b"all" | b"everything" | b"default"));
            ALL.iter()
                .copied()
                .filter(|s| everything || asked.iter().any(|a| a == s.as_bytes()))
                .collect()
        };
        let keys = if wanted.contains(&"keyspace") {
            self.flush(out);
            match self.conn.dbsize() {
                Ok(n) => n,
                Err(e) => return self.backend_error(out, &e),
            }
        } else {
            0
        };
        let fabric = if wanted.contains(&"fabric") {
            self.flush(out);
            self.conn.fabric_counts()
        } else {
            None
        };
        // The counters of this connection's earlier commands are published first, so INFO counts them.
        self.publish_counts();
        let s = &self.shared;
        let k = &s.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut sections = Vec::new();
        for section in wanted {
            let body = match section {
                "server" => {
                    let up = s.started.elapsed().as_secs();
                    format!(
                        "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\ndinomo_version:{}\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:{}\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{up}\r\nuptime_in_days:{}\r\n",
                        env!("CARGO_PKG_VERSION"),
                        std::env::consts::OS,
                        std::env::consts::ARCH,
                        usize::BITS,
                        std::process::id(),
                        s.run_id,
                        s.port,
                        up / 86400,
                    )
                }
                "clients" => format!(
                    "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:0\r\n",
                    k.connected_clients.load(Ordering::Relaxed),
                    s.config.max_clients
                ),
                "stats" => format!(
                    "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ntotal_net_input_bytes:{}\r\ntotal_net_output_bytes:{}\r\nrejected_connections:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_error_replies:{}\r\n",
                    load(&k.connections_received),
                    load(&k.commands_processed),
                    load(&k.net_input_bytes),
                    load(&k.net_output_bytes),
                    load(&k.rejected_connections),
                    load(&k.keyspace_hits),
                    load(&k.keyspace_misses),
                    load(&k.error_replies),
                ),
                // Only a store that counts its fabric traffic has the section.
                "fabric" => match fabric {
                    Some(f) => format!(
                        "# Fabric\r\nfabric_scope:process\r\nfabric_round_trips:{}\r\nfabric_bytes_out:{}\r\nfabric_bytes_in:{}\r\n",
                        f.round_trips, f.bytes_out, f.bytes_in
                    ),
                    None => continue,
                },
                _ => {
                    if keys > 0 {
                        format!("# Keyspace\r\ndb0:keys={keys},expires=0,avg_ttl=0\r\n")
                    } else {
                        "# Keyspace\r\n".to_string()
                    }
                }
            };
            sections.push(body);
        }
        let text = sections.join("\r\n");
        self.reply(out, |w| w.verbatim(b"txt", text.as_bytes()));
    }

    /// Starts the pending key operations without waiting for them; the next [`Session::flush`] completes them.
    pub(crate) fn start_ops(&mut self) {
        if !self.started && !self.ops.is_empty() {
            if self.running_txn.is_some() {
                self.conn.start_atomic(&mut self.ops);
            } else {
                self.conn.start(&mut self.ops);
            }
            self.started = true;
        }
    }

    /// Whether [`Session::flush`] can complete the started key operations without waiting for the store.
    pub(crate) fn ops_done(&mut self) -> bool {
        !self.started || self.conn.is_complete(&mut self.ops)
    }

    /// Runs the pending key operations (or completes the started ones) and writes every reply not written yet,
    /// in request order.
    pub(crate) fn flush(&mut self, out: &mut Vec<u8>) {
        if !self.pending.is_empty() {
            // Ops not started yet start here: a backend's start and finish run them as its execute would.
            self.start_ops();
            if std::mem::take(&mut self.started) {
                if self.running_txn.is_some() {
                    // EXEC's batch: the transaction's operations alone.
                    let outcome = self.conn.finish_atomic(&mut self.ops, &mut self.results);
                    self.txn_outcome = Some(outcome);
                } else {
                    self.conn.finish(&mut self.ops, &mut self.results);
                }
                self.ops.clear();
            }
            let pending = std::mem::take(&mut self.pending);
            self.write_replies(&pending, out);
            self.pending = pending;
            self.pending.clear();
            self.stash.clear();
            self.results.clear();
        }
        self.publish_counts();
    }

    /// Writes the replies of `pending`, in order: the stashed ones as they are, the others made from `self.results`.
    fn write_replies(&mut self, pending: &[Pending], out: &mut Vec<u8>) {
        for p in pending {
            match *p {
                Pending::Ready(start, end) => out.extend_from_slice(&self.stash[start..end]),
                Pending::Ops {
                    reply,
                    first,
                    count,
                    proto,
                } => self.compose(reply, first, count, proto, out),
                Pending::Exec(proto) => self.compose_exec(proto, out),
            }
        }
    }

    /// Writes the last command and the protocol version to the card, when they changed since last written (a lock
    /// taken only then, not on every flush).
    fn publish_card(&mut self) {
        let now = (self.last_command, self.proto.version());
        if now != self.on_card {
            self.card.ran(now.0, now.1);
            self.on_card = now;
        }
    }

    fn publish_counts(&mut self) {
        let c = std::mem::take(&mut self.counts);
        if c.commands > 0 {
            self.publish_card();
            self.shared
                .counters
                .commands_processed
                .fetch_add(c.commands, Ordering::Relaxed);
        }
        let k = &self.shared.counters;
        if c.hits > 0 {
            k.keyspace_hits.fetch_add(c.hits, Ordering::Relaxed);
        }
        if c.misses > 0 {
            k.keyspace_misses.fetch_add(c.misses, Ordering::Relaxed);
        }
        if c.errors > 0 {
            k.error_replies.fetch_add(c.errors, Ordering::Relaxed);
        }
    }

    /// Makes one reply from its ops' results.
    fn compose(
        &mut self,
        reply: Deferred,
        first: usize,
        count: usize,
        proto: Protocol,
        out: &mut Vec<u8>,
    ) {
        let mut w = ReplyWriter::new(out, proto);
        let Some(results) = self.results.get(first..first + count) else {
            self.counts.errors += 1;
            return w.err("the store returned fewer results than operations");
        };
        // A command of several keys fails as a whole when one of its keys failed (the others may have applied:
        // they are independent operations).
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            self.counts.errors += 1;
            return w.error(error_text(e).as_bytes());
        }
        let outputs = results.iter().filter_map(|r| r.as_ref().ok());
        let single = results.first().and_then(|r| r.as_ref().ok());
        let counts = &mut self.counts;
        match (reply, single) {
            (Deferred::Value { counts_hits }, Some(Output::Value(v))) => match v {
                Some(v) => {
                    counts.hits += u64::from(counts_hits);
                    w.bulk(v);
                }
                None => {
                    counts.misses += u64::from(counts_hits);
                    w.null();
                }
            },
            (Deferred::OkOrNull, Some(Output::Applied(true))) => w.ok(),
            (Deferred::OkOrNull, Some(Output::Applied(false))) => w.null(),
            (Deferred::Flag, Some(Output::Applied(a))) => w.integer(i64::from(*a)),
            (Deferred::Count, _) => {
                let n = outputs
                    .filter(|o| matches!(o, Output::Applied(true)))
                    .count();
                w.integer(n as i64);
            }
            (Deferred::Values, _) => {
                w.array(count);
                for o in outputs {
                    match o {
                        Output::Value(Some(v)) => {
                            counts.hits += 1;
                            w.bulk(v);
                        }
                        _ => {
                            counts.misses += 1;
                            w.null();
                        }
                    }
                }
            }
            (Deferred::AllOk, _) => w.ok(),
            (Deferred::Int, Some(Output::Int(n))) => w.integer(*n),
            (Deferred::Type, Some(Output::Applied(there))) => {
                w.simple(if *there { b"string" } else { b"none" })
            }
            (Deferred::NoExpiry, Some(Output::Applied(there))) => {
                w.integer(if *there { -1 } else { -2 })
            }
            (_, o) => {
                counts.errors += 1;
                w.err(&format!("the store answered with an unexpected {o:?}"));
            }
        }
    }

    /// Queues a command's key operations; its reply is made when they ran.
    fn defer(&mut self, reply: Deferred, ops: impl IntoIterator<Item = Op>) {
        let first = self.ops.len();
        self.ops.extend(ops);
        self.pending.push(Pending::Ops {
            reply,
            first,
            count: self.ops.len() - first,
            proto: self.proto,
        });
    }

    /// Writes a reply that needs no key operation: straight to `out`, or behind the pending ones.
    fn reply(&mut self, out: &mut Vec<u8>, f: impl FnOnce(&mut ReplyWriter<'_>)) {
        if self.pending.is_empty() && !self.queuing {
            f(&mut ReplyWriter::new(out, self.proto));
        } else {
            let start = self.stash.len();
            f(&mut ReplyWriter::new(&mut self.stash, self.proto));
            self.pending.push(Pending::Ready(start, self.stash.len()));
        }
    }

    fn error(&mut self, out: &mut Vec<u8>, text: &str) {
        self.error_bytes(out, text.as_bytes());
    }

    fn error_bytes(&mut self, out: &mut Vec<u8>, text: &[u8]) {
        self.counts.errors += 1;
        self.reply(out, |w| w.error(text));
    }

    fn backend_error(&mut self, out: &mut Vec<u8>, e: &BackendError) {
        self.error(out, &error_text(e));
    }

    fn arity_error(&mut self, out: &mut Vec<u8>, spec: &CommandSpec) {
        let text = format!("ERR wrong number of arguments for '{}' command", spec.name);
        self.error(out, &text);
    }
}

/// The error reply to a failed store operation: `-OOM` when the store is full (as Redis answers a write beyond
/// `maxmemory`), `-ERR` otherwise.
fn error_text(e: &BackendError) -> String {
    match e {
        BackendError::OutOfSpace(_) => format!("OOM {e}"),
        _ => format!("ERR {e}"),
    }
}

/// Whether a `CLIENT LIST`/`CLIENT KILL` `TYPE` names the kind of every client here (`normal`), or another kind
/// Redis has (`master`, `replica`, `slave`, `pubsub`); the error reply for any other.
fn is_normal_client_type(kind: &[u8]) -> Result<bool, String> {
    match kind.to_ascii_lowercase().as_slice() {
        b"normal" => Ok(true),
        b"master" | b"replica" | b"slave" | b"pubsub" => Ok(false),
        _ => Err(format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(kind)
        )),
    }
}

/// The unit of a `BITCOUNT` or `BITPOS` range: `Some(true)` for `BIT`, `Some(false)` for `BYTE` or none given,
/// `None` for anything else.
fn bit_unit(arg: Option<&Vec<u8>>) -> Option<bool> {
    match arg {
        None => Some(false),
        Some(a) if a.eq_ignore_ascii_case(b"byte") => Some(false),
        Some(a) if a.eq_ignore_ascii_case(b"bit") => Some(true),
        Some(_) => None,
    }
}

/// A `SCAN` cursor: an unsigned 64-bit decimal, as Redis reads it.
fn parse_cursor(arg: &[u8]) -> Option<u64> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
}

/// Moves argument `i` out (arity was checked, so it exists).
fn take(args: &mut [Vec<u8>], i: usize) -> Vec<u8> {
    std::mem::take(&mut args[i])
}

/// Redis's reply to an unknown command: the name and the first arguments, each cut at 128 bytes in all.
fn unknown_command(args: &[Vec<u8>]) -> Vec<u8> {
    let mut text = b"ERR unknown command '".to_vec();
    text.extend_from_slice(&args[0][..args[0].len().min(128)]);
    text.extend_from_slice(b"', with args beginning with: ");
    let mut listed = 0usize;
    for a in &args[1..] {
        if listed >= 128 {
            break;
        }
        let part = &a[..a.len().min(128 - listed)];
        text.push(b'\'');
        text.extend_from_slice(part);
        text.extend_from_slice(b"' ");
        listed += part.len() + 3;
    }
    text
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
