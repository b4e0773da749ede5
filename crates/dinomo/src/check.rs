//! `dinomo check`: inspects a pool file offline and reports damage, changing nothing unless asked to repair it.
//!
//! The file is mapped copy-on-write ([`Pool::open_snapshot`]): the pool's own checks (superblock, allocation table)
//! run as a memory node's would, then [`dinomo_dpm::check`] walks the logs and indexes, and finally a trial start
//! of the data plane runs the memory node's recovery on the private copy, to tell whether `dinomo dpm` would start
//! on the file and what it would recover. Exit status: 0 when nothing is damaged, 1 when something is, 2 when the
//! file cannot be checked (missing, not a pool file, in use by a memory node).
//!
//! `--repair` then mends what it can in place ([`repair_pool`]) and checks again; the exit status is that check's.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dinomo_dpm::check::{CheckOptions, PoolCheck, Repair, check_pool, repair_pool};
use dinomo_dpm::{Partitioning, Processor, ProcessorConfig};
use dinomo_pool::{OpenReport, Pool, PoolError};
use serde::Serialize;

use crate::config::{Config, load_or_default};

/// Settings of `dinomo check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Pool file to check; it must not be in use by a memory node [pool.path; default dinomo-data/pool].
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Configuration file (TOML): its pool path, and the processor settings of the trial start.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the trial start of the data plane (recovery on a private copy of the file).
    #[arg(long)]
    pub no_recovery: bool,
    /// Problems listed in the report; the rest are counted.
    #[arg(long, default_value_t = CheckOptions::default().max_listed_problems)]
    pub max_problems: usize,
    /// After a report of damage, repair the file in place: run the memory node's recovery on it, remove the index
    /// slots that name damaged entries (their keys then read as absent; before, every read of them was refused),
    /// empty and recycle the log segments with damaged stretches, and check again. The exit status is then the
    /// second check's.
    #[arg(long)]
    pub repair: bool,
}

/// The report of a check followed by a repair.
#[derive(Serialize)]
struct Repaired<'a> {
    check: &'a Report,
    repair: &'a Repair,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    path: String,
    /// Whether nothing is damaged.
    clean: bool,
    pool: PoolSummary,
    /// The layout of a pDPM baseline, when the pool holds one (its contents are not checked).
    pdpm_layout: Option<&'static str>,
    data_plane: Option<PoolCheck>,
    recovery: Option<Trial>,
}

#[derive(Debug, Serialize)]
struct PoolSummary {
    size: u64,
    segment_size: u64,
    segments: u64,
    used_segments: u64,
    closed_cleanly: bool,
    opens: u32,
}

/// What a memory node starting on the file would do.
#[derive(Debug, Default, Serialize)]
struct Trial {
    /// Why it would refuse to start (`None`: it starts).
    refused: Option<String>,
    recovered_entries: u64,
    damaged_log_bytes: u64,
    torn_entries: u64,
    /// Segments whose damaged sealed length it rebuilds by scanning them.
    resealed_segments: u64,
    /// Segments whose damaged link to the older segment it writes again.
    relinked_segments: u64,
    /// Keys the store would hold.
    keys: u64,
}

/// Runs the check; the process exits with 1 when something is damaged, 2 when the file cannot be checked.
pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let loaded = load_or_default(args.config.as_deref())?;
    let mut cfg = loaded.config;
    if let Some(p) = &args.pool {
        cfg.pool.path = p.clone();
    }
    let path = cfg.pool.path.clone();
    let shown = path.display().to_string();
    let (pool, opened) = match Pool::open_snapshot(&path) {
        Ok(p) => p,
        Err(
            e @ (PoolError::CorruptSuperblock { .. }
            | PoolError::CorruptAllocTable { .. }
            | PoolError::InvalidOptions(_)),
        ) => {
            // Damage of the pool's own structures: report it like any other.
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "path": shown, "clean": false, "problems": [e.to_string()] })
                );
            } else {
                println!("{shown}: {e}\nthe pool is damaged: a memory node refuses to open it");
            }
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: cannot check {shown}: {e}");
            std::process::exit(2);
        }
    };
    let pool = Arc::new(pool);
    let report = inspect(&args, &cfg, pool, opened, shown);
    let layout = report.data_plane.as_ref().and_then(|c| c.layout);
    let repaired = match layout {
        Some(layout) if args.repair && !report.clean => {
            Some(repair(&args, &cfg, &path, layout, !opened.was_clean)?)
        }
        _ => None,
    };
    if args.json {
        let json = match &repaired {
            None => serde_json::to_string_pretty(&report),
            Some(repair) => serde_json::to_string_pretty(&Repaired {
                check: &report,
                repair,
            }),
        };
        println!("{}", json.context("encoding the report")?);
    } else {
        print!("{}", render(&report));
        if let Some(r) = &repaired {
            print!("{}", render_repair(r));
        }
    }
    let clean = match &repaired {
        Some(r) => r.after.is_clean(),
        None => report.clean,
    };
    if !clean {
        std::process::exit(1);
    }
    Ok(())
}

/// The configured processor settings, for the index layout the pool was formatted with.
fn processor_config(cfg: &Config, layout: Partitioning) -> ProcessorConfig {
    ProcessorConfig {
        partitioning: layout,
        ..cfg.processor.clone()
    }
}

/// Opens the file for writing (as a memory node would: no other process may have it) and repairs it.
fn repair(
    args: &CheckArgs,
    cfg: &Config,
    path: &std::path::Path,
    layout: Partitioning,
    crashed: bool,
) -> anyhow::Result<Repair> {
    let (pool, _) = Pool::open(path, dinomo_pool::PersistMode::Durable)
        .with_context(|| format!("opening {} to repair it", path.display()))?;
    let pool = Arc::new(pool);
    let opts = CheckOptions {
        max_listed_problems: args.max_problems,
        crashed,
    };
    let repaired = repair_pool(&pool, &processor_config(cfg, layout), &opts)
        .with_context(|| format!("repairing {}", path.display()))?;
    pool.close()
        .with_context(|| format!("closing {}", path.display()))?;
    Ok(repaired)
}

fn render_repair(r: &Repair) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "repair: the memory node's recovery merged {} entries, stepped over {} damaged log bytes and rebuilt {} \
         segment header words; {} index slots naming damaged entries were removed (their keys now read as absent); {} \
         log segments with damaged stretches were emptied and recycled",
        r.recovered_entries,
        r.damaged_log_bytes,
        r.repaired_segment_headers,
        r.removed_slots.len(),
        r.emptied_segments
    );
    for slot in &r.removed_slots {
        let _ = writeln!(
            out,
            "  removed: {} slot of hash {:#x} naming the entry at {:#x}{}",
            match slot.node {
                Some(n) => format!("KV node {n}'s"),
                None => "the index's".to_string(),
            },
            slot.hash,
            slot.entry,
            match &slot.key {
                Some(k) => format!(", key {k}"),
                None => String::new(),
            }
        );
    }
    out.push_str("after the repair:\n");
    render_data_plane(&mut out, &r.after);
    let _ = writeln!(
        out,
        "{}",
        if r.after.is_clean() {
            "no damage found"
        } else {
            "damage remains that the repair cannot mend (listed above)"
        }
    );
    out
}

fn inspect(
    args: &CheckArgs,
    cfg: &Config,
    pool: Arc<Pool>,
    opened: OpenReport,
    path: String,
) -> Report {
    let layout = *pool.layout();
    let space = pool.space();
    let summary = PoolSummary {
        size: layout.pool_size,
        segment_size: layout.segment_size,
        segments: space.total_segments,
        used_segments: space.total_segments - space.free_segments,
        closed_cleanly: opened.was_clean,
        // Opening counts itself; a snapshot is not an open.
        opens: opened.generation.saturating_sub(1),
    };
    let pdpm_layout = dinomo_pdpm::formatted_store(&pool);
    let checked = check_pool(
        &pool,
        &CheckOptions {
            max_listed_problems: args.max_problems,
            crashed: !opened.was_clean,
        },
    );
    let recovery = checked
        .layout
        .filter(|_| !args.no_recovery)
        .map(|layout| trial(pool.clone(), cfg, layout));
    // A baseline's pool has no DINOMO data plane to speak of.
    let data_plane = (checked.layout.is_some() || pdpm_layout.is_none()).then_some(checked);
    let clean = data_plane.as_ref().is_none_or(PoolCheck::is_clean)
        && recovery.as_ref().is_none_or(|t| t.refused.is_none());
    Report {
        path,
        clean,
        pool: summary,
        pdpm_layout,
        data_plane,
        recovery,
    }
}

/// Starts the data plane on the private copy, as `dinomo dpm` would, and stops it.
fn trial(pool: Arc<Pool>, cfg: &Config, layout: Partitioning) -> Trial {
    let started =
        Processor::start(pool.clone(), &processor_config(cfg, layout)).map_err(|e| e.to_string());
    let (p, keys) = match started.and_then(|p| {
        dinomo_meta::EmbeddedMeta::open(pool.clone(), cfg.dpm.meta.clone())
            .map_err(|e| format!("cluster record: {e}"))?;
        let keys = p.count_keys().map_err(|e| e.to_string())?;
        Ok((p, keys))
    }) {
        Ok(v) => v,
        Err(refused) => {
            return Trial {
                refused: Some(refused),
                ..Trial::default()
            };
        }
    };
    let s = p.stats();
    p.shutdown();
    Trial {
        refused: None,
        recovered_entries: s.recovered_entries,
        damaged_log_bytes: s.damaged_log_bytes,
        torn_entries: s.torn_entries,
        resealed_segments: s.resealed_segments,
        relinked_segments: s.relinked_segments,
        keys,
    }
}

fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let p = &r.pool;
    let _ = writeln!(
        out,
        "pool {}: {} bytes, {} segments of {} bytes, {} in use; {} (opened {} time{})",
        r.path,
        p.size,
        p.segments,
        p.segment_size,
        p.used_segments,
        if p.closed_cleanly {
            "closed cleanly"
        } else {
            "not closed cleanly (a crash or a kill): recovery runs when it is next opened"
        },
        p.opens,
        if p.opens == 1 { "" } else { "s" }
    );
    if let Some(name) = r.pdpm_layout {
        let _ = writeln!(
            out,
            "{name} layout (a pDPM baseline): the superblock and allocation table are checked, its tables are not"
        );
    }
    if let Some(c) = &r.data_plane {
        render_data_plane(&mut out, c);
    }
    if let Some(t) = &r.recovery {
        match &t.refused {
            Some(why) => {
                let _ = writeln!(out, "recovery: a memory node refuses to start: {why}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "recovery: a memory node starts, merges {} entries left unmerged, skips {} damaged log bytes \
                     and {} torn entries{}{}, and holds {} keys",
                    t.recovered_entries,
                    t.damaged_log_bytes,
                    t.torn_entries,
                    match t.resealed_segments {
                        0 => String::new(),
                        n => format!(", seals again {n} segments whose sealed length is damaged"),
                    },
                    match t.relinked_segments {
                        0 => String::new(),
                        n => format!(
                            ", links again {n} segments whose link to the older one is damaged"
                        ),
                    },
                    t.keys
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "{}",
        if r.clean {
            "no damage found"
        } else {
            "the pool is damaged"
        }
    );
    out
}

fn render_data_plane(out: &mut String, c: &PoolCheck) {
    use std::fmt::Write;
    let Some(layout) = c.layout else {
        let _ = writeln!(out, "data plane: none formatted yet");
        return;
    };
    let segments: u64 = c.logs.iter().map(|l| l.segments).sum();
    let open: u64 = c.logs.iter().map(|l| l.open_segments).sum();
    let entries: u64 = c.logs.iter().map(|l| l.entries).sum();
    let unmerged: u64 = c.logs.iter().map(|l| l.unmerged_entries).sum();
    let cut_short: u64 = c.logs.iter().map(|l| l.cut_short_bytes).sum();
    let stepped_over: u64 = c.logs.iter().map(|l| l.stepped_over_bytes).sum();
    let mut holes = String::new();
    if cut_short > 0 {
        let _ = write!(
            holes,
            "; {cut_short} bytes in open segments hold no valid entry past the merged ones: a write the stop cut \
             short (never acknowledged), or damage"
        );
    }
    if stepped_over > 0 {
        let _ = write!(
            holes,
            "; {stepped_over} bytes in sealed segments are the holes a start after a crash stepped over (a write \
             the crash cut short, reported by that start)"
        );
    }
    let _ = writeln!(
        out,
        "data plane: {} index; {} logs in {segments} segments ({open} open, {} orphaned), {entries} entries, \
         {unmerged} not merged yet{holes}",
        match layout {
            Partitioning::PerNode => "per-node",
            Partitioning::Shared => "one shared",
        },
        c.logs.len(),
        c.orphaned_segments,
    );
    for i in &c.indexes {
        let _ = writeln!(
            out,
            "{}: {} keys in {} buckets ({} bytes), {} bad slots",
            match (i.node, i.departed) {
                (Some(n), false) => format!("index of KV node {n}"),
                (Some(n), true) => format!("index of KV node {n} (departed)"),
                (None, _) => "index".to_string(),
            },
            i.keys,
            i.buckets,
            i.table_bytes,
            i.bad_slots
        );
    }
    if c.revoked_clients > 0 {
        let _ = writeln!(out, "revoked KV-node incarnations: {}", c.revoked_clients);
    }
    if c.shared_keys > 0 {
        let _ = writeln!(out, "shared keys: {}", c.shared_keys);
    }
    if c.problem_count > 0 {
        let _ = writeln!(out, "problems ({}):", c.problem_count);
        for p in &c.problems {
            let _ = writeln!(out, "  {p}");
        }
        let unlisted = c.problem_count - c.problems.len() as u64;
        if unlisted > 0 {
            let _ = writeln!(out, "  … and {unlisted} more (--max-problems)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::render_data_plane;
    use dinomo_dpm::Partitioning;
    use dinomo_dpm::check::{LogCheck, PoolCheck};

    fn summary(logs: Vec<LogCheck>) -> String {
        let mut out = String::new();
        render_data_plane(
            &mut out,
            &PoolCheck {
                layout: Some(Partitioning::Shared),
                logs,
                ..PoolCheck::default()
            },
        );
        out
    }

    /// The holes of a write cut short in an open segment and those a start sealed in are summed and named apart.
    #[test]
    fn the_summary_names_holes_cut_short_apart_from_holes_a_start_stepped_over() {
        let log = |cut_short_bytes, stepped_over_bytes| LogCheck {
            cut_short_bytes,
            stepped_over_bytes,
            ..LogCheck::default()
        };
        let both = summary(vec![log(40, 0), log(2, 100), log(0, 20)]);
        assert!(
            both.contains("; 42 bytes in open segments hold no valid entry past the merged ones")
                && both.contains("; 120 bytes in sealed segments are the holes a start after a crash stepped over"),
            "{both}"
        );
        let stepped_only = summary(vec![log(0, 8)]);
        assert!(
            stepped_only.contains("8 bytes in sealed segments")
                && !stepped_only.contains("open segments hold"),
            "{stepped_only}"
        );
        let neither = summary(vec![log(0, 0)]);
        assert!(
            !neither.contains("hold no valid entry") && !neither.contains("stepped over"),
            "{neither}"
        );
    }
}
