//! `dinomo up --system directds|directds-c|centralds|clover` as a process: Redis commands through redis-cli, a
//! restart on the same data directory, and redis-benchmark.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{cli, run};

/// A running baseline, stopped with SIGINT when dropped.
struct Up {
    process: common::Interrupted,
    resp: SocketAddr,
    /// Per memory node, whether this start formatted it (else it was reopened).
    formatted: Vec<bool>,
}

/// The arguments of `dinomo up --system SYSTEM` on `dir` with two memory nodes and small pools, for values up to
/// `max_value` bytes.
fn up_args(system: &str, dir: &Path, max_value: &str) -> Vec<String> {
    [
        "up",
        "--system",
        system,
        "--data-dir",
        dir.to_str().expect("utf-8 path"),
        "--resp-listen",
        "127.0.0.1:0",
        "--memory-nodes",
        "2",
        "--keys",
        "4096",
        "--max-value",
        max_value,
    ]
    .map(String::from)
    .to_vec()
}

/// Starts `dinomo up --system SYSTEM` on `dir` with two memory nodes and small pools.
fn up(system: &str, dir: &Path, extra: &[&str]) -> anyhow::Result<Up> {
    let child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(up_args(system, dir, "256"))
        .args(extra)
        .env("DINOMO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut resp = None;
    let mut formatted = Vec::new();
    let process = common::read_banner(child, |line| {
        if let Some((_, addr)) = line.split_once("Redis protocol on ") {
            resp = Some(addr.parse()?);
        }
        if line.starts_with("memory node") {
            formatted.push(line.ends_with("(formatted)"));
        }
        Ok(line.starts_with("replication"))
    })?;
    anyhow::ensure!(formatted.len() == 2, "two memory nodes: {formatted:?}");
    Ok(Up {
        process,
        resp: resp.ok_or_else(|| anyhow::anyhow!("no Redis address in the banner"))?,
        formatted,
    })
}

#[test]
fn every_baseline_serves_redis_commands_and_keeps_its_data_across_a_restart() -> anyhow::Result<()>
{
    for system in ["directds", "directds-c", "centralds", "clover"] {
        let dir = tempfile::tempdir()?;
        let extra: &[&str] = if system == "directds" || system == "clover" {
            &["--replication", "2"]
        } else {
            &[]
        };
        let a = up(system, dir.path(), extra)?;
        assert_eq!(a.formatted, [true, true]);
        let r = a.resp;
        assert_eq!(cli(r, &["PING"])?, "PONG\n", "{system}");
        assert_eq!(cli(r, &["SET", "greeting", "hello"])?, "OK\n");
        assert_eq!(cli(r, &["GET", "greeting"])?, "hello\n");
        assert_eq!(cli(r, &["INCR", "n"])?, "1\n");
        assert_eq!(cli(r, &["INCRBY", "n", "41"])?, "42\n");
        assert_eq!(
            cli(r, &["INCR", "greeting"])?,
            "ERR value is not an integer or out of range\n\n"
        );
        assert_eq!(cli(r, &["SETNX", "greeting", "other"])?, "0\n");
        assert_eq!(cli(r, &["SETNX", "fresh", "x"])?, "1\n");
        assert_eq!(cli(r, &["APPEND", "greeting", " world"])?, "11\n");
        assert_eq!(cli(r, &["MSET", "a", "1", "b", "2"])?, "OK\n");
        assert_eq!(cli(r, &["DEL", "a", "fresh", "nothere"])?, "2\n");
        assert_eq!(
            cli(r, &["MGET", "greeting", "n", "a", "b"])?,
            "hello world\n42\n\n2\n"
        );
        assert_eq!(cli(r, &["DBSIZE"])?, "3\n");
        assert_eq!(
            sorted_lines(&cli(r, &["KEYS", "*"])?),
            ["b", "greeting", "n"],
            "{system}"
        );
        assert_eq!(
            cli(r, &["--scan", "--pattern", "g*"])?,
            "greeting\n",
            "{system}"
        );
        assert!(
            cli(r, &["SET", "big", &"v".repeat(257)])?
                .contains("longer than the limit of 256 bytes")
        );
        drop(a.process);

        // The same data directory: the memory nodes are reopened (and CentralDS's coordinator or Clover's metadata
        // server rebuilt).
        let b = up(system, dir.path(), extra)?;
        assert_eq!(b.formatted, [false, false]);
        let r = b.resp;
        assert_eq!(
            cli(r, &["MGET", "greeting", "n", "a", "b", "fresh"])?,
            "hello world\n42\n\n2\n\n",
            "{system} after a restart"
        );
        assert_eq!(cli(r, &["DBSIZE"])?, "3\n");
        assert_eq!(cli(r, &["INCR", "n"])?, "43\n");
        // New versions after the restart land in free slots, never over a live one.
        assert_eq!(cli(r, &["SET", "b", "3"])?, "OK\n");
        assert_eq!(cli(r, &["APPEND", "c", "new"])?, "3\n");
        assert_eq!(
            cli(r, &["MGET", "greeting", "n", "b", "c"])?,
            "hello world\n43\n3\nnew\n",
            "{system} after writes that followed the restart"
        );
        assert_eq!(cli(r, &["DBSIZE"])?, "4\n");
        assert_eq!(
            sorted_lines(&cli(r, &["KEYS", "*"])?),
            ["b", "c", "greeting", "n"],
            "{system} after a restart"
        );
        drop(b.process);

        // The checker knows the pool for a baseline's and checks what it can of it.
        let checked = run(
            env!("CARGO_BIN_EXE_dinomo"),
            &[
                "check".to_string(),
                "--pool".to_string(),
                dir.path()
                    .join(format!("{system}-0.pool"))
                    .display()
                    .to_string(),
            ],
            Duration::from_secs(60),
        )?;
        let report = String::from_utf8_lossy(&checked.stdout);
        assert!(checked.status.success(), "{system}: {report}");
        let name = match system {
            "centralds" => "CentralDS",
            "clover" => "Clover",
            _ => "DirectDS",
        };
        assert!(
            report.contains(&format!("{name} layout (a pDPM baseline)")),
            "{system}: {report}"
        );

        // Different geometry on the same directory is refused, not misread.
        let refused = run(
            env!("CARGO_BIN_EXE_dinomo"),
            &up_args(system, dir.path(), "512"),
            Duration::from_secs(60),
        )?;
        assert!(!refused.status.success(), "{system}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("were formatted as"), "{system}: {err}");
    }
    Ok(())
}

#[test]
fn redis_benchmark_completes_without_errors_against_centralds_and_clover() -> anyhow::Result<()> {
    for system in ["centralds", "clover"] {
        redis_benchmark_against(system)?;
    }
    Ok(())
}

fn redis_benchmark_against(system: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let up = up(system, dir.path(), &["--replication", "2"])?;
    let a = up.resp;
    common::redis_benchmark(
        a,
        "set,get,incr",
        2000,
        &["SET", "GET", "INCR"],
        Duration::from_secs(120),
        system,
    )?;
    // Every one of the 2,000 increments of the benchmark's counter was applied once, though its 50 clients
    // raced on the one key.
    assert_eq!(
        cli(a, &["GET", "counter:__rand_int__"])?,
        "2000\n",
        "{system}"
    );
    Ok(())
}

/// redis-cli's lines, sorted (a walk over the keys names them in no particular order).
fn sorted_lines(out: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    lines
}
