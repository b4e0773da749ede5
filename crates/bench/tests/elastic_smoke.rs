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
