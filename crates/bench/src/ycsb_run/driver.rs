//! The load phase and the closed-loop clients.
//!
//! Each client thread has its own operation stream ([`OpGenerator::for_client`]) and its own session, and keeps up
//! to `outstanding` operations in flight: it issues until the window is full, waits for one completion, handles
//! it, and issues again. A read-modify-write is a read, then (when the read completes) a write; its latency spans
//! both. An operation that targets a record whose insert is still in flight waits until that insert completes,
//! so no read is issued for a record that may not exist yet.
//!
//! Phases: every client connects, then all warm up, then the measured phase runs, then the clients stop. An
//! operation counts when it was issued in the measured phase and completed before it ended.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use hdrhistogram::Histogram;

use super::report::{self, LoadResult, Outcomes, Second};
use super::resources;
use super::target::{Store, StoreError, StoreOp, StoreReply};
use super::{Progress, YcsbOptions, YcsbReport};
use crate::ycsb::{OpGenerator, OpKind, Operation, fill_value, key_bytes, load_ids, verify_value};

/// Client threads are named with this prefix and their number, so their CPU time is told apart.
pub(crate) const CLIENT_THREAD_PREFIX: &str = "ycsb-client-";

/// Latencies are recorded in nanoseconds up to this bound (longer ones count as this long).
const MAX_LATENCY_NS: u64 = 600_000_000_000;
/// How long after a second ends its figures are read for the progress line.
const SECOND_SETTLE: Duration = Duration::from_millis(50);
/// Loaders keep at least this many writes in flight each.
const LOAD_WINDOW: usize = 32;

const PENDING: u8 = 0;
const WARMUP: u8 = 1;
const MEASURE: u8 = 2;
const STOP: u8 = 3;
/// The main thread has read the counters: clients may close their sessions (which ends the server threads that
/// served them, and with them the CPU times the counters read).
const EXIT: u8 = 4;

/// A histogram of latencies in ns with `digits` significant digits.
pub(crate) fn latency_histogram(digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, digits).expect("valid histogram bounds")
}

/// What the main thread and the clients share.
struct Control {
    phase: AtomicU8,
    ready: AtomicUsize,
    warm_done: AtomicUsize,
    measured_done: AtomicUsize,
    /// Clients that stopped and have nothing in flight.
    drained: AtomicUsize,
    failed: AtomicBool,
    measure_start: OnceLock<Instant>,
}

impl Control {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }
}

/// One second of the measured phase, filled by every client.
pub(crate) struct SecondAcc {
    pub ops: u64,
    pub latency: Histogram<u64>,
}

/// The share of `total` client `c` of `clients` takes.
fn share(total: u64, c: usize, clients: usize) -> u64 {
    let r = load_ids(total, c as u64, clients as u64).expect("client in range");
    r.end - r.start
}

/// Loads records `0..opts.records` with version-0 values, every client thread writing its share with pipelined
/// writes.
fn load(
    opts: &YcsbOptions,
    store: &dyn Store,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<LoadResult> {
    let total = opts.records;
    let loaders = (opts.clients as u64).min(total).max(1) as usize;
    let window = opts.outstanding.max(LOAD_WINDOW);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    progress(Progress::Load { done: 0, total });
    let result = std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..loaders)
            .map(|c| {
                let session = store.session();
                let done = &done;
                std::thread::Builder::new()
                    .name(format!("ycsb-load-{c}"))
                    .spawn_scoped(s, move || -> anyhow::Result<()> {
                        let mut session = session?;
                        let ids = load_ids(total, c as u64, loaders as u64)?;
                        let (mut key, mut value) = (Vec::new(), Vec::new());
                        let mut next = ids.start;
                        loop {
                            while next < ids.end && session.outstanding() < window {
                                key_bytes(next, opts.key_bytes, &mut key)?;
                                fill_value(next, 0, opts.value_bytes, &mut value)?;
                                session
                                    .submit(next, StoreOp::Set(&key, &value))
                                    .map_err(|e| anyhow!("loading record {next}: {e}"))?;
                                next += 1;
                            }
                            let Some((id, r)) = session.next_completion() else {
                                break;
                            };
                            match r {
                                Ok(StoreReply::Stored) => {
                                    done.fetch_add(1, Ordering::Relaxed);
                                }
                                Ok(other) => {
                                    bail!("loading record {id}: unexpected reply {other:?}")
                                }
                                Err(e) => bail!("loading record {id}: {e}"),
                            }
                        }
                        Ok(())
                    })
                    .context("starting a loader thread")
            })
            .collect::<anyhow::Result<_>>()?;
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            progress(Progress::Load {
                done: done.load(Ordering::Relaxed),
                total,
            });
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("a loader thread panicked"))??;
        }
        Ok(())
    });
    result?;
    let secs = start.elapsed().as_secs_f64();
    progress(Progress::Load { done: total, total });
    Ok(LoadResult {
        records: total,
        secs,
        ops_per_s: total as f64 / secs.max(1e-9),
    })
}

/// Runs the whole benchmark against `store`.
pub(crate) fn run(
    opts: &YcsbOptions,
    store: &dyn Store,
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<YcsbReport> {
    let load_result = if opts.load && opts.records > 0 {
        progress(Progress::Phase(format!(
            "loading {} records ({} B keys, {} B values)",
            opts.records, opts.key_bytes, opts.value_bytes
        )));
        Some(load(opts, store, progress)?)
    } else {
        None
    };

    let control = Control {
        phase: AtomicU8::new(PENDING),
        ready: AtomicUsize::new(0),
        warm_done: AtomicUsize::new(0),
        measured_done: AtomicUsize::new(0),
        drained: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        measure_start: OnceLock::new(),
    };
    // One entry per started second of the measured phase, and one more for completions at its very end.
    let seconds = opts.secs.ceil() as usize + 1;
    let timeline: Mutex<Vec<SecondAcc>> = Mutex::new(
        (0..seconds)
            .map(|_| SecondAcc {
                ops: 0,
                latency: latency_histogram(2),
            })
            .collect(),
    );
    // Sealed segments waiting to be merged at each second's end.
    let mut backlog: Vec<Option<u64>> = vec![None; seconds];

    let (start_snapshot, end_snapshot, window, outcomes) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..opts.clients)
            .map(|c| {
                let (control, timeline) = (&control, &timeline);
                std::thread::Builder::new()
                    .name(format!("{CLIENT_THREAD_PREFIX}{c}"))
                    .spawn_scoped(s, move || {
                        let r = client(c, opts, store, control, timeline);
                        if r.is_err() {
                            control.failed.store(true, Ordering::Release);
                        }
                        r
                    })
                    .context("starting a client thread")
            })
            .collect::<anyhow::Result<_>>()?;
        let orchestrated = orchestrate(opts, store, &control, &timeline, &mut backlog, progress);
        control.phase.store(EXIT, Ordering::Release);
        let mut outcomes = Vec::with_capacity(handles.len());
        let mut first_error = None;
        for h in handles {
            match h.join() {
                Ok(Ok(o)) => outcomes.push(o),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(anyhow!("a client thread panicked"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e.context("a client failed"));
        }
        let (a, b, window) = orchestrated?;
        Ok((a, b, window, outcomes))
    })?;

    let deltas = resources::diff(&start_snapshot, &end_snapshot);
    let mut merged = Outcomes::new();
    for o in &outcomes {
        merged.merge(o);
    }
    let mut timeline = timeline
        .into_inner()
        .map_err(|_| anyhow!("timeline lock"))?;
    let window_s = window.as_secs_f64();
    // Seconds the phase reached, each with the time it covered.
    let mut covered: Vec<f64> = (0..timeline.len())
        .map(|k| (window_s - k as f64).min(1.0))
        .take_while(|&c| c > 0.0)
        .collect();
    // A last part-second shorter than half a second would show a rate from a handful of operations: it is
    // folded into the second before it.
    if covered.len() >= 2 && covered[covered.len() - 1] < 0.5 {
        let tail = covered.len() - 1;
        let (head, rest) = timeline.split_at_mut(tail);
        head[tail - 1].ops += rest[0].ops;
        let _ = head[tail - 1].latency.add(&rest[0].latency);
        covered[tail - 1] += covered[tail];
        covered.pop();
        backlog[tail - 1] = backlog[tail].or(backlog[tail - 1]);
    }
    let timeline: Vec<Second> = covered
        .iter()
        .enumerate()
        .map(|(k, &secs)| {
            let acc = &timeline[k];
            Second {
                t_s: k as f64,
                secs,
                ops: acc.ops,
                ops_per_s: acc.ops as f64 / secs,
                p50_us: acc.latency.value_at_quantile(0.5) as f64 / 1e3,
                p99_us: acc.latency.value_at_quantile(0.99) as f64 / 1e3,
                backlog_segments: backlog.get(k).copied().flatten(),
            }
        })
        .collect();
    let (kv_nodes, kn_threads) = store.layout();
    // A running cluster does not say how its nodes were started, but its statistics list their workers.
    let kn_threads = kn_threads.or_else(|| {
        end_snapshot
            .nodes
            .as_ref()
            .and_then(|n| n.first())
            .map(|n| n.threads.len())
    });
    Ok(report::assemble(
        opts,
        store.identity(),
        kv_nodes,
        kn_threads,
        load_result,
        merged,
        window_s,
        &deltas,
        timeline,
    ))
}

/// The main thread's part: starts the phases, takes the snapshots around the measured phase, samples the merge
/// backlog every second. Returns the snapshots and the measured phase's length.
fn orchestrate(
    opts: &YcsbOptions,
    store: &dyn Store,
    control: &Control,
    timeline: &Mutex<Vec<SecondAcc>>,
    backlog: &mut [Option<u64>],
    progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<(resources::Snapshot, resources::Snapshot, Duration)> {
    let failed = || control.failed.load(Ordering::Acquire);
    let connect_deadline = Instant::now() + opts.op_timeout() * 2;
    while control.ready.load(Ordering::Acquire) < opts.clients {
        if failed() {
            bail!("a client could not start");
        }
        if Instant::now() > connect_deadline {
            bail!("the clients did not connect in time");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    progress(Progress::Phase(format!(
        "warming up: {} client(s) × {} in flight",
        opts.clients, opts.outstanding
    )));
    control.phase.store(WARMUP, Ordering::Release);
    let warm_start = Instant::now();
    let warm_cap = Duration::from_secs_f64(opts.warmup_secs);
    loop {
        if failed() {
            bail!("a client failed during the warm-up");
        }
        let elapsed = warm_start.elapsed();
        if elapsed >= warm_cap
            || (opts.warmup_ops.is_some()
                && control.warm_done.load(Ordering::Acquire) == opts.clients)
        {
            break;
        }
        std::thread::sleep((warm_cap - elapsed).min(Duration::from_millis(5)));
    }
    let start_snapshot = store.snapshot().context("reading the store's counters")?;
    progress(Progress::Phase(match opts.ops {
        Some(n) => format!("measuring {n} operations (at most {} s)", opts.secs),
        None => format!("measuring for {} s", opts.secs),
    }));
    let t0 = Instant::now();
    let _ = control.measure_start.set(t0);
    control.phase.store(MEASURE, Ordering::Release);
    let cap = Duration::from_secs_f64(opts.secs);
    let mut second = 1usize;
    loop {
        if failed() {
            bail!("a client failed during the measured phase");
        }
        let elapsed = t0.elapsed();
        if elapsed >= cap
            || (opts.ops.is_some() && control.measured_done.load(Ordering::Acquire) == opts.clients)
        {
            break;
        }
        let boundary = Duration::from_secs(second as u64);
        // A little past the boundary, so the clients have added the second's last completions.
        if elapsed >= boundary + SECOND_SETTLE {
            if let Some(m) = store.memory_stats()
                && let Some(slot) = backlog.get_mut(second - 1)
            {
                *slot = Some(m.backlog_segments);
            }
            if let Ok(t) = timeline.lock()
                && let Some(acc) = t.get(second - 1)
            {
                progress(Progress::Second {
                    t_s: second as u64 - 1,
                    ops_per_s: acc.ops as f64,
                    p99_us: acc.latency.value_at_quantile(0.99) as f64 / 1e3,
                });
            }
            second += 1;
            continue;
        }
        let wait = (boundary + SECOND_SETTLE)
            .saturating_sub(elapsed)
            .min(cap - elapsed);
        let wait = if opts.ops.is_some() {
            wait.min(Duration::from_millis(2))
        } else {
            wait
        };
        std::thread::sleep(wait);
    }
    let window = t0.elapsed();
    control.phase.store(STOP, Ordering::Release);
    // The clients finish what is in flight; their sessions stay open until the counters are read.
    let drain_deadline = Instant::now() + opts.op_timeout() * 2;
    while control.drained.load(Ordering::Acquire) < opts.clients
        && !failed()
        && Instant::now() < drain_deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    if let Some(m) = store.memory_stats() {
        let last = ((window.as_secs_f64().ceil() as usize).max(1) - 1).min(backlog.len() - 1);
        backlog[last].get_or_insert(m.backlog_segments);
    }
    let end_snapshot = store.snapshot().context("reading the store's counters")?;
    Ok((start_snapshot, end_snapshot, window))
}

/// An operation in flight.
struct Slot {
    op: Operation,
    started: Instant,
    /// Issued during the measured phase.
    measured: bool,
    /// A read-modify-write whose write is in flight.
    writing: bool,
}

/// One closed-loop client.
fn client(
    c: usize,
    opts: &YcsbOptions,
    store: &dyn Store,
    control: &Control,
    timeline: &Mutex<Vec<SecondAcc>>,
) -> anyhow::Result<Outcomes> {
    let mut session = store.session()?;
    let mut ops = OpGenerator::for_client(
        opts.workload,
        opts.distribution,
        opts.records,
        opts.seed,
        c as u64,
        opts.clients as u64,
    )?;
    let warm_quota = opts
        .warmup_ops
        .map_or(u64::MAX, |n| share(n, c, opts.clients));
    let measure_quota = opts.ops.map_or(u64::MAX, |n| share(n, c, opts.clients));
    let mut out = Outcomes::new();
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(opts.outstanding);
    let mut free: Vec<usize> = Vec::new();
    let mut inserting: HashSet<u64> = HashSet::new();
    let mut parked: Option<Operation> = None;
    let (mut issued_warm, mut issued_measured) = (0u64, 0u64);
    let (mut warm_reported, mut measured_reported) = (false, false);
    let (mut key, mut value) = (Vec::new(), Vec::new());
    // Versions of this client's writes: unique per client, so a value read names a write that happened.
    let mut version = (c as u64) << 40;
    // The second being counted locally, flushed into the shared timeline when a later one begins.
    let mut current = (0usize, 0u64, latency_histogram(2));

    control.ready.fetch_add(1, Ordering::AcqRel);
    while control.phase() == PENDING {
        std::thread::sleep(Duration::from_micros(200));
    }
    loop {
        let phase = control.phase();
        if phase >= STOP {
            if session.outstanding() == 0 {
                break;
            }
        } else {
            // Issue until the window is full or this phase's quota is spent.
            while session.outstanding() < opts.outstanding {
                let (issued, quota) = if phase == WARMUP {
                    (&mut issued_warm, warm_quota)
                } else {
                    (&mut issued_measured, measure_quota)
                };
                if *issued >= quota {
                    break;
                }
                let op = parked.take().unwrap_or_else(|| ops.next());
                if op.kind != OpKind::Insert && inserting.contains(&op.key_id) {
                    parked = Some(op);
                    break;
                }
                key_bytes(op.key_id, opts.key_bytes, &mut key)?;
                let store_op = match op.kind {
                    OpKind::Read | OpKind::ReadModifyWrite => StoreOp::Get(&key),
                    OpKind::Update | OpKind::Insert => {
                        version += 1;
                        fill_value(op.key_id, version, opts.value_bytes, &mut value)?;
                        StoreOp::Set(&key, &value)
                    }
                };
                if op.kind == OpKind::Insert {
                    inserting.insert(op.key_id);
                }
                let slot = Slot {
                    op,
                    started: Instant::now(),
                    measured: phase == MEASURE,
                    writing: false,
                };
                let tag = match free.pop() {
                    Some(i) => {
                        slots[i] = Some(slot);
                        i
                    }
                    None => {
                        slots.push(Some(slot));
                        slots.len() - 1
                    }
                };
                session
                    .submit(tag as u64, store_op)
                    .map_err(|e| anyhow!("client {c}: {e}"))?;
                *issued += 1;
            }
            if session.outstanding() == 0 {
                // This phase's quota is spent: say so once, then wait for the next phase.
                if phase == WARMUP && !warm_reported {
                    warm_reported = true;
                    control.warm_done.fetch_add(1, Ordering::AcqRel);
                } else if phase == MEASURE && !measured_reported {
                    measured_reported = true;
                    control.measured_done.fetch_add(1, Ordering::AcqRel);
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
        }
        let Some((tag, result)) = session.next_completion() else {
            continue;
        };
        let tag = tag as usize;
        let Some(slot) = slots.get_mut(tag).and_then(Option::as_mut) else {
            bail!("client {c}: a completion for unknown tag {tag}");
        };
        let op = slot.op;
        let reply = match result {
            Err(StoreError::Invalid(m)) => bail!("client {c}: invalid request: {m}"),
            Err(e) => {
                let counted = slot.measured && control.phase() == MEASURE;
                slots[tag] = None;
                free.push(tag);
                inserting.remove(&op.key_id);
                if counted {
                    out.error(&e);
                }
                continue;
            }
            Ok(r) => r,
        };
        let counted_now = slot.measured && control.phase() == MEASURE;
        match (reply, slot.writing, op.kind) {
            (StoreReply::Value(v), false, OpKind::Read | OpKind::ReadModifyWrite) => {
                if opts.verify && counted_now {
                    match v {
                        None => out.missing(op.key_id),
                        Some(bytes) => match verify_value(op.key_id, &bytes) {
                            Ok(_) => out.verified += 1,
                            Err(e) => out.corrupt(op.key_id, &e.to_string()),
                        },
                    }
                }
                if op.kind == OpKind::ReadModifyWrite {
                    slot.writing = true;
                    version += 1;
                    fill_value(op.key_id, version, opts.value_bytes, &mut value)?;
                    key_bytes(op.key_id, opts.key_bytes, &mut key)?;
                    session
                        .submit(tag as u64, StoreOp::Set(&key, &value))
                        .map_err(|e| anyhow!("client {c}: {e}"))?;
                    continue;
                }
            }
            (StoreReply::Stored, _, OpKind::Update | OpKind::Insert)
            | (StoreReply::Stored, true, OpKind::ReadModifyWrite) => {}
            (other, _, kind) => bail!("client {c}: unexpected reply {other:?} to a {kind}"),
        }
        let latency = slot.started.elapsed();
        slots[tag] = None;
        free.push(tag);
        if op.kind == OpKind::Insert {
            inserting.remove(&op.key_id);
        }
        if counted_now {
            let ns = (latency.as_nanos() as u64).clamp(1, MAX_LATENCY_NS);
            out.record(op.kind, ns);
            if let Some(t0) = control.measure_start.get() {
                let second = t0.elapsed().as_secs() as usize;
                if second != current.0 {
                    flush_second(timeline, &mut current);
                    current.0 = second;
                }
                current.1 += 1;
                let _ = current.2.record(ns);
            }
        }
    }
    flush_second(timeline, &mut current);
    control.drained.fetch_add(1, Ordering::AcqRel);
    while control.phase() != EXIT {
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(out)
}

/// Adds the locally counted second to the shared timeline (seconds past its end go to its last entry).
fn flush_second(timeline: &Mutex<Vec<SecondAcc>>, current: &mut (usize, u64, Histogram<u64>)) {
    if current.1 == 0 {
        return;
    }
    if let Ok(mut t) = timeline.lock() {
        let last = t.len() - 1;
        let acc = &mut t[current.0.min(last)];
        acc.ops += current.1;
        let _ = acc.latency.add(&current.2);
    }
    current.1 = 0;
    current.2.reset();
}
