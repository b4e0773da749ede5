//! The cluster with its metadata in a real etcd (Debian etcd-server at /usr/bin/etcd): membership and liveness by
//! etcd leases, the M-node elected through etcd; killing the leading M-node hands the cluster to the standby, which
//! then handles a KV-node failure and a join while the cluster keeps serving.
#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dinomo_cluster::{
    Client, ClientConfig, ClusterNode, MNode, MNodeConfig, NodeConfig, RoutingNode, ServerLimits,
};
use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig as FabricNodeConfig, Target};
use dinomo_kn::KnConfig;
use dinomo_meta::{EtcdConfig, LocalEtcd, MetaStore};

fn connect(etcd: &mut LocalEtcd) -> Result<Arc<dyn MetaStore>> {
    Ok(Arc::new(etcd.connect(EtcdConfig {
        prefix: "/dinomo-cluster-test/".into(),
        timeout: Duration::from_secs(2),
        ..EtcdConfig::default()
    })?))
}

fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > timeout {
            bail!("timed out waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[test]
fn standby_mnode_takes_over_and_handles_failures_and_joins() -> Result<()> {
    let mut etcd = LocalEtcd::start()?;
    let pool = Arc::new(dinomo_pool::Pool::anonymous(256 << 20, 1 << 20)?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 1 << 20,
            ..ProcessorConfig::default()
        },
    )?;
    // Every part presents the cluster token: the KV nodes and M-nodes to the memory node, the M-nodes and the
    // client to the KV and routing nodes.
    const TOKEN: &str = "etcd-test-token";
    let memory = MemoryNode::new(
        pool,
        FabricNodeConfig {
            cluster_token: TOKEN.into(),
            ..FabricNodeConfig::default()
        },
    );
    processor.serve(&memory);
    let mut connector = Connector::new(Target::InProcess(memory.clone()));
    connector.config.cluster_token = TOKEN.into();
    let node_cfg = |id| NodeConfig {
        node_id: id,
        kn: KnConfig {
            threads: 2,
            max_value_len: 64 << 10,
            ..KnConfig::default()
        },
        // etcd's shortest lease.
        lease_ttl: Duration::from_secs(2),
        heartbeat: Duration::from_millis(300),
        ..NodeConfig::default()
    };
    let mut nodes: Vec<ClusterNode> = (1..=3)
        .map(|id| {
            ClusterNode::start(node_cfg(id), connector.clone(), connect(&mut etcd)?)
                .map_err(Into::into)
        })
        .collect::<Result<_>>()?;
    let mnode_cfg = |name: &str| MNodeConfig {
        name: name.into(),
        lease_ttl: Duration::from_secs(2),
        failure_grace: Duration::from_secs(3),
        ..MNodeConfig::default()
    };
    let first = MNode::start(mnode_cfg("m1"), connect(&mut etcd)?, connector.clone())?;
    wait("m1 leads", Duration::from_secs(10), || first.is_leading())?;
    let standby = MNode::start(mnode_cfg("m2"), connect(&mut etcd)?, connector.clone())?;
    let rn = RoutingNode::start(
        "127.0.0.1:0".parse()?,
        connect(&mut etcd)?,
        Duration::from_millis(20),
        ServerLimits::default(),
        TOKEN,
    )?;
    let mut client = Client::connect(ClientConfig {
        seeds: vec![rn.local_addr().to_string()],
        token: TOKEN.into(),
        op_timeout: Duration::from_secs(15),
        ..ClientConfig::default()
    })?;
    wait(
        "three nodes are in the ring",
        Duration::from_secs(20),
        || {
            client.refresh_routing();
            client.routing().is_some_and(|r| r.ring.len() == 3)
        },
    )?;
    for i in 0..200u32 {
        client.set(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())?;
    }
    assert!(!standby.is_leading());

    // The leader dies; the standby takes over once its lease expires in etcd.
    first.crash();
    wait("the standby leads", Duration::from_secs(15), || {
        standby.is_leading()
    })?;
    for i in 0..200u32 {
        assert_eq!(
            client.get(format!("k{i}").as_bytes())?,
            Some(format!("v{i}").into_bytes())
        );
    }

    // The new leader handles a KV-node failure (seen through the node's etcd lease) ...
    let victim = nodes.remove(0);
    let victim_id = victim.id();
    victim.crash();
    for i in 0..200u32 {
        assert_eq!(
            client.get(format!("k{i}").as_bytes())?,
            Some(format!("v{i}").into_bytes()),
            "k{i}"
        );
    }
    assert!(!client.routing().expect("routing").ring.contains(victim_id));
    // ... and a join.
    nodes.push(ClusterNode::start(
        node_cfg(7),
        connector.clone(),
        connect(&mut etcd)?,
    )?);
    wait("node 7 joins", Duration::from_secs(20), || {
        client.refresh_routing();
        client.routing().is_some_and(|r| r.ring.contains(7))
    })?;
    for i in 0..200u32 {
        client.set(format!("k{i}").as_bytes(), format!("w{i}").as_bytes())?;
        assert_eq!(
            client.get(format!("k{i}").as_bytes())?,
            Some(format!("w{i}").into_bytes())
        );
    }
    let kinds: Vec<_> = standby.events().iter().map(|e| (e.kind, e.node)).collect();
    assert!(
        kinds.contains(&(dinomo_cluster::ReconfigKind::Failure, victim_id)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&(dinomo_cluster::ReconfigKind::Add, 7)),
        "{kinds:?}"
    );
    drop(rn);
    standby.stop();
    for n in nodes {
        n.stop();
    }
    processor.shutdown();
    Ok(())
}
