//! `dinomo bench figure 5 --front-door resp`: Figure 5's DINOMO / Clover comparison with both systems behind the
//! same front door. For each system, KV-node count and workload the recipe starts `dinomo up --system S` as a child
//! process on loopback (a fresh data directory each time), drives it through the Redis protocol with the same
//! YCSB clients ([`TargetOptions::Resp`]), and stops it with SIGINT, requiring a clean exit.
//!
//! What "N KV nodes" means for each system:
//! - DINOMO: `dinomo up --kns N`, each KV node with its own Redis port, `kn_threads` workers and one event-loop
//!   thread; the clients' connections are spread over the N ports and forwarded to the owner when needed.
//! - Clover: its compute nodes are the front door's threads. `dinomo up --system clover` gives every Redis
//!   connection its own Clover client, and runs each command on the event-loop thread that serves the
//!   connection, so N KV nodes are `N × kn_threads` event-loop threads (`kn.resp.io_threads`): as many threads
//!   running the store's data path as DINOMO's N nodes have workers. One memory node, no replication.
//!
//! Fabric round trips per operation come from `INFO fabric`, which both kinds of `dinomo up` fill from the same
//! process-wide fabric counters: every thread of the serving process, so the background work (DINOMO's heartbeats
//! and routing refreshes, Clover's metadata server) is in them too.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use super::{Comparison, Files, Findings, Scale, cores, figure5_cache_bytes, figure5_sizes, mean};
use crate::format::rate;
use crate::ycsb::{Distribution, Workload};
use crate::ycsb_run::{
    PlotKind, RespOptions, System, TargetOptions, YcsbOptions, YcsbReport, YcsbSweep, plot,
    run_ycsb,
};

/// The folder the recipe writes to, under the output folder.
pub const FOLDER: &str = "figure5-resp";

/// The systems compared, DINOMO first.
pub const SYSTEMS: [System; 2] = [System::Dinomo, System::Clover];

/// How long `dinomo up` may take to print its banner, and to exit after SIGINT.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The workloads: read-only (C), read-mostly (B) and write-heavy (A), Zipf 0.99.
fn workloads(scale: Scale) -> Vec<(&'static str, Workload)> {
    let all = vec![
        ("read-only (C)", Workload::C),
        ("read-mostly, 5% updates (B)", Workload::B),
        ("write-heavy, 50% updates (A)", Workload::A),
    ];
    match scale {
        Scale::Tiny => vec![all[0], all[2]],
        _ => all,
    }
}

/// Everything one scale fixes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Records loaded, 8 B keys and 1 KiB values.
    pub records: u64,
    /// KV-node counts.
    pub kns: Vec<usize>,
    /// DINOMO's workers per KV node (and Clover's event-loop threads per KV node).
    pub kn_threads: usize,
    /// DINOMO's cache per KV node: 1/32 of the data, as the paper's 1 GB per node of 32 GB.
    pub cache_bytes: u64,
    /// DINOMO's pool file.
    pub pool_bytes: u64,
    /// Client threads, one connection each.
    pub clients: usize,
    /// Requests each client keeps in flight.
    pub outstanding: usize,
    /// Warm-up before the measured phase, in seconds (at most, with `warmup_ops`).
    pub warmup_secs: f64,
    /// The measured phase, in seconds (at most, with `ops`).
    pub secs: f64,
    /// Warm-up operations in all (tiny: they end the phase; the time still bounds it).
    pub warmup_ops: Option<u64>,
    /// Measured operations in all (tiny).
    pub ops: Option<u64>,
}

/// The plan of `scale`: the in-process Figure 5's settings.
pub fn plan(scale: Scale) -> Plan {
    // A tiny run starts a `dinomo up` per case: fewer records than in process.
    let (records, kns, secs, warmup) = match scale {
        Scale::Tiny => (300, vec![1, 2], 10.0, 10.0),
        _ => figure5_sizes(scale),
    };
    let tiny = scale == Scale::Tiny;
    Plan {
        records,
        kns,
        kn_threads: 2,
        cache_bytes: figure5_cache_bytes(records, 1024),
        pool_bytes: if tiny { 128 << 20 } else { 1 << 30 },
        clients: if tiny { 2 } else { 8 },
        outstanding: 1,
        warmup_secs: warmup,
        secs,
        warmup_ops: tiny.then_some(100),
        ops: tiny.then_some(400),
    }
}

impl Plan {
    /// The KV-node counts, joined by `sep`.
    fn kns_list(&self, sep: &str) -> String {
        self.kns
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(sep)
    }
}

/// The arguments of `dinomo up` for `system` at `kns` KV nodes, with its data in `dir`, and the configuration file's
/// text (written to `dir/up.toml` and passed with `--config`).
pub fn up_args(system: System, kns: usize, p: &Plan, dir: &Path) -> (Vec<String>, String) {
    let dir_s = dir.display().to_string();
    let mut args: Vec<String> = [
        "up",
        "--system",
        system.name(),
        "--data-dir",
        &dir_s,
        "--persist",
        "volatile",
        "--resp-listen",
        "127.0.0.1:0",
        "--max-value",
        "1024",
    ]
    .map(String::from)
    .to_vec();
    let config = if system.is_pdpm() {
        // Sized for twice the records: the workloads add no keys, and retired versions wait out the reclaim lease.
        args.extend(
            [
                "--memory-nodes",
                "1",
                "--replication",
                "1",
                "--max-key",
                "64",
                "--keys",
                &(2 * p.records).max(1024).to_string(),
            ]
            .map(String::from),
        );
        format!(
            "# Clover's compute-node threads: {kns} KV node(s) x {} threads.\n[kn.resp]\nio_threads = {}\n",
            p.kn_threads,
            kns * p.kn_threads
        )
    } else {
        args.extend(
            [
                "--kns",
                &kns.to_string(),
                "--threads",
                &p.kn_threads.to_string(),
                "--cache",
                &p.cache_bytes.to_string(),
                "--pool-size",
                &p.pool_bytes.to_string(),
                "--rn-listen",
                "127.0.0.1:0",
                // A machine busy with the benchmark must not take a late heartbeat for a failure (as the
                // in-process target's lease).
                "--lease-ms",
                "2000",
                "--heartbeat-ms",
                "200",
            ]
            .map(String::from),
        );
        "# DINOMO: every setting is a flag.\n".to_string()
    };
    args.extend([
        "--config".to_string(),
        dir.join("up.toml").display().to_string(),
    ]);
    (args, config)
}

/// A `dinomo up` child process: interrupted (then killed, if it does not exit) when dropped.
struct Up {
    child: Option<Child>,
    /// The rest of its standard output, line by line.
    lines: Receiver<String>,
    /// Its Redis addresses, from the banner.
    resp: Vec<String>,
}

impl Up {
    /// Starts `exe args` and reads its banner until it has printed everything it serves.
    fn start(exe: &Path, args: &[String], log: &Path) -> anyhow::Result<Up> {
        let stderr =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(exe)
            .args(args)
            .env("DINOMO_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stdout = child.stdout.take().context("dinomo up's stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut up = Up {
            child: Some(child),
            lines,
            resp: Vec::new(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match up.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    bail!(
                        "dinomo up printed no banner within {START_TIMEOUT:?} (log: {})",
                        log.display()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = up.child.as_mut().map(|c| c.wait()).transpose()?;
                    up.child = None;
                    bail!(
                        "dinomo up exited before it served ({status:?}): {}",
                        std::fs::read_to_string(log).unwrap_or_default().trim()
                    )
                }
            };
            if let Some((_, addr)) = line.split_once("Redis protocol on ") {
                up.resp.push(addr.trim().to_string());
            }
            // DINOMO's banner ends with its memory node, a baseline's with its replication.
            let line = line.trim();
            if line.starts_with("memory node:") || line.starts_with("replication") {
                return Ok(up);
            }
        }
    }

    /// Interrupts it and waits for a clean exit: status 0 and "stopped cleanly" printed.
    fn stop(mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("dinomo up is not running");
        };
        let Some(status) = interrupt(&mut child)? else {
            bail!("dinomo up did not stop within {STOP_TIMEOUT:?} of SIGINT: killed");
        };
        // The reader thread hands over the last lines, then ends when the pipe closes.
        let mut rest = Vec::new();
        let drained = Instant::now() + STOP_TIMEOUT;
        while let Ok(line) = self
            .lines
            .recv_timeout(drained.saturating_duration_since(Instant::now()))
        {
            rest.push(line);
        }
        ensure!(status.success(), "dinomo up exited with {status}");
        ensure!(
            rest.iter().any(|l| l.contains("stopped cleanly")),
            "dinomo up exited without stopping cleanly: {rest:?}"
        );
        Ok(())
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = interrupt(&mut child);
        }
    }
}

/// Sends `child` SIGINT and waits up to [`STOP_TIMEOUT`] for it to exit: its status, or `None` when it had to be
/// killed. A child that cannot be waited on is killed too.
fn interrupt(child: &mut Child) -> std::io::Result<Option<ExitStatus>> {
    // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) if Instant::now() <= deadline => std::thread::sleep(Duration::from_millis(20)),
            waited => {
                let _ = child.kill();
                let _ = child.wait();
                return waited.map(|_| None);
            }
        }
    }
}

/// One run: starts `dinomo up`, runs `workload` through RESP, stops it. The report names the system and the
/// KV-node count (the RESP target cannot tell them).
fn run_one(
    exe: &Path,
    system: System,
    kns: usize,
    workload: Workload,
    p: &Plan,
    data: &Path,
) -> anyhow::Result<YcsbReport> {
    let dir = data.join(format!("{system}-{kns}kn-{workload}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (args, config) = up_args(system, kns, p, &dir);
    std::fs::write(dir.join("up.toml"), config)?;
    let up = Up::start(exe, &args, &dir.join("up.log"))?;
    let expected = if system.is_pdpm() { 1 } else { kns };
    ensure!(
        up.resp.len() == expected,
        "dinomo up --system {system} served {} Redis address(es), expected {expected}",
        up.resp.len()
    );
    let opts = YcsbOptions {
        system,
        target: TargetOptions::Resp(RespOptions {
            addrs: up.resp.clone(),
            password: String::new(),
        }),
        workload,
        distribution: Distribution::Zipfian { theta: 0.99 },
        records: p.records,
        value_bytes: 1024,
        clients: p.clients,
        outstanding: p.outstanding,
        warmup_secs: p.warmup_secs,
        secs: p.secs,
        warmup_ops: p.warmup_ops,
        ops: p.ops,
        ..YcsbOptions::default()
    };
    let report = run_ycsb(&opts, &mut |_| {});
    let stopped = up.stop();
    let mut report = report.with_context(|| format!("{system}, {kns} KV node(s), {workload}"))?;
    stopped.with_context(|| format!("stopping {system} after {workload} on {kns} KV node(s)"))?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    report.system = system.name().to_string();
    report.kv_nodes = Some(kns);
    Ok(report)
}

/// The command line of one `dinomo up` and its benchmark, for the report.
fn commands(system: System, p: &Plan, out: &Path) -> Vec<String> {
    let kns = p.kns_list(" ");
    let dir = out.join("data");
    let (mut args, _) = up_args(system, 0, p, &dir);
    // The placeholders the loop fills.
    for a in &mut args {
        if a == "0" && system.variant().is_some() {
            *a = "$N".into();
        }
    }
    let limits = match (p.warmup_ops, p.ops) {
        (Some(w), Some(n)) => format!(
            "--warmup-ops {w} --ops {n} --warmup-secs {} --secs {}",
            p.warmup_secs, p.secs
        ),
        _ => format!("--warmup-secs {} --secs {}", p.warmup_secs, p.secs),
    };
    let config_note = if system.is_pdpm() {
        format!("   # up.toml: [kn.resp] io_threads = {} x N", p.kn_threads)
    } else {
        String::new()
    };
    vec![
        format!("for N in {kns}, for W in the workloads (fresh data directory each):{config_note}"),
        format!("  dinomo {} &", args.join(" ")),
        format!(
            "  dinomo bench ycsb --target resp --resp ADDR[,ADDR..] --workload $W --distribution zipf:0.99 \
             --records {} --value-bytes 1024 --clients {} --outstanding {} {limits}; kill -INT %1",
            p.records, p.clients, p.outstanding
        ),
    ]
}

/// Runs the recipe: every system, KV-node count and workload, each on a `dinomo up` of its own started from `exe`.
pub(super) fn figure5_resp(
    scale: Scale,
    exe: &Path,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let p = plan(scale);
    let data: PathBuf = files.dir.join("data");
    let mut all: Vec<YcsbReport> = Vec::new();
    let mut cmds = Vec::new();
    for system in SYSTEMS {
        cmds.extend(commands(system, &p, &files.dir));
        for (name, workload) in workloads(scale) {
            let mut sweep = YcsbSweep { runs: Vec::new() };
            for &n in &p.kns {
                progress(&format!(
                    "figure 5 (front door: RESP): {system}, {name}, {n} KV node(s)"
                ));
                sweep
                    .runs
                    .push(run_one(exe, system, n, workload, &p, &data)?);
            }
            files.write_results(&sweep.file_stem(), &sweep, &sweep.to_csv(), &sweep.to_svg())?;
            all.extend(sweep.runs);
        }
    }
    // Nothing of the data directories is kept.
    let _ = std::fs::remove_dir(&data);
    files.write("throughput.svg", &plot(PlotKind::Nodes, &all))?;
    files.write("throughput.csv", &table_csv(&all))?;
    let largest = p.kns.iter().copied().max().unwrap_or(1);
    Ok(Findings {
        title: "DINOMO and Clover behind the same front door (Redis protocol), throughput against KV nodes, YCSB \
                with Zipf 0.99",
        commands: cmds,
        rows: rows(scale, &all, &p, largest),
        not_built: Vec::new(),
        differences: vec![
            format!(
                "one {}-core machine runs `dinomo up` (every node of the system in one process, in-process \
                 fabric) and the benchmark's clients, which reach it over loopback TCP (the paper: separate \
                 servers, 56 Gb/s InfiniBand)",
                cores()
            ),
            format!(
                "KV nodes: DINOMO runs N KV nodes of {0} workers and one Redis event-loop thread each, the \
                 clients' connections spread over their ports; Clover's compute nodes are the front door's \
                 threads (every connection has its own Clover client, run on the event-loop thread serving it), \
                 so N KV nodes are N x {0} event-loop threads (kn.resp.io_threads): as many data-path threads as \
                 DINOMO's workers. One memory node, no replication",
                p.kn_threads
            ),
            "a Redis client does not route by owner: at N > 1 DINOMO's KV node forwards a key it does not own to \
             its owner over loopback TCP ((N-1)/N of the requests; DINOMO's native client goes straight to the \
             owner), a hop Clover, which has no owners, never makes"
                .into(),
            format!(
                "{} client threads, {} request(s) in flight each (the paper raises the requests in flight until \
                 the KV nodes saturate); {} records of 1 KiB; DINOMO caches 1/32 of the data per KV node",
                p.clients, p.outstanding, p.records
            ),
            "fabric round trips per operation are the serving process's (INFO fabric, every thread of `dinomo \
             up`: DINOMO's heartbeats and routing refreshes and Clover's metadata server included), over the \
             measured phase's operations"
                .into(),
        ],
    })
}

/// One line per run: system, KV nodes, workload, throughput and latency.
fn table_csv(runs: &[YcsbReport]) -> String {
    let mut s = String::from(
        "system,kv_nodes,workload,ops_per_s,p50_us,p99_us,round_trips_per_op,reads_verified,errors\n",
    );
    for r in runs {
        s.push_str(&format!(
            "{},{},{},{:.0},{:.1},{:.1},{},{},{}\n",
            r.system,
            r.kv_nodes.unwrap_or(0),
            r.options.workload,
            r.measured.ops_per_s,
            r.latency.p50_us,
            r.latency.p99_us,
            round_trips(r).map_or(String::new(), |x| format!("{x:.3}")),
            r.measured.reads_verified,
            r.measured.errors.total()
        ));
    }
    s
}

/// The serving process's fabric round trips per operation, when it published them.
fn round_trips(r: &YcsbReport) -> Option<f64> {
    r.server_fabric.as_ref().map(|f| f.round_trips_per_op)
}

/// The report's rows: each workload's throughput at every node count, the DINOMO / Clover ratio at the largest,
/// and the runs' errors.
fn rows(scale: Scale, runs: &[YcsbReport], p: &Plan, largest: usize) -> Vec<Comparison> {
    let run = |system: System, w: Workload, n: usize| {
        runs.iter()
            .find(|r| r.system == system.name() && r.kv_nodes == Some(n) && r.options.workload == w)
    };
    let at =
        |system: System, w: Workload, n: usize| run(system, w, n).map(|r| r.measured.ops_per_s);
    let rt = |system: System, w: Workload| run(system, w, largest).and_then(round_trips);
    let kns = p.kns_list(" / ");
    let mut out = Vec::new();
    let mut ratios: Vec<(&str, f64)> = Vec::new();
    let mut rt_ratios: Vec<(&str, f64, f64)> = Vec::new();
    for (name, w) in workloads(scale) {
        let series = |system: System| {
            p.kns
                .iter()
                .map(|&n| at(system, w, n).map_or("—".into(), rate))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let ratio = match (
            at(System::Dinomo, w, largest),
            at(System::Clover, w, largest),
        ) {
            (Some(d), Some(c)) if c > 0.0 => Some(d / c),
            _ => None,
        };
        if let Some(r) = ratio {
            ratios.push((name, r));
        }
        if let (Some(c), Some(d)) = (rt(System::Clover, w), rt(System::Dinomo, w)) {
            rt_ratios.push((name, c, d));
        }
        out.push(Comparison::new(
            format!("{name}: ops/s at {kns} KNs, and DINOMO / Clover at {largest}"),
            "DINOMO ≥ 3.8× Clover at 16 KNs",
            Some(3.8),
            format!(
                "DINOMO {}; Clover {}; {}",
                series(System::Dinomo),
                series(System::Clover),
                ratio.map_or("—".into(), |r| format!("{r:.2}×"))
            ),
            ratio,
            format!("{largest} KV nodes at most, not 16; both behind `dinomo up`'s Redis protocol"),
        ));
    }
    let lowest = ratios.iter().map(|x| x.1).min_by(f64::total_cmp);
    out.insert(
        0,
        Comparison::new(
            format!(
                "DINOMO / Clover throughput at {largest} KNs, same front door, lowest over the workloads (measured)"
            ),
            "≥ 3.8× on every workload (at 16 KNs)",
            Some(3.8),
            match lowest {
                Some(lo) => format!(
                    "{lo:.2}× ({})",
                    ratios
                        .iter()
                        .map(|(n, r)| format!("{r:.2}× {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => "—".into(),
            },
            lowest,
            format!(
                "{largest} KV nodes at most, not 16; one {}-core machine: both systems' threads share its cores",
                cores()
            ),
        ),
    );
    for system in SYSTEMS {
        let scaling = mean(workloads(scale).iter().filter_map(|(_, w)| {
            match (at(system, *w, 1), at(system, *w, largest)) {
                (Some(a), Some(b)) if a > 0.0 => Some(b / a),
                _ => None,
            }
        }));
        out.push(Comparison::new(
            format!("{system} throughput, {largest} KNs / 1 KN (mean over the workloads)"),
            if system == System::Dinomo {
                "scales to 16 KNs"
            } else {
                "does not scale beyond 4 KNs"
            },
            None,
            scaling.map_or("—".into(), |s| format!("{s:.2}")),
            scaling,
            "more KV nodes add threads, not cores, on this machine",
        ));
    }
    let errors: u64 = runs.iter().map(|r| r.measured.errors.total()).sum();
    let verified: u64 = runs.iter().map(|r| r.measured.reads_verified).sum();
    out.push(Comparison::new(
        "failed operations and wrong reads, every run",
        "—",
        None,
        format!(
            "{errors} in {} runs ({verified} reads checked against what was written)",
            runs.len()
        ),
        Some(errors as f64),
        "every value read is checked against the versions the workload wrote",
    ));
    let rt_low = rt_ratios
        .iter()
        .filter(|x| x.2 > 0.0)
        .map(|x| x.1 / x.2)
        .min_by(f64::total_cmp);
    out.push(Comparison::new(
        format!("Clover / DINOMO fabric round trips per op at {largest} KNs (the serving process's)"),
        "4× to 87×",
        None,
        if rt_ratios.is_empty() {
            "absent: the servers did not publish INFO fabric".to_string()
        } else {
            rt_ratios
                .iter()
                .map(|(n, c, d)| {
                    let ratio = if *d > 0.0 { format!("{:.1}×", c / d) } else { "—".into() };
                    format!("{ratio} {n} ({c:.2} vs {d:.2})")
                })
                .collect::<Vec<_>>()
                .join(", ")
        },
        rt_low,
        "every thread of `dinomo up` counts: background work (DINOMO's heartbeats and routing refreshes, \
         Clover's metadata server) is included",
    ));
    out
}
