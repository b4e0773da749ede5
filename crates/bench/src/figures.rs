//! `dinomo bench figure N --scale tiny|small|full`: the DINOMO paper's Figures 3, 5, 6, 7 and 8, scaled to the
//! machine at hand, each run with the existing benchmarks and written to `OUT/figureN/`: the benchmarks' own
//! results (JSON, CSV, SVG), then `figureN.json` and `figureN.md`, a table of the paper's numbers beside ours.
//!
//! | figure | paper (§5) | recipe |
//! |---|---|---|
//! | 3 | caching policies, one KN, 1–16% cache | [`run_dac`] |
//! | 5 | throughput vs KV nodes, five YCSB workloads, Zipf 0.99 | [`run_sweep`] per workload for DINOMO, DINOMO-S and DINOMO-N, then [`project`] to 16 KV nodes |
//! | 6 | autoscaling under a bursty load | `add` and `remove` scenarios of [`run_elastic`] for DINOMO and DINOMO-N (the M-node's policy engine, which triggers them in the paper, is not driven by this recipe) |
//! | 7 | selective replication of 4 hot keys, Zipf 2 | `replicate` scenario |
//! | 8 | a KV node fails | `failure` scenario for DINOMO and DINOMO-N |
//!
//! The pDPM paper's Figure 7 ([`run_pdpm_figure`], `pdpm`), Figure 9 and Figure 10 ([`run_pdpm_scaling_figure`],
//! `pdpm-mn` and `pdpm-cn`) run its stores ([`System::PDPM`]) on YCSB and write to `OUT/pdpm-figureN/`.
//!
//! DINOMO-S and DINOMO-N run beside DINOMO where the paper compares them (Figures 5, 6 and 8). Clover runs beside
//! them in Figure 5 (on the pDPM target, its compute nodes counted as KV nodes, projected to 16 like DINOMO), in
//! Figures 6 and 8 (compute nodes joining, leaving and crashing mid-write, [`run_elastic`]) and in Figure 7 (its
//! steady throughput under the same Zipf 2 load: it has no owners, so nothing to replicate). Scales: `tiny` is a
//! smoke run of seconds (the test suite runs it), `small` takes a minute or two per figure on a 2-core machine (RESULTS.md), `full` is as large as one
//! machine sensibly runs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::elastic::{ElasticOptions, ElasticReport, Scenario, run_elastic};
use crate::project::{HardwareProfile, Projection, project};
use crate::ycsb::{Distribution, Workload};
use crate::ycsb_run::{
    InProcessOptions, PlotKind, System, TargetOptions, YcsbOptions, YcsbReport, plot, run_sweep,
    run_ycsb,
};
use crate::{DacBenchOptions, DacReport, run_dac};

mod front_door;
pub use front_door::{FOLDER as FRONT_DOOR_FOLDER, SYSTEMS as FRONT_DOOR_SYSTEMS};

/// The figures with a recipe.
pub const FIGURES: [u32; 5] = [3, 5, 6, 7, 8];

/// How large a recipe runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scale {
    /// Seconds: a smoke run for the test suite.
    Tiny,
    /// A minute or two per figure on a 2-core machine.
    Small,
    /// As large as one machine sensibly runs (several minutes per figure).
    Full,
}

impl Scale {
    /// "tiny", "small" or "full".
    pub fn name(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Small => "small",
            Scale::Full => "full",
        }
    }
}

impl FromStr for Scale {
    type Err = String;

    fn from_str(s: &str) -> Result<Scale, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tiny" => Ok(Scale::Tiny),
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            other => Err(format!("unknown scale {other:?} (tiny, small or full)")),
        }
    }
}

impl std::fmt::Display for Scale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One claim of the paper beside what the recipe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// What is compared.
    pub claim: String,
    /// The paper's number or statement.
    pub paper: String,
    /// The paper's number, when it states one.
    pub paper_value: Option<f64>,
    /// Ours, or why there is none.
    pub ours: String,
    /// Our number, when there is one.
    pub ours_value: Option<f64>,
    /// `ours_value / paper_value`, when both exist.
    pub ratio: Option<f64>,
    /// What differs between the two setups.
    pub differs: String,
}

impl Comparison {
    fn new(
        claim: impl Into<String>,
        paper: impl Into<String>,
        paper_value: Option<f64>,
        ours: impl Into<String>,
        ours_value: Option<f64>,
        differs: impl Into<String>,
    ) -> Comparison {
        let ratio = match (ours_value, paper_value) {
            (Some(o), Some(p)) if p != 0.0 && o.is_finite() => Some(o / p),
            _ => None,
        };
        Comparison {
            claim: claim.into(),
            paper: paper.into(),
            paper_value,
            ours: ours.into(),
            ours_value,
            ratio,
            differs: differs.into(),
        }
    }

    /// A claim about a system that is not built: no number of ours.
    fn not_built(claim: &str, paper: &str, paper_value: Option<f64>, systems: &str) -> Comparison {
        Comparison::new(
            claim,
            paper,
            paper_value,
            format!("not built ({systems})"),
            None,
            "the system compared with is not built in this project",
        )
    }
}

/// What a recipe produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureReport {
    /// The paper's figure number.
    pub figure: u32,
    /// The paper the figure is from: "DINOMO" or "pDPM".
    #[serde(default = "dinomo_paper")]
    pub paper: String,
    /// What it shows.
    pub title: String,
    /// The scale it ran at.
    pub scale: Scale,
    /// Cores of the machine it ran on.
    pub host_cores: usize,
    /// The command that reproduces it, then the benchmark commands it amounts to.
    pub commands: Vec<String>,
    /// The paper's claims beside ours.
    pub rows: Vec<Comparison>,
    /// Systems of the figure that are not built (never run, never faked).
    pub not_built: Vec<String>,
    /// How the setup differs from the paper's.
    pub differences: Vec<String>,
    /// Files written, relative to the figure's folder.
    pub files: Vec<String>,
}

fn dinomo_paper() -> String {
    "DINOMO".into()
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

impl FigureReport {
    /// The report as Markdown: the commands, the table, what is not built and what differs.
    pub fn to_markdown(&self) -> String {
        // The DINOMO paper's figures keep their plain heading.
        let paper = if self.paper == dinomo_paper() {
            String::new()
        } else {
            format!("{} ", self.paper)
        };
        let mut s = format!(
            "## {paper}Figure {}: {}\n\nScale `{}` on a {}-core machine.\n\n```sh\n",
            self.figure, self.title, self.scale, self.host_cores
        );
        for c in &self.commands {
            let _ = writeln!(s, "{c}");
        }
        s.push_str("```\n\n| claim | paper | ours | ours / paper | what differs |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            let ratio = r.ratio.map_or("—".to_string(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r.claim, r.paper, r.ours, ratio, r.differs
            );
        }
        if !self.not_built.is_empty() {
            let _ = writeln!(s, "\nNot built, so not run: {}.", self.not_built.join(", "));
        }
        if !self.differences.is_empty() {
            s.push('\n');
            for d in &self.differences {
                let _ = writeln!(s, "- {d}");
            }
        }
        let _ = writeln!(s, "\nFiles: {}", self.files.join(", "));
        s
    }
}

/// Runs the recipe of `figure` at `scale`, writing into `out/figureN/`; `progress` hears what is happening.
pub fn run_figure(
    figure: u32,
    scale: Scale,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<FigureReport> {
    let mut files = Files::create(out.join(format!("figure{figure}")))?;
    let found = match figure {
        3 => figure3(scale, &mut files, progress)?,
        5 => figure5(scale, &mut files, progress)?,
        6 => figure6(scale, &mut files, progress)?,
        7 => figure7(scale, &mut files, progress)?,
        8 => figure8(scale, &mut files, progress)?,
        other => bail!(
            "no recipe for figure {other} (recipes: {})",
            FIGURES.map(|f| f.to_string()).join(", ")
        ),
    };
    let command = format!(
        "dinomo bench figure {figure} --scale {scale} --out {}",
        out.display()
    );
    files.publish(
        &format!("figure{figure}"),
        found.into_report(figure, scale, command),
    )
}

/// Where the systems of a figure are reached from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrontDoor {
    /// Each system as its recipe runs it: DINOMO in process behind loopback TCP, Clover's compute nodes as the
    /// benchmark's client threads.
    InProcess,
    /// Every system behind the Redis protocol of a `dinomo up --system S` child process, driven by the same clients
    /// (Figure 5 only; written to `OUT/figure5-resp/`).
    Resp,
}

impl FromStr for FrontDoor {
    type Err = String;

    fn from_str(s: &str) -> Result<FrontDoor, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "in-process" => Ok(FrontDoor::InProcess),
            "resp" => Ok(FrontDoor::Resp),
            other => Err(format!("unknown front door {other:?} (in-process or resp)")),
        }
    }
}

/// Runs Figure 5's DINOMO / Clover comparison with both systems behind the Redis protocol: each system, KV-node
/// count and workload on a `dinomo up` child process started from `dinomo_exe`, writing into
/// `out/figure5-resp/`. `progress` hears what is happening.
pub fn run_figure5_front_door(
    scale: Scale,
    out: &Path,
    dinomo_exe: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<FigureReport> {
    let mut files = Files::create(out.join(front_door::FOLDER))?;
    let found = front_door::figure5_resp(scale, dinomo_exe, &mut files, progress)?;
    let command = format!(
        "dinomo bench figure 5 --front-door resp --scale {scale} --out {}",
        out.display()
    );
    files.publish("figure5", found.into_report(5, scale, command))
}

/// What a recipe found; [`run_figure`] adds the figure, scale, host and files to make its report.
struct Findings {
    title: &'static str,
    /// The benchmark commands the recipe amounts to.
    commands: Vec<String>,
    rows: Vec<Comparison>,
    not_built: Vec<String>,
    differences: Vec<String>,
}

impl Findings {
    /// The report of `figure` at `scale`: `command` (the one that ran the recipe) first, then the recipe's own.
    fn into_report(self, figure: u32, scale: Scale, command: String) -> FigureReport {
        let mut commands = vec![command];
        commands.extend(self.commands);
        FigureReport {
            figure,
            paper: dinomo_paper(),
            title: self.title.into(),
            scale,
            host_cores: cores(),
            commands,
            rows: self.rows,
            not_built: self.not_built,
            differences: self.differences,
            files: Vec::new(),
        }
    }
}

/// Where a recipe writes, and what it wrote.
struct Files {
    dir: PathBuf,
    written: Vec<String>,
}

impl Files {
    /// Creates the recipe's folder `dir`.
    fn create(dir: PathBuf) -> anyhow::Result<Files> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Files {
            dir,
            written: Vec::new(),
        })
    }

    /// Writes `report` as `stem.json` and `stem.md`, its `files` set to every file the recipe wrote and those two.
    fn publish(mut self, stem: &str, mut report: FigureReport) -> anyhow::Result<FigureReport> {
        let (json_name, md_name) = (format!("{stem}.json"), format!("{stem}.md"));
        report.files = self.written.clone();
        report.files.push(json_name.clone());
        report.files.push(md_name.clone());
        self.write(&json_name, &serde_json::to_string_pretty(&report)?)?;
        self.write(&md_name, &report.to_markdown())?;
        Ok(report)
    }

    fn write(&mut self, name: &str, body: &str) -> anyhow::Result<()> {
        let path = self.dir.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        if !self.written.iter().any(|w| w == name) {
            self.written.push(name.to_string());
        }
        Ok(())
    }

    /// A benchmark's result as `stem.json`, its table as `stem.csv` and its plot as `stem.svg`.
    fn write_results(
        &mut self,
        stem: &str,
        result: &impl Serialize,
        csv: &str,
        svg: &str,
    ) -> anyhow::Result<()> {
        self.write(
            &format!("{stem}.json"),
            &serde_json::to_string_pretty(result)?,
        )?;
        self.write(&format!("{stem}.csv"), csv)?;
        self.write(&format!("{stem}.svg"), svg)
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn host_note() -> String {
    format!(
        "one {}-core machine runs every node and client, with an in-process fabric (the paper: separate servers, \
         56 Gb/s InfiniBand)",
        cores()
    )
}

// ---------------------------------------------------------------------------------------------------------------
// Figure 3: caching policies.

fn dac_options(scale: Scale) -> DacBenchOptions {
    match scale {
        Scale::Tiny => DacBenchOptions {
            keys: 4000,
            duration: Duration::from_millis(10),
            warmup_passes: 2.0,
            ..DacBenchOptions::default()
        },
        Scale::Small => DacBenchOptions {
            keys: 200_000,
            duration: Duration::from_millis(300),
            ..DacBenchOptions::default()
        },
        Scale::Full => DacBenchOptions::default(),
    }
}

fn dac_command(o: &DacBenchOptions, out: &Path) -> String {
    format!(
        "dinomo bench dac --keys {} --value-size {} --working-set {} --cache {} --threads {} --ms {} \
         --warmup-passes {} --latency-ns {} --out {}",
        o.keys,
        o.value_size,
        o.working_set_percent,
        o.cache_percents
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(","),
        o.threads,
        o.duration.as_millis(),
        o.warmup_passes,
        o.injected_latency_ns,
        out.display()
    )
}

fn figure3(
    scale: Scale,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let opts = dac_options(scale);
    let report = run_dac(&opts, |s| progress(&format!("figure 3: {s}")))?;
    files.write_results("dac", &report, &report.to_csv(), &report.to_svg())?;
    let differs = format!(
        "{} keys, not 30M; {} KV-node worker, not 16; fabric emulated at {} ns per round trip",
        opts.keys, opts.threads, opts.injected_latency_ns
    );
    let worst = report
        .dac_versus_best
        .iter()
        .min_by(|a, b| a.ratio.total_cmp(&b.ratio));
    let mut rows = vec![Comparison::new(
        "DAC / best other policy, worst cache size",
        "≥ 0.84 (\"within 16% of the best policy, in all settings\")",
        Some(0.84),
        worst.map_or("no cases".into(), |w| {
            format!(
                "{:.2} (at {}%, best: {})",
                w.ratio, w.cache_percent, w.best_policy
            )
        }),
        worst.map(|w| w.ratio),
        differs.clone(),
    )];
    for (pct, paper_best) in [(2.0, "shortcut-only"), (8.0, "value-only")] {
        let best = best_policy(&report, pct, false);
        rows.push(Comparison::new(
            format!("best policy at {pct}% of the data"),
            paper_best,
            None,
            best.map_or("not run".into(), |(p, r)| format!("{p} ({:.0} reads/s)", r)),
            None,
            differs.clone(),
        ));
    }
    let at4 = |p: &str| case_rate(&report, 4.0, p);
    let dac_over = match (at4("dac"), at4("shortcut-only"), at4("value-only")) {
        (Some(d), Some(s), Some(v)) if s.max(v) > 0.0 => Some(d / s.max(v)),
        _ => None,
    };
    rows.push(Comparison::new(
        "DAC / better of shortcut-only and value-only at 4%",
        "> 1 (\"DAC exceeds the performance of both\")",
        None,
        num(dac_over),
        dac_over,
        differs,
    ));
    Ok(Findings {
        title: "caching policies: read throughput as the cache grows from 1% to 16% of the data",
        commands: vec![dac_command(&opts, &files.dir)],
        rows,
        not_built: Vec::new(),
        differences: vec![
            "reads are driven directly into KV-node workers (no client network), as the paper generates them \
             locally on the KV node"
                .into(),
            "the cache budget counts real per-entry memory (key, value, shortcut and structure), so a 64 B value \
             costs only about 1.6× a shortcut"
                .into(),
        ],
    })
}

fn case_rate(r: &DacReport, pct: f64, policy: &str) -> Option<f64> {
    r.cases
        .iter()
        .find(|c| c.cache_percent == pct && c.policy == policy)
        .map(|c| c.reads_per_sec)
}

/// The fastest policy at `pct` (DAC left out unless `with_dac`).
fn best_policy(r: &DacReport, pct: f64, with_dac: bool) -> Option<(String, f64)> {
    r.cases
        .iter()
        .filter(|c| c.cache_percent == pct && (with_dac || c.policy != "dac"))
        .max_by(|a, b| a.reads_per_sec.total_cmp(&b.reads_per_sec))
        .map(|c| (c.policy.clone(), c.reads_per_sec))
}

// ---------------------------------------------------------------------------------------------------------------
// Figure 5: throughput against KV nodes.

/// The paper's five request patterns (§5 "Workloads"), with 8 B keys, 1 KiB values and Zipf 0.99.
fn figure5_workloads(scale: Scale) -> Vec<(&'static str, Workload)> {
    let all = vec![
        ("read-only", Workload::C),
        ("read-mostly (5% updates)", Workload::B),
        (
            "read-mostly (5% inserts)",
            "read=0.95,insert=0.05".parse().expect("a fixed mix parses"),
        ),
        ("write-heavy (50% updates)", Workload::A),
        ("write-heavy (50% inserts)", Workload::W),
    ];
    match scale {
        Scale::Tiny => vec![all[0], all[3]],
        _ => all,
    }
}

/// The systems of Figure 5, DINOMO first. Clover runs on the pDPM target, where `kns` is the number of compute
/// nodes (the paper's Clover KNs) and the same client threads are spread over them.
const FIGURE5_SYSTEMS: [System; 4] = [
    System::Dinomo,
    System::DinomoS,
    System::DinomoN,
    System::Clover,
];

/// Figure 5 at `scale`: records loaded, KV-node counts, and the measured and warm-up phases' seconds (a tiny run's
/// operation counts end it first).
fn figure5_sizes(scale: Scale) -> (u64, Vec<usize>, f64, f64) {
    match scale {
        Scale::Tiny => (500, vec![1, 2], 20.0, 20.0),
        Scale::Small => (20_000, vec![1, 2, 4], 3.0, 1.0),
        Scale::Full => (100_000, vec![1, 2, 4, 8], 10.0, 2.0),
    }
}

/// A Figure 5 KV node's cache for `records` values of `value_bytes` (8 B keys): the paper's KV nodes each cache 1 GB
/// of 32 GB loaded, 1/32 of the data per node.
fn figure5_cache_bytes(records: u64, value_bytes: u64) -> u64 {
    (records * (8 + value_bytes) / 32).max(64 << 10)
}

fn figure5_options(scale: Scale, workload: Workload, system: System) -> (YcsbOptions, Vec<usize>) {
    let (records, kns, secs, warmup) = figure5_sizes(scale);
    let value_bytes = 1024;
    let cache_bytes = figure5_cache_bytes(records, value_bytes as u64);
    let tiny = scale == Scale::Tiny;
    // A pDPM store is sized for its keys up front (Clover's shortcut cells, found by bounded probing): an insert
    // workload also counts its operations (the time limits still hold), so that at most 600 000 keys are inserted,
    // and the store is sized for twice what it may insert.
    let insert = workload.mix().fraction(crate::ycsb::OpKind::Insert);
    let (pdpm_keys, warmup_ops, ops) = if system.is_pdpm() && !tiny && insert > 0.0 {
        let warmup_ops: u64 = 200_000;
        let ops = ((600_000.0 / insert) as u64).min(3_000_000);
        let inserted = ((warmup_ops + ops) as f64 * insert).ceil() as u64;
        (Some(records + 2 * inserted), Some(warmup_ops), Some(ops))
    } else {
        (None, tiny.then_some(100), tiny.then_some(300))
    };
    let opts = YcsbOptions {
        system,
        target: TargetOptions::InProcess(InProcessOptions {
            cache_bytes,
            policy: system.default_policy(),
            merge_threads: if tiny { 1 } else { 4 },
            pool_bytes: tiny.then_some(256 << 20),
            pdpm_keys,
            ..InProcessOptions::default()
        }),
        workload,
        distribution: Distribution::Zipfian { theta: 0.99 },
        records,
        value_bytes,
        clients: if tiny { 2 } else { 8 },
        outstanding: if tiny { 4 } else { 1 },
        warmup_secs: warmup,
        secs,
        warmup_ops,
        ops,
        ..YcsbOptions::default()
    };
    (opts, kns)
}

fn ycsb_command(o: &YcsbOptions, kns: &[usize], out: &Path) -> String {
    let TargetOptions::InProcess(p) = &o.target else {
        return "dinomo bench ycsb --target native ...".into();
    };
    let kns_list = kns
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",");
    if o.system.is_pdpm() {
        // No KV-node threads, cache or merge threads: the pDPM target takes none of those flags.
        let one = YcsbOptions {
            target: TargetOptions::InProcess(InProcessOptions {
                kns: kns.first().copied().unwrap_or(1),
                ..p.clone()
            }),
            ..o.clone()
        };
        return pdpm_command(&one, out).replacen(
            &format!(" --kns {} ", kns.first().copied().unwrap_or(1)),
            &format!(" --sweep-kns {kns_list} "),
            1,
        );
    }
    let mut s = format!(
        "dinomo bench ycsb --system {} --workload {} --distribution {} --records {} --value-bytes {} --clients {} \
         --outstanding {} --kn-threads {} --cache-bytes {} --merge-threads {} --sweep-kns {}",
        o.system,
        o.workload,
        o.distribution,
        o.records,
        o.value_bytes,
        o.clients,
        o.outstanding,
        p.kn_threads,
        p.cache_bytes,
        p.merge_threads,
        kns_list
    );
    match (o.warmup_ops, o.ops) {
        (Some(w), Some(n)) => {
            let _ = write!(s, " --warmup-ops {w} --ops {n}");
        }
        _ => {
            let _ = write!(s, " --warmup-secs {} --secs {}", o.warmup_secs, o.secs);
        }
    }
    if let Some(pool) = p.pool_bytes {
        let _ = write!(s, " --pool-bytes {pool}");
    }
    let _ = write!(s, " --out {}", out.display());
    s
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn figure5(
    scale: Scale,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let mut all_runs: Vec<YcsbReport> = Vec::new();
    let mut commands = Vec::new();
    let mut largest = 0;
    for system in FIGURE5_SYSTEMS {
        for (name, workload) in figure5_workloads(scale) {
            let (opts, kns) = figure5_options(scale, workload, system);
            largest = largest.max(kns.iter().copied().max().unwrap_or(1));
            progress(&format!("figure 5: {system}, {name} on {kns:?} KV node(s)"));
            let sweep = run_sweep(&opts, &kns, &mut |p| {
                if let crate::ycsb_run::Progress::Phase(step) = p {
                    progress(&format!("figure 5: {step}"));
                }
            })?;
            files.write_results(&sweep.file_stem(), &sweep, &sweep.to_csv(), &sweep.to_svg())?;
            commands.push(ycsb_command(&opts, &kns, &files.dir));
            all_runs.extend(sweep.runs);
        }
    }
    files.write("throughput.svg", &plot(PlotKind::Nodes, &all_runs))?;
    files.write("round-trips.svg", &plot(PlotKind::RoundTrips, &all_runs))?;
    files.write("hit-ratios.svg", &plot(PlotKind::HitRatios, &all_runs))?;
    let system_rows = figure5_system_rows(scale, &all_runs, largest)?;
    let clover_rows = figure5_clover_rows(scale, &all_runs, largest, files)?;
    commands.push(format!(
        "dinomo bench project {0}/ycsb-clover-sweep-*.json --profile paper --max-kns 16 --out {0}",
        files.dir.display()
    ));
    // The projection and the rows below are DINOMO's; the variants are compared in `system_rows`.
    let runs: Vec<YcsbReport> = all_runs
        .into_iter()
        .filter(|r| r.system == System::Dinomo.name())
        .collect();

    let paper = project(&runs, &HardwareProfile::paper(), 16)?;
    write_projection(files, "projection-paper", &paper)?;
    let local = project(&runs, &HardwareProfile::local(cores()), largest)?;
    write_projection(files, "projection-local", &local)?;
    commands.push(format!(
        "dinomo bench project {0}/ycsb-sweep-*.json --profile paper --max-kns 16 --out {0}",
        files.dir.display()
    ));
    commands.push(format!(
        "dinomo bench project {0}/ycsb-sweep-*.json --profile local --max-kns {largest} --out {0}",
        files.dir.display()
    ));

    let at =
        |n: usize| -> Vec<&YcsbReport> { runs.iter().filter(|r| r.kv_nodes == Some(n)).collect() };
    let first = at(1);
    let last = at(largest);
    let rt_last = mean(
        last.iter()
            .filter_map(|r| r.resources.as_ref().map(|x| x.per_op.round_trips)),
    );
    let value_hits = |rs: &[&YcsbReport]| {
        mean(
            rs.iter()
                .filter_map(|r| r.cache.as_ref()?.ratios.map(|h| h.value)),
        )
    };
    let (v1, vn) = (value_hits(&first), value_hits(&last));
    let scaling = mean(figure5_workloads(scale).iter().filter_map(|(_, w)| {
        let ops = |n: usize| {
            runs.iter()
                .find(|r| r.kv_nodes == Some(n) && r.options.workload == *w)
                .map(|r| r.measured.ops_per_s)
        };
        match (ops(1), ops(largest)) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a),
            _ => None,
        }
    }));
    let model_scaling = mean(paper.series.iter().filter_map(|s| {
        let first = s.points.first()?;
        let last = s.points.last()?;
        (first.predicted_ops_per_s > 0.0)
            .then(|| last.predicted_ops_per_s / first.predicted_ops_per_s)
    }));
    let model16 = mean(
        paper
            .series
            .iter()
            .filter_map(|s| s.points.last().map(|p| p.predicted_ops_per_s)),
    );
    let binds: Vec<String> = {
        let mut b: Vec<String> = paper
            .series
            .iter()
            .filter_map(|s| s.points.last().map(|p| p.bound_by.name().to_string()))
            .collect();
        b.sort();
        b.dedup();
        b
    };
    let worst_check = local
        .series
        .iter()
        .flat_map(|s| &s.checks)
        .map(|c| c.error)
        .max_by(|a, b| a.abs().total_cmp(&b.abs()));
    let scaled = format!(
        "{} records of 1 KiB, cache 1/32 of the data per node as in the paper; {largest} KV nodes at most, not 16",
        runs.first().map_or(0, |r| r.options.records)
    );
    let mut rows = clover_rows;
    rows.extend(system_rows);
    rows.extend([
        Comparison::new(
            format!(
                "fabric round trips per op at the largest scale (paper 16 KNs, ours {largest})"
            ),
            "0.1 (across all workloads)",
            Some(0.1),
            num(rt_last),
            rt_last,
            scaled.clone(),
        ),
        Comparison::new(
            format!("value hits, 1 KN → largest scale (ours {largest} KNs)"),
            "52% → 88%",
            Some(0.88),
            match (v1, vn) {
                (Some(a), Some(b)) => format!("{:.0}% → {:.0}%", a * 100.0, b * 100.0),
                _ => "no lookups".into(),
            },
            vn,
            scaled.clone(),
        ),
        Comparison::new(
            format!("measured throughput, {largest} KNs / 1 KN (mean over workloads)"),
            "scales to 16 KNs (Figure 5)",
            None,
            num(scaling),
            scaling,
            format!("{}: more nodes add threads, not cores", host_note()),
        ),
        Comparison::new(
            "MODEL: throughput at 16 KNs / 1 KN on the paper's hardware (mean over workloads)",
            "scales to 16 KNs (Figure 5)",
            None,
            format!(
                "{} (projected {} ops/s at 16 KNs, bound by {})",
                num(model_scaling),
                num(model16),
                binds.join(", ")
            ),
            model_scaling,
            "a bottleneck model fed with per-op resources measured here (projection-paper.txt), not a measurement",
        ),
        Comparison::new(
            "MODEL check: prediction / measured − 1 on this machine, worst run",
            "—",
            None,
            worst_check.map_or("—".into(), |e| format!("{:+.1}%", e * 100.0)),
            worst_check,
            "the local profile (this machine's cores, in-process fabric) against every run above (projection-local.txt)",
        ),
    ]);
    Ok(Findings {
        title: "throughput against the number of KV nodes, YCSB with Zipf 0.99",
        commands,
        rows,
        not_built: Vec::new(),
        differences: vec![
            host_note(),
            "clients run one request at a time (the paper raises the requests in flight until the KV nodes \
             saturate)"
                .into(),
            "Clover: its compute nodes (the paper's Clover KNs) are the client threads themselves, spread over `kns` \
             compute nodes, so a Clover operation skips the client-to-KN hop and the KN's network threads that \
             every DINOMO operation pays here; one memory node, the metadata server on a memory node of its own; \
             its cache is the per-client cursor cache (the paper's shortcut-only cache, per thread rather than per \
             KN). Its projection counts the client threads' CPU as the compute nodes'"
                .into(),
        ],
    })
}

/// The runs of `system` on `workload`.
fn runs_of(runs: &[YcsbReport], system: System, workload: Workload) -> Vec<YcsbReport> {
    runs.iter()
        .filter(|r| r.system == system.name() && r.options.workload == workload)
        .cloned()
        .collect()
}

/// Figure 5's comparisons of DINOMO with Clover: measured at the largest node count, and projected to 16 KV nodes
/// on the paper's hardware from each system's own per-op resources. Writes Clover's projections.
fn figure5_clover_rows(
    scale: Scale,
    runs: &[YcsbReport],
    largest: usize,
    files: &mut Files,
) -> anyhow::Result<Vec<Comparison>> {
    let workloads = figure5_workloads(scale);
    let clover: Vec<YcsbReport> = runs
        .iter()
        .filter(|r| r.system == System::Clover.name())
        .cloned()
        .collect();
    let paper_profile = HardwareProfile::paper();
    let clover_paper = project(&clover, &paper_profile, 16)?;
    write_projection(files, "projection-paper-clover", &clover_paper)?;
    let clover_local = project(&clover, &HardwareProfile::local(cores()), largest)?;
    write_projection(files, "projection-local-clover", &clover_local)?;
    let at = |system: System, w: Workload, n: usize| {
        runs.iter()
            .find(|r| r.system == system.name() && r.kv_nodes == Some(n) && r.options.workload == w)
    };
    // Measured, at the largest node count: DINOMO / Clover throughput and Clover / DINOMO round trips.
    let mut measured: Vec<(&str, f64)> = Vec::new();
    let mut round_trips: Vec<(&str, f64, f64)> = Vec::new();
    let mut clover_scaling: Vec<(&str, f64)> = Vec::new();
    for (name, w) in &workloads {
        let (Some(d), Some(c)) = (
            at(System::Dinomo, *w, largest),
            at(System::Clover, *w, largest),
        ) else {
            continue;
        };
        if c.measured.ops_per_s > 0.0 {
            measured.push((name, d.measured.ops_per_s / c.measured.ops_per_s));
        }
        if let (Some(rd), Some(rc)) = (d.resources.as_ref(), c.resources.as_ref()) {
            round_trips.push((name, rc.per_op.round_trips, rd.per_op.round_trips));
        }
        if let Some(c1) = at(System::Clover, *w, 1).filter(|r| r.measured.ops_per_s > 0.0) {
            clover_scaling.push((name, c.measured.ops_per_s / c1.measured.ops_per_s));
        }
    }
    // MODEL: each system projected from its own runs on this workload; then again with Clover's compute nodes
    // charged DINOMO's per-op network-thread CPU at the same node count, since the paper's Clover KNs receive
    // their clients' requests over the network as DINOMO's KNs do, and here they are the clients.
    let mut projected: Vec<(&str, f64, String, String)> = Vec::new();
    let mut charged: Vec<(&str, f64, String, String)> = Vec::new();
    for (name, w) in &workloads {
        let (d_runs, c_runs) = (
            runs_of(runs, System::Dinomo, *w),
            runs_of(runs, System::Clover, *w),
        );
        if d_runs.is_empty() || c_runs.is_empty() {
            continue;
        }
        let c_charged: Vec<YcsbReport> = c_runs
            .iter()
            .cloned()
            .map(|mut r| {
                let network = d_runs
                    .iter()
                    .find(|d| d.kv_nodes == r.kv_nodes)
                    .and_then(|d| d.resources.as_ref()?.per_op.kn_network_cpu_us);
                if let Some(p) = r.resources.as_mut().map(|x| &mut x.per_op)
                    && let (Some(c), Some(n)) = (p.client_cpu_us, network)
                {
                    p.client_cpu_us = Some(c + n);
                }
                r
            })
            .collect();
        let last = |rs: &[YcsbReport]| -> anyhow::Result<Option<(f64, String)>> {
            let p = project(rs, &paper_profile, 16)?;
            Ok(p.series
                .first()
                .and_then(|s| s.points.last())
                .map(|p| (p.predicted_ops_per_s, p.bound_by.name().to_string())))
        };
        let d_last = last(&d_runs)?;
        if let (Some((d, d_bound)), Some((c, c_bound))) = (&d_last, last(&c_runs)?)
            && c > 0.0
        {
            projected.push((name, d / c, d_bound.clone(), c_bound));
        }
        if let (Some((d, d_bound)), Some((c, c_bound))) = (&d_last, last(&c_charged)?)
            && c > 0.0
        {
            charged.push((name, d / c, d_bound.clone(), c_bound));
        }
    }
    let lowest = |v: &[(&str, f64)]| v.iter().map(|x| x.1).min_by(f64::total_cmp);
    let listed = |v: &[(&str, f64)]| {
        v.iter()
            .map(|(name, r)| format!("{r:.2}× {name}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let model_low =
        |v: &[(&str, f64, String, String)]| v.iter().map(|x| x.1).min_by(f64::total_cmp);
    let model_list = |v: &[(&str, f64, String, String)]| {
        v.iter()
            .map(|(name, r, d, c)| format!("{r:.2}× {name} (DINOMO bound by {d}, Clover by {c})"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let rt_ratios: Vec<f64> = round_trips
        .iter()
        .filter(|(_, _, d)| *d > 0.0)
        .map(|(_, c, d)| c / d)
        .collect();
    let rt_range = match (
        rt_ratios.iter().copied().min_by(f64::total_cmp),
        rt_ratios.iter().copied().max_by(f64::total_cmp),
    ) {
        (Some(lo), Some(hi)) => format!("{lo:.1}× to {hi:.1}×"),
        _ => "—".into(),
    };
    let rt_list = round_trips
        .iter()
        .map(|(name, c, d)| format!("{c:.2} vs {d:.2} {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let scaled = format!("{largest} KV nodes at most, not 16; {}", host_note());
    Ok(vec![
        Comparison::new(
            format!(
                "DINOMO / Clover throughput at {largest} KNs, lowest over the workloads (measured)"
            ),
            "≥ 3.8× on every workload (at 16 KNs)",
            Some(3.8),
            match lowest(&measured) {
                Some(lo) => format!("{lo:.2}× ({})", listed(&measured)),
                None => "—".into(),
            },
            lowest(&measured),
            format!(
                "{scaled}; Clover's compute nodes are the client threads (no client-to-KN hop), DINOMO's KV nodes \
                 are reached over loopback TCP"
            ),
        ),
        Comparison::new(
            "MODEL: DINOMO / Clover throughput at 16 KNs on the paper's hardware, lowest over the workloads",
            "≥ 3.8× on every workload",
            Some(3.8),
            match model_low(&projected) {
                Some(lo) => format!("{lo:.2}× ({})", model_list(&projected)),
                None => "—".into(),
            },
            model_low(&projected),
            "a bottleneck model fed with each system's per-op resources measured here (projection-paper.txt, \
             projection-paper-clover.txt), not a measurement; contention among Clover's compute nodes, which \
             grows with their number, is not in it",
        ),
        Comparison::new(
            "MODEL: the same, Clover's compute nodes charged DINOMO's per-op network-thread CPU (they serve \
             clients over the network in the paper)",
            "≥ 3.8× on every workload",
            Some(3.8),
            match model_low(&charged) {
                Some(lo) => format!("{lo:.2}× ({})", model_list(&charged)),
                None => "—".into(),
            },
            model_low(&charged),
            "an estimate of the request handling Clover's KNs would do: DINOMO's KV nodes' network threads per \
             op at the same node count, added to Clover's compute-node CPU",
        ),
        Comparison::new(
            format!("Clover / DINOMO round trips per op at {largest} KNs"),
            "4× to 87×",
            None,
            format!("{rt_range} (Clover vs DINOMO RT/op: {rt_list})"),
            None,
            scaled.clone(),
        ),
        Comparison::new(
            format!("Clover throughput, {largest} KNs / 1 KN (measured)"),
            "does not scale beyond 4 KNs (network or metadata-server CPU)",
            None,
            match mean(clover_scaling.iter().map(|x| x.1)) {
                Some(m) => format!("{m:.2} mean ({})", listed(&clover_scaling)),
                None => "—".into(),
            },
            mean(clover_scaling.iter().map(|x| x.1)),
            format!("{}: more compute nodes add threads, not cores", host_note()),
        ),
    ])
}

/// Figure 5's comparisons of DINOMO with DINOMO-S and DINOMO-N, from the runs of all three at the largest node
/// count.
fn figure5_system_rows(
    scale: Scale,
    runs: &[YcsbReport],
    largest: usize,
) -> anyhow::Result<Vec<Comparison>> {
    let workloads = figure5_workloads(scale);
    let run = |system: System, w: Workload| {
        runs.iter().find(|r| {
            r.system == system.name() && r.kv_nodes == Some(largest) && r.options.workload == w
        })
    };
    let scaled = format!("{largest} KV nodes at most, not 16; {}", host_note());

    // DINOMO against DINOMO-N, workload by workload.
    let ratios: Vec<(&str, f64)> = workloads
        .iter()
        .filter_map(|(name, w)| {
            let d = run(System::Dinomo, *w)?.measured.ops_per_s;
            let n = run(System::DinomoN, *w)?.measured.ops_per_s;
            (n > 0.0).then_some((*name, d / n))
        })
        .collect();
    let widest = ratios
        .iter()
        .map(|(_, r)| (r - 1.0).abs())
        .max_by(f64::total_cmp);
    let listed: Vec<String> = ratios
        .iter()
        .map(|(name, r)| format!("{r:.2}× {name}"))
        .collect();

    // Round trips per operation: DINOMO-S pays a READ for every hit.
    let mean_rt = |system: System| {
        mean(
            workloads
                .iter()
                .filter_map(|(_, w)| Some(run(system, *w)?.resources.as_ref()?.per_op.round_trips)),
        )
    };
    let (rt_s, rt_d) = (mean_rt(System::DinomoS), mean_rt(System::Dinomo));
    let rt_ratio = match (rt_s, rt_d) {
        (Some(s), Some(d)) if d > 0.0 => Some(s / d),
        _ => None,
    };
    let hits_s = mean(workloads.iter().filter_map(|(_, w)| {
        run(System::DinomoS, *w)?
            .cache
            .as_ref()?
            .ratios
            .map(|h| 1.0 - h.miss)
    }));
    let values_s = mean(workloads.iter().filter_map(|(_, w)| {
        run(System::DinomoS, *w)?
            .cache
            .as_ref()?
            .ratios
            .map(|h| h.value)
    }));

    // MODEL: where DINOMO-S stops scaling on the paper's hardware, read-only.
    let read_only: Vec<YcsbReport> = runs
        .iter()
        .filter(|r| r.system == System::DinomoS.name() && r.options.workload == Workload::C)
        .cloned()
        .collect();
    let model_s = if read_only.is_empty() {
        None
    } else {
        let p = project(&read_only, &HardwareProfile::paper(), 16)?;
        p.series.first().and_then(|s| {
            let at = |n: usize| s.points.iter().find(|p| p.kv_nodes == n);
            let (eight, sixteen) = (at(8)?, at(16)?);
            (eight.predicted_ops_per_s > 0.0).then(|| {
                (
                    sixteen.predicted_ops_per_s / eight.predicted_ops_per_s,
                    sixteen.bound_by.name().to_string(),
                )
            })
        })
    };

    Ok(vec![
        Comparison::new(
            format!("DINOMO / DINOMO-N throughput at {largest} KNs, largest difference over the workloads"),
            "within 11% (\"max difference is 11%\")",
            Some(0.11),
            match widest {
                Some(w) => format!("{:.0}% ({})", w * 100.0, listed.join(", ")),
                None => "—".into(),
            },
            widest,
            scaled.clone(),
        ),
        Comparison::new(
            format!("DINOMO-S / DINOMO round trips per op at {largest} KNs (mean over the workloads)"),
            "up to 10×",
            Some(10.0),
            format!("{} ({} vs {} RT/op)", num(rt_ratio), num(rt_s), num(rt_d)),
            rt_ratio,
            "the ratio depends on how few round trips DINOMO makes: 0.1 per op at the paper's 16 KNs".to_string(),
        ),
        Comparison::new(
            format!("DINOMO-S cache hit ratio at {largest} KNs"),
            "100% on every workload and node count (all from shortcuts)",
            Some(1.0),
            format!(
                "{} (values {})",
                hits_s.map_or("—".into(), |h| format!("{:.0}%", h * 100.0)),
                values_s.map_or("—".into(), |v| format!("{:.0}%", v * 100.0))
            ),
            hits_s,
            "hits include reads answered from the node's own unmerged log".to_string(),
        ),
        Comparison::new(
            "MODEL: DINOMO-S read-only throughput at 16 KNs / 8 KNs on the paper's hardware",
            "stops scaling beyond 8 KNs (network)",
            Some(1.0),
            match &model_s {
                Some((r, bound)) => format!("{r:.2}× (bound by {bound} at 16 KNs)"),
                None => "—".into(),
            },
            model_s.as_ref().map(|(r, _)| *r),
            "a bottleneck model fed with DINOMO-S's per-op resources measured here, not a measurement",
        ),
    ])
}

fn write_projection(files: &mut Files, stem: &str, p: &Projection) -> anyhow::Result<()> {
    files.write(&format!("{stem}.txt"), &p.table())?;
    files.write_results(stem, p, &p.to_csv(), &p.to_svg())
}

// ---------------------------------------------------------------------------------------------------------------
// Figures 6, 7 and 8: elasticity.

fn elastic_options(scale: Scale, scenario: Scenario, distribution: Distribution) -> ElasticOptions {
    // Only the failure scenario measures detection, with a 30 ms lease; the others get a long one, so that a
    // heartbeat late on a busy machine is never taken for a failure in the middle of their event. The smoke scale
    // runs beside other tests, so its failure lease leaves room too.
    let (lease_ms, heartbeat_ms) = match (scenario, scale) {
        (Scenario::Failure, Scale::Tiny) => (200, 20),
        (Scenario::Failure, _) => (30, 5),
        _ => (2000, 200),
    };
    let base = ElasticOptions {
        scenario,
        distribution,
        workload: Workload::A,
        // The paper's 1 KiB values.
        value_size: 1024,
        lease: Duration::from_millis(lease_ms),
        heartbeat: Duration::from_millis(heartbeat_ms),
        ..ElasticOptions::default()
    };
    match scale {
        Scale::Tiny => ElasticOptions {
            kns: 2,
            keys: 2000,
            clients: 2,
            before: Duration::from_millis(300),
            after: Duration::from_millis(500),
            ..base
        },
        Scale::Small => ElasticOptions {
            kns: 4,
            keys: 20_000,
            clients: 8,
            before: Duration::from_millis(2000),
            after: Duration::from_millis(3000),
            ..base
        },
        Scale::Full => ElasticOptions {
            kns: 4,
            keys: 100_000,
            clients: 8,
            before: Duration::from_millis(5000),
            after: Duration::from_millis(10_000),
            ..base
        },
    }
}

fn elastic_command(o: &ElasticOptions, out: &Path) -> String {
    let mut s = format!(
        "dinomo bench elastic --system {} --scenario {} --kns {} --kn-threads {} --keys {} --value-size {} --clients {} \
         --workload {} --distribution {} --before-ms {} --after-ms {} --bucket-ms {} --lease-ms {} \
         --heartbeat-ms {}",
        o.system,
        o.scenario.name(),
        o.kns,
        o.kn_threads,
        o.keys,
        o.value_size,
        o.clients,
        o.workload,
        o.distribution,
        o.before.as_millis(),
        o.after.as_millis(),
        o.bucket.as_millis(),
        o.lease.as_millis(),
        o.heartbeat.as_millis()
    );
    if o.scenario == Scenario::Replicate {
        let _ = write!(
            s,
            " --hot-keys {} --replication {}",
            o.hot_keys, o.replication
        );
    }
    let _ = write!(s, " --out {}", out.display());
    s
}

fn run_scenario(
    o: &ElasticOptions,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<ElasticReport> {
    run_scenario_as(o, &o.file_stem(), files, progress)
}

/// Runs `o` and writes its results under `name`.
fn run_scenario_as(
    o: &ElasticOptions,
    name: &str,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<ElasticReport> {
    let r = run_elastic(o, |s| progress(&format!("{name}: {s}")))?;
    files.write_results(name, &r, &r.to_csv(), &r.to_svg())?;
    Ok(r)
}

/// Mean throughput over the first `window` after the event (as much of it as the run has), over the baseline.
fn window_over_baseline(r: &ElasticReport, window_ms: f64) -> Option<f64> {
    let m = mean(
        r.timeline
            .iter()
            .filter(|b| b.t_ms >= r.event_at_ms - 1e-9 && b.t_ms < r.event_at_ms + window_ms)
            .map(|b| b.ops_per_s),
    )?;
    (r.baseline_ops_per_s > 0.0).then(|| m / r.baseline_ops_per_s)
}

fn mnode_ms(r: &ElasticReport, kind: dinomo_cluster::ReconfigKind) -> Option<f64> {
    r.reconfigurations
        .iter()
        .find(|e| e.kind == kind)
        .map(|e| e.duration.as_secs_f64() * 1e3)
}

fn dip_text(r: &ElasticReport) -> String {
    let lowest = if r.baseline_ops_per_s > 0.0 {
        r.min_ops_per_s / r.baseline_ops_per_s * 100.0
    } else {
        0.0
    };
    format!(
        "below 80% of the baseline for {:.0} ms; lowest {} ms bucket {:.0}% of it",
        r.dip_ms,
        r.options.bucket.as_millis(),
        lowest
    )
}

/// What reading every record back after the run found.
fn intact_text(r: &ElasticReport) -> String {
    format!(
        "{} of {} records read back intact afterwards",
        r.values_checked - r.values_missing - r.values_corrupt,
        r.values_checked
    )
}

/// What a run's reconfigurations moved between partitions (DINOMO-N).
fn moved_text(r: &ElasticReport) -> String {
    format!(
        "{} keys ({:.1} MiB) moved between partitions in {:.1} ms",
        r.moved_keys,
        r.moved_bytes as f64 / (1u64 << 20) as f64,
        r.move_ms
    )
}

fn elastic_differs(o: &ElasticOptions) -> String {
    format!(
        "{} KV nodes of {} worker, {} closed-loop clients, {} keys of {} B, {} ms before and {} ms after the event",
        o.kns,
        o.kn_threads,
        o.clients,
        o.keys,
        o.value_size,
        o.before.as_millis(),
        o.after.as_millis()
    )
}

fn figure6(
    scale: Scale,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let zipf05 = Distribution::Zipfian { theta: 0.5 };
    let add_opts = elastic_options(scale, Scenario::Add, zipf05);
    let remove_opts = elastic_options(scale, Scenario::Remove, zipf05);
    let add = run_scenario(&add_opts, files, progress)?;
    let remove = run_scenario(&remove_opts, files, progress)?;
    let n_add_opts = ElasticOptions {
        system: System::DinomoN,
        ..add_opts.clone()
    };
    let n_remove_opts = ElasticOptions {
        system: System::DinomoN,
        ..remove_opts.clone()
    };
    let n_add = run_scenario(&n_add_opts, files, progress)?;
    let n_remove = run_scenario(&n_remove_opts, files, progress)?;
    let c_add_opts = ElasticOptions {
        system: System::Clover,
        ..add_opts.clone()
    };
    let c_remove_opts = ElasticOptions {
        system: System::Clover,
        ..remove_opts.clone()
    };
    let c_add = run_scenario(&c_add_opts, files, progress)?;
    let c_remove = run_scenario(&c_remove_opts, files, progress)?;
    use dinomo_cluster::ReconfigKind;
    let rows = vec![
        Comparison::new(
            "throughput when a KV node joins",
            "a brief dip while the nodes update their hash rings",
            None,
            format!(
                "{}; M-node work {} ms",
                dip_text(&add),
                num(mnode_ms(&add, ReconfigKind::Add))
            ),
            Some(add.dip_ms),
            elastic_differs(&add_opts),
        ),
        Comparison::new(
            "throughput when a KV node leaves",
            "a brief latency rise, within the SLOs",
            None,
            format!(
                "{}; M-node work {} ms",
                dip_text(&remove),
                num(mnode_ms(&remove, ReconfigKind::Remove))
            ),
            Some(remove.dip_ms),
            elastic_differs(&remove_opts),
        ),
        Comparison::new(
            "DINOMO-N when a KV node joins (data of the keys it takes moved into its partition)",
            "40 s at 0 ops/s",
            Some(40_000.0),
            format!("{}; {}", dip_text(&n_add), moved_text(&n_add)),
            Some(n_add.dip_ms),
            elastic_differs(&n_add_opts),
        ),
        Comparison::new(
            "DINOMO-N when a KV node leaves (its data moved into the others' partitions)",
            "a 20 s throughput dip",
            Some(20_000.0),
            format!("{}; {}", dip_text(&n_remove), moved_text(&n_remove)),
            Some(n_remove.dip_ms),
            elastic_differs(&n_remove_opts),
        ),
        Comparison::new(
            "Clover when a compute node joins (its clients start; nothing moves, nothing is reassigned)",
            "not run (\"Clover has no implementation for auto-scaling KNs\")",
            None,
            format!(
                "{}; settled {:.2}× the baseline; {}",
                dip_text(&c_add),
                c_add.settled_over_baseline,
                intact_text(&c_add)
            ),
            Some(c_add.dip_ms),
            elastic_differs(&c_add_opts),
        ),
        Comparison::new(
            "Clover when a compute node leaves (its clients stop and hand their unused slots back)",
            "not run",
            None,
            format!(
                "{}; settled {:.2}× the baseline; {}",
                dip_text(&c_remove),
                c_remove.settled_over_baseline,
                intact_text(&c_remove)
            ),
            Some(c_remove.dip_ms),
            elastic_differs(&c_remove_opts),
        ),
        Comparison::new(
            "what triggers the change",
            "the M-node's policy engine, on a tail-latency SLO violation with over-utilized KNs (load ×7), and \
             on an under-utilized KN",
            None,
            "the benchmark adds or removes the node at a fixed time (stand-in)",
            None,
            "the M-node's policy engine (dinomo up --autoscale) is not driven by this recipe; the same add and \
             remove reconfigurations run at a fixed time",
        ),
    ];
    Ok(Findings {
        title: "elasticity: a KV node joins and leaves under load (autoscaling, scaled stand-in)",
        commands: vec![
            elastic_command(&add_opts, &files.dir),
            elastic_command(&remove_opts, &files.dir),
            elastic_command(&n_add_opts, &files.dir),
            elastic_command(&n_remove_opts, &files.dir),
            elastic_command(&c_add_opts, &files.dir),
            elastic_command(&c_remove_opts, &files.dir),
        ],
        rows,
        not_built: Vec::new(),
        differences: vec![
            host_note(),
            "the paper's run lasts minutes with 10 s samples; here a few seconds with 10 ms buckets, so a dip of \
             milliseconds shows"
                .into(),
            "Clover: `kns` compute nodes share the client threads (a joining node brings as many clients as a node \
             had, so the load grows with it); its compute nodes are the client threads themselves, over one memory \
             node and a metadata server"
                .into(),
        ],
    })
}

fn figure7(
    scale: Scale,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let opts = elastic_options(
        scale,
        Scenario::Replicate,
        Distribution::Zipfian { theta: 2.0 },
    );
    // The same run without replication: the event shares nothing.
    let control = ElasticOptions {
        hot_keys: 0,
        ..opts.clone()
    };
    // Its files sit beside the replicated run's: `elastic-replicate-control`.
    let control_stem = format!("{}-control", control.file_stem());
    // Runs alternate, so that a slow phase of a shared machine hits both sides alike.
    let pairs = match scale {
        Scale::Tiny => 1,
        Scale::Small | Scale::Full => 3,
    };
    let mut gains = Vec::new();
    let mut last = None;
    for pair in 0..pairs {
        progress(&format!("pair {} of {pairs}", pair + 1));
        let r = run_scenario(&opts, files, progress)?;
        let c = run_scenario_as(&control, &control_stem, files, progress)?;
        if c.settled_ops_per_s > 0.0 {
            gains.push(r.settled_ops_per_s / c.settled_ops_per_s);
        }
        last = Some((r, c));
    }
    let (r, c) = last.expect("at least one pair");
    let gain = median(&mut gains);
    // Clover under the same load: nothing to replicate (every compute node reaches every key), so its steady
    // throughput is what DINOMO is compared with, before and after sharing.
    let clover_opts = figure7_clover_options(scale, &opts);
    progress("figure 7: clover under the same load");
    let clover = run_ycsb(&clover_opts, &mut |p| {
        if let crate::ycsb_run::Progress::Phase(step) = p {
            progress(&format!("figure 7: {step}"));
        }
    })?;
    files.write(
        "ycsb-clover-zipf2.json",
        &serde_json::to_string_pretty(&clover)?,
    )?;
    let clover_ops = clover.measured.ops_per_s;
    let over_clover = |x: f64| (clover_ops > 0.0).then(|| x / clover_ops);
    let (after_over, before_over) = (
        over_clover(r.settled_ops_per_s),
        over_clover(c.settled_ops_per_s),
    );
    // Clover is almost 4× DINOMO without replication; DINOMO with it is almost 1.6× Clover.
    let paper_gain = 4.0 * 1.6;
    let rows = vec![
        Comparison::new(
            "throughput with the 4 hottest keys shared / the same run without, Zipf 2",
            "≈ 6.4× (derived: Clover ≈ 4× DINOMO before; DINOMO after ≈ 1.6× Clover)",
            Some(paper_gain),
            format!(
                "{} (median of {} alternating pairs: {}; last pair {:.0} vs {:.0} ops/s)",
                gain.map_or("—".into(), |g| format!("{g:.2}×")),
                gains.len(),
                gains
                    .iter()
                    .map(|g| format!("{g:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.settled_ops_per_s,
                c.settled_ops_per_s
            ),
            gain,
            format!(
                "{}; every node shares the hot keys at once (the paper raises the factor over 60 s)",
                elastic_differs(&opts)
            ),
        ),
        Comparison::new(
            "throughput with the 4 hottest keys shared / before, same run",
            "—",
            None,
            format!(
                "{:.2}× (the control run: {:.2}×)",
                r.settled_over_baseline, c.settled_over_baseline
            ),
            Some(r.settled_over_baseline),
            "before and after differ by more than the sharing on a shared machine; the control shows by how much",
        ),
        Comparison::new(
            "DINOMO / Clover after replication",
            "≈ 1.6×",
            Some(1.6),
            format!(
                "{} ({:.0} vs {:.0} ops/s)",
                after_over.map_or("—".into(), |x| format!("{x:.2}×")),
                r.settled_ops_per_s,
                clover_ops
            ),
            after_over,
            format!(
                "Clover: {} compute nodes sharing the same {} client threads, the same Zipf 2 load, measured on its \
                 own ({} s); its compute nodes are the client threads (no client-to-KN hop)",
                clover_opts_kns(&clover_opts),
                clover_opts.clients,
                clover_opts.secs
            ),
        ),
        Comparison::new(
            "DINOMO without replication / Clover",
            "≈ 0.25× (\"Clover initially outperforms DINOMO without selective replication ... by almost 4×\")",
            Some(0.25),
            format!(
                "{} ({:.0} vs {:.0} ops/s, the control run)",
                before_over.map_or("—".into(), |x| format!("{x:.2}×")),
                c.settled_ops_per_s,
                clover_ops
            ),
            before_over,
            "as above",
        ),
        Comparison::new(
            "Clover with the hot keys replicated",
            "—",
            None,
            "no meaning: Clover has no owners, so there is nothing to share; every compute node already reads and \
             writes the hot keys directly (bench elastic refuses --system clover --scenario replicate)",
            None,
            "—",
        ),
        Comparison::new(
            "DINOMO / DINOMO-N after replication",
            "up to 5.6×",
            Some(5.6),
            "not run: DINOMO-N cannot share keys, so it serves this load as DINOMO does without sharing (the \
             control run above)",
            None,
            "dinomo bench elastic --system dinomo-n refuses the replicate scenario",
        ),
    ];
    Ok(Findings {
        title: "load balancing: selective replication of the hottest keys under Zipf 2",
        commands: vec![
            elastic_command(&opts, &files.dir),
            elastic_command(&control, &files.dir),
            pdpm_command(&clover_opts, &files.dir),
        ],
        rows,
        not_built: Vec::new(),
        differences: vec![
            host_note(),
            "one machine's cores are shared by every node, so spreading a hot key over more nodes adds no cores: \
             the gain comes only from more worker threads serving the key"
                .into(),
        ],
    })
}

/// Clover on Figure 7's load: as many compute nodes as the elastic run has KV nodes, its clients, keys, values,
/// workload and Zipf 2, measured for as long as the elastic run lasts after its event.
fn figure7_clover_options(scale: Scale, o: &ElasticOptions) -> YcsbOptions {
    let tiny = scale == Scale::Tiny;
    YcsbOptions {
        system: System::Clover,
        target: TargetOptions::InProcess(InProcessOptions {
            kns: o.kns,
            policy: System::Clover.default_policy(),
            ..InProcessOptions::default()
        }),
        workload: o.workload,
        distribution: o.distribution,
        records: o.keys,
        value_bytes: o.value_size,
        clients: o.clients,
        outstanding: 1,
        warmup_secs: if tiny {
            20.0
        } else {
            o.before.as_secs_f64() / 2.0
        },
        secs: if tiny { 20.0 } else { o.after.as_secs_f64() },
        warmup_ops: tiny.then_some(200),
        ops: tiny.then_some(300),
        ..YcsbOptions::default()
    }
}

fn clover_opts_kns(o: &YcsbOptions) -> usize {
    match &o.target {
        TargetOptions::InProcess(p) => p.kns,
        _ => 0,
    }
}

fn figure8(
    scale: Scale,
    files: &mut Files,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Findings> {
    let opts = elastic_options(
        scale,
        Scenario::Failure,
        Distribution::Zipfian { theta: 0.99 },
    );
    let r = run_scenario(&opts, files, progress)?;
    let n_opts = ElasticOptions {
        system: System::DinomoN,
        ..opts.clone()
    };
    let n = run_scenario(&n_opts, files, progress)?;
    let c_opts = ElasticOptions {
        system: System::Clover,
        ..opts.clone()
    };
    let c = run_scenario(&c_opts, files, progress)?;
    let c_drop_100ms = window_over_baseline(&c, 100.0).map(|w| 1.0 - w);
    let handling = mnode_ms(&r, dinomo_cluster::ReconfigKind::Failure);
    let n_handling = mnode_ms(&n, dinomo_cluster::ReconfigKind::Failure);
    let drop_100ms = window_over_baseline(&r, 100.0).map(|w| 1.0 - w);
    let drop_1s = window_over_baseline(&r, 1000.0).map(|w| 1.0 - w);
    let pct = |v: Option<f64>| v.map_or("—".into(), |w| format!("{:.0}%", w * 100.0));
    let rows = vec![
        Comparison::new(
            "failure handling after detection (log merged, ownership moved)",
            "< 109 ms",
            Some(109.0),
            format!("{} ms (M-node)", num(handling)),
            handling,
            elastic_differs(&opts),
        ),
        Comparison::new(
            "kill → every key of the dead node served again",
            "not stated (detection time not given)",
            None,
            format!(
                "{} ms, detection after {} ms (lease {} ms)",
                num(r.all_keys_served_after_ms),
                num(r.noticed_after_ms),
                opts.lease.as_millis()
            ),
            r.all_keys_served_after_ms,
            format!("our lease: {} ms", opts.lease.as_millis()),
        ),
        Comparison::new(
            "throughput drop after the failure",
            "briefly 45%",
            Some(0.45),
            format!(
                "{} over the first 100 ms, {} over the first second; {}",
                pct(drop_100ms),
                pct(drop_1s),
                dip_text(&r)
            ),
            drop_100ms,
            "the paper samples over seconds; here 10 ms buckets. One of our 4 nodes fails (a quarter of the keys \
             wait, and every client soon waits on one of them), one of the paper's 16; on shared cores 3 nodes \
             then serve faster than 4 did",
        ),
        Comparison::new(
            "DINOMO-N on the same failure: reorganizing the dead node's data",
            "more than 11 s (a 20 s dip at 0 ops/s)",
            Some(11_000.0),
            format!(
                "{} ms; M-node {} ms in all; kill → every key served again {} ms; {}",
                num(Some(n.move_ms)),
                num(n_handling),
                num(n.all_keys_served_after_ms),
                dip_text(&n)
            ),
            Some(n.move_ms),
            format!(
                "{}; {} keys ({} bytes) moved",
                elastic_differs(&n_opts),
                n.moved_keys,
                n.moved_bytes
            ),
        ),
        Comparison::new(
            "Clover on the same failure: throughput drop",
            "a brief 55% drop",
            Some(0.55),
            format!(
                "{} over the first 100 ms; {}; {}",
                pct(c_drop_100ms),
                dip_text(&c),
                intact_text(&c)
            ),
            c_drop_100ms,
            format!(
                "{}; the dead compute node's clients stop inside a write each, and every client of the survivors \
                 keeps going: nothing waits for detection",
                elastic_differs(&c_opts)
            ),
        ),
        Comparison::new(
            "Clover on the same failure: recovery work",
            "< 68 ms to update the RNs' membership (clients retry after a 500 ms timeout)",
            Some(68.0),
            match &c.clover {
                Some(e) => format!(
                    "metadata server reclaimed {} slot(s) of {} crashed client(s) in {} ms; writes cut at the crash \
                     points (written, linked, linked + shortcut): {:?}; every key they were writing read back {} ms \
                     after the kill",
                    e.reclaimed_slots,
                    e.clients_changed,
                    num(e.reclaim_ms),
                    e.interrupted_writes,
                    num(c.all_keys_served_after_ms)
                ),
                None => "—".into(),
            },
            c.clover.as_ref().and_then(|e| e.reclaim_ms),
            "no routing nodes in front of Clover here (the clients are the compute nodes), so there is no membership \
             to update; the reclaim is triggered at once rather than by a failure detector",
        ),
    ];
    Ok(Findings {
        title: "fault tolerance: a KV node fails under load",
        commands: vec![
            elastic_command(&opts, &files.dir),
            elastic_command(&n_opts, &files.dir),
            elastic_command(&c_opts, &files.dir),
        ],
        rows,
        not_built: Vec::new(),
        differences: vec![host_note()],
    })
}

// ---------------------------------------------------------------------------------------------------------------
// pDPM Figure 7: the pDPM baselines' throughput on YCSB, with and without replication.

/// The name of the pDPM recipe on the command line (`dinomo bench figure pdpm`).
pub const PDPM_FIGURE: &str = "pdpm";

/// The pDPM paper's Figure 7 workloads (§5.2): read-only, 5% writes, 50% writes, write-only; each with its name in
/// the table and in file names.
fn pdpm_workloads(scale: Scale) -> Vec<(&'static str, &'static str, Workload)> {
    let all = vec![
        ("C (read-only)", "c", Workload::C),
        ("B (5% updates)", "b", Workload::B),
        ("A (50% updates)", "a", Workload::A),
        (
            "write-only",
            "write-only",
            "update=1".parse().expect("a fixed mix parses"),
        ),
    ];
    match scale {
        Scale::Tiny => vec![all[0], all[3]],
        _ => all,
    }
}

/// The settings of one pDPM run: the paper's 4 CNs × 8 threads and 4 DPMs, scaled.
fn pdpm_options(scale: Scale, system: System, workload: Workload, replication: u32) -> YcsbOptions {
    let (records, memory_nodes, compute_nodes, clients, secs): (u64, usize, usize, usize, f64) =
        match scale {
            Scale::Tiny => (200, 2, 1, 2, 20.0),
            Scale::Small => (20_000, 4, 2, 4, 2.0),
            Scale::Full => (100_000, 4, 4, 8, 10.0),
        };
    pdpm_run_options(
        scale,
        system,
        workload,
        PdpmLayout {
            records,
            memory_nodes,
            compute_nodes,
            clients,
            replication,
            warmup_secs: 0.5,
            secs,
        },
    )
}

/// The shape of one pDPM run.
#[derive(Debug, Clone, Copy)]
struct PdpmLayout {
    records: u64,
    memory_nodes: usize,
    compute_nodes: usize,
    /// Client threads in all, spread over the compute nodes.
    clients: usize,
    replication: u32,
    /// Warm-up and measured seconds (the tiny scale counts 400 and 300 operations instead, bounded by 20 s).
    warmup_secs: f64,
    secs: f64,
}

fn pdpm_run_options(
    scale: Scale,
    system: System,
    workload: Workload,
    layout: PdpmLayout,
) -> YcsbOptions {
    let PdpmLayout {
        records,
        memory_nodes,
        compute_nodes,
        clients,
        replication,
        warmup_secs,
        secs,
    } = layout;
    let tiny = scale == Scale::Tiny;
    YcsbOptions {
        system,
        target: TargetOptions::InProcess(InProcessOptions {
            kns: compute_nodes,
            policy: system.default_policy(),
            memory_nodes,
            replication,
            ..InProcessOptions::default()
        }),
        workload,
        distribution: Distribution::Zipfian { theta: 0.99 },
        records,
        value_bytes: 1024,
        clients,
        outstanding: 1,
        warmup_secs: if tiny { 20.0 } else { warmup_secs },
        secs: if tiny { 20.0 } else { secs },
        warmup_ops: tiny.then_some(400),
        ops: tiny.then_some(300),
        ..YcsbOptions::default()
    }
}

fn pdpm_command(o: &YcsbOptions, out: &Path) -> String {
    let TargetOptions::InProcess(p) = &o.target else {
        return "dinomo bench ycsb ...".into();
    };
    let mut s = format!(
        "dinomo bench ycsb --system {} --workload {} --distribution {} --records {} --value-bytes {} --clients {} \
         --kns {} --memory-nodes {} --replication {}",
        o.system,
        o.workload,
        o.distribution,
        o.records,
        o.value_bytes,
        o.clients,
        p.kns,
        p.memory_nodes,
        p.replication
    );
    if let Some(keys) = p.pdpm_keys {
        let _ = write!(s, " --pdpm-keys {keys}");
    }
    match (o.warmup_ops, o.ops) {
        (Some(w), Some(n)) => {
            let _ = write!(
                s,
                " --warmup-ops {w} --ops {n} --warmup-secs {} --secs {}",
                o.warmup_secs, o.secs
            );
        }
        _ => {
            let _ = write!(s, " --warmup-secs {} --secs {}", o.warmup_secs, o.secs);
        }
    }
    let _ = write!(s, " --out {}", out.display());
    s
}

/// Runs the pDPM paper's Figure 7 recipe at `scale`: every store of [`System::PDPM`] (DirectDS, DirectDS-C,
/// CentralDS and Clover, the paper's SepDS) on YCSB C, B, A and write-only (C and write-only at the tiny scale),
/// with one copy and with two, writing every run's report, a throughput table (`throughput.csv`) and
/// `pdpm-figure7.json` / `.md` to `out/pdpm-figure7/`. Hotpot, which is not built, is listed as such.
pub fn run_pdpm_figure(
    scale: Scale,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<FigureReport> {
    let mut files = Files::create(out.join("pdpm-figure7"))?;
    let mut commands = vec![format!(
        "dinomo bench figure {PDPM_FIGURE} --scale {scale} --out {}",
        out.display()
    )];
    // (workload name, replication, system, report)
    let mut runs: Vec<(&'static str, u32, System, YcsbReport)> = Vec::new();
    let mut csv = String::from(
        "workload,replication,system,ops_per_s,p50_us,p99_us,round_trips_per_op,bytes_per_op,errors\n",
    );
    for (name, slug, workload) in pdpm_workloads(scale) {
        for replication in [1, 2] {
            for system in System::PDPM {
                let opts = pdpm_options(scale, system, workload, replication);
                progress(&format!(
                    "pdpm figure 7: {system}, {name}, replication {replication}"
                ));
                let r = run_ycsb(&opts, &mut |p| {
                    if let crate::ycsb_run::Progress::Phase(step) = p {
                        progress(&format!("pdpm figure 7: {step}"));
                    }
                })?;
                let stem = format!("ycsb-{system}-{slug}-r{replication}");
                files.write(&format!("{stem}.json"), &serde_json::to_string_pretty(&r)?)?;
                commands.push(pdpm_command(&opts, &files.dir));
                let per_op = r.resources.as_ref().map(|x| &x.per_op);
                let _ = writeln!(
                    csv,
                    "{name},{replication},{system},{:.0},{:.1},{:.1},{},{},{}",
                    r.measured.ops_per_s,
                    r.latency.p50_us,
                    r.latency.p99_us,
                    per_op.map_or(String::new(), |p| format!("{:.3}", p.round_trips)),
                    per_op.map_or(String::new(), |p| format!(
                        "{:.0}",
                        p.bytes_out + p.bytes_in
                    )),
                    r.measured.errors.total()
                );
                runs.push((name, replication, system, r));
            }
        }
    }
    files.write("throughput.csv", &csv)?;
    let find = |name: &str, replication: u32, system: System| {
        runs.iter()
            .find(|(n, r, s, _)| *n == name && *r == replication && *s == system)
            .map(|(_, _, _, rep)| rep)
    };
    let ops = |name: &str, replication: u32, system: System| {
        find(name, replication, system).map(|r| r.measured.ops_per_s)
    };
    let rt = |name: &str, system: System| {
        find(name, 1, system)
            .and_then(|r| r.resources.as_ref())
            .map(|x| x.per_op.round_trips)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (read_only, write_only) = ("C (read-only)", "write-only");
    let contention = "Zipf 0.99 contention; uncontended Table 1 counts";
    let mut rows = Vec::new();
    for (name, _, _) in pdpm_workloads(scale) {
        for replication in [1, 2] {
            let parts: Vec<String> = System::PDPM
                .iter()
                .map(|&s| {
                    format!(
                        "{s} {}",
                        ops(name, replication, s).map_or("—".into(), crate::format::rate)
                    )
                })
                .collect();
            rows.push(Comparison::new(
                format!("throughput (ops/s), {name}, replication {replication}"),
                "Figure 7 (bars; the text states no numbers)",
                None,
                parts.join(", "),
                None,
                host_note(),
            ));
        }
    }
    let c_over_d = ratio(
        ops(read_only, 1, System::DirectDsC),
        ops(read_only, 1, System::DirectDs),
    );
    let c_over_central = ratio(
        ops(read_only, 1, System::DirectDsC),
        ops(read_only, 1, System::CentralDs),
    );
    let central_over_direct = ratio(
        ops(write_only, 1, System::CentralDs),
        ops(write_only, 1, System::DirectDs),
    );
    // The paper finds SepDS (Clover) the best of all systems on every workload: Clover over the best of the others.
    let clover_over_best: Vec<(&str, Option<f64>)> = pdpm_workloads(scale)
        .into_iter()
        .map(|(name, _, _)| {
            let best_other = System::PDPM
                .into_iter()
                .filter(|&s| s != System::Clover)
                .filter_map(|s| ops(name, 1, s))
                .reduce(f64::max);
            (name, ratio(ops(name, 1, System::Clover), best_other))
        })
        .collect();
    let clover_lowest = clover_over_best
        .iter()
        .filter_map(|&(_, r)| r)
        .reduce(f64::min);
    let clover_per_workload = clover_over_best
        .iter()
        .map(|&(name, r)| format!("{name} {}", num(r)))
        .collect::<Vec<_>>()
        .join(", ");
    rows.extend([
        Comparison::new(
            "DirectDS-C / DirectDS throughput, read-only",
            "> 1: DirectDS-C reads take no lock; DirectDS's locked reads are the worst under contention",
            None,
            num(c_over_d),
            c_over_d,
            host_note(),
        ),
        Comparison::new(
            "DirectDS-C / CentralDS throughput, read-only",
            "> 1: a CentralDS read is 2 RTTs and the coordinator is the bottleneck",
            None,
            num(c_over_central),
            c_over_central,
            host_note(),
        ),
        Comparison::new(
            "CentralDS / DirectDS throughput, write-only",
            "> 1: the DirectDS systems' locks are costly under contention",
            None,
            num(central_over_direct),
            central_over_direct,
            host_note(),
        ),
        Comparison::new(
            "Clover / the best other store throughput, replication 1, lowest over the workloads",
            "≥ 1: SepDS is the best of all systems on every workload",
            None,
            format!("{} ({clover_per_workload})", num(clover_lowest)),
            clover_lowest,
            host_note(),
        ),
    ]);
    for system in System::PDPM {
        let r2 = ratio(ops(write_only, 2, system), ops(write_only, 1, system));
        rows.push(Comparison::new(
            format!("{system}: replication 2 / 1 throughput, write-only"),
            "< 1: redundancy lowers write-heavy throughput",
            None,
            num(r2),
            r2,
            "our clients write the replicas one after another (the paper issues them in parallel)",
        ));
    }
    for (system, read, write) in [
        (System::DirectDs, 3.0, 6.0),
        (System::DirectDsC, 1.0, 6.0),
        (System::CentralDs, 2.0, 3.0),
        (System::Clover, 1.0, 2.0),
    ] {
        let (r, w) = (rt(read_only, system), rt(write_only, system));
        rows.push(Comparison::new(
            format!("{system}: round trips per read, read-only (Table 1)"),
            format!("{read}"),
            Some(read),
            num(r),
            r,
            contention,
        ));
        rows.push(Comparison::new(
            format!("{system}: round trips per write, write-only (Table 1)"),
            format!("{write}"),
            Some(write),
            num(w),
            w,
            match system {
                System::CentralDs => format!(
                    "{contention}; a GRANT call every 32 writes refills the client's free blocks"
                ),
                System::Clover => format!(
                    "{contention}; a key a client meets for the first time costs a read of its cell, and a \
                     write whose link CAS finds another version linked first chases the tail and retries"
                ),
                _ => contention.to_string(),
            },
        ));
    }
    rows.push(Comparison::not_built(
        "Hotpot throughput",
        "orders of magnitude below the DPM stores",
        None,
        "hotpot",
    ));
    let report = FigureReport {
        figure: 7,
        paper: "pDPM".into(),
        title: "DPM throughput and replication: DirectDS, DirectDS-C, CentralDS and Clover on YCSB, Zipf 0.99"
            .into(),
        scale,
        host_cores: cores(),
        commands,
        rows,
        not_built: vec!["hotpot".into()],
        differences: vec![
            host_note(),
            "memory nodes and compute nodes are scaled down (the paper: 4 CNs × 8 threads, 4 DPMs, 100 000 \
             records), and no fabric latency is injected, so a round trip costs far less than on RDMA"
                .into(),
            "replication degree 2 (the paper's text; its caption says three)".into(),
        ],
        files: Vec::new(),
    };
    files.publish("pdpm-figure7", report)
}

// ---------------------------------------------------------------------------------------------------------------
// pDPM Figures 9 and 10: the pDPM stores' throughput as memory nodes (Figure 9) or compute nodes (Figure 10) are
// added.

/// What a pDPM scalability recipe varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdpmAxis {
    /// Memory nodes (DPMs), compute nodes held: the pDPM paper's Figure 9.
    MemoryNodes,
    /// Compute nodes, each with the same client threads, memory nodes held: the pDPM paper's Figure 10.
    ComputeNodes,
}

impl PdpmAxis {
    /// Both axes, in the paper's order.
    pub const ALL: [PdpmAxis; 2] = [PdpmAxis::MemoryNodes, PdpmAxis::ComputeNodes];

    /// The recipe's name on the command line: `pdpm-mn` or `pdpm-cn`.
    pub fn name(self) -> &'static str {
        match self {
            PdpmAxis::MemoryNodes => "pdpm-mn",
            PdpmAxis::ComputeNodes => "pdpm-cn",
        }
    }

    /// The pDPM paper's figure number.
    pub fn figure(self) -> u32 {
        match self {
            PdpmAxis::MemoryNodes => 9,
            PdpmAxis::ComputeNodes => 10,
        }
    }

    /// The recipe whose name is `name` (any case), if any.
    pub fn from_name(name: &str) -> Option<PdpmAxis> {
        PdpmAxis::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    fn unit(self) -> &'static str {
        match self {
            PdpmAxis::MemoryNodes => "MN",
            PdpmAxis::ComputeNodes => "CN",
        }
    }
}

/// The node counts a scalability recipe visits and what it holds fixed.
#[derive(Debug, Clone, PartialEq)]
pub struct PdpmScalingPlan {
    /// Node counts along the axis, smallest first.
    pub counts: Vec<usize>,
    /// Memory nodes when compute nodes vary.
    pub fixed_memory_nodes: usize,
    /// Compute nodes when memory nodes vary.
    pub fixed_compute_nodes: usize,
    /// Client threads per compute node.
    pub threads_per_compute_node: usize,
    /// Records loaded (1 KiB values).
    pub records: u64,
    /// Warm-up seconds per run (`tiny` counts operations instead).
    pub warmup_secs: f64,
    /// Measured seconds per run.
    pub secs: f64,
}

/// The plan of a scalability recipe at `scale`: the paper holds 4 CNs × 8 threads (Figure 9) or 4 DPMs (Figure
/// 10); scaled to 2 threads per compute node and, at `small`, 2 compute nodes or 4 memory nodes held, 1–4 nodes
/// visited.
pub fn pdpm_scaling_plan(axis: PdpmAxis, scale: Scale) -> PdpmScalingPlan {
    let counts = match (axis, scale) {
        (_, Scale::Tiny) => vec![1, 2],
        (_, Scale::Small) => vec![1, 2, 4],
        (_, Scale::Full) => vec![1, 2, 4, 8],
    };
    let (fixed_memory_nodes, fixed_compute_nodes, threads, records, warmup_secs, secs) = match scale
    {
        Scale::Tiny => (2, 1, 1, 200, 20.0, 20.0),
        Scale::Small => (4, 2, 2, 10_000, 0.3, 1.0),
        Scale::Full => (4, 4, 2, 100_000, 1.0, 5.0),
    };
    PdpmScalingPlan {
        counts,
        fixed_memory_nodes,
        fixed_compute_nodes,
        threads_per_compute_node: threads,
        records,
        warmup_secs,
        secs,
    }
}

fn pdpm_scaling_layout(axis: PdpmAxis, plan: &PdpmScalingPlan, count: usize) -> PdpmLayout {
    let (memory_nodes, compute_nodes) = match axis {
        PdpmAxis::MemoryNodes => (count, plan.fixed_compute_nodes),
        PdpmAxis::ComputeNodes => (plan.fixed_memory_nodes, count),
    };
    PdpmLayout {
        records: plan.records,
        memory_nodes,
        compute_nodes,
        clients: compute_nodes * plan.threads_per_compute_node,
        replication: 1,
        warmup_secs: plan.warmup_secs,
        secs: plan.secs,
    }
}

/// The pDPM paper's statement about `system` along `axis` (§5.2, "Scalability").
fn pdpm_scaling_claim(axis: PdpmAxis, system: System) -> &'static str {
    match (axis, system) {
        (PdpmAxis::MemoryNodes, System::DirectDs) => "does not scale with DPMs: lock contention",
        (PdpmAxis::MemoryNodes, System::DirectDsC) => {
            "scales with DPMs: direct access uses every DPM's bandwidth"
        }
        (PdpmAxis::MemoryNodes, System::CentralDs) => {
            "does not scale: the single coordinator's network interface binds"
        }
        (PdpmAxis::ComputeNodes, System::DirectDs | System::DirectDsC) => {
            "does not scale with CNs: more CNs contend more often, throughput falls"
        }
        (PdpmAxis::ComputeNodes, System::CentralDs) => {
            "scales worse than SepDS: the single coordinator's network throughput binds"
        }
        (PdpmAxis::MemoryNodes, _) => "SepDS scales well with DPMs",
        (PdpmAxis::ComputeNodes, _) => "SepDS scales best: no single network bottleneck",
    }
}

/// Runs the pDPM paper's Figure 9 (`axis` memory nodes) or Figure 10 (compute nodes) at `scale`: every store of
/// [`System::PDPM`] on YCSB C, B, A and write-only (C and write-only at `tiny`), Zipf 0.99, 1 KiB values, one copy,
/// at each node count of [`pdpm_scaling_plan`], with no fabric latency injected. Writes every run's report,
/// `throughput.csv` and `pdpm-figureN.json` / `.md` to `out/pdpm-figureN/`.
pub fn run_pdpm_scaling_figure(
    axis: PdpmAxis,
    scale: Scale,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<FigureReport> {
    let figure = axis.figure();
    let mut files = Files::create(out.join(format!("pdpm-figure{figure}")))?;
    let plan = pdpm_scaling_plan(axis, scale);
    let mut commands = vec![format!(
        "dinomo bench figure {} --scale {scale} --out {}",
        axis.name(),
        out.display()
    )];
    let unit = axis.unit();
    let mut csv = format!(
        "workload,system,{}s,memory_nodes,compute_nodes,clients,ops_per_s,p50_us,p99_us,round_trips_per_op,\
         failed_ops\n",
        unit.to_ascii_lowercase()
    );
    let mut rows = Vec::new();
    for (name, slug, workload) in pdpm_workloads(scale) {
        for system in System::PDPM {
            // (node count, ops/s, round trips per op)
            let mut points: Vec<(usize, f64, Option<f64>)> = Vec::new();
            for &count in &plan.counts {
                let layout = pdpm_scaling_layout(axis, &plan, count);
                let opts = pdpm_run_options(scale, system, workload, layout);
                progress(&format!(
                    "pdpm figure {figure}: {system}, {name}, {count} {unit}(s)"
                ));
                let r = run_ycsb(&opts, &mut |p| {
                    if let crate::ycsb_run::Progress::Phase(step) = p {
                        progress(&format!("pdpm figure {figure}: {step}"));
                    }
                })?;
                let stem = format!("ycsb-{system}-{slug}-{count}{}", unit.to_ascii_lowercase());
                files.write(&format!("{stem}.json"), &serde_json::to_string_pretty(&r)?)?;
                commands.push(pdpm_command(&opts, &files.dir));
                let round_trips = r.resources.as_ref().map(|x| x.per_op.round_trips);
                let _ = writeln!(
                    csv,
                    "{name},{system},{count},{},{},{},{:.0},{:.1},{:.1},{},{}",
                    layout.memory_nodes,
                    layout.compute_nodes,
                    layout.clients,
                    r.measured.ops_per_s,
                    r.latency.p50_us,
                    r.latency.p99_us,
                    round_trips.map_or(String::new(), |x| format!("{x:.3}")),
                    r.measured.errors.total()
                );
                points.push((count, r.measured.ops_per_s, round_trips));
            }
            rows.push(pdpm_scaling_row(axis, name, system, &points));
        }
    }
    files.write("throughput.csv", &csv)?;
    let held = match axis {
        PdpmAxis::MemoryNodes => format!(
            "held: {} compute nodes × {} client threads (the paper: 4 CNs × 8 threads)",
            plan.fixed_compute_nodes, plan.threads_per_compute_node
        ),
        PdpmAxis::ComputeNodes => format!(
            "held: {} memory nodes, {} client threads per compute node (the paper: 4 DPMs, 8 threads per CN)",
            plan.fixed_memory_nodes, plan.threads_per_compute_node
        ),
    };
    let cores_note = match axis {
        PdpmAxis::MemoryNodes => format!(
            "the memory nodes are in-process pools with no NIC of their own, so adding one adds no bandwidth and \
             no processor here (the coordinator's node aside); what DirectDS-C gains from more DPMs in the paper \
             (each DPM's link) cannot show on {} cores",
            cores()
        ),
        PdpmAxis::ComputeNodes => format!(
            "every compute node adds {} client thread(s) to the same {} cores: throughput cannot grow with compute \
             nodes here, whatever the store. What does show is contention: the round trips per operation at the \
             largest count against the smallest (locks retried, torn reads re-read)",
            plan.threads_per_compute_node,
            cores()
        ),
    };
    let report = FigureReport {
        figure,
        paper: "pDPM".into(),
        title: match axis {
            PdpmAxis::MemoryNodes => {
                "scalability with memory nodes (DPMs): DirectDS, DirectDS-C, CentralDS and Clover on YCSB, Zipf 0.99"
            }
            PdpmAxis::ComputeNodes => {
                "scalability with compute nodes: DirectDS, DirectDS-C, CentralDS and Clover on YCSB, Zipf 0.99"
            }
        }
        .into(),
        scale,
        host_cores: cores(),
        commands,
        rows,
        not_built: Vec::new(),
        differences: vec![
            host_note(),
            held,
            format!(
                "{} records of 1 KiB (the paper: 100 000), one copy, no fabric latency injected (a one-sided verb \
                 is an in-process memory copy of about 0.1 µs; the paper's RDMA round trip is microseconds)",
                plan.records
            ),
            cores_note,
        ],
        files: Vec::new(),
    };
    files.publish(&format!("pdpm-figure{figure}"), report)
}

/// One store on one workload along the axis: throughput at every count, and the largest count's throughput and
/// round trips over the smallest's.
fn pdpm_scaling_row(
    axis: PdpmAxis,
    workload: &str,
    system: System,
    points: &[(usize, f64, Option<f64>)],
) -> Comparison {
    let unit = axis.unit();
    let first = points.first();
    let last = points.last();
    let growth = match (first, last) {
        (Some(&(_, a, _)), Some(&(_, b, _))) if a > 0.0 && points.len() > 1 => Some(b / a),
        _ => None,
    };
    let series = points
        .iter()
        .map(|(n, ops, _)| format!("{n} {unit}: {}", crate::format::rate(*ops)))
        .collect::<Vec<_>>()
        .join(", ");
    let round_trips = match (first, last) {
        (Some(&(n0, _, Some(r0))), Some(&(n1, _, Some(r1)))) => {
            format!("; round trips per op {r0:.2} at {n0} {unit}, {r1:.2} at {n1} {unit}")
        }
        _ => String::new(),
    };
    let (lo, hi) = (first.map_or(0, |p| p.0), last.map_or(0, |p| p.0));
    Comparison::new(
        format!("{system}, {workload}: throughput at {hi} / {lo} {unit}(s)"),
        pdpm_scaling_claim(axis, system),
        None,
        format!("{} ({series}{round_trips})", num(growth)),
        growth,
        format!("{} shared cores (see below)", cores()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_compute_their_ratio_only_with_both_numbers() {
        let c = Comparison::new("x", "2", Some(2.0), "3", Some(3.0), "");
        assert_eq!(c.ratio, Some(1.5));
        let c = Comparison::new("x", "2", Some(2.0), "—", None, "");
        assert_eq!(c.ratio, None);
        let c = Comparison::not_built("x", "3.8×", Some(3.8), "ditto");
        assert_eq!((c.ours.as_str(), c.ratio), ("not built (ditto)", None));
    }

    #[test]
    fn scales_parse_and_unknown_figures_are_refused() {
        assert_eq!("small".parse::<Scale>(), Ok(Scale::Small));
        assert!("huge".parse::<Scale>().is_err());
        let dir = tempfile::tempdir().unwrap();
        let err = run_figure(4, Scale::Tiny, dir.path(), &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("no recipe for figure 4"), "{err}");
    }

    #[test]
    fn figure5_keeps_the_papers_cache_to_data_ratio() {
        let (o, kns) = figure5_options(Scale::Small, Workload::A, System::Dinomo);
        assert_eq!(kns, [1, 2, 4]);
        let TargetOptions::InProcess(p) = &o.target else {
            panic!("in-process");
        };
        assert_eq!(p.cache_bytes, 20_000 * 1032 / 32);
        assert_eq!(figure5_workloads(Scale::Small).len(), 5);
        o.validate().unwrap();
    }
}
