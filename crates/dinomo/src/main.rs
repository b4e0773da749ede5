//! The `dinomo` command: memory node, benchmarks, and (as the project grows) KV nodes and whole clusters.

mod bench;
mod check;
mod cluster;
mod config;
mod dpm;
mod pdpm;
mod size;

use clap::{Parser, Subcommand};

/// The hot paths allocate on one thread and free on another (a request's key on an event loop and a reply's value
/// on a worker), which the system allocator serves through its arenas' locks; mimalloc frees such blocks without
/// them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its option enum's 16th entry, in v2 and v3 alike).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long the allocator keeps freed memory before giving it back to the OS. mimalloc's 10 ms gives back the
/// pages of a KV node's cache churn under writes (an evicted value freed, a new one allocated) between two
/// requests, and then faults them in and zeroes them again: under a SET load on a full cache, some 40% of the
/// server's page faults. A second keeps the memory a steady load reuses and still returns a burst's soon after.
/// `MIMALLOC_PURGE_DELAY` in the environment overrides it.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = 1000;

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
    /// Check a pool file for damage without changing it (exit status 1 when damaged, 2 when it cannot be read).
    Check(check::CheckArgs),
}

fn main() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option word the allocator reads when it schedules a purge; before any thread starts.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) };
    }
    let cli = Cli::parse();
    // The checker's report is its output: what the layers it opens log on the way is noise unless asked for.
    let default_level = match cli.command {
        Command::Check(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DINOMO_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: logs sent to a file or a collector stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
        Command::Check(args) => check::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// An error and its causes, outermost first, joined by ": ". Many errors already end with their cause's message
/// ("KV node: {0}"); such a cause is not repeated.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use std::fmt;

    /// An error whose message names its cause's (`with_cause`) or not.
    #[derive(Debug)]
    struct Outer {
        with_cause: bool,
        inner: Inner,
    }

    #[derive(Debug)]
    struct Inner;

    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("invalid setting: too big")
        }
    }

    impl std::error::Error for Inner {}

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.with_cause {
                write!(f, "KV node: {}", self.inner)
            } else {
                f.write_str("bare")
            }
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.inner)
        }
    }

    #[test]
    fn a_cause_already_in_its_parents_message_is_printed_once() {
        let e = anyhow::Error::new(Outer {
            with_cause: true,
            inner: Inner,
        })
        .context("starting the cluster");
        assert_eq!(
            error_chain(&e),
            "starting the cluster: KV node: invalid setting: too big"
        );
        let e = anyhow::Error::new(Outer {
            with_cause: false,
            inner: Inner,
        })
        .context("starting the cluster");
        assert_eq!(
            error_chain(&e),
            "starting the cluster: bare: invalid setting: too big"
        );
    }
}
