//! Forwarding for a KV node's Redis front door: the operations on keys other nodes own go to their owners through
//! forwarding lanes, each one pipelined native client with a thread that waits for its answers, so an event-loop
//! thread never waits for another node. A frozen or dying owner then delays only the operations on its keys, not
//! every connection of the loop.
//!
//! A connection hands a batch's forwarded operations to its lane as a [`ForwardJob`], already in waves: each wave
//! holds at most one operation per key and is answered whole before the next is sent, so a key's operations apply
//! in order. The event-loop thread sends a job's first wave itself when the lane's client has a connection open to
//! every node (the usual case: no wait, and no hop to another thread); otherwise it posts the job to the lane's
//! thread, which may have to connect. The lane's thread waits on the owners' sockets, reads the answers, sends the
//! jobs' next waves, and hands each job's answers back at once through the connection's [`ConnSink`], which rings
//! the connection's event loop. Every job is answered: each request completes by the client's deadline, and a wave
//! not yet sent when the job's deadline passes is answered unavailable unsent.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dinomo_kn::DataOp;
use dinomo_sync::{Inbox, Mailbox};
use mio::{Events, Poll, Token};

use crate::ClusterError;
use crate::client::{Client, ClientConfig, ClientError};
use crate::pipeline::{Completion, PipelinedClient, poll_fds, readable};
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

/// A node's forwarding lanes. Dropping it stops their threads; jobs handed over afterwards are refused
/// ([`ForwardLane::forward`] says so).
pub(crate) struct Forwarding {
    lanes: Vec<ForwardLane>,
    next: AtomicUsize,
    threads: Vec<JoinHandle<()>>,
}

/// One forwarding lane, as connections hand it jobs.
#[derive(Clone)]
pub(crate) struct ForwardLane(Arc<LaneShared>);

/// What a lane's thread and the event-loop threads that hand it jobs share.
struct LaneShared {
    state: Mutex<Lane>,
    /// Jobs the lane's thread starts (those that may have to connect), and its wake-up.
    mailbox: Arc<Mailbox<ForwardJob>>,
    stop: AtomicBool,
}

impl Forwarding {
    /// Starts `threads` forwarding lanes, their threads named `name` and their number, whose clients start from
    /// `client`'s seeds.
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
        let mut forwarding = Forwarding {
            lanes: Vec::with_capacity(threads),
            next: AtomicUsize::new(0),
            threads: Vec::with_capacity(threads),
        };
        for k in 0..threads {
            let io = |e: std::io::Error| ClusterError::Io(format!("forwarding thread: {e}"));
            let poll = Poll::new().map_err(io)?;
            let (mailbox, inbox) = Mailbox::new(&poll, WAKER).map_err(io)?;
            let shared = Arc::new(LaneShared {
                state: Mutex::new(Lane {
                    config: client.clone(),
                    client: None,
                    jobs: HashMap::new(),
                    next_job: 0,
                    watching: None,
                }),
                mailbox,
                stop: AtomicBool::new(false),
            });
            let lane = ForwardLane(shared.clone());
            // A failed start drops `forwarding`, which stops the lanes started so far.
            let thread = std::thread::Builder::new()
                .name(format!("{name}{k}"))
                .spawn(move || run(&shared, poll, inbox))
                .map_err(io)?;
            forwarding.lanes.push(lane);
            forwarding.threads.push(thread);
        }
        Ok(forwarding)
    }

    /// The lane of a new connection: connections take the lanes in turn.
    pub(crate) fn lane(&self) -> ForwardLane {
        let k = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        self.lanes[k].clone()
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for lane in &self.lanes {
            lane.0.stop.store(true, Ordering::Release);
            let _ = lane.0.mailbox.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl ForwardLane {
    /// Hands `job` to the lane; false (the job dropped unanswered) once the lane has stopped.
    pub(crate) fn forward(&self, job: ForwardJob) -> bool {
        let shared = &self.0;
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        // The lane's thread holds the lock while it reads answers, and while it connects, which may wait (for a
        // frozen node's handshake, say): an event loop never waits for it, but posts the job to the thread. So does
        // a job that may have to connect.
        let mut guard = match shared.state.try_lock() {
            Ok(g)
                if g.client
                    .as_ref()
                    .is_some_and(PipelinedClient::connected_to_all) =>
            {
                g
            }
            _ => return shared.mailbox.post(job),
        };
        let mut done = Vec::new();
        guard.start(job, &mut done);
        let lane = &mut *guard;
        let client = lane.client.as_mut().expect("connected, checked above");
        client.flush();
        // A lane's thread that is not waiting takes a new wait set before it waits. One that waits must look again
        // if the job went out on a socket it does not wait on, left a retry to time, or left bytes a full socket
        // had no room for (the thread sends them when it takes more).
        let wake = lane.watching.as_deref().is_some_and(|fds| {
            client.in_flight_beyond(fds) || client.has_retries() || client.has_unsent()
        });
        drop(guard);
        for running in done {
            running.deliver();
        }
        if wake {
            let _ = shared.mailbox.wake();
        }
        true
    }
}

impl LaneShared {
    fn lock(&self) -> MutexGuard<'_, Lane> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A lane's client and the jobs with a wave in flight.
struct Lane {
    config: ClientConfig,
    /// Connected by the lane's thread on the first job (and again after a connection attempt failed).
    client: Option<PipelinedClient>,
    jobs: HashMap<u32, Running>,
    next_job: u32,
    /// While the lane's thread waits: the sockets it waits on. `None` while it is not waiting.
    watching: Option<Vec<std::os::fd::RawFd>>,
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

impl Running {
    fn deliver(self) {
        self.to.forwarded(self.batch, self.answers);
    }
}

/// The lane's thread: starts the jobs posted to it, waits on the owners' sockets and the mailbox at once, and
/// takes the answers. One turn holds the lane's lock once: it reads what the last wait found ready, starts the
/// posted jobs, takes the completions (sending next waves), sends, and takes the next wait set.
fn run(shared: &LaneShared, mut poll: Poll, mut inbox: Inbox<ForwardJob>) {
    let mut events = Events::with_capacity(8);
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut addrs: Vec<Arc<str>> = Vec::new();
    let mut done = Vec::new();
    // The buffer of `Lane::watching`, kept between waits.
    let mut spare_watching = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        let next = {
            let mut guard = shared.lock();
            let lane = &mut *guard;
            if let Some(w) = lane.watching.take() {
                spare_watching = w;
            }
            if let Some(c) = lane.client.as_mut() {
                for (fd, addr) in fds.iter().zip(&addrs) {
                    if readable(fd) {
                        c.read_ready(addr);
                    }
                }
            }
            for job in inbox.take() {
                lane.connect();
                lane.start(job, &mut done);
            }
            fds.clear();
            addrs.clear();
            let next = lane.client.as_mut().and_then(|c| {
                c.expire();
                while let Some(completion) = c.take_completion() {
                    lane_complete(&mut lane.jobs, c, completion, &mut done);
                }
                c.flush();
                c.wait_set(&mut fds, &mut addrs)
            });
            let mut watching = std::mem::take(&mut spare_watching);
            watching.clear();
            watching.extend(fds.iter().map(|f| f.fd));
            lane.watching = Some(watching);
            next
        };
        for running in done.drain(..) {
            running.deliver();
        }
        // The mailbox's poll beside the sockets: a post or a wake ends the wait.
        fds.push(libc::pollfd {
            fd: poll.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let timeout = next.map_or(IDLE_WAIT, |t| t.saturating_duration_since(Instant::now()));
        // What is ready shows in `revents` (all zero after a timeout or an interrupted call), read next turn.
        inbox.wait_with(true, |sleep| {
            poll_fds(&mut fds, if sleep { timeout } else { Duration::ZERO })
        });
        if fds.last().is_some_and(|f| f.revents != 0) {
            // The wake's event is taken, so the poll's descriptor is not readable again until the next one.
            let _ = poll.poll(&mut events, Some(Duration::ZERO));
        }
    }
}

impl Lane {
    /// Connects the client if it is not.
    fn connect(&mut self) {
        if self.client.is_none()
            && let Ok(c) = Client::connect(self.config.clone())
        {
            self.client = Some(PipelinedClient::from_client(c));
        }
    }

    /// Takes a job: submits its first wave, or answers it at once (into `done`) if nothing can be sent.
    fn start(&mut self, job: ForwardJob, done: &mut Vec<Running>) {
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
        let Some(client) = self.client.as_mut() else {
            let why = ClientError::Unavailable(format!(
                "cannot reach the cluster to forward: no routing table from {:?}",
                self.config.seeds
            ));
            for (i, _) in running.waves.drain(..).flatten() {
                running.answers.push((i, Err(why.clone())));
            }
            done.push(running);
            return;
        };
        let id = self.next_job;
        self.next_job = self.next_job.wrapping_add(1);
        if send_next_wave(client, id, &mut running) {
            self.jobs.insert(id, running);
        } else {
            done.push(running);
        }
    }
}

/// Submits the job's next wave; false when the job has nothing in flight (every wave was answered, or refused
/// unsent), so it is done.
fn send_next_wave(client: &mut PipelinedClient, id: u32, running: &mut Running) -> bool {
    while let Some(wave) = running.waves.pop() {
        let now = Instant::now();
        if now >= running.deadline {
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
        running.sent_at = now;
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
fn lane_complete(
    jobs: &mut HashMap<u32, Running>,
    client: &mut PipelinedClient,
    c: Completion,
    done: &mut Vec<Running>,
) {
    let (id, i) = ((c.tag >> 32) as u32, (c.tag & u64::from(u32::MAX)) as usize);
    let Some(running) = jobs.get_mut(&id) else {
        return;
    };
    running.answers.push((i, c.result));
    running.waiting -= 1;
    client.client().record_latency(running.sent_at.elapsed());
    if running.waiting > 0 {
        return;
    }
    let mut running = jobs.remove(&id).expect("looked up above");
    if send_next_wave(client, id, &mut running) {
        jobs.insert(id, running);
    } else {
        done.push(running);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crossbeam_channel::unbounded;
    use dinomo_resp::Wake;

    use super::*;
    use crate::resp::Delivery;
    use crate::{LocalCluster, LocalClusterConfig};

    /// The answers of the next job delivered, by op index, and its batch.
    fn answers(deliveries: &crossbeam_channel::Receiver<Delivery>) -> (u32, Vec<Answer>) {
        match deliveries.recv_timeout(Duration::from_secs(20)) {
            Ok(Delivery::Forwarded { batch, mut answers }) => {
                answers.sort_by_key(|a| a.0);
                (batch, answers)
            }
            Ok(Delivery::Worker(..)) => panic!("a worker reply from a forwarding lane"),
            Err(e) => panic!("no answer from the lane: {e}"),
        }
    }

    #[test]
    fn a_lane_answers_waves_in_order_and_leaves_the_waves_of_a_lapsed_job_unsent() {
        let cluster = LocalCluster::start(LocalClusterConfig {
            pool_size: 256 << 20,
            processor: dinomo_dpm::ProcessorConfig {
                merge_threads: 2,
                segment_size: 1 << 20,
                ..dinomo_dpm::ProcessorConfig::default()
            },
            kns: 1,
            node: crate::NodeConfig {
                kn: dinomo_kn::KnConfig {
                    threads: 2,
                    max_value_len: 64 << 10,
                    ..dinomo_kn::KnConfig::default()
                },
                ..crate::NodeConfig::default()
            },
            ..LocalClusterConfig::default()
        })
        .expect("cluster");
        let seeds = vec![cluster.nodes()[0].addr().to_string()];
        let forwarding = Forwarding::start(
            1,
            ClientConfig {
                seeds,
                ..ClientConfig::default()
            },
            "test-fwd",
        )
        .expect("lanes");
        let lane = forwarding.lane();
        let (tx, deliveries) = unbounded();
        let sink = Arc::new(ConnSink::new(tx, Wake::none()));
        let job = |waves: Vec<Vec<(usize, DataOp)>>, batch: u32, deadline: Instant| ForwardJob {
            waves,
            batch,
            deadline,
            to: sink.clone(),
        };
        let (k, later) = (
            || b"k".to_vec(),
            || Instant::now() + Duration::from_secs(20),
        );

        // A key's SET, then its GET in the next wave: the GET sees the SET.
        let waves = vec![
            vec![
                (0, DataOp::Set(k(), b"one".to_vec())),
                (2, DataOp::Get(b"other".to_vec())),
            ],
            vec![(1, DataOp::Get(k()))],
        ];
        assert!(lane.forward(job(waves, 7, later())));
        let (batch, got) = answers(&deliveries);
        assert_eq!(batch, 7);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (0, Ok(ResponseBody::Applied(true))));
        assert_eq!(got[1], (1, Ok(ResponseBody::Value(Some(b"one".to_vec())))));
        assert_eq!(got[2], (2, Ok(ResponseBody::Value(None))));

        // A job whose batch's time ran out: nothing is sent, every op is answered unavailable, the key keeps its
        // value.
        let waves = vec![
            vec![(0, DataOp::Set(k(), b"two".to_vec()))],
            vec![(1, DataOp::Delete(k()))],
        ];
        assert!(lane.forward(job(waves, 8, Instant::now())));
        let (batch, got) = answers(&deliveries);
        assert_eq!(batch, 8);
        assert!(
            got.iter()
                .all(|(_, r)| matches!(r, Err(ClientError::Unavailable(m)) if m.contains("not forwarded"))),
            "{got:?}"
        );
        assert!(lane.forward(job(vec![vec![(0, DataOp::Get(k()))]], 9, later())));
        assert_eq!(
            answers(&deliveries).1,
            vec![(0, Ok(ResponseBody::Value(Some(b"one".to_vec()))))]
        );

        // Stopped lanes refuse jobs.
        drop(forwarding);
        assert!(!lane.forward(job(vec![vec![(0, DataOp::Get(k()))]], 10, later())));
    }
}
