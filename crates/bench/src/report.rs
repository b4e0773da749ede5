//! What [`crate::run`] returns: per-case results beside their references, batch speedups and the targets.

use std::io::{self, Write};

use dinomo_fabric::VerbKind;
use serde::{Deserialize, Serialize};

use crate::format::rate;
use crate::{FabricBenchOptions, Timing, TransportChoice, VerbCase};

/// Target: in-process fabric ns/op at most this many times its raw reference.
pub const IN_PROCESS_MAX_RATIO: f64 = 2.0;
/// Target: TCP fabric ns per round trip at most this many times the ping-pong's.
pub const TCP_MAX_RATIO: f64 = 1.5;
/// Target: batched verbs/s at least this many times unbatched verbs/s.
pub const MIN_BATCH_SPEEDUP: f64 = 5.0;

/// The physical reference measured beside one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// What was measured: "memcpy", "AtomicU64::fetch_add x16", "tcp ping-pong 48/32 B" (bytes out/in per
    /// exchange).
    pub method: String,
    /// Nanoseconds per operation (per verb-equivalent).
    pub ns_per_op: f64,
    /// Nanoseconds per iteration: one exchange for TCP, one group of `verbs_per_round_trip` raw operations
    /// in-process.
    pub ns_per_round_trip: f64,
    /// Iterations of the timed loop.
    pub iterations: u64,
    /// Length of the timed loop, in nanoseconds.
    pub elapsed_ns: u64,
}

impl Reference {
    /// A reference whose every iteration stood for `ops` operations.
    pub(crate) fn from_timing(method: String, ops: u64, t: &Timing) -> Reference {
        let ns_per_round_trip = t.ns_per_iteration();
        Reference {
            method,
            ns_per_op: ns_per_round_trip / ops as f64,
            ns_per_round_trip,
            iterations: t.iterations,
            elapsed_ns: t.elapsed.as_nanos() as u64,
        }
    }
}

/// One measured case: a transport, a verb and size, unbatched or batched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// Transport.
    pub transport: TransportChoice,
    /// Label: "READ 8 B", "WRITE 1 KiB", "CAS", "FAA".
    pub case: String,
    /// The verb.
    pub verb: VerbKind,
    /// Bytes per verb.
    pub size: u32,
    /// True when verbs were posted in batches.
    pub batched: bool,
    /// Verbs per round trip: 1 unbatched, the batch size batched.
    pub verbs_per_round_trip: usize,
    /// Verbs completed in the timed loop.
    pub verbs: u64,
    /// Verbs seen by the fabric's thread counters over the timed loop (equals `verbs`).
    pub counted_verbs: u64,
    /// Round trips seen by the fabric's thread counters over the timed loop.
    pub round_trips: u64,
    /// Length of the timed loop, in nanoseconds.
    pub elapsed_ns: u64,
    /// Verbs per second.
    pub ops_per_sec: f64,
    /// Nanoseconds per verb.
    pub ns_per_op: f64,
    /// Round trips per verb, from the counters: 1 unbatched, 1/batch batched.
    pub round_trips_per_op: f64,
    /// Nanoseconds per round trip, from the counters.
    pub ns_per_round_trip: f64,
    /// The physical reference measured beside this case.
    pub reference: Reference,
    /// Fabric cost over reference cost: ns/op ÷ reference ns/op in-process, ns per round trip ÷ ping-pong ns per
    /// exchange over TCP (the same quotient when the counters are exact).
    pub ratio: f64,
}

impl CaseResult {
    pub(crate) fn new(
        transport: TransportChoice,
        case: VerbCase,
        batched: bool,
        verbs_per_round_trip: usize,
        fabric: &Timing,
        reference: Reference,
    ) -> CaseResult {
        let verbs = fabric.iterations * verbs_per_round_trip as u64;
        let elapsed_ns = fabric.elapsed.as_nanos() as f64;
        let round_trips = fabric.counters.round_trips;
        let ns_per_op = elapsed_ns / verbs as f64;
        let ns_per_round_trip = elapsed_ns / round_trips.max(1) as f64;
        let ratio = match transport {
            TransportChoice::InProcess => ns_per_op / reference.ns_per_op,
            TransportChoice::Tcp => ns_per_round_trip / reference.ns_per_round_trip,
        };
        CaseResult {
            transport,
            case: case.label(),
            verb: case.kind,
            size: case.size,
            batched,
            verbs_per_round_trip,
            verbs,
            counted_verbs: fabric.counters.verbs(),
            round_trips,
            elapsed_ns: elapsed_ns as u64,
            ops_per_sec: verbs as f64 * 1e9 / elapsed_ns,
            ns_per_op,
            round_trips_per_op: round_trips as f64 / verbs as f64,
            ns_per_round_trip,
            reference,
            ratio,
        }
    }

    fn label(&self) -> String {
        format!(
            "{} {}",
            self.case,
            if self.batched { "batched" } else { "single" }
        )
    }
}

/// How much batching multiplies the verbs per second of one transport and case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSpeedup {
    /// Transport.
    pub transport: TransportChoice,
    /// Label of the case.
    pub case: String,
    /// The verb.
    pub verb: VerbKind,
    /// Bytes per verb.
    pub size: u32,
    /// Verbs per batch.
    pub batch: usize,
    /// Verbs per second, one verb per round trip.
    pub unbatched_ops_per_sec: f64,
    /// Verbs per second, `batch` verbs per round trip.
    pub batched_ops_per_sec: f64,
    /// `batched_ops_per_sec / unbatched_ops_per_sec`.
    pub speedup: f64,
}

/// Whether one performance target was met, with the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    /// What the target says.
    pub name: String,
    /// Transport it is judged on.
    pub transport: TransportChoice,
    /// The figure compared: "ratio" (of each case) or "batch_speedup" (of each case).
    pub metric: String,
    /// Limit.
    pub threshold: f64,
    /// True when figures must be at most the threshold, false when at least.
    pub at_most: bool,
    /// The worst figure among the cases.
    pub worst: f64,
    /// The case that gave it.
    pub worst_case: String,
    /// Cases within the target.
    pub passing: usize,
    /// Cases judged.
    pub total: usize,
    /// True when every case is within the target.
    pub met: bool,
    /// Context for reading the result, if any.
    pub note: Option<String>,
}

/// Everything one run of the fabric benchmark measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricReport {
    /// Logical cores available to the process.
    pub cores: usize,
    /// Processor architecture ("x86_64", "aarch64").
    pub arch: String,
    /// Operating system ("linux").
    pub os: String,
    /// Options of the run.
    pub options: FabricBenchOptions,
    /// Every case, by transport, then verb and size, then unbatched before batched.
    pub cases: Vec<CaseResult>,
    /// Batched over unbatched verbs per second, by transport and case.
    pub batch_speedup: Vec<BatchSpeedup>,
    /// The targets, each judged on every relevant case.
    pub targets: Vec<TargetCheck>,
}

impl FabricReport {
    pub(crate) fn assemble(opts: &FabricBenchOptions, cases: Vec<CaseResult>) -> FabricReport {
        let mut batch_speedup = Vec::new();
        for single in cases.iter().filter(|c| !c.batched) {
            if let Some(batched) = cases.iter().find(|c| {
                c.batched
                    && c.transport == single.transport
                    && c.verb == single.verb
                    && c.size == single.size
            }) {
                batch_speedup.push(BatchSpeedup {
                    transport: single.transport,
                    case: single.case.clone(),
                    verb: single.verb,
                    size: single.size,
                    batch: batched.verbs_per_round_trip,
                    unbatched_ops_per_sec: single.ops_per_sec,
                    batched_ops_per_sec: batched.ops_per_sec,
                    speedup: batched.ops_per_sec / single.ops_per_sec,
                });
            }
        }

        let mut targets = Vec::new();
        for &transport in &opts.transports {
            let (name, threshold) = match transport {
                TransportChoice::InProcess => (
                    format!("in-process within {IN_PROCESS_MAX_RATIO}x of the raw operation"),
                    IN_PROCESS_MAX_RATIO,
                ),
                TransportChoice::Tcp => (
                    format!("tcp within {TCP_MAX_RATIO}x of ping-pong per round trip"),
                    TCP_MAX_RATIO,
                ),
            };
            let figures: Vec<(f64, String)> = cases
                .iter()
                .filter(|c| c.transport == transport)
                .map(|c| (c.ratio, c.label()))
                .collect();
            let note = (opts.injected_latency_ns > 0).then(|| {
                format!(
                    "the fabric pays {} ns of injected latency per round trip; the reference does not",
                    opts.injected_latency_ns
                )
            });
            targets.extend(judge(
                name, transport, "ratio", threshold, true, figures, note,
            ));
        }
        for &transport in &opts.transports {
            let figures: Vec<(f64, String)> = batch_speedup
                .iter()
                .filter(|s| s.transport == transport)
                .map(|s| (s.speedup, s.case.clone()))
                .collect();
            let note = (transport == TransportChoice::InProcess && opts.injected_latency_ns == 0).then(|| {
                "an in-process round trip costs next to nothing, so there is little for a batch to amortise"
                    .to_string()
            });
            targets.extend(judge(
                format!(
                    "{transport} batch of {} gives >= {MIN_BATCH_SPEEDUP}x the verbs/s of single verbs",
                    opts.batch
                ),
                transport,
                "batch_speedup",
                MIN_BATCH_SPEEDUP,
                false,
                figures,
                note,
            ));
        }

        FabricReport {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            arch: std::env::consts::ARCH.to_string(),
            os: std::env::consts::OS.to_string(),
            options: opts.clone(),
            cases,
            batch_speedup,
            targets,
        }
    }

    /// The report as pretty-printed JSON (what `--json` prints).
    pub fn to_json_pretty(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// Writes the report as aligned tables (cases beside their references, batch speedups) followed by the
    /// targets, each marked met or not met with its numbers.
    pub fn print_table(&self, out: &mut impl Write) -> io::Result<()> {
        let o = &self.options;
        writeln!(
            out,
            "fabric micro-benchmark: {} cores ({}/{}), {} ms per case, batch {}, injected latency {} ns{}",
            self.cores,
            self.os,
            self.arch,
            fmt_num(o.duration_per_case.as_secs_f64() * 1e3),
            o.batch,
            o.injected_latency_ns,
            if o.named_client {
                ", endpoints named as a KV node's (revocation gate)"
            } else {
                ""
            }
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "{:<10}  {:<11}  {:>7}  {:>9}  {:>9}  {:>6}  {:>9}  {:>6}  reference",
            "transport", "case", "batched", "ops/s", "ns/op", "RT/op", "ref ns/op", "ratio"
        )?;
        for c in &self.cases {
            writeln!(
                out,
                "{:<10}  {:<11}  {:>7}  {:>9}  {:>9}  {:>6}  {:>9}  {:>6}  {}",
                c.transport.name(),
                c.case,
                if c.batched {
                    format!("x{}", c.verbs_per_round_trip)
                } else {
                    "no".to_string()
                },
                rate(c.ops_per_sec),
                fmt_num(c.ns_per_op),
                fmt_round_trips(c),
                fmt_num(c.reference.ns_per_op),
                format!("{:.2}x", c.ratio),
                c.reference.method
            )?;
        }
        writeln!(
            out,
            "RT/op: round trips per verb from the fabric's thread counters; ratio: fabric ns/op / reference ns/op \
             (tcp: per round trip)"
        )?;
        if !self.batch_speedup.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{:<10}  {:<11}  {:>12}  {:>13}  {:>7}",
                "transport", "case", "single ops/s", "batched ops/s", "speedup"
            )?;
            for s in &self.batch_speedup {
                writeln!(
                    out,
                    "{:<10}  {:<11}  {:>12}  {:>13}  {:>7}",
                    s.transport.name(),
                    s.case,
                    rate(s.unbatched_ops_per_sec),
                    rate(s.batched_ops_per_sec),
                    format!("{:.2}x", s.speedup)
                )?;
            }
        }
        writeln!(out)?;
        writeln!(out, "targets:")?;
        for t in &self.targets {
            writeln!(
                out,
                "  {:<9} {}: {} {:.2}x ({}); {}/{} cases within",
                if t.met { "[met]" } else { "[NOT MET]" },
                t.name,
                if t.at_most { "worst" } else { "lowest" },
                t.worst,
                t.worst_case,
                t.passing,
                t.total
            )?;
            if let Some(note) = &t.note {
                writeln!(out, "      note: {note}")?;
            }
        }
        Ok(())
    }
}

/// Judges `figures` (value, case label) against a threshold; nothing when there are none.
fn judge(
    name: String,
    transport: TransportChoice,
    metric: &str,
    threshold: f64,
    at_most: bool,
    figures: Vec<(f64, String)>,
    note: Option<String>,
) -> Option<TargetCheck> {
    let within = |v: f64| {
        if at_most {
            v <= threshold
        } else {
            v >= threshold
        }
    };
    let worse = |a: f64, b: f64| if at_most { a > b } else { a < b };
    let (worst, worst_case) = figures
        .iter()
        .fold(None::<&(f64, String)>, |acc, f| match acc {
            Some(w) if !worse(f.0, w.0) => Some(w),
            _ => Some(f),
        })?
        .clone();
    let passing = figures.iter().filter(|f| within(f.0)).count();
    Some(TargetCheck {
        name,
        transport,
        metric: metric.to_string(),
        threshold,
        at_most,
        worst,
        worst_case,
        passing,
        total: figures.len(),
        met: passing == figures.len(),
        note,
    })
}

/// Two decimals below 10, one below 10 000, none above.
fn fmt_num(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 10_000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// "1", "1/16", or the decimal figure when the counters are not exact.
fn fmt_round_trips(c: &CaseResult) -> String {
    if c.round_trips > 0 && c.round_trips * c.verbs_per_round_trip as u64 == c.verbs {
        if c.verbs_per_round_trip == 1 {
            "1".to_string()
        } else {
            format!("1/{}", c.verbs_per_round_trip)
        }
    } else {
        format!("{:.4}", c.round_trips_per_op)
    }
}
