//! Bad input gets an error or a closed connection; the node keeps serving others and the pool is untouched.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Harness, TOKEN};
use dinomo_fabric::wire::{self, REQ_HEADER, RESP_HEADER, ReqHeader, RespHeader, op, status};
use dinomo_fabric::{
    Batch, ClientId, Connector, DATA_REGION, FabricError, MemoryNode, NodeConfig, ROOTS_REGION,
    RegionInfo, RemoteAddr, RpcError, RpcHandler, Server, ServerConfig, Target, VerbError,
};
use dinomo_pool::Pool;
use rand::{Rng, RngExt, SeedableRng};

fn verb_error(r: Result<impl std::fmt::Debug, FabricError>) -> VerbError {
    match r {
        Err(FabricError::Verb { error, .. }) => error,
        other => panic!("expected a verb refusal, got {other:?}"),
    }
}

/// Writes a recognisable pattern so that "untouched" means something.
fn seed_pattern(h: &Harness) -> Vec<u8> {
    let mut ep = h.connect(false);
    let r = ep.region(DATA_REGION).unwrap().clone();
    let pattern: Vec<u8> = (0..r.len).map(|i| (i * 7 % 251) as u8).collect();
    ep.write(r.at(r.start), &pattern).unwrap();
    h.data_image()
}

fn still_serving(h: &Harness) {
    for tcp in [false, true] {
        let mut ep = h.connect(tcp);
        let r = ep.region(DATA_REGION).unwrap().clone();
        let mut b = [0u8; 8];
        ep.read(r.at(r.start), &mut b).unwrap();
    }
}

#[test]
fn refused_verbs_leave_the_connection_usable() {
    let h = Harness::new(1 << 20, 1 << 16);
    let image = seed_pattern(&h);
    for tcp in [false, true] {
        let mut ep = h.connect(tcp);
        let data = ep.region(DATA_REGION).unwrap().clone();
        let roots = ep.region(ROOTS_REGION).unwrap().clone();
        let mut buf = [0u8; 16];
        assert_eq!(
            verb_error(ep.read(data.at(data.end() - 8), &mut buf)),
            VerbError::OutOfBounds
        );
        assert_eq!(
            verb_error(ep.read(data.at(data.start - 8), &mut buf)),
            VerbError::OutOfBounds
        );
        assert_eq!(
            verb_error(ep.write(data.at(u64::MAX - 4), b"overflow")),
            VerbError::OutOfBounds
        );
        let wrong_key = RemoteAddr {
            rkey: data.rkey ^ 1,
            ..data.at(data.start)
        };
        assert_eq!(verb_error(ep.write(wrong_key, b"x")), VerbError::BadKey);
        assert_eq!(verb_error(ep.faa(wrong_key, 1)), VerbError::BadKey);
        let no_region = RemoteAddr {
            region: 99,
            ..data.at(data.start)
        };
        assert_eq!(
            verb_error(ep.read(no_region, &mut buf)),
            VerbError::NoSuchRegion
        );
        assert_eq!(
            verb_error(ep.write(roots.at(roots.start), b"root")),
            VerbError::AccessDenied
        );
        assert_eq!(
            verb_error(ep.cas(roots.at(roots.start), 0, 1)),
            VerbError::AccessDenied
        );
        assert_eq!(
            verb_error(ep.faa(data.at(data.start + 4), 1)),
            VerbError::Misaligned
        );
        let mut huge = vec![0u8; (1 << 20) + 1];
        assert_eq!(
            verb_error(ep.read(data.at(data.start), &mut huge)),
            VerbError::TooLarge
        );
        // In a batch, an oversized WRITE is refused where it stands: the verb before it ran, the one after it did
        // not.
        let mut batch = Batch::new();
        let before = batch.faa(data.at(data.start + 8), 0);
        let oversized = batch.write(data.at(data.start), &huge);
        let after = batch.write(data.at(data.start), b"after");
        let posted = ep.post(&mut batch);
        assert!(
            matches!(
                posted,
                Err(FabricError::Verb {
                    index: 1,
                    error: VerbError::TooLarge,
                    ..
                })
            ),
            "tcp={tcp}: {posted:?}"
        );
        assert_eq!(batch.status(before), Ok(()));
        assert_eq!(batch.status(oversized), Err(VerbError::TooLarge));
        assert_eq!(batch.status(after), Err(VerbError::Skipped));
        // Still usable.
        ep.read(data.at(data.start), &mut buf).unwrap();
        ep.read(roots.at(roots.start), &mut buf).unwrap();
    }
    assert_eq!(h.data_image(), image, "refused verbs changed the pool");
}

#[test]
fn wrong_token_and_bad_handshakes_are_refused() {
    let h = Harness::new(1 << 20, 1 << 16);
    for tcp in [false, true] {
        let mut c = h.connector(tcp);
        c.config.cluster_token = "not-the-token".into();
        assert!(
            matches!(c.connect(), Err(FabricError::Handshake(m)) if m.contains("token")),
            "tcp={tcp}"
        );
    }
    // Bad magic, wrong version, overlong token: each refused with a reason, then closed.
    for hello in [
        b"HTTP/1.1".to_vec(),
        [
            &wire::HANDSHAKE_MAGIC[..],
            &99u16.to_le_bytes(),
            &0u16.to_le_bytes(),
        ]
        .concat(),
        [
            &wire::HANDSHAKE_MAGIC[..],
            &wire::PROTOCOL_VERSION.to_le_bytes(),
            &u16::MAX.to_le_bytes(),
        ]
        .concat(),
    ] {
        let mut s = TcpStream::connect(h.server.local_addr()).unwrap();
        s.write_all(&hello).unwrap();
        let mut reply = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_to_end(&mut reply).unwrap();
        assert_eq!(reply[0], 1, "refusal status");
        assert!(reply.len() > 5, "a refusal carries its reason");
    }
    still_serving(&h);
}

/// A raw connection that has passed the handshake.
fn raw_client(h: &Harness) -> TcpStream {
    let mut s = TcpStream::connect(h.server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = wire::HANDSHAKE_MAGIC.to_vec();
    hello.extend_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
    hello.extend_from_slice(&(TOKEN.len() as u16).to_le_bytes());
    hello.extend_from_slice(TOKEN.as_bytes());
    // Not named: no KV node's identity.
    hello.extend_from_slice(&wire::encode_identity(None));
    s.write_all(&hello).unwrap();
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0);
    let mut body = vec![0u8; u32::from_le_bytes(head[1..5].try_into().unwrap()) as usize];
    s.read_exact(&mut body).unwrap();
    s
}

fn read_response(s: &mut TcpStream) -> Option<RespHeader> {
    let mut b = [0u8; RESP_HEADER];
    s.read_exact(&mut b).ok()?;
    Some(RespHeader::decode(&b))
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// The encoded header of a single-verb request at the start of `region`.
fn header(region: &RegionInfo, opcode: u8, len: u32, id: u32) -> Vec<u8> {
    let mut frame = Vec::new();
    ReqHeader {
        op: opcode,
        flags: wire::FLAG_LAST,
        target: region.id,
        rkey: region.rkey,
        offset: region.start,
        len,
        id,
        arg0: 0,
        arg1: 0,
    }
    .encode(&mut frame);
    frame
}

#[test]
fn garbage_frames_and_absurd_lengths_close_the_connection() {
    let h = Harness::new(1 << 20, 1 << 16);
    let image = seed_pattern(&h);
    let data = h.node.regions()[0].clone();

    // Unknown opcode: BAD_REQUEST, then closed.
    let mut s = raw_client(&h);
    let frame = header(&data, 77, 0, 5);
    s.write_all(&frame).unwrap();
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status), (5, status::BAD_REQUEST));
    assert!(closed(&mut s));

    // WRITE announcing a 4 GiB payload: TOO_LARGE, closed, nothing written.
    let mut s = raw_client(&h);
    let mut frame = header(&data, op::WRITE, u32::MAX, 6);
    frame.extend_from_slice(&[0xAA; 4096]);
    let _ = s.write_all(&frame);
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status), (6, VerbError::TooLarge.code()));
    assert!(closed(&mut s));

    // READ of an absurd length: refused, connection stays usable.
    let mut s = raw_client(&h);
    let mut frame = header(&data, op::READ, u32::MAX, 7);
    frame.extend(header(&data, op::READ, 8, 8));
    s.write_all(&frame).unwrap();
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status, r.len), (7, VerbError::TooLarge.code(), 0));
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status, r.len), (8, status::OK, 8));

    // A client that vanishes mid-frame: half a header, then half a WRITE payload.
    let mut s = raw_client(&h);
    let frame = header(&data, op::WRITE, 1000, 9);
    s.write_all(&frame[..REQ_HEADER / 2]).unwrap();
    drop(s);
    let mut s = raw_client(&h);
    s.write_all(&frame).unwrap();
    s.write_all(&[0x55; 500]).unwrap();
    drop(s);

    std::thread::sleep(Duration::from_millis(50));
    still_serving(&h);
    assert_eq!(h.data_image(), image, "bad frames changed the pool");
}

#[test]
fn random_bytes_at_the_socket_never_hurt_the_node() {
    let h = Harness::new(1 << 20, 1 << 16);
    let image = seed_pattern(&h);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xD1_40_40);
    let deadline = Instant::now() + Duration::from_secs(10);
    for round in 0..300 {
        if Instant::now() > deadline {
            break;
        }
        // Half the rounds pass the handshake first so that the garbage reaches the verb parser.
        let mut s = if round % 2 == 0 {
            raw_client(&h)
        } else {
            TcpStream::connect(h.server.local_addr()).unwrap()
        };
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let n = rng.random_range(1..4096);
        let mut junk = vec![0u8; n];
        rng.fill_bytes(&mut junk);
        // Random opcodes are mostly invalid; make some frames look plausible (valid opcode, wrong key).
        if round % 3 == 0 && junk.len() >= REQ_HEADER {
            junk[0] = rng.random_range(1..=5);
        }
        let _ = s.write_all(&junk);
        let mut sink = [0u8; 1024];
        let _ = s.read(&mut sink);
    }
    std::thread::sleep(Duration::from_millis(50));
    still_serving(&h);
    assert_eq!(h.data_image(), image, "random bytes changed the pool");
}

#[test]
fn non_loopback_listen_requires_opt_in_and_token() {
    let pool = Arc::new(Pool::anonymous(1 << 20, 1 << 16).unwrap());
    let node = MemoryNode::new(pool, NodeConfig::default());
    let cfg = ServerConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let err = Server::start(node.clone(), cfg.clone())
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("non-loopback"), "{err}");
    let err = Server::start(
        node,
        ServerConfig {
            allow_non_loopback: true,
            ..cfg
        },
    )
    .err()
    .expect("must refuse");
    assert!(err.to_string().contains("token"), "{err}");
}

#[test]
fn connection_limit_is_enforced() {
    let pool = Arc::new(Pool::anonymous(1 << 20, 1 << 16).unwrap());
    let node = MemoryNode::new(pool, NodeConfig::default());
    let server = Server::start(
        node,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            max_connections: 2,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let c = Connector::new(Target::Tcp(server.local_addr()));
    let a = c.connect().unwrap();
    let _b = c.connect().unwrap();
    assert!(matches!(c.connect(), Err(FabricError::Handshake(m)) if m.contains("too many")));
    drop(a);
    // The slot frees once the server notices the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.connect() {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "slot never freed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[test]
fn fault_hooks_drop_delay_and_cut() {
    let h = Harness::new(1 << 20, 1 << 16);
    for tcp in [false, true] {
        let mut ep = h.connect(tcp);
        let r = ep.region(DATA_REGION).unwrap().clone();
        let mut b = [0u8; 8];
        // Delay.
        ep.hooks().set_delay(Duration::from_millis(20));
        let t = Instant::now();
        ep.read(r.at(r.start), &mut b).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(20));
        ep.hooks().set_delay(Duration::ZERO);
        // A dropped request times out and the endpoint must be replaced.
        ep.hooks().drop_next(1);
        assert!(matches!(
            ep.read(r.at(r.start), &mut b),
            Err(FabricError::Timeout)
        ));
        assert!(matches!(
            ep.read(r.at(r.start), &mut b),
            Err(FabricError::Disconnected(_))
        ));
        // Cut.
        let mut ep = h.connect(tcp);
        ep.faa(r.at(r.start), 1).unwrap();
        ep.hooks().cut();
        assert!(matches!(
            ep.faa(r.at(r.start), 1),
            Err(FabricError::Disconnected(_))
        ));
        assert!(ep.hooks().is_cut());
    }
    // Cut from the server side: clients see a lost connection, new ones work.
    let mut ep = h.connect(true);
    let r = ep.region(DATA_REGION).unwrap().clone();
    h.server.cut_all_connections();
    let e = ep.faa(r.at(r.start), 1).unwrap_err();
    assert!(e.is_connection_lost(), "{e}");
    still_serving(&h);
}

struct Echo;
impl RpcHandler for Echo {
    fn handle(
        &self,
        _caller: Option<ClientId>,
        method: u16,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        match method {
            1 => {
                response.extend_from_slice(request);
                response.reverse();
                Ok(())
            }
            2 => Err(RpcError::Failed("no such log".into())),
            5 => Err(RpcError::OutOfSpace("no segment left".into())),
            3 => panic!("handler bug"),
            4 => {
                let n: u64 = dinomo_fabric::decode(request)?;
                dinomo_fabric::encode(&(n * 2), response)
            }
            m => Err(RpcError::UnknownMethod(m)),
        }
    }
}

#[test]
fn rpc_calls_and_their_failures() {
    let h = Harness::new(1 << 20, 1 << 16);
    let mut resp = Vec::new();
    for tcp in [false, true] {
        // No handler installed yet.
        let mut ep = h.connect(tcp);
        assert!(matches!(
            ep.rpc(1, b"abc", &mut resp),
            Err(FabricError::Rpc(RpcError::UnknownMethod(1)))
        ));
    }
    h.node.set_rpc_handler(Arc::new(Echo));
    for tcp in [false, true] {
        let mut ep = h.connect(tcp);
        ep.rpc(1, b"abc", &mut resp).unwrap();
        assert_eq!(resp, b"cba");
        assert_eq!(ep.call::<u64, u64>(4, &21).unwrap(), 42);
        assert!(
            matches!(ep.rpc(2, b"", &mut resp), Err(FabricError::Rpc(RpcError::Failed(m))) if m == "no such log")
        );
        // Out of space stays out of space across the wire, so a KV node can tell its clients the store is full.
        assert!(
            matches!(ep.rpc(5, b"", &mut resp), Err(FabricError::Rpc(RpcError::OutOfSpace(m))) if m == "no segment left")
        );
        assert!(
            matches!(ep.rpc(3, b"", &mut resp), Err(FabricError::Rpc(RpcError::Failed(m))) if m.contains("panicked"))
        );
        assert!(matches!(
            ep.rpc(9, b"", &mut resp),
            Err(FabricError::Rpc(RpcError::UnknownMethod(9)))
        ));
        // A varint that overflows u64 cannot be decoded.
        assert!(matches!(
            ep.rpc(4, &[0xFF; 11], &mut resp),
            Err(FabricError::Rpc(RpcError::Codec(_)))
        ));
        // The endpoint still works after every failure.
        ep.rpc(1, b"xy", &mut resp).unwrap();
        assert_eq!(resp, b"yx");
        let big = vec![0u8; (1 << 20) + 1];
        assert!(ep.rpc(1, &big, &mut resp).is_err());
        ep.rpc(1, b"ok", &mut resp).unwrap();
    }
    // Method ids are 16 bits: a frame naming 0x1_0001 must not run method 1 (the echo) that it truncates to.
    let mut s = raw_client(&h);
    let mut frame = Vec::new();
    ReqHeader {
        op: op::RPC,
        flags: wire::FLAG_LAST,
        target: 0x1_0001,
        rkey: 0,
        offset: 0,
        len: 3,
        id: 11,
        arg0: 0,
        arg1: 0,
    }
    .encode(&mut frame);
    frame.extend_from_slice(b"abc");
    s.write_all(&frame).unwrap();
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status, r.len), (11, status::RPC_UNKNOWN, 0));
}

#[test]
fn a_large_write_that_arrives_in_pieces_is_applied_whole() {
    // The server grows a connection's buffer with the bytes that arrive, not with the announced length; a payload
    // many times the initial buffer, sent in pieces with pauses, must still land whole.
    let h = Harness::new(2 << 20, 1 << 16);
    let data = h.node.regions()[0].clone();
    let len = 600_000usize;
    assert!(data.len >= len as u64);
    let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut s = raw_client(&h);
    s.write_all(&header(&data, op::WRITE, len as u32, 12))
        .unwrap();
    for piece in payload.chunks(100_000) {
        std::thread::sleep(Duration::from_millis(5));
        s.write_all(piece).unwrap();
    }
    let r = read_response(&mut s).unwrap();
    assert_eq!((r.id, r.status), (12, status::OK));
    let mut back = vec![0u8; len];
    h.connect(true)
        .read(data.at(data.start), &mut back)
        .unwrap();
    assert!(back == payload, "the pool holds something else");
}
