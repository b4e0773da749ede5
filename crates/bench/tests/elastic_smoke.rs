//! `dinomo bench elastic --system dinomo-n` at tiny scale: a KV node joins, and one leaves, under a bounded
//! closed-loop load; the data of the keys that change owner moves between partitions, the report says how much and
//! how long it took, and every record reads back intact afterwards.

use std::time::Duration;

use dinomo_bench::ycsb::{Distribution, Workload};
use dinomo_bench::ycsb_run::System;
use dinomo_bench::{ElasticOptions, Scenario, run_elastic};
use dinomo_cluster::ReconfigKind;

fn tiny(scenario: Scenario) -> ElasticOptions {
    ElasticOptions {
        system: System::DinomoN,
        scenario,
        kns: 2,
        keys: 2000,
        value_size: 256,
        clients: 2,
        workload: Workload::A,
        distribution: Distribution::Uniform,
        before: Duration::from_millis(300),
        after: Duration::from_millis(400),
        // Long leases: no heartbeat late on a busy machine may fail a node in the middle of these runs.
        lease: Duration::from_secs(2),
        heartbeat: Duration::from_millis(200),
        ..ElasticOptions::default()
    }
}

#[test]
fn shared_nothing_moves_data_when_a_node_joins_and_leaves() -> anyhow::Result<()> {
    for (scenario, kind) in [
        (Scenario::Add, ReconfigKind::Add),
        (Scenario::Remove, ReconfigKind::Remove),
    ] {
        let r = run_elastic(&tiny(scenario), |_| {})?;
        assert_eq!(
            (r.values_checked, r.values_missing, r.values_corrupt),
            (2000, 0, 0),
            "{scenario:?}: every record reads back intact"
        );
        let event = r
            .reconfigurations
            .iter()
            .find(|e| e.kind == kind)
            .expect("the reconfiguration ran");
        // A third of the keys (joining the second node of three) or half of them (leaving one of two) move.
        assert!(
            (300..=1500).contains(&event.moved_keys),
            "{scenario:?}: {} keys moved",
            event.moved_keys
        );
        assert!(event.moved_bytes >= event.moved_keys * 256);
        assert!(!event.move_duration.is_zero() && event.move_duration <= event.duration);
        assert_eq!(
            (r.moved_keys, r.moved_bytes),
            (event.moved_keys, event.moved_bytes)
        );
        assert!(
            r.summary().contains("between partitions"),
            "{}",
            r.summary()
        );
        assert_eq!(
            r.options.file_stem(),
            format!("elastic-dinomo-n-{}", scenario.name())
        );
    }
    Ok(())
}

#[test]
fn dinomo_n_refuses_the_replicate_scenario() {
    let err = run_elastic(&tiny(Scenario::Replicate), |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("no selective replication"),
        "{err}"
    );
}

/// Clover has no owners: a killed compute node's clients stop inside a write each, the metadata server takes their
/// grants back, the survivors never stop serving, and every record reads back. Replication has nothing to share.
#[test]
fn clover_compute_node_crash_mid_write_loses_nothing() -> anyhow::Result<()> {
    let o = ElasticOptions {
        system: System::Clover,
        clients: 6,
        kns: 2,
        ..tiny(Scenario::Failure)
    };
    let r = run_elastic(&o, |_| {})?;
    let c = r.clover.as_ref().expect("a Clover report");
    assert_eq!((c.compute_nodes_before, c.compute_nodes_after), (2, 1));
    // Clients 0, 2 and 4 were node 0's: each stopped at a different crash point.
    assert_eq!(c.clients_changed, 3);
    assert_eq!(c.interrupted_writes, [1, 1, 1]);
    assert!(c.reclaimed_slots > 0 && c.reclaim_ms.is_some());
    assert!(r.all_keys_served_after_ms.is_some());
    assert_eq!(
        (r.values_checked, r.values_missing, r.values_corrupt),
        (2000, 0, 0)
    );
    assert!(r.baseline_ops_per_s > 0.0 && r.settled_ops_per_s > 0.0);

    let err = run_elastic(
        &ElasticOptions {
            system: System::Clover,
            ..tiny(Scenario::Replicate)
        },
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("clover has no owners"), "{err}");
    let err = run_elastic(
        &ElasticOptions {
            system: System::DirectDs,
            ..tiny(Scenario::Add)
        },
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("no KV nodes to add"), "{err}");
    Ok(())
}
