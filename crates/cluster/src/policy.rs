//! The M-node's policy engine (paper §3.5, Table 4): from the clients' latency, the KV nodes' occupancy and the
//! keys' access frequency over a decision period, decide whether to add or remove a KV node or change keys'
//! replication factors.
//!
//! | SLO       | KN occupancy                 | key access frequency      | action                          |
//! |-----------|------------------------------|---------------------------|---------------------------------|
//! | satisfied | some node under-utilized     | –                         | remove the least occupied node  |
//! | violated  | every node over-utilized     | –                         | add a node                      |
//! | violated  | not every node over-utilized | hot (above mean + 3σ)     | raise the key's replication     |
//! | satisfied | no node removed              | cold (below mean − 1σ)    | replication of the key back to 1|
//!
//! At most one node is added or removed per decision, and none within the grace period after the previous
//! membership change (the M-node's own joins, removals and failure handling count too). As in the original
//! system, an SLO violation that calls for a node which cannot be added (grace period, `max_nodes`) falls back to
//! replicating hot keys. The engine is pure: [`PolicyEngine::decide`] looks only at the [`ClusterSample`] and the
//! time it is given.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dinomo_kn::KeyFrequency;
use dinomo_ring::NodeId;
use serde::Serialize;
use tracing::{debug, info};

use crate::latency::LatencyObservation;

/// Settings of the policy; the defaults are the paper's (§5 "Policy variables").
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Average-latency SLO (default 1.2 ms).
    #[serde(with = "humantime_serde")]
    pub avg_latency_slo: Duration,
    /// Tail (99th-percentile) latency SLO (default 16 ms).
    #[serde(with = "humantime_serde")]
    pub tail_latency_slo: Duration,
    /// Over-utilization lower bound: a node whose occupancy is above it is over-utilized (default 0.20).
    pub over_utilization_lower_bound: f64,
    /// Under-utilization upper bound: a node whose occupancy is below it is under-utilized (default 0.10).
    pub under_utilization_upper_bound: f64,
    /// Key-hotness lower bound, in standard deviations above the mean access frequency (default 3).
    pub hotness_sigmas: f64,
    /// Key-coldness upper bound, in standard deviations below the mean access frequency (default 1; the bound
    /// is never below 0, so a replicated key nobody accessed is always cold).
    pub coldness_sigmas: f64,
    /// How often the engine decides (default 10 s).
    #[serde(with = "humantime_serde")]
    pub decision_period: Duration,
    /// No node is added or removed this long after the previous membership change (default 90 s).
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// Fewest KV nodes the policy leaves (default 1).
    pub min_nodes: usize,
    /// Most KV nodes the policy adds up to (default 16).
    pub max_nodes: usize,
    /// Highest replication factor the policy gives a key (default 8; never more than the node count).
    pub max_replication: u32,
    /// Most replication changes in one decision (default 32).
    pub max_replication_changes: usize,
    /// Whether the policy adds and removes nodes (default true).
    pub autoscaling: bool,
    /// Whether the policy replicates hot keys and de-replicates cold ones (default true).
    pub selective_replication: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            avg_latency_slo: Duration::from_micros(1200),
            tail_latency_slo: Duration::from_millis(16),
            over_utilization_lower_bound: 0.20,
            under_utilization_upper_bound: 0.10,
            hotness_sigmas: 3.0,
            coldness_sigmas: 1.0,
            decision_period: Duration::from_secs(10),
            grace_period: Duration::from_secs(90),
            min_nodes: 1,
            max_nodes: 16,
            max_replication: 8,
            max_replication_changes: 32,
            autoscaling: true,
            selective_replication: true,
        }
    }
}

impl PolicyConfig {
    /// Checks the settings fit together.
    pub fn validate(&self) -> Result<(), String> {
        let (under, over) = (
            self.under_utilization_upper_bound,
            self.over_utilization_lower_bound,
        );
        if !(0.0..=1.0).contains(&under) || !(0.0..=1.0).contains(&over) {
            return Err("utilization bounds are occupancies between 0 and 1".into());
        }
        if under > over {
            return Err(format!(
                "the under-utilization upper bound {under} exceeds the over-utilization lower bound {over}"
            ));
        }
        if self.avg_latency_slo.is_zero() || self.tail_latency_slo.is_zero() {
            return Err("latency SLOs must be above zero".into());
        }
        if !(self.hotness_sigmas.is_finite() && self.coldness_sigmas.is_finite()) {
            return Err("hotness and coldness bounds must be finite".into());
        }
        if self.decision_period.is_zero() {
            return Err("the decision period must be above zero".into());
        }
        if self.min_nodes == 0 || self.max_nodes < self.min_nodes {
            return Err(format!(
                "need 1 <= min_nodes <= max_nodes, got {} and {}",
                self.min_nodes, self.max_nodes
            ));
        }
        if !(1..=dinomo_ring::MAX_REPLICATION).contains(&self.max_replication) {
            return Err(format!(
                "max_replication must be in 1..={}",
                dinomo_ring::MAX_REPLICATION
            ));
        }
        Ok(())
    }
}

/// What the engine judges: one decision period of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterSample {
    /// Occupancy (busy share, 0..=1) of every ring member that reported.
    pub occupancy: BTreeMap<NodeId, f64>,
    /// Ring members that did not report; membership is not changed on an incomplete sample.
    pub unsampled: Vec<NodeId>,
    /// The clients' latency.
    pub latency: LatencyObservation,
    /// The keys' access frequency (`None`: the nodes keep no key statistics; replication is left alone).
    pub keys: Option<KeyFrequency>,
    /// Keys whose replication factor is above 1, with their factors.
    pub replication: BTreeMap<Vec<u8>, u32>,
}

impl ClusterSample {
    /// Nodes in the ring.
    pub fn nodes(&self) -> usize {
        self.occupancy.len() + self.unsampled.len()
    }
}

/// A reconfiguration the engine asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Action {
    /// Start one more KV node.
    AddNode,
    /// Remove this node from the ring (then stop it).
    RemoveNode(NodeId),
    /// Change a key's replication factor.
    SetReplication {
        /// The key.
        key: Vec<u8>,
        /// Its factor now.
        from: u32,
        /// The factor asked for (1 = not replicated).
        to: u32,
    },
}

impl Action {
    /// Whether the action adds or removes a node.
    pub fn is_membership(&self) -> bool {
        matches!(self, Action::AddNode | Action::RemoveNode(_))
    }
}

/// What the engine saw when it decided.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Observation {
    /// Requests measured.
    pub requests: u64,
    /// Their mean latency (ns).
    pub avg_latency_ns: f64,
    /// Their 99th-percentile latency (ns).
    pub p99_latency_ns: u64,
    /// Whether a latency SLO was violated.
    pub slo_violated: bool,
    /// Ring members.
    pub nodes: usize,
    /// Ring members that did not report.
    pub unsampled: Vec<NodeId>,
    /// Lowest and highest occupancy reported.
    pub min_occupancy: f64,
    /// Highest occupancy reported.
    pub max_occupancy: f64,
    /// Key accesses counted.
    pub key_accesses: u64,
    /// Mean accesses per distinct key.
    pub mean_frequency: f64,
    /// Their standard deviation.
    pub frequency_stddev: f64,
}

/// One decision: what was observed, what was decided, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The observation.
    pub observed: Observation,
    /// The actions, membership first.
    pub actions: Vec<Action>,
    /// Why, in words (one line per consideration).
    pub reasons: Vec<String>,
}

/// The policy engine: Table 4 with the grace period and the one-change rule.
#[derive(Debug, Clone)]
pub struct PolicyEngine {
    cfg: PolicyConfig,
    last_membership_change: Option<Instant>,
}

impl PolicyEngine {
    /// An engine with `cfg` (checked).
    pub fn new(cfg: PolicyConfig) -> Result<PolicyEngine, String> {
        cfg.validate()?;
        Ok(PolicyEngine {
            cfg,
            last_membership_change: None,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// A membership change happened at `at` (one the engine did not decide: a failure, a join by hand); the
    /// grace period counts from the latest one.
    pub fn note_membership_change(&mut self, at: Instant) {
        if self.last_membership_change.is_none_or(|t| at > t) {
            self.last_membership_change = Some(at);
        }
    }

    /// Whether `now` is within the grace period after the latest membership change.
    pub fn in_grace_period(&self, now: Instant) -> bool {
        self.last_membership_change
            .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.grace_period)
    }

    /// Decides on one decision period's sample. A membership action it returns starts a grace period at `now`.
    pub fn decide(&mut self, sample: &ClusterSample, now: Instant) -> Decision {
        let cfg = &self.cfg;
        let lat = sample.latency;
        let avg_violated = lat.requests > 0 && lat.avg_ns > cfg.avg_latency_slo.as_nanos() as f64;
        let tail_violated =
            lat.requests > 0 && u128::from(lat.p99_ns) > cfg.tail_latency_slo.as_nanos();
        let violated = avg_violated || tail_violated;
        let min_occ = sample
            .occupancy
            .values()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let max_occ = sample.occupancy.values().copied().fold(0.0, f64::max);
        let freq = sample.keys.as_ref();
        let observed = Observation {
            requests: lat.requests,
            avg_latency_ns: lat.avg_ns,
            p99_latency_ns: lat.p99_ns,
            slo_violated: violated,
            nodes: sample.nodes(),
            unsampled: sample.unsampled.clone(),
            min_occupancy: if min_occ.is_finite() { min_occ } else { 0.0 },
            max_occupancy: max_occ,
            key_accesses: freq.map_or(0, |f| f.accesses),
            mean_frequency: freq.map_or(0.0, KeyFrequency::mean),
            frequency_stddev: freq.map_or(0.0, KeyFrequency::stddev),
        };
        let mut reasons = Vec::new();
        let mut actions = Vec::new();
        let complete = sample.unsampled.is_empty() && !sample.occupancy.is_empty();
        let membership_blocked = if !cfg.autoscaling {
            Some("autoscaling is off".to_string())
        } else if !complete {
            Some(format!(
                "no occupancy from nodes {:?}: membership is left alone",
                sample.unsampled
            ))
        } else if self.in_grace_period(now) {
            Some("within the grace period after the last membership change".to_string())
        } else {
            None
        };
        let nodes = sample.nodes();
        if violated {
            reasons.push(format!(
                "SLO violated: average {:.0} ns (SLO {} ns), p99 {} ns (SLO {} ns) over {} requests",
                lat.avg_ns,
                cfg.avg_latency_slo.as_nanos(),
                lat.p99_ns,
                cfg.tail_latency_slo.as_nanos(),
                lat.requests
            ));
            let all_over = complete && min_occ > cfg.over_utilization_lower_bound;
            let add_blocked = if !all_over {
                Some(format!(
                    "not every node is over-utilized (lowest occupancy {:.3}, bound {})",
                    observed.min_occupancy, cfg.over_utilization_lower_bound
                ))
            } else if let Some(why) = &membership_blocked {
                Some(why.clone())
            } else if nodes >= cfg.max_nodes {
                Some(format!("already at max_nodes {}", cfg.max_nodes))
            } else {
                None
            };
            match add_blocked {
                None => {
                    reasons.push(format!(
                        "every node is over-utilized (lowest occupancy {min_occ:.3} > {}): add a node",
                        cfg.over_utilization_lower_bound
                    ));
                    actions.push(Action::AddNode);
                }
                Some(why) => {
                    reasons.push(format!("no node added: {why}"));
                    self.replicate_hot(sample, nodes, &mut actions, &mut reasons);
                }
            }
        } else {
            reasons.push(format!(
                "SLO met: average {:.0} ns, p99 {} ns over {} requests",
                lat.avg_ns, lat.p99_ns, lat.requests
            ));
            let least = sample
                .occupancy
                .iter()
                .filter(|(_, o)| **o < cfg.under_utilization_upper_bound)
                .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
                .map(|(n, o)| (*n, *o));
            let remove_blocked = match (least, &membership_blocked) {
                (None, _) => Some(format!(
                    "no node is under-utilized (lowest occupancy {:.3}, bound {})",
                    observed.min_occupancy, cfg.under_utilization_upper_bound
                )),
                (Some(_), Some(why)) => Some(why.clone()),
                (Some(_), None) if nodes <= cfg.min_nodes => {
                    Some(format!("already at min_nodes {}", cfg.min_nodes))
                }
                _ => None,
            };
            match (remove_blocked, least) {
                (None, Some((node, occ))) => {
                    reasons.push(format!(
                        "node {node} is under-utilized (occupancy {occ:.3} < {}): remove it",
                        cfg.under_utilization_upper_bound
                    ));
                    actions.push(Action::RemoveNode(node));
                }
                (why, _) => {
                    reasons.push(format!("no node removed: {}", why.unwrap_or_default()));
                    self.dereplicate_cold(sample, &mut actions, &mut reasons);
                }
            }
        }
        if actions.iter().any(Action::is_membership) {
            self.last_membership_change = Some(now);
        }
        let decision = Decision {
            observed,
            actions,
            reasons,
        };
        if decision.actions.is_empty() {
            debug!(reasons = ?decision.reasons, "policy: no action");
        } else {
            info!(actions = ?decision.actions, reasons = ?decision.reasons, "policy decision");
        }
        decision
    }

    /// The key statistics that replication changes are decided on; `None`, with the reason, when selective
    /// replication is off or the sample has none.
    fn replication_statistics<'a>(
        &self,
        sample: &'a ClusterSample,
        reasons: &mut Vec<String>,
    ) -> Option<&'a KeyFrequency> {
        if !self.cfg.selective_replication {
            reasons.push("selective replication is off".into());
            return None;
        }
        if sample.keys.is_none() {
            reasons.push("no key statistics: replication left alone".into());
        }
        sample.keys.as_ref()
    }

    /// Raises the replication of keys accessed more than mean + hotness_sigmas·σ, by the ratio of the observed
    /// latency to its SLO (at least by one), up to the node count and `max_replication`.
    fn replicate_hot(
        &self,
        sample: &ClusterSample,
        nodes: usize,
        actions: &mut Vec<Action>,
        reasons: &mut Vec<String>,
    ) {
        let cfg = &self.cfg;
        let Some(freq) = self.replication_statistics(sample, reasons) else {
            return;
        };
        let bound = freq.mean() + cfg.hotness_sigmas * freq.stddev();
        let cap = cfg.max_replication.min(nodes as u32).max(1);
        let lat = sample.latency;
        let ratio = (lat.avg_ns / cfg.avg_latency_slo.as_nanos() as f64)
            .max(lat.p99_ns as f64 / cfg.tail_latency_slo.as_nanos() as f64);
        let mut hot = 0;
        // Listed counts are lower bounds: a key listed above the bound is hot for certain.
        for h in freq.heavy_hitters.iter().filter(|h| h.count as f64 > bound) {
            hot += 1;
            let from = sample.replication.get(&h.key).copied().unwrap_or(1);
            let scaled = (f64::from(from) * ratio).ceil().min(f64::from(u32::MAX)) as u32;
            let to = scaled.max(from + 1).min(cap);
            if to > from && actions.len() < cfg.max_replication_changes {
                actions.push(Action::SetReplication {
                    key: h.key.clone(),
                    from,
                    to,
                });
            }
        }
        reasons.push(format!(
            "{hot} hot keys (accessed more than {bound:.1} times = mean {:.2} + {}σ, σ {:.2}); replication up to {cap}",
            freq.mean(),
            cfg.hotness_sigmas,
            freq.stddev()
        ));
    }

    /// Returns replicated keys accessed at most max(mean − coldness_sigmas·σ, 0) times to a factor of 1.
    fn dereplicate_cold(
        &self,
        sample: &ClusterSample,
        actions: &mut Vec<Action>,
        reasons: &mut Vec<String>,
    ) {
        let cfg = &self.cfg;
        if sample.replication.is_empty() {
            return;
        }
        let Some(freq) = self.replication_statistics(sample, reasons) else {
            return;
        };
        let bound = (freq.mean() - cfg.coldness_sigmas * freq.stddev()).max(0.0);
        let mut cold = 0;
        for (key, &from) in sample.replication.iter().filter(|(_, r)| **r > 1) {
            // The most the key may have been accessed: cold only if even that is under the bound.
            if freq.upper_bound(key) as f64 <= bound {
                cold += 1;
                if actions.len() < cfg.max_replication_changes {
                    actions.push(Action::SetReplication {
                        key: key.clone(),
                        from,
                        to: 1,
                    });
                }
            }
        }
        reasons.push(format!(
            "{cold} of {} replicated keys cold (accessed at most {bound:.1} times)",
            sample.replication.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dinomo_kn::KeyCount;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn engine(cfg: PolicyConfig) -> PolicyEngine {
        PolicyEngine::new(cfg).unwrap()
    }

    fn latency(avg_ms: f64, p99_ms: f64) -> LatencyObservation {
        LatencyObservation {
            requests: 10_000,
            avg_ns: avg_ms * MS as f64,
            p99_ns: (p99_ms * MS as f64) as u64,
        }
    }

    /// Uniform accesses to 1000 keys, 100 each, plus the given hot keys.
    fn keys(hot: &[(&[u8], u64)], tracked: &[(&[u8], u64)]) -> KeyFrequency {
        let mut heavy: Vec<KeyCount> = hot
            .iter()
            .map(|(k, c)| KeyCount {
                key: k.to_vec(),
                count: *c,
            })
            .collect();
        heavy.push(KeyCount {
            key: b"ordinary".to_vec(),
            count: 100,
        });
        let accesses = 1000 * 100 + hot.iter().map(|h| h.1).sum::<u64>();
        let f2 = 1000.0 * 100.0 * 100.0 + hot.iter().map(|h| (h.1 * h.1) as f64).sum::<f64>();
        KeyFrequency {
            accesses,
            distinct: 1000.0 + hot.len() as f64,
            f2,
            heavy_hitters: heavy,
            heavy_hitter_error: 0,
            tracked: tracked
                .iter()
                .map(|(k, c)| KeyCount {
                    key: k.to_vec(),
                    count: *c,
                })
                .collect(),
        }
    }

    fn sample(occ: &[(NodeId, f64)], lat: LatencyObservation) -> ClusterSample {
        ClusterSample {
            occupancy: occ.iter().copied().collect(),
            unsampled: vec![],
            latency: lat,
            keys: Some(keys(&[], &[])),
            replication: BTreeMap::new(),
        }
    }

    #[test]
    fn defaults_are_the_papers() {
        let c = PolicyConfig::default();
        assert_eq!(c.avg_latency_slo, Duration::from_micros(1200));
        assert_eq!(c.tail_latency_slo, Duration::from_millis(16));
        assert_eq!(c.over_utilization_lower_bound, 0.20);
        assert_eq!(c.under_utilization_upper_bound, 0.10);
        assert_eq!((c.hotness_sigmas, c.coldness_sigmas), (3.0, 1.0));
        assert_eq!(c.decision_period, Duration::from_secs(10));
        assert_eq!(c.grace_period, Duration::from_secs(90));
        c.validate().unwrap();
        assert!(
            PolicyConfig {
                under_utilization_upper_bound: 0.5,
                ..c.clone()
            }
            .validate()
            .is_err()
        );
        assert!(
            PolicyConfig {
                min_nodes: 3,
                max_nodes: 2,
                ..c
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn slo_met_and_a_node_under_utilized_removes_the_least_occupied() {
        let mut e = engine(PolicyConfig::default());
        let d = e.decide(
            &sample(&[(1, 0.5), (2, 0.05), (3, 0.02)], latency(0.5, 5.0)),
            Instant::now(),
        );
        assert_eq!(d.actions, vec![Action::RemoveNode(3)], "{:?}", d.reasons);
        assert!(!d.observed.slo_violated);
    }

    #[test]
    fn slo_violated_and_every_node_over_utilized_adds_a_node() {
        let mut e = engine(PolicyConfig::default());
        // The tail SLO alone is violated.
        let d = e.decide(
            &sample(&[(1, 0.35), (2, 0.9)], latency(1.0, 20.0)),
            Instant::now(),
        );
        assert_eq!(d.actions, vec![Action::AddNode], "{:?}", d.reasons);
        // The average SLO alone is violated.
        let mut e = engine(PolicyConfig::default());
        let d = e.decide(&sample(&[(1, 0.35)], latency(2.0, 3.0)), Instant::now());
        assert_eq!(d.actions, vec![Action::AddNode]);
    }

    #[test]
    fn slo_violated_with_normal_occupancy_replicates_hot_keys() {
        let mut e = engine(PolicyConfig::default());
        let mut s = sample(
            &[(1, 0.05), (2, 0.5), (3, 0.3), (4, 0.3)],
            latency(2.4, 8.0),
        );
        s.keys = Some(keys(&[(b"hot", 50_000), (b"warm", 5_000)], &[]));
        s.replication.insert(b"warm".to_vec(), 2);
        let d = e.decide(&s, Instant::now());
        // Latency is twice the average SLO: factors double (at least +1), capped at the 4 nodes.
        assert_eq!(
            d.actions,
            vec![
                Action::SetReplication {
                    key: b"hot".to_vec(),
                    from: 1,
                    to: 2
                },
                Action::SetReplication {
                    key: b"warm".to_vec(),
                    from: 2,
                    to: 4
                },
            ],
            "{:?}",
            d.reasons
        );
        // Nothing hot: nothing to do.
        let d = e.decide(
            &sample(&[(1, 0.05), (2, 0.5)], latency(2.4, 8.0)),
            Instant::now(),
        );
        assert!(d.actions.is_empty(), "{:?}", d.actions);
    }

    #[test]
    fn slo_met_with_normal_occupancy_dereplicates_cold_keys() {
        let mut e = engine(PolicyConfig::default());
        let mut s = sample(&[(1, 0.5), (2, 0.5)], latency(0.5, 5.0));
        s.replication.insert(b"was-hot".to_vec(), 3);
        s.replication.insert(b"still-hot".to_vec(), 2);
        s.keys = Some(keys(
            &[(b"still-hot", 40_000)],
            &[(b"was-hot", 0), (b"still-hot", 40_000)],
        ));
        let d = e.decide(&s, Instant::now());
        assert_eq!(
            d.actions,
            vec![Action::SetReplication {
                key: b"was-hot".to_vec(),
                from: 3,
                to: 1
            }],
            "{:?}",
            d.reasons
        );
        // An untracked replicated key whose count is uncertain up to the error bound is not called cold.
        let mut f = keys(&[], &[]);
        f.heavy_hitter_error = 1_000;
        s.keys = Some(f);
        s.replication = [(b"unknown".to_vec(), 2)].into();
        assert!(e.decide(&s, Instant::now()).actions.is_empty());
        // Without key statistics replication is left alone.
        s.keys = None;
        assert!(e.decide(&s, Instant::now()).actions.is_empty());
    }

    #[test]
    fn the_grace_period_blocks_membership_changes_then_lapses() {
        let cfg = PolicyConfig {
            grace_period: Duration::from_secs(90),
            ..PolicyConfig::default()
        };
        let mut e = engine(cfg);
        let t0 = Instant::now();
        let busy = sample(&[(1, 0.9), (2, 0.9)], latency(5.0, 50.0));
        assert_eq!(e.decide(&busy, t0).actions, vec![Action::AddNode]);
        // 10 s later, still violated and over-utilized: no second node within the grace period (no hot keys
        // either, so nothing at all).
        let d = e.decide(&busy, t0 + Duration::from_secs(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert!(d.reasons.iter().any(|r| r.contains("grace")));
        let idle = sample(&[(1, 0.01), (2, 0.01), (3, 0.0)], latency(0.1, 1.0));
        assert!(
            e.decide(&idle, t0 + Duration::from_secs(80))
                .actions
                .is_empty()
        );
        assert_eq!(
            e.decide(&idle, t0 + Duration::from_secs(91)).actions,
            vec![Action::RemoveNode(3)]
        );
        // A change the engine did not make (a failure) starts a grace period too.
        let mut e = engine(PolicyConfig::default());
        e.note_membership_change(t0);
        assert!(
            e.decide(&busy, t0 + Duration::from_secs(1))
                .actions
                .is_empty()
        );
        assert_eq!(
            e.decide(&busy, t0 + Duration::from_secs(90)).actions,
            vec![Action::AddNode]
        );
    }

    #[test]
    fn min_and_max_nodes_bound_the_cluster() {
        let cfg = PolicyConfig {
            min_nodes: 2,
            max_nodes: 2,
            ..PolicyConfig::default()
        };
        let mut e = engine(cfg);
        let d = e.decide(
            &sample(&[(1, 0.0), (2, 0.0)], latency(0.1, 1.0)),
            Instant::now(),
        );
        assert!(d.actions.is_empty());
        assert!(d.reasons.iter().any(|r| r.contains("min_nodes")));
        let d = e.decide(
            &sample(&[(1, 0.9), (2, 0.9)], latency(9.0, 90.0)),
            Instant::now(),
        );
        assert!(d.actions.is_empty());
        assert!(d.reasons.iter().any(|r| r.contains("max_nodes")));
    }

    #[test]
    fn no_membership_change_on_an_incomplete_sample_or_with_autoscaling_off() {
        let mut e = engine(PolicyConfig::default());
        let mut s = sample(&[(1, 0.01), (2, 0.5)], latency(0.1, 1.0));
        s.unsampled = vec![3];
        assert!(e.decide(&s, Instant::now()).actions.is_empty());
        let mut e = engine(PolicyConfig {
            autoscaling: false,
            ..PolicyConfig::default()
        });
        let s = sample(&[(1, 0.01), (2, 0.5)], latency(0.1, 1.0));
        assert!(e.decide(&s, Instant::now()).actions.is_empty());
    }

    #[test]
    fn no_requests_means_the_slo_is_met() {
        let mut e = engine(PolicyConfig::default());
        let d = e.decide(
            &sample(&[(1, 0.0), (2, 0.0)], LatencyObservation::default()),
            Instant::now(),
        );
        assert!(!d.observed.slo_violated);
        assert_eq!(
            d.actions,
            vec![Action::RemoveNode(1)],
            "ties go to the lowest id"
        );
    }

    fn arb_sample() -> impl Strategy<Value = ClusterSample> {
        (
            proptest::collection::btree_map(1u32..20, 0.0f64..1.0, 0..8),
            proptest::collection::vec(20u32..30, 0..2),
            (0u64..1000, 0.0f64..5e7, 0u64..1_000_000_000),
            proptest::collection::vec((0u8..20, 0u64..100_000), 0..20),
            proptest::collection::btree_map(0u8..20, 2u32..10, 0..5),
            0u64..1000,
        )
            .prop_map(
                |(occupancy, unsampled, (requests, avg_ns, p99_ns), hh, rep, err)| {
                    let heavy_hitters: Vec<KeyCount> = hh
                        .into_iter()
                        .map(|(k, count)| KeyCount {
                            key: vec![k],
                            count,
                        })
                        .collect();
                    let accesses = heavy_hitters.iter().map(|h| h.count).sum::<u64>() + 10_000;
                    ClusterSample {
                        occupancy,
                        unsampled,
                        latency: LatencyObservation {
                            requests,
                            avg_ns,
                            p99_ns,
                        },
                        keys: Some(KeyFrequency {
                            accesses,
                            distinct: 200.0,
                            f2: accesses as f64 * 300.0,
                            heavy_hitters,
                            heavy_hitter_error: err,
                            tracked: vec![],
                        }),
                        replication: rep.into_iter().map(|(k, r)| (vec![k], r)).collect(),
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn decisions_keep_the_rules(samples in proptest::collection::vec(arb_sample(), 1..12),
                                    step_s in 1u64..60) {
            let cfg = PolicyConfig { max_nodes: 8, min_nodes: 2, ..PolicyConfig::default() };
            let mut e = engine(cfg.clone());
            let t0 = Instant::now();
            let mut last_change: Option<Instant> = None;
            for (i, s) in samples.iter().enumerate() {
                let now = t0 + Duration::from_secs(step_s * i as u64);
                let d = e.decide(s, now);
                let membership: Vec<&Action> = d.actions.iter().filter(|a| a.is_membership()).collect();
                prop_assert!(membership.len() <= 1, "at most one add or remove: {:?}", d.actions);
                if !membership.is_empty() {
                    prop_assert!(last_change.is_none_or(|t| now - t >= cfg.grace_period), "grace period");
                    prop_assert!(s.unsampled.is_empty());
                    last_change = Some(now);
                }
                for a in &d.actions {
                    match a {
                        Action::AddNode => {
                            prop_assert!(d.observed.slo_violated);
                            prop_assert!(s.nodes() < cfg.max_nodes);
                        }
                        Action::RemoveNode(n) => {
                            prop_assert!(!d.observed.slo_violated);
                            prop_assert!(s.nodes() > cfg.min_nodes);
                            prop_assert!(s.occupancy[n] < cfg.under_utilization_upper_bound);
                        }
                        Action::SetReplication { from, to, .. } => {
                            if to > from {
                                prop_assert!(d.observed.slo_violated, "never replicate when the SLO is met");
                                prop_assert!(*to <= cfg.max_replication.min(s.nodes() as u32));
                            } else {
                                prop_assert!(!d.observed.slo_violated, "de-replicate only when the SLO is met");
                                prop_assert_eq!(*to, 1);
                            }
                            prop_assert!(!d.actions.iter().any(Action::is_membership),
                                "a replication change never comes with a membership change");
                        }
                    }
                }
                prop_assert!(d.actions.len() <= cfg.max_replication_changes.max(1));
            }
        }
    }
}
