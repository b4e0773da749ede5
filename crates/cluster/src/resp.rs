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
//! A pipeline's operations on keys owned elsewhere are forwarded together, from the node's forwarding threads
//! ([`crate::forward`]), so the event loop goes on serving other connections while an owner answers: in waves that
//! each hold the next operation of every such key, sent at once (one round trip to each owner, not one per
//! operation) and all answered before the next wave, so a key's operations still apply in order. Operations the
//! workers refuse (the key moved away meanwhile) are forwarded the same way once every local one is answered.
//!
//! A write whose outcome is unknown (the node lost the memory node or its lease mid-write, or a forwarded write
//! got no reply) is answered with an error, never with success.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use dinomo_kn::{Command, DataOp, KnError, Reply, ReplySink};
use dinomo_resp::{Backend, BackendConn, BackendError, Op, OpResult, Output, Wake};
use dinomo_ring::NodeId;

use crate::ClusterError;
use crate::client::{ClientConfig, ClientError};
use crate::forward::{Answer, ForwardJob, ForwardLane, Forwarding};
use crate::node::{NodeConfig, NodeShared, Peers};
use crate::wire::ResponseBody;

/// How long a batch's operations may take, at this node's workers and at their owners, before those unanswered are
/// reported as failed: beyond the longest a worker waits for the memory node to merge
/// (`KnConfig::merge_wait_timeout`, 10 s by default) and the forwarding client's deadline per operation (5 s).
const WORKER_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts the RESP server of a node; its forwarding clients present the cluster `token`.
pub(crate) fn start(
    listen: SocketAddr,
    config: &NodeConfig,
    shared: Arc<NodeShared>,
    peers: Option<Arc<Peers>>,
    token: &str,
    native_addr: String,
) -> Result<dinomo_resp::RespServer, ClusterError> {
    let name = format!("dinomo-kn{}-resp", config.node_id);
    let threads = match config.resp_forward_threads {
        0 => config.resp.event_loops(),
        n => n,
    };
    // The node's own native server answers routing requests: the forwarding clients start there.
    let forward = ClientConfig {
        seeds: vec![native_addr],
        token: token.into(),
        ..ClientConfig::default()
    };
    let backend = NodeBackend {
        shared,
        peers,
        // Thread names are cut at 15 bytes: "dinomo-kn1-fwd0" stays apart from the loops' "dinomo-kn1-resp".
        forwarding: Forwarding::start(
            threads,
            forward,
            &format!("dinomo-kn{}-fwd", config.node_id),
        )?,
        worker_timeout: WORKER_REPLY_TIMEOUT.max(config.kn.merge_wait_timeout.saturating_mul(2)),
        txn_wait: config.txn_wait,
    };
    let server_config = dinomo_resp::ServerConfig {
        listen,
        name,
        ..config.resp.clone()
    };
    dinomo_resp::RespServer::start(server_config, backend)
        .map_err(|e| ClusterError::Io(e.to_string()))
}

struct NodeBackend {
    shared: Arc<NodeShared>,
    /// The other nodes of this process, whose keys' operations are queued at their workers directly.
    peers: Option<Arc<Peers>>,
    /// The threads that forward the keys other nodes own; stopped with the server (which drops the backend).
    forwarding: Forwarding,
    worker_timeout: Duration,
    txn_wait: Duration,
}

impl Backend for NodeBackend {
    type Conn = NodeConn;

    fn connect(&self, wake: Wake) -> NodeConn {
        let (replies_tx, replies_rx) = unbounded();
        NodeConn {
            sink: Arc::new(ConnSink::new(replies_tx, wake)),
            replies: replies_rx,
            shared: self.shared.clone(),
            peers: self.peers.clone(),
            lane: self.forwarding.lane(),
            worker_timeout: self.worker_timeout,
            txn_wait: self.txn_wait,
            txn_end: None,
            deadline: Instant::now(),
            batch: 0,
            local: Vec::new(),
            at_peers: Vec::new(),
            remote: Vec::new(),
            peer_of: Vec::new(),
            refused: Vec::new(),
            results: Vec::new(),
            answered: Vec::new(),
            queued: 0,
            forwarding: 0,
            started: false,
        }
    }
}

/// Why a transaction did not run.
enum TxnEnd {
    /// A key it watched changed: `EXEC` answers null.
    Changed,
    /// It may not run, for this reason.
    NotRun(String),
}

/// What reaches a RESP connection from elsewhere: a worker's reply to one op, or the answers of a forwarded job.
pub(crate) enum Delivery {
    Worker(u64, Result<Reply, KnError>),
    Forwarded { batch: u32, answers: Vec<Answer> },
}

/// Where a RESP connection's operations are answered, by this node's workers and by its forwarding threads: the
/// connection's channel, then a ring of its event loop.
pub(crate) struct ConnSink {
    replies: Sender<Delivery>,
    wake: Wake,
}

impl ConnSink {
    /// A sink that sends to `replies` and rings `wake`.
    pub(crate) fn new(replies: Sender<Delivery>, wake: Wake) -> ConnSink {
        ConnSink { replies, wake }
    }

    fn send(&self, d: Delivery) -> bool {
        if self.replies.send(d).is_err() {
            return false;
        }
        self.wake.wake();
        true
    }

    /// The answers of a forwarded job of `batch`.
    pub(crate) fn forwarded(&self, batch: u32, answers: Vec<Answer>) {
        self.send(Delivery::Forwarded { batch, answers });
    }
}

impl ReplySink for ConnSink {
    fn deliver(&self, tag: u64, reply: Result<Reply, KnError>) -> bool {
        self.send(Delivery::Worker(tag, reply))
    }
}

/// One RESP connection's way to the cluster.
struct NodeConn {
    shared: Arc<NodeShared>,
    peers: Option<Arc<Peers>>,
    worker_timeout: Duration,
    /// How long a transaction's workers wait for each other (`NodeConfig::txn_wait`).
    txn_wait: Duration,
    /// Why the transaction running did not run, once known: refused before anything of it was queued, or as its
    /// workers reported.
    txn_end: Option<TxnEnd>,
    sink: Arc<ConnSink>,
    replies: Receiver<Delivery>,
    /// The forwarding thread this connection's forwarded ops go through.
    lane: ForwardLane,
    /// When the started batch's ops still unanswered are reported failed.
    deadline: Instant,
    /// Numbers batches, so a late answer of an earlier batch that timed out is never taken for a current one.
    batch: u32,
    /// The started batch's ops routed here, to another node of this process (with that node), and away.
    local: Vec<usize>,
    at_peers: Vec<(NodeId, usize)>,
    remote: Vec<usize>,
    /// Each owner [`NodeConn::route`] met in the batch, and that node if it runs in this process: looked up once
    /// per batch, so that all of a key's ops go one way; emptied once they are queued, so that a node that stops
    /// is not held alive by it.
    peer_of: Vec<(NodeId, Option<Arc<NodeShared>>)>,
    /// Ops the workers handed back (not owned here after all), forwarded once every local op is answered.
    refused: Vec<usize>,
    /// The started batch's results as they come, and which ops have one.
    results: Vec<OpResult>,
    answered: Vec<bool>,
    /// Ops queued at the workers and not answered yet.
    queued: usize,
    /// Forwarded jobs not answered yet.
    forwarding: usize,
    /// A batch was started ([`BackendConn::start`]) and awaits [`BackendConn::finish`].
    started: bool,
}

/// The batch a worker reply's tag names (see `NodeShared::queue_ops`).
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
        Op::Take(k) => DataOp::Take(take(k)),
        Op::GetRange(k, start, end) => DataOp::GetRange(take(k), *start, *end),
        Op::SetRange(k, offset, v) => DataOp::SetRange(take(k), *offset, take(v)),
        Op::IncrFloat(k, delta) => DataOp::IncrFloat(take(k), take(delta)),
        Op::InsertGet(k, v) => DataOp::InsertGet(take(k), take(v)),
        Op::UpdateGet(k, v) => DataOp::UpdateGet(take(k), take(v)),
        Op::SetBit(k, i, bit) => DataOp::SetBit(take(k), *i, *bit),
        Op::GetBit(k, i) => DataOp::GetBit(take(k), *i),
        Op::BitCount(k, range) => DataOp::BitCount(take(k), *range),
        Op::BitPos(k, bit, range) => DataOp::BitPos(take(k), *bit, *range),
        Op::Unchanged(k, digest) => DataOp::Unchanged(take(k), *digest),
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
        DataOp::Take(k) => Op::Take(k),
        DataOp::GetRange(k, start, end) => Op::GetRange(k, start, end),
        DataOp::SetRange(k, offset, v) => Op::SetRange(k, offset, v),
        DataOp::IncrFloat(k, delta) => Op::IncrFloat(k, delta),
        DataOp::InsertGet(k, v) => Op::InsertGet(k, v),
        DataOp::UpdateGet(k, v) => Op::UpdateGet(k, v),
        DataOp::SetBit(k, i, bit) => Op::SetBit(k, i, bit),
        DataOp::GetBit(k, i) => Op::GetBit(k, i),
        DataOp::BitCount(k, range) => Op::BitCount(k, range),
        DataOp::BitPos(k, bit, range) => Op::BitPos(k, bit, range),
        DataOp::Unchanged(k, digest) => Op::Unchanged(k, digest),
    }
}

/// The result of `op` from the store's answer, which must be of the kind `op` is answered with.
fn output(op: &Op, answer: Output) -> OpResult {
    match (op, answer) {
        (
            Op::Get(_)
            | Op::GetSet(..)
            | Op::Take(_)
            | Op::GetRange(..)
            | Op::IncrFloat(..)
            | Op::InsertGet(..)
            | Op::UpdateGet(..),
            value @ Output::Value(_),
        ) => Ok(value),
        (
            Op::Exists(_)
            | Op::Set(..)
            | Op::Insert(..)
            | Op::Update(..)
            | Op::Delete(_)
            | Op::Unchanged(..),
            applied @ Output::Applied(_),
        ) => Ok(applied),
        (
            Op::Incr(..)
            | Op::Append(..)
            | Op::Strlen(_)
            | Op::SetRange(..)
            | Op::SetBit(..)
            | Op::GetBit(..)
            | Op::BitCount(..)
            | Op::BitPos(..),
            int @ Output::Int(_),
        ) => Ok(int),
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
        KnError::KeyTooLarge { .. }
        | KnError::ValueTooLarge { .. }
        | KnError::NotAFloat
        | KnError::NotFinite
        | KnError::Config(_) => BackendError::Invalid(e.to_string()),
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
    /// Makes ready for a new batch of `ops` operations: a new batch number and deadline, nothing answered yet.
    fn begin_batch(&mut self, ops: usize) {
        self.batch = self.batch.wrapping_add(1);
        self.deadline = Instant::now() + self.worker_timeout;
        self.queued = 0;
        self.forwarding = 0;
        self.refused.clear();
        // Every op is answered by one path or another before the batch completes, or failed by `give_up`: the
        // placeholder is always overwritten, so it carries no message (an empty `String` allocates nothing).
        self.results.clear();
        self.results
            .resize_with(ops, || Err(BackendError::Unavailable(String::new())));
        self.answered.clear();
        self.answered.resize(ops, false);
    }

    /// Splits `ops` by owner into `self.local`, `self.at_peers` and `self.remote`.
    fn route(&mut self, ops: &[Op]) {
        self.local.clear();
        self.at_peers.clear();
        self.remote.clear();
        self.peer_of.clear();
        let node = self.shared.id;
        let (local, at_peers, remote) = (&mut self.local, &mut self.at_peers, &mut self.remote);
        let (peers, peer_of) = (self.peers.as_deref(), &mut self.peer_of);
        self.shared.with_routing(|r| {
            for (i, op) in ops.iter().enumerate() {
                // Every op on a key goes the same way, as the workers decide ownership: a shared key (one with a
                // cell) is served by any of its owners, reads and writes alike, and any other key by its primary
                // alone. Reads here and writes at the primary would let a read overtake a write sent before it.
                let key = op.key();
                let here = if r.cells.contains_key(key) {
                    r.ring.is_owner(node, key)
                } else {
                    r.ring.primary(key) == Some(node)
                };
                if here {
                    local.push(i);
                    continue;
                }
                match (peers, r.ring.primary(key)) {
                    (Some(peers), Some(owner)) if runs_here(peers, peer_of, owner) => {
                        at_peers.push((owner, i));
                    }
                    _ => remote.push(i),
                }
            }
        });
    }

    fn answer(&mut self, i: usize, r: OpResult) {
        self.results[i] = r;
        self.answered[i] = true;
    }

    /// Queues the ops at `self.local` at this node's workers without waiting; their replies come through the
    /// connection's channel. An op this node turns out not to own comes back whole with its refusal and is
    /// forwarded then.
    fn submit_local(&mut self, ops: &mut [Op]) {
        let queued = self.shared.queue_ops(
            ops,
            self.local.iter().copied(),
            self.batch,
            &self.sink,
            false,
            answer_into(&mut self.results, &mut self.answered),
        );
        self.queued += queued.unwrap_or(0);
    }

    /// Queues the ops at `self.at_peers` at their owners' workers, as [`Self::submit_local`] queues this node's.
    /// The ops of an owner that stopped meanwhile go to `self.remote`, to be forwarded.
    fn submit_to_peers(&mut self, ops: &mut [Op]) {
        let mut at_peers = std::mem::take(&mut self.at_peers);
        // Each owner's ops together, in batch order.
        at_peers.sort_unstable();
        for group in at_peers.chunk_by(|a, b| a.0 == b.0) {
            let owner = group[0].0;
            let queued = peer_in(&self.peer_of, owner).queue_ops(
                ops,
                group.iter().map(|&(_, i)| i),
                self.batch,
                &self.sink,
                true,
                answer_into(&mut self.results, &mut self.answered),
            );
            match queued {
                Some(n) => {
                    self.queued += n;
                    self.shared
                        .resp_ops_to_peers
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                None => self.remote.extend(group.iter().map(|&(_, i)| i)),
            }
        }
        // The ops left to forward, in batch order (a key's ops keep theirs).
        self.remote.sort_unstable();
        at_peers.clear();
        self.at_peers = at_peers;
        self.peer_of.clear();
    }

    /// Hands the ops at `at` (in batch order) to the connection's forwarding thread, moving each one's key and
    /// value into the job; the answers come through the connection's channel.
    fn forward(&mut self, ops: &mut [Op], at: &[usize]) {
        let waves = match at {
            // Most forwarded batches are one op: no grouping by key.
            [i] => vec![vec![(*i, take_data_op(&mut ops[*i]))]],
            _ => waves(ops, at)
                .into_iter()
                .map(|wave| {
                    wave.into_iter()
                        .map(|i| (i, take_data_op(&mut ops[i])))
                        .collect()
                })
                .collect(),
        };
        self.shared
            .resp_ops_forwarded
            .fetch_add(at.len() as u64, Ordering::Relaxed);
        let job = ForwardJob {
            waves,
            batch: self.batch,
            deadline: self.deadline,
            to: self.sink.clone(),
        };
        if self.lane.forward(job) {
            self.forwarding += 1;
        } else {
            for &i in at {
                self.answer(
                    i,
                    Err(BackendError::Unavailable(
                        "the node is stopping: not forwarded".into(),
                    )),
                );
            }
        }
    }

    /// Takes one delivery into the started batch's results: a worker's reply (an op refused as not owned here
    /// comes back whole and waits in `self.refused`), or a forwarded job's answers. Those of an earlier batch
    /// (one that timed out) are dropped.
    fn take(&mut self, d: Delivery, ops: &mut [Op]) {
        match d {
            Delivery::Worker(t, r) => {
                let i = (t & u64::from(u32::MAX)) as usize;
                if batch_of(t) != self.batch || i >= ops.len() || self.answered[i] {
                    return;
                }
                self.queued = self.queued.saturating_sub(1);
                let r = match r {
                    Ok(reply) => from_reply(&ops[i], reply),
                    Err(KnError::NotOwner {
                        refused: Some(op), ..
                    }) => {
                        ops[i] = op_of(*op);
                        self.refused.push(i);
                        return;
                    }
                    Err(KnError::TxnAborted(why)) => {
                        self.txn_end
                            .get_or_insert_with(|| TxnEnd::NotRun(why.clone()));
                        Err(from_kn_error(&ops[i], KnError::TxnAborted(why)))
                    }
                    Err(KnError::TxnChanged) => {
                        self.txn_end = Some(TxnEnd::Changed);
                        Err(from_kn_error(&ops[i], KnError::TxnChanged))
                    }
                    Err(e) => Err(from_kn_error(&ops[i], e)),
                };
                self.answer(i, r);
            }
            Delivery::Forwarded { batch, answers } => {
                if batch != self.batch {
                    return;
                }
                self.forwarding = self.forwarding.saturating_sub(1);
                for (i, r) in answers {
                    if let Some(op) = ops.get(i) {
                        let r = forwarded(op, r);
                        self.answer(i, r);
                    }
                }
            }
        }
    }

    /// Takes what arrived without waiting and moves the batch on; whether every op has its result (or the
    /// batch's time is up, and the unanswered ones are reported failed).
    fn progress(&mut self, ops: &mut [Op]) -> bool {
        while self.queued > 0 || self.forwarding > 0 {
            match self.replies.try_recv() {
                Ok(d) => self.take(d, ops),
                Err(_) => break,
            }
        }
        if self.queued == 0 && !self.refused.is_empty() {
            // Each key's ops keep their order: all of a key's local ops were refused together (see the module).
            let mut refused = std::mem::take(&mut self.refused);
            refused.sort_unstable();
            self.forward(ops, &refused);
            refused.clear();
            self.refused = refused;
        }
        if self.queued == 0 && self.forwarding == 0 {
            return true;
        }
        if Instant::now() >= self.deadline {
            self.give_up(ops);
            return true;
        }
        false
    }

    /// Reports every op without a result failed, its time up: a write as indeterminate (it may yet be applied),
    /// a read as unavailable.
    fn give_up(&mut self, ops: &[Op]) {
        let why = format!(
            "no reply from this node's workers or the key's owner within {:?}",
            self.worker_timeout
        );
        for (i, op) in ops.iter().enumerate() {
            if !self.answered[i] {
                let failed = if op.is_write() {
                    BackendError::Indeterminate(why.clone())
                } else {
                    BackendError::Unavailable(why.clone())
                };
                self.answer(i, Err(failed));
            }
        }
        self.queued = 0;
        self.forwarding = 0;
        self.refused.clear();
    }
}

/// Answers op `i` with `r` in a batch's `results` (the fields of [`NodeConn::answer`], for where `self` is
/// borrowed).
fn answer_into<'a>(
    results: &'a mut [OpResult],
    answered: &'a mut [bool],
) -> impl FnMut(usize, OpResult) + 'a {
    |i, r| {
        results[i] = r;
        answered[i] = true;
    }
}

/// The node `owner` of this process, as [`NodeConn::route`] looked it up for the batch (`runs_here`).
fn peer_in(seen: &[(NodeId, Option<Arc<NodeShared>>)], owner: NodeId) -> &Arc<NodeShared> {
    seen.iter()
        .find_map(|(id, p)| (*id == owner).then_some(p.as_ref()).flatten())
        .expect("route looked every owner in at_peers up")
}

/// Whether `owner` runs in this process, looked up in `peers` once per batch (`seen` keeps the answers).
fn runs_here(
    peers: &Peers,
    seen: &mut Vec<(NodeId, Option<Arc<NodeShared>>)>,
    owner: NodeId,
) -> bool {
    if let Some((_, p)) = seen.iter().find(|(id, _)| *id == owner) {
        return p.is_some();
    }
    let p = peers.get(owner);
    let here = p.is_some();
    seen.push((owner, p));
    here
}

impl NodeShared {
    /// Queues the ops at `at` (in batch order) at this node's workers without waiting, moving each one's key and
    /// value into its request, under the read side of `queue_order`, so that every op of a key meets the same
    /// ownership there; the replies come through `sink`, tagged with `batch` and the op's index. An op the workers
    /// cannot take is answered through `failed`. Returns how many were queued, or `None`, queuing nothing, when
    /// they come `from_peer` and the node closed to peers (it is stopping).
    fn queue_ops(
        &self,
        ops: &mut [Op],
        at: impl IntoIterator<Item = usize>,
        batch: u32,
        sink: &Arc<ConnSink>,
        from_peer: bool,
        mut failed: impl FnMut(usize, OpResult),
    ) -> Option<usize> {
        let _same_ownership = self.queue_order.read().expect("queue order lock");
        if from_peer && !self.open_to_peers.load(Ordering::Acquire) {
            return None;
        }
        let mut queued = 0;
        for i in at {
            let op = take_data_op(&mut ops[i]);
            let tag = (u64::from(batch) << 32) | i as u64;
            match self
                .submitter
                .submit_to(Command::Data(op), tag, sink.clone())
            {
                Ok(()) => queued += 1,
                Err(e) => failed(i, Err(from_kn_error(&ops[i], e))),
            }
        }
        Some(queued)
    }
}

/// Queues the ops at each node's indexes in `nodes` as one transaction at those nodes' workers, under the read side
/// of each node's `queue_order` (taken in node order), as `NodeShared::queue_ops` queues ops; each reply comes
/// through `sink`, tagged with `batch` and the op's index, and an op that could not be queued is answered through
/// `failed`. Returns how many replies will come through `sink`, or why nothing was queued (a peer is stopping).
fn queue_txn(
    nodes: &mut [(Arc<NodeShared>, Vec<usize>)],
    this: NodeId,
    ops: &mut [Op],
    batch: u32,
    sink: &Arc<ConnSink>,
    wait: Duration,
    mut failed: impl FnMut(usize, OpResult),
) -> Result<usize, String> {
    nodes.sort_unstable_by_key(|(n, _)| n.id);
    let _same_ownership: Vec<_> = nodes
        .iter()
        .map(|(n, _)| n.queue_order.read().expect("queue order lock"))
        .collect();
    if let Some((n, _)) = nodes
        .iter()
        .find(|(n, _)| n.id != this && !n.open_to_peers.load(Ordering::Acquire))
    {
        return Err(format!("KV node {} is stopping; retry", n.id));
    }
    let tag = |i: usize| (u64::from(batch) << 32) | i as u64;
    let mut groups = Vec::with_capacity(nodes.len());
    let mut total = 0;
    for (n, at) in nodes.iter() {
        let txn: dinomo_kn::TxnOps = at
            .iter()
            .map(|&i| (tag(i), take_data_op(&mut ops[i])))
            .collect();
        total += txn.len();
        groups.push((&n.submitter, txn));
    }
    let mut unqueued = 0;
    dinomo_kn::submit_txn(groups, wait, sink.clone(), |tag, e| {
        let i = (tag & u64::from(u32::MAX)) as usize;
        unqueued += 1;
        failed(i, Err(from_kn_error(&ops[i], e)));
    });
    Ok(total - unqueued)
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

impl BackendConn for NodeConn {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.finish(ops, results);
    }

    /// The workers and the forwarding threads both ring the connection's event loop as they answer.
    fn is_complete(&mut self, ops: &mut Vec<Op>) -> bool {
        !self.started || self.progress(ops)
    }

    fn start(&mut self, ops: &mut Vec<Op>) {
        self.begin_batch(ops.len());
        self.route(ops);
        if !self.local.is_empty() {
            self.submit_local(ops);
        }
        if !self.at_peers.is_empty() {
            self.submit_to_peers(ops);
        }
        if !self.remote.is_empty() {
            let remote = std::mem::take(&mut self.remote);
            self.forward(ops, &remote);
            self.remote = remote;
        }
        self.started = true;
    }

    fn execute_atomic(
        &mut self,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) -> Result<bool, BackendError> {
        self.start_atomic(ops);
        self.finish_atomic(ops, results)
    }

    /// The transaction's keys must all be owned by nodes of this process (this one or its peers): their workers
    /// run it (`dinomo_kn::submit_txn`). Keys of nodes in other processes are refused, nothing applied.
    fn start_atomic(&mut self, ops: &mut Vec<Op>) {
        self.begin_batch(ops.len());
        self.txn_end = None;
        self.route(ops);
        let mut nodes: Vec<(Arc<NodeShared>, Vec<usize>)> = Vec::new();
        if !self.local.is_empty() {
            nodes.push((self.shared.clone(), std::mem::take(&mut self.local)));
        }
        // Each owner's ops together, in batch order.
        self.at_peers.sort_unstable();
        for group in self.at_peers.chunk_by(|a, b| a.0 == b.0) {
            let peer = peer_in(&self.peer_of, group[0].0).clone();
            nodes.push((peer, group.iter().map(|&(_, i)| i).collect()));
        }
        let elsewhere = self.remote.len();
        self.at_peers.clear();
        self.remote.clear();
        self.peer_of.clear();
        if elsewhere > 0 {
            self.txn_end = Some(TxnEnd::NotRun(format!(
                "{elsewhere} of its {} operations are on keys of KV nodes in other processes; a transaction runs \
                 on the nodes of the process serving the connection",
                ops.len()
            )));
            return;
        }
        let queued = queue_txn(
            &mut nodes,
            self.shared.id,
            ops,
            self.batch,
            &self.sink,
            self.txn_wait,
            answer_into(&mut self.results, &mut self.answered),
        );
        match queued {
            Ok(n) => {
                self.queued += n;
                self.started = true;
            }
            Err(why) => self.txn_end = Some(TxnEnd::NotRun(why)),
        }
    }

    fn finish_atomic(
        &mut self,
        ops: &mut Vec<Op>,
        results: &mut Vec<OpResult>,
    ) -> Result<bool, BackendError> {
        // A transaction refused before anything was queued was never started: `finish` would start it as a
        // pipeline.
        if self.started {
            self.finish(ops, results);
        }
        let outcome = match self.txn_end.take() {
            None => return Ok(true),
            Some(TxnEnd::Changed) => Ok(false),
            Some(TxnEnd::NotRun(why)) => Err(BackendError::Unavailable(why)),
        };
        ops.clear();
        results.clear();
        outcome
    }

    fn finish(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        if !self.started {
            self.start(ops);
        }
        self.started = false;
        while !self.progress(ops) {
            match self.replies.recv_deadline(self.deadline) {
                Ok(d) => self.take(d, ops),
                // The connection holds a sender itself, so the channel never closes: only the time runs out.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    self.give_up(ops);
                    break;
                }
            }
        }
        std::mem::swap(results, &mut self.results);
        ops.clear();
    }

    /// Every thread of this process: its KV nodes' workers, and the background work (heartbeats, leases, routing
    /// refreshes; with `dinomo up`, every node of the cluster).
    fn fabric_counts(&mut self) -> Option<dinomo_resp::FabricCounts> {
        Some(process_fabric_counts())
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        let count: dinomo_dpm::proto::KeyCount = self
            .shared
            .memory
            .call(dinomo_dpm::proto::COUNT_KEYS, &())
            .map_err(|e| {
                BackendError::Unavailable(format!("the memory node did not count the keys: {e}"))
            })?;
        Ok(count.keys)
    }

    fn scan(&mut self, cursor: u64, count: u32) -> Result<dinomo_resp::KeysPage, BackendError> {
        let page = self.shared.scan_keys(cursor, count).map_err(|e| {
            BackendError::Unavailable(format!("the memory node did not list the keys: {e}"))
        })?;
        Ok(dinomo_resp::KeysPage {
            cursor: page.cursor,
            keys: page.keys,
        })
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
            Op::Take(k()),
            Op::GetRange(k(), -2, 7),
            Op::SetRange(k(), 3, v()),
            Op::IncrFloat(k(), b"0.5".to_vec()),
            Op::InsertGet(k(), v()),
            Op::UpdateGet(k(), v()),
            Op::SetBit(k(), 9, true),
            Op::GetBit(k(), 9),
            Op::BitCount(k(), Some((0, -1, true))),
            Op::BitPos(k(), false, Some((1, None, false))),
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
