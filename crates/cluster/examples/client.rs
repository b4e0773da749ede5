//! The native Rust client, step by step: connect through a routing node, read and write keys (each request goes
//! straight to the key's owner), read-modify-write at the owner, list keys, and keep many requests in flight.
//!
//! Against a running cluster (`dinomo up` serves its routing node on 127.0.0.1:7200 by default):
//!
//! ```sh
//! cargo run --release -p dinomo-cluster --example client -- 127.0.0.1:7200
//! ```
//!
//! Without an address it starts a two-node cluster in this process first (its data in memory, gone at exit).
//! A cluster with a token (`fabric.token`) takes it from `DINOMO_CLUSTER_TOKEN`.

use std::time::Instant;

use dinomo_cluster::wire::{RequestBody, ResponseBody};
use dinomo_cluster::{Client, ClientConfig, LocalCluster, LocalClusterConfig, PipelinedClient};
use dinomo_kn::DataOp;

fn main() -> anyhow::Result<()> {
    // A cluster of our own unless we were given one to reach.
    let (_cluster, config) = match std::env::args().nth(1) {
        Some(seed) => {
            let token = std::env::var("DINOMO_CLUSTER_TOKEN").unwrap_or_default();
            let config = ClientConfig {
                seeds: vec![seed],
                token: token.into(),
                ..ClientConfig::default()
            };
            (None, config)
        }
        None => {
            let cluster = LocalCluster::start(LocalClusterConfig {
                pool_size: 256 << 20,
                ..LocalClusterConfig::default()
            })?;
            let config = cluster.client_config();
            (Some(cluster), config)
        }
    };

    // The client fetches the routing table once and sends each request to its key's owner.
    let mut client = Client::connect(config.clone())?;
    client.set(b"greeting", b"hello")?;
    println!(
        "greeting = {:?}",
        client.get(b"greeting")?.map(String::from_utf8)
    );
    println!("owner of greeting: node {:?}", client.owner(b"greeting"));

    // Read-modify-writes run at the owner, one at a time per key: no increment is lost.
    println!("visits = {}", client.incr(b"visits", 1)?);
    println!("ratio = {}", client.incr_by_float(b"ratio", 0.25)?);
    println!(
        "taken = {:?}",
        client.get_del(b"greeting")?.map(String::from_utf8)
    );

    // Many requests in flight, each to its owner, completing in any order (tagged).
    let mut pipelined = PipelinedClient::connect(config)?;
    let started = Instant::now();
    const KEYS: u64 = 10_000;
    for i in 0..KEYS {
        let op = DataOp::Set(format!("key:{i}").into_bytes(), i.to_string().into_bytes());
        pipelined.submit(i, RequestBody::Data(op))?;
    }
    let mut written = 0;
    while let Some(done) = pipelined.next_completion() {
        match done.result? {
            ResponseBody::Applied(true) => written += 1,
            other => anyhow::bail!("set of key:{} answered {other:?}", done.tag),
        }
    }
    println!(
        "{written} keys written pipelined in {:?}",
        started.elapsed()
    );

    // A whole walk over the keys that match a pattern, each step's keys checked at their owners at once.
    let listed = pipelined.keys(b"key:99*")?;
    println!("{} keys match key:99*", listed.len());
    Ok(())
}
