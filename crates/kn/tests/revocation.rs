//! A KV node the memory node took over (`TAKE_OVER_NODE`) is revoked there, over TCP as in process: its next write
//! lands nowhere, it cannot connect or claim its logs again, and what it wrote before is served by others.

use std::sync::Arc;

use anyhow::{Result, ensure};
use dinomo_dpm::{Processor, ProcessorConfig, proto};
use dinomo_fabric::{
    ClientId, Connector, FabricError, MemoryNode, NodeConfig, RpcError, Server, ServerConfig,
    Target,
};
use dinomo_kn::{KnConfig, KnError, KvNode};
use dinomo_pool::Pool;

struct MemoryNodeUnderTest {
    node: Arc<MemoryNode>,
    processor: Arc<Processor>,
    _server: Server,
    connector: Connector,
}

fn memory_node(tcp: bool) -> Result<MemoryNodeUnderTest> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 16 << 10,
            ..ProcessorConfig::default()
        },
    )?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    let server = Server::start(
        node.clone(),
        ServerConfig {
            listen: "127.0.0.1:0".parse()?,
            ..ServerConfig::default()
        },
    )?;
    let connector = Connector::new(if tcp {
        Target::Tcp(server.local_addr())
    } else {
        Target::InProcess(node.clone())
    });
    Ok(MemoryNodeUnderTest {
        node,
        processor,
        _server: server,
        connector,
    })
}

fn kv_node(connector: &Connector, node_id: u32) -> Result<KvNode> {
    Ok(KvNode::start(
        KnConfig {
            node_id,
            threads: 1,
            max_value_len: 1024,
            ..KnConfig::default()
        },
        connector.clone(),
    )?)
}

/// Node 1 taken over at the memory node, as the M-node asks it to, naming `incarnation`.
fn take_over(m: &MemoryNodeUnderTest, incarnation: u64) -> Result<proto::NodeTakenOver> {
    Ok(m.connector.connect()?.call(
        proto::TAKE_OVER_NODE,
        &proto::TakeOverNode {
            node_id: 1,
            incarnation: Some(incarnation),
            // No management node acts in these tests.
            epoch: 0,
        },
    )?)
}

/// What a node started afterwards (anonymous, node 2) reads of `key`.
fn read_by_another_node(m: &MemoryNodeUnderTest, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let other = kv_node(&m.connector, 2)?;
    let got = other.handle().get(key)?;
    other.stop();
    Ok(got)
}

#[test]
fn a_kv_node_taken_over_writes_nothing_more_and_cannot_claim_its_logs_back() -> Result<()> {
    for tcp in [false, true] {
        let m = memory_node(tcp)?;
        let id = ClientId {
            node: 1,
            incarnation: 11,
        };
        let kv = kv_node(&m.connector.for_client(id), 1)?;
        let h = kv.handle();
        h.set(b"k", b"before")?;

        let taken = take_over(&m, id.incarnation)?;
        ensure!(taken.revoked_connections >= 1, "tcp={tcp}: {taken:?}");
        ensure!(
            m.node.clients().connected().is_empty(),
            "tcp={tcp}: the node is still connected"
        );

        // The write's WRITE is refused (in process) or goes out on a closed connection (TCP): either way it is not
        // acknowledged, and the node cannot connect again to retry it.
        let late = h.set(b"k", b"after");
        ensure!(
            late.is_err(),
            "tcp={tcp}: a revoked node acknowledged a write"
        );
        let again = h.set(b"k", b"after");
        ensure!(
            matches!(&again, Err(KnError::Fabric(FabricError::Revoked(_)))),
            "tcp={tcp}: {again:?}"
        );
        ensure!(
            matches!(
                m.connector.for_client(id).connect(),
                Err(FabricError::Revoked(_))
            ),
            "tcp={tcp}"
        );
        // A claim that got past the connection's check (one on its way when the revocation came) is refused by the
        // processor, which looks at who calls.
        let mut claim = Vec::new();
        dinomo_fabric::encode(
            &proto::OpenLog {
                node_id: 1,
                thread: 0,
            },
            &mut claim,
        )?;
        let refused = m.processor.rpc_handler(&m.node).handle(
            Some(id),
            proto::OPEN_LOG,
            &claim,
            &mut Vec::new(),
        );
        ensure!(
            matches!(&refused, Err(RpcError::Failed(why)) if why.contains("revoked")),
            "tcp={tcp}: {refused:?}"
        );

        // Another node serves what the revoked one acknowledged, and nothing else.
        drop(h);
        kv.stop();
        ensure!(
            read_by_another_node(&m, b"k")? == Some(b"before".to_vec()),
            "tcp={tcp}"
        );
    }
    Ok(())
}

/// A take-over that names an older incarnation (one a management node that stalled meant to take over) leaves the
/// incarnation running now connected and its logs to it: what it acknowledges afterwards is not sealed away, and
/// another node reads it once it stops.
#[test]
fn a_take_over_of_an_older_incarnation_leaves_the_running_one_alone() -> Result<()> {
    for tcp in [false, true] {
        let m = memory_node(tcp)?;
        let running = ClientId {
            node: 1,
            incarnation: 12,
        };
        let kv = kv_node(&m.connector.for_client(running), 1)?;
        let h = kv.handle();
        h.set(b"k", b"v1")?;
        let taken = take_over(&m, 11)?;
        ensure!(taken.revoked_connections == 0, "tcp={tcp}: {taken:?}");
        ensure!(
            m.node.clients().connected() == vec![running],
            "tcp={tcp}: {:?}",
            m.node.clients().connected()
        );
        h.set(b"k", b"v2")?;
        ensure!(h.get(b"k")? == Some(b"v2".to_vec()), "tcp={tcp}");
        drop(h);
        kv.stop();
        let got = read_by_another_node(&m, b"k")?;
        ensure!(got == Some(b"v2".to_vec()), "tcp={tcp}: {got:?}");
    }
    Ok(())
}
