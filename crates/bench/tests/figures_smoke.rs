//! Every figure recipe end to end at the tiny scale: the files it promises exist and read back, and the numbers in
//! its table agree with the benchmark results it wrote. Counts and consistency, never timings.

use std::path::Path;

use dinomo_bench::figures::{FigureReport, Scale, run_figure};
use dinomo_bench::project::Projection;
use dinomo_bench::ycsb_run::load_reports;

mod common;
use common::read_json;

fn run(figure: u32, out: &Path) -> anyhow::Result<FigureReport> {
    let report = run_figure(figure, Scale::Tiny, out, &mut |_| {})?;
    assert_eq!(report.figure, figure);
    assert_eq!(report.scale, Scale::Tiny);
    let dir = out.join(format!("figure{figure}"));
    for f in &report.files {
        let path = dir.join(f);
        let len = std::fs::metadata(&path)?.len();
        assert!(len > 0, "{} is empty", path.display());
        if f.ends_with(".svg") {
            let svg = std::fs::read_to_string(&path)?;
            assert!(svg.starts_with("<svg") && svg.contains("<polyline"), "{f}");
        }
    }
    // The JSON summary reads back as written; the Markdown has a row per claim.
    let back: FigureReport = read_json(&dir.join(format!("figure{figure}.json")))?;
    assert_eq!(back, report);
    let md = std::fs::read_to_string(dir.join(format!("figure{figure}.md")))?;
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| ")).count(),
        report.rows.len() + 1,
        "{md}"
    );
    assert!(report.commands[0].starts_with(&format!("dinomo bench figure {figure} --scale tiny")));
    assert!(
        report.commands.len() >= 2,
        "the benchmark commands are listed"
    );
    for r in &report.rows {
        if let (Some(o), Some(p), Some(ratio)) = (r.ours_value, r.paper_value, r.ratio) {
            assert!((ratio - o / p).abs() < 1e-9, "{r:?}");
        }
        if r.ours.starts_with("not built") {
            assert!(r.ours_value.is_none() && r.ratio.is_none(), "{r:?}");
        }
    }
    Ok(report)
}

fn row<'a>(r: &'a FigureReport, starts: &str) -> &'a dinomo_bench::figures::Comparison {
    r.rows
        .iter()
        .find(|c| c.claim.starts_with(starts))
        .unwrap_or_else(|| panic!("no row {starts:?} in {:?}", r.rows))
}

#[test]
fn figure3_caching_policies() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = run(3, dir.path())?;
    let dac: serde_json::Value = read_json(&dir.path().join("figure3/dac.json"))?;
    // Six policies at five cache sizes.
    assert_eq!(dac["cases"].as_array().map(Vec::len), Some(30));
    let worst = row(&r, "DAC / best other policy")
        .ours_value
        .expect("a ratio");
    let min_ratio = dac["dac_versus_best"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["ratio"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(worst, min_ratio);
    assert!(r.not_built.is_empty());
    Ok(())
}

#[test]
fn figure5_scalability_with_projection() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = run(5, dir.path())?;
    let f = dir.path().join("figure5");
    let mut runs = Vec::new();
    for name in r
        .files
        .iter()
        .filter(|n| n.starts_with("ycsb-sweep") && n.ends_with(".json"))
    {
        runs.extend(load_reports(&f.join(name))?);
    }
    // Two workloads on 1 and 2 KV nodes, every operation done and every read verified.
    assert_eq!(runs.len(), 4);
    for run in &runs {
        assert_eq!(run.measured.ops, 300);
        assert_eq!(run.measured.errors.total(), 0, "{:?}", run.measured.errors);
    }
    let paper: Projection = read_json(&f.join("projection-paper.json"))?;
    assert_eq!(paper.series.len(), 2);
    for s in &paper.series {
        assert_eq!(s.points.len(), 16);
        assert_eq!(s.checks.len(), 2);
        assert!(s.points.iter().all(|p| p.predicted_ops_per_s > 0.0));
    }
    assert!(paper.model.starts_with("MODEL"));
    let local: Projection = read_json(&f.join("projection-local.json"))?;
    assert!(local.series.iter().all(|s| s.points.len() == 2));
    assert!(std::fs::read_to_string(f.join("projection-paper.txt"))?.starts_with("MODEL"));
    // Every system of the figure ran the same sweeps, Clover on its compute nodes.
    assert!(r.not_built.is_empty());
    for system in ["dinomo-s", "dinomo-n", "clover"] {
        let sweeps: Vec<&String> = r
            .files
            .iter()
            .filter(|n| n.starts_with(&format!("ycsb-{system}-sweep")) && n.ends_with(".json"))
            .collect();
        assert_eq!(sweeps.len(), 2, "{system}: {:?}", r.files);
        for name in sweeps {
            for run in load_reports(&f.join(name))? {
                assert_eq!(run.system, system);
                assert_eq!(run.measured.errors.total(), 0, "{:?}", run.measured.errors);
            }
        }
    }
    assert!(row(&r, "DINOMO / DINOMO-N").ours_value.is_some());
    // DINOMO / Clover: measured at 2 nodes, and projected to 16 from each system's own runs.
    let measured = row(&r, "DINOMO / Clover throughput at 2 KNs");
    assert!(
        measured
            .ours_value
            .is_some_and(|x| x > 0.0 && x.is_finite()),
        "{measured:?}"
    );
    for claim in [
        "MODEL: DINOMO / Clover throughput at 16 KNs",
        "MODEL: the same, Clover's compute nodes charged",
    ] {
        let m = row(&r, claim);
        assert!(m.ours_value.is_some_and(|x| x > 0.0), "{m:?}");
        assert!(m.ours.contains("Clover by"), "{m:?}");
    }
    assert!(
        row(&r, "Clover / DINOMO round trips")
            .ours
            .contains("RT/op")
    );
    let clover: Projection = read_json(&f.join("projection-paper-clover.json"))?;
    assert_eq!(clover.series.len(), 2);
    for s in &clover.series {
        assert!(s.label.starts_with("clover"), "{}", s.label);
        assert!(s.measured.iter().all(|d| d.compute_on_clients));
        assert!(s.points.iter().all(|p| p.predicted_ops_per_s > 0.0));
    }
    let rt = row(&r, "DINOMO-S / DINOMO round trips").ours_value;
    assert!(
        rt.is_some_and(|x| x > 1.0),
        "{rt:?}: DINOMO-S reads its values remotely"
    );
    assert!(row(&r, "DINOMO-S cache hit ratio").ours_value.is_some());
    let rt = row(&r, "fabric round trips per op")
        .ours_value
        .expect("measured");
    assert!(rt >= 0.0 && rt.is_finite());
    Ok(())
}

#[test]
fn figure6_add_and_remove() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = run(6, dir.path())?;
    for scenario in ["clover-add", "clover-remove"] {
        let v: serde_json::Value =
            read_json(&dir.path().join(format!("figure6/elastic-{scenario}.json")))?;
        assert_eq!(v["values_missing"].as_u64(), Some(0), "{scenario}");
        assert_eq!(v["values_corrupt"].as_u64(), Some(0), "{scenario}");
        assert_eq!(v["values_checked"].as_u64(), Some(2000), "{scenario}");
        assert!(v["baseline_ops_per_s"].as_f64().unwrap() > 0.0);
        // No owners: nothing reconfigured, nothing moved; one compute node more or fewer.
        assert_eq!(v["reconfigurations"].as_array().map(Vec::len), Some(0));
        let (before, after) = (
            v["clover"]["compute_nodes_before"].as_u64().unwrap(),
            v["clover"]["compute_nodes_after"].as_u64().unwrap(),
        );
        assert_eq!(
            after,
            if scenario == "clover-add" {
                before + 1
            } else {
                before - 1
            }
        );
    }
    assert!(
        row(&r, "Clover when a compute node joins")
            .ours_value
            .is_some()
    );
    for scenario in ["add", "remove", "dinomo-n-add", "dinomo-n-remove"] {
        let v: serde_json::Value =
            read_json(&dir.path().join(format!("figure6/elastic-{scenario}.json")))?;
        assert_eq!(v["values_missing"].as_u64(), Some(0), "{scenario}");
        assert_eq!(v["values_corrupt"].as_u64(), Some(0), "{scenario}");
        // Only the shared-nothing system moves data.
        let moved = v["moved_keys"].as_u64().unwrap();
        assert_eq!(
            moved > 0,
            scenario.starts_with("dinomo-n"),
            "{scenario}: {moved}"
        );
        assert!(
            v["baseline_ops_per_s"].as_f64().unwrap() > 0.0,
            "{scenario}"
        );
        assert!(!v["timeline"].as_array().unwrap().is_empty());
        assert_eq!(
            v["reconfigurations"].as_array().map(Vec::len),
            Some(1),
            "{scenario}"
        );
    }
    assert!(row(&r, "what triggers").ours.contains("stand-in"));
    assert!(
        row(&r, "DINOMO-N when a KV node joins")
            .ours
            .contains("moved between partitions")
    );
    assert!(r.not_built.is_empty());
    Ok(())
}

#[test]
fn figure7_selective_replication() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = run(7, dir.path())?;
    let v: serde_json::Value = read_json(&dir.path().join("figure7/elastic-replicate.json"))?;
    let control: serde_json::Value =
        read_json(&dir.path().join("figure7/elastic-replicate-control.json"))?;
    // The four hottest keys became shared: one reconfiguration each; the control run shares nothing.
    assert_eq!(v["reconfigurations"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        control["reconfigurations"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(control["options"]["hot_keys"].as_u64(), Some(0));
    // The tiny scale runs one pair: the gain is that pair's throughput ratio after the event.
    let gain = row(
        &r,
        "throughput with the 4 hottest keys shared / the same run",
    )
    .ours_value
    .unwrap();
    let settled = |v: &serde_json::Value| v["settled_ops_per_s"].as_f64().unwrap();
    assert_eq!(gain, settled(&v) / settled(&control));
    let within = row(&r, "throughput with the 4 hottest keys shared / before")
        .ours_value
        .unwrap();
    assert_eq!(within, v["settled_over_baseline"].as_f64().unwrap());
    // DINOMO-N cannot share keys, and Clover has nothing to share: each named with its reason, not measured.
    assert!(
        row(&r, "DINOMO / DINOMO-N after replication")
            .ours_value
            .is_none()
    );
    assert!(
        row(&r, "Clover with the hot keys replicated")
            .ours
            .starts_with("no meaning")
    );
    // Clover ran the same load on its own; DINOMO after sharing is compared with it.
    let clover: serde_json::Value = read_json(&dir.path().join("figure7/ycsb-clover-zipf2.json"))?;
    let clover_ops = clover["measured"]["ops_per_s"].as_f64().unwrap();
    assert!(clover_ops > 0.0);
    assert_eq!(
        row(&r, "DINOMO / Clover after replication").ours_value,
        Some(settled(&v) / clover_ops)
    );
    assert!(r.not_built.is_empty());
    Ok(())
}

#[test]
fn figure8_failure() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = run(8, dir.path())?;
    let served = row(&r, "kill → every key")
        .ours_value
        .expect("every key served again");
    let handling = row(&r, "failure handling")
        .ours_value
        .expect("the M-node handled it");
    assert!(handling > 0.0 && served >= handling, "{handling} {served}");
    let n: serde_json::Value =
        read_json(&dir.path().join("figure8/elastic-dinomo-n-failure.json"))?;
    assert!(n["moved_keys"].as_u64().unwrap() > 0);
    assert_eq!(n["values_missing"].as_u64(), Some(0));
    let moving = row(&r, "DINOMO-N on the same failure")
        .ours_value
        .expect("measured");
    assert_eq!(moving, n["move_ms"].as_f64().unwrap());
    // Clover: the dead compute node's clients stopped inside a write each; the metadata server took their grants
    // back, every key they were writing reads back, and so does every record.
    let c: serde_json::Value = read_json(&dir.path().join("figure8/elastic-clover-failure.json"))?;
    let crashed = c["clover"]["clients_changed"].as_u64().unwrap();
    let interrupted: u64 = c["clover"]["interrupted_writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert!(crashed >= 1 && interrupted == crashed, "{c}");
    assert!(c["clover"]["reclaimed_slots"].as_u64().unwrap() > 0);
    assert!(c["all_keys_served_after_ms"].as_f64().is_some());
    assert_eq!(c["values_missing"].as_u64(), Some(0));
    assert_eq!(c["values_corrupt"].as_u64(), Some(0));
    assert!(
        row(&r, "Clover on the same failure: recovery work")
            .ours_value
            .is_some()
    );
    assert!(r.not_built.is_empty());
    Ok(())
}
