//! The cluster at a glance (`dinomo status`): every KV node of the routing table with its share, its load and hit
//! ratio over a short sampling window, and the memory node's pool, all asked over the native protocol from any
//! address that serves routing (a routing node or a KV node).

use std::time::{Duration, Instant};

use dinomo_dpm::ProcessorStats;
use dinomo_ring::NodeId;
use serde::{Deserialize, Serialize};

use crate::ClusterError;
use crate::client::{Expected, call_each, call_once};
use crate::node::NodeStats;
use crate::wire::{RequestBody, ResponseBody, Routing};

/// One KV node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Its id.
    pub id: NodeId,
    /// Its native-protocol address.
    pub addr: String,
    /// Whether it answered both samples.
    pub alive: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Its share of the ring (0..1).
    pub share: f64,
    /// The epoch of the routing table it serves under.
    pub epoch: Option<u64>,
    /// Its worker threads.
    pub threads: Option<usize>,
    /// Data operations per second over the window.
    pub ops_per_s: Option<f64>,
    /// Share of the window's lookups answered from the cache or the unmerged log (no index walk); `None` without
    /// lookups in the window.
    pub hit_ratio: Option<f64>,
    /// The same since the node started.
    pub hit_ratio_since_start: Option<f64>,
    /// Busy share of its workers over the window (0..1).
    pub occupancy: Option<f64>,
}

/// The cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The address asked for the routing table.
    pub seed: String,
    /// The routing table's epoch.
    pub epoch: u64,
    /// How long the load was sampled, in milliseconds.
    pub window_ms: u64,
    /// Every KV node of the ring, by id.
    pub nodes: Vec<NodeStatus>,
    /// The memory node, as a live KV node reported it.
    pub memory: Option<ProcessorStats>,
}

fn hits(s: &NodeStats) -> (u64, u64) {
    s.threads.iter().fold((0, 0), |(h, l), t| {
        (
            // Saturating: the counts come from peers and must not overflow.
            h.saturating_add(t.value_hits)
                .saturating_add(t.shortcut_hits)
                .saturating_add(t.absent_hits)
                .saturating_add(t.log_hits),
            l.saturating_add(t.lookups),
        )
    })
}

fn ops(s: &NodeStats) -> u64 {
    s.threads
        .iter()
        .fold(0u64, |n, t| n.saturating_add(t.ops.total()))
}

fn busy(s: &NodeStats) -> (u64, u64) {
    s.threads.iter().fold((0u64, 0u64), |(b, w), t| {
        (b.saturating_add(t.busy_ns), w.saturating_add(t.wall_ns))
    })
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

fn node_stats(
    targets: &[(NodeId, String)],
    token: &str,
    timeout: Duration,
) -> Vec<Result<NodeStats, String>> {
    call_each(
        targets,
        None,
        &RequestBody::Stats,
        token,
        timeout,
        |_, addr, body| match body {
            ResponseBody::Stats(json) => serde_json::from_str(&json)
                .map_err(|e| format!("{addr}: undecodable statistics: {e}")),
            other => Err(format!("{addr}: answered {other:?}")),
        },
    )
    .into_iter()
    .map(|(_, r)| r)
    .collect()
}

/// Asks `seed` for the routing table, samples every KV node's counters twice, `window` apart, and asks a live
/// node for the memory node's statistics, presenting the cluster `token`. `timeout` bounds each call.
pub fn collect(
    seed: &str,
    token: &str,
    window: Duration,
    timeout: Duration,
) -> Result<ClusterStatus, ClusterError> {
    let routing: Routing = match call_once(
        seed,
        Expected::default(),
        &RequestBody::Routing,
        token,
        timeout,
    ) {
        Ok(ResponseBody::Routing(r)) => r,
        Ok(ResponseBody::Error { message, .. }) => {
            return Err(ClusterError::Io(format!("{seed}: {message}")));
        }
        Ok(other) => return Err(ClusterError::Io(format!("{seed}: answered {other:?}"))),
        Err(e) => return Err(ClusterError::Io(e)),
    };
    let targets: Vec<(NodeId, String)> = routing
        .ring
        .nodes()
        .map(|n| (n, routing.addrs.get(&n).cloned().unwrap_or_default()))
        .collect();
    let first = node_stats(&targets, token, timeout);
    let t0 = Instant::now();
    std::thread::sleep(window);
    let second = node_stats(&targets, token, timeout);
    let elapsed = t0.elapsed().as_secs_f64().max(1e-9);
    let mut nodes = Vec::new();
    for (((id, addr), a), b) in targets.iter().zip(first).zip(second) {
        let share = routing.ring.share(*id);
        let mut status = NodeStatus {
            id: *id,
            addr: addr.clone(),
            alive: false,
            error: None,
            share,
            epoch: None,
            threads: None,
            ops_per_s: None,
            hit_ratio: None,
            hit_ratio_since_start: None,
            occupancy: None,
        };
        match (a, b) {
            (Ok(a), Ok(b)) => {
                let ((h0, l0), (h1, l1)) = (hits(&a), hits(&b));
                let ((b0, w0), (b1, w1)) = (busy(&a), busy(&b));
                status.alive = true;
                status.epoch = Some(b.epoch);
                status.threads = Some(b.threads.len());
                status.ops_per_s = Some(ops(&b).saturating_sub(ops(&a)) as f64 / elapsed);
                status.hit_ratio = ratio(h1.saturating_sub(h0), l1.saturating_sub(l0));
                status.hit_ratio_since_start = ratio(h1, l1);
                status.occupancy = ratio(b1.saturating_sub(b0), w1.saturating_sub(w0));
            }
            (Err(e), _) | (_, Err(e)) => status.error = Some(e),
        }
        nodes.push(status);
    }
    let memory = nodes.iter().filter(|n| n.alive).find_map(|n| {
        match call_once(
            &n.addr,
            Expected {
                node: Some(n.id),
                pool: None,
            },
            &RequestBody::MemoryStats,
            token,
            timeout,
        ) {
            Ok(ResponseBody::Stats(json)) => serde_json::from_str(&json).ok(),
            _ => None,
        }
    });
    Ok(ClusterStatus {
        seed: seed.to_string(),
        epoch: routing.epoch(),
        window_ms: window.as_millis() as u64,
        nodes,
        memory,
    })
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 4] = [
        ("TiB", (1u64 << 40) as f64),
        ("GiB", (1u64 << 30) as f64),
        ("MiB", (1u64 << 20) as f64),
        ("KiB", 1024.0),
    ];
    for (unit, size) in UNITS {
        if n as f64 >= size {
            return format!("{:.1} {unit}", n as f64 / size);
        }
    }
    format!("{n} B")
}

impl ClusterStatus {
    /// A plain aligned table for a terminal.
    pub fn table(&self) -> String {
        let alive = self.nodes.iter().filter(|n| n.alive).count();
        let mut out = format!(
            "cluster at epoch {}: {} KV nodes, {alive} answering (load over {} ms, from {})\n",
            self.epoch,
            self.nodes.len(),
            self.window_ms,
            self.seed
        );
        let header = [
            "node",
            "address",
            "alive",
            "share",
            "ops/s",
            "hit ratio",
            "occupancy",
            "epoch",
        ];
        let rows: Vec<[String; 8]> = self
            .nodes
            .iter()
            .map(|n| {
                [
                    n.id.to_string(),
                    n.addr.clone(),
                    if n.alive { "yes" } else { "no" }.to_string(),
                    format!("{:.1}%", n.share * 100.0),
                    n.ops_per_s.map_or("-".into(), |v| format!("{v:.0}")),
                    percent(n.hit_ratio),
                    percent(n.occupancy),
                    n.epoch.map_or("-".into(), |e| e.to_string()),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                // Text columns to the left, numbers to the right.
                if i == 1 || i == 2 {
                    l.push_str(&format!("{cell:<w$}  "));
                } else {
                    l.push_str(&format!("{cell:>w$}  "));
                }
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(&header.map(String::from)));
        for r in &rows {
            out.push_str(&line(r));
        }
        for n in self.nodes.iter().filter(|n| !n.alive) {
            if let Some(e) = &n.error {
                out.push_str(&format!("node {}: {e}\n", n.id));
            }
        }
        match &self.memory {
            Some(m) => {
                let total = m.pool_used_bytes.saturating_add(m.pool_free_bytes);
                out.push_str(&format!(
                    "memory node: pool {} used of {} ({}), {} keys merged into the index, merge backlog {} segments ({})\n",
                    bytes(m.pool_used_bytes),
                    bytes(total),
                    percent(ratio(m.pool_used_bytes, total)),
                    m.index_entries,
                    m.backlog_segments,
                    bytes(m.backlog_bytes)
                ));
            }
            None => out.push_str("memory node: no KV node reported it\n"),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_aligned_and_says_what_is_missing() {
        let node = |id: NodeId, alive: bool| NodeStatus {
            id,
            addr: format!("127.0.0.1:{}", 7300 + id),
            alive,
            error: (!alive).then(|| "connection refused".to_string()),
            share: 0.5,
            epoch: alive.then_some(3),
            threads: alive.then_some(2),
            ops_per_s: alive.then_some(1234.4),
            hit_ratio: alive.then_some(0.875),
            hit_ratio_since_start: alive.then_some(0.9),
            occupancy: alive.then_some(0.25),
        };
        let s = ClusterStatus {
            seed: "127.0.0.1:7200".into(),
            epoch: 3,
            window_ms: 1000,
            nodes: vec![node(1, true), node(12, false)],
            memory: Some(ProcessorStats {
                pool_used_bytes: 3 << 20,
                pool_free_bytes: 1 << 20,
                ..ProcessorStats::default()
            }),
        };
        let t = s.table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("2 KV nodes, 1 answering"), "{t}");
        assert!(
            lines[2].contains("1234") && lines[2].contains("87.5%"),
            "{t}"
        );
        assert!(
            lines[3].contains(" no ") && lines[3].trim_end().ends_with('-'),
            "{t}"
        );
        // Columns line up: every row has its share at the same place as the header.
        let at = lines[1].find("share").unwrap() + "share".len();
        assert_eq!(&lines[2][at - 1..at], "%", "{t}");
        assert_eq!(&lines[3][at - 1..at], "%", "{t}");
        assert!(t.contains("node 12: connection refused"), "{t}");
        assert!(t.contains("pool 3.0 MiB used of 4.0 MiB (75.0%)"), "{t}");
    }
}
