//! Setup shared by the `bench ycsb` tests that run a few hundred operations against a target, and by the figure
//! tests that read back what a recipe wrote.

// Every test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::path::Path;

use std::time::Duration;

use dinomo_bench::figures::FigureReport;
use dinomo_bench::ycsb::{Distribution, Workload};
use dinomo_bench::ycsb_run::{TargetOptions, YcsbOptions, YcsbReport};
use dinomo_cluster::{LocalClusterConfig, NodeConfig};

/// Two KV nodes on a 256 MiB pool with long leases: a heartbeat late on a busy machine must not fail a node in the
/// middle of the run.
pub fn patient_cluster() -> LocalClusterConfig {
    LocalClusterConfig {
        pool_size: 256 << 20,
        kns: 2,
        node: NodeConfig {
            lease_ttl: Duration::from_secs(2),
            heartbeat: Duration::from_millis(200),
            ..NodeConfig::default()
        },
        ..LocalClusterConfig::default()
    }
}

/// A tiny run against `target`: 500 records of 64 B, two clients with four operations in flight each, 100
/// warm-up and 400 measured operations.
pub fn tiny_run(
    target: TargetOptions,
    workload: Workload,
    distribution: Distribution,
    seed: u64,
) -> YcsbOptions {
    YcsbOptions {
        target,
        workload,
        distribution,
        records: 500,
        value_bytes: 64,
        clients: 2,
        outstanding: 4,
        // Operation counts, with generous time bounds that a healthy run never reaches.
        warmup_ops: Some(100),
        warmup_secs: 20.0,
        ops: Some(400),
        secs: 20.0,
        seed,
        ..YcsbOptions::default()
    }
}

/// A JSON file a recipe wrote.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// The YCSB reports (`ycsb-*` files) `report` lists, read from the figure's folder `dir`.
pub fn ycsb_runs(report: &FigureReport, dir: &Path) -> anyhow::Result<Vec<YcsbReport>> {
    report
        .files
        .iter()
        .filter(|f| f.starts_with("ycsb-"))
        .map(|f| read_json(&dir.join(f)))
        .collect()
}
