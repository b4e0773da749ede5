//! The pipelined client: many requests in flight over the native protocol, each matched to its own reply, with
//! refusals followed and reads sent again when their node dies.

use std::collections::HashMap;

use common::small_cluster;
use dinomo_cluster::wire::{RequestBody, ResponseBody};
use dinomo_cluster::{ClientConfig, ClientError, LocalCluster, PipelinedClient};
use dinomo_kn::DataOp;

mod common;

fn key(i: u64) -> Vec<u8> {
    format!("pipe-{i:05}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("value-of-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes()
}

fn pipelined(c: &LocalCluster) -> PipelinedClient {
    PipelinedClient::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        ..ClientConfig::default()
    })
    .expect("client")
}

/// Submits `bodies` keeping at most `window` in flight; returns every completion by tag (the index in `bodies`).
fn run_window(
    cl: &mut PipelinedClient,
    bodies: Vec<RequestBody>,
    window: usize,
    mut between: impl FnMut(usize),
) -> HashMap<u64, Result<ResponseBody, ClientError>> {
    let mut results = HashMap::new();
    let total = bodies.len();
    let mut bodies = bodies.into_iter().enumerate();
    let mut submitted = 0;
    loop {
        while cl.outstanding() < window {
            let Some((i, body)) = bodies.next() else {
                break;
            };
            cl.submit(i as u64, body).unwrap();
            submitted += 1;
            between(submitted);
        }
        match cl.next_completion() {
            Some(c) => assert!(results.insert(c.tag, c.result).is_none(), "tag {}", c.tag),
            None => break,
        }
    }
    assert_eq!(results.len(), total);
    results
}

#[test]
fn every_request_gets_its_own_reply() -> anyhow::Result<()> {
    let c = LocalCluster::start(small_cluster(2))?;
    let mut cl = pipelined(&c);
    let n = 600u64;
    let sets = (0..n)
        .map(|i| RequestBody::Data(DataOp::Set(key(i), value(i))))
        .collect();
    for (tag, r) in run_window(&mut cl, sets, 64, |_| {}) {
        assert_eq!(r, Ok(ResponseBody::Applied(true)), "set {tag}");
    }
    // Reads of every key and of absent keys, interleaved, many in flight on both nodes.
    let gets = (0..2 * n)
        .map(|i| RequestBody::Data(DataOp::Get(key(i))))
        .collect();
    for (tag, r) in run_window(&mut cl, gets, 100, |_| {}) {
        let expected = (tag < n).then(|| value(tag));
        assert_eq!(r, Ok(ResponseBody::Value(expected)), "get {tag}");
    }
    assert!(cl.next_completion().is_none());
    assert_eq!(cl.outstanding(), 0);
    assert!(
        cl.submit(1, RequestBody::Ping).is_err(),
        "only data requests"
    );
    // Statistics over the one-at-a-time connection: every worker of every node, in thread order, with exactly the
    // writes of the keys it owns.
    let routing = cl.client().routing().unwrap().clone();
    let mut writes = 0;
    for node in routing.ring.nodes() {
        let doc: serde_json::Value = serde_json::from_str(&cl.client().node_stats(node)?)?;
        assert_eq!(doc["node_id"], node);
        let threads = doc["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 2);
        for (t, stats) in threads.iter().enumerate() {
            let owned = (0..n)
                .filter(|&i| {
                    routing.ring.primary(&key(i)) == Some(node)
                        && dinomo_kn::thread_for_key(&key(i), threads.len()) == t
                })
                .count() as u64;
            assert_eq!(
                stats["writes"].as_u64(),
                Some(owned),
                "node {node} thread {t}"
            );
            writes += owned;
        }
    }
    assert_eq!(writes, n);
    Ok(())
}

#[test]
fn refusals_are_followed_to_the_new_owner() -> anyhow::Result<()> {
    let mut c = LocalCluster::start(small_cluster(2))?;
    let mut cl = pipelined(&c);
    let n = 400u64;
    let sets = (0..n)
        .map(|i| RequestBody::Data(DataOp::Set(key(i), value(i))))
        .collect();
    run_window(&mut cl, sets, 32, |_| {});
    let epoch = cl.client().routing().unwrap().epoch();
    // The client's table is now stale: the new node's keys are refused by their old owners.
    c.add_node()?;
    let gets = (0..n)
        .map(|i| RequestBody::Data(DataOp::Get(key(i))))
        .collect();
    for (tag, r) in run_window(&mut cl, gets, 32, |_| {}) {
        assert_eq!(r, Ok(ResponseBody::Value(Some(value(tag)))), "get {tag}");
    }
    assert!(cl.client().routing().unwrap().epoch() > epoch);
    Ok(())
}

/// A routing node owns no key: it refuses a data request as a node refuses a key it does not own, with its
/// table's epoch, so that a client whose stale table sends a request to an address a routing node has taken since
/// (a dead node's freed port) fetches the table and goes to the owner instead of failing the request.
#[test]
fn a_routing_node_refuses_data_as_a_node_owning_no_key() -> anyhow::Result<()> {
    let c = LocalCluster::start(small_cluster(2))?;
    let mut cl = pipelined(&c);
    run_window(
        &mut cl,
        vec![RequestBody::Data(DataOp::Set(key(1), value(1)))],
        1,
        |_| {},
    );
    let epoch = cl.client().routing().unwrap().epoch();
    for op in [DataOp::Get(key(1)), DataOp::Set(key(2), value(2))] {
        match common::raw_call(&c.rn_addr().to_string(), "", RequestBody::Data(op))? {
            ResponseBody::NotOwner { epoch: e } => assert_eq!(e, epoch),
            other => panic!("the routing node answered a data request with {other:?}"),
        }
    }
    // Nothing was written through it.
    let got = run_window(
        &mut cl,
        vec![RequestBody::Data(DataOp::Get(key(2)))],
        1,
        |_| {},
    );
    assert_eq!(got[&0], Ok(ResponseBody::Value(None)));
    Ok(())
}

#[test]
fn reads_in_flight_on_a_dead_node_are_served_by_its_heir() -> anyhow::Result<()> {
    let mut c = LocalCluster::start(small_cluster(3))?;
    let mut cl = pipelined(&c);
    let n = 600u64;
    let sets = (0..n)
        .map(|i| RequestBody::Data(DataOp::Set(key(i), value(i))))
        .collect();
    run_window(&mut cl, sets, 32, |_| {});
    let victim = c.nodes()[0].id();
    let gets = (0..n)
        .map(|i| RequestBody::Data(DataOp::Get(key(i))))
        .collect();
    let mut crashed = false;
    let results = run_window(&mut cl, gets, 48, |submitted| {
        if submitted == 200 && !crashed {
            crashed = true;
            c.crash_node(victim).expect("crash");
        }
    });
    assert!(crashed);
    for (tag, r) in results {
        assert_eq!(r, Ok(ResponseBody::Value(Some(value(tag)))), "get {tag}");
    }
    assert!(!cl.client().routing().unwrap().ring.contains(victim));
    Ok(())
}
