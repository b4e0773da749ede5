//! `dinomo check` as a process: a clean report and exit 0 on an intact pool file, the damage and exit 1 on a damaged
//! one, exit 2 on a file it cannot read or one a memory node holds; the file never changes.

use std::path::Path;
use std::process::{Command, Output};

use dinomo_dpm::ProcessorConfig;
use dinomo_kn::{Embedded, EmbeddedConfig, KnConfig};

const KEYS: u32 = 500;

fn config(path: &Path) -> EmbeddedConfig {
    EmbeddedConfig {
        pool_path: Some(path.to_path_buf()),
        pool_size: 16 << 20,
        pool_segment_size: 64 << 10,
        processor: ProcessorConfig {
            segment_size: 64 << 10,
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

#[test]
fn check_reports_intact_and_damaged_pools_and_changes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pool");
    {
        let store = Embedded::open(&config(&path))?;
        let h = store.handle();
        for i in 0..KEYS {
            h.set(
                format!("key{i}").as_bytes(),
                format!("value-{i:05}").as_bytes(),
            )?;
        }
    }
    let intact = std::fs::read(&path)?;

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
    let mut damaged = intact.clone();
    let at = intact
        .windows(11)
        .position(|w| w == b"value-00042")
        .expect("the value is in the file");
    damaged[at + 10] ^= 1;
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
