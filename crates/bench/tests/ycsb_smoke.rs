//! `dinomo bench ycsb` at tiny scale: a few hundred operations against in-process clusters of one and two KV
//! nodes, with the report's numbers checked against each other and against what the workload must produce.

use dinomo_bench::ycsb::{Distribution, OpKind, Workload};
use dinomo_bench::ycsb_run::{
    InProcessOptions, PlotKind, System, TargetOptions, YcsbOptions, YcsbReport, YcsbSweep,
    load_reports, plot, run_sweep, run_ycsb,
};

mod common;
use common::tiny_run;

fn tiny(workload: Workload, distribution: Distribution, kns: usize) -> YcsbOptions {
    let target = TargetOptions::InProcess(InProcessOptions {
        kns,
        // Two workers per node: the counters of each are matched across snapshots.
        kn_threads: 2,
        cache_bytes: 1 << 20,
        merge_threads: 1,
        pool_bytes: Some(256 << 20),
        ..InProcessOptions::default()
    });
    tiny_run(target, workload, distribution, 7)
}

/// What every report must satisfy.
fn check_sane(r: &YcsbReport, kns: usize) {
    let m = &r.measured;
    assert_eq!(m.ops, 400, "exactly the operations asked for");
    assert_eq!(m.errors.total(), 0, "{:?}", m.errors);
    assert!(m.secs > 0.0 && m.ops_per_s > 0.0);
    assert_eq!(m.by_kind.iter().map(|k| k.ops).sum::<u64>(), m.ops);
    // Every read (and the read of every read-modify-write) returned a value the workload wrote for its record.
    assert_eq!(
        m.reads_verified,
        r.measured.ops_of(OpKind::Read) + r.measured.ops_of(OpKind::ReadModifyWrite)
    );
    let l = &r.latency;
    assert_eq!(l.samples, m.ops);
    assert!(l.p50_us > 0.0);
    assert!(l.p50_us <= l.p90_us && l.p90_us <= l.p99_us, "{l:?}");
    assert!(l.p99_us <= l.p999_us && l.p999_us <= l.max_us, "{l:?}");
    assert!(l.mean_us <= l.max_us);
    // Nothing else ran, and nothing was in flight when the counters were read: the KV nodes saw exactly the
    // measured operations.
    let resources = r
        .resources
        .as_ref()
        .expect("the KV nodes' counters are read");
    let t = &resources.totals;
    assert_eq!(
        t.lookups,
        r.measured.ops_of(OpKind::Read) + r.measured.ops_of(OpKind::ReadModifyWrite)
    );
    assert_eq!(
        t.writes,
        r.measured.ops_of(OpKind::Update)
            + r.measured.ops_of(OpKind::Insert)
            + r.measured.ops_of(OpKind::ReadModifyWrite)
    );
    if t.writes > 0 {
        assert!(t.commits >= 1 && t.commits <= t.writes);
        assert!(t.round_trips >= t.commits, "a commit is a round trip");
        assert!(t.bytes_out > t.writes * 64, "the values were written");
    }
    let c = r.cache.as_ref().expect("the KV nodes' caches are read");
    assert_eq!(c.lookups, t.lookups);
    assert_eq!(
        c.value_hits + c.shortcut_hits + c.log_hits + c.misses,
        c.lookups
    );
    if c.lookups > 0 {
        let h = c.ratios.expect("ratios when something was looked up");
        for part in [h.value, h.shortcut, h.log, h.miss] {
            assert!((0.0..=1.0).contains(&part), "{h:?}");
        }
        let sum = h.value + h.shortcut + h.log + h.miss;
        assert!((sum - 1.0).abs() < 1e-9, "hit ratios sum to {sum}");
    }
    let per = &resources.per_op;
    assert!((per.lookups * m.ops as f64 - t.lookups as f64).abs() < 1e-6);
    assert!(r.merge.is_some(), "the in-process memory node is read");
    // Nanosecond thread times (schedstat); the clock-tick fallback is too coarse for so short a run.
    if std::path::Path::new("/proc/thread-self/schedstat").exists() {
        let cpu = resources.cpu_ns.as_ref().expect("thread CPU times");
        assert!(cpu.values().sum::<u64>() > 0);
        assert!(per.kn_worker_cpu_us.unwrap() > 0.0, "{cpu:?}");
        assert!(per.client_cpu_us.unwrap() > 0.0, "{cpu:?}");
    }
    assert_eq!(r.kv_nodes, Some(kns));
    assert_eq!(r.nodes.len(), kns);
    let shares: f64 = r.nodes.iter().map(|n| n.load_share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    assert_eq!(r.timeline.iter().map(|s| s.ops).sum::<u64>(), m.ops);
    assert!(r.load.as_ref().is_some_and(|l| l.records == 500));
}

#[test]
fn workload_a_on_two_nodes_reports_sane_numbers() -> anyhow::Result<()> {
    let opts = tiny(Workload::A, Distribution::Zipfian { theta: 0.99 }, 2);
    let mut phases = Vec::new();
    let r = run_ycsb(&opts, &mut |p| phases.push(p))?;
    check_sane(&r, 2);
    assert!(r.measured.ops_of(OpKind::Read) > 100 && r.measured.ops_of(OpKind::Update) > 100);
    assert!(!phases.is_empty());

    // The JSON report reads back as it was written, and the plot helper draws it.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(format!("{}.json", r.file_stem()));
    std::fs::write(&path, serde_json::to_string_pretty(&r)?)?;
    let back = load_reports(&path)?;
    assert_eq!(back, vec![r.clone()]);
    let svg = plot(PlotKind::HitRatios, &back);
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(r.to_csv().lines().count() > r.timeline.len());
    assert!(r.summary().contains("reads verified"));
    Ok(())
}

/// `dinomo bench ycsb --system S` for every variant of the DINOMO paper built here, end to end.
fn run_system(system: System) -> anyhow::Result<YcsbReport> {
    let mut opts = tiny(Workload::B, Distribution::Zipfian { theta: 0.99 }, 2);
    opts.system = system;
    if let TargetOptions::InProcess(p) = &mut opts.target {
        p.policy = system.default_policy();
    }
    let r = run_ycsb(&opts, &mut |_| {})?;
    check_sane(&r, 2);
    assert_eq!(r.system, system.name());
    assert!(
        r.file_stem()
            .starts_with(&format!("ycsb-{}-b-", system.name())),
        "{}",
        r.file_stem()
    );
    Ok(r)
}

#[test]
fn dinomo_s_runs_end_to_end_and_pays_a_read_per_hit() -> anyhow::Result<()> {
    let r = run_system(System::DinomoS)?;
    // Every loaded record is cached, as a shortcut only: each hit is one READ of the value.
    let cache = r.cache.as_ref().expect("the KV nodes' caches are read");
    let resources = r
        .resources
        .as_ref()
        .expect("the workers' counters are read");
    assert_eq!(cache.value_hits, 0);
    assert!(cache.shortcut_hits > 0);
    let reads = r.measured.ops_of(OpKind::Read) as f64;
    assert!(
        resources.totals.round_trips as f64 >= cache.shortcut_hits as f64,
        "{} round trips for {} shortcut hits of {reads} reads",
        resources.totals.round_trips,
        cache.shortcut_hits
    );
    Ok(())
}

#[test]
fn dinomo_n_runs_end_to_end_on_partitioned_memory() -> anyhow::Result<()> {
    let r = run_system(System::DinomoN)?;
    // Two nodes, each with its own partition of the index; the records loaded through each node stay in it.
    let merge = r
        .merge
        .as_ref()
        .expect("the in-process memory node is read");
    let cache = r.cache.as_ref().expect("the KV nodes' caches are read");
    assert!(cache.value_hits > 0);
    assert_eq!(merge.partitions, 2, "{merge:?}");
    Ok(())
}

#[test]
fn inserts_and_read_modify_writes_read_back_what_they_wrote() -> anyhow::Result<()> {
    // D: reads favour the newest inserts, which must already be readable; F: the read of each read-modify-write.
    for (workload, distribution) in [
        (Workload::D, Distribution::Latest),
        (Workload::F, Distribution::ScrambledZipfian { theta: 0.99 }),
    ] {
        let r = run_ycsb(&tiny(workload, distribution, 1), &mut |_| {})?;
        check_sane(&r, 1);
        assert!(r.measured.ops_of(OpKind::Insert) + r.measured.ops_of(OpKind::ReadModifyWrite) > 0);
    }
    Ok(())
}

#[test]
fn a_sweep_runs_each_node_count_and_plots_them() -> anyhow::Result<()> {
    let opts = YcsbOptions {
        ops: Some(200),
        ..tiny(Workload::C, Distribution::Uniform, 1)
    };
    let sweep: YcsbSweep = run_sweep(&opts, &[1, 2], &mut |_| {})?;
    assert_eq!(
        sweep.runs.iter().map(|r| r.kv_nodes).collect::<Vec<_>>(),
        [Some(1), Some(2)]
    );
    for r in &sweep.runs {
        assert_eq!(r.measured.ops, 200);
        assert_eq!(r.measured.errors.total(), 0);
        assert_eq!(r.measured.reads_verified, 200);
    }
    let svg = sweep.to_svg();
    // Throughput, round trips and the four hit ratios, each a line over both node counts.
    assert_eq!(svg.matches("<polyline").count(), 6);
    assert_eq!(sweep.to_csv().lines().count(), 3);
    assert!(
        sweep.file_stem().ends_with("-1-2kn"),
        "{}",
        sweep.file_stem()
    );
    Ok(())
}

#[test]
fn a_running_cluster_is_measured_over_the_network() -> anyhow::Result<()> {
    use dinomo_bench::ycsb_run::NativeOptions;
    use dinomo_cluster::LocalCluster;
    let cluster = LocalCluster::start(common::patient_cluster())?;
    let opts = YcsbOptions {
        target: TargetOptions::Native(NativeOptions {
            seeds: vec![cluster.rn_addr().to_string()],
            ..NativeOptions::default()
        }),
        ..tiny(Workload::B, Distribution::Uniform, 2)
    };
    let r = run_ycsb(&opts, &mut |_| {})?;
    let m = &r.measured;
    assert_eq!((m.ops, m.errors.total()), (400, 0), "{:?}", m.errors);
    assert_eq!(m.reads_verified, r.measured.ops_of(OpKind::Read));
    let resources = r
        .resources
        .as_ref()
        .expect("the KV nodes' counters are read");
    assert_eq!(
        r.cache.as_ref().map(|c| c.lookups),
        Some(r.measured.ops_of(OpKind::Read))
    );
    assert_eq!(resources.totals.writes, r.measured.ops_of(OpKind::Update));
    assert_eq!((r.target.as_str(), r.kv_nodes), ("native", Some(2)));
    assert_eq!(
        r.kn_threads,
        Some(2),
        "the default workers, as the nodes' statistics list them"
    );
    // Neither the memory node (no --dpm) nor thread CPU times (another process) can be read from here.
    assert!(r.merge.is_none() && resources.cpu_ns.is_none());
    // A second run finds the records the first one loaded.
    let again = YcsbOptions {
        load: false,
        ..opts
    };
    let r = run_ycsb(&again, &mut |_| {})?;
    assert!(r.load.is_none());
    assert_eq!(r.measured.errors.total(), 0, "{:?}", r.measured.errors);
    cluster.stop();
    Ok(())
}

/// Over an emulated 2 µs fabric, DINOMO-S's workers read their batches' shortcut entries ahead (the report counts
/// them per operation and says so); with `read_ahead_bytes` 0, as the paper's KV nodes, nothing is read ahead and
/// every shortcut hit costs a round trip of its own.
#[test]
fn reads_ahead_are_reported_and_can_be_turned_off() -> anyhow::Result<()> {
    let run = |read_ahead_bytes: u64| -> anyhow::Result<YcsbReport> {
        let mut opts = tiny(Workload::C, Distribution::Uniform, 1);
        opts.system = System::DinomoS;
        if let TargetOptions::InProcess(p) = &mut opts.target {
            p.policy = System::DinomoS.default_policy();
            p.latency_ns = 2_000;
            p.read_ahead_bytes = read_ahead_bytes;
        }
        let r = run_ycsb(&opts, &mut |_| {})?;
        check_sane(&r, 1);
        Ok(r)
    };
    let on = run(1 << 20)?;
    let per_op = &on.resources.as_ref().expect("counters").per_op;
    assert!(per_op.entries_read_ahead > 0.0, "{per_op:?}");
    let summary = on.summary();
    assert!(summary.contains("read-ahead 1.0 MiB"), "{summary}");
    assert!(
        summary.contains("read ahead for their batches"),
        "{summary}"
    );
    let off = run(0)?;
    let resources = off.resources.as_ref().expect("counters");
    assert_eq!(resources.per_op.entries_read_ahead, 0.0);
    assert_eq!(resources.per_op.index_walks_ahead, 0.0);
    let cache = off.cache.as_ref().expect("caches");
    assert!(
        resources.totals.round_trips >= cache.shortcut_hits,
        "{} round trips for {} shortcut hits",
        resources.totals.round_trips,
        cache.shortcut_hits
    );
    assert!(!off.summary().contains("read ahead for their batches"));
    Ok(())
}
