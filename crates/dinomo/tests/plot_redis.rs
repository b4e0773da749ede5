//! `dinomo bench plot-redis` as a process: it draws the results file of `scripts/bench-redis`, refuses a malformed
//! one with the line at fault and writes nothing, and the figures in `docs/results` are what it draws from the
//! results files beside them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn plot(csv: &Path, svg: &Path) -> anyhow::Result<(bool, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(["bench", "plot-redis"])
        .arg(csv)
        .arg("--out")
        .arg(svg)
        .output()?;
    Ok((out.status.success(), String::from_utf8(out.stderr)?))
}

const HEADER: &str = dinomo_bench::REDIS_CSV_HEADER;

#[test]
fn draws_a_results_file_and_refuses_a_malformed_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let csv = dir.path().join("redis.csv");
    std::fs::write(
        &csv,
        format!(
            "# title: test run\n{HEADER}\nGET,1,90000,100000,0.4,0.3,11.0,9.5\nSET,16,150000,100000,3,4,6,6\n"
        ),
    )?;
    let svg = dir.path().join("out/redis.svg");
    let (ok, err) = plot(&csv, &svg)?;
    assert!(ok, "{err}");
    let drawn = std::fs::read_to_string(&svg)?;
    assert!(drawn.starts_with("<svg") && drawn.contains("GET P1") && drawn.contains("SET P16"));
    // The ratios, each beside its target.
    assert!(drawn.contains(">0.90<") && drawn.contains(">1.50<"));
    assert!(drawn.contains(">test run<"));

    std::fs::write(
        &csv,
        format!("{HEADER}\nGET,1,90000,lots,0.4,0.3,11.0,9.5\n"),
    )?;
    let bad = dir.path().join("bad.svg");
    let (ok, err) = plot(&csv, &bad)?;
    assert!(!ok);
    assert!(
        err.contains("line 2") && err.contains("field 4 is not a number"),
        "{err}"
    );
    assert!(!bad.exists());

    let (ok, err) = plot(&dir.path().join("missing.csv"), &bad)?;
    assert!(!ok && err.contains("missing.csv"), "{err}");
    Ok(())
}

#[test]
fn the_committed_figures_are_drawn_from_their_results_files() -> anyhow::Result<()> {
    let results = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/results");
    let dir = tempfile::tempdir()?;
    let mut seen = 0;
    for entry in std::fs::read_dir(&results)? {
        let csv = entry?.path();
        let name = csv.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("redis-") && name.ends_with(".csv")) {
            continue;
        }
        let out = dir.path().join(name.replace(".csv", ".svg"));
        let (ok, err) = plot(&csv, &out)?;
        assert!(ok, "{name}: {err}");
        let committed = std::fs::read_to_string(csv.with_extension("svg"))?;
        assert_eq!(
            std::fs::read_to_string(&out)?,
            committed,
            "docs/results/{name}: its figure is not what `dinomo bench plot-redis` draws from it"
        );
        seen += 1;
    }
    assert_eq!(seen, 2, "the 2-core and 16-core comparisons");
    Ok(())
}
