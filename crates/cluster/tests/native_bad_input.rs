//! Bad input on the native protocol: random bytes before and after the handshake, absurd frame lengths, half frames
//! and clients that vanish mid-frame. Each gets an error or a closed connection; the node keeps serving others, its
//! data is untouched, and every connection's slot is given back (the node allows only a few at once here).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dinomo_cluster::wire::{ErrorKind, Request, RequestBody, Response, ResponseBody, read_frame};
use dinomo_cluster::{Client, ClientError, LocalCluster, SessionError, open_session};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

const TOKEN: &str = "bad-input-token";
/// Connections a node serves at once: far fewer than the test opens, so a slot that is not given back shows.
const MAX_CONNECTIONS: usize = 8;

fn cluster() -> anyhow::Result<LocalCluster> {
    let mut cfg = common::small_cluster(1);
    cfg.node.lease_ttl = Duration::from_secs(5);
    cfg.node.heartbeat = Duration::from_millis(50);
    cfg.memory_node.cluster_token = TOKEN.into();
    cfg.node.limits.max_connections = MAX_CONNECTIONS;
    cfg.node.limits.max_frame = 1 << 20;
    cfg.node.limits.handshake_timeout = Duration::from_secs(2);
    Ok(LocalCluster::start(cfg)?)
}

/// A greeted connection. The node serves only a few at once and a connection's slot comes back when its thread
/// has seen it close, so a new one may be turned away for a moment: try again for a while.
fn greet(addr: &str) -> anyhow::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open_session(addr, Duration::from_secs(5), TOKEN) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Reads whatever the server sends until it closes the connection (or 10 s pass); the frames it sent.
fn drain(mut s: TcpStream) -> Vec<Response> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let mut r = &all[..];
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    while let Ok(f) = read_frame::<Response>(&mut r, &mut buf, 16 << 20) {
        frames.push(f);
    }
    frames
}

#[test]
fn random_bytes_before_and_after_the_handshake_are_refused_and_the_node_keeps_serving()
-> anyhow::Result<()> {
    let c = cluster()?;
    let addr = c.nodes()[0].addr().to_string();
    let mut good = Client::connect(c.client_config())?;
    good.set(b"k", b"v")?;
    // Seeded: a failure repeats.
    let mut rng = StdRng::seed_from_u64(0x5eed_cafe_f00d_d00d);
    for round in 0..120 {
        let mut garbage = vec![0u8; rng.random_range(1..=2048)];
        rng.fill_bytes(&mut garbage);
        let mut s = if round % 2 == 0 {
            TcpStream::connect(&addr)?
        } else {
            greet(&addr)?
        };
        // The server may close before it has read everything: a failed write is an answer too.
        let _ = s.write_all(&garbage);
        let _ = s.shutdown(std::net::Shutdown::Write);
        for f in drain(s) {
            if let ResponseBody::Error { kind, .. } = f.body {
                assert!(
                    matches!(kind, ErrorKind::Refused | ErrorKind::Invalid),
                    "round {round}: {kind:?}"
                );
            }
        }
    }
    assert_eq!(good.get(b"k")?, Some(b"v".to_vec()));
    // More connections than the node serves at once came and went: their slots were given back.
    for _ in 0..2 * MAX_CONNECTIONS {
        Client::connect(c.client_config())?.get(b"k")?;
    }
    Ok(())
}

#[test]
fn absurd_lengths_half_frames_and_vanishing_clients_get_an_error_or_a_close() -> anyhow::Result<()>
{
    let c = cluster()?;
    let addr = c.nodes()[0].addr().to_string();
    let mut good = Client::connect(c.client_config())?;
    good.set(b"k", b"v")?;

    // A frame announced beyond the limit: refused by its length, before its body is read.
    for greeted in [false, true] {
        let mut s = if greeted {
            greet(&addr)?
        } else {
            TcpStream::connect(&addr)?
        };
        s.write_all(&u32::MAX.to_le_bytes())?;
        let frames = drain(s);
        let message = match frames.as_slice() {
            [
                Response {
                    body: ResponseBody::Error { message, .. },
                    ..
                },
            ] => message.clone(),
            other => panic!("greeted {greeted}: {other:?}"),
        };
        assert!(message.contains("exceeds the limit"), "{message}");
    }

    // Half a frame, then the client vanishes: before the handshake, and after it in the middle of a request.
    for greeted in [false, true] {
        for _ in 0..3 * MAX_CONNECTIONS {
            let mut s = if greeted {
                greet(&addr)?
            } else {
                TcpStream::connect(&addr)?
            };
            // Connections come faster than the node sees the last ones gone, so it may close a new one at once
            // for being over its limit: a failed write is that answer, and the slots are checked at the end.
            let _ = s
                .write_all(&100u32.to_le_bytes())
                .and_then(|()| s.write_all(&[1, 2, 3]));
            drop(s);
        }
    }

    // A request whose body does not decode after the handshake: an error naming it, then a close.
    let mut s = greet(&addr)?;
    s.write_all(&4u32.to_le_bytes())?;
    s.write_all(&[7, 250, 250, 250])?;
    let frames = drain(s);
    assert!(
        matches!(
            frames.as_slice(),
            [Response { body: ResponseBody::Error { kind: ErrorKind::Invalid, message }, .. }]
                if message.contains("malformed")
        ),
        "{frames:?}"
    );

    // A second Hello on a greeted connection is an error, and the connection keeps serving.
    let mut s = greet(&addr)?;
    let mut buf = Vec::new();
    for (id, body) in [
        (
            1,
            RequestBody::Hello {
                version: dinomo_cluster::wire::PROTOCOL_VERSION,
                token: dinomo_cluster::wire::Secret(TOKEN.into()),
            },
        ),
        (2, RequestBody::Ping),
    ] {
        dinomo_cluster::wire::write_frame(&mut s, &Request { id, body }, &mut buf)?;
    }
    s.flush()?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let first: Response = read_frame(&mut s, &mut buf, 1 << 20)?;
    assert!(
        matches!(&first.body, ResponseBody::Error { kind: ErrorKind::Invalid, message } if message.contains("already")),
        "{first:?}"
    );
    let second: Response = read_frame(&mut s, &mut buf, 1 << 20)?;
    assert_eq!((second.id, second.body), (2, ResponseBody::Done));
    drop(s);

    assert_eq!(good.get(b"k")?, Some(b"v".to_vec()));
    for _ in 0..2 * MAX_CONNECTIONS {
        Client::connect(c.client_config())?.get(b"k")?;
    }
    Ok(())
}

#[test]
fn a_connection_beyond_the_limit_is_told_why_and_the_client_says_so() -> anyhow::Result<()> {
    let c = cluster()?;
    let addr = c.nodes()[0].addr().to_string();
    let mut good = Client::connect(c.client_config())?;
    good.set(b"k", b"v")?;

    // Fill every slot the node has left (the cluster's own connections hold some): the next session is turned
    // away, with the reason. Then a client that needs a new connection retries until its timeout and names the
    // cause. A connection of the cluster's own (an M-node install just after the start) may end meanwhile and
    // free a slot for the client: fill again then, a bounded number of times.
    let mut held = Vec::new();
    let mut cfg = c.client_config();
    cfg.op_timeout = Duration::from_millis(300);
    let mut rounds = 0;
    let (why, err, mut late) = loop {
        let why = fill_slots(&addr, &mut held, MAX_CONNECTIONS)?;
        // The routing node has room: the client is made, its first request to the KV node finds none.
        let mut late = Client::connect(cfg.clone())?;
        match late.get(b"k") {
            Err(err) => break (why, err, late),
            Ok(_) => {
                rounds += 1;
                assert!(rounds < 20, "a slot freed up {rounds} times");
            }
        }
    };
    assert!(
        why.contains(&format!("at most {MAX_CONNECTIONS} connections")),
        "{why}"
    );
    assert!(
        matches!(&err, ClientError::Unavailable(m) if m.contains("turned the connection away")
            && m.contains(&format!("at most {MAX_CONNECTIONS} connections"))),
        "{err}"
    );
    // The connection the node already serves keeps working.
    assert_eq!(good.get(b"k")?, Some(b"v".to_vec()));

    // Slots come back when their connections close.
    drop(held);
    assert_eq!(late.get(b"k")?, Some(b"v".to_vec()));
    Ok(())
}

#[test]
fn a_client_that_finds_the_routing_node_full_says_so() -> anyhow::Result<()> {
    const RN_CONNECTIONS: usize = 2;
    let mut cfg = common::small_cluster(1);
    cfg.memory_node.cluster_token = TOKEN.into();
    cfg.rn_limits.max_connections = RN_CONNECTIONS;
    let c = LocalCluster::start(cfg)?;
    let rn = c.rn_addr().to_string();
    let mut held = Vec::new();
    fill_slots(&rn, &mut held, RN_CONNECTIONS)?;
    let mut cfg = c.client_config();
    cfg.op_timeout = Duration::from_millis(300);
    let err = Client::connect(cfg.clone())
        .err()
        .expect("the routing node has no slot");
    assert!(
        matches!(&err, ClientError::Unavailable(m) if m.contains("no seed answered")
            && m.contains(&format!("at most {RN_CONNECTIONS} connections"))),
        "{err}"
    );
    drop(held);
    Client::connect(cfg)?.set(b"k", b"v")?;
    Ok(())
}

/// Opens sessions to `addr`, kept in `held`, until one is turned away; why it was. A node allowing `limit`
/// connections turns one away by then.
fn fill_slots(addr: &str, held: &mut Vec<TcpStream>, limit: usize) -> anyhow::Result<String> {
    loop {
        assert!(
            held.len() <= limit,
            "{} sessions open beyond a limit of {limit}",
            held.len()
        );
        match open_session(addr, Duration::from_secs(5), TOKEN) {
            Ok(s) => held.push(s),
            Err(SessionError::Busy(why)) => return Ok(why),
            Err(e) => anyhow::bail!("expected a session or a busy node, got: {e}"),
        }
    }
}
