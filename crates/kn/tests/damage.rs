//! Damage to a pool file (flipped bits, as from failing media) gives errors or reported losses, never a panic, a
//! hang, or a wrong value served as if it were right.
//!
//! Each case flips a few random bits in a copy of a pool file, opens it, and reads every key:
//! - after a clean stop every log is sealed and merged, so a damaged entry the index names fails its checksum and
//!   the read is refused; no key may read as anything but its last write;
//! - in a crash image (a copy of the file taken while the store runs), damaged entries the recovery merges are
//!   skipped and reported in `damaged_log_bytes`, and the entries after them are kept: each damaged entry costs at
//!   most its own write; only the last entry of a log's open segment cannot be told from a write the crash cut
//!   short, so each log may lose that one silently; a write cut short leaves holes past the merged entries of an
//!   open segment, which the checker counts rather than reports when told the pool was not closed cleanly;
//! - bits flipped anywhere in the file (index, directory, allocation table) give an error or a serving store;
//! - a segment header's fields written once refuse the start when damaged; of the two it rewrites in place, a
//!   damaged sealed length is rebuilt at start with nothing lost, a damaged link to the older segment is rebuilt
//!   when the older segment is certain and refuses the start otherwise; segments of the format before those checks
//!   still recover and grow;
//! - the pool checker (`dinomo check`) reports damage wherever reads come out refused or wrong, and finds damage to
//!   the index that reads cannot tell from a missing key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};
use std::time::Duration;

use dinomo_dpm::check::{CheckOptions, PoolCheck, check_pool};
use dinomo_dpm::{ProcessorConfig, ProcessorStats};
use dinomo_kn::{Embedded, EmbeddedConfig};
use dinomo_log::ENTRY_HEADER_LEN;
use dinomo_log::segment::{InPlace, SegmentFormat, SegmentHeader};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;

const KEYS: u32 = 1500;
const THREADS: usize = 2;
const CASES: u64 = 12;

fn config(path: &Path) -> EmbeddedConfig {
    common::small_file_store(path, 8 << 20, THREADS)
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i}").into_bytes()
}

/// Each key with its last write (`None`: deleted).
type LastWrites = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Every key's last write: written once, every seventh deleted, every fifth written again.
fn workload() -> LastWrites {
    (0..KEYS)
        .map(|i| {
            let last = if i % 5 == 0 {
                Some(format!("again{i}").into_bytes())
            } else if i % 7 == 0 {
                None
            } else {
                Some(vec![(i % 251) as u8; (i % 300) as usize])
            };
            (key(i), last)
        })
        .collect()
}

fn write_workload(store: &Embedded) -> anyhow::Result<()> {
    let h = store.handle();
    for i in 0..KEYS {
        h.set(&key(i), &vec![(i % 251) as u8; (i % 300) as usize])?;
    }
    for i in (0..KEYS).step_by(7) {
        h.delete(&key(i))?;
    }
    for i in (0..KEYS).step_by(5) {
        h.set(&key(i), format!("again{i}").as_bytes())?;
    }
    Ok(())
}

/// A pool file after the workload and a clean stop.
fn clean_image(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("clean");
    write_workload(&Embedded::open(&config(&path))?)?;
    Ok(path)
}

/// A copy of the pool file taken while the store runs, once every sealed segment is merged (nothing changes the
/// pool then, so the copy is what a crash would leave): each log's newest segment is open and unmerged.
fn crash_image(dir: &Path) -> anyhow::Result<PathBuf> {
    let live = dir.join("live");
    let store = Embedded::open(&config(&live))?;
    write_workload(&store)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.processor_stats().backlog_segments > 0 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "merges did not catch up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let image = dir.join("crash");
    std::fs::copy(&live, &image)?;
    drop(store);
    Ok(image)
}

/// Byte ranges of the file holding log entries: each log segment's entry area up to its last non-zero byte.
fn entry_areas(image: &Path) -> anyhow::Result<Vec<std::ops::Range<usize>>> {
    let bytes = std::fs::read(image)?;
    let pool = dinomo_pool::Pool::open_snapshot(image)?.0;
    let mut areas = Vec::new();
    for ext in pool.allocated() {
        if ext.tag != dinomo_log::tags::LOG_SEGMENT {
            continue;
        }
        let start = ext.offset as usize;
        let seg = &bytes[start..start + ext.len as usize];
        // The delete reserve's segments are allocated but not formatted yet.
        if SegmentFormat::of_magic(&seg[..8]).is_none() {
            continue;
        }
        let used = seg.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let entries = start + dinomo_log::SEGMENT_HEADER_LEN;
        if start + used > entries {
            areas.push(entries..start + used);
        }
    }
    anyhow::ensure!(!areas.is_empty(), "no log entries in the image");
    Ok(areas)
}

/// What reading every key of a damaged copy gave.
#[derive(Debug, Default)]
struct Outcome {
    /// The open failed (with this error).
    open_error: Option<String>,
    /// Keys read as something other than their last write, without an error.
    wrong: Vec<String>,
    /// Reads refused with an error.
    refused: u32,
    /// The memory node's statistics after the open.
    stats: ProcessorStats,
    /// What the checker said of the copy, before it was opened.
    check: PoolCheck,
}

/// The checker's report on the pool file at `path`, which must not change.
fn checked(path: &Path) -> anyhow::Result<PoolCheck> {
    let before = std::fs::read(path)?;
    let pool = std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(path)?.0);
    let report = check_pool(&pool, &CheckOptions::default());
    drop(pool);
    anyhow::ensure!(
        std::fs::read(path)? == before,
        "the checker changed the file"
    );
    Ok(report)
}

/// Reads every key of `writes` from `store`: the keys read as something other than their last write (without an
/// error), and the reads refused with an error.
fn read_every_key(store: &Embedded, writes: &LastWrites) -> (Vec<String>, u32) {
    let h = store.handle();
    let (mut wrong, mut refused) = (Vec::new(), 0);
    for (k, want) in writes {
        match h.get(k) {
            Ok(got) if got == *want => {}
            Ok(got) => wrong.push(format!(
                "{}: read {:?}, last write {:?}",
                String::from_utf8_lossy(k),
                got.map(|v| v.len()),
                want.as_ref().map(|v| v.len())
            )),
            Err(_) => refused += 1,
        }
    }
    (wrong, refused)
}

/// Opens `path` and reads every key, on a thread given two minutes to finish.
fn read_back(path: PathBuf) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Outcome::default();
        match Embedded::open(&config(&path)) {
            Err(e) => out.open_error = Some(e.to_string()),
            Ok(store) => {
                out.stats = store.processor_stats();
                (out.wrong, out.refused) = read_every_key(&store, &workload());
            }
        }
        let _ = tx.send(out);
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("opening and reading a damaged pool hung")
}

/// Records every panic, in any thread (a memory-node merge thread, a worker): the tests check with `ensure!`, so
/// any panic is the store's. [`no_panics`] says whether there was one.
fn watch_for_panics() {
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.lock().unwrap().push(info.to_string());
            default(info);
        }));
    });
}

static HOOK: Once = Once::new();
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Fails when any thread panicked since [`watch_for_panics`].
fn no_panics() -> anyhow::Result<()> {
    let panics = PANICS.lock().unwrap().clone();
    anyhow::ensure!(panics.is_empty(), "panics: {panics:#?}");
    Ok(())
}

/// [`read_damaged`] with three bits flipped in log entries: the store must open, since damaged entries cost
/// themselves, never the start.
fn read_entries_damaged(
    image: &Path,
    areas: &[std::ops::Range<usize>],
    seed: u64,
) -> anyhow::Result<Outcome> {
    let out = read_damaged(image, areas, 3, seed)?;
    anyhow::ensure!(
        out.open_error.is_none(),
        "seed {seed}: {:?}",
        out.open_error
    );
    Ok(out)
}

/// Opens a copy of `image` with `flips` random bits (from `seed`) flipped inside `areas`, reads every key back,
/// and removes the copy.
fn read_damaged(
    image: &Path,
    areas: &[std::ops::Range<usize>],
    flips: usize,
    seed: u64,
) -> anyhow::Result<Outcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bytes = std::fs::read(image)?;
    for _ in 0..flips {
        let area = &areas[rng.random_range(0..areas.len())];
        let at = rng.random_range(area.clone());
        bytes[at] ^= 1 << rng.random_range(0..8u32);
    }
    let path = image.with_extension(format!("damaged{seed}"));
    std::fs::write(&path, &bytes)?;
    // A copy the pool refuses to open is not the checker's to walk.
    let check = checked(&path).unwrap_or_default();
    let out = read_back(path.clone());
    std::fs::remove_file(path)?;
    Ok(Outcome { check, ..out })
}

#[test]
fn after_a_clean_stop_a_damaged_entry_is_refused_never_served() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = clean_image(dir.path())?;
    let areas = entry_areas(&image)?;
    let mut refused = 0;
    for seed in 0..CASES {
        let out = read_entries_damaged(&image, &areas, seed)?;
        anyhow::ensure!(out.wrong.is_empty(), "seed {seed}: {:?}", out.wrong);
        anyhow::ensure!(
            out.refused == 0 || !out.check.is_clean(),
            "seed {seed}: {} reads refused, and the checker found nothing",
            out.refused
        );
        refused += out.refused;
    }
    anyhow::ensure!(
        refused > 0,
        "no damaged entry was live: the test hit nothing"
    );
    no_panics()
}

#[test]
fn in_a_crash_image_damaged_entries_are_skipped_reported_and_cost_only_themselves()
-> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = crash_image(dir.path())?;
    let areas = entry_areas(&image)?;
    let mut reported = 0;
    for seed in 0..CASES {
        let out = read_entries_damaged(&image, &areas, seed)?;
        // A lost entry takes at least a header's bytes, and changes one key.
        let explained = out.stats.damaged_log_bytes as usize / ENTRY_HEADER_LEN + THREADS;
        anyhow::ensure!(
            out.wrong.len() <= explained,
            "seed {seed}: {} keys read wrong, {} damaged bytes reported: {:?}",
            out.wrong.len(),
            out.stats.damaged_log_bytes,
            out.wrong
        );
        // What recovery skips, the checker reports; where it reports nothing, reads lose at most each log's
        // last entry (above).
        anyhow::ensure!(
            out.stats.damaged_log_bytes == 0 || !out.check.is_clean(),
            "seed {seed}: recovery skipped {} damaged bytes, and the checker found nothing",
            out.stats.damaged_log_bytes
        );
        anyhow::ensure!(
            !out.check.is_clean() || (out.refused == 0 && out.wrong.len() <= THREADS),
            "seed {seed}: the checker found nothing, yet {} reads were refused and {:?} read wrong",
            out.refused,
            out.wrong
        );
        reported += out.stats.damaged_log_bytes;
    }
    anyhow::ensure!(
        reported > 0,
        "no damage was ever reported: the test hit nothing"
    );
    no_panics()
}

#[test]
fn bits_flipped_anywhere_give_an_error_or_a_serving_store() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = crash_image(dir.path())?;
    let len = std::fs::metadata(&image)?.len() as usize;
    let mut outcomes: HashMap<&str, u32> = HashMap::new();
    for seed in 0..CASES {
        // The superblock's checksum refuses any change to it, so damage past it.
        let out = read_damaged(&image, std::slice::from_ref(&(4096..len)), 8, 1000 + seed)?;
        let what = match (&out.open_error, out.refused) {
            (Some(_), _) => "refused to open",
            (None, 0) => "served",
            (None, _) => "served, refusing some reads",
        };
        *outcomes.entry(what).or_default() += 1;
    }
    eprintln!("{outcomes:?}");
    no_panics()
}

#[test]
fn a_damaged_segment_header_refuses_the_open_and_names_the_segment() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = crash_image(dir.path())?;
    let areas = entry_areas(&image)?;
    // A byte of each field written once: magic, log id, checksum, first sequence number (low and high bytes),
    // capacity. (The sealed length and the link to the older segment change in place and carry their own checks:
    // see the next test.)
    let bytes = [3usize, 9, 13, 16, 21, 42];
    // The oldest segment (merged) and the newest (a log's open head).
    let segments = [areas[0].start, areas[areas.len() - 1].start];
    for (n, (&byte, &entries)) in bytes
        .iter()
        .flat_map(|b| segments.iter().map(move |s| (b, s)))
        .enumerate()
    {
        let header = entries - dinomo_log::SEGMENT_HEADER_LEN;
        let at = header + byte;
        let out = read_damaged(&image, std::slice::from_ref(&(at..at + 1)), 1, n as u64)?;
        let error = out.open_error.unwrap_or_default();
        anyhow::ensure!(
            error.contains(&format!("{header:#x} is not an allocated log segment")),
            "a flipped bit in byte {byte} of the header of the segment at {header:#x}: {error:?}"
        );
        anyhow::ensure!(
            out.check
                .problems
                .iter()
                .any(|p| p.contains(&format!("segment at {header:#x}: its header is damaged"))),
            "the checker on a flipped bit in byte {byte} of the header at {header:#x}: {:?}",
            out.check.problems
        );
    }
    no_panics()
}

/// The segments of the pool file at `image` with their headers, read from the file.
fn segment_headers(image: &Path) -> anyhow::Result<Vec<(usize, SegmentHeader)>> {
    let bytes = std::fs::read(image)?;
    Ok(entry_areas(image)?
        .into_iter()
        .map(|area| area.start - dinomo_log::SEGMENT_HEADER_LEN)
        .filter_map(|at| Some((at, SegmentHeader::decode(&bytes[at..])?)))
        .collect())
}

/// A copy of `image` with bit `bit` of the header word `field` of the segment at `at` flipped, named `name`.
fn with_flipped_word(
    image: &Path,
    name: &str,
    at: usize,
    field: InPlace,
    bit: usize,
) -> anyhow::Result<PathBuf> {
    let mut bytes = std::fs::read(image)?;
    bytes[at + field.offset() as usize + bit / 8] ^= 1 << (bit % 8);
    let path = image.with_file_name(name);
    std::fs::write(&path, &bytes)?;
    Ok(path)
}

/// The segment header at `at` of the pool file at `path`.
fn header_at(path: &Path, at: usize) -> anyhow::Result<Option<SegmentHeader>> {
    Ok(SegmentHeader::decode(&std::fs::read(path)?[at..]))
}

/// Flips `bit` of the header word `field` of the segment at `at` (whose header is `original`) in a copy of `image`,
/// and requires the damage repaired by a start: the checker reports one problem, saying each of `reported`; a start
/// counts one repair (`repairs` of its statistics), reads every key right and writes the header back as it was; the
/// file then checks clean.
fn repaired_at_start(
    image: &Path,
    name: &str,
    (at, original): (usize, &SegmentHeader),
    field: InPlace,
    bit: usize,
    reported: &[String],
    repairs: fn(&ProcessorStats) -> u64,
) -> anyhow::Result<()> {
    let path = with_flipped_word(image, name, at, field, bit)?;
    let check = checked(&path)?;
    anyhow::ensure!(
        check.problems.len() == 1 && reported.iter().all(|r| check.problems[0].contains(r)),
        "bit {bit} of {field:?} of the segment at {at:#x}: {:?}",
        check.problems
    );
    let out = read_back(path.clone());
    anyhow::ensure!(out.open_error.is_none(), "{:?}", out.open_error);
    anyhow::ensure!(
        repairs(&out.stats) == 1,
        "{field:?}: {} repairs",
        repairs(&out.stats)
    );
    anyhow::ensure!(
        out.wrong.is_empty() && out.refused == 0,
        "read wrong: {:?}, {} refused",
        out.wrong,
        out.refused
    );
    let repaired = header_at(&path, at)?;
    anyhow::ensure!(
        repaired.as_ref() == Some(original),
        "after the start, the header at {at:#x} reads {repaired:?}, was {original:?}"
    );
    let check = checked(&path)?;
    anyhow::ensure!(check.is_clean(), "{:?}", check.problems);
    Ok(())
}

/// The checker reports, and a start refuses, the damaged link of the segment at `at` in the pool file at `path`,
/// both saying `why` it cannot be rebuilt.
fn link_refused(path: PathBuf, at: usize, why: &str) -> anyhow::Result<()> {
    let link = format!("segment at {at:#x}: its link to the older segment is damaged");
    let check = checked(&path)?;
    anyhow::ensure!(
        check
            .problems
            .iter()
            .any(|p| p.contains(&link) && p.contains(why)),
        "{:?}",
        check.problems
    );
    let error = read_back(path.clone()).open_error.unwrap_or_default();
    anyhow::ensure!(error.contains(&link) && error.contains(why), "{error:?}");
    // The refused start left the pool as after a crash: not marked cleanly closed, for the next start to recover
    // and for the checker to read so.
    anyhow::ensure!(
        !dinomo_pool::Pool::open_snapshot(&path)?.1.was_clean,
        "a refused start marked the pool cleanly closed"
    );
    Ok(())
}

/// The two header words the memory node rewrites in place carry their own checks. A flipped bit in a sealed length
/// is rebuilt at start (the segment is scanned to its last valid entry and sealed there again) with nothing lost;
/// the checker reports it first.
#[test]
fn a_damaged_sealed_length_is_rebuilt_at_start() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = clean_image(dir.path())?;
    let segments = segment_headers(&image)?;
    let sealed: Vec<_> = segments
        .iter()
        .filter(|(_, h)| h.format == SegmentFormat::Checked && h.sealed_len.is_ok_and(|l| l > 0))
        .collect();
    anyhow::ensure!(sealed.len() >= 2, "sealed segments: {segments:?}");
    for (n, (at, h)) in sealed.iter().enumerate() {
        // Low, middle and check bits of the word.
        let bit = [3usize, 29, 57][n % 3];
        repaired_at_start(
            &image,
            &format!("sealed{n}"),
            (*at, h),
            InPlace::SealedLen,
            bit,
            &[format!("segment at {at:#x}: its sealed length is damaged")],
            |s| s.resealed_segments,
        )?;
    }
    no_panics()
}

/// A flipped bit in a segment's link to the older segment is rebuilt at start when the older segment is certain:
/// the log's newest segment outside its chain, whose entries end just before this one's (or none, for the log's
/// oldest). When a segment outside the chains has a damaged header, it may be the one, and the start is refused,
/// naming both. The checker says which.
#[test]
fn a_damaged_link_is_rebuilt_when_the_older_segment_is_certain() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = clean_image(dir.path())?;
    let segments = segment_headers(&image)?;
    anyhow::ensure!(
        segments.iter().any(|(_, h)| h.older.is_ok_and(|o| o != 0))
            && segments.iter().any(|(_, h)| h.older == Ok(0)),
        "segments linking an older one and oldest ones: {segments:?}"
    );
    for (n, (at, h)) in segments.iter().enumerate() {
        let bit = [11usize, 40, 50][n % 3];
        let again = match h.older.map_err(|d| anyhow::anyhow!("{d}"))? {
            0 => "links it again to nothing".to_string(),
            o => format!("links it again to {o:#x}"),
        };
        repaired_at_start(
            &image,
            &format!("link{n}"),
            (*at, h),
            InPlace::Older,
            bit,
            &[
                format!("segment at {at:#x}: its link to the older segment is damaged"),
                again,
            ],
            |s| s.relinked_segments,
        )?;
    }

    // With the link, damage to the older segment it named: its last entry (it no longer ends where the segment
    // begins), or its header (it cannot be told from any other segment).
    let (at, h) = segments
        .iter()
        .find(|(_, h)| h.older.is_ok_and(|o| o != 0))
        .expect("checked above");
    let older = h.older.map_err(|d| anyhow::anyhow!("{d}"))? as usize;
    let older_len = segments
        .iter()
        .find(|(o, _)| *o == older)
        .and_then(|(_, o)| o.sealed_len.ok())
        .expect("the older segment is sealed") as usize;
    // Inside the last entry: at most 7 bytes of padding follow it.
    let last_entry = older + dinomo_log::SEGMENT_HEADER_LEN + older_len - 9;
    let first_seq = older + dinomo_log::segment::field::FIRST_SEQ as usize;
    for (name, byte, why) in [
        (
            "link-and-entry",
            last_entry,
            format!(
                "the log's newest older segment outside its chain ({older:#x}) does not end where this one begins"
            ),
        ),
        (
            "link-and-header",
            first_seq,
            format!("the segment at {older:#x}, which no chain reaches, has a damaged header"),
        ),
    ] {
        let path = with_flipped_word(&image, name, *at, InPlace::Older, 20)?;
        let mut bytes = std::fs::read(&path)?;
        bytes[byte] ^= 0x10;
        std::fs::write(&path, &bytes)?;
        link_refused(path, *at, &why)?;
    }
    no_panics()
}

/// The extents a memory node sets aside for deletes on a full pool carry no segment header, even where they held a
/// segment before: a stale header could pass for a log's older segment when a damaged link is rebuilt.
#[test]
fn the_delete_reserve_carries_no_stale_segment_header() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("reused");
    {
        // Segments are filled, merged, superseded and recycled; with no reserve, the lowest extents are among them.
        let mut first = config(&path);
        first.processor.delete_reserve_segments = 0;
        let store = Embedded::open(&first)?;
        for _ in 0..4 {
            write_workload(&store)?;
        }
        anyhow::ensure!(store.processor_stats().recycled_segments > 0);
    }
    let stale = segment_headers(&path);
    // A restart frees the reserve of the last run; the first segment granted sets one aside again, first fit: over
    // recycled segments.
    {
        let store = Embedded::open(&config(&path))?;
        store.handle().set(b"after the restart", b"value")?;
    }
    let bytes = std::fs::read(&path)?;
    let pool = dinomo_pool::Pool::open_snapshot(&path)?.0;
    let log_segments: Vec<u64> = pool
        .allocated()
        .into_iter()
        .filter(|e| e.tag == dinomo_log::tags::LOG_SEGMENT)
        .map(|e| e.offset)
        .collect();
    let unformatted: Vec<u64> = log_segments
        .iter()
        .copied()
        .filter(|&o| {
            let header = &bytes[o as usize..][..dinomo_log::SEGMENT_HEADER_LEN];
            header.iter().all(|&b| b == 0)
        })
        .collect();
    let check = checked(&path)?;
    anyhow::ensure!(check.is_clean(), "{:?}", check.problems);
    // Every log segment no chain reaches is the reserve, and it carries no header.
    anyhow::ensure!(
        check.orphaned_segments == ProcessorConfig::default().delete_reserve_segments as u64
            && unformatted.len() as u64 == check.orphaned_segments,
        "{} log segments outside the chains, {} of them without a header: {unformatted:x?} of {log_segments:x?} \
         (segments before the restart: {stale:?})",
        check.orphaned_segments,
        unformatted.len()
    );
    Ok(())
}

/// A pool written by a version whose segment headers kept plain in-place words (`DNMSEG01`) still recovers,
/// serves and grows: its segments are sealed and relinked in their own format, new segments get the checked one.
#[test]
fn segments_of_the_unchecked_format_are_recovered_and_kept_in_their_format() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let image = crash_image(dir.path())?;
    let mut bytes = std::fs::read(&image)?;
    let old = segment_headers(&image)?;
    let open_heads = old.iter().filter(|(_, h)| h.sealed_len == Ok(0)).count();
    anyhow::ensure!(open_heads > 0, "a crash image has open segments: {old:?}");
    for (at, h) in &old {
        let unchecked = SegmentHeader {
            format: SegmentFormat::Unchecked,
            ..*h
        };
        bytes[*at..*at + dinomo_log::SEGMENT_HEADER_LEN]
            .copy_from_slice(&unchecked.encode().expect("plain words hold any value"));
    }
    let path = dir.path().join("unchecked");
    std::fs::write(&path, &bytes)?;
    let check = checked(&path)?;
    anyhow::ensure!(check.is_clean(), "{:?}", check.problems);

    // Recovery seals the open heads in their format, at their last entry.
    let mut writes = workload();
    {
        let store = Embedded::open(&config(&path))?;
        anyhow::ensure!(store.processor_stats().recovered_entries > 0);
        let (wrong, refused) = read_every_key(&store, &writes);
        anyhow::ensure!(
            wrong.is_empty() && refused == 0,
            "read wrong after recovery: {wrong:?}, {refused} refused"
        );
        let file = std::fs::read(&path)?;
        for (at, _) in old.iter().filter(|(_, h)| h.sealed_len == Ok(0)) {
            // Sealed at its last entry, with a plain word.
            let sealed = SegmentHeader::decode(&file[*at..]);
            let word: [u8; 8] =
                file[at + InPlace::SealedLen.offset() as usize..][..8].try_into()?;
            anyhow::ensure!(
                sealed.is_some_and(|h| h.format == SegmentFormat::Unchecked
                    && h.sealed_len
                        .is_ok_and(|len| len > 0 && len == u64::from_le_bytes(word))),
                "the open segment at {at:#x} after recovery: {sealed:?}"
            );
        }
        // More writes: new segments, and recycling relinks chains through the old segments.
        let h = store.handle();
        for round in 0..3 {
            for (i, (k, v)) in writes.iter_mut().enumerate() {
                let value = format!("round{round}-{i}").into_bytes();
                h.set(k, &value)?;
                *v = Some(value);
            }
        }
    }
    for (at, h) in &old {
        let now = SegmentHeader::decode(&std::fs::read(&path)?[*at..]);
        // A segment recycled since may hold any header now; one still there kept its format.
        if let Some(now) = now.filter(|n| n.log_id == h.log_id && n.first_seq == h.first_seq) {
            anyhow::ensure!(
                now.format == SegmentFormat::Unchecked
                    && now.sealed_len.is_ok()
                    && now.older.is_ok(),
                "the segment at {at:#x}: {now:?}"
            );
        }
    }
    let check = checked(&path)?;
    anyhow::ensure!(check.is_clean(), "{:?}", check.problems);
    let now = segment_headers(&path)?;
    anyhow::ensure!(
        now.iter().any(|(_, h)| h.format == SegmentFormat::Checked),
        "no segment formatted since has the checked format: {now:?}"
    );
    let store = Embedded::open(&config(&path))?;
    let (wrong, refused) = read_every_key(&store, &writes);
    anyhow::ensure!(
        wrong.is_empty() && refused == 0,
        "read wrong after a restart: {wrong:?}, {refused} refused"
    );
    Ok(())
}

#[test]
fn the_checker_passes_intact_images_and_counts_what_recovery_will_merge() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let live_keys = workload().iter().filter(|(_, v)| v.is_some()).count() as u64;
    let clean = checked(&clean_image(dir.path())?)?;
    anyhow::ensure!(clean.is_clean(), "{:?}", clean.problems);
    anyhow::ensure!(
        clean.layout == Some(dinomo_dpm::Partitioning::Shared) && clean.indexes.len() == 1
    );
    anyhow::ensure!(
        clean.indexes[0].keys == live_keys,
        "{} keys indexed after a clean stop, {live_keys} live",
        clean.indexes[0].keys
    );
    let unmerged: u64 = clean.logs.iter().map(|l| l.unmerged_entries).sum();
    anyhow::ensure!(unmerged == 0, "a clean stop merges everything: {unmerged}");
    let crash = checked(&crash_image(dir.path())?)?;
    anyhow::ensure!(crash.is_clean(), "{:?}", crash.problems);
    let unmerged: u64 = crash.logs.iter().map(|l| l.unmerged_entries).sum();
    let open: u64 = crash.logs.iter().map(|l| l.open_segments).sum();
    anyhow::ensure!(
        unmerged > 0 && open > 0,
        "a crash image has open segments ({open}) with unmerged entries ({unmerged})"
    );
    Ok(())
}

/// A worker's group commit is one WRITE of its new entries, and a memory node stopped in the middle of it leaves the
/// write cut short, its bytes landed in any order. In a pool not closed cleanly, the hole that leaves in an open
/// segment past the merged entries is counted, not reported, and a start serves every key as before; the same hole
/// in a pool closed cleanly is damage. The start seals the segment with the hole in it and records the bytes it
/// stepped over, so later checks count the hole too, and report any damage beyond it.
#[test]
fn a_commit_cut_short_by_a_crash_is_counted_not_reported() -> anyhow::Result<()> {
    watch_for_panics();
    let dir = tempfile::tempdir()?;
    let image = crash_image(dir.path())?;
    anyhow::ensure!(
        !dinomo_pool::Pool::open_snapshot(&image)?.1.was_clean,
        "a copy of a running store's pool reads as closed cleanly"
    );
    let logs: Vec<u32> = checked(&image)?.logs.iter().map(|l| l.log).collect();
    let mut cut = 0;
    for log_id in logs {
        let path = dir.path().join(format!("cut-{log_id}"));
        let Some(cut_len) = common::with_write_cut_short(&image, &path, log_id)? else {
            continue;
        };
        cut += 1;
        let of_log = |report: &PoolCheck| common::cut_short_and_damaged(report, log_id);
        let pool = std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(&path)?.0);
        let after_crash = check_pool(
            &pool,
            &CheckOptions {
                crashed: true,
                ..CheckOptions::default()
            },
        );
        drop(pool);
        anyhow::ensure!(
            after_crash.is_clean(),
            "log {log_id}: {:?}",
            after_crash.problems
        );
        anyhow::ensure!(
            of_log(&after_crash) == (cut_len, 0),
            "log {log_id}: {after_crash:?}"
        );
        let strict = checked(&path)?;
        anyhow::ensure!(
            !strict.is_clean() && of_log(&strict) == (0, cut_len),
            "log {log_id}: {strict:?}"
        );
        let out = read_back(path.clone());
        anyhow::ensure!(
            out.open_error.is_none() && out.wrong.is_empty() && out.refused == 0,
            "log {log_id}: {out:?}"
        );
        // The start sealed the segment with the hole inside, and recorded what it stepped over: a check of the pool,
        // closed cleanly since, counts the hole as stepped over (no longer cut short: the segment is sealed) and
        // reports nothing.
        let started = checked(&path)?;
        anyhow::ensure!(
            started.is_clean()
                && of_log(&started) == (0, 0)
                && common::log_check(&started, log_id).stepped_over_bytes == cut_len,
            "log {log_id} after a start: {started:?}"
        );
        // Damage found there later is more than the start stepped over: reported, the hole with it.
        let first = common::open_head(&image, log_id)?.entries[0].0;
        let mut bytes = std::fs::read(&path)?;
        bytes[first..first + ENTRY_HEADER_LEN].fill(0xa5);
        std::fs::write(&path, &bytes)?;
        let later = checked(&path)?;
        let (cut_short, damaged) = of_log(&later);
        anyhow::ensure!(
            !later.is_clean()
                && cut_short == 0
                && common::log_check(&later, log_id).stepped_over_bytes == 0
                && damaged > cut_len,
            "log {log_id} damaged after a start: {later:?}"
        );
    }
    anyhow::ensure!(cut > 0, "no open segment had room for the cut write");
    no_panics()
}

/// Damage to the index: a slot whose hash word moved it out of its chain, which a read cannot tell from a missing
/// key (it answers "no such key"), and a slot naming another key's entry, which a read refuses (the entry may have
/// been the key's, its slot moved and its bytes written again since the bucket was read, so after walks that find it
/// the same the read reports damage rather than answering "no such key"). The checker names both.
#[test]
fn the_checker_finds_index_damage_that_reads_take_for_missing_keys() -> anyhow::Result<()> {
    use dinomo_index::layout::{SLOTS, bucket_index, primary_offset};
    let dir = tempfile::tempdir()?;
    let image = clean_image(dir.path())?;
    let bytes = std::fs::read(&image)?;
    let word =
        |at: u64| u64::from_le_bytes(bytes[at as usize..at as usize + 8].try_into().unwrap());
    let (table, nbuckets) = {
        let pool = std::sync::Arc::new(dinomo_pool::Pool::open_snapshot(&image)?.0);
        let index = dinomo_index::Index::open(pool, &dinomo_index::IndexConfig::default())?;
        let cw = index.current();
        (cw.table, cw.nbuckets)
    };
    // Two live slots of primary buckets, and the key each names.
    let mut live = Vec::new();
    for b in 0..nbuckets {
        for i in 0..SLOTS as u64 {
            let at = primary_offset(table, b) + 16 * i;
            if word(at) != 0 && word(at + 8) != 0 {
                live.push((b, at));
            }
        }
        if live.len() >= 2 {
            break;
        }
    }
    anyhow::ensure!(live.len() >= 2, "fewer than two keys indexed");
    let key_of = |slot: u64| -> Vec<u8> {
        let r = dinomo_log::EntryRef::from_raw(word(slot + 8)).unwrap();
        let e = &bytes[r.offset() as usize..(r.offset() + r.len()) as usize];
        dinomo_log::EntryView::parse(e).unwrap().key.to_vec()
    };
    let (first, second) = (live[0], live[1]);
    let (first_key, second_key) = (key_of(first.1), key_of(second.1));
    let foreign = (1..u64::MAX)
        .find(|&h| bucket_index(h, nbuckets) != first.0)
        .unwrap();
    let cases: [(&str, u64, u64, &[u8], &str); 2] = [
        (
            "misplaced",
            first.1,
            foreign,
            &first_key,
            "lies in another hash's chain, so no lookup finds key",
        ),
        (
            "crossed",
            second.1 + 8,
            word(first.1 + 8),
            &second_key,
            "the entry is of key",
        ),
    ];
    for (name, at, value, key, expected) in cases {
        // A read finds the crossed slot's entry is another key's, and refuses; the misplaced slot it never finds.
        let refused = name == "crossed";
        let mut damaged = bytes.clone();
        damaged[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        let path = dir.path().join(name);
        std::fs::write(&path, &damaged)?;
        let report = checked(&path)?;
        anyhow::ensure!(
            report.problem_count == 1 && report.problems[0].contains(expected),
            "{name}: {:?}",
            report.problems
        );
        anyhow::ensure!(report.indexes[0].bad_slots == 1, "{name}");
        let store = Embedded::open(&config(&path))?;
        match store.handle().get(key) {
            Err(dinomo_kn::KnError::Corrupt(why)) if refused => {
                anyhow::ensure!(why.contains("holds a put of another key"), "{name}: {why}")
            }
            Ok(None) if !refused => {} // which is why the checker is needed
            other => anyhow::bail!("{name}: the read gave {other:?}"),
        }
    }
    Ok(())
}
