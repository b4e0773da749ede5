//! `dinomo check` as a process: a clean report and exit 0 on an intact pool file, the damage and exit 1 on a damaged
//! one, exit 2 on a file it cannot read or one a memory node holds; the file never changes. A write a crash cut
//! short is counted, not reported. `--repair` mends a damaged value's pool in place.

use std::path::Path;
use std::process::{Command, Output};

use dinomo_dpm::{Partitioning, ProcessorConfig};
use dinomo_kn::{Embedded, EmbeddedConfig, KnConfig};

const KEYS: u32 = 500;

fn config(path: &Path) -> EmbeddedConfig {
    config_in(path, Partitioning::Shared)
}

fn config_in(path: &Path, partitioning: Partitioning) -> EmbeddedConfig {
    EmbeddedConfig {
        pool_path: Some(path.to_path_buf()),
        pool_size: 16 << 20,
        pool_segment_size: 64 << 10,
        processor: ProcessorConfig {
            segment_size: 64 << 10,
            partitioning,
            ..ProcessorConfig::default()
        },
        kn: KnConfig {
            threads: 2,
            max_value_len: 4096,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    }
}

fn check(path: &Path, extra: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .arg("check")
        .arg("--pool")
        .arg(path)
        .args(extra)
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

fn value(i: u32) -> Vec<u8> {
    format!("value-{i:05}").into_bytes()
}

/// A pool file at `path` holding [`KEYS`] keys, closed cleanly; its bytes.
fn written_pool(path: &Path, partitioning: Partitioning) -> anyhow::Result<Vec<u8>> {
    {
        let store = Embedded::open(&config_in(path, partitioning))?;
        let h = store.handle();
        for i in 0..KEYS {
            h.set(format!("key{i}").as_bytes(), &value(i))?;
        }
    }
    Ok(std::fs::read(path)?)
}

/// `intact` with a byte of key42's value flipped: the index names an entry that fails its checksum.
fn with_value_42_damaged(intact: &[u8]) -> Vec<u8> {
    let mut damaged = intact.to_vec();
    let at = intact
        .windows(11)
        .position(|w| w == b"value-00042")
        .expect("the value is in the file");
    damaged[at + 10] ^= 1;
    damaged
}

#[test]
fn check_reports_intact_and_damaged_pools_and_changes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    let intact = written_pool(&path, Partitioning::Shared)?;

    let (code, out, err) = check(&path, &[])?;
    anyhow::ensure!(code == 0, "exit {code}: {out}{err}");
    anyhow::ensure!(
        out.contains(&format!("index: {KEYS} keys")) && out.contains("no damage found"),
        "{out}"
    );
    anyhow::ensure!(
        out.contains(&format!("holds {KEYS} keys")),
        "the trial start: {out}"
    );
    let (code, out, _) = check(&path, &["--json"])?;
    anyhow::ensure!(code == 0);
    let json: serde_json::Value = serde_json::from_str(&out)?;
    anyhow::ensure!(json["clean"] == true, "{json}");
    anyhow::ensure!(json["data_plane"]["indexes"][0]["keys"] == KEYS, "{json}");
    anyhow::ensure!(json["recovery"]["keys"] == KEYS, "{json}");
    anyhow::ensure!(
        std::fs::read(&path)? == intact,
        "the check changed the file"
    );

    // A memory node holds the file.
    {
        let _store = Embedded::open(&config(&path))?;
        let (code, _, err) = check(&path, &[])?;
        anyhow::ensure!(code == 2 && err.contains("locked"), "exit {code}: {err}");
    }
    let intact = std::fs::read(&path)?;

    // A value's byte flipped: the index names an entry that fails its checksum.
    let damaged = with_value_42_damaged(&intact);
    let bad = dir.path().join("damaged");
    std::fs::write(&bad, &damaged)?;
    let (code, out, err) = check(&bad, &[])?;
    anyhow::ensure!(code == 1, "exit {code}: {out}{err}");
    anyhow::ensure!(
        out.contains("problems (2):")
            && out.contains("fails its check: entry checksum mismatch")
            && out.contains("hold no valid entry")
            && out.contains("the pool is damaged"),
        "{out}"
    );
    anyhow::ensure!(
        std::fs::read(&bad)? == damaged,
        "the check changed the file"
    );

    // A flipped bit in a segment's sealed length: damage, which a start repairs.
    let mut damaged = intact.clone();
    let segment = intact
        .windows(8)
        .position(|w| w == dinomo_log::segment::SEGMENT_MAGIC)
        .expect("a log segment is in the file");
    damaged[segment + dinomo_log::segment::field::SEALED_LEN as usize] ^= 0x08;
    std::fs::write(&bad, &damaged)?;
    let (code, out, err) = check(&bad, &[])?;
    anyhow::ensure!(code == 1, "exit {code}: {out}{err}");
    anyhow::ensure!(
        out.contains(&format!(
            "segment at {segment:#x}: its sealed length is damaged"
        )) && out.contains("seals again 1 segments whose sealed length is damaged")
            && out.contains(&format!("holds {KEYS} keys")),
        "{out}"
    );

    // The superblock's checksum fails.
    let mut damaged = intact.clone();
    damaged[100] ^= 0x10;
    std::fs::write(&bad, &damaged)?;
    let (code, out, _) = check(&bad, &[])?;
    anyhow::ensure!(
        code == 1 && out.contains("corrupt superblock"),
        "exit {code}: {out}"
    );

    // A flipped bit in the format version: damage, not a format this build cannot read.
    let mut damaged = intact.clone();
    damaged[8] ^= 0x04;
    std::fs::write(&bad, &damaged)?;
    let (code, out, _) = check(&bad, &[])?;
    anyhow::ensure!(
        code == 1 && out.contains("corrupt superblock") && out.contains("version field reads 5"),
        "exit {code}: {out}"
    );

    // Not a pool file; no file.
    std::fs::write(&bad, b"hello")?;
    let (code, _, err) = check(&bad, &[])?;
    anyhow::ensure!(
        code == 2 && err.contains("not a dinomo pool file"),
        "exit {code}: {err}"
    );
    let (code, _, err) = check(&dir.path().join("missing"), &[])?;
    anyhow::ensure!(
        code == 2 && err.contains("cannot check"),
        "exit {code}: {err}"
    );
    Ok(())
}

/// `--repair` mends a pool whose stored value was damaged: the index slot naming the damaged entry goes (its key
/// reads as absent, where every read of it was refused), the segment holding the damage is emptied, and the check
/// after, and a check run afterwards, find nothing; every other key reads back. On an intact pool it changes
/// nothing.
#[test]
fn repair_removes_what_names_damage_and_keeps_everything_else() -> anyhow::Result<()> {
    repair_in(Partitioning::Shared)
}

/// The same with an index partition per KV node (DINOMO-N).
#[test]
fn repair_finds_the_partition_that_names_damage() -> anyhow::Result<()> {
    repair_in(Partitioning::PerNode)
}

fn repair_in(partitioning: Partitioning) -> anyhow::Result<()> {
    let config = |path: &Path| config_in(path, partitioning);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    let intact = written_pool(&path, partitioning)?;
    let (code, out, err) = check(&path, &["--repair"])?;
    anyhow::ensure!(
        code == 0 && out.contains("no damage found") && !out.contains("repair:"),
        "exit {code}: {out}{err}"
    );
    anyhow::ensure!(
        std::fs::read(&path)? == intact,
        "a repair of an intact pool changed the file"
    );

    let damaged = with_value_42_damaged(&intact);
    std::fs::write(&path, &damaged)?;
    {
        let store = Embedded::open(&config(&path))?;
        anyhow::ensure!(
            store.handle().get(b"key42").is_err(),
            "a damaged value was served"
        );
    }
    let (code, out, err) = check(&path, &["--repair"])?;
    anyhow::ensure!(code == 0, "exit {code}: {out}{err}");
    anyhow::ensure!(
        out.contains("the pool is damaged")
            && out.contains("1 index slots naming damaged entries were removed")
            && out.contains("1 log segments with damaged stretches were emptied")
            && out.trim_end().ends_with("no damage found"),
        "{out}"
    );
    let (code, out, err) = check(&path, &[])?;
    anyhow::ensure!(
        code == 0 && out.contains("no damage found"),
        "exit {code}: {out}{err}"
    );
    // The same repair, reported as JSON.
    let copy = dir.path().join("copy");
    std::fs::write(&copy, &damaged)?;
    let (code, out, err) = check(&copy, &["--repair", "--json"])?;
    anyhow::ensure!(code == 0, "exit {code}: {out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out)?;
    anyhow::ensure!(json["check"]["clean"] == false, "{json}");
    anyhow::ensure!(
        json["repair"]["removed_slots"].as_array().map(Vec::len) == Some(1)
            && json["repair"]["emptied_segments"] == 1
            && json["repair"]["after"]["problem_count"] == 0,
        "{json}"
    );
    let store = Embedded::open(&config(&path))?;
    let h = store.handle();
    for i in 0..KEYS {
        let want = (i != 42).then(|| value(i));
        anyhow::ensure!(h.get(format!("key{i}").as_bytes())? == want, "key{i}");
    }
    Ok(())
}

#[path = "../../kn/tests/common/mod.rs"]
mod kn_common;

/// A memory node killed in the middle of a log write leaves a hole in the open segment, with entries of the same
/// write after it. In a pool not closed cleanly (here, a copy taken while its store runs) the check counts it as a
/// write cut short and passes; nothing was acknowledged there.
#[test]
fn check_counts_a_write_cut_short_in_a_pool_not_closed_cleanly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let live = dir.path().join("live");
    let image = dir.path().join("crash");
    {
        let store = Embedded::open(&config(&live))?;
        let h = store.handle();
        for i in 0..KEYS {
            h.set(format!("key{i}").as_bytes(), b"value")?;
        }
        // Once every sealed segment is merged nothing changes the file: the copy is what a crash would leave.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.processor_stats().backlog_segments > 0 {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "merges did not catch up"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::fs::copy(&live, &image)?;
    }
    let logs: Vec<u32> = {
        let pool = std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(&image)?.0);
        let report = dinomo_dpm::check::check_pool(&pool, &Default::default());
        report.logs.iter().map(|l| l.log).collect()
    };
    let cut = dir.path().join("cut");
    let mut cut_len = None;
    for log in logs {
        cut_len = kn_common::with_write_cut_short(&image, &cut, log)?;
        if cut_len.is_some() {
            break;
        }
    }
    let cut_len = cut_len.ok_or_else(|| anyhow::anyhow!("no open segment had room"))?;
    let (code, out, err) = check(&cut, &[])?;
    anyhow::ensure!(
        code == 0
            && out.contains("not closed cleanly")
            && out.contains(&format!(
                "{cut_len} bytes in open segments hold no valid entry past the merged ones"
            ))
            && out.contains("no damage found"),
        "exit {code}: {out}{err}"
    );
    Ok(())
}
