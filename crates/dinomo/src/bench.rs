//! `dinomo bench`: benchmarks that print tables for people and JSON for scripts.

use std::time::Duration;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use dinomo_bench::{DacBenchOptions, FabricBenchOptions, TransportChoice};
use dinomo_cache::Policy;

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
    /// What the KV node's per-epoch key-access statistics (for the M-node's policy) cost: in-process throughput
    /// with and without them, side by side, and the sketch's own nanoseconds per access.
    KeyStats(KeyStatsArgs),
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

/// Settings of `dinomo bench elastic`.
#[derive(Debug, Args)]
pub struct ElasticArgs {
    /// What happens mid-run: add, remove or failure.
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
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Folder for elastic-SCENARIO.json, .csv and .svg.
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
}

/// Runs the chosen benchmark.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.which {
        Which::Fabric(a) => {
            let opts = FabricBenchOptions {
                duration_per_case: Duration::from_millis(a.ms),
                batch: a.batch,
                injected_latency_ns: a.latency_ns,
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
            };
            let report = dinomo_bench::run_elastic(&opts, |step| eprintln!("elastic: {step}"))?;
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            let name = format!("elastic-{}", format!("{:?}", a.scenario).to_lowercase());
            let json = serde_json::to_string_pretty(&report)?;
            std::fs::write(a.out.join(format!("{name}.json")), &json)?;
            std::fs::write(a.out.join(format!("{name}.csv")), report.to_csv())?;
            std::fs::write(a.out.join(format!("{name}.svg")), report.to_svg())?;
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
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                report.print_table();
            }
            Ok(())
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
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            let json = serde_json::to_string_pretty(&report)?;
            std::fs::write(a.out.join("dac.json"), &json)?;
            std::fs::write(a.out.join("dac.csv"), report.to_csv())?;
            std::fs::write(a.out.join("dac.svg"), report.to_svg())?;
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
