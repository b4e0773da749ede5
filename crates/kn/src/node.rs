use std::sync::{Arc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};
use dinomo_fabric::Connector;
use dinomo_log::key_hash;

use crate::txn::TxnOps;
use crate::worker::{
    Command, DataOp, EpochStats, LeaseGate, Ownership, Reply, ReplySink, Request, Responder,
    Tagged, Worker, WorkerStats,
};
use crate::{KnConfig, KnError};

/// The worker thread that owns `key` among `threads` (jump consistent hashing: growing the thread count moves
/// only the keys the new thread takes).
pub fn thread_for_key(key: &[u8], threads: usize) -> usize {
    let mut k = key_hash(key);
    let (mut b, mut j) = (-1i64, 0i64);
    while j < threads as i64 {
        b = j;
        k = k.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((k >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

/// A running KV node: its worker threads and their queues.
pub struct KvNode {
    submitter: Submitter,
    threads: Vec<JoinHandle<()>>,
}

impl KvNode {
    /// Starts the worker threads; each connects through `connector`, claims its log (which the memory node merges
    /// first if a previous run left it unmerged) and then serves.
    pub fn start(config: KnConfig, connector: Connector) -> Result<KvNode, KnError> {
        KvNode::start_in_cluster(config, connector, None, None)
    }

    /// Like [`KvNode::start`], for a member of a cluster: the workers refuse keys `ownership` rejects (until a
    /// [`Command::Own`] replaces it) and stop serving once `lease` lapses.
    pub fn start_in_cluster(
        config: KnConfig,
        connector: Connector,
        ownership: Option<Arc<dyn Ownership>>,
        lease: Option<Arc<LeaseGate>>,
    ) -> Result<KvNode, KnError> {
        config.validate()?;
        let cfg = Arc::new(config);
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        let (ready_tx, ready_rx) = bounded::<Result<(), KnError>>(cfg.threads);
        for t in 0..cfg.threads {
            let (tx, rx): (Sender<Request>, Receiver<Request>) = bounded(cfg.queue_depth);
            let (cfg, connector, ready) = (cfg.clone(), connector.clone(), ready_tx.clone());
            let (ownership, lease) = (ownership.clone(), lease.clone());
            let handle = std::thread::Builder::new()
                .name(format!("dinomo-kn-{t}"))
                .spawn(
                    move || match Worker::start(cfg, t as u32, connector, ownership, lease) {
                        Ok(w) => {
                            let _ = ready.send(Ok(()));
                            w.run(rx);
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                        }
                    },
                )
                .map_err(|e| KnError::Config(format!("cannot start a worker thread: {e}")))?;
            senders.push(tx);
            threads.push(handle);
        }
        drop(ready_tx);
        let mut first_error = None;
        for _ in 0..cfg.threads {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(KnError::Stopped);
                }
            }
        }
        let node = KvNode {
            submitter: Submitter { senders },
            threads,
        };
        match first_error {
            None => Ok(node),
            Some(e) => {
                node.stop();
                Err(e)
            }
        }
    }

    /// A handle for issuing requests; each thread of the caller should use its own.
    pub fn handle(&self) -> KvHandle {
        KvHandle::new(self.submitter.clone())
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.submitter.threads()
    }

    /// A way to queue requests without waiting for their replies, which arrive tagged on a channel of the
    /// caller's choosing (for servers that keep many requests of one connection in flight).
    pub fn submitter(&self) -> Submitter {
        self.submitter.clone()
    }

    /// Stops the workers after they finish what is queued; handles still around get [`KnError::Stopped`].
    pub fn stop(self) {
        let (tx, _rx) = bounded(self.submitter.threads());
        let _ = self.submitter.broadcast(|| Command::Shutdown, 0, &tx);
        drop(self.submitter);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Queues requests to a [`KvNode`]'s workers without waiting; see [`KvNode::submitter`].
#[derive(Clone)]
pub struct Submitter {
    senders: Vec<Sender<Request>>,
}

/// Held while a transaction's parts are queued, so that any two transactions of this process meet their workers,
/// whichever nodes they belong to, in the same order (else each could hold one worker at its barrier waiting for
/// the other).
static TXN_ORDER: LazyLock<Mutex<()>> = LazyLock::new(|| Mutex::new(()));

/// Queues a transaction (`crate::txn`) over the workers of one or more nodes of this process: `nodes` gives each
/// node's submitter with its operations, each with the tag its reply carries, in transaction order. One part goes
/// to each worker owning some of the keys, the parts waiting up to `wait` for each other. Each op's reply goes to
/// `sink`. An op whose part could not be queued (its worker stopped) is answered through `failed` instead, and the
/// parts queued abort. Blocks while a worker's queue is full.
pub fn submit_txn(
    nodes: Vec<(&Submitter, TxnOps)>,
    wait: Duration,
    sink: Arc<dyn ReplySink>,
    mut failed: impl FnMut(u64, KnError),
) {
    let mut parts: Vec<(&Submitter, usize, TxnOps)> = Vec::new();
    for (submitter, ops) in nodes {
        for (tag, op) in ops {
            let thread = thread_for_key(op.key(), submitter.senders.len());
            // One part per worker, whatever handle on its node names it: two parts at one worker would wait at
            // the barrier for each other.
            match parts.iter_mut().find(|(s, t, _)| {
                *t == thread && s.senders[thread].same_channel(&submitter.senders[thread])
            }) {
                Some((_, _, part)) => part.push((tag, op)),
                None => parts.push((submitter, thread, vec![(tag, op)])),
            }
        }
    }
    let barrier = crate::txn::TxnBarrier::new(parts.len(), wait);
    let _in_order = TXN_ORDER.lock().unwrap_or_else(|p| p.into_inner());
    for (submitter, thread, ops) in parts {
        let part = crate::txn::TxnPart {
            barrier: barrier.clone(),
            ops,
        };
        if let Err(part) = submitter.queue_part(thread, part, &sink) {
            barrier.refuse(KnError::Stopped.to_string());
            for (tag, _) in part.ops {
                failed(tag, KnError::Stopped);
            }
        }
    }
}

impl Submitter {
    /// Queues `cmd` at the worker that owns its key (worker 0 for commands without a key); its reply arrives on
    /// `replies` tagged with `tag`. Blocks while that worker's queue is full (backpressure).
    pub fn submit(&self, cmd: Command, tag: u64, replies: &Sender<Tagged>) -> Result<(), KnError> {
        self.send_to(self.thread_of(&cmd), cmd, tag, replies)
    }

    /// Queues `cmd` at worker `thread` (numbered from 0); its reply arrives tagged with `tag`.
    pub fn send_to(
        &self,
        thread: usize,
        cmd: Command,
        tag: u64,
        replies: &Sender<Tagged>,
    ) -> Result<(), KnError> {
        self.queue(thread, cmd, Responder::channel(tag, replies.clone()))
    }

    /// Queues `cmd` at the worker that owns its key, like [`Submitter::submit`]; its reply goes to `sink`, tagged
    /// with `tag`.
    pub fn submit_to(
        &self,
        cmd: Command,
        tag: u64,
        sink: Arc<dyn ReplySink>,
    ) -> Result<(), KnError> {
        self.queue(self.thread_of(&cmd), cmd, Responder::sink(tag, sink))
    }

    /// The worker that serves `cmd`: the owner of its key, worker 0 for commands without one.
    fn thread_of(&self, cmd: &Command) -> usize {
        cmd.key()
            .map_or(0, |k| thread_for_key(k, self.senders.len()))
    }

    fn queue(&self, thread: usize, cmd: Command, reply: Responder) -> Result<(), KnError> {
        self.senders[thread]
            .send(Request { cmd, reply })
            .map_err(|_| KnError::Stopped)
    }

    /// Queues a transaction (`crate::txn`) of this node's keys: `ops`, each with the tag its reply carries, in
    /// transaction order; see [`submit_txn`].
    pub fn submit_txn(
        &self,
        ops: TxnOps,
        wait: Duration,
        sink: Arc<dyn ReplySink>,
        failed: impl FnMut(u64, KnError),
    ) {
        submit_txn(vec![(self, ops)], wait, sink, failed)
    }

    /// Queues `part` at worker `thread`; the part back if the worker stopped.
    fn queue_part(
        &self,
        thread: usize,
        part: crate::txn::TxnPart,
        sink: &Arc<dyn ReplySink>,
    ) -> Result<(), crate::txn::TxnPart> {
        let request = Request {
            cmd: Command::Txn(part),
            reply: Responder::sink(0, sink.clone()),
        };
        match self.senders[thread].send(request) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::SendError(Request {
                cmd: Command::Txn(part),
                ..
            })) => Err(part),
            Err(_) => unreachable!("a transaction's part comes back as it was sent"),
        }
    }

    /// Queues `make()` at every worker; the replies arrive tagged with `tag`, one per worker.
    pub fn broadcast(
        &self,
        make: impl Fn() -> Command,
        tag: u64,
        replies: &Sender<Tagged>,
    ) -> Result<(), KnError> {
        (0..self.senders.len()).try_for_each(|t| self.send_to(t, make(), tag, replies))
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.senders.len()
    }

    /// A handle that issues requests through this submitter and waits for their replies.
    pub fn handle(&self) -> KvHandle {
        KvHandle::new(self.clone())
    }
}

/// Issues requests to a [`KvNode`]'s workers and waits for their replies.
pub struct KvHandle {
    submitter: Submitter,
    reply_tx: Sender<Tagged>,
    reply_rx: Receiver<Tagged>,
}

impl Clone for KvHandle {
    fn clone(&self) -> Self {
        KvHandle::new(self.submitter.clone())
    }
}

impl KvHandle {
    fn new(submitter: Submitter) -> KvHandle {
        let (reply_tx, reply_rx) = bounded(1);
        KvHandle {
            submitter,
            reply_tx,
            reply_rx,
        }
    }

    fn call(&self, thread: usize, cmd: Command) -> Result<Reply, KnError> {
        self.submitter.send_to(thread, cmd, 0, &self.reply_tx)?;
        self.reply_rx.recv().map_err(|_| KnError::Stopped)?.1
    }

    /// Runs `op` at the worker that owns its key.
    pub fn data(&self, op: DataOp) -> Result<Reply, KnError> {
        self.submitter
            .submit(Command::Data(op), 0, &self.reply_tx)?;
        self.reply_rx.recv().map_err(|_| KnError::Stopped)?.1
    }

    /// The value of `key`, or `None`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        match self.data(DataOp::Get(key.to_vec()))? {
            Reply::Value(v) => Ok(v),
            _ => unreachable!("a GET is answered with a value"),
        }
    }

    /// Whether `key` has a value (the value is not copied out).
    pub fn exists(&self, key: &[u8]) -> Result<bool, KnError> {
        self.applied(DataOp::Exists(key.to_vec()))
    }

    /// The length of the value at `key` (absent = 0; the value is not copied out).
    pub fn strlen(&self, key: &[u8]) -> Result<u64, KnError> {
        match self.data(DataOp::Strlen(key.to_vec()))? {
            Reply::Int(n) => Ok(n as u64),
            _ => unreachable!("a STRLEN is answered with a length"),
        }
    }

    fn applied(&self, op: DataOp) -> Result<bool, KnError> {
        match self.data(op)? {
            Reply::Applied(a) => Ok(a),
            _ => unreachable!("a write is answered with whether it applied"),
        }
    }

    /// Sets `key` to `value` (insert or update); returns once the write is durable on the memory node.
    pub fn set(&self, key: &[u8], value: &[u8]) -> Result<(), KnError> {
        self.applied(DataOp::Set(key.to_vec(), value.to_vec()))
            .map(|_| ())
    }

    /// Sets `key` only when it is absent; returns whether it did.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<bool, KnError> {
        self.applied(DataOp::Insert(key.to_vec(), value.to_vec()))
    }

    /// Sets `key` only when it is present; returns whether it did.
    pub fn update(&self, key: &[u8], value: &[u8]) -> Result<bool, KnError> {
        self.applied(DataOp::Update(key.to_vec(), value.to_vec()))
    }

    /// Sets `key` and returns its previous value.
    pub fn get_set(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, KnError> {
        match self.data(DataOp::GetSet(key.to_vec(), value.to_vec()))? {
            Reply::Value(v) => Ok(v),
            _ => unreachable!("a GETSET is answered with a value"),
        }
    }

    /// Adds `delta` to the decimal integer at `key` (absent = 0); returns the result.
    pub fn incr(&self, key: &[u8], delta: i64) -> Result<i64, KnError> {
        match self.data(DataOp::Incr(key.to_vec(), delta))? {
            Reply::Int(n) => Ok(n),
            _ => unreachable!("an INCR is answered with an integer"),
        }
    }

    /// Appends `suffix` to the value at `key` (absent = empty); returns the new length.
    pub fn append(&self, key: &[u8], suffix: &[u8]) -> Result<u64, KnError> {
        match self.data(DataOp::Append(key.to_vec(), suffix.to_vec()))? {
            Reply::Int(n) => Ok(n as u64),
            _ => unreachable!("an APPEND is answered with a length"),
        }
    }

    /// Removes `key`; returns whether it existed.
    pub fn delete(&self, key: &[u8]) -> Result<bool, KnError> {
        self.applied(DataOp::Delete(key.to_vec()))
    }

    /// Has every worker seal its log and the memory node merge it all; returns when the index holds every
    /// acknowledged write.
    pub fn merge_all(&self) -> Result<(), KnError> {
        for t in 0..self.submitter.threads() {
            self.call(t, Command::MergeAll)?;
        }
        Ok(())
    }

    /// Counters of each worker thread.
    pub fn stats(&self) -> Result<Vec<WorkerStats>, KnError> {
        (0..self.submitter.threads())
            .map(|t| match self.call(t, Command::Stats)? {
                Reply::Stats(s) => Ok(*s),
                _ => unreachable!("stats are answered with stats"),
            })
            .collect()
    }

    /// Each worker's statistics of the monitoring epoch that ends now (each starts a new one).
    pub fn epoch_stats(&self) -> Result<Vec<EpochStats>, KnError> {
        (0..self.submitter.threads())
            .map(|t| match self.call(t, Command::EpochStats)? {
                Reply::Epoch(s) => Ok(*s),
                _ => unreachable!("epoch statistics are answered with epoch statistics"),
            })
            .collect()
    }

    /// Has every worker count accesses of `keys` exactly from now on.
    pub fn track_keys(&self, keys: &[Vec<u8>]) -> Result<(), KnError> {
        let keys: Arc<[Vec<u8>]> = keys.into();
        for t in 0..self.submitter.threads() {
            self.call(t, Command::TrackKeys(keys.clone()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_spreads_keys_and_moves_few_on_growth() {
        let keys: Vec<Vec<u8>> = (0..10_000u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let mut counts = [0usize; 4];
        for k in &keys {
            counts[thread_for_key(k, 4)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (2000..3000).contains(&c)),
            "{counts:?}"
        );
        let moved = keys
            .iter()
            .filter(|k| thread_for_key(k, 4) != thread_for_key(k, 5))
            .count();
        assert!(
            (1500..2500).contains(&moved),
            "{moved} of 10000 moved going from 4 to 5 threads"
        );
        assert!(keys.iter().all(|k| thread_for_key(k, 1) == 0));
    }
}
