//! A process writing at full speed is SIGKILLed at random moments; after each restart every acknowledged write
//! reads back with its last acknowledged value (or the one write per key that was in flight), and no torn value is
//! ever returned; with the memory node's index shared, and partitioned per KV node (DINOMO-N's layout), and with the
//! log cleaner moving every live entry it can while the writers write.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dinomo_dpm::Partitioning;
use dinomo_kn::{Embedded, EmbeddedConfig};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;

const WRITERS: u32 = 4;
const KEYS_PER_WRITER: u32 = 64;
/// Where the child finds the layout to open its pool with ("per-node" or "shared").
const LAYOUT_VAR: &str = "DINOMO_KN_CRASH_LAYOUT";
/// Set for a child whose log cleaner works all the time on every segment.
const CLEAN_VAR: &str = "DINOMO_KN_CRASH_CLEAN";

fn config(path: &Path, partitioning: Partitioning, clean_always: bool) -> EmbeddedConfig {
    let mut cfg = common::small_file_store(path, 64 << 20, 2);
    cfg.processor.partitioning = partitioning;
    if clean_always {
        cfg.processor.clean_below_free_percent = 100;
        cfg.processor.clean_max_live_percent = 100;
    }
    cfg
}

fn key(writer: u32, i: u32) -> Vec<u8> {
    format!("w{writer}-k{i}").into_bytes()
}

/// A value that names its key and version and whose every byte follows from them, so a torn or mixed value
/// cannot pass `decode`.
fn value(key: &[u8], version: u64) -> Vec<u8> {
    let len = 16 + (version as usize * 37 + key.len() * 11) % 900;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    let seed = dinomo_log::key_hash(key) ^ version;
    v.extend((16..len).map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ i as u8));
    v
}

fn decode(key: &[u8], v: &[u8]) -> Option<u64> {
    let version = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    (value(key, version) == v).then_some(version)
}

/// Child: write at full speed (for at most a minute), printing "writer key version" after each acknowledgement.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var("DINOMO_KN_CRASH_CHILD") else {
        return;
    };
    let partitioning = match std::env::var(LAYOUT_VAR).as_deref() {
        Ok("per-node") => Partitioning::PerNode,
        _ => Partitioning::Shared,
    };
    let clean_always = std::env::var_os(CLEAN_VAR).is_some();
    let store =
        Embedded::open(&config(Path::new(&path), partitioning, clean_always)).expect("open store");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let h = store.handle();
            let out = out.clone();
            std::thread::spawn(move || {
                let mut versions: Vec<u64> = (0..KEYS_PER_WRITER)
                    .map(|i| {
                        let k = key(w, i);
                        h.get(&k)
                            .unwrap()
                            .map_or(0, |v| decode(&k, &v).expect("recovered value is whole"))
                    })
                    .collect();
                let mut i = 0;
                // Killed long before this; the bound only keeps an orphaned child from running on.
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    let k = key(w, i);
                    let version = versions[i as usize] + 1;
                    h.set(&k, &value(&k, version)).unwrap();
                    versions[i as usize] = version;
                    writeln!(out.lock().unwrap(), "{w} {i} {version}").unwrap();
                    i = (i + 1) % KEYS_PER_WRITER;
                }
            })
        })
        .collect();
    writeln!(out.lock().unwrap(), "ready").unwrap();
    for t in threads {
        let _ = t.join();
    }
}

/// Acknowledgements a child must have printed before the parent picks its moment to kill it.
const ACKS_BEFORE_KILL: usize = 20;

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write() -> anyhow::Result<()> {
    kill_and_check(Partitioning::Shared, 20, false)
}

#[test]
fn sigkill_with_the_index_partitioned_per_node_loses_no_acknowledged_write() -> anyhow::Result<()> {
    kill_and_check(Partitioning::PerNode, 8, false)
}

/// The cleaner copies entries and moves index slots under the writers (every merged segment qualifies, all the
/// time): a kill in the middle of a move loses nothing either, and each crash image checks clean.
#[test]
fn sigkill_while_the_cleaner_moves_entries_loses_no_acknowledged_write() -> anyhow::Result<()> {
    kill_and_check(Partitioning::Shared, 8, true)
}

#[test]
fn sigkill_while_the_cleaner_moves_entries_between_partitioned_logs_loses_no_acknowledged_write()
-> anyhow::Result<()> {
    kill_and_check(Partitioning::PerNode, 4, true)
}

fn kill_and_check(
    partitioning: Partitioning,
    rounds: usize,
    clean_always: bool,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("crash.pool");
    let layout = match partitioning {
        Partitioning::Shared => "shared",
        Partitioning::PerNode => "per-node",
    };
    let mut rng = StdRng::seed_from_u64(0xd170);
    // Last acknowledged version per (writer, key).
    let mut acked: HashMap<(u32, u32), u64> = HashMap::new();
    let mut total_acks = 0u64;
    // Entries in the relocation logs of the last crash image.
    let mut relocated = 0u64;
    for round in 0..rounds {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env("DINOMO_KN_CRASH_CHILD", &path)
            .env(LAYOUT_VAR, layout)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if clean_always {
            command.env(CLEAN_VAR, "1");
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until it serves and has acknowledged a few writes (on a loaded machine a child may get little CPU
        // time), then let it write for a random while. The acknowledgements that come first count like the rest.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut early = Vec::new();
        let mut ready = false;
        while !ready || early.len() < ACKS_BEFORE_KILL {
            let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))?;
            if line.ends_with("ready") {
                ready = true;
            } else {
                early.push(line);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(5..120)));
        child.kill()?;
        child.wait()?;
        reader.join().expect("reader thread");
        for line in early.into_iter().chain(rx.try_iter()) {
            let mut f = line.split(' ').map(str::parse::<u64>);
            let (Some(Ok(w)), Some(Ok(i)), Some(Ok(v))) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let e = acked.entry((w as u32, i as u32)).or_default();
            *e = (*e).max(v);
            total_acks += 1;
        }

        if clean_always {
            let (pool, opened) = dinomo_pool::Pool::open_snapshot(&path)?;
            assert!(
                !opened.was_clean,
                "round {round}: the kill left a clean pool"
            );
            let report = dinomo_dpm::check::check_pool(
                &Arc::new(pool),
                &dinomo_dpm::check::CheckOptions {
                    crashed: true,
                    ..Default::default()
                },
            );
            assert!(report.is_clean(), "round {round}: {:?}", report.problems);
            relocated = report
                .logs
                .iter()
                .filter(|l| l.thread == dinomo_dpm::CLEANER_THREAD)
                .map(|l| l.entries)
                .sum();
        }
        let store = Embedded::open(&config(&path, partitioning, clean_always))?;
        let h = store.handle();
        for w in 0..WRITERS {
            for i in 0..KEYS_PER_WRITER {
                let k = key(w, i);
                let last = acked.get(&(w, i)).copied().unwrap_or(0);
                match h.get(&k)? {
                    None => assert_eq!(
                        last, 0,
                        "round {round}: acknowledged key {k:?} (version {last}) is gone"
                    ),
                    Some(v) => {
                        let Some(version) = decode(&k, &v) else {
                            panic!("round {round}: torn value for {k:?}: {} bytes", v.len())
                        };
                        assert!(
                            version == last || version == last + 1,
                            "round {round}: {k:?} has version {version}, last acknowledged {last}"
                        );
                        // The in-flight write that landed is what the next child continues from.
                        acked.insert((w, i), version);
                    }
                }
            }
        }
        let stats = store.processor_stats();
        assert_eq!(
            stats.backlog_segments, 0,
            "recovery merged everything: {stats:?}"
        );
        assert_eq!(store.processor().partitioning(), partitioning);
    }
    assert!(
        total_acks > rounds as u64 * 10,
        "the children wrote too little to test anything: {total_acks}"
    );
    assert!(
        !clean_always || relocated > 0,
        "the cleaner moved nothing, so the kills tested nothing of it"
    );
    Ok(())
}
