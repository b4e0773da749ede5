//! The `dinomo` command: memory node, benchmarks, and (as the project grows) KV nodes and whole clusters.

mod bench;
mod cluster;
mod config;
mod dpm;
mod pdpm;
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
    /// Run a whole cluster in one process: memory node, KV nodes, routing node and M-node (or a pDPM baseline:
    /// its memory nodes, CentralDS's coordinator and a Redis listener).
    Up(Box<cluster::UpArgs>),
    /// Run a KV node that joins the cluster of a memory node.
    Kn(cluster::KnCmdArgs),
    /// Run a routing node.
    Rn(cluster::RnArgs),
    /// Run a management node (one leads; more wait as standbys).
    Mnode(cluster::MnodeArgs),
    /// One operation against a running cluster.
    Kv(cluster::KvArgs),
    /// The cluster at a glance: nodes, shares, load, hit ratios, pool use, ring epoch.
    Status(cluster::StatusArgs),
    /// Run a benchmark.
    Bench(bench::BenchArgs),
    /// Print the default configuration file, or check one.
    Config(config::ConfigCmdArgs),
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
        Command::Up(args) => cluster::up(*args),
        Command::Kn(args) => cluster::kn(args),
        Command::Rn(args) => cluster::rn(args),
        Command::Mnode(args) => cluster::mnode(args),
        Command::Kv(args) => cluster::kv(args),
        Command::Status(args) => cluster::status(args),
        Command::Bench(args) => bench::run(args),
        Command::Config(args) => config::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
