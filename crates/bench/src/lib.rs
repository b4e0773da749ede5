//! Benchmarks behind `dinomo bench`: the fabric micro-benchmark below, and the caching-policy benchmark in
//! [`run_dac`] (`dinomo bench dac`).
//!
//! [`run`] measures the memory fabric (`dinomo bench fabric`): READ (8 B and 1 KiB), WRITE (8 B and 1 KiB), CAS and
//! FAA, each one verb per round trip and in [`Batch`]es, over every chosen transport, and reports verbs per second,
//! nanoseconds per verb, and round trips per verb as counted by [`dinomo_fabric::counters`].
//!
//! Every case is measured beside a *physical reference*, so the report says how far the fabric is from what the
//! machine can do. Both warm up, then take turns in four time-bounded slices each (so that drift of the machine
//! affects both alike); the timed loops look at the clock only every ~200 µs worth of iterations, never per
//! operation. The references:
//! - **in-process**: the raw operation on the same pool memory with no fabric: a real `memcpy` of the same runtime
//!   length for READ and WRITE, `AtomicU64::compare_exchange` / `fetch_add` for CAS and FAA (repeated `batch`
//!   times for batched cases);
//! - **TCP**: a plain blocking ping-pong on loopback (`TCP_NODELAY` on both ends) whose messages have the verb's
//!   wire size ([`dinomo_fabric::wire::verb_bytes`]), `batch` requests and responses per exchange for batched cases.
//!
//! The reference is physical: it never includes [`FabricBenchOptions::injected_latency_ns`].
//!
//! [`FabricReport`] serialises to JSON (`--json`) and prints as an aligned table with a summary of the targets:
//! in-process within 2x of its reference, TCP within 1.5x of ping-pong per round trip, and a batch of 16 giving at
//! least 5x the verbs per second of single verbs.

mod cache_lookup;
mod dac;
mod elastic;
pub mod figures;
mod format;
mod key_stats;
mod pingpong;
pub mod project;
mod redis_compare;
mod report;
pub mod svg;
pub mod ycsb;
pub mod ycsb_run;

pub use cache_lookup::{CacheBenchOptions, CacheCase, CacheReport, run_cache};
pub use dac::{DacBenchOptions, DacCase, DacReport, DacVersusBest, run_dac};
pub use elastic::{Bucket, CloverEvent, ElasticOptions, ElasticReport, Scenario, run_elastic};
pub use key_stats::{KeyStatsBenchOptions, KeyStatsReport, run_key_stats};
pub use redis_compare::{
    REDIS_CSV_HEADER, RedisCase, RedisComparison, parse_redis_csv, plot_redis,
};

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use dinomo_fabric::{
    Batch, ClientId, Connector, CounterSnapshot, DATA_REGION, Endpoint, EndpointConfig,
    FabricError, MemoryNode, NodeConfig, RegionInfo, RemoteAddr, Server, ServerConfig, Slot,
    Target, VerbKind, counters, wire,
};
use dinomo_pool::Pool;
use serde::{Deserialize, Serialize};

pub use report::{
    BatchSpeedup, CaseResult, FabricReport, IN_PROCESS_MAX_RATIO, MIN_BATCH_SPEEDUP, Reference,
    TCP_MAX_RATIO, TargetCheck,
};

/// Size of the anonymous pool the benchmark runs on.
const POOL_SIZE: u64 = 64 << 20;
/// Segment size of that pool.
const SEGMENT_SIZE: u64 = 1 << 20;
/// Largest batch accepted (the scratch areas must fit in the pool).
pub const MAX_BATCH: usize = 4096;
/// Distance between the words used by atomics (one cache line each).
const WORD_STRIDE: u64 = 64;
/// Longest warm-up of one measurement.
const MAX_WARMUP: Duration = Duration::from_millis(30);
/// Warm-up iterations done at least, however short the duration.
const MIN_WARMUP_ITERATIONS: u64 = 4;
/// Timed slices of each measurement; the fabric and its reference take turns.
const SLICES: u32 = 4;
/// Longest stretch of the timed loop between two looks at the clock.
const MAX_CHECK_INTERVAL: Duration = Duration::from_micros(200);
/// Allocation tag of the scratch extent.
const SCRATCH_TAG: u16 = 0xbe;

/// How the benchmark reaches the memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportChoice {
    /// Verbs as direct copies and atomics on the mapped pool ([`Target::InProcess`]).
    InProcess,
    /// Verbs over a loopback TCP connection to a [`Server`] ([`Target::Tcp`]).
    Tcp,
}

impl TransportChoice {
    /// Every transport, in report order.
    pub const ALL: [TransportChoice; 2] = [TransportChoice::InProcess, TransportChoice::Tcp];

    /// "in-process" or "tcp".
    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::InProcess => "in-process",
            TransportChoice::Tcp => "tcp",
        }
    }
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransportChoice {
    type Err = anyhow::Error;

    /// Parses "in-process" (also "inprocess", "in_process", "local") or "tcp", ignoring case.
    fn from_str(s: &str) -> anyhow::Result<TransportChoice> {
        match s.to_ascii_lowercase().as_str() {
            "in-process" | "inprocess" | "in_process" | "local" => Ok(TransportChoice::InProcess),
            "tcp" => Ok(TransportChoice::Tcp),
            _ => bail!("unknown transport {s:?} (expected \"in-process\" or \"tcp\")"),
        }
    }
}

/// Settings of [`run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricBenchOptions {
    /// Timed length of each case, and separately of its reference (interleaved in four slices), after a warm-up
    /// of a tenth of it (at most 30 ms) for each. Default 300 ms.
    #[serde(rename = "duration_per_case_ms", with = "duration_ms")]
    pub duration_per_case: Duration,
    /// Verbs per posted batch in batched cases, 1 to [`MAX_BATCH`]. Default 16.
    pub batch: usize,
    /// Busy-wait the endpoint adds to every round trip (see [`EndpointConfig::injected_latency_ns`]); never added
    /// to the references. Default 0.
    pub injected_latency_ns: u64,
    /// Transports measured, in this order. Default: in-process, then TCP.
    pub transports: Vec<TransportChoice>,
    /// Name the endpoint as a KV node's, as the nodes of a cluster do: its verbs then run under the memory node's
    /// revocation gate (see [`dinomo_fabric::Clients`]), whose cost this shows. Default false.
    #[serde(default)]
    pub named_client: bool,
}

impl Default for FabricBenchOptions {
    fn default() -> Self {
        FabricBenchOptions {
            duration_per_case: Duration::from_millis(300),
            batch: 16,
            injected_latency_ns: 0,
            transports: TransportChoice::ALL.to_vec(),
            named_client: false,
        }
    }
}

mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        if !ms.is_finite() || !(0.0..=1e12).contains(&ms) {
            return Err(D::Error::custom(format!("bad duration: {ms} ms")));
        }
        Ok(Duration::from_nanos((ms * 1e6).round() as u64))
    }
}

/// One verb and size: a row pair (unbatched and batched) of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VerbCase {
    /// The verb.
    pub kind: VerbKind,
    /// Bytes moved by one verb (8 for CAS and FAA).
    pub size: u32,
}

impl VerbCase {
    /// The cases measured, in report order.
    pub const ALL: [VerbCase; 6] = [
        VerbCase {
            kind: VerbKind::Read,
            size: 8,
        },
        VerbCase {
            kind: VerbKind::Read,
            size: 1024,
        },
        VerbCase {
            kind: VerbKind::Write,
            size: 8,
        },
        VerbCase {
            kind: VerbKind::Write,
            size: 1024,
        },
        VerbCase {
            kind: VerbKind::Cas,
            size: 8,
        },
        VerbCase {
            kind: VerbKind::Faa,
            size: 8,
        },
    ];

    /// "READ 8 B", "WRITE 1 KiB", "CAS", "FAA".
    pub fn label(&self) -> String {
        let size = if self.size >= 1024 && self.size % 1024 == 0 {
            format!("{} KiB", self.size / 1024)
        } else {
            format!("{} B", self.size)
        };
        match self.kind {
            VerbKind::Read => format!("READ {size}"),
            VerbKind::Write => format!("WRITE {size}"),
            VerbKind::Cas => "CAS".to_string(),
            VerbKind::Faa => "FAA".to_string(),
        }
    }

    /// Wire bytes of one verb of this case: (request, response), as the TCP transport sends them.
    pub fn wire_bytes(&self) -> (u64, u64) {
        wire::verb_bytes(self.kind, self.size as u64)
    }

    /// Distance between the addresses of consecutive verbs of a batch.
    fn stride(&self) -> u64 {
        (self.size as u64).next_multiple_of(64).max(WORD_STRIDE)
    }
}

/// Runs the fabric micro-benchmark: every [`VerbCase`], unbatched and batched, over every transport of `opts`,
/// each beside its physical reference.
///
/// Takes about `2 × 12 × 1.1 × duration_per_case` per transport (under 17 s with the defaults and both transports).
pub fn run(opts: &FabricBenchOptions) -> anyhow::Result<FabricReport> {
    ensure!(
        !opts.duration_per_case.is_zero(),
        "the duration per case must be positive"
    );
    ensure!(
        (1..=MAX_BATCH).contains(&opts.batch),
        "the batch must hold 1 to {MAX_BATCH} verbs (got {})",
        opts.batch
    );
    ensure!(!opts.transports.is_empty(), "choose at least one transport");

    let pool = Arc::new(
        Pool::anonymous(POOL_SIZE, SEGMENT_SIZE).context("creating the benchmark's memory pool")?,
    );
    let scratch = Scratch::allocate(&pool, opts.batch)?;
    let node = MemoryNode::new(pool.clone(), NodeConfig::default());
    let endpoint_config = EndpointConfig {
        injected_latency_ns: opts.injected_latency_ns,
        ..EndpointConfig::default()
    };

    let mut cases = Vec::new();
    for &transport in &opts.transports {
        // The server (TCP) must outlive the endpoint, so it is declared first and dropped last.
        let server = match transport {
            TransportChoice::InProcess => None,
            TransportChoice::Tcp => Some(
                Server::start(
                    node.clone(),
                    ServerConfig {
                        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                        ..ServerConfig::default()
                    },
                )
                .context("starting the memory node's TCP server")?,
            ),
        };
        let target = match &server {
            None => Target::InProcess(node.clone()),
            Some(s) => Target::Tcp(s.local_addr()),
        };
        let mut connector = Connector::with_config(target, endpoint_config.clone());
        if opts.named_client {
            connector = connector.for_client(ClientId {
                node: 1,
                incarnation: 1,
            });
        }
        let endpoint = connector
            .connect()
            .with_context(|| format!("connecting to the memory node ({transport})"))?;
        let region = endpoint
            .region(DATA_REGION)
            .cloned()
            .context("the memory node has no data region")?;
        ensure!(
            scratch.offset >= region.start && scratch.end() <= region.end(),
            "the scratch extent lies outside the data region"
        );
        let mut bench = Bench {
            transport,
            endpoint,
            region,
            pool: &pool,
            scratch: &scratch,
            opts,
        };
        for case in VerbCase::ALL {
            for batched in [false, true] {
                let result = bench.case(case, batched).with_context(|| {
                    format!(
                        "{transport} {} {}",
                        case.label(),
                        if batched { "batched" } else { "unbatched" }
                    )
                })?;
                cases.push(result);
            }
        }
        drop(bench);
        drop(server);
    }
    drop(node);
    Ok(FabricReport::assemble(opts, cases))
}

/// The pool memory the benchmark works on: one area per verb family, each large enough for a batch of 1 KiB verbs.
struct Scratch {
    offset: u64,
    area: u64,
}

impl Scratch {
    fn allocate(pool: &Pool, batch: usize) -> anyhow::Result<Scratch> {
        let area = (batch as u64 * 1024).next_multiple_of(4096);
        let extent = pool
            .alloc_bytes(3 * area, SCRATCH_TAG)
            .context("allocating the benchmark's scratch memory")?;
        Ok(Scratch {
            offset: extent.offset,
            area,
        })
    }

    fn end(&self) -> u64 {
        self.offset + 3 * self.area
    }

    /// Pool offset of the first address used by `kind`.
    fn base(&self, kind: VerbKind) -> u64 {
        match kind {
            VerbKind::Read => self.offset,
            VerbKind::Write => self.offset + self.area,
            VerbKind::Cas | VerbKind::Faa => self.offset + 2 * self.area,
        }
    }

    /// Pool offsets of the `n` addresses a case uses (verb `i` of a batch goes to the `i`-th).
    fn offsets(&self, case: VerbCase, n: usize) -> Vec<u64> {
        let base = self.base(case.kind);
        (0..n as u64).map(|i| base + i * case.stride()).collect()
    }
}

/// A timed loop's outcome.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    /// Iterations of the timed loop (each one round trip, or one exchange, or one group of raw operations).
    iterations: u64,
    /// Time the timed loop took.
    elapsed: Duration,
    /// The calling thread's fabric counters over the timed loop.
    counters: CounterSnapshot,
}

impl Timing {
    fn ns_per_iteration(&self) -> f64 {
        self.elapsed.as_nanos() as f64 / self.iterations.max(1) as f64
    }
}

impl std::ops::AddAssign for Timing {
    fn add_assign(&mut self, o: Timing) {
        self.iterations += o.iterations;
        self.elapsed += o.elapsed;
        self.counters = self.counters + o.counters;
    }
}

/// One iteration of a timed loop: one fabric round trip, one reference exchange or one group of raw operations.
///
/// Every implementation is `#[inline(always)]`, so that the fabric's loop and its reference's are compiled alike:
/// a closure holding a whole inlined verb may be left out of line by the optimiser (a call and a returned `Result`
/// in memory per iteration) while the reference's small closure is inlined, which would charge the fabric for
/// the benchmark's own call.
trait Iteration {
    type Error;
    fn run(&mut self) -> Result<(), Self::Error>;
}

/// Runs `iteration` for a warm-up of a tenth of `duration` (at most 30 ms) and returns how many iterations fit
/// between two looks at the clock in the timed loop (about 200 µs worth, judging by the warm-up).
fn warm_up<I: Iteration>(duration: Duration, iteration: &mut I) -> Result<u64, I::Error> {
    let warm_for = (duration / 10).min(MAX_WARMUP);
    let start = Instant::now();
    let mut n = 0u64;
    let elapsed = loop {
        iteration.run()?;
        n += 1;
        let e = start.elapsed();
        if n >= MIN_WARMUP_ITERATIONS && e >= warm_for {
            break e;
        }
    };
    let per_iteration_ns = (elapsed.as_nanos() as f64 / n as f64).max(1.0);
    let check_ns = (duration / 50).min(MAX_CHECK_INTERVAL).as_nanos() as f64;
    Ok(((check_ns / per_iteration_ns) as u64).clamp(1, 1 << 20))
}

/// Runs `iteration` for at least `duration`, `chunk` iterations between two looks at the clock.
#[inline(always)]
fn timed_slice<I: Iteration>(
    duration: Duration,
    chunk: u64,
    iteration: &mut I,
) -> Result<Timing, I::Error> {
    let before = counters::thread_snapshot();
    let start = Instant::now();
    let mut iterations = 0u64;
    let elapsed = loop {
        for _ in 0..chunk {
            iteration.run()?;
        }
        iterations += chunk;
        let e = start.elapsed();
        if e >= duration {
            break e;
        }
    };
    let counters = counters::thread_snapshot() - before;
    Ok(Timing {
        iterations,
        elapsed,
        counters,
    })
}

/// Measures `fabric` and `reference` side by side: both warm up, then they take turns in [`SLICES`] timed slices
/// each, `duration` in all for each, so that drift of the machine (frequency, neighbours) affects both alike.
fn paired<F: Iteration, R: Iteration>(
    duration: Duration,
    mut fabric: F,
    mut reference: R,
) -> anyhow::Result<(Timing, Timing)>
where
    anyhow::Error: From<F::Error> + From<R::Error>,
{
    let fabric_chunk = warm_up(duration, &mut fabric)?;
    let reference_chunk = warm_up(duration, &mut reference)?;
    let slice = duration / SLICES;
    let (mut f, mut r) = (Timing::default(), Timing::default());
    for _ in 0..SLICES {
        f += timed_slice(slice, fabric_chunk, &mut fabric)?;
        r += timed_slice(slice, reference_chunk, &mut reference)?;
    }
    Ok((f, r))
}

/// A verb as a const generic argument: the timed loops are compiled once per verb and batching, so that neither
/// the fabric's loop nor the reference's pays a per-iteration dispatch on the case, and both inline alike.
const fn verb_code(kind: VerbKind) -> u8 {
    match kind {
        VerbKind::Read => 0,
        VerbKind::Write => 1,
        VerbKind::Cas => 2,
        VerbKind::Faa => 3,
    }
}

/// The verb of [`verb_code`] `code`.
const fn verb_of_code(code: u8) -> VerbKind {
    match code {
        0 => VerbKind::Read,
        1 => VerbKind::Write,
        2 => VerbKind::Cas,
        _ => VerbKind::Faa,
    }
}

/// Evaluates `$body` with `$k` bound to the [`verb_code`] of `$kind` and `$b` to `$batched`, both as constants.
macro_rules! monomorphic {
    ($kind:expr, $batched:expr, |$k:ident, $b:ident| $body:expr) => {{
        macro_rules! arm {
            ($verb:expr, $flag:expr) => {{
                const $k: u8 = verb_code($verb);
                const $b: bool = $flag;
                $body
            }};
        }
        match ($kind, $batched) {
            (VerbKind::Read, false) => arm!(VerbKind::Read, false),
            (VerbKind::Read, true) => arm!(VerbKind::Read, true),
            (VerbKind::Write, false) => arm!(VerbKind::Write, false),
            (VerbKind::Write, true) => arm!(VerbKind::Write, true),
            (VerbKind::Cas, false) => arm!(VerbKind::Cas, false),
            (VerbKind::Cas, true) => arm!(VerbKind::Cas, true),
            (VerbKind::Faa, false) => arm!(VerbKind::Faa, false),
            (VerbKind::Faa, true) => arm!(VerbKind::Faa, true),
        }
    }};
}
/// One transport's measurements.
struct Bench<'a> {
    transport: TransportChoice,
    endpoint: Endpoint,
    region: RegionInfo,
    pool: &'a Arc<Pool>,
    scratch: &'a Scratch,
    opts: &'a FabricBenchOptions,
}

impl Bench<'_> {
    fn case(&mut self, case: VerbCase, batched: bool) -> anyhow::Result<CaseResult> {
        let d = self.opts.duration_per_case;
        let per_round_trip = if batched { self.opts.batch } else { 1 };
        let n = per_round_trip as u64;
        let offsets = self.scratch.offsets(case, per_round_trip);
        let values = offsets
            .iter()
            .map(|&o| Ok(self.pool.atomic_u64(o)?.load(Ordering::Acquire)))
            .collect::<anyhow::Result<Vec<u64>>>()?;
        // Every WRITE's payload; it outlives the batch, which borrows it.
        let payload = match case.kind {
            VerbKind::Write => pattern(case.size as usize),
            _ => Vec::new(),
        };
        let mut fabric = FabricOp {
            endpoint: &mut self.endpoint,
            kind: case.kind,
            size: case.size,
            batched,
            addrs: offsets.iter().map(|&o| self.region.at(o)).collect(),
            buf: vec![0; case.size as usize],
            payload: &payload,
            values: values.clone(),
            batch: Batch::new(),
        };
        let (timing, reference) = match self.transport {
            TransportChoice::InProcess => {
                let mut raw = RawOp::new(self.pool, case, &offsets, values)?;
                let (timing, r) = monomorphic!(case.kind, batched, |K, B| paired(
                    d,
                    FabricIteration::<K, B>(&mut fabric),
                    RawIteration::<K>(&mut raw),
                ))?;
                let method = if n > 1 {
                    format!("{} x{n}", raw.method())
                } else {
                    raw.method().to_string()
                };
                (timing, Reference::from_timing(method, n, &r))
            }
            TransportChoice::Tcp => {
                let (out, inb) = case.wire_bytes();
                let mut pp = pingpong::PingPong::start((n * out) as usize, (n * inb) as usize)?;
                let (timing, r) = monomorphic!(case.kind, batched, |K, B| paired(
                    d,
                    FabricIteration::<K, B>(&mut fabric),
                    &mut pp,
                ))?;
                pp.finish()?;
                let method = format!("tcp ping-pong {}/{} B", n * out, n * inb);
                (timing, Reference::from_timing(method, n, &r))
            }
        };
        Ok(CaseResult::new(
            self.transport,
            case,
            batched,
            per_round_trip,
            &timing,
            reference,
        ))
    }
}

/// The fabric's [`Iteration`]: one round trip of verb `K` ([`verb_code`]), batched when `B`.
struct FabricIteration<'a, 'e, 'p, const K: u8, const B: bool>(&'a mut FabricOp<'e, 'p>);

impl<const K: u8, const B: bool> Iteration for FabricIteration<'_, '_, '_, K, B> {
    type Error = FabricError;

    #[inline(always)]
    fn run(&mut self) -> Result<(), FabricError> {
        self.0.iterate::<K, B>()
    }
}

/// The in-process reference's [`Iteration`]: the raw operations of verb `K` ([`verb_code`]).
struct RawIteration<'a, 'p, const K: u8>(&'a mut RawOp<'p>);

impl<const K: u8> Iteration for RawIteration<'_, '_, K> {
    type Error = std::convert::Infallible;

    #[inline(always)]
    fn run(&mut self) -> Result<(), Self::Error> {
        self.0.iterate::<K>();
        Ok(())
    }
}

/// The TCP reference's [`Iteration`]: one ping-pong exchange.
impl Iteration for &mut pingpong::PingPong {
    type Error = std::io::Error;

    #[inline(always)]
    fn run(&mut self) -> Result<(), std::io::Error> {
        self.exchange()
    }
}

/// One iteration of a fabric case: one verb, or one posted batch.
struct FabricOp<'e, 'p> {
    endpoint: &'e mut Endpoint,
    kind: VerbKind,
    size: u32,
    batched: bool,
    /// Where each verb of a round trip goes (one address unbatched).
    addrs: Vec<RemoteAddr>,
    /// Destination of a single READ.
    buf: Vec<u8>,
    /// The payload of every WRITE.
    payload: &'p [u8],
    /// The value each CAS expects next, one per address.
    values: Vec<u64>,
    /// Cleared and filled again for every batched round trip, as a caller keeping a batch does; its WRITEs borrow
    /// `payload`.
    batch: Batch<'p>,
}

impl FabricOp<'_, '_> {
    /// One round trip of verb `K` ([`verb_code`]), batched when `B`; the caller picks `K` and `B` from `kind` and
    /// `batched`.
    #[inline(always)]
    fn iterate<const K: u8, const B: bool>(&mut self) -> Result<(), FabricError> {
        let kind = const { verb_of_code(K) };
        debug_assert!(kind == self.kind && B == self.batched);
        let ep = &mut *self.endpoint;
        if !B {
            let a = self.addrs[0];
            match kind {
                VerbKind::Read => {
                    ep.read(a, &mut self.buf)?;
                    black_box(&self.buf);
                }
                VerbKind::Write => ep.write(a, self.payload)?,
                VerbKind::Cas => {
                    let v = self.values[0];
                    let prev = ep.cas(a, v, v.wrapping_add(1))?;
                    self.values[0] = next_expected(v, prev);
                }
                VerbKind::Faa => {
                    black_box(ep.faa(a, 1)?);
                }
            }
            return Ok(());
        }
        let batch = &mut self.batch;
        batch.clear();
        match kind {
            VerbKind::Read => {
                for &a in &self.addrs {
                    batch.read(a, self.size);
                }
            }
            VerbKind::Write => {
                for &a in &self.addrs {
                    batch.write(a, self.payload);
                }
            }
            VerbKind::Cas => {
                for (&a, &v) in self.addrs.iter().zip(&self.values) {
                    batch.cas(a, v, v.wrapping_add(1));
                }
            }
            VerbKind::Faa => {
                for &a in &self.addrs {
                    batch.faa(a, 1);
                }
            }
        }
        let posted = ep.post(batch);
        if posted.is_ok() {
            match kind {
                VerbKind::Read => {
                    black_box(batch.read_data(Slot(0)));
                }
                VerbKind::Write => {}
                VerbKind::Cas => {
                    for (i, v) in self.values.iter_mut().enumerate() {
                        *v = next_expected(*v, batch.old_value(Slot(i)));
                    }
                }
                VerbKind::Faa => {
                    black_box(batch.old_value(Slot(0)));
                }
            }
        }
        posted
    }
}

/// One iteration of the in-process reference: the raw operation on the same pool memory, once per address.
struct RawOp<'p> {
    kind: VerbKind,
    len: usize,
    /// Pool memory of each address.
    remote: Vec<*mut u8>,
    /// Local memory: `len` bytes per address.
    local: Vec<u8>,
    /// The pool words of CAS and FAA.
    words: Vec<&'p AtomicU64>,
    /// The value each CAS expects next.
    values: Vec<u64>,
}

impl<'p> RawOp<'p> {
    fn new(
        pool: &'p Pool,
        case: VerbCase,
        offsets: &[u64],
        values: Vec<u64>,
    ) -> anyhow::Result<RawOp<'p>> {
        let len = case.size as usize;
        let mut remote = Vec::with_capacity(offsets.len());
        let mut words = Vec::new();
        for &o in offsets {
            pool.check_range(o, case.size as u64)?;
            remote.push(pool.as_ptr().wrapping_add(o as usize));
            if matches!(case.kind, VerbKind::Cas | VerbKind::Faa) {
                words.push(pool.atomic_u64(o)?);
            }
        }
        Ok(RawOp {
            kind: case.kind,
            len,
            remote,
            local: pattern(offsets.len() * len),
            words,
            values,
        })
    }

    fn method(&self) -> &'static str {
        match self.kind {
            VerbKind::Read | VerbKind::Write => "memcpy",
            VerbKind::Cas => "AtomicU64::compare_exchange",
            VerbKind::Faa => "AtomicU64::fetch_add",
        }
    }

    /// The raw operations of verb `K` ([`verb_code`]); the caller picks `K` from `kind`.
    #[inline(always)]
    fn iterate<const K: u8>(&mut self) {
        let kind = const { verb_of_code(K) };
        debug_assert!(kind == self.kind);
        let len = self.len;
        match kind {
            VerbKind::Read => {
                let dst = self.local.as_mut_ptr();
                for (i, &src) in self.remote.iter().enumerate() {
                    // SAFETY: `src` points at `len` bytes inside the pool mapping (range checked in `new`), `dst + i *
                    // len` at `len` bytes of `local`; the two never overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            black_box(src.cast_const()),
                            black_box(dst.wrapping_add(i * len)),
                            black_box(len),
                        )
                    };
                }
            }
            VerbKind::Write => {
                let src = self.local.as_ptr();
                for (i, &dst) in self.remote.iter().enumerate() {
                    // SAFETY: `dst` points at `len` bytes inside the pool mapping (range checked in `new`), which only
                    // this thread touches during the measurement; `src + i * len` at `len` bytes of `local`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            black_box(src.wrapping_add(i * len)),
                            black_box(dst),
                            black_box(len),
                        )
                    };
                }
            }
            VerbKind::Cas => {
                for (w, v) in self.words.iter().zip(self.values.iter_mut()) {
                    let prev = match w.compare_exchange(
                        *v,
                        v.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(p) | Err(p) => p,
                    };
                    *v = next_expected(*v, prev);
                }
            }
            VerbKind::Faa => {
                for w in &self.words {
                    black_box(w.fetch_add(1, Ordering::AcqRel));
                }
            }
        }
    }
}

/// The value a chain of successful CAS expects next, after a CAS that expected `expected` returned `prev`.
#[inline(always)]
fn next_expected(expected: u64, prev: u64) -> u64 {
    if prev == expected {
        expected.wrapping_add(1)
    } else {
        prev
    }
}

/// `len` bytes of a recognisable pattern.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(7))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_run_reports_every_case_with_exact_round_trips() {
        let opts = FabricBenchOptions {
            duration_per_case: Duration::from_millis(5),
            ..FabricBenchOptions::default()
        };
        let report = run(&opts).expect("benchmark run");

        assert_eq!(report.options, opts);
        assert!(report.cores >= 1);
        assert_eq!(
            report.cases.len(),
            TransportChoice::ALL.len() * VerbCase::ALL.len() * 2
        );
        for transport in TransportChoice::ALL {
            for case in VerbCase::ALL {
                for batched in [false, true] {
                    let c = report
                        .cases
                        .iter()
                        .find(|c| {
                            c.transport == transport
                                && c.verb == case.kind
                                && c.size == case.size
                                && c.batched == batched
                        })
                        .unwrap_or_else(|| {
                            panic!("{transport} {} {batched} missing", case.label())
                        });
                    let per_rt = if batched { opts.batch } else { 1 };
                    assert_eq!(c.verbs_per_round_trip, per_rt);
                    assert!(c.ops_per_sec > 0.0 && c.ns_per_op > 0.0, "{c:?}");
                    assert!(c.reference.ns_per_op > 0.0 && c.ratio > 0.0, "{c:?}");
                    assert_eq!(c.counted_verbs, c.verbs, "{c:?}");
                    assert_eq!(c.round_trips * per_rt as u64, c.verbs, "{c:?}");
                    assert_eq!(c.round_trips_per_op, 1.0 / per_rt as f64, "{c:?}");
                }
            }
            assert_eq!(
                report
                    .batch_speedup
                    .iter()
                    .filter(|s| s.transport == transport && s.speedup > 0.0)
                    .count(),
                VerbCase::ALL.len()
            );
        }
        assert_eq!(report.targets.len(), 4);

        let mut table = Vec::new();
        report.print_table(&mut table).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("WRITE 1 KiB") && table.contains("tcp ping-pong"));

        let json = report.to_json_pretty().unwrap();
        let back: FabricReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cases.len(), report.cases.len());
        assert_eq!(back.options, opts);
    }

    #[test]
    fn bad_options_are_refused() {
        let zero = FabricBenchOptions {
            batch: 0,
            ..FabricBenchOptions::default()
        };
        assert!(run(&zero).is_err());
        let none = FabricBenchOptions {
            transports: vec![],
            ..FabricBenchOptions::default()
        };
        assert!(run(&none).is_err());
    }

    #[test]
    fn transport_names_parse() {
        for t in TransportChoice::ALL {
            assert_eq!(t.name().parse::<TransportChoice>().unwrap(), t);
        }
        assert!("udp".parse::<TransportChoice>().is_err());
        assert_eq!(VerbCase::ALL[1].label(), "READ 1 KiB");
        assert_eq!(VerbCase::ALL[2].label(), "WRITE 8 B");
    }
}
