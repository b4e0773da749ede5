//! Forwarding for a KV node's Redis front door: the operations on keys other nodes own go to their owners from
//! forwarding threads, each driving one pipelined native client, so an event-loop thread never waits for another
//! node. A frozen or dying owner then delays only the operations on its keys, not every connection of the loop.
//!
//! A connection hands a batch's forwarded operations to one thread (its lane) as a [`ForwardJob`], already in
//! waves: each wave holds at most one operation per key and is answered whole before the next is sent, so a key's
//! operations apply in order. A thread sends the first wave of every job it has taken together (frames for one
//! owner share a system call), and hands a job's answers back at once through the connection's [`ConnSink`],
//! which rings the connection's event loop. Every job a thread takes is answered: each request completes by the
//! client's deadline, and a wave not yet sent when the job's deadline passes is answered unavailable unsent.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dinomo_kn::DataOp;
use dinomo_sync::{Inbox, Mailbox};
use mio::{Events, Poll, Token};

use crate::ClusterError;
use crate::client::{Client, ClientConfig, ClientError};
use crate::pipeline::{Completion, Event, Interrupt, PipelinedClient};
use crate::resp::ConnSink;
use crate::wire::{RequestBody, ResponseBody};

/// An op's index in its connection's batch, and its owner's answer.
pub(crate) type Answer = (usize, Result<ResponseBody, ClientError>);

/// The forwarded ops of one connection's batch.
pub(crate) struct ForwardJob {
    /// The ops with their indices in the batch, wave by wave (see [`crate::resp`]'s `waves`).
    pub waves: Vec<Vec<(usize, DataOp)>>,
    /// The connection's batch, named in the answer so a late one is never taken for a later batch.
    pub batch: u32,
    /// After it, waves not sent yet are answered unavailable instead: the connection has given up on them.
    pub deadline: Instant,
    /// Where the answers go.
    pub to: Arc<ConnSink>,
}

/// The most forwarding threads a node starts.
pub(crate) const MAX_FORWARD_THREADS: usize = 64;

/// How long an idle forwarding thread sleeps before it looks at its stop flag again (a stop also wakes it).
const IDLE_WAIT: Duration = Duration::from_secs(1);

const WAKER: Token = Token(0);

/// A node's forwarding threads. Dropping it stops them; jobs posted afterwards are refused
/// ([`ForwardLane::post`] says so).
pub(crate) struct Forwarding {
    lanes: Vec<Arc<Mailbox<ForwardJob>>>,
    next: AtomicUsize,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// One forwarding thread, as a connection posts to it.
pub(crate) type ForwardLane = Arc<Mailbox<ForwardJob>>;

impl Forwarding {
    /// Starts `threads` forwarding threads, named `name` and their number, whose clients start from `client`'s seeds.
    pub(crate) fn start(
        threads: usize,
        client: ClientConfig,
        name: &str,
    ) -> Result<Forwarding, ClusterError> {
        if !(1..=MAX_FORWARD_THREADS).contains(&threads) {
            return Err(ClusterError::Io(format!(
                "resp_forward_threads must be 1 to {MAX_FORWARD_THREADS}, not {threads}"
            )));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut forwarding = Forwarding {
            lanes: Vec::with_capacity(threads),
            next: AtomicUsize::new(0),
            stop: stop.clone(),
            threads: Vec::with_capacity(threads),
        };
        for k in 0..threads {
            let io = |e: std::io::Error| ClusterError::Io(format!("forwarding thread: {e}"));
            let poll = Poll::new().map_err(io)?;
            let (mailbox, inbox) = Mailbox::new(&poll, WAKER).map_err(io)?;
            let lane = Lane {
                config: client.clone(),
                client: None,
                jobs: HashMap::new(),
                next_job: 0,
            };
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}{k}"))
                .spawn(move || lane.run(poll, inbox, &stop))
                .map_err(io)?;
            forwarding.lanes.push(mailbox);
            forwarding.threads.push(thread);
        }
        Ok(forwarding)
    }

    /// The lane of a new connection: the threads take connections in turn.
    pub(crate) fn lane(&self) -> ForwardLane {
        let k = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        self.lanes[k].clone()
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for lane in &self.lanes {
            let _ = lane.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A forwarding thread's state.
struct Lane {
    config: ClientConfig,
    /// Connected on the first job (and again after a connection attempt failed).
    client: Option<PipelinedClient>,
    jobs: HashMap<u32, Running>,
    next_job: u32,
}

/// A job with a wave in flight.
struct Running {
    /// The waves not sent yet, the next one last.
    waves: Vec<Vec<(usize, DataOp)>>,
    batch: u32,
    deadline: Instant,
    to: Arc<ConnSink>,
    /// Ops of the wave in flight not answered yet.
    waiting: usize,
    answers: Vec<Answer>,
    sent_at: Instant,
}

impl Lane {
    fn run(mut self, mut poll: Poll, mut inbox: Inbox<ForwardJob>, stop: &AtomicBool) {
        let mut events = Events::with_capacity(8);
        let fd = poll.as_raw_fd();
        let mut taken = Vec::new();
        while !stop.load(Ordering::Acquire) {
            taken.extend(inbox.take());
            for job in taken.drain(..) {
                self.start(job);
            }
            let Some(client) = self.client.as_mut().filter(|c| c.outstanding() > 0) else {
                // Nothing in flight: sleep until a job is posted (or the stop wakes the thread).
                if let Err(e) = inbox.poll(&mut poll, &mut events, true, Some(IDLE_WAIT)) {
                    tracing::warn!("forwarding thread: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            };
            // Waits on the owners' sockets and on the mailbox's poll together: a post ends the wait.
            let event = inbox.wait_with(true, |sleep| {
                client.next_event(Some(Interrupt { fd, sleep }))
            });
            match event {
                Event::Completed(c) => self.complete(c),
                // The wake's event is taken, so the poll's descriptor is not readable again until the next one.
                Event::Interrupted => {
                    let _ = poll.poll(&mut events, Some(Duration::ZERO));
                }
                Event::Idle => {}
            }
        }
    }

    /// Takes a job: sends its first wave, or answers it at once if nothing can be sent.
    fn start(&mut self, job: ForwardJob) {
        let ForwardJob {
            mut waves,
            batch,
            deadline,
            to,
        } = job;
        waves.reverse();
        let mut running = Running {
            answers: Vec::with_capacity(waves.iter().map(Vec::len).sum()),
            waves,
            batch,
            deadline,
            to,
            waiting: 0,
            sent_at: Instant::now(),
        };
        if self.client.is_none() {
            match Client::connect(self.config.clone()) {
                Ok(c) => self.client = Some(PipelinedClient::from_client(c)),
                Err(e) => {
                    for (i, _) in running.waves.drain(..).flatten() {
                        running.answers.push((i, Err(e.clone())));
                    }
                    deliver(running);
                    return;
                }
            }
        }
        let id = self.next_job;
        self.next_job = self.next_job.wrapping_add(1);
        if self.send_next_wave(id, &mut running) {
            self.jobs.insert(id, running);
        } else {
            deliver(running);
        }
    }

    /// Sends the job's next wave; false when the job has nothing in flight (every wave was answered, or refused
    /// unsent), so it is done.
    fn send_next_wave(&mut self, id: u32, running: &mut Running) -> bool {
        let client = self.client.as_mut().expect("connected before any job runs");
        while let Some(wave) = running.waves.pop() {
            if Instant::now() >= running.deadline {
                // The connection gave up on the batch: what was not sent stays unsent, so it is not applied.
                let why = ClientError::Unavailable(
                    "not forwarded: the batch's time ran out while earlier commands on the key ran"
                        .into(),
                );
                for (i, _) in std::iter::once(wave)
                    .chain(running.waves.drain(..))
                    .flatten()
                {
                    running.answers.push((i, Err(why.clone())));
                }
                return false;
            }
            running.sent_at = Instant::now();
            for (i, op) in wave {
                let tag = (u64::from(id) << 32) | i as u64;
                match client.submit(tag, RequestBody::Data(op)) {
                    Ok(()) => running.waiting += 1,
                    Err(e) => running.answers.push((i, Err(e))),
                }
            }
            if running.waiting > 0 {
                return true;
            }
        }
        false
    }

    /// Takes one request's completion into its job; a job whose wave is answered sends the next, or is done.
    fn complete(&mut self, c: Completion) {
        let (id, i) = ((c.tag >> 32) as u32, (c.tag & u64::from(u32::MAX)) as usize);
        let Some(running) = self.jobs.get_mut(&id) else {
            return;
        };
        running.answers.push((i, c.result));
        running.waiting -= 1;
        if let Some(client) = self.client.as_mut() {
            client.client().record_latency(running.sent_at.elapsed());
        }
        if running.waiting > 0 {
            return;
        }
        let mut running = self.jobs.remove(&id).expect("looked up above");
        if self.send_next_wave(id, &mut running) {
            self.jobs.insert(id, running);
        } else {
            deliver(running);
        }
    }
}

fn deliver(running: Running) {
    running.to.forwarded(running.batch, running.answers);
}
