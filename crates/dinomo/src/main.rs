//! The `dinomo` command: memory node, benchmarks, and (as the project grows) KV nodes and whole clusters.

mod bench;
mod dpm;
mod size;

use clap::{Parser, Subcommand};

/// dinomo: an elastic, persistent key-value store for disaggregated memory.
#[derive(Debug, Parser)]
#[command(name = "dinomo", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a memory node: serve a persistent pool over the fabric.
    Dpm(dpm::DpmArgs),
    /// Run a benchmark.
    Bench(bench::BenchArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DINOMO_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dpm(args) => dpm::run(args),
        Command::Bench(args) => bench::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
