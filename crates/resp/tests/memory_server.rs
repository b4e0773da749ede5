//! The server over TCP with the in-memory backend: pipelining, large values, the client limit, protected mode,
//! passwords, the idle timeout, and clients that misbehave or vanish while others are served.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dinomo_resp::value::Value;
use dinomo_resp::{MemoryBackend, RespServer, ServerConfig, ServerError, encode_request};

mod common;

use common::Conn;

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn server(config: ServerConfig) -> RespServer {
    RespServer::start(
        ServerConfig {
            listen: local(),
            ..config
        },
        MemoryBackend::new(),
    )
    .expect("start")
}

/// Waits up to 10 s for the server to count no more than `n` open connections; fails with `why` if it never does.
fn wait_for_connected_clients(s: &RespServer, n: usize, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.stats().connected_clients > n {
        assert!(Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn bulk(b: &[u8]) -> Value {
    Value::Bulk(b.to_vec())
}

fn ok() -> Value {
    Value::Simple(b"OK".to_vec())
}

#[test]
fn pipelines_are_answered_in_order() {
    let s = server(ServerConfig::default());
    let mut c = Conn::open(s.local_addr());
    let mut wire = Vec::new();
    for i in 0..500u32 {
        encode_request(
            &[
                b"SET".as_slice(),
                format!("k{i}").as_bytes(),
                &i.to_le_bytes(),
            ],
            &mut wire,
        );
        encode_request(&[b"INCR".as_slice(), b"counter"], &mut wire);
        encode_request(&[b"GET".as_slice(), format!("k{i}").as_bytes()], &mut wire);
    }
    c.stream.write_all(&wire).unwrap();
    for i in 0..500u32 {
        assert_eq!(c.read(), Some(ok()));
        assert_eq!(c.read(), Some(Value::Integer(i64::from(i) + 1)));
        assert_eq!(c.read(), Some(bulk(&i.to_le_bytes())));
    }
    assert_eq!(c.call(&[b"DBSIZE"]), Value::Integer(501));
    assert!(s.stats().commands_processed >= 1501);
}

#[test]
fn large_values_round_trip() {
    let s = server(ServerConfig::default());
    let mut c = Conn::open(s.local_addr());
    let value: Vec<u8> = (0..(1 << 20) + 7).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(c.call(&[b"SET", b"big", &value]), ok());
    assert_eq!(c.call(&[b"GET", b"big"]), bulk(&value));
    assert_eq!(
        c.call(&[b"STRLEN", b"big"]),
        Value::Integer(value.len() as i64)
    );
}

#[test]
fn hello_3_switches_the_connection_to_resp3() {
    let s = server(ServerConfig::default());
    let mut c = Conn::open(s.local_addr());
    assert_eq!(c.call(&[b"GET", b"none"]), Value::NullBulk);
    let Value::Map(fields) = c.call(&[b"HELLO", b"3"]) else {
        panic!("HELLO 3 answers with a map");
    };
    assert!(fields.contains(&(bulk(b"proto"), Value::Integer(3))));
    assert_eq!(c.call(&[b"GET", b"none"]), Value::Null);
    assert!(matches!(c.call(&[b"INFO", b"server"]), Value::Verbatim(f, _) if &f == b"txt"));
}

#[test]
fn the_client_limit_refuses_extra_connections() {
    let s = server(ServerConfig {
        max_clients: 2,
        ..ServerConfig::default()
    });
    let mut a = Conn::open(s.local_addr());
    let mut b = Conn::open(s.local_addr());
    assert_eq!(a.call(&[b"PING"]), Value::Simple(b"PONG".to_vec()));
    assert_eq!(b.call(&[b"PING"]), Value::Simple(b"PONG".to_vec()));
    let mut c = Conn::open(s.local_addr());
    assert_eq!(
        c.read(),
        Some(Value::Error(b"ERR max number of clients reached".to_vec()))
    );
    assert!(c.closed());
    assert_eq!(s.stats().rejected_connections, 1);
    // Once a client leaves, a new one gets in.
    drop(a);
    wait_for_connected_clients(&s, 1, "the closed connection was never noticed");
    let mut d = Conn::open(s.local_addr());
    assert_eq!(d.call(&[b"PING"]), Value::Simple(b"PONG".to_vec()));
}

#[test]
fn protected_mode_refuses_a_public_address_without_a_password() {
    let public = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = RespServer::start(
        ServerConfig {
            listen: public,
            ..ServerConfig::default()
        },
        MemoryBackend::new(),
    );
    assert!(matches!(refused, Err(ServerError::ProtectedMode(a)) if a == public));
    let err = refused.err().unwrap().to_string();
    assert!(err.contains("requirepass"), "{err}");
}

#[test]
fn requirepass_over_tcp() {
    let s = server(ServerConfig {
        requirepass: Some("pw".into()),
        ..ServerConfig::default()
    });
    let mut c = Conn::open(s.local_addr());
    assert_eq!(
        c.call(&[b"SET", b"k", b"v"]),
        Value::Error(b"NOAUTH Authentication required.".to_vec())
    );
    assert_eq!(c.call(&[b"AUTH", b"pw"]), ok());
    assert_eq!(c.call(&[b"SET", b"k", b"v"]), ok());
}

#[test]
fn idle_connections_are_closed() {
    let s = server(ServerConfig {
        idle_timeout: Duration::from_millis(100),
        ..ServerConfig::default()
    });
    let mut c = Conn::open(s.local_addr());
    assert_eq!(c.call(&[b"PING"]), Value::Simple(b"PONG".to_vec()));
    // Nothing more is sent: the server closes the connection (the read would otherwise wait 10 s).
    let started = Instant::now();
    assert!(c.closed());
    assert!(started.elapsed() < Duration::from_secs(9));
}

#[test]
fn abusive_clients_do_not_disturb_others() {
    let s = server(ServerConfig::default());
    let mut good = Conn::open(s.local_addr());
    assert_eq!(good.call(&[b"SET", b"k", b"v"]), ok());
    let attacks: &[&[u8]] = &[
        b"*1\r\n$999999999999\r\n",
        b"*2147483648\r\n",
        b"*1\r\n*1\r\n*1\r\n*1\r\n$4\r\nPING\r\n",
        b"\xff\xfe\x00garbage\"\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nhalf",
        b"*100\r\n$1\r\na\r\n",
    ];
    for attack in attacks {
        let mut bad = Conn::open(s.local_addr());
        bad.stream.write_all(attack).unwrap();
        // Vanish without reading anything.
        drop(bad);
        assert_eq!(good.call(&[b"GET", b"k"]), bulk(b"v"), "after {attack:?}");
    }
    // A request line that never ends is cut off at the inline limit with Redis's error.
    let mut endless = Conn::open(s.local_addr());
    endless.stream.write_all(&vec![b'a'; 70 << 10]).unwrap();
    assert_eq!(
        endless.read(),
        Some(Value::Error(
            b"ERR Protocol error: too big inline request".to_vec()
        ))
    );
    assert!(endless.closed());
    let mut nested = Conn::open(s.local_addr());
    nested.stream.write_all(b"*1\r\n*1\r\n").unwrap();
    assert_eq!(
        nested.read(),
        Some(Value::Error(
            b"ERR Protocol error: expected '$', got '*'".to_vec()
        ))
    );
    assert!(nested.closed());
    assert_eq!(good.call(&[b"GET", b"k"]), bulk(b"v"));
    wait_for_connected_clients(&s, 1, "connections of vanished clients stay open");
}

#[test]
fn client_kill_closes_another_connection_and_client_list_forgets_it() {
    let s = server(ServerConfig {
        io_threads: 2,
        ..ServerConfig::default()
    });
    let mut admin = Conn::open(s.local_addr());
    let mut victim = Conn::open(s.local_addr());
    assert_eq!(victim.call(&[b"CLIENT", b"SETNAME", b"victim"]), ok());
    let Value::Integer(id) = victim.call(&[b"CLIENT", b"ID"]) else {
        panic!("CLIENT ID answers an integer");
    };
    let list = |c: &mut Conn| match c.call(&[b"CLIENT", b"LIST"]) {
        Value::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("CLIENT LIST answered {other:?}"),
    };
    let before = list(&mut admin);
    assert_eq!(before.lines().count(), 2, "{before}");
    assert!(
        before.contains(&format!("id={id} ")) && before.contains("name=victim"),
        "{before}"
    );
    let id = id.to_string();
    assert_eq!(
        admin.call(&[b"CLIENT", b"KILL", b"ID", id.as_bytes()]),
        Value::Integer(1)
    );
    // The victim's own event loop sees its socket shut down and drops it.
    assert!(victim.closed());
    wait_for_connected_clients(&s, 1, "the killed connection was never dropped");
    let after = list(&mut admin);
    assert_eq!(after.lines().count(), 1, "{after}");
    assert_eq!(admin.call(&[b"PING"]), Value::Simple(b"PONG".to_vec()));
}
