//! The projection model against throughput measured on this project's 2-core VM. The fixtures are real
//! `dinomo bench ycsb` sweeps (1 and 2 KV nodes, YCSB A and C, Zipf 0.99, 20 000 records of 1 KiB, 8 clients, 5 s
//! measured; recorded with the benchmark at raised scheduling priority because other builds shared the machine):
//!
//! ```sh
//! dinomo bench ycsb --workload a --distribution zipf --theta 0.99 --sweep-kns 1,2 --clients 8 --records 20000 \
//!     --secs 5 --warmup-secs 1 --out DIR       # and --workload c
//! ```
//!
//! A profile of that machine (its 2 cores shared by everything, the in-process fabric) must predict each run's
//! throughput from the run's own per-operation resources within [`TOLERANCE`], with the shared cores binding.
//! What that tests: every thread's CPU time is accounted to the operations, and the cores, not latency or
//! waiting, limit this machine — measured / predicted is the share of the cores the run got.

use std::path::Path;

use dinomo_bench::project::{Component, HardwareProfile, project};
use dinomo_bench::ycsb_run::{YcsbReport, load_reports};

/// How far the prediction may be from the measurement on this machine.
const TOLERANCE: f64 = 0.20;

fn fixtures() -> anyhow::Result<Vec<YcsbReport>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut runs = Vec::new();
    for name in [
        "local-ycsb-a-zipf0.99-1-2kn.json",
        "local-ycsb-c-zipf0.99-1-2kn.json",
    ] {
        runs.extend(load_reports(&dir.join(name))?);
    }
    Ok(runs)
}

#[test]
fn local_profile_predicts_the_measured_one_and_two_node_throughput() -> anyhow::Result<()> {
    let runs = fixtures()?;
    assert_eq!(runs.len(), 4);
    let cores = runs[0].host.cores;
    assert_eq!(cores, 2, "recorded on the 2-core VM");
    let p = project(&runs, &HardwareProfile::local(cores), 2)?;
    assert_eq!(p.series.len(), 2, "A and C");
    for s in &p.series {
        assert_eq!(s.checks.len(), 2, "{}", s.label);
        for c in &s.checks {
            assert_eq!(c.bound_by, Component::SharedCpu, "{}: {c:?}", s.label);
            assert!(
                c.within(TOLERANCE),
                "{} at {} KV node(s): predicted {:.0}, measured {:.0} ({:+.1}%)",
                s.label,
                c.kv_nodes,
                c.predicted_ops_per_s,
                c.measured_ops_per_s,
                c.error * 100.0
            );
            // An upper bound: nothing measured beats the cores.
            assert!(c.predicted_ops_per_s >= c.measured_ops_per_s, "{c:?}");
        }
        for point in &s.points {
            assert_eq!(point.from_kv_nodes, point.kv_nodes);
            assert!(point.measured_ops_per_s.is_some());
        }
    }
    assert!(p.all_within(TOLERANCE));
    assert!(!p.all_within(0.01), "the checks are not vacuous");
    Ok(())
}

#[test]
fn paper_profile_scales_with_the_kv_nodes() -> anyhow::Result<()> {
    let runs = fixtures()?;
    let p = project(&runs, &HardwareProfile::paper(), 16)?;
    for s in &p.series {
        assert_eq!(s.points.len(), 16);
        for w in s.points[1..].windows(2) {
            assert!(
                w[1].predicted_ops_per_s >= w[0].predicted_ops_per_s,
                "{}: more nodes never predict less from the same per-op resources ({} → {})",
                s.label,
                w[0].kv_nodes,
                w[1].kv_nodes
            );
        }
        // The KV nodes' CPU binds at one node: per op, they spend tens of µs against well under 1 µs of the
        // memory node's processor and a fraction of a round trip.
        assert_eq!(s.points[0].bound_by, Component::KnCpu, "{}", s.label);
        // From 2 nodes on, the 2-node run's resources are used.
        assert!(s.points[1..].iter().all(|pt| pt.from_kv_nodes == 2));
    }
    // Read-only C makes no fabric round trips once every value is cached: the fabric never limits it.
    let c = p
        .series
        .iter()
        .find(|s| s.label.contains(" c "))
        .expect("C");
    let last = c.points.last().unwrap();
    for comp in [Component::DpmNic, Component::DpmLink] {
        let ceiling = last.ceilings.iter().find(|x| x.component == comp).unwrap();
        assert_eq!(ceiling.ops_per_s, None, "{comp}: {ceiling:?}");
    }
    let table = p.table();
    assert!(table.starts_with("MODEL, not a measurement"));
    assert_eq!(p.to_csv().lines().count(), 1 + 2 * 16);
    Ok(())
}

/// A pDPM store's compute nodes are the client threads: the model counts their CPU as compute-node (KV-node) CPU,
/// leaves none on the clients' side, and says so.
#[test]
fn pdpm_runs_count_client_cpu_as_compute_node_cpu() -> anyhow::Result<()> {
    use dinomo_bench::project::Demand;
    let runs = fixtures()?;
    let dinomo = Demand::of(&runs[0]).expect("resources");
    assert!(!dinomo.compute_on_clients);
    let client_cpu = runs[0].resources.as_ref().unwrap().per_op.client_cpu_us;
    assert!(client_cpu.is_some_and(|c| c > 0.0));
    assert_eq!(dinomo.client_cpu_us, client_cpu);

    let mut clover = runs[0].clone();
    clover.system = "clover".into();
    let d = Demand::of(&clover).expect("resources");
    assert!(d.compute_on_clients);
    assert_eq!((d.kn_cpu_us, d.client_cpu_us), (client_cpu, None));
    let p = project(&[clover], &HardwareProfile::paper(), 16)?;
    assert!(
        p.warnings.iter().any(|w| w.contains("pDPM store")),
        "{:?}",
        p.warnings
    );
    assert_eq!(p.series[0].points.len(), 16);
    Ok(())
}
