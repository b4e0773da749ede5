//! The pDPM paper's Figure 7 recipe at the tiny scale: every run it lists was written and reads back, its table
//! agrees with them, and the systems not built are listed, never run. Counts and consistency, never timings.

use dinomo_bench::figures::{FigureReport, PDPM_FIGURE, Scale, run_pdpm_figure};
use dinomo_bench::ycsb::Workload;
use dinomo_bench::ycsb_run::{System, TargetOptions};

mod common;
use common::{read_json, ycsb_runs};

#[test]
fn pdpm_figure7_runs_every_store_with_and_without_replication() -> anyhow::Result<()> {
    let out = tempfile::tempdir()?;
    let report = run_pdpm_figure(Scale::Tiny, out.path(), &mut |_| {})?;
    assert_eq!((report.figure, report.paper.as_str()), (7, "pDPM"));
    assert!(
        report.commands[0].starts_with(&format!("dinomo bench figure {PDPM_FIGURE} --scale tiny"))
    );
    let dir = out.path().join("pdpm-figure7");
    let back: FigureReport = read_json(&dir.join("pdpm-figure7.json"))?;
    assert_eq!(back, report);
    let md = std::fs::read_to_string(dir.join("pdpm-figure7.md"))?;
    assert!(md.starts_with("## pDPM Figure 7"), "{md}");
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| ")).count(),
        report.rows.len() + 1
    );
    // Two workloads at the tiny scale, two replication degrees, four stores: one report each, all clean.
    let runs = ycsb_runs(&report, &dir)?;
    assert_eq!(runs.len(), 2 * 2 * System::PDPM.len());
    assert!(System::PDPM.contains(&System::Clover));
    for r in &runs {
        assert_eq!(r.measured.ops, 300, "{}", r.system);
        assert_eq!(
            r.measured.errors.total(),
            0,
            "{}: {:?}",
            r.system,
            r.measured.errors
        );
        assert!(r.cache.is_none());
    }
    for s in System::PDPM {
        assert_eq!(runs.iter().filter(|r| r.system == s.name()).count(), 4);
    }
    // The table's throughput rows name every store, and the throughput CSV has a line per run.
    let csv = std::fs::read_to_string(dir.join("throughput.csv"))?;
    assert_eq!(csv.lines().count(), 1 + runs.len());
    // Table 1's read costs of the lock-free and the coordinator reads hold on the read-only runs.
    let row = |claim: &str| {
        report
            .rows
            .iter()
            .find(|r| r.claim == claim)
            .unwrap_or_else(|| panic!("no row {claim:?}"))
    };
    // One READ per read, plus a probe the first time a client meets a key in the measured phase (the warm-up is
    // short here; `pdpm_smoke.rs` holds the exact counts with every key met before).
    let lock_free = row("directds-c: round trips per read, read-only (Table 1)");
    assert!(
        lock_free
            .ours_value
            .is_some_and(|v| (1.0..1.1).contains(&v)),
        "{lock_free:?}"
    );
    let central = row("centralds: round trips per read, read-only (Table 1)");
    assert!(central.ours_value.is_some_and(|v| v >= 2.0), "{central:?}");
    // Clover (Table 1: a read is 1 round trip on a cursor hit, a write 2 with one copy), from its runs' reports:
    // the probe of a key first met in the measured phase adds one, and a write that finds another client's
    // version linked first chases it.
    let clover_rt = |workload: &Workload| {
        let r = runs
            .iter()
            .find(|r| {
                r.system == "clover"
                    && r.options.workload == *workload
                    && matches!(&r.options.target, TargetOptions::InProcess(p) if p.replication == 1)
            })
            .unwrap_or_else(|| panic!("no clover run of {workload}"));
        r.resources.as_ref().expect("counters").per_op.round_trips
    };
    let read = clover_rt(&Workload::C);
    assert!((1.0..1.2).contains(&read), "clover read-only: {read}");
    let write = clover_rt(&"update=1".parse().expect("a mix"));
    assert!(write >= 2.0, "clover write-only: {write}");
    // The table's Table 1 rows for Clover carry the same counts.
    let clover_read = row("clover: round trips per read, read-only (Table 1)");
    assert_eq!(
        (clover_read.paper_value, clover_read.ours_value),
        (Some(1.0), Some(read))
    );
    let clover_write = row("clover: round trips per write, write-only (Table 1)");
    assert_eq!(
        (clover_write.paper_value, clover_write.ours_value),
        (Some(2.0), Some(write))
    );
    for r in &report.rows {
        if let (Some(o), Some(p), Some(ratio)) = (r.ours_value, r.paper_value, r.ratio) {
            assert!((ratio - o / p).abs() < 1e-9, "{r:?}");
        }
        if r.ours.starts_with("not built") {
            assert!(r.ours_value.is_none() && r.ratio.is_none(), "{r:?}");
        }
    }
    assert_eq!(report.not_built, ["hotpot"]);
    Ok(())
}
