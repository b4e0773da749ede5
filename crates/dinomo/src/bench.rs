//! `dinomo bench`: benchmarks that print tables for people and JSON for scripts.

use std::time::Duration;

use std::path::PathBuf;

use std::io::IsTerminal;

use anyhow::Context;
use clap::{Args, Subcommand};
use dinomo_bench::ycsb::{Distribution, Workload};
use dinomo_bench::ycsb_run::{
    InProcessOptions, NativeOptions, PlotKind, Progress, RespOptions, System, TargetOptions,
    YcsbOptions, YcsbReport,
};
use dinomo_bench::{DacBenchOptions, FabricBenchOptions, TransportChoice};
use dinomo_cache::Policy;

use crate::size::parse_size;

/// Benchmarks.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: Which,
}

/// Which benchmark.
#[derive(Debug, Subcommand)]
pub enum Which {
    /// Fabric verbs (READ, WRITE, CAS, FAA; single and batched) on each transport, beside the raw operation
    /// (in-process) or a plain TCP ping-pong (TCP) measured in the same run.
    Fabric(FabricArgs),
    /// Caching policies (DAC, static splits, value-only, shortcut-only): read throughput and round trips per read
    /// as the cache grows (Figure 3 of the DINOMO paper, scaled to this machine). Writes JSON, CSV and an SVG plot.
    Dac(DacArgs),
    /// A KV node added, removed or killed under load: throughput timeline, dip, and (for a kill) the time until
    /// every key is served again (Figures 6 and 8 of the DINOMO paper, scaled). Writes JSON, CSV and an SVG plot.
    Elastic(ElasticArgs),
    /// YCSB workloads against an in-process cluster or a running one: throughput, latency percentiles, fabric round
    /// trips, bytes and CPU per operation, cache hit ratios, merge backlog and a per-second timeline.
    Ycsb(Box<YcsbArgs>),
    /// Plots throughput, round trips per operation or hit ratios against the number of KV nodes from the JSON
    /// results of `bench ycsb`.
    Plot(PlotArgs),
    /// Plots the Redis-protocol comparison that `scripts/bench-redis` writes (its `redis.csv`): throughput of
    /// dinomo and redis-server, dinomo's fraction of Redis's beside each test's target, and CPU per request.
    PlotRedis(PlotRedisArgs),
    /// What the KV node's per-epoch key-access statistics (for the M-node's policy) cost: in-process throughput
    /// with and without them, side by side, and the sketch's own nanoseconds per access.
    KeyStats(KeyStatsArgs),
    /// A KV-node worker's cache lookup (and value copy) with every key cached, keys served one at a time beside
    /// batches announced first with a prefetch, as a worker announces the requests it takes together.
    Cache(CacheArgs),
    /// A MODEL, not a measurement: from the per-operation resources of `bench ycsb` results and a hardware profile,
    /// each component's throughput ceiling and the predicted throughput for 1 to --max-kns KV nodes, with the
    /// component that binds; compared with the measured runs.
    Project(Box<ProjectArgs>),
    /// Reproduces a figure of the DINOMO paper (3, 5, 6, 7 or 8) or of the pDPM paper (pdpm: its Figure 7;
    /// pdpm-mn: Figure 9, memory nodes added; pdpm-cn: Figure 10, compute nodes added), or all of them, scaled to
    /// this machine: runs the benchmarks and writes their results, plots and a table of the paper's numbers beside
    /// ours to OUT/figureN/ (OUT/pdpm-figureN/).
    Figure(FigureArgs),
}

/// Settings of `dinomo bench cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Keys cached.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    pub value_size: usize,
    /// Keys per round (comma-separated), one case each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub batch: Vec<usize>,
    /// Milliseconds per timed slice.
    #[arg(long, default_value_t = 100)]
    pub ms: u64,
    /// Slices per way and batch size (the two ways take turns).
    #[arg(long, default_value_t = 10)]
    pub slices: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `dinomo bench key-stats`.
#[derive(Debug, Args)]
pub struct KeyStatsArgs {
    /// Records loaded.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// YCSB workload (a, b, c, ...).
    #[arg(long, default_value = "c")]
    pub workload: dinomo_bench::ycsb::Workload,
    /// Request distribution: uniform, zipf:THETA, scrambled-zipf:THETA, latest.
    #[arg(long, default_value = "scrambled-zipf:0.99")]
    pub distribution: dinomo_bench::ycsb::Distribution,
    /// Requests kept in flight at the KV node.
    #[arg(long, default_value_t = 64)]
    pub depth: usize,
    /// Milliseconds per timed slice.
    #[arg(long, default_value_t = 200)]
    pub ms: u64,
    /// Slices per configuration (they take turns).
    #[arg(long, default_value_t = 10)]
    pub slices: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `dinomo bench project`. Profile values given here override the profile's.
#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// JSON results of `dinomo bench ycsb` (single runs or sweeps).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Hardware profile: paper (the DINOMO paper's testbed), local (the machine the runs ran on: its cores shared
    /// by everything, in-process fabric) or a TOML file of profile keys (`base = "local"` starts from local).
    #[arg(long, default_value = "paper")]
    pub profile: String,
    /// Largest number of KV nodes projected.
    #[arg(long, default_value_t = 16)]
    pub max_kns: usize,
    /// Fabric round trip, µs (paper 2).
    #[arg(long)]
    pub fabric_rtt_us: Option<f64>,
    /// Fabric round trips per second of one KV node's NIC; 0: no limit (paper 25M).
    #[arg(long)]
    pub kn_nic_rts: Option<f64>,
    /// Fabric round trips per second of the memory node's NIC; 0: no limit (paper 25M).
    #[arg(long)]
    pub dpm_nic_rts: Option<f64>,
    /// Link bandwidth per NIC and direction, Gb/s; 0: no limit (paper 56).
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Cores of one KV node (paper 8).
    #[arg(long)]
    pub kn_cores: Option<f64>,
    /// Processor threads of the memory node (paper 4).
    #[arg(long)]
    pub dpm_threads: Option<f64>,
    /// Closed-loop clients; 0: as in the run (paper 512).
    #[arg(long)]
    pub clients: Option<u32>,
    /// Requests in flight per client; 0: as in the run (paper 1).
    #[arg(long)]
    pub outstanding: Option<u32>,
    /// Client to KV-node round trip, µs (paper 20).
    #[arg(long)]
    pub client_rtt_us: Option<f64>,
    /// Factor on every measured CPU time (0.5: cores twice as fast as this machine's).
    #[arg(long)]
    pub cpu_scale: Option<f64>,
    /// Cores shared by every part (one machine); 0: each node has its own.
    #[arg(long)]
    pub shared_cores: Option<f64>,
    /// Fail unless the prediction for every measured run, from its own per-op resources, is within this fraction
    /// of what it measured (0.25 = 25%); meaningful with a profile of the machine the runs ran on.
    #[arg(long)]
    pub check: Option<f64>,
    /// Folder for projection.txt, .json, .csv and .svg.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the projection as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `dinomo bench figure`.
#[derive(Debug, Args)]
pub struct FigureArgs {
    /// The figure: 3, 5, 6, 7 or 8 (the DINOMO paper's); pdpm (the pDPM paper's Figure 7: the pDPM baselines on
    /// YCSB, with and without replication; written to OUT/pdpm-figure7/); pdpm-mn (its Figure 9: throughput as
    /// memory nodes are added, compute nodes held; OUT/pdpm-figure9/); pdpm-cn (its Figure 10: throughput as
    /// compute nodes are added, memory nodes held; OUT/pdpm-figure10/); or all (every one of them, then
    /// OUT/figures.md).
    pub figure: String,
    /// tiny (seconds, a smoke run), small (a minute or two per figure) or full (several minutes per figure).
    #[arg(long, default_value = "small")]
    pub scale: dinomo_bench::figures::Scale,
    /// Folder under which figureN/ is written.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Figure 5 only: `resp` runs DINOMO and Clover both behind the Redis protocol of a `dinomo up --system S`
    /// child process per run, driven by the same clients (written to OUT/figure5-resp/); `in-process` (the
    /// default) is the recipe above.
    #[arg(long, default_value = "in-process")]
    pub front_door: dinomo_bench::figures::FrontDoor,
}

/// Settings of `dinomo bench elastic`.
#[derive(Debug, Args)]
pub struct ElasticArgs {
    /// System under test: dinomo, dinomo-s or dinomo-n (which reports the data each reconfiguration moved).
    #[arg(long, default_value = "dinomo")]
    pub system: System,
    /// What happens mid-run: add, remove, failure or replicate (the hottest keys become shared).
    #[arg(long, default_value = "failure")]
    pub scenario: dinomo_bench::Scenario,
    /// KV nodes at the start.
    #[arg(long, default_value_t = 4)]
    pub kns: usize,
    /// Worker threads per KV node.
    #[arg(long, default_value_t = 1)]
    pub kn_threads: usize,
    /// Records loaded.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Closed-loop client threads.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// YCSB workload (a, b, c, d, f, w, insert-only).
    #[arg(long, default_value = "a")]
    pub workload: dinomo_bench::ycsb::Workload,
    /// Request distribution: uniform, zipf:THETA, scrambled-zipf:THETA, latest.
    #[arg(long, default_value = "uniform")]
    pub distribution: dinomo_bench::ycsb::Distribution,
    /// Milliseconds before the event.
    #[arg(long, default_value_t = 1500)]
    pub before_ms: u64,
    /// Milliseconds after the event.
    #[arg(long, default_value_t = 1500)]
    pub after_ms: u64,
    /// Timeline bucket in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub bucket_ms: u64,
    /// KV-node lease in milliseconds (how long a dead node goes unnoticed).
    #[arg(long, default_value_t = 30)]
    pub lease_ms: u64,
    /// KV-node heartbeat period in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub heartbeat_ms: u64,
    /// Busy-wait per fabric round trip, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Seed of the clients' generators.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// `replicate`: how many of the hottest keys become shared.
    #[arg(long, default_value_t = 4)]
    pub hot_keys: u64,
    /// `replicate`: owners of each shared key (0: every node).
    #[arg(long, default_value_t = 0)]
    pub replication: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Folder for elastic-SCENARIO.json, .csv and .svg (elastic-SYSTEM-SCENARIO.* for systems other than dinomo).
    #[arg(long, default_value = "results/elastic")]
    pub out: PathBuf,
}

/// Settings of `dinomo bench dac`.
#[derive(Debug, Args)]
pub struct DacArgs {
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keys loaded.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Working set read uniformly, in percent of the keys.
    #[arg(long, default_value_t = 5.0)]
    pub working_set: f64,
    /// Cache sizes in percent of the data (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub cache: Vec<f64>,
    /// Policies (comma-separated): dac, shortcut-only, value-only, static-N.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "shortcut-only,static-25,static-50,static-75,value-only,dac"
    )]
    pub policies: Vec<Policy>,
    /// KV-node worker threads, each driven by its own benchmark thread.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed phase per case, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub ms: u64,
    /// Warm-up reads per worker, in passes over its share of the working set.
    #[arg(long, default_value_t = 6.0)]
    pub warmup_passes: f64,
    /// Busy-wait per fabric round trip, in nanoseconds.
    #[arg(long, default_value_t = 2000)]
    pub latency_ns: u64,
    /// Seed of the working-set choice and the reads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Folder for dac.json, dac.csv and dac.svg.
    #[arg(long, default_value = "results/dac")]
    pub out: PathBuf,
}

/// Settings of `dinomo bench fabric`.
#[derive(Debug, Args)]
pub struct FabricArgs {
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measured time per case, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pub ms: u64,
    /// Verbs per batch in the batched cases.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Busy-wait added to every fabric round trip, in nanoseconds (emulates a microsecond fabric).
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// Transport to measure: in-process or tcp (repeat for both; default both).
    #[arg(long)]
    pub transport: Vec<TransportChoice>,
    /// Name the endpoints as a KV node's, as a cluster's nodes do: their verbs run under the memory node's
    /// revocation gate.
    #[arg(long)]
    pub named_client: bool,
}

/// Runs the chosen benchmark.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.which {
        Which::Ycsb(a) => ycsb(*a),
        Which::Plot(a) => plot(a),
        Which::PlotRedis(a) => plot_redis(a),
        Which::Project(a) => project(*a),
        Which::Figure(a) => figure(a),
        Which::Fabric(a) => {
            let opts = FabricBenchOptions {
                duration_per_case: Duration::from_millis(a.ms),
                batch: a.batch,
                injected_latency_ns: a.latency_ns,
                named_client: a.named_client,
                transports: if a.transport.is_empty() {
                    TransportChoice::ALL.to_vec()
                } else {
                    a.transport
                },
            };
            let report = dinomo_bench::run(&opts)?;
            if a.json {
                println!("{}", report.to_json_pretty()?);
            } else {
                report.print_table(&mut std::io::stdout().lock())?;
            }
            Ok(())
        }
        Which::Elastic(a) => {
            let opts = dinomo_bench::ElasticOptions {
                system: a.system,
                scenario: a.scenario,
                kns: a.kns,
                kn_threads: a.kn_threads,
                keys: a.keys,
                value_size: a.value_size,
                clients: a.clients,
                workload: a.workload,
                distribution: a.distribution,
                before: Duration::from_millis(a.before_ms),
                after: Duration::from_millis(a.after_ms),
                bucket: Duration::from_millis(a.bucket_ms),
                lease: Duration::from_millis(a.lease_ms),
                heartbeat: Duration::from_millis(a.heartbeat_ms),
                latency_ns: a.latency_ns,
                seed: a.seed,
                hot_keys: a.hot_keys,
                replication: a.replication,
            };
            let report = dinomo_bench::run_elastic(&opts, |step| eprintln!("elastic: {step}"))?;
            let name = opts.file_stem();
            let json = serde_json::to_string_pretty(&report)?;
            write_outputs(&a.out, &name, &json, &report.to_csv(), &report.to_svg())?;
            if a.json {
                println!("{json}");
            } else {
                println!("{}", report.summary());
                println!("wrote {}/{name}.json, .csv and .svg", a.out.display());
            }
            Ok(())
        }
        Which::KeyStats(a) => {
            let opts = dinomo_bench::KeyStatsBenchOptions {
                keys: a.keys,
                value_size: a.value_size,
                workload: a.workload,
                distribution: a.distribution,
                depth: a.depth,
                slice: Duration::from_millis(a.ms),
                slices: a.slices,
                ..dinomo_bench::KeyStatsBenchOptions::default()
            };
            let report = dinomo_bench::run_key_stats(&opts, |step| eprintln!("key-stats: {step}"))?;
            print_report(a.json, &report, dinomo_bench::KeyStatsReport::print_table)
        }
        Which::Cache(a) => {
            let opts = dinomo_bench::CacheBenchOptions {
                keys: a.keys,
                value_size: a.value_size,
                batches: a.batch,
                slice: Duration::from_millis(a.ms),
                slices: a.slices,
                ..dinomo_bench::CacheBenchOptions::default()
            };
            let report = dinomo_bench::run_cache(&opts, |step| eprintln!("cache: {step}"))?;
            print_report(a.json, &report, dinomo_bench::CacheReport::print_table)
        }
        Which::Dac(a) => {
            let opts = DacBenchOptions {
                keys: a.keys,
                value_size: a.value_size,
                working_set_percent: a.working_set,
                cache_percents: a.cache,
                policies: a.policies,
                threads: a.threads,
                duration: Duration::from_millis(a.ms),
                warmup_passes: a.warmup_passes,
                injected_latency_ns: a.latency_ns,
                seed: a.seed,
            };
            let report = dinomo_bench::run_dac(&opts, |step| eprintln!("dac: {step}"))?;
            let json = serde_json::to_string_pretty(&report)?;
            write_outputs(&a.out, "dac", &json, &report.to_csv(), &report.to_svg())?;
            if a.json {
                println!("{json}");
            } else {
                report.print_table();
                println!("\nwrote {}/dac.json, dac.csv and dac.svg", a.out.display());
            }
            Ok(())
        }
    }
}

/// Prints `report` as JSON when `json`, else as the table `table` prints.
fn print_report<R: serde::Serialize>(
    json: bool,
    report: &R,
    table: impl FnOnce(&R),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        table(report);
    }
    Ok(())
}

/// Settings of `dinomo bench ycsb`.
#[derive(Debug, Args)]
pub struct YcsbArgs {
    /// System under test: dinomo, dinomo-s (shortcut-only cache) or dinomo-n (shared-nothing: one index partition
    /// per KV node) of the DINOMO paper, or the pDPM baselines directds, directds-c, centralds and clover (SepDS)
    /// (in-process only; --kns is then the number of compute nodes the clients are spread over, one pDPM client per
    /// client thread). ditto and tac are named but not built yet.
    #[arg(long, default_value = "dinomo")]
    pub system: System,
    /// Where the store runs: in-process (a cluster started by this command), native (a running cluster, reached
    /// through --seed HOST:PORT) or resp (any server speaking the Redis protocol, at --resp HOST:PORT). Default:
    /// resp when --resp is given, else in-process.
    #[arg(long, value_parser = ["in-process", "native", "resp"])]
    pub target: Option<String>,
    /// YCSB workload: a, b, c, d, f, w, insert-only, or a mix such as read=0.9,update=0.1.
    #[arg(long, default_value = "a")]
    pub workload: Workload,
    /// Request distribution: uniform, zipf, scrambled-zipf or latest (default: the workload's, as in YCSB:
    /// latest for d, scrambled-zipf for the others). zipf:THETA also works.
    #[arg(long)]
    pub distribution: Option<String>,
    /// Skew of zipf and scrambled-zipf (0.5, 0.99, 2 ...).
    #[arg(long)]
    pub theta: Option<f64>,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Bytes per key.
    #[arg(long, default_value_t = 8)]
    pub key_bytes: usize,
    /// Bytes per value (the DINOMO paper uses 1024 and 64; at least 16).
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Closed-loop client threads.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Operations each client keeps in flight (pipelined over the native protocol).
    #[arg(long, default_value_t = 1)]
    pub outstanding: usize,
    /// Warm-up before the measured phase, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub warmup_secs: f64,
    /// Length of the measured phase in seconds (with --ops: the most it may last).
    #[arg(long, default_value_t = 10.0)]
    pub secs: f64,
    /// Warm up for this many operations in all instead (still bounded by --warmup-secs).
    #[arg(long)]
    pub warmup_ops: Option<u64>,
    /// Measure this many operations in all instead (still bounded by --secs).
    #[arg(long)]
    pub ops: Option<u64>,
    /// A number seeds the operation streams (default 42; the same seed repeats the run's operations). HOST:PORT
    /// names a routing node of a running cluster for --target native (repeat for several).
    #[arg(long = "seed", value_name = "N|HOST:PORT")]
    pub seed: Vec<String>,
    /// Skip the load phase (the cluster was loaded by an earlier run with the same records and sizes).
    #[arg(long)]
    pub no_load: bool,
    /// Do not check the values read.
    #[arg(long)]
    pub no_verify: bool,
    /// How long one operation may take, retries included, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub op_timeout_ms: u64,
    /// In-process: KV nodes.
    #[arg(long, default_value_t = 2)]
    pub kns: usize,
    /// In-process: worker threads per KV node.
    #[arg(long, default_value_t = 2)]
    pub kn_threads: usize,
    /// In-process: cache per KV node (split among its workers), e.g. 64MiB.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub cache_bytes: u64,
    /// In-process: caching policy (dac, static-N, value-only, shortcut-only); default: the system's (dac;
    /// shortcut-only for dinomo-s, which takes no other).
    #[arg(long)]
    pub policy: Option<String>,
    /// In-process: busy-wait per fabric round trip, in nanoseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ns: u64,
    /// In-process, with --latency-ns: bytes a KV-node worker reads ahead for a batch's lookups (the index walks of
    /// its uncached keys side by side, then the entries found and those its cached shortcuts lead to), e.g. 1MiB;
    /// 0 gives the paper's KV nodes.
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub read_ahead_bytes: u64,
    /// In-process, with --latency-ns: whether KV-node caches record keys an index walk found without a value
    /// (false gives the paper's DAC).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub remember_absent: bool,
    /// In-process: the memory node's merge threads.
    #[arg(long, default_value_t = 4)]
    pub merge_threads: usize,
    /// In-process: the memory node's pool (default: four times the records' log entries, at least 1GiB).
    #[arg(long, value_parser = parse_size)]
    pub pool_bytes: Option<u64>,
    /// In-process: KV-node liveness lease in milliseconds (heartbeats every tenth of it).
    #[arg(long, default_value_t = 2000)]
    pub lease_ms: u64,
    /// In-process: run once for each of these KV-node counts (e.g. 1,2,4) and write one combined result.
    #[arg(long, value_delimiter = ',')]
    pub sweep_kns: Vec<usize>,
    /// pDPM baselines: memory nodes, each over its own pool.
    #[arg(long, default_value_t = 1)]
    pub memory_nodes: usize,
    /// pDPM baselines: copies of every value, on distinct memory nodes.
    #[arg(long, default_value_t = 1)]
    pub replication: u32,
    /// pDPM baselines: keys the slot tables (DirectDS), block areas (CentralDS) or shortcut cells and data slots
    /// (Clover) are sized for (default: the
    /// records plus --ops, twice the records without --ops, at least 1024).
    #[arg(long)]
    pub pdpm_keys: Option<u64>,
    /// Clover: the metadata server's reclaim lease in milliseconds (how long a retired slot waits before reuse).
    #[arg(long, default_value_t = InProcessOptions::default().clover_reclaim_lease_ms)]
    pub clover_reclaim_lease_ms: u64,
    /// Clover: the clients' read timeout in milliseconds (a slower read starts over; at most half the lease).
    #[arg(long, default_value_t = InProcessOptions::default().clover_read_timeout_ms)]
    pub clover_read_timeout_ms: u64,
    /// Native: the memory node's fabric address, to report its merge backlog.
    #[arg(long)]
    pub dpm: Option<String>,
    /// RESP: a server speaking the Redis protocol (a `dinomo up` RESP port, a redis-server); repeat to spread the
    /// clients' connections over several.
    #[arg(long = "resp", value_name = "HOST:PORT")]
    pub resp: Vec<String>,
    /// RESP: the password every connection sends with AUTH; also read from DINOMO_RESP_PASSWORD.
    #[arg(
        long,
        value_name = "P",
        env = "DINOMO_RESP_PASSWORD",
        default_value = "",
        hide_env_values = true
    )]
    pub password: String,
    #[command(flatten)]
    pub token: crate::dpm::ClusterToken,
    /// Folder for the JSON report, the timeline CSV and an SVG plot.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the JSON report on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// Settings of `dinomo bench plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// What to plot against the number of KV nodes: nodes (throughput), round-trips (per operation) or hit-ratios.
    #[arg(long, default_value = "nodes")]
    pub kind: PlotKind,
    /// JSON results of `dinomo bench ycsb` (single runs or sweeps).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// Settings of `dinomo bench plot-redis`.
#[derive(Debug, Args)]
pub struct PlotRedisArgs {
    /// The results file of `scripts/bench-redis` (CSV: `# title: ...`, a header, a line per test and pipeline).
    pub file: PathBuf,
    /// The SVG file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// The distribution asked for: a name with --theta, or name:θ.
fn distribution(a: &YcsbArgs) -> anyhow::Result<Distribution> {
    let Some(name) = &a.distribution else {
        let d = a.workload.default_distribution();
        return Ok(match (d, a.theta) {
            (Distribution::ScrambledZipfian { .. }, Some(theta)) => {
                Distribution::ScrambledZipfian { theta }
            }
            (_, Some(_)) => anyhow::bail!(
                "--theta applies to zipf and scrambled-zipf; workload {} reads with {d}",
                a.workload
            ),
            (d, None) => d,
        });
    };
    let spec = match a.theta {
        None => name.clone(),
        Some(_) if name.contains(':') => {
            anyhow::bail!("give the skew once: --distribution {name} or --theta")
        }
        Some(theta) => {
            let lower = name.to_ascii_lowercase();
            if lower.contains("zipf") {
                format!("{name}:{theta}")
            } else {
                anyhow::bail!("--theta applies to zipf and scrambled-zipf, not {name}")
            }
        }
    };
    Ok(spec.parse()?)
}

/// The options of a `bench ycsb` command line.
fn ycsb_options(a: &YcsbArgs) -> anyhow::Result<YcsbOptions> {
    let mut rng_seed = None;
    let mut seeds = Vec::new();
    for s in &a.seed {
        match s.parse::<u64>() {
            Ok(n) if rng_seed.is_none() => rng_seed = Some(n),
            Ok(_) => anyhow::bail!("--seed N given twice"),
            Err(_) if s.contains(':') => seeds.push(s.clone()),
            Err(_) => anyhow::bail!(
                "--seed {s:?}: expected a number (the generators' seed) or HOST:PORT (a routing node)"
            ),
        }
    }
    let target_name = match (&a.target, a.resp.is_empty()) {
        (Some(t), _) => t.as_str(),
        (None, false) => "resp",
        (None, true) => "in-process",
    };
    if target_name != "resp" {
        anyhow::ensure!(
            a.resp.is_empty(),
            "--resp names a RESP server: use it with --target resp (or without --target)"
        );
        anyhow::ensure!(
            a.password.is_empty(),
            "--password is sent to a RESP server: use it with --resp"
        );
    }
    let target = match target_name {
        "resp" => {
            anyhow::ensure!(
                a.sweep_kns.is_empty(),
                "--sweep-kns starts in-process clusters; it cannot be used with --target resp"
            );
            anyhow::ensure!(
                seeds.is_empty() && a.dpm.is_none(),
                "--seed HOST:PORT and --dpm are for --target native; a RESP server is named with --resp"
            );
            TargetOptions::Resp(RespOptions {
                addrs: a.resp.clone(),
                password: a.password.clone(),
            })
        }
        "native" => {
            anyhow::ensure!(
                a.sweep_kns.is_empty(),
                "--sweep-kns starts in-process clusters; it cannot be used with --target native"
            );
            TargetOptions::Native(NativeOptions {
                seeds,
                dpm: a.dpm.clone(),
                token: a.token.value.clone().unwrap_or_default(),
            })
        }
        _ => {
            anyhow::ensure!(
                seeds.is_empty(),
                "--seed HOST:PORT names a running cluster: add --target native"
            );
            anyhow::ensure!(
                a.dpm.is_none(),
                "--dpm is for --target native; an in-process cluster's memory node is read directly"
            );
            let defaults = InProcessOptions::default();
            if a.system.is_pdpm() {
                // Settings of DINOMO's KV nodes and memory-node processor mean nothing to these stores: refuse them
                // rather than run without them.
                let ignored = [
                    ("--kn-threads", a.kn_threads != defaults.kn_threads),
                    ("--cache-bytes", a.cache_bytes != defaults.cache_bytes),
                    (
                        "--read-ahead-bytes",
                        a.read_ahead_bytes != defaults.read_ahead_bytes,
                    ),
                    (
                        "--remember-absent",
                        a.remember_absent != defaults.remember_absent,
                    ),
                    ("--merge-threads", a.merge_threads != defaults.merge_threads),
                    ("--pool-bytes", a.pool_bytes.is_some()),
                    ("--lease-ms", a.lease_ms != defaults.lease_ms),
                ];
                if let Some((flag, _)) = ignored.iter().find(|(_, given)| *given) {
                    anyhow::bail!(
                        "{flag} configures DINOMO's KV nodes or memory node; {} has neither (its settings are \
                         --kns, --memory-nodes, --replication, --pdpm-keys and --latency-ns)",
                        a.system
                    );
                }
            }
            let clover_only = [
                (
                    "--clover-reclaim-lease-ms",
                    a.clover_reclaim_lease_ms != defaults.clover_reclaim_lease_ms,
                ),
                (
                    "--clover-read-timeout-ms",
                    a.clover_read_timeout_ms != defaults.clover_read_timeout_ms,
                ),
            ];
            if let Some((flag, _)) = clover_only.iter().find(|(_, given)| *given) {
                anyhow::ensure!(
                    a.system == System::Clover,
                    "{flag} configures Clover; {} does not run it",
                    a.system
                );
            }
            TargetOptions::InProcess(InProcessOptions {
                kns: a.kns,
                kn_threads: a.kn_threads,
                cache_bytes: a.cache_bytes,
                policy: a
                    .policy
                    .clone()
                    .unwrap_or_else(|| a.system.default_policy()),
                latency_ns: a.latency_ns,
                read_ahead_bytes: a.read_ahead_bytes,
                remember_absent: a.remember_absent,
                merge_threads: a.merge_threads,
                pool_bytes: a.pool_bytes,
                lease_ms: a.lease_ms,
                memory_nodes: a.memory_nodes,
                replication: a.replication,
                pdpm_keys: a.pdpm_keys,
                clover_reclaim_lease_ms: a.clover_reclaim_lease_ms,
                clover_read_timeout_ms: a.clover_read_timeout_ms,
            })
        }
    };
    Ok(YcsbOptions {
        system: a.system,
        target,
        workload: a.workload,
        distribution: distribution(a)?,
        records: a.records,
        key_bytes: a.key_bytes,
        value_bytes: a.value_bytes,
        clients: a.clients,
        outstanding: a.outstanding,
        warmup_secs: a.warmup_secs,
        secs: a.secs,
        warmup_ops: a.warmup_ops,
        ops: a.ops,
        seed: rng_seed.unwrap_or(42),
        load: !a.no_load,
        verify: !a.no_verify,
        op_timeout_ms: a.op_timeout_ms,
    })
}

/// Shows progress on stderr: a bar for the load phase when stderr is a terminal, lines otherwise.
struct ProgressView {
    bar: Option<indicatif::ProgressBar>,
    terminal: bool,
}

impl ProgressView {
    fn new() -> ProgressView {
        ProgressView {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn show(&mut self, p: Progress) {
        match p {
            Progress::Phase(step) => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                eprintln!("ycsb: {step}");
            }
            Progress::Load { done, total } if self.terminal => {
                let bar = self.bar.get_or_insert_with(|| {
                    let bar = indicatif::ProgressBar::new(total);
                    if let Ok(style) = indicatif::ProgressStyle::with_template(
                        "  loading [{bar:40}] {pos}/{len} records ({per_sec}, {eta} left)",
                    ) {
                        bar.set_style(style.progress_chars("=> "));
                    }
                    bar
                });
                bar.set_position(done);
                if done >= total {
                    bar.finish_and_clear();
                    self.bar = None;
                }
            }
            Progress::Load { .. } => {}
            Progress::Second {
                t_s,
                ops_per_s,
                p99_us,
            } => {
                eprintln!("  {t_s:>4} s  {ops_per_s:>10.0} ops/s  p99 {p99_us:>8.1} µs");
            }
        }
    }
}

fn write_outputs(
    dir: &std::path::Path,
    stem: &str,
    json: &str,
    csv: &str,
    svg: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (ext, body) in [("json", json), ("csv", csv), ("svg", svg)] {
        let path = dir.join(format!("{stem}.{ext}"));
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn ycsb(a: YcsbArgs) -> anyhow::Result<()> {
    let opts = ycsb_options(&a)?;
    let mut view = ProgressView::new();
    let mut progress = |p: Progress| view.show(p);
    if !a.sweep_kns.is_empty() {
        let sweep = dinomo_bench::ycsb_run::run_sweep(&opts, &a.sweep_kns, &mut progress)?;
        let json = serde_json::to_string_pretty(&sweep)?;
        if let Some(dir) = &a.out {
            let stem = sweep.file_stem();
            write_outputs(dir, &stem, &json, &sweep.to_csv(), &sweep.to_svg())?;
            eprintln!("ycsb: wrote {}/{stem}.json, .csv and .svg", dir.display());
        }
        if a.json {
            println!("{json}");
        } else {
            for r in &sweep.runs {
                println!("{}", r.summary());
            }
            print!("{}", sweep.table());
        }
        return Ok(());
    }
    let report = dinomo_bench::ycsb_run::run_ycsb(&opts, &mut progress)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(dir) = &a.out {
        let stem = report.file_stem();
        write_outputs(dir, &stem, &json, &report.to_csv(), &report.to_svg())?;
        eprintln!("ycsb: wrote {}/{stem}.json, .csv and .svg", dir.display());
    }
    if a.json {
        println!("{json}");
    } else {
        print!("{}", report.summary());
    }
    Ok(())
}

/// Every run in the JSON results of `bench ycsb` at `files`; at least one.
fn load_runs(files: &[PathBuf]) -> anyhow::Result<Vec<YcsbReport>> {
    let mut runs = Vec::new();
    for f in files {
        runs.extend(dinomo_bench::ycsb_run::load_reports(f)?);
    }
    anyhow::ensure!(!runs.is_empty(), "no runs in {files:?}");
    Ok(runs)
}

fn plot_redis(a: PlotRedisArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let comparison = dinomo_bench::parse_redis_csv(&text)
        .with_context(|| format!("reading {}", a.file.display()))?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&a.out, dinomo_bench::plot_redis(&comparison))
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "wrote {} ({} cases)",
        a.out.display(),
        comparison.cases.len()
    );
    Ok(())
}

fn plot(a: PlotArgs) -> anyhow::Result<()> {
    let runs = load_runs(&a.files)?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&a.out, dinomo_bench::ycsb_run::plot(a.kind, &runs))
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {} ({} runs)", a.out.display(), runs.len());
    Ok(())
}

fn project(a: ProjectArgs) -> anyhow::Result<()> {
    use dinomo_bench::project::{ProfilePreset, ProfileSettings, project};
    let runs = load_runs(&a.files)?;
    let base = match a.profile.parse::<ProfilePreset>() {
        Ok(preset) => ProfileSettings {
            base: Some(preset),
            ..ProfileSettings::default()
        },
        Err(_) => {
            let path = PathBuf::from(&a.profile);
            anyhow::ensure!(
                path.exists(),
                "--profile {:?}: neither paper, local, nor a file",
                a.profile
            );
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            ProfileSettings::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
    };
    let flags = ProfileSettings {
        fabric_rtt_us: a.fabric_rtt_us,
        kn_nic_round_trips_per_s: a.kn_nic_rts,
        dpm_nic_round_trips_per_s: a.dpm_nic_rts,
        link_gbps: a.link_gbps,
        kn_cores: a.kn_cores,
        dpm_threads: a.dpm_threads,
        clients: a.clients,
        outstanding: a.outstanding,
        client_rtt_us: a.client_rtt_us,
        cpu_scale: a.cpu_scale,
        shared_cores: a.shared_cores,
        ..ProfileSettings::default()
    };
    // The local profile describes the machine the runs ran on.
    let cores = runs[0].host.cores;
    let profile = base.overlay(&flags).resolve(cores)?;
    let projection = project(&runs, &profile, a.max_kns)?;
    let json = serde_json::to_string_pretty(&projection)?;
    if let Some(dir) = &a.out {
        write_outputs(
            dir,
            "projection",
            &json,
            &projection.to_csv(),
            &projection.to_svg(),
        )?;
        let txt = dir.join("projection.txt");
        std::fs::write(&txt, projection.table())
            .with_context(|| format!("writing {}", txt.display()))?;
        eprintln!(
            "project: wrote {}/projection.txt, .json, .csv and .svg",
            dir.display()
        );
    }
    if a.json {
        println!("{json}");
    } else {
        print!("{}", projection.table());
    }
    if let Some(tolerance) = a.check {
        anyhow::ensure!(
            projection.all_within(tolerance),
            "the model is off by more than {:.0}% for at least one measured run (see the checks above)",
            tolerance * 100.0
        );
    }
    Ok(())
}

fn figure(a: FigureArgs) -> anyhow::Result<()> {
    use dinomo_bench::figures::{
        FIGURES, PDPM_FIGURE, PdpmAxis, run_figure, run_pdpm_figure, run_pdpm_scaling_figure,
    };
    let all = a.figure.eq_ignore_ascii_case("all");
    let mut markdown = String::new();
    let mut emit = |report: &dinomo_bench::figures::FigureReport, folder: String| {
        let md = report.to_markdown();
        println!("{md}");
        markdown.push_str(&md);
        markdown.push('\n');
        eprintln!(
            "wrote {}/{folder}/ ({})",
            a.out.display(),
            report.files.join(", ")
        );
    };
    if a.front_door == dinomo_bench::figures::FrontDoor::Resp {
        anyhow::ensure!(
            a.figure == "5",
            "--front-door resp is Figure 5's comparison of DINOMO and Clover: use it with figure 5"
        );
        // The benchmark is the dinomo binary: it starts itself as `dinomo up`.
        let exe = std::env::current_exe().context("locating the dinomo binary")?;
        let report =
            dinomo_bench::figures::run_figure5_front_door(a.scale, &a.out, &exe, &mut |s| {
                eprintln!("{s}")
            })?;
        emit(&report, dinomo_bench::figures::FRONT_DOOR_FOLDER.into());
        return Ok(());
    }
    let (figures, pdpm, axes): (Vec<u32>, bool, Vec<PdpmAxis>) = if all {
        (FIGURES.to_vec(), true, PdpmAxis::ALL.to_vec())
    } else if a.figure.eq_ignore_ascii_case(PDPM_FIGURE) {
        (Vec::new(), true, Vec::new())
    } else if let Some(axis) = PdpmAxis::from_name(&a.figure) {
        (Vec::new(), false, vec![axis])
    } else {
        let n: u32 = a.figure.parse().map_err(|_| {
            anyhow::anyhow!(
                "figure: expected 3, 5, 6, 7, 8, pdpm, pdpm-mn, pdpm-cn or all, got {:?}",
                a.figure
            )
        })?;
        (vec![n], false, Vec::new())
    };
    for n in figures {
        let report = run_figure(n, a.scale, &a.out, &mut |s| eprintln!("{s}"))?;
        emit(&report, format!("figure{n}"));
    }
    if pdpm {
        let report = run_pdpm_figure(a.scale, &a.out, &mut |s| eprintln!("{s}"))?;
        emit(&report, "pdpm-figure7".into());
    }
    for axis in axes {
        let report = run_pdpm_scaling_figure(axis, a.scale, &a.out, &mut |s| eprintln!("{s}"))?;
        emit(&report, format!("pdpm-figure{}", axis.figure()));
    }
    if all {
        let path = a.out.join("figures.md");
        std::fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        ycsb: YcsbArgs,
    }

    fn options(args: &[&str]) -> anyhow::Result<YcsbOptions> {
        let cli = Cli::try_parse_from(std::iter::once("ycsb").chain(args.iter().copied()))?;
        let o = ycsb_options(&cli.ycsb)?;
        o.validate()?;
        Ok(o)
    }

    fn policy(o: &YcsbOptions) -> &str {
        match &o.target {
            TargetOptions::InProcess(p) => &p.policy,
            other => panic!("expected an in-process target, got {}", other.name()),
        }
    }

    #[test]
    fn the_system_picks_the_cache_policy_unless_one_is_given() {
        let o = options(&[]).unwrap();
        assert_eq!((o.system, policy(&o)), (System::Dinomo, "dac"));
        let o = options(&["--system", "dinomo-s"]).unwrap();
        assert_eq!((o.system, policy(&o)), (System::DinomoS, "shortcut-only"));
        let o = options(&["--system", "dinomo-n"]).unwrap();
        assert_eq!((o.system, policy(&o)), (System::DinomoN, "dac"));
        let o = options(&["--policy", "value-only"]).unwrap();
        assert_eq!(policy(&o), "value-only");
        let err = options(&["--system", "dinomo-s", "--policy", "dac"]).unwrap_err();
        assert!(err.to_string().contains("shortcuts only"), "{err}");
        let err = options(&["--system", "ditto"]).unwrap_err();
        assert!(err.to_string().contains("not built yet"), "{err}");
        let o = options(&[
            "--system",
            "clover",
            "--memory-nodes",
            "3",
            "--replication",
            "2",
        ])
        .unwrap();
        assert_eq!((o.system, policy(&o)), (System::Clover, "none"));
        let err = options(&["--system", "clover", "--replication", "2"]).unwrap_err();
        assert!(err.to_string().contains("--replication"), "{err}");
        let err = options(&["--system", "clover", "--policy", "dac"]).unwrap_err();
        assert!(err.to_string().contains("has no cache"), "{err}");
        let o = options(&["--system", "centralds", "--memory-nodes", "2"]).unwrap();
        assert_eq!((o.system, policy(&o)), (System::CentralDs, "none"));
        let err = options(&["--system", "directds", "--policy", "dac"]).unwrap_err();
        assert!(err.to_string().contains("has no cache"), "{err}");
        let err = options(&["--system", "directds-c", "--replication", "2"]).unwrap_err();
        assert!(err.to_string().contains("--replication"), "{err}");
        let err = options(&["--memory-nodes", "2"]).unwrap_err();
        assert!(err.to_string().contains("one memory node"), "{err}");
        for flag in [
            ["--kn-threads", "4"],
            ["--cache-bytes", "1MiB"],
            ["--merge-threads", "1"],
            ["--pool-bytes", "1GiB"],
            ["--lease-ms", "500"],
            ["--read-ahead-bytes", "0"],
            ["--remember-absent", "false"],
        ] {
            let err = options(&["--system", "directds", flag[0], flag[1]]).unwrap_err();
            assert!(err.to_string().starts_with(flag[0]), "{err}");
            assert!(options(&[flag[0], flag[1]]).is_ok(), "{flag:?} is DINOMO's");
        }
        // The paper's KV nodes: nothing read ahead, no records of absence.
        let o = options(&["--read-ahead-bytes", "0", "--remember-absent", "false"]).unwrap();
        let TargetOptions::InProcess(p) = &o.target else {
            panic!("in process")
        };
        assert_eq!((p.read_ahead_bytes, p.remember_absent), (0, false));
        let o = options(&[]).unwrap();
        let TargetOptions::InProcess(p) = &o.target else {
            panic!("in process")
        };
        assert_eq!((p.read_ahead_bytes, p.remember_absent), (1 << 20, true));
    }
}
