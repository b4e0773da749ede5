//! Statistics for the M-node's policy (paper §3.5): what a KV node reports per monitoring epoch — its workers'
//! busy time, their key-access statistics, and the latency reports its clients sent — and how the M-node combines
//! the reports of all nodes over a decision period into a [`ClusterSample`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dinomo_kn::{Command, KeyStats, KnError, Reply};
use dinomo_ring::{NodeId, Ring};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::client::call_each;
use crate::latency::{LatencyHistogram, LatencyObservation, LatencySummary};
use crate::node::NodeShared;
use crate::policy::ClusterSample;
use crate::wire::{RequestBody, ResponseBody, Routing};

/// A KV node's statistics of one monitoring epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEpochStats {
    /// The node.
    pub node: NodeId,
    /// The epoch of the routing table it serves under.
    pub routing_epoch: u64,
    /// Its worker threads.
    pub threads: u32,
    /// Nanoseconds its workers spent serving in the epoch, summed over the workers.
    pub busy_ns: u64,
    /// Length of the epoch in nanoseconds, summed over the workers.
    pub wall_ns: u64,
    /// Its workers' key-access statistics, merged (`None` when the node keeps none).
    pub keys: Option<KeyStats>,
    /// The latencies its clients reported in the epoch.
    pub latency: LatencySummary,
}

impl NodeEpochStats {
    /// The busy share of the epoch, averaged over the workers (0..=1).
    pub fn occupancy(&self) -> f64 {
        if self.wall_ns == 0 {
            return 0.0;
        }
        (self.busy_ns as f64 / self.wall_ns as f64).min(1.0)
    }

    /// Checks what came over the network.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(k) = &self.keys {
            k.validate().map_err(|e| e.to_string())?;
        }
        self.latency.validate()
    }
}

/// What a node keeps for the policy between two collections by the M-node.
#[derive(Default)]
pub(crate) struct NodePolicyStats {
    /// Latencies clients reported since the last collection.
    latency: Mutex<LatencyHistogram>,
    /// Every latency clients reported since the node started (its metrics).
    latency_total: Mutex<LatencyHistogram>,
    /// The keys the workers count exactly (the replicated keys of the table last installed).
    tracked: Mutex<Vec<Vec<u8>>>,
}

impl NodeShared {
    /// Keeps a client's latency report until the M-node collects it.
    pub(crate) fn record_latency(&self, report: &LatencySummary) -> Result<(), String> {
        self.policy_stats
            .latency
            .lock()
            .expect("latency lock")
            .merge(report)?;
        self.policy_stats
            .latency_total
            .lock()
            .expect("latency lock")
            .merge(report)
    }

    /// Every latency clients reported since the node started.
    pub(crate) fn reported_latency(&self) -> LatencyHistogram {
        self.policy_stats
            .latency_total
            .lock()
            .expect("latency lock")
            .clone()
    }

    /// The statistics of the monitoring epoch that ends now: every worker's, merged, and the latency reports
    /// kept since the last call.
    pub(crate) fn epoch_stats(&self) -> Result<NodeEpochStats, KnError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.submitter.broadcast(|| Command::EpochStats, 0, &tx)?;
        let threads = self.submitter.threads();
        let (mut busy_ns, mut wall_ns) = (0u64, 0u64);
        let mut keys: Option<KeyStats> = None;
        for _ in 0..threads {
            let epoch = match rx.recv() {
                Ok((_, Ok(Reply::Epoch(e)))) => e,
                Ok((_, Err(e))) => return Err(e),
                _ => return Err(KnError::Stopped),
            };
            busy_ns = busy_ns.saturating_add(epoch.busy_ns);
            wall_ns = wall_ns.saturating_add(epoch.wall_ns);
            match (&mut keys, epoch.keys) {
                (Some(acc), Some(k)) => {
                    acc.merge(&k).map_err(|e| KnError::Config(e.to_string()))?
                }
                (None, k) => keys = k,
                (Some(_), None) => {}
            }
        }
        let latency = {
            let mut l = self.policy_stats.latency.lock().expect("latency lock");
            let s = l.summary();
            l.clear();
            s
        };
        Ok(NodeEpochStats {
            node: self.id,
            routing_epoch: self.routing().epoch(),
            threads: threads as u32,
            busy_ns,
            wall_ns,
            keys,
            latency,
        })
    }

    /// Has the workers count the replicated keys of `routing` exactly (for the coldness check), when they changed.
    pub(crate) fn track_replicated(&self, routing: &Routing) -> Result<(), KnError> {
        let keys: Vec<Vec<u8>> = routing.ring.replicated().map(|(k, _)| k.to_vec()).collect();
        let mut tracked = self.policy_stats.tracked.lock().expect("tracked lock");
        if *tracked == keys {
            return Ok(());
        }
        let shared: Arc<[Vec<u8>]> = keys.clone().into();
        let (tx, rx) = crossbeam_channel::unbounded();
        self.submitter
            .broadcast(|| Command::TrackKeys(shared.clone()), 0, &tx)?;
        for _ in 0..self.submitter.threads() {
            match rx.recv() {
                Ok((_, Ok(_))) => {}
                Ok((_, Err(e))) => return Err(e),
                Err(_) => return Err(KnError::Stopped),
            }
        }
        *tracked = keys;
        Ok(())
    }
}

/// Asks every node of `routing` for its epoch statistics, in parallel, presenting `token`; each answer or why
/// there is none.
pub(crate) fn collect_epoch(
    routing: &Routing,
    token: &str,
    timeout: Duration,
) -> Vec<(NodeId, Result<NodeEpochStats, String>)> {
    let targets: Vec<(NodeId, String)> = routing
        .ring
        .nodes()
        .filter_map(|n| routing.addrs.get(&n).map(|a| (n, a.clone())))
        .collect();
    call_each(
        &targets,
        None,
        &RequestBody::EpochStats,
        token,
        timeout,
        |n, addr, r| match r {
            ResponseBody::EpochStats(st) if st.node == n => {
                st.validate()?;
                Ok(*st)
            }
            ResponseBody::EpochStats(st) => Err(format!(
                "{addr} answered as node {} instead of {n}",
                st.node
            )),
            other => Err(format!("{addr}: unexpected reply {other:?}")),
        },
    )
}

/// The nodes' epoch statistics gathered over one decision period.
#[derive(Debug, Default)]
pub struct SampleWindow {
    /// (busy, wall) nanoseconds per node.
    load: BTreeMap<NodeId, (u64, u64)>,
    keys: Option<KeyStats>,
    /// Whether a node reported no key statistics (then the window has none to judge keys by).
    keys_missing: bool,
    latency: LatencyHistogram,
    epochs: u32,
}

impl SampleWindow {
    /// An empty window.
    pub fn new() -> SampleWindow {
        SampleWindow::default()
    }

    /// Adds one node's epoch statistics (checked first).
    pub fn add(&mut self, st: &NodeEpochStats) -> Result<(), String> {
        st.validate()?;
        match (&mut self.keys, &st.keys) {
            (_, None) => self.keys_missing = true,
            (None, Some(k)) => self.keys = Some(k.clone()),
            (Some(acc), Some(k)) => {
                if let Err(e) = acc.merge(k) {
                    warn!(node = st.node, error = %e, "key statistics left out");
                    self.keys_missing = true;
                }
            }
        }
        self.latency.merge(&st.latency)?;
        let (busy, wall) = self.load.entry(st.node).or_default();
        *busy = busy.saturating_add(st.busy_ns);
        *wall = wall.saturating_add(st.wall_ns);
        Ok(())
    }

    /// Marks the end of one monitoring epoch.
    pub fn end_epoch(&mut self) {
        self.epochs += 1;
    }

    /// Monitoring epochs in the window.
    pub fn epochs(&self) -> u32 {
        self.epochs
    }

    /// What the policy engine judges: the occupancy of every member of `ring` that reported (members that did
    /// not are listed as unsampled), the clients' latency, the key-access frequency and the replication factors.
    pub fn sample(&self, ring: &Ring) -> ClusterSample {
        let mut occupancy = BTreeMap::new();
        let mut unsampled = Vec::new();
        for n in ring.nodes() {
            match self.load.get(&n) {
                Some(&(busy, wall)) if wall > 0 => {
                    occupancy.insert(n, (busy as f64 / wall as f64).min(1.0));
                }
                _ => unsampled.push(n),
            }
        }
        ClusterSample {
            occupancy,
            unsampled,
            latency: LatencyObservation::from(&self.latency),
            keys: if self.keys_missing {
                None
            } else {
                self.keys.as_ref().map(KeyStats::frequency)
            },
            replication: ring.replicated().map(|(k, r)| (k.to_vec(), r)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_kn::{KeySketch, KeyStatsConfig};

    fn node_stats(
        node: NodeId,
        busy: u64,
        wall: u64,
        keys: &[&[u8]],
        lat: &[u64],
    ) -> NodeEpochStats {
        let mut sketch = KeySketch::new(&KeyStatsConfig::default());
        for k in keys {
            sketch.record(k);
        }
        let mut h = LatencyHistogram::new();
        for &l in lat {
            h.record(l);
        }
        NodeEpochStats {
            node,
            routing_epoch: 1,
            threads: 1,
            busy_ns: busy,
            wall_ns: wall,
            keys: Some(sketch.take()),
            latency: h.summary(),
        }
    }

    #[test]
    fn a_window_combines_epochs_and_nodes() {
        let ring = Ring::with_nodes(16, [1, 2, 3]);
        let mut w = SampleWindow::new();
        w.add(&node_stats(1, 10, 100, &[b"a", b"a", b"b"], &[1000, 3000]))
            .unwrap();
        w.add(&node_stats(2, 50, 100, &[b"c"], &[2000])).unwrap();
        w.end_epoch();
        w.add(&node_stats(1, 30, 100, &[b"a", b"a"], &[])).unwrap();
        w.end_epoch();
        let s = w.sample(&ring);
        assert_eq!(w.epochs(), 2);
        assert_eq!(s.occupancy.len(), 2);
        assert!((s.occupancy[&1] - 0.2).abs() < 1e-9, "busy 40 of 200");
        assert!((s.occupancy[&2] - 0.5).abs() < 1e-9);
        assert_eq!(s.unsampled, vec![3]);
        assert_eq!(s.latency.requests, 3);
        assert!((s.latency.avg_ns - 2000.0).abs() < 1e-9);
        let keys = s.keys.expect("every node reported keys");
        assert_eq!(keys.accesses, 6);
        assert_eq!(keys.heavy_hitters[0].key, b"a");
        assert_eq!(keys.heavy_hitters[0].count, 4);
        // "b" and "c" were seen once each: unlisted, within the error.
        assert_eq!(keys.heavy_hitters.len(), 1);
        assert!(keys.heavy_hitter_error >= 1);
        // A node without key statistics leaves the window without any to judge by.
        let mut st = node_stats(3, 1, 100, &[], &[]);
        st.keys = None;
        w.add(&st).unwrap();
        assert!(w.sample(&ring).keys.is_none());
    }

    #[test]
    fn malformed_node_statistics_are_refused() {
        let mut st = node_stats(1, 1, 2, &[b"k"], &[5]);
        st.latency.count = 7;
        let mut w = SampleWindow::new();
        assert!(w.add(&st).is_err());
        let mut st = node_stats(1, 1, 2, &[b"k"], &[5]);
        st.keys.as_mut().unwrap().registers.clear();
        assert!(w.add(&st).is_err());
        assert!(w.sample(&Ring::with_nodes(16, [1])).occupancy.is_empty());
    }
}
