//! `dinomo up` started from a configuration file with its metrics endpoint on, then `dinomo status` and a scrape
//! of `/metrics` against it while a client writes and reads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use dinomo_cluster::{Client, ClientConfig};

mod common;

/// A running `dinomo up`, stopped with SIGINT when dropped.
struct Up {
    _process: common::Interrupted,
    rn: SocketAddr,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

/// `dinomo up` with three KV nodes, as its configuration file says; long leases, since nothing here kills a node.
fn up() -> anyhow::Result<Up> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("dinomo.toml");
    std::fs::write(
        &config,
        r#"
[pool]
size = 268435456
[up]
kns = 3
resp = false
[kn]
lease_ttl = "10s"
heartbeat = "100ms"
[rn]
listen = "127.0.0.1:0"
"#,
    )?;
    let child = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(["up", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("DINOMO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let (mut rn, mut metrics, mut kns) = (None, None, 0);
    let process = common::read_banner(child, |l| {
        if let Some(a) = l.strip_prefix("dinomo up: routing node on ") {
            rn = Some(a.parse()?);
        }
        if l.starts_with("KV node ") {
            kns += 1;
        }
        if let Some(a) = l.strip_prefix("metrics on http://") {
            metrics = Some(a.trim_end_matches("/metrics").parse()?);
        }
        Ok(metrics.is_some())
    })?;
    ensure!(
        kns == 3,
        "the file asked for 3 KV nodes, the banner shows {kns}"
    );
    Ok(Up {
        _process: process,
        rn: rn.context("no routing node in the banner")?,
        metrics: metrics.context("no metrics address")?,
        _dir: dir,
    })
}

fn status(seed: SocketAddr, extra: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(["status", "--seed", &seed.to_string(), "--window-ms", "300"])
        .args(extra)
        .env("DINOMO_LOG", "warn")
        .output()?)
}

/// The sum of every sample of `name` in a text exposition.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn status_and_metrics_of_a_running_cluster() -> anyhow::Result<()> {
    let up = up()?;
    let mut client = Client::connect(ClientConfig {
        seeds: vec![up.rn.to_string()],
        ..ClientConfig::default()
    })?;
    for i in 0..300 {
        client.set(format!("key{i}").as_bytes(), b"value")?;
    }
    // A reader keeps the nodes busy while status samples them; bounded in count and time.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads, seed) = (stop.clone(), reads.clone(), up.rn.to_string());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut c = Client::connect(ClientConfig {
                seeds: vec![seed],
                ..ClientConfig::default()
            })?;
            let deadline = Instant::now() + Duration::from_secs(20);
            for i in 0..200_000u64 {
                if stop.load(Ordering::Acquire) || Instant::now() > deadline {
                    break;
                }
                ensure!(c.get(format!("key{}", i % 300).as_bytes())?.is_some());
                reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };

    let out = status(up.rn, &["--json"])?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let nodes = s["nodes"].as_array().context("nodes")?;
    ensure!(nodes.len() == 3, "{s}");
    let epoch = s["epoch"].as_u64().context("epoch")?;
    ensure!(epoch >= 1);
    let shares: f64 = nodes.iter().filter_map(|n| n["share"].as_f64()).sum();
    ensure!((shares - 1.0).abs() < 1e-6, "shares add up to {shares}");
    let load: f64 = nodes.iter().filter_map(|n| n["ops_per_s"].as_f64()).sum();
    for n in nodes {
        ensure!(
            n["alive"] == true && n["epoch"].as_u64() == Some(epoch),
            "{n}"
        );
    }
    ensure!(load > 0.0, "no load seen while a client read: {s}");
    ensure!(s["memory"]["pool_used_bytes"].as_u64() > Some(0), "{s}");

    // The table: a title, a header and one row per node, then the memory node.
    let out = status(up.rn, &[])?;
    ensure!(out.status.success());
    let table = String::from_utf8(out.stdout)?;
    let lines: Vec<&str> = table.lines().collect();
    ensure!(lines.len() == 6, "{table}");
    ensure!(
        lines[1].starts_with("node") && lines[1].contains("ops/s"),
        "{table}"
    );
    ensure!(lines[2..5].iter().all(|l| l.contains(" yes ")), "{table}");
    ensure!(lines[5].starts_with("memory node: pool"), "{table}");

    stop.store(true, Ordering::Release);
    reader.join().expect("reader thread")?;
    let issued = 300 + reads.load(Ordering::Relaxed);

    // The same process's metrics endpoint counted every operation.
    let mut conn = TcpStream::connect(up.metrics)?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    ensure!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    let ops = metric_sum(&text, "dinomo_kn_ops_total");
    ensure!(
        ops >= issued as f64,
        "{ops} operations counted, {issued} issued"
    );
    ensure!(metric_sum(&text, "dinomo_ring_nodes") == 3.0);
    ensure!(metric_sum(&text, "dinomo_pool_used_bytes") > 0.0);

    // A seed where nothing listens is an error, not a table.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let out = status(dead, &["--timeout-ms", "500"])?;
    ensure!(!out.status.success());
    ensure!(String::from_utf8_lossy(&out.stderr).contains("asking"));
    Ok(())
}
