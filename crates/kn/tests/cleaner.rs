//! The log cleaner: segments that a few live entries hold on to are emptied and recycled, so a store whose live
//! data is a fraction of its pool keeps taking writes for as long as it is written; what it moved reads back, after
//! a restart too, and the pool checks clean.

use std::collections::BTreeMap;
use std::path::Path;

use dinomo_dpm::CLEANER_THREAD;
use dinomo_dpm::check::{CheckOptions, PoolCheck, check_pool};
use dinomo_kn::{Embedded, EmbeddedConfig, KnError};

mod common;

/// 64 segments of 64 KiB.
const POOL: u64 = 4 << 20;
/// Keys overwritten all the time.
const HOT: u32 = 16;
/// Writes of hot keys after each new cold key (a cold key is written once, and stays live).
const HOT_PER_COLD: u32 = 15;
/// Cold keys: about 1.2 MiB of live entries, under a third of the pool. The writes add up to about five pools.
const COLD: u32 = 4000;

fn config(path: &Path, clean: bool) -> EmbeddedConfig {
    let mut cfg = common::small_file_store(path, POOL, 1);
    if !clean {
        cfg.processor.clean_below_free_percent = 0;
        cfg.processor.clean_max_live_percent = 0;
    }
    cfg
}

fn value(key: &str, version: u32) -> Vec<u8> {
    let mut v = format!("{key}={version};").into_bytes();
    v.resize(256, b'0' + (version % 10) as u8);
    v
}

/// Writes the cold keys in order, each followed by `HOT_PER_COLD` writes of the hot keys, until the store refuses
/// one. Returns the last value written of every key, and the refusal if there was one.
fn write_cold_among_hot(store: &Embedded) -> (BTreeMap<String, Vec<u8>>, Option<KnError>) {
    let h = store.handle();
    let mut last = BTreeMap::new();
    let mut hot_writes = 0u32;
    for c in 0..COLD {
        let mut writes = vec![(format!("cold-{c}"), value("cold", c))];
        for _ in 0..HOT_PER_COLD {
            let k = format!("hot-{}", hot_writes % HOT);
            writes.push((k.clone(), value(&k, hot_writes)));
            hot_writes += 1;
        }
        for (k, v) in writes {
            if let Err(e) = h.set(k.as_bytes(), &v) {
                return (last, Some(e));
            }
            last.insert(k, v);
        }
    }
    (last, None)
}

/// The keys of `last` that `store` reads as something other than their last write.
fn wrong_keys(store: &Embedded, last: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<Vec<String>> {
    let h = store.handle();
    let mut wrong = Vec::new();
    for (k, v) in last {
        if h.get(k.as_bytes())?.as_ref() != Some(v) {
            wrong.push(k.clone());
        }
    }
    Ok(wrong)
}

#[test]
fn segments_held_by_a_few_live_entries_are_cleaned_and_the_store_keeps_taking_writes()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;

    // Without the cleaner, the cold keys spread over every segment keep them all: the pool fills with dead entries.
    let path = dir.path().join("uncleaned.pool");
    {
        let store = Embedded::open(&config(&path, false))?;
        let (_, refused) = write_cold_among_hot(&store);
        assert!(
            matches!(refused, Some(KnError::OutOfSpace(_))),
            "without cleaning the pool should fill up: {refused:?}"
        );
        assert_eq!(store.processor_stats().cleaned_segments, 0);
    }

    let path = dir.path().join("cleaned.pool");
    let last = {
        let store = Embedded::open(&config(&path, true))?;
        let (last, refused) = write_cold_among_hot(&store);
        assert!(refused.is_none(), "a write was refused: {refused:?}");
        let stats = store.processor_stats();
        assert!(
            stats.cleaned_segments > 0 && stats.relocated_entries > 0,
            "{stats:?}"
        );
        assert!(
            stats.relocated_bytes >= stats.relocated_entries * 256,
            "{stats:?}"
        );
        assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
        last
    };

    // The checker finds the relocation log, its copies named by the index, and nothing wrong.
    let report = check_pool(
        &std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(&path)?.0),
        &CheckOptions::default(),
    );
    assert!(report.is_clean(), "{:?}", report.problems);
    let relocation: u64 = report
        .logs
        .iter()
        .filter(|l| l.thread == CLEANER_THREAD)
        .map(|l| l.entries)
        .sum();
    assert!(relocation > 0, "no relocation log in {:?}", report.logs);
    assert_eq!(
        report.indexes.iter().map(|i| i.keys).sum::<u64>(),
        last.len() as u64
    );

    // A restart serves every key as its last write, and the store keeps taking writes.
    let store = Embedded::open(&config(&path, true))?;
    assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    let (last, refused) = write_cold_among_hot(&store);
    assert!(
        refused.is_none(),
        "a write was refused after the restart: {refused:?}"
    );
    assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    Ok(())
}

#[test]
fn a_kv_node_cannot_claim_the_relocation_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Embedded::open(&config(&dir.path().join("claim.pool"), true))?;
    let mut ep = dinomo_fabric::Connector::new(dinomo_fabric::Target::InProcess(
        store.memory_node().clone(),
    ))
    .connect()?;
    let err = ep
        .call::<_, dinomo_dpm::proto::LogOpened>(
            dinomo_dpm::proto::OPEN_LOG,
            &dinomo_dpm::proto::OpenLog {
                node_id: 1,
                thread: CLEANER_THREAD,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("no KV node may claim it"), "{err}");
    Ok(())
}

/// The cleaner thread can fall behind the writers (starved of CPU on a loaded machine): the pool fills, and each
/// grant that finds it full cleans only until one segment is free. An index table that must double then needs more
/// free segments than that; making its run cleans until they are free instead of refusing the write. The cleaner
/// thread is kept idle here (it cleans only below 0% free), so every cleaning is one a writer asked for.
#[test]
fn with_the_cleaner_thread_behind_a_growing_index_table_still_gets_its_room() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("starved.pool");
    let mut cfg = config(&path, true);
    cfg.processor.clean_below_free_percent = 0;
    let store = Embedded::open(&cfg)?;
    let (last, refused) = write_cold_among_hot(&store);
    assert!(refused.is_none(), "a write was refused: {refused:?}");
    assert!(
        store.processor_stats().relocated_entries > 0,
        "nothing was cleaned: the workload never filled the pool"
    );
    assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    Ok(())
}

/// A store whose log segments were recycled for a while has its free space in pieces between them. An index table
/// that doubles needs one contiguous run: with twice its size free in pieces it could not grow, and every new key
/// was refused. The cleaner now empties a run of merged log segments for it (copying their live entries away) and
/// the table grows into it; what it moved reads back, after a restart too, and the pool checks clean.
#[test]
fn an_index_table_gets_a_contiguous_run_emptied_for_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pieces.pool");
    let mut cfg = common::small_file_store(&path, 16 << 20, 1);
    cfg.processor.index.initial_buckets = 64;
    let big = |k: u32, v: u32| format!("big-{k}-{v}").into_bytes().repeat(60);
    let mut last = BTreeMap::new();
    let mut small = 0u32;
    {
        let store = Embedded::open(&cfg)?;
        let h = store.handle();
        // Big values overwritten at random: segments are recycled and cleaned all over the pool.
        const BIG: u32 = 3000;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..BIG + 20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = if i < BIG {
                i
            } else {
                (x % u64::from(BIG)) as u32
            };
            let key = format!("big-{k}");
            h.set(key.as_bytes(), &big(k, i))?;
            last.insert(key, big(k, i));
        }
        // Small keys, until the table has grown into a run made for it and a few thousand more keys.
        let mut runs_at = None;
        let refused = loop {
            let key = format!("small-{small}");
            if let Err(e) = h.set(key.as_bytes(), key.as_bytes()) {
                break Some(e);
            }
            last.insert(key.clone(), key.into_bytes());
            small += 1;
            if runs_at.is_none() && store.processor_stats().table_runs_made > 0 {
                runs_at = Some(small);
            }
            if runs_at.is_some_and(|at| small >= at + 2000) {
                break None;
            }
            assert!(small < 200_000, "the small keys never stopped");
        };
        let stats = store.processor_stats();
        assert!(
            stats.table_runs_made >= 1,
            "the table never grew into a run made for it; {small} small keys, then {refused:?}; {stats:?}"
        );
        assert!(refused.is_none(), "{refused:?} after {small} small keys");
        assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    }
    let report = check_pool(
        &std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(&path)?.0),
        &CheckOptions::default(),
    );
    assert!(report.is_clean(), "{:?}", report.problems);
    let store = Embedded::open(&cfg)?;
    assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    Ok(())
}

/// The cleaner's copies are written a megabyte at a time, and a memory node stopped in the middle of one leaves it
/// cut short: in a pool not closed cleanly, what that leaves past the copies that count (merged, persisted before
/// any slot names them) is counted, not reported, and a start serves every key. The same stretch in a pool closed
/// cleanly, or among the copies that count, is damage, and is reported.
#[test]
fn copies_cut_short_by_a_crash_are_counted_and_damaged_copies_reported() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let check = |path: &Path, crashed: bool| -> anyhow::Result<_> {
        let pool = std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(path)?.0);
        let opts = CheckOptions {
            crashed,
            ..CheckOptions::default()
        };
        Ok(check_pool(&pool, &opts))
    };
    // The relocation log's open segment needs room for the cut write; a run that left it all but full is made again.
    let cut = dir.path().join("cut-short.pool");
    let mut made = None;
    for attempt in 0..4 {
        let path = dir.path().join(format!("cleaned-{attempt}.pool"));
        let last = {
            let store = Embedded::open(&config(&path, true))?;
            let (last, refused) = write_cold_among_hot(&store);
            assert!(refused.is_none(), "a write was refused: {refused:?}");
            last
        };
        let report = check(&path, false)?;
        assert!(report.is_clean(), "{:?}", report.problems);
        let log_id = report
            .logs
            .iter()
            .find(|l| l.thread == CLEANER_THREAD)
            .ok_or_else(|| anyhow::anyhow!("no relocation log in {:?}", report.logs))?
            .log;
        if let Some(cut_len) = common::with_write_cut_short(&path, &cut, log_id)? {
            made = Some((last, log_id, cut_len));
            break;
        }
    }
    let (last, log_id, cut_len) =
        made.ok_or_else(|| anyhow::anyhow!("four runs left no room in the relocation log"))?;
    let log_check = |report: &PoolCheck| common::cut_short_and_damaged(report, log_id);

    let report = check(&cut, true)?;
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(log_check(&report), (cut_len, 0));
    {
        // (On a copy: a start changes the file.)
        let started = dir.path().join("started.pool");
        std::fs::copy(&cut, &started)?;
        let store = Embedded::open(&config(&started, true))?;
        assert_eq!(wrong_keys(&store, &last)?, Vec::<String>::new());
    }
    // A pool closed cleanly had no write in flight.
    let report = check(&cut, false)?;
    assert_eq!(log_check(&report), (0, cut_len));
    assert!(!report.is_clean());

    // The head's first copy, merged, loses its first bytes: damage (the cut write after it is still counted as
    // cut, unless the damage reaches it: the head held one copy, and the one gap starts among the merged ones).
    let common::OpenHead { entries, end, .. } = common::open_head(&cut, log_id)?;
    let first = entries.first().expect("the open segment holds a copy").0;
    let first_len = (entries.get(1).map_or(end, |&(at, _)| at) - first) as u64;
    let mut bytes = std::fs::read(&cut)?;
    bytes[first..first + 64].fill(0xa5);
    let damaged = dir.path().join("damaged.pool");
    std::fs::write(&damaged, &bytes)?;
    let report = check(&damaged, true)?;
    let (cut_short, damage) = log_check(&report);
    assert!(
        damage >= first_len && cut_short + damage == first_len + cut_len,
        "{report:?}"
    );
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains(&format!("log {log_id}:")) && p.contains("hold no valid entry")),
        "{:?}",
        report.problems
    );
    Ok(())
}
