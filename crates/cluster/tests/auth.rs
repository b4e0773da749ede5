//! The native protocol's handshake: a cluster with a token serves only connections that present it, refuses the
//! others with a clear error before anything else is read, and closes connections that never greet. The M-node
//! presents the token too: nodes still join under it.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dinomo_cluster::wire::{
    ErrorKind, PROTOCOL_VERSION, Request, RequestBody, Response, ResponseBody, Routing, Secret,
    read_frame, write_frame,
};
use dinomo_cluster::{
    Client, ClientConfig, ClientError, Expected, LocalCluster, PipelinedClient, RoutingNode,
    ServerLimits, SessionError, Welcomed, open_session, open_session_expecting,
};
use dinomo_kn::DataOp;
use dinomo_ring::Ring;

const TOKEN: &str = "s3cret-cluster-token";

fn cluster() -> anyhow::Result<LocalCluster> {
    let mut cfg = common::small_cluster(2);
    cfg.node.lease_ttl = Duration::from_secs(5);
    cfg.node.heartbeat = Duration::from_millis(50);
    cfg.memory_node.cluster_token = TOKEN.into();
    cfg.node.limits.handshake_timeout = Duration::from_millis(300);
    Ok(LocalCluster::start(cfg)?)
}

/// Sends `request` as the first frame on a fresh connection to `addr`; the answer and the connection.
fn first_frame(addr: &str, request: Request) -> anyhow::Result<(Response, TcpStream)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    write_frame(&mut s, &request, &mut buf)?;
    let answer: Response = read_frame(&mut s, &mut buf, 1 << 20)?;
    Ok((answer, s))
}

/// Whether the server closes `s` (within 10 s) without sending anything more.
fn closed_by_server(mut s: TcpStream) -> bool {
    match s.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

fn refusal(r: &Response) -> Option<&str> {
    match &r.body {
        ResponseBody::Error {
            kind: ErrorKind::Refused,
            message,
        } => Some(message),
        _ => None,
    }
}

#[test]
fn only_connections_presenting_the_cluster_token_are_served() -> anyhow::Result<()> {
    let c = cluster()?;
    let rn = c.rn_addr().to_string();
    let kn = c.nodes()[0].addr().to_string();

    let mut good = Client::connect(c.client_config())?;
    good.set(b"k", b"v")?;
    assert_eq!(good.get(b"k")?, Some(b"v".to_vec()));

    // A client with a wrong or no token fails at once with the reason, not after its whole timeout.
    for token in ["wrong", ""] {
        let started = Instant::now();
        let err = Client::connect(ClientConfig {
            token: token.into(),
            op_timeout: Duration::from_secs(20),
            ..c.client_config()
        })
        .err()
        .expect("refused");
        assert!(
            matches!(&err, ClientError::Invalid(m) if m.contains("wrong cluster token")),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    }
    for addr in [&rn, &kn] {
        match open_session(addr, Duration::from_secs(5), "wrong") {
            Err(SessionError::Refused(m)) => assert_eq!(m, "wrong cluster token"),
            other => panic!("{addr}: {other:?}"),
        }
        open_session(addr, Duration::from_secs(5), TOKEN)?;
    }

    // Requests before the handshake are refused unserved and the connection is closed: an unauthenticated
    // Install would otherwise take the node's keys.
    let forged = Routing {
        ring: Ring::with_nodes(16, [7]),
        addrs: Default::default(),
        cells: Default::default(),
    };
    for body in [
        RequestBody::Install(forged),
        RequestBody::Data(DataOp::Set(b"k".to_vec(), b"forged".to_vec())),
        RequestBody::EpochStats,
        RequestBody::Routing,
    ] {
        let (answer, conn) = first_frame(&kn, Request { id: 9, body })?;
        assert_eq!(answer.id, 9);
        let why = refusal(&answer).expect("refused");
        assert!(why.contains("must be Hello"), "{why}");
        assert!(
            closed_by_server(conn),
            "the connection stays open after a refusal"
        );
    }
    assert_eq!(good.get(b"k")?, Some(b"v".to_vec()));
    // The node still serves under the M-node's table, not the forged one.
    match common::raw_call(&kn, TOKEN, RequestBody::Routing)? {
        ResponseBody::Routing(r) => {
            assert!(
                !r.ring.contains(7) && r.ring.contains(c.nodes()[0].id()),
                "{r:?}"
            )
        }
        other => panic!("{other:?}"),
    }

    // Another protocol version is refused, naming both.
    let hello = |version| Request {
        id: 1,
        body: RequestBody::Hello {
            version,
            token: Secret(TOKEN.into()),
        },
    };
    let (answer, conn) = first_frame(&kn, hello(PROTOCOL_VERSION + 1))?;
    let why = refusal(&answer).expect("refused");
    assert!(
        why.contains(&format!("version {}", PROTOCOL_VERSION + 1))
            && why.contains(&format!("speaks {PROTOCOL_VERSION}")),
        "{why}"
    );
    assert!(closed_by_server(conn));
    let (answer, _) = first_frame(&kn, hello(PROTOCOL_VERSION))?;
    let node = c.nodes()[0].id();
    let pool = match answer.body {
        ResponseBody::Welcome {
            version: PROTOCOL_VERSION,
            node: Some(n),
            pool,
        } if n == node && pool != 0 => pool,
        other => panic!("{other:?}"),
    };
    // The welcome says who answers: a session meant for another node, or for another cluster's, is refused as
    // reaching someone else (an address a stopped node left to another server), and one meant for this node
    // opens.
    let expecting = |node, pool| {
        open_session_expecting(&kn, Duration::from_secs(5), TOKEN, Expected { node, pool })
    };
    for (n, p) in [
        (Some(node + 100), None),
        (None, Some(pool ^ 1)),
        (Some(node), Some(pool ^ 1)),
    ] {
        match expecting(n, p) {
            Err(SessionError::Elsewhere(why)) => assert!(why.contains(&kn), "{why}"),
            other => panic!("{n:?} {p:?}: {other:?}"),
        }
    }
    let (_, welcomed) = expecting(Some(node), Some(pool))?;
    assert_eq!(
        welcomed,
        Welcomed {
            node: Some(node),
            pool
        }
    );
    match open_session_expecting(
        &rn,
        Duration::from_secs(5),
        TOKEN,
        Expected {
            node: Some(node),
            pool: None,
        },
    ) {
        Err(SessionError::Elsewhere(why)) => assert!(why.contains("a routing node"), "{why}"),
        other => panic!("{other:?}"),
    }

    // A routing node and KV nodes configured with different tokens: a client gets its table from the first, and
    // its requests to the second are refused with the reason, one at a time and pipelined.
    let odd_rn = RoutingNode::start(
        "127.0.0.1:0".parse()?,
        c.meta_store(),
        Duration::from_millis(5),
        ServerLimits::default(),
        "other",
    )?;
    let odd = ClientConfig {
        seeds: vec![odd_rn.local_addr().to_string()],
        token: "other".into(),
        ..c.client_config()
    };
    let err = Client::connect(odd.clone())?.get(b"k").unwrap_err();
    assert!(
        matches!(&err, ClientError::Invalid(m) if m.contains("wrong cluster token")),
        "{err}"
    );
    let mut pipelined = PipelinedClient::connect(odd)?;
    pipelined.submit(1, RequestBody::Data(DataOp::Get(b"k".to_vec())))?;
    let done = pipelined.next_completion().expect("a completion");
    assert!(
        matches!(&done.result, Err(ClientError::Invalid(m)) if m.contains("wrong cluster token")),
        "{:?}",
        done.result
    );
    Ok(())
}

#[test]
fn a_connection_that_never_greets_is_closed_after_the_handshake_timeout() -> anyhow::Result<()> {
    let c = cluster()?;
    let mut s = TcpStream::connect(c.nodes()[0].addr())?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let started = Instant::now();
    let n = s.read(&mut [0u8; 16]).unwrap_or(0);
    assert_eq!(n, 0, "the server sent something to a silent connection");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(15),
        "closed after {waited:?}, the handshake timeout is 300 ms"
    );
    // The node still serves.
    Client::connect(c.client_config())?.set(b"after", b"1")?;
    Ok(())
}

#[test]
fn the_m_node_presents_the_token_when_nodes_join_and_leave() -> anyhow::Result<()> {
    let mut c = cluster()?;
    let mut client = Client::connect(c.client_config())?;
    for i in 0..50u32 {
        client.set(format!("k{i}").as_bytes(), &i.to_le_bytes())?;
    }
    let added = c.add_node()?;
    let first = c.nodes()[0].id();
    c.remove_node(first)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        client.refresh_routing();
        let r = client.routing().expect("routing");
        if r.ring.contains(added) && !r.ring.contains(first) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ring never took the join and the removal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..50u32 {
        assert_eq!(
            client.get(format!("k{i}").as_bytes())?,
            Some(i.to_le_bytes().to_vec())
        );
    }
    Ok(())
}

#[test]
fn a_non_loopback_native_listener_needs_a_token() -> anyhow::Result<()> {
    let c = cluster()?;
    let err = RoutingNode::start(
        "0.0.0.0:0".parse()?,
        c.meta_store(),
        Duration::from_millis(5),
        ServerLimits::default(),
        "",
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("non-loopback") && err.contains("token"),
        "{err}"
    );
    Ok(())
}
