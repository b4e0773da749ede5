//! `dinomo bench ycsb` on the pDPM baselines at tiny scale: a few hundred operations each, with the op counts, the
//! verified reads and the round trips per operation checked against the protocols (pDPM Table 1).

use dinomo_bench::ycsb::{Distribution, OpKind, Workload};
use dinomo_bench::ycsb_run::{
    InProcessOptions, System, TargetOptions, YcsbOptions, YcsbReport, run_ycsb,
};

const OPS: u64 = 400;

fn tiny(system: System, workload: Workload, clients: usize, memory_nodes: usize) -> YcsbOptions {
    YcsbOptions {
        system,
        target: TargetOptions::InProcess(InProcessOptions {
            kns: clients,
            policy: system.default_policy(),
            memory_nodes,
            replication: memory_nodes as u32,
            // Round trips are counted exactly: a Clover read abandoned after a scheduling stall past the read
            // timeout (CI runs tests in parallel on 2 cores) would add one. No stall lasts 2 s; the 1,400 writes
            // of a run fit the slots without any retired one coming back.
            clover_read_timeout_ms: 2000,
            clover_reclaim_lease_ms: 60_000,
            ..InProcessOptions::default()
        }),
        workload,
        distribution: Distribution::Uniform,
        // Few records and a long warm-up: every client has met (and cached the slot or location of) every record
        // before the measured phase, as the paper's Table 1 assumes.
        records: 50,
        value_bytes: 64,
        clients,
        outstanding: 1,
        // Operation counts, with generous time bounds that a healthy run never reaches.
        warmup_ops: Some(1000),
        warmup_secs: 20.0,
        ops: Some(OPS),
        secs: 20.0,
        seed: 11,
        ..YcsbOptions::default()
    }
}

fn update_only() -> Workload {
    "update=1".parse().expect("a mix")
}

/// Runs `o` and checks what every run must satisfy; returns the report and the round trips per operation.
fn run(o: &YcsbOptions) -> anyhow::Result<(YcsbReport, f64)> {
    let r = run_ycsb(o, &mut |_| {})?;
    let m = &r.measured;
    assert_eq!(r.system, o.system.name());
    assert_eq!(m.ops, OPS, "exactly the operations asked for");
    assert_eq!(m.errors.total(), 0, "{:?}", m.errors);
    let reads = r.measured.ops_of(OpKind::Read);
    assert_eq!(
        m.reads_verified, reads,
        "every read returned a written value"
    );
    let res = r
        .resources
        .as_ref()
        .expect("the clients' counters are read");
    // Operations run inside submit and nothing runs across the phase's edges: the counters saw exactly the
    // measured operations.
    assert_eq!(res.totals.lookups, reads);
    assert_eq!(
        res.totals.writes,
        r.measured.ops_of(OpKind::Update) + r.measured.ops_of(OpKind::Insert)
    );
    assert!(res.totals.bytes_out > 0 && res.totals.bytes_in > 0);
    // No cache: the cache section is absent rather than zero.
    assert!(r.cache.is_none(), "{:?}", r.cache);
    assert_eq!(r.kv_nodes, Some(o.clients));
    assert!(r.merge.is_none());
    let rt = res.per_op.round_trips;
    Ok((r, rt))
}

#[test]
fn directds_c_reads_in_one_round_trip_and_writes_in_six() -> anyhow::Result<()> {
    let (_, rt) = run(&tiny(System::DirectDsC, Workload::C, 1, 1))?;
    assert_eq!(rt, 1.0, "a lock-free read is one READ");
    let (_, rt) = run(&tiny(System::DirectDsC, update_only(), 1, 1))?;
    assert_eq!(rt, 6.0, "lock, redo, validate, commit, validate, unlock");
    Ok(())
}

#[test]
fn directds_reads_in_three_round_trips_and_replicates_writes() -> anyhow::Result<()> {
    let (_, rt) = run(&tiny(System::DirectDs, Workload::C, 1, 1))?;
    assert_eq!(rt, 3.0, "lock, READ, unlock");
    // Two replicas: the four data and validation steps reach both nodes one after another (2 + 4R).
    let (_, rt) = run(&tiny(System::DirectDs, update_only(), 1, 2))?;
    assert_eq!(rt, 10.0);
    // Concurrent clients on a mixed workload: no errors, and every operation at least its lock-free cost.
    let (r, rt) = run(&tiny(System::DirectDs, Workload::A, 2, 1))?;
    let reads = r.measured.ops_of(OpKind::Read) as f64;
    assert!(
        rt >= (3.0 * reads + 6.0 * (OPS as f64 - reads)) / OPS as f64,
        "{rt}"
    );
    Ok(())
}

#[test]
fn centralds_reads_in_two_round_trips_and_writes_in_three() -> anyhow::Result<()> {
    let (r, rt) = run(&tiny(System::CentralDs, Workload::C, 1, 1))?;
    assert_eq!(rt, 2.0, "a LOOKUP at the coordinator, then one READ");
    let res = r.resources.as_ref().expect("counters");
    assert!(
        res.per_op.memory_rpc_cpu_us.is_some_and(|us| us > 0.0),
        "the coordinator's time is counted: {:?}",
        res.per_op
    );
    let (_, rt) = run(&tiny(System::CentralDs, update_only(), 1, 1))?;
    // WRITE, validating READ, COMMIT; a GRANT call every 32 writes refills the client's free blocks.
    assert!((3.0..=3.0 + 1.0 / 16.0).contains(&rt), "{rt}");
    let (_, rt) = run(&tiny(System::CentralDs, Workload::A, 2, 2))?;
    assert!(rt >= 2.0, "{rt}");
    Ok(())
}

#[test]
fn clover_reads_in_one_round_trip_and_writes_in_two() -> anyhow::Result<()> {
    // Every client met every record in the warm-up: its cursors are the tails.
    let (_, rt) = run(&tiny(System::Clover, Workload::C, 1, 1))?;
    assert_eq!(
        rt, 1.0,
        "the entry at the cursor and the shortcut in one batch"
    );
    let (_, rt) = run(&tiny(System::Clover, update_only(), 1, 1))?;
    // WRITE with its validating READ, then the CAS. Free slots are refilled (and records sent to the metadata
    // server) by the client's background thread, off the write path.
    assert_eq!(rt, 2.0);
    // Two copies on two memory nodes: both copies, the CAS, the old copies' header words (2R + 1 posts).
    let (_, rt) = run(&tiny(System::Clover, update_only(), 1, 2))?;
    assert_eq!(rt, 5.0);
    // Concurrent clients: stale cursors are chased, and nothing fails.
    let (_, rt) = run(&tiny(System::Clover, Workload::A, 2, 2))?;
    assert!(rt >= 1.0, "{rt}");
    Ok(())
}
