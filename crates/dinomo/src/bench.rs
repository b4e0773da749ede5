//! `dinomo bench`: benchmarks that print tables for people and JSON for scripts.

use std::time::Duration;

use clap::{Args, Subcommand};
use dinomo_bench::{FabricBenchOptions, TransportChoice};

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
    }
}
