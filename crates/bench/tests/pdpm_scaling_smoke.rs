//! The pDPM paper's Figures 9 and 10 recipes at the tiny scale: every store runs at every node count of the axis,
//! with the other count held, every report reads back, and the table agrees with the runs. Counts and
//! consistency, never timings.

use dinomo_bench::figures::{
    FigureReport, PdpmAxis, Scale, pdpm_scaling_plan, run_pdpm_scaling_figure,
};
use dinomo_bench::ycsb_run::{System, TargetOptions};

mod common;
use common::{read_json, ycsb_runs};

fn check(axis: PdpmAxis) -> anyhow::Result<()> {
    let out = tempfile::tempdir()?;
    let report = run_pdpm_scaling_figure(axis, Scale::Tiny, out.path(), &mut |_| {})?;
    assert_eq!(
        (report.figure, report.paper.as_str()),
        (axis.figure(), "pDPM")
    );
    assert!(
        report.commands[0]
            .starts_with(&format!("dinomo bench figure {} --scale tiny", axis.name()))
    );
    let dir = out.path().join(format!("pdpm-figure{}", axis.figure()));
    let back: FigureReport = read_json(&dir.join(format!("pdpm-figure{}.json", axis.figure())))?;
    assert_eq!(back, report);
    let plan = pdpm_scaling_plan(axis, Scale::Tiny);
    let runs = ycsb_runs(&report, &dir)?;
    // Two workloads at the tiny scale, every store, every count: one clean report each.
    assert_eq!(runs.len(), 2 * System::PDPM.len() * plan.counts.len());
    for r in &runs {
        assert_eq!(r.measured.ops, 300, "{}", r.system);
        assert_eq!(
            r.measured.errors.total(),
            0,
            "{}: {:?}",
            r.system,
            r.measured.errors
        );
        let TargetOptions::InProcess(p) = &r.options.target else {
            panic!("an in-process target");
        };
        assert_eq!(p.replication, 1);
        match axis {
            PdpmAxis::MemoryNodes => {
                assert_eq!(p.kns, plan.fixed_compute_nodes);
                assert!(plan.counts.contains(&p.memory_nodes));
            }
            PdpmAxis::ComputeNodes => {
                assert_eq!(p.memory_nodes, plan.fixed_memory_nodes);
                assert!(plan.counts.contains(&p.kns));
            }
        }
        // Every compute node brings the same client threads.
        assert_eq!(r.options.clients, p.kns * plan.threads_per_compute_node);
    }
    let csv = std::fs::read_to_string(dir.join("throughput.csv"))?;
    assert_eq!(csv.lines().count(), 1 + runs.len());
    // A row per store and workload whose ratio is the largest count's throughput over the smallest's.
    for system in System::PDPM {
        let rows: Vec<_> = report
            .rows
            .iter()
            .filter(|r| r.claim.starts_with(&format!("{system}, ")))
            .collect();
        assert_eq!(rows.len(), 2, "{system}");
        for row in rows {
            let growth = row.ours_value.expect("a ratio");
            assert!(growth.is_finite() && growth > 0.0, "{row:?}");
            assert!(row.ratio.is_none(), "the paper states no number: {row:?}");
        }
    }
    // Every store of the pDPM paper these figures compare is built and run.
    assert!(report.not_built.is_empty(), "{:?}", report.not_built);
    Ok(())
}

#[test]
fn pdpm_figure9_adds_memory_nodes_with_compute_nodes_held() -> anyhow::Result<()> {
    check(PdpmAxis::MemoryNodes)
}

#[test]
fn pdpm_figure10_adds_compute_nodes_with_memory_nodes_held() -> anyhow::Result<()> {
    check(PdpmAxis::ComputeNodes)
}

#[test]
fn scaling_recipes_are_named_on_the_command_line() {
    assert_eq!(PdpmAxis::from_name("PDPM-MN"), Some(PdpmAxis::MemoryNodes));
    assert_eq!(PdpmAxis::from_name("pdpm-cn"), Some(PdpmAxis::ComputeNodes));
    assert_eq!(PdpmAxis::from_name("pdpm"), None);
    let small = pdpm_scaling_plan(PdpmAxis::ComputeNodes, Scale::Small);
    assert_eq!(small.counts, [1, 2, 4]);
}
