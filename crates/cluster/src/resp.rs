//! The Redis front door of a KV node: a [`dinomo_resp::RespServer`] whose backend runs the keys this node owns
//! on its own workers and forwards the others to their owners through the native client, so any plain Redis
//! client works against any node.
//!
//! A pipeline's operations on owned keys are queued at the workers together (writes then share group commits)
//! under the read side of [`NodeShared::queue_order`], so all of them meet the same ownership: operations on one
//! key are either all served here, in order, or all refused and then forwarded, in order. Operations on different
//! keys may complete in any order, as across the nodes of a Redis Cluster. Multi-key commands (`MGET`, `MSET`,
//! `DEL`, `EXISTS`) are one operation per key, so `MSET` of keys on several nodes is not atomic.
//!
//! A pipeline's operations on keys owned elsewhere are forwarded together: in waves that each hold the next
//! operation of every such key, sent at once (one round trip to each owner, not one per operation) and all
//! answered before the next wave, so a key's operations still apply in order. The first wave of every ready
//! connection of an event-loop thread is sent when the connection's operations start ([`LoopForwarder`]), so the
//! thread has all of them in flight at once instead of one connection's round trip after another's.
//!
//! A write whose outcome is unknown (the node lost the memory node or its lease mid-write, or a forwarded write
//! got no reply) is answered with an error, never with success.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use dinomo_fabric::{Connector, Endpoint};
use dinomo_kn::{Command, DataOp, KnError, Reply, ReplySink, Tagged};
use dinomo_resp::{Backend, BackendConn, BackendError, Op, OpResult, Output, Wake};

use crate::ClusterError;
use crate::client::{Client, ClientConfig, ClientError};
use crate::node::{NodeConfig, NodeShared};
use crate::pipeline::PipelinedClient;
use crate::wire::{RequestBody, ResponseBody};

/// How long a queued operation may take at this node's workers before it is reported as failed: beyond the
/// longest a worker waits for the memory node to merge (`KnConfig::merge_wait_timeout`, 10 s by default).
const WORKER_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The most native clients a node's RESP connections share for forwarding ([`NodeConfig::resp_forward_clients`]).
const MAX_FORWARD_CLIENTS: usize = 1024;

/// Starts the RESP server of a node.
pub(crate) fn start(
    listen: SocketAddr,
    config: &NodeConfig,
    shared: Arc<NodeShared>,
    connector: Connector,
    native_addr: String,
) -> Result<dinomo_resp::RespServer, ClusterError> {
    if !(1..=MAX_FORWARD_CLIENTS).contains(&config.resp_forward_clients) {
        return Err(ClusterError::Io(format!(
            "resp_forward_clients must be 1 to {MAX_FORWARD_CLIENTS}, not {}",
            config.resp_forward_clients
        )));
    }
    let backend = NodeBackend {
        shared,
        // The node's own native server answers routing requests: the forwarding clients start there.
        forward: ClientConfig {
            seeds: vec![native_addr],
            token: connector.config.cluster_token.clone().into(),
            ..ClientConfig::default()
        },
        connector,
        forwarders: Arc::new(
            (0..config.resp_forward_clients)
                .map(|_| Mutex::new(None))
                .collect(),
        ),
        next_forwarder: AtomicUsize::new(0),
        id: NEXT_BACKEND.fetch_add(1, Ordering::Relaxed),
        next_conn: AtomicU32::new(0),
        memory: Arc::new(Mutex::new(None)),
        worker_timeout: WORKER_REPLY_TIMEOUT.max(config.kn.merge_wait_timeout.saturating_mul(2)),
    };
    let server_config = dinomo_resp::ServerConfig {
        listen,
        name: format!("dinomo-kn{}-resp", config.node_id),
        ..config.resp.clone()
    };
    dinomo_resp::RespServer::start(server_config, backend)
        .map_err(|e| ClusterError::Io(e.to_string()))
}

/// Native clients shared by a node's RESP connections, each connected on first use.
type Forwarders = Arc<Vec<Mutex<Option<PipelinedClient>>>>;

/// Numbers the RESP backends of the process, so an event-loop thread's [`LoopForwarder`] is never taken for
/// another node's.
static NEXT_BACKEND: AtomicU64 = AtomicU64::new(0);

/// The forwarding client of one event-loop thread, shared by the connections it serves. A connection's
/// [`BackendConn::start`] submits its first wave of forwarded ops here without waiting; its
/// [`BackendConn::finish`] takes their completions, and keeps those of other connections that arrive meanwhile
/// for their own `finish` (which the same thread runs, in the same loop iteration).
struct LoopForwarder {
    client: PipelinedClient,
    /// Completions of other connections' ops taken while one connection waited for its own.
    stash: HashMap<u32, Vec<Answer>>,
}

/// An op's index in its connection's batch, and its owner's answer.
type Answer = (usize, Result<ResponseBody, ClientError>);

thread_local! {
    /// This thread's forwarding client of each RESP backend it serves (by [`NodeBackend::id`]).
    static LOOP_FORWARDERS: RefCell<HashMap<u64, LoopForwarder>> = RefCell::new(HashMap::new());
}

struct NodeBackend {
    shared: Arc<NodeShared>,
    connector: Connector,
    forward: ClientConfig,
    forwarders: Forwarders,
    next_forwarder: AtomicUsize,
    /// Identity of this backend for the threads' [`LoopForwarder`]s.
    id: u64,
    /// Numbers the connections, whose forwarded ops share a [`LoopForwarder`].
    next_conn: AtomicU32,
    /// A fabric endpoint to the memory node for `DBSIZE`, shared by the connections, connected on first use.
    memory: Arc<Mutex<Option<Endpoint>>>,
    worker_timeout: Duration,
}

impl Backend for NodeBackend {
    type Conn = NodeConn;

    fn connect(&self, wake: Wake) -> NodeConn {
        let (replies_tx, replies_rx) = unbounded();
        NodeConn {
            sink: Arc::new(ConnSink {
                replies: replies_tx,
                wake,
            }),
            arrived: Vec::new(),
            arrived_now: 0,
            shared: self.shared.clone(),
            connector: self.connector.clone(),
            forward_config: self.forward.clone(),
            forwarders: self.forwarders.clone(),
            forwarder: self.next_forwarder.fetch_add(1, Ordering::Relaxed) % self.forwarders.len(),
            backend: self.id,
            conn: self.next_conn.fetch_add(1, Ordering::Relaxed),
            sent_ahead: Vec::new(),
            ahead_waiting: 0,
            ahead_refused: Vec::new(),
            sent_at: Instant::now(),
            worker_timeout: self.worker_timeout,
            local_deadline: Instant::now(),
            replies_rx,
            batch: 0,
            memory: self.memory.clone(),
            local: Vec::new(),
            remote: Vec::new(),
            answered: Vec::new(),
            early: Vec::new(),
            queued: 0,
            started: false,
        }
    }
}

/// Where the workers answer a RESP connection's operations: its channel, then a ring of its event loop.
struct ConnSink {
    replies: Sender<Tagged>,
    wake: Wake,
}

impl ReplySink for ConnSink {
    fn deliver(&self, tag: u64, reply: Result<Reply, KnError>) -> bool {
        if self.replies.send((tag, reply)).is_err() {
            return false;
        }
        self.wake.wake();
        true
    }
}

/// One RESP connection's way to the cluster.
struct NodeConn {
    shared: Arc<NodeShared>,
    connector: Connector,
    forward_config: ClientConfig,
    worker_timeout: Duration,
    /// When the ops queued at the workers are reported failed if some are still unanswered.
    local_deadline: Instant,
    sink: Arc<ConnSink>,
    replies_rx: Receiver<Tagged>,
    /// Replies taken from `replies_rx` by [`BackendConn::is_complete`], for [`NodeConn::collect_local`]; of them,
    /// the ones of the current batch.
    arrived: Vec<Tagged>,
    arrived_now: usize,
    /// Numbers batches, so a late reply of an earlier batch that timed out is never taken for a current one.
    batch: u32,
    forwarders: Forwarders,
    /// The forwarding client this connection tries first.
    forwarder: usize,
    /// The backend and this connection, for the thread's [`LoopForwarder`].
    backend: u64,
    conn: u32,
    /// The ops of the started batch forwarded through the thread's [`LoopForwarder`] (the first wave), and when.
    sent_ahead: Vec<usize>,
    /// Of those, the ops in the forwarding client with no answer taken yet, and the ones it refused at once.
    ahead_waiting: usize,
    ahead_refused: Vec<Answer>,
    sent_at: Instant,
    memory: Arc<Mutex<Option<Endpoint>>>,
    local: Vec<usize>,
    remote: Vec<usize>,
    answered: Vec<bool>,
    /// Ops of the started batch the workers refused at once, with why.
    early: Vec<(usize, BackendError)>,
    /// Ops of the started batch queued at the workers and not answered yet.
    queued: usize,
    /// A batch was started ([`BackendConn::start`]) and awaits [`BackendConn::finish`].
    started: bool,
}

/// The batch a worker reply's tag names (see [`NodeConn::submit_local`]).
fn batch_of(tag: u64) -> u32 {
    (tag >> 32) as u32
}

/// The store's operation for `op`, its key and value moved out: `op` keeps only its kind, which is all its result
/// needs.
fn take_data_op(op: &mut Op) -> DataOp {
    use std::mem::take;
    match op {
        Op::Get(k) => DataOp::Get(take(k)),
        // Probes: the KV path answers without the value, so none crosses a thread or the network.
        Op::Exists(k) => DataOp::Exists(take(k)),
        Op::Strlen(k) => DataOp::Strlen(take(k)),
        Op::Set(k, v) => DataOp::Set(take(k), take(v)),
        Op::Insert(k, v) => DataOp::Insert(take(k), take(v)),
        Op::Update(k, v) => DataOp::Update(take(k), take(v)),
        Op::GetSet(k, v) => DataOp::GetSet(take(k), take(v)),
        Op::Delete(k) => DataOp::Delete(take(k)),
        Op::Incr(k, d) => DataOp::Incr(take(k), *d),
        Op::Append(k, v) => DataOp::Append(take(k), take(v)),
    }
}

/// The inverse of [`take_data_op`]: the op again, from a store operation the workers handed back.
fn op_of(op: DataOp) -> Op {
    match op {
        DataOp::Get(k) => Op::Get(k),
        DataOp::Exists(k) => Op::Exists(k),
        DataOp::Strlen(k) => Op::Strlen(k),
        DataOp::Set(k, v) => Op::Set(k, v),
        DataOp::Insert(k, v) => Op::Insert(k, v),
        DataOp::Update(k, v) => Op::Update(k, v),
        DataOp::GetSet(k, v) => Op::GetSet(k, v),
        DataOp::Delete(k) => Op::Delete(k),
        DataOp::Incr(k, d) => Op::Incr(k, d),
        DataOp::Append(k, v) => Op::Append(k, v),
    }
}

/// The result of `op` from the store's answer, which must be of the kind `op` is answered with.
fn output(op: &Op, answer: Output) -> OpResult {
    match (op, answer) {
        (Op::Get(_) | Op::GetSet(..), value @ Output::Value(_)) => Ok(value),
        (
            Op::Exists(_) | Op::Set(..) | Op::Insert(..) | Op::Update(..) | Op::Delete(_),
            applied @ Output::Applied(_),
        ) => Ok(applied),
        (Op::Incr(..) | Op::Append(..) | Op::Strlen(_), int @ Output::Int(_)) => Ok(int),
        _ => Err(wrong_kind()),
    }
}

fn wrong_kind() -> BackendError {
    BackendError::Unavailable("the KV node answered with a reply of the wrong kind".into())
}

fn from_reply(op: &Op, r: Reply) -> OpResult {
    let answer = match r {
        Reply::Value(v) => Output::Value(v),
        Reply::Applied(a) => Output::Applied(a),
        Reply::Int(n) => Output::Int(n),
        Reply::Stats(_) | Reply::Epoch(_) => return Err(wrong_kind()),
    };
    output(op, answer)
}

fn from_kn_error(op: &Op, e: KnError) -> BackendError {
    match e {
        KnError::NotAnInteger => BackendError::NotAnInteger,
        KnError::IncrOverflow => BackendError::Overflow,
        KnError::KeyTooLarge { .. } | KnError::ValueTooLarge { .. } | KnError::Config(_) => {
            BackendError::Invalid(e.to_string())
        }
        KnError::OutOfSpace(_) => BackendError::OutOfSpace(e.to_string()),
        e if e.is_indeterminate() && op.is_write() => BackendError::Indeterminate(e.to_string()),
        e => BackendError::Unavailable(e.to_string()),
    }
}

fn from_client_error(e: ClientError) -> BackendError {
    match e {
        ClientError::Invalid(m) if m == KnError::NotAnInteger.to_string() => {
            BackendError::NotAnInteger
        }
        ClientError::Invalid(m) if m == KnError::IncrOverflow.to_string() => BackendError::Overflow,
        ClientError::Invalid(m) => BackendError::Invalid(m),
        ClientError::Indeterminate(m) => BackendError::Indeterminate(m),
        ClientError::Unavailable(m) => BackendError::Unavailable(m),
        ClientError::OutOfSpace(m) => BackendError::OutOfSpace(m),
    }
}

impl NodeConn {
    /// Splits `ops` by owner into `self.local` and `self.remote`.
    fn route(&mut self, ops: &[Op]) {
        self.local.clear();
        self.remote.clear();
        self.early.clear();
        let node = self.shared.id;
        let (local, remote) = (&mut self.local, &mut self.remote);
        self.shared.with_routing(|r| {
            for (i, op) in ops.iter().enumerate() {
                // Like the native client: writes at the primary owner, reads at any owner.
                let here = if op.is_write() {
                    r.ring.primary(op.key()) == Some(node)
                } else {
                    r.ring.is_owner(node, op.key())
                };
                if here {
                    local.push(i);
                } else {
                    remote.push(i);
                }
            }
        });
    }

    /// Queues the ops at `self.local` at this node's workers without waiting, moving each one's key and value
    /// into its request; [`NodeConn::collect_local`] takes their results.
    fn submit_local(&mut self, ops: &mut [Op]) {
        self.batch = self.batch.wrapping_add(1);
        let batch = self.batch;
        let tag = |i: usize| (u64::from(batch) << 32) | i as u64;
        self.queued = 0;
        self.arrived_now = 0;
        self.local_deadline = Instant::now() + self.worker_timeout;
        let _same_ownership = self.shared.queue_order.read().expect("queue order lock");
        for &i in &self.local {
            // An op this node turns out not to own comes back whole with its refusal and is forwarded then.
            let op = take_data_op(&mut ops[i]);
            match self
                .shared
                .submitter
                .submit_to(Command::Data(op), tag(i), self.sink.clone())
            {
                Ok(()) => self.queued += 1,
                Err(e) => self.early.push((i, from_kn_error(&ops[i], e))),
            }
        }
    }

    /// Takes the replies that arrived without waiting; whether every op queued at the workers is answered (or
    /// their time is up, and [`NodeConn::collect_local`] reports the rest failed).
    fn local_done(&mut self) -> bool {
        while self.arrived_now < self.queued {
            match self.replies_rx.try_recv() {
                Ok(t) => {
                    self.arrived_now += usize::from(batch_of(t.0) == self.batch);
                    self.arrived.push(t);
                }
                Err(_) => return Instant::now() >= self.local_deadline,
            }
        }
        true
    }

    /// Collects the results of the ops [`NodeConn::submit_local`] queued (waiting for them until their deadline);
    /// refused ones are put back in `ops` and join `self.remote`.
    fn collect_local(&mut self, ops: &mut [Op], results: &mut [OpResult]) {
        self.answered.clear();
        self.answered.resize(ops.len(), false);
        for (i, e) in self.early.drain(..) {
            self.answered[i] = true;
            results[i] = Err(e);
        }
        let mut arrived = std::mem::take(&mut self.arrived);
        for t in arrived.drain(..) {
            self.take_reply(t, ops, results);
        }
        self.arrived = arrived;
        while self.queued > 0 {
            match self.replies_rx.recv_deadline(self.local_deadline) {
                Ok(t) => self.take_reply(t, ops, results),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    self.queued = 0;
                    let why = format!(
                        "no reply from the KV node's worker within {:?}",
                        self.worker_timeout
                    );
                    for &i in &self.local {
                        if !self.answered[i] {
                            results[i] = Err(if ops[i].is_write() {
                                BackendError::Indeterminate(why.clone())
                            } else {
                                BackendError::Unavailable(why.clone())
                            });
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Takes one worker reply: the result of its op, or, for an op refused as not owned here, the op back for
    /// forwarding. Replies of an earlier batch (one that timed out) are dropped.
    fn take_reply(&mut self, (t, r): Tagged, ops: &mut [Op], results: &mut [OpResult]) {
        if batch_of(t) != self.batch {
            return;
        }
        let i = (t & u64::from(u32::MAX)) as usize;
        if i >= ops.len() || self.answered[i] {
            return;
        }
        self.answered[i] = true;
        self.queued -= 1;
        results[i] = match r {
            Ok(reply) => from_reply(&ops[i], reply),
            Err(KnError::NotOwner {
                refused: Some(op), ..
            }) => {
                ops[i] = op_of(*op);
                self.remote.push(i);
                return;
            }
            Err(e) => Err(from_kn_error(&ops[i], e)),
        };
    }

    /// Sends the ops at `self.remote` (sorted) to their owners through a shared client (a free one if there is,
    /// else this connection's own turn at its first choice), in waves (see [`waves`]): a wave's ops are sent
    /// together and all answered before the next wave is sent. Each op's key and value are moved into its request.
    fn run_remote(&mut self, ops: &mut [Op], results: &mut [OpResult]) {
        let n = self.forwarders.len();
        let free = (0..n).find_map(|k| self.forwarders[(self.forwarder + k) % n].try_lock().ok());
        let mut slot = match free {
            Some(slot) => slot,
            None => self.forwarders[self.forwarder]
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        };
        if slot.is_none() {
            match Client::connect(self.forward_config.clone()) {
                Ok(c) => *slot = Some(PipelinedClient::from_client(c)),
                Err(e) => {
                    let e = from_client_error(e);
                    for &i in &self.remote {
                        results[i] = Err(e.clone());
                    }
                    return;
                }
            }
        }
        let client = slot.as_mut().expect("connected above");
        if let [i] = self.remote[..] {
            // One op: the one-at-a-time client, without the pipeline's bookkeeping.
            let op = take_data_op(&mut ops[i]);
            results[i] = forwarded(&ops[i], client.client().request(RequestBody::Data(op)));
            return;
        }
        for wave in waves(ops, &self.remote) {
            let sent = Instant::now();
            for &i in &wave {
                if let Err(e) =
                    client.submit(i as u64, RequestBody::Data(take_data_op(&mut ops[i])))
                {
                    results[i] = Err(from_client_error(e));
                }
            }
            // Every submitted op completes by its deadline, so this ends.
            while let Some(c) = client.next_completion() {
                client.client().record_latency(sent.elapsed());
                let i = c.tag as usize;
                if let (Some(op), Some(r)) = (ops.get(i), results.get_mut(i)) {
                    *r = forwarded(op, c.result);
                }
            }
        }
    }
}

/// The result of `op` from its owner's answer.
fn forwarded(op: &Op, answer: Result<ResponseBody, ClientError>) -> OpResult {
    match answer {
        Ok(ResponseBody::Value(v)) => output(op, Output::Value(v)),
        Ok(ResponseBody::Applied(a)) => output(op, Output::Applied(a)),
        Ok(ResponseBody::Int(n)) => output(op, Output::Int(n)),
        Ok(other) => Err(BackendError::Unavailable(format!(
            "unexpected reply from the owner: {other:?}"
        ))),
        Err(e) => Err(from_client_error(e)),
    }
}

/// The ops at `remote` (in order) in waves: each op goes in the wave after the one holding the previous op on its
/// key, so a wave has at most one op per key, and a key's ops are in successive waves in their order. Most
/// pipelines touch each key once and make one wave.
fn waves(ops: &[Op], remote: &[usize]) -> Vec<Vec<usize>> {
    let mut waves: Vec<Vec<usize>> = Vec::new();
    let mut next: HashMap<&[u8], usize> = HashMap::with_capacity(remote.len());
    for &i in remote {
        let w = next.entry(ops[i].key()).or_insert(0);
        if *w == waves.len() {
            waves.push(Vec::new());
        }
        waves[*w].push(i);
        *w += 1;
    }
    waves
}

impl NodeConn {
    /// Submits the first wave of `self.remote` to this thread's [`LoopForwarder`] without waiting, moving the ops
    /// to `self.sent_ahead`; the rest stay in `self.remote` for [`NodeConn::run_remote`] after the first wave is
    /// answered. Nothing is sent when the forwarding client cannot connect: `run_remote` reports why.
    fn send_ahead(&mut self, ops: &mut [Op]) {
        // Most batches forward one op, or touch each key once: one wave, found without the map `waves` builds.
        let first = match self.remote[..] {
            [] => return,
            [i] => vec![i],
            _ => waves(ops, &self.remote).swap_remove(0),
        };
        let conn = self.conn;
        let tag = |i: usize| (u64::from(conn) << 32) | i as u64;
        let (refused, waiting) = (&mut self.ahead_refused, &mut self.ahead_waiting);
        let sent = LOOP_FORWARDERS.with(|forwarders| {
            let mut forwarders = forwarders.borrow_mut();
            let f = match forwarders.entry(self.backend) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    match Client::connect(self.forward_config.clone()) {
                        Ok(c) => e.insert(LoopForwarder {
                            client: PipelinedClient::from_client(c),
                            stash: HashMap::new(),
                        }),
                        Err(_) => return false,
                    }
                }
            };
            for &i in &first {
                match f
                    .client
                    .submit(tag(i), RequestBody::Data(take_data_op(&mut ops[i])))
                {
                    Ok(()) => *waiting += 1,
                    Err(e) => refused.push((i, Err(e))),
                }
            }
            true
        });
        if sent {
            if first.len() == self.remote.len() {
                self.remote.clear();
            } else {
                // A pipeline may hold many ops: a mask, not a search of the wave per op.
                let mut ahead = vec![false; ops.len()];
                for &i in &first {
                    ahead[i] = true;
                }
                self.remote.retain(|&i| !ahead[i]);
            }
            self.sent_ahead = first;
            self.sent_at = Instant::now();
        }
    }

    /// Takes the answers of `self.sent_ahead` from this thread's [`LoopForwarder`], keeping other connections'
    /// answers that come first for them.
    fn collect_ahead(&mut self, ops: &[Op], results: &mut [OpResult]) {
        let conn = self.conn;
        let mut answers = std::mem::take(&mut self.ahead_refused);
        LOOP_FORWARDERS.with(|forwarders| {
            let mut forwarders = forwarders.borrow_mut();
            let Some(f) = forwarders.get_mut(&self.backend) else {
                return;
            };
            // Answers another connection took while it waited for its own.
            if let Some(taken) = f.stash.remove(&conn) {
                self.ahead_waiting = self.ahead_waiting.saturating_sub(taken.len());
                answers.extend(taken);
            }
            // Every submitted op completes by its deadline, so this ends.
            while self.ahead_waiting > 0 {
                let Some(c) = f.client.next_completion() else {
                    break;
                };
                let (owner, i) = ((c.tag >> 32) as u32, (c.tag & u64::from(u32::MAX)) as usize);
                if owner == conn {
                    self.ahead_waiting -= 1;
                    f.client.client().record_latency(self.sent_at.elapsed());
                    answers.push((i, c.result));
                } else {
                    f.stash.entry(owner).or_default().push((i, c.result));
                }
            }
        });
        for (i, r) in answers {
            if let (Some(op), Some(slot)) = (ops.get(i), results.get_mut(i)) {
                *slot = forwarded(op, r);
            }
        }
        if self.ahead_waiting > 0 {
            // Not expected: the client lost track of an op. Said, never left as a blank error.
            self.ahead_waiting = 0;
            for &i in &self.sent_ahead {
                if matches!(&results[i], Err(BackendError::Unavailable(m)) if m.is_empty()) {
                    results[i] = Err(if ops[i].is_write() {
                        BackendError::Indeterminate("the forwarding client lost the request".into())
                    } else {
                        BackendError::Unavailable("the forwarding client lost the request".into())
                    });
                }
            }
        }
        self.sent_ahead.clear();
    }
}

impl BackendConn for NodeConn {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.finish(ops, results);
    }

    /// Only the operations queued at this node's workers ring the connection's event loop. Forwarded ones ring
    /// nothing: a batch with some is finished (waiting for their owners) as soon as the loop looks at it, which
    /// it does once every ready connection's first wave is sent, so their round trips overlap.
    fn is_complete(&mut self) -> bool {
        !self.started
            || !self.remote.is_empty()
            || !self.sent_ahead.is_empty()
            || self.local.is_empty()
            || self.local_done()
    }

    fn start(&mut self, ops: &mut Vec<Op>) {
        self.route(ops);
        if !self.local.is_empty() {
            self.submit_local(ops);
        }
        if !self.remote.is_empty() {
            self.send_ahead(ops);
        }
        self.started = true;
    }

    fn finish(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        if !self.started {
            self.start(ops);
        }
        self.started = false;
        // Every op is local or remote, and each path writes the result of every op it holds: the placeholder is
        // always overwritten, so it carries no message (an empty `String` allocates nothing, unlike a text per op).
        results.clear();
        results.resize_with(ops.len(), || Err(BackendError::Unavailable(String::new())));
        if !self.local.is_empty() {
            self.collect_local(ops, results);
        }
        if !self.sent_ahead.is_empty() {
            self.collect_ahead(ops, results);
        }
        if !self.remote.is_empty() {
            // Refused ops joined the list after the ones routed away at once; each key's ops keep their order.
            self.remote.sort_unstable();
            self.run_remote(ops, results);
        }
        ops.clear();
    }

    /// Every thread of this process: its KV nodes' workers, and the background work (heartbeats, leases, routing
    /// refreshes; with `dinomo up`, every node of the cluster).
    fn fabric_counts(&mut self) -> Option<dinomo_resp::FabricCounts> {
        Some(process_fabric_counts())
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        if memory.is_none() {
            *memory = Some(self.connector.connect().map_err(|e| {
                BackendError::Unavailable(format!("cannot reach the memory node: {e}"))
            })?);
        }
        let ep = memory.as_mut().expect("connected above");
        match ep.call::<_, dinomo_dpm::proto::KeyCount>(dinomo_dpm::proto::COUNT_KEYS, &()) {
            Ok(c) => Ok(c.keys),
            Err(e) => {
                *memory = None;
                Err(BackendError::Unavailable(format!(
                    "the memory node did not count the keys: {e}"
                )))
            }
        }
    }
}

/// This process's fabric traffic (every thread, background work included), for a Redis front door's
/// `INFO fabric`: the DINOMO nodes' and the pDPM baselines' alike.
pub fn process_fabric_counts() -> dinomo_resp::FabricCounts {
    let c = dinomo_fabric::counters::global_snapshot();
    dinomo_resp::FabricCounts {
        round_trips: c.round_trips,
        bytes_out: c.bytes_out,
        bytes_in: c.bytes_in,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_fabric::FabricError;

    #[test]
    fn failures_map_to_what_a_client_may_conclude() {
        let set = Op::Set(b"k".to_vec(), b"v".to_vec());
        let get = Op::Get(b"k".to_vec());
        let lost = || KnError::Fabric(FabricError::Disconnected("cut".into()));
        assert!(matches!(
            from_kn_error(&set, lost()),
            BackendError::Indeterminate(_)
        ));
        assert!(matches!(
            from_kn_error(&set, KnError::Fenced),
            BackendError::Indeterminate(_)
        ));
        // A read changes nothing, so a lost one is just unavailable.
        assert!(matches!(
            from_kn_error(&get, lost()),
            BackendError::Unavailable(_)
        ));
        assert!(matches!(
            from_kn_error(&set, KnError::Stopped),
            BackendError::Unavailable(_)
        ));
        assert_eq!(
            from_kn_error(&set, KnError::NotAnInteger),
            BackendError::NotAnInteger
        );
        assert!(matches!(
            from_kn_error(&set, KnError::ValueTooLarge { len: 2, max: 1 }),
            BackendError::Invalid(_)
        ));
        assert!(matches!(
            from_client_error(ClientError::Indeterminate("sent, no reply".into())),
            BackendError::Indeterminate(_)
        ));
        assert_eq!(
            from_client_error(ClientError::Invalid(KnError::NotAnInteger.to_string())),
            BackendError::NotAnInteger
        );
        assert_eq!(
            from_client_error(ClientError::Invalid(KnError::IncrOverflow.to_string())),
            BackendError::Overflow
        );
        assert_eq!(
            from_kn_error(&set, KnError::IncrOverflow),
            BackendError::Overflow
        );
        assert!(matches!(
            from_client_error(ClientError::Unavailable("down".into())),
            BackendError::Unavailable(_)
        ));
    }

    #[test]
    fn an_op_handed_back_is_the_op_again() {
        let (k, v) = (|| b"k".to_vec(), || b"v".to_vec());
        for op in [
            Op::Get(k()),
            Op::Exists(k()),
            Op::Strlen(k()),
            Op::Set(k(), v()),
            Op::Insert(k(), v()),
            Op::Update(k(), v()),
            Op::GetSet(k(), v()),
            Op::Delete(k()),
            Op::Incr(k(), -3),
            Op::Append(k(), v()),
        ] {
            let mut taken = op.clone();
            let data = take_data_op(&mut taken);
            assert_eq!(taken.is_write(), op.is_write(), "the kind stays behind");
            assert_eq!(op_of(data), op);
        }
    }

    #[test]
    fn forwarded_ops_go_in_waves_of_distinct_keys_in_order() {
        let get = |k: &str| Op::Get(k.as_bytes().to_vec());
        let set = |k: &str| Op::Set(k.as_bytes().to_vec(), b"v".to_vec());
        let ops = [
            set("a"),
            get("b"),
            get("local"),
            get("a"),
            set("c"),
            set("a"),
            get("c"),
        ];
        // Index 2 was served here; the others go, each key's ops in later and later waves.
        let remote = [0, 1, 3, 4, 5, 6];
        assert_eq!(
            waves(&ops, &remote),
            vec![vec![0, 1, 4], vec![3, 6], vec![5]]
        );
        // Distinct keys: one wave, one round trip to each owner.
        assert_eq!(waves(&ops, &[0, 1, 4]), vec![vec![0, 1, 4]]);
        assert!(waves(&ops, &[]).is_empty());
    }

    #[test]
    fn replies_map_by_operation() {
        let exists = Op::Exists(b"k".to_vec());
        assert_eq!(
            from_reply(&exists, Reply::Applied(true)),
            Ok(Output::Applied(true))
        );
        // A probe answered with the value would mean the value crossed over after all.
        assert!(from_reply(&exists, Reply::Value(Some(b"v".to_vec()))).is_err());
        let strlen = Op::Strlen(b"k".to_vec());
        assert_eq!(from_reply(&strlen, Reply::Int(3)), Ok(Output::Int(3)));
        assert!(matches!(take_data_op(&mut strlen.clone()), DataOp::Strlen(k) if k == b"k"));
        assert_eq!(
            from_reply(&Op::Incr(b"k".to_vec(), 1), Reply::Int(5)),
            Ok(Output::Int(5))
        );
        assert!(from_reply(&Op::Incr(b"k".to_vec(), 1), Reply::Applied(true)).is_err());
        assert!(matches!(take_data_op(&mut exists.clone()), DataOp::Exists(k) if k == b"k"));
    }
}
