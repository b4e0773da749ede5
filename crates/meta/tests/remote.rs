//! The embedded store served by a memory node and reached with `RemoteMeta`, in process and over TCP.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dinomo_fabric::{
    Connector, FabricError, MemoryNode, NodeConfig, RpcError, Server, ServerConfig, Target,
};
use dinomo_meta::{
    EmbeddedMeta, META_LOAD, META_METHODS, META_STORE, MetaConfig, MetaError, MetaService,
    MetaStore, RemoteMeta, Versioned,
};
use dinomo_pool::Pool;

const TOKEN: &str = "meta-test";
const MAX_RECORD: usize = 200 << 10;

struct Node {
    meta: Arc<EmbeddedMeta>,
    node: Arc<MemoryNode>,
    server: Server,
}

fn node() -> Node {
    let pool = Arc::new(Pool::anonymous(16 << 20, 64 << 10).unwrap());
    let meta = EmbeddedMeta::open(
        pool.clone(),
        MetaConfig {
            max_record_len: MAX_RECORD,
            ..MetaConfig::default()
        },
    )
    .unwrap();
    let node = MemoryNode::new(
        pool,
        NodeConfig {
            cluster_token: TOKEN.into(),
            max_message_len: 1 << 20,
            ..NodeConfig::default()
        },
    );
    node.set_rpc_handler(Arc::new(MetaService::new(meta.clone())));
    let server = Server::start(
        node.clone(),
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    Node { meta, node, server }
}

impl Node {
    fn connector(&self, tcp: bool) -> Connector {
        let mut c = Connector::new(if tcp {
            Target::Tcp(self.server.local_addr())
        } else {
            Target::InProcess(self.node.clone())
        });
        c.config.cluster_token = TOKEN.into();
        c.config.timeout = Duration::from_secs(5);
        c
    }
}

#[test]
fn in_process_remote_store_behaves() -> anyhow::Result<()> {
    let n = node();
    let remote = RemoteMeta::new(n.connector(false));
    common::conformance(&remote, &common::Params::embedded(MAX_RECORD))
}

#[test]
fn tcp_remote_store_behaves() -> anyhow::Result<()> {
    let n = node();
    let remote = RemoteMeta::new(n.connector(true));
    common::conformance(&remote, &common::Params::embedded(MAX_RECORD))
}

#[test]
fn remote_and_local_see_the_same_store() {
    let n = node();
    let remote = RemoteMeta::new(n.connector(true));
    let v = remote.store(None, b"from afar").unwrap();
    assert_eq!(
        n.meta.load().unwrap(),
        Some(Versioned {
            version: v,
            value: b"from afar".to_vec()
        })
    );
    let lease = n.meta.grant(Duration::from_secs(30)).unwrap();
    remote.register("kn/1", b"i", lease).unwrap();
    assert_eq!(n.meta.members("kn/").unwrap().len(), 1);
}

#[test]
fn a_cut_connection_is_replaced_once() {
    let n = node();
    let remote = RemoteMeta::new(n.connector(true));
    let v1 = remote.store(None, b"one").unwrap();
    n.server.cut_all_connections();
    // The stale connection fails; the call goes out again on a new one, and runs once.
    let v2 = remote.store(Some(v1), b"two").unwrap();
    assert!(v2 > v1);
    assert_eq!(remote.load().unwrap().unwrap().version, v2);
    n.server.cut_all_connections();
    let lease = remote.grant(Duration::from_secs(30)).unwrap();
    assert_eq!(n.meta.live_leases(), 1);
    n.server.cut_all_connections();
    remote.revoke(lease).unwrap();
    assert_eq!(n.meta.live_leases(), 0);
}

#[test]
fn an_unreachable_store_is_unavailable() {
    let mut n = node();
    let remote = RemoteMeta::new(n.connector(true));
    remote.load().unwrap();
    n.server.shutdown();
    for r in [
        remote.load().map(|_| ()),
        remote.store(None, b"x").map(|_| ()),
        remote.keep_alive(1),
    ] {
        assert!(matches!(r, Err(MetaError::Unavailable(_))), "{r:?}");
    }
    // Nothing was written behind the failed calls.
    assert_eq!(n.meta.load().unwrap(), None);
}

#[test]
fn a_request_beyond_the_fabric_limit_is_invalid() {
    let pool = Arc::new(Pool::anonymous(16 << 20, 64 << 10).unwrap());
    // A store accepting larger records than the fabric carries: the fabric's refusal is an argument error.
    let meta = EmbeddedMeta::open(pool.clone(), MetaConfig::default()).unwrap();
    let node = MemoryNode::new(
        pool,
        NodeConfig {
            max_message_len: 4096,
            ..NodeConfig::default()
        },
    );
    node.set_rpc_handler(Arc::new(MetaService::new(meta.clone())));
    let remote = RemoteMeta::new(Connector::new(Target::InProcess(node)));
    assert!(matches!(
        remote.store(None, &[0u8; 8192]),
        Err(MetaError::Invalid(_))
    ));
    assert_eq!(meta.load().unwrap(), None);
}

#[test]
fn resent_mutations_run_once() {
    let n = node();
    let mut ep = n.connector(true).connect().unwrap();
    // The wire form of a store: request id, expected version, value.
    let body = |id: u64, expected: Option<u64>, value: &[u8]| {
        #[derive(serde::Serialize)]
        struct Store<'a> {
            request_id: u64,
            expected: Option<u64>,
            value: &'a [u8],
        }
        let mut b = Vec::new();
        dinomo_fabric::encode(
            &Store {
                request_id: id,
                expected,
                value,
            },
            &mut b,
        )
        .unwrap();
        b
    };
    let mut reply = Vec::new();
    let mut call = |b: &[u8]| -> Result<u64, MetaError> {
        ep.rpc(META_STORE, b, &mut reply).unwrap();
        dinomo_fabric::decode::<Result<u64, MetaError>>(&reply).unwrap()
    };
    let first = call(&body(77, None, b"a")).unwrap();
    // The same id again: the first reply, not a conflict, and no second write.
    assert_eq!(call(&body(77, None, b"a")), Ok(first));
    assert_eq!(n.meta.load().unwrap().unwrap().version, first);
    // Another id is another call.
    assert_eq!(
        call(&body(78, None, b"a")),
        Err(MetaError::Conflict {
            current: Some(first)
        })
    );
    // Id 0 opts out.
    let second = call(&body(0, Some(first), b"b")).unwrap();
    assert_eq!(
        call(&body(0, Some(first), b"b")),
        Err(MetaError::Conflict {
            current: Some(second)
        })
    );
}

#[test]
fn resend_window_is_bounded() {
    let pool = Arc::new(Pool::anonymous(4 << 20, 64 << 10).unwrap());
    let meta = EmbeddedMeta::open(pool, MetaConfig::default()).unwrap();
    let svc = MetaService::with_dedup_window(meta.clone(), 2);
    let grant = |id: u64| {
        #[derive(serde::Serialize)]
        struct Grant {
            request_id: u64,
            ttl: Duration,
        }
        let mut b = Vec::new();
        dinomo_fabric::encode(
            &Grant {
                request_id: id,
                ttl: Duration::from_secs(30),
            },
            &mut b,
        )
        .unwrap();
        let mut out = Vec::new();
        svc.handle(dinomo_meta::META_GRANT, &b, &mut out).unwrap();
        dinomo_fabric::decode::<Result<u64, MetaError>>(&out)
            .unwrap()
            .unwrap()
    };
    let a = grant(1);
    assert_eq!(grant(1), a);
    grant(2);
    grant(3);
    // Id 1 has left the window: it runs again.
    assert_ne!(grant(1), a);
    assert_eq!(meta.live_leases(), 4);
}

#[test]
fn bad_calls_are_rpc_errors() {
    let n = node();
    let mut ep = n.connector(true).connect().unwrap();
    let mut reply = Vec::new();
    let unused = *META_METHODS.end();
    match ep.rpc(unused, &[], &mut reply) {
        Err(FabricError::Rpc(RpcError::UnknownMethod(m))) => assert_eq!(m, unused),
        other => panic!("{other:?}"),
    }
    match ep.rpc(META_STORE, &[0xff, 0xff, 0xff], &mut reply) {
        Err(FabricError::Rpc(RpcError::Codec(_))) => {}
        other => panic!("{other:?}"),
    }
    // The connection is still usable.
    ep.rpc(META_LOAD, &[], &mut reply).unwrap();
    let r: Result<Option<Versioned>, MetaError> = dinomo_fabric::decode(&reply).unwrap();
    assert_eq!(r, Ok(None));
}
