//! A process storing cluster records is killed at random moments; every reopen finds a whole record, never older
//! than the last acknowledged store, and no leaked allocations.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use std::sync::Arc;
use std::time::{Duration, Instant};

use dinomo_meta::{CLUSTER_META_TAG, EmbeddedMeta, MetaConfig, MetaStore};
use dinomo_pool::{PersistMode, Pool, PoolOptions};

const CHILD_ENV: &str = "DINOMO_META_CRASH_CHILD";
const ROUNDS: u64 = 6;

/// The record written on top of version `prev`: `prev`, then a length and pattern derived from it.
fn value(prev: u64) -> Vec<u8> {
    let len = (prev.wrapping_mul(7919) % 150_000) as usize;
    let mut v = prev.to_le_bytes().to_vec();
    v.extend((0..len).map(|i| (i as u64 ^ prev) as u8));
    v
}

/// The version a record was written on top of, if the record is whole.
fn decode(v: &[u8]) -> Option<u64> {
    let prev = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    (value(prev) == v).then_some(prev)
}

fn open(path: &Path) -> (Arc<Pool>, Arc<EmbeddedMeta>) {
    let pool = if path.exists() {
        Pool::open(path, PersistMode::Volatile)
            .expect("open pool")
            .0
    } else {
        Pool::create(
            path,
            &PoolOptions {
                size: 4 << 20,
                segment_size: 64 << 10,
                persist: PersistMode::Volatile,
            },
        )
        .expect("create pool")
    };
    let pool = Arc::new(pool);
    let meta = EmbeddedMeta::open(pool.clone(), MetaConfig::default()).expect("open meta");
    (pool, meta)
}

/// Child: store at full speed (for at most a minute), printing each acknowledged version.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (_pool, meta) = open(Path::new(&path));
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    // Killed long before this; the bound only keeps an orphaned child from running on.
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let current = meta.load().unwrap();
        let prev = current.as_ref().map_or(0, |r| r.version);
        if let Some(r) = &current {
            assert!(decode(&r.value).is_some(), "the record is whole");
        }
        let v = meta
            .store(current.map(|r| r.version), &value(prev))
            .unwrap();
        writeln!(out, "{v}").unwrap();
    }
}

#[test]
fn sigkill_at_random_moments_keeps_a_whole_record() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("meta.pool");
    let mut acked = 0u64;
    let mut seed = 0x5eed_u64;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
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
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))?;
            if line.ends_with("ready") {
                break;
            }
        }
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(10 + (seed >> 33) % 90));
        child.kill()?;
        child.wait()?;
        reader.join().expect("reader thread");
        let mut stores = 0;
        for line in rx.try_iter() {
            if let Ok(v) = line.trim().parse::<u64>() {
                anyhow::ensure!(v > acked, "acknowledged versions increase");
                acked = v;
                stores += 1;
            }
        }
        let (pool, meta) = open(&path);
        let record = meta.load()?;
        let record = match record {
            Some(r) => r,
            None if acked == 0 => continue,
            None => {
                anyhow::bail!("round {round}: the record vanished after {acked} was acknowledged")
            }
        };
        anyhow::ensure!(
            record.version >= acked,
            "round {round}: recovered version {} is older than acknowledged {acked}",
            record.version
        );
        let prev = decode(&record.value)
            .ok_or_else(|| anyhow::anyhow!("round {round}: recovered record is not whole"))?;
        anyhow::ensure!(prev < record.version);
        let tagged = pool
            .allocated()
            .iter()
            .filter(|e| e.tag == CLUSTER_META_TAG)
            .count();
        anyhow::ensure!(
            tagged <= 3,
            "round {round}: {tagged} allocations after recovery"
        );
        eprintln!(
            "round {round}: {stores} stores, recovered version {}",
            record.version
        );
        acked = record.version;
    }
    anyhow::ensure!(acked > 0, "the child never stored anything");
    Ok(())
}
