//! The autoscaler: the policy loop of the leading M-node. Every monitoring epoch it collects every KV node's
//! statistics (occupancy, key accesses, the latency reports of its clients); every decision period it runs the
//! [`PolicyEngine`] on what it collected and carries the actions out: a node is added through a [`Scaler`] (it then
//! joins through the M-node's join path), removed by the M-node and then stopped by the scaler, and a key's
//! replication factor is changed through the [`Actuator`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender, bounded};
use dinomo_meta::MetaStore;
use dinomo_ring::NodeId;
use serde::Serialize;
use tracing::{info, warn};

use crate::policy::{Action, Decision, PolicyConfig, PolicyEngine};
use crate::stats::{SampleWindow, collect_epoch};
use crate::{ClusterError, ClusterRecord, MNode};

/// Starts and stops KV nodes (the M-node does the ownership part).
pub trait Scaler: Send + Sync {
    /// Provisions and starts a new KV node, which then joins the cluster through the M-node; returns its id.
    fn add_node(&self) -> Result<NodeId, ClusterError>;
    /// Stops `node`, which the M-node has already removed from the ring.
    fn stop_node(&self, node: NodeId) -> Result<(), ClusterError>;
    /// Says that the caller is removing `node` (`true`) and will stop it once the removal succeeds, or no longer
    /// is (`false`): a scaler that stops removed nodes by itself leaves it to the caller meanwhile.
    fn set_removing(&self, _node: NodeId, _removing: bool) {}
}

/// Has `remove` take `node` out of the ring, then `stop` stop it, telling `scaler` meanwhile that the caller drives
/// the removal (so a scaler that stops removed nodes by itself leaves this one alone). A removal that failed may
/// still be carried through by the M-node later; the scaler may then stop the node itself.
pub(crate) fn remove_then_stop(
    scaler: &dyn Scaler,
    node: NodeId,
    remove: impl FnOnce() -> Result<(), ClusterError>,
    stop: impl FnOnce() -> Result<(), ClusterError>,
) -> Result<(), ClusterError> {
    scaler.set_removing(node, true);
    let removed = remove().and_then(|()| stop());
    scaler.set_removing(node, false);
    removed
}

/// What the autoscaler asks of the M-node.
pub trait Actuator: Send + Sync {
    /// Whether this M-node leads (only the leader's autoscaler acts).
    fn is_leading(&self) -> bool;
    /// Removes `node` from the ring (it hands its keys over); returns when done.
    fn remove_node(&self, node: NodeId) -> Result<(), ClusterError>;
    /// Sets the replication factor of `key` (1 = not replicated); returns when the nodes serve under it.
    fn set_replication(&self, key: &[u8], factor: u32) -> Result<(), ClusterError>;
    /// When the latest membership change (join, removal, failure) completed, if any.
    fn last_membership_change(&self) -> Option<Instant>;
    /// The cluster token, presented to the KV nodes when their statistics are collected.
    fn cluster_token(&self) -> &str;
}

impl Actuator for MNode {
    fn is_leading(&self) -> bool {
        MNode::is_leading(self)
    }

    fn cluster_token(&self) -> &str {
        MNode::cluster_token(self)
    }

    fn remove_node(&self, node: NodeId) -> Result<(), ClusterError> {
        MNode::remove_node(self, node)
    }

    fn set_replication(&self, key: &[u8], factor: u32) -> Result<(), ClusterError> {
        MNode::set_replication(self, key, factor)
    }

    fn last_membership_change(&self) -> Option<Instant> {
        // Sharing changes move no ownership of whole ranges: they do not restart the grace period.
        self.events()
            .iter()
            .rev()
            .find(|e| {
                matches!(
                    e.kind,
                    crate::ReconfigKind::Add
                        | crate::ReconfigKind::Remove
                        | crate::ReconfigKind::Failure
                )
            })
            .map(|e| self.started() + e.noticed_at + e.duration)
    }
}

/// A scaler for an M-node that cannot start processes (`dinomo mnode`): adding a node is refused with advice,
/// and a removed node's process is left to the operator.
#[derive(Debug, Default, Clone, Copy)]
pub struct ManualScaler;

impl Scaler for ManualScaler {
    fn add_node(&self) -> Result<NodeId, ClusterError> {
        Err(ClusterError::Reconfig(
            "this M-node cannot start KV nodes; start one with `dinomo kn` and it joins by itself"
                .into(),
        ))
    }

    fn stop_node(&self, node: NodeId) -> Result<(), ClusterError> {
        info!(
            node,
            "KV node removed from the ring; it serves nothing and its process may be stopped"
        );
        Ok(())
    }
}

/// Settings of the autoscaler.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscaleConfig {
    /// Whether the leading M-node runs the policy loop (default false).
    pub enabled: bool,
    /// The policy.
    pub policy: PolicyConfig,
    /// How often the KV nodes' statistics are collected (default 5 s; at most the decision period).
    #[serde(with = "humantime_serde")]
    pub monitoring_epoch: Duration,
    /// Bound on collecting one node's statistics (default 2 s).
    #[serde(with = "humantime_serde")]
    pub collect_timeout: Duration,
    /// Policy events kept for [`Autoscaler::events`] (default 1024; older ones are dropped).
    pub max_events: usize,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            enabled: false,
            policy: PolicyConfig::default(),
            monitoring_epoch: Duration::from_secs(5),
            collect_timeout: Duration::from_secs(2),
            max_events: 1024,
        }
    }
}

impl AutoscaleConfig {
    /// Checks the settings fit together.
    pub fn validate(&self) -> Result<(), String> {
        self.policy.validate()?;
        if self.monitoring_epoch.is_zero() || self.monitoring_epoch > self.policy.decision_period {
            return Err(format!(
                "the monitoring epoch ({:?}) must be above zero and at most the decision period ({:?})",
                self.monitoring_epoch, self.policy.decision_period
            ));
        }
        if self.collect_timeout.is_zero() {
            return Err("the collection timeout must be above zero".into());
        }
        Ok(())
    }
}

/// How one action went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActionOutcome {
    /// The action.
    pub action: Action,
    /// `Ok` with what was done, or why it failed.
    pub result: Result<String, String>,
}

/// One decision of the autoscaler and what came of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyEvent {
    /// When it decided, since the autoscaler started.
    pub at: Duration,
    /// Monitoring epochs the decision looked at.
    pub epochs: u32,
    /// What was observed, decided and why.
    pub decision: Decision,
    /// How each action went.
    pub outcomes: Vec<ActionOutcome>,
}

/// A running policy loop; stopping (or dropping) it ends the loop.
pub struct Autoscaler {
    started: Instant,
    stop: Option<Sender<()>>,
    events: Arc<Mutex<VecDeque<PolicyEvent>>>,
    thread: Option<JoinHandle<()>>,
}

impl Autoscaler {
    /// Starts the loop. It acts only while `actuator` leads.
    pub fn start(
        cfg: AutoscaleConfig,
        meta: Arc<dyn MetaStore>,
        actuator: Arc<dyn Actuator>,
        scaler: Arc<dyn Scaler>,
    ) -> Result<Autoscaler, ClusterError> {
        cfg.validate().map_err(ClusterError::Reconfig)?;
        let engine = PolicyEngine::new(cfg.policy.clone()).map_err(ClusterError::Reconfig)?;
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let events = Arc::new(Mutex::new(VecDeque::new()));
        let started = Instant::now();
        let mut run = Loop {
            cfg,
            engine,
            meta,
            actuator,
            scaler,
            events: events.clone(),
            started,
        };
        let thread = std::thread::Builder::new()
            .name("dinomo-autoscaler".into())
            .spawn(move || run.run(&stop_rx))
            .map_err(|e| ClusterError::Io(format!("cannot start the autoscaler: {e}")))?;
        Ok(Autoscaler {
            started,
            stop: Some(stop_tx),
            events,
            thread: Some(thread),
        })
    }

    /// When it started: [`PolicyEvent::at`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The decisions so far (the latest `max_events`).
    pub fn events(&self) -> Vec<PolicyEvent> {
        self.events
            .lock()
            .expect("events lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Stops the loop (an action in progress finishes first).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Autoscaler {
    fn drop(&mut self) {
        self.halt();
    }
}

struct Loop {
    cfg: AutoscaleConfig,
    engine: PolicyEngine,
    meta: Arc<dyn MetaStore>,
    actuator: Arc<dyn Actuator>,
    scaler: Arc<dyn Scaler>,
    events: Arc<Mutex<VecDeque<PolicyEvent>>>,
    started: Instant,
}

impl Loop {
    fn run(&mut self, stop: &crossbeam_channel::Receiver<()>) {
        let epoch = self.cfg.monitoring_epoch;
        let period = self.cfg.policy.decision_period;
        let mut window = SampleWindow::new();
        let mut next_epoch = dinomo_kn::deadline_after(epoch);
        let mut next_decision = dinomo_kn::deadline_after(period);
        loop {
            match stop.recv_timeout(next_epoch.saturating_duration_since(Instant::now())) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let now = Instant::now();
            next_epoch = next_epoch.checked_add(epoch).unwrap_or(next_epoch).max(now);
            if !self.actuator.is_leading() {
                window = SampleWindow::new();
                next_decision = dinomo_kn::deadline_after(period);
                continue;
            }
            let record = match ClusterRecord::load(&*self.meta) {
                Ok(Some((r, _))) => r,
                Ok(None) => continue,
                Err(e) => {
                    warn!(error = %e, "autoscaler: cannot read the cluster record");
                    continue;
                }
            };
            for (node, r) in collect_epoch(
                &record.routing,
                self.actuator.cluster_token(),
                self.cfg.collect_timeout,
            ) {
                match r.and_then(|st| window.add(&st)) {
                    Ok(()) => {}
                    Err(e) => warn!(node, error = %e, "autoscaler: no statistics from a node"),
                }
            }
            window.end_epoch();
            if Instant::now() < next_decision {
                continue;
            }
            next_decision = dinomo_kn::deadline_after(period);
            if let Some(t) = self.actuator.last_membership_change() {
                self.engine.note_membership_change(t);
            }
            let sample = window.sample(&record.routing.ring);
            let epochs = window.epochs();
            window = SampleWindow::new();
            let at = Instant::now();
            let decision = self.engine.decide(&sample, at);
            let outcomes = act(&decision, &*self.actuator, &*self.scaler);
            let mut events = self.events.lock().expect("events lock");
            events.push_back(PolicyEvent {
                at: at.duration_since(self.started),
                epochs,
                decision,
                outcomes,
            });
            while events.len() > self.cfg.max_events {
                events.pop_front();
            }
        }
    }
}

/// Carries out a decision's actions in order: add through the scaler; remove through the M-node, then stop
/// through the scaler; replication changes through the M-node.
pub fn act(
    decision: &Decision,
    actuator: &dyn Actuator,
    scaler: &dyn Scaler,
) -> Vec<ActionOutcome> {
    decision
        .actions
        .iter()
        .map(|a| ActionOutcome {
            action: a.clone(),
            result: carry_out(a, actuator, scaler).map_err(|e| {
                warn!(action = ?a, error = %e, "autoscaler: action failed");
                e.to_string()
            }),
        })
        .collect()
}

fn carry_out(
    action: &Action,
    actuator: &dyn Actuator,
    scaler: &dyn Scaler,
) -> Result<String, ClusterError> {
    match action {
        Action::AddNode => {
            let id = scaler.add_node()?;
            Ok(format!("node {id} started"))
        }
        Action::RemoveNode(node) => {
            remove_then_stop(
                scaler,
                *node,
                || actuator.remove_node(*node),
                || scaler.stop_node(*node),
            )?;
            Ok(format!("node {node} removed and stopped"))
        }
        Action::SetReplication { key, to, .. } => {
            actuator.set_replication(key, *to)?;
            Ok(format!("replication factor {to}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::LatencyObservation;
    use crate::policy::ClusterSample;
    use dinomo_kn::{KeyCount, KeyFrequency};

    /// Records what it is asked to do, in order.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
        refuse_replication: bool,
    }

    impl Recorder {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
        fn note(&self, s: String) {
            self.calls.lock().unwrap().push(s);
        }
    }

    impl Actuator for Recorder {
        fn is_leading(&self) -> bool {
            true
        }
        fn remove_node(&self, node: NodeId) -> Result<(), ClusterError> {
            self.note(format!("remove {node}"));
            Ok(())
        }
        fn set_replication(&self, key: &[u8], factor: u32) -> Result<(), ClusterError> {
            self.note(format!(
                "replicate {} {factor}",
                String::from_utf8_lossy(key)
            ));
            if self.refuse_replication {
                return Err(ClusterError::Reconfig("refused".into()));
            }
            Ok(())
        }
        fn last_membership_change(&self) -> Option<Instant> {
            None
        }
        fn cluster_token(&self) -> &str {
            ""
        }
    }

    impl Scaler for Recorder {
        fn add_node(&self) -> Result<NodeId, ClusterError> {
            self.note("add".into());
            Ok(9)
        }
        fn stop_node(&self, node: NodeId) -> Result<(), ClusterError> {
            self.note(format!("stop {node}"));
            Ok(())
        }
    }

    fn sample(occupancy: &[(NodeId, f64)], avg_ms: f64, hot: &[(&[u8], u64)]) -> ClusterSample {
        let mut heavy: Vec<KeyCount> = hot
            .iter()
            .map(|(k, c)| KeyCount {
                key: k.to_vec(),
                count: *c,
            })
            .collect();
        heavy.push(KeyCount {
            key: b"other".to_vec(),
            count: 10,
        });
        let accesses = 10 * 1000 + hot.iter().map(|h| h.1).sum::<u64>();
        ClusterSample {
            occupancy: occupancy.iter().copied().collect(),
            unsampled: vec![],
            latency: LatencyObservation {
                requests: 1000,
                avg_ns: avg_ms * 1e6,
                p99_ns: 1_000_000,
            },
            keys: Some(KeyFrequency {
                accesses,
                distinct: 1000.0,
                f2: 100.0 * 1000.0 + hot.iter().map(|h| (h.1 * h.1) as f64).sum::<f64>(),
                heavy_hitters: heavy,
                heavy_hitter_error: 0,
                tracked: vec![],
            }),
            replication: Default::default(),
        }
    }

    #[test]
    fn replication_decisions_reach_the_actuator() {
        let mut engine = PolicyEngine::new(PolicyConfig::default()).unwrap();
        let rec = Recorder::default();
        // Average latency 3x the SLO with a hot key and normal occupancy: replicate it 3x (3 nodes).
        let s = sample(&[(1, 0.15), (2, 0.3), (3, 0.3)], 3.6, &[(b"hot", 20_000)]);
        let d = engine.decide(&s, Instant::now());
        let out = act(&d, &rec, &rec);
        assert_eq!(rec.calls(), vec!["replicate hot 3"]);
        assert_eq!(out.len(), 1);
        assert!(out[0].result.is_ok());
        // A refused change is reported, not hidden.
        let refusing = Recorder {
            refuse_replication: true,
            ..Recorder::default()
        };
        let out = act(&d, &refusing, &refusing);
        assert!(out[0].result.as_ref().unwrap_err().contains("refused"));
    }

    #[test]
    fn removal_goes_through_the_mnode_before_the_node_is_stopped() {
        let mut engine = PolicyEngine::new(PolicyConfig::default()).unwrap();
        let rec = Recorder::default();
        let d = engine.decide(&sample(&[(1, 0.5), (2, 0.01)], 0.1, &[]), Instant::now());
        act(&d, &rec, &rec);
        assert_eq!(rec.calls(), vec!["remove 2", "stop 2"]);
        let rec = Recorder::default();
        let d = engine.decide(
            &sample(&[(1, 0.5), (2, 0.5)], 5.0, &[]),
            Instant::now() + Duration::from_secs(3600),
        );
        let out = act(&d, &rec, &rec);
        assert_eq!(rec.calls(), vec!["add"]);
        assert_eq!(out[0].result, Ok("node 9 started".to_string()));
    }

    #[test]
    fn settings_are_checked() {
        AutoscaleConfig::default().validate().unwrap();
        let long_epoch = AutoscaleConfig {
            monitoring_epoch: Duration::from_secs(60),
            ..AutoscaleConfig::default()
        };
        assert!(long_epoch.validate().is_err());
        assert!(ManualScaler.add_node().is_err());
        assert!(ManualScaler.stop_node(3).is_ok());
    }
}
