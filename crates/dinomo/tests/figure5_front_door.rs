//! `dinomo bench figure 5 --front-door resp` at the tiny scale: DINOMO and Clover each started as `dinomo up`
//! child processes and driven through the Redis protocol by the same clients; the report's shape, and that every
//! run completed without an error and read back what it wrote.

use std::collections::BTreeSet;
use std::time::Duration;

use dinomo_bench::figures::{FRONT_DOOR_FOLDER, FigureReport, Scale};
use dinomo_bench::ycsb_run::YcsbSweep;

mod common;

#[test]
fn dinomo_and_clover_behind_the_same_front_door() -> anyhow::Result<()> {
    let out = tempfile::tempdir()?;
    let args: Vec<String> = [
        "bench",
        "figure",
        "5",
        "--front-door",
        "resp",
        "--scale",
        "tiny",
        "--out",
        out.path().to_str().expect("utf-8 path"),
    ]
    .map(String::from)
    .to_vec();
    let run = common::run(
        env!("CARGO_BIN_EXE_dinomo"),
        &args,
        Duration::from_secs(240),
    )?;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let dir = out.path().join(FRONT_DOOR_FOLDER);
    let report: FigureReport =
        serde_json::from_str(&std::fs::read_to_string(dir.join("figure5.json"))?)?;
    assert_eq!((report.figure, report.scale), (5, Scale::Tiny));
    assert!(report.commands[0].contains("--front-door resp"));
    // The ratio at the largest count is measured, and both systems' round trips were read through INFO fabric.
    let ratio = &report.rows[0];
    assert!(
        ratio
            .claim
            .starts_with("DINOMO / Clover throughput at 2 KNs")
    );
    assert!(ratio.ours_value.is_some_and(|r| r > 0.0), "{ratio:?}");
    let round_trips = report
        .rows
        .iter()
        .find(|r| r.claim.starts_with("Clover / DINOMO fabric round trips"))
        .expect("a round-trip row");
    assert!(round_trips.ours_value.is_some(), "{round_trips:?}");
    for file in ["figure5.md", "throughput.svg", "throughput.csv"] {
        assert!(report.files.iter().any(|f| f == file), "{file}");
        assert!(dir.join(file).exists(), "{file}");
    }
    // The data directories are gone.
    assert!(!dir.join("data").exists());

    // Every system, node count and workload ran, cleanly.
    let mut seen = BTreeSet::new();
    for file in report
        .files
        .iter()
        .filter(|f| f.starts_with("ycsb-") && f.ends_with(".json"))
    {
        let sweep: YcsbSweep = serde_json::from_str(&std::fs::read_to_string(dir.join(file))?)?;
        for r in sweep.runs {
            let what = format!("{} {} {:?}", r.system, r.options.workload, r.kv_nodes);
            assert_eq!(r.target, "resp", "{what}");
            assert_eq!(
                r.measured.errors.total(),
                0,
                "{what}: {:?}",
                r.measured.errors
            );
            assert_eq!(r.load.as_ref().map(|l| l.records), Some(300), "{what}");
            assert!(r.measured.ops > 0 && r.measured.ops <= 400, "{what}");
            assert!(r.measured.reads_verified > 0, "{what}");
            let fabric = r.server_fabric.as_ref().expect("INFO fabric");
            assert!(fabric.round_trips > 0, "{what}");
            seen.insert((r.system, r.options.workload.to_string(), r.kv_nodes));
        }
    }
    let expected: BTreeSet<_> = ["dinomo", "clover"]
        .into_iter()
        .flat_map(|s| {
            ["c", "a"].into_iter().flat_map(move |w| {
                [1, 2]
                    .into_iter()
                    .map(move |n| (s.to_string(), w.to_string(), Some(n)))
            })
        })
        .collect();
    assert_eq!(seen, expected);
    Ok(())
}
