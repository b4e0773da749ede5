//! Every command's replies, byte for byte. Unless a comment says otherwise, each expected reply is what
//! redis-server 7.0 sends for the same request.

use std::sync::Arc;

use super::*;
use crate::backend::{BackendConn, BackendError, KeysPage, MemoryBackend, Op, OpResult};
use crate::parse::{ParseLimits, RequestParser};

/// A connection without a socket: requests go through the parser and the session as the server runs them.
struct Client<C: BackendConn = MemoryBackend> {
    session: Session<C>,
    parser: RequestParser,
    closed: bool,
}

impl Client {
    fn new(config: ServerConfig, store: &MemoryBackend) -> Client {
        Client::on(config, store.clone())
    }

    fn plain() -> Client {
        Client::new(ServerConfig::default(), &MemoryBackend::new())
    }
}

impl Client {
    /// Another connection to the same server (the same clients, counters and settings) and store.
    fn beside(&self, store: &MemoryBackend) -> Client {
        Client {
            session: Session::new(
                store.clone(),
                self.session.shared.clone(),
                "127.0.0.1:50001".into(),
                "127.0.0.1:6379".into(),
            ),
            parser: RequestParser::new(ParseLimits::default()),
            closed: false,
        }
    }
}

impl<C: BackendConn> Client<C> {
    /// A connection whose commands run on `conn`.
    fn on(config: ServerConfig, conn: C) -> Client<C> {
        let shared = Arc::new(Shared::new(config, 6379));
        Client {
            session: Session::new(
                conn,
                shared,
                "127.0.0.1:50000".into(),
                "127.0.0.1:6379".into(),
            ),
            parser: RequestParser::new(ParseLimits::default()),
            closed: false,
        }
    }

    /// Sends `input` (any number of requests) and returns everything replied.
    fn send(&mut self, input: &[u8]) -> Vec<u8> {
        assert!(!self.closed, "the connection was closed");
        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            let (used, r) = self
                .parser
                .parse(&input[pos..], self.session.authenticated());
            pos += used;
            match r {
                Ok(Some(args)) => match self.session.handle(args, &mut out) {
                    Flow::Close => {
                        self.closed = true;
                        break;
                    }
                    // As the server does: the batch so far runs, then the rest is handled.
                    Flow::Pause => {
                        self.session.start_ops();
                        self.session.flush(&mut out);
                    }
                    Flow::Continue => {}
                },
                Ok(None) => break,
                Err(e) => {
                    self.session.protocol_error(&e, &mut out);
                    self.closed = true;
                    break;
                }
            }
        }
        self.session.flush(&mut out);
        out
    }

    /// Sends one inline command line and checks the reply.
    #[track_caller]
    fn check(&mut self, line: &str, want: &[u8]) {
        let got = self.send(format!("{line}\r\n").as_bytes());
        assert_eq!(
            got.escape_ascii().to_string(),
            want.escape_ascii().to_string(),
            "reply to {line:?}"
        );
    }
}

#[test]
fn get_set_and_their_options() {
    let mut c = Client::plain();
    c.check("get a", b"$-1\r\n");
    c.check(
        "set",
        b"-ERR wrong number of arguments for 'set' command\r\n",
    );
    c.check(
        "set a",
        b"-ERR wrong number of arguments for 'set' command\r\n",
    );
    c.check("set a 1 nx", b"+OK\r\n");
    c.check("set a 2 nx", b"$-1\r\n");
    c.check("set a 2 xx", b"+OK\r\n");
    c.check("set b 2 xx", b"$-1\r\n");
    c.check("set a 3 get", b"$1\r\n2\r\n");
    c.check("set c 3 nx get", b"$-1\r\n");
    c.check("get c", b"$1\r\n3\r\n");
    c.check("set a 4 nx get", b"$1\r\n3\r\n");
    c.check("set a 5 nx xx", b"-ERR syntax error\r\n");
    c.check("set a 1 px 10 ex 10", b"-ERR syntax error\r\n");
    c.check("set a 1 foo", b"-ERR syntax error\r\n");
    c.check("set a 1 ex", b"-ERR syntax error\r\n");
    c.check("set a 1 keepttl ex 5", b"-ERR syntax error\r\n");
    c.check(
        "set a 1 ex 0",
        b"-ERR invalid expire time in 'set' command\r\n",
    );
    c.check(
        "set a 1 ex abc",
        b"-ERR value is not an integer or out of range\r\n",
    );
    // Redis sets a key with an expiry; dinomo has none, so it refuses rather than ignore the option.
    c.check(
        "set a 1 ex 10",
        b"-ERR dinomo keeps keys until they are deleted: expiry (EX, PX, EXAT, PXAT) is not supported\r\n",
    );
    c.check(
        "set a 1 PXAT 99999",
        b"-ERR dinomo keeps keys until they are deleted: expiry (EX, PX, EXAT, PXAT) is not supported\r\n",
    );
    c.check("get a", b"$1\r\n3\r\n");
    c.check("set a 1 keepttl", b"+OK\r\n");
    c.check("set a 1 get get", b"$1\r\n1\r\n");
    c.check("set a 1 NX nx", b"$-1\r\n");
    c.check("set a 2 xx get", b"$1\r\n1\r\n");
    c.check("get a", b"$1\r\n2\r\n");
    c.check("set nothere 1 xx get", b"$-1\r\n");
    c.check("exists nothere", b":0\r\n");
    c.check(
        "get",
        b"-ERR wrong number of arguments for 'get' command\r\n",
    );
    c.check(
        "get a b",
        b"-ERR wrong number of arguments for 'get' command\r\n",
    );
}

#[test]
fn setnx_getset_del_exists() {
    let mut c = Client::plain();
    c.check("set a 1", b"+OK\r\n");
    c.check("setnx a 1", b":0\r\n");
    c.check("setnx z 1", b":1\r\n");
    c.check(
        "setnx z",
        b"-ERR wrong number of arguments for 'setnx' command\r\n",
    );
    c.check("getset a 9", b"$1\r\n1\r\n");
    c.check("getset q 9", b"$-1\r\n");
    c.check(
        "getset q",
        b"-ERR wrong number of arguments for 'getset' command\r\n",
    );
    c.check("exists a b c b", b":1\r\n");
    c.check("exists a a z", b":3\r\n");
    c.check(
        "exists",
        b"-ERR wrong number of arguments for 'exists' command\r\n",
    );
    c.check("del a", b":1\r\n");
    c.check("del a z q nothere", b":2\r\n");
    c.check(
        "del",
        b"-ERR wrong number of arguments for 'del' command\r\n",
    );
    c.check("set u 1", b"+OK\r\n");
    c.check("unlink u u", b":1\r\n");
}

#[test]
fn mget_mset() {
    let mut c = Client::plain();
    c.check("mset a 1 b 2", b"+OK\r\n");
    c.check("mget a nothere b", b"*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n2\r\n");
    c.check(
        "mset a 1 b",
        b"-ERR wrong number of arguments for 'mset' command\r\n",
    );
    c.check(
        "mset a",
        b"-ERR wrong number of arguments for 'mset' command\r\n",
    );
    c.check(
        "mget",
        b"-ERR wrong number of arguments for 'mget' command\r\n",
    );
}

#[test]
fn counters_and_strings() {
    let mut c = Client::plain();
    c.check("incr a", b":1\r\n");
    c.check("incr a", b":2\r\n");
    c.check(
        "incr b c",
        b"-ERR wrong number of arguments for 'incr' command\r\n",
    );
    c.check("decr a", b":1\r\n");
    c.check("incrby a 10", b":11\r\n");
    c.check(
        "incrby a x",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check(
        "incrby a 9223372036854775807",
        b"-ERR increment or decrement would overflow\r\n",
    );
    c.check("decrby a 5", b":6\r\n");
    c.check(
        "decrby a -9223372036854775808",
        b"-ERR decrement would overflow\r\n",
    );
    c.check("decrby a -4", b":10\r\n");
    c.check("set s hello", b"+OK\r\n");
    c.check(
        "incr s",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check("append s world", b":10\r\n");
    c.check("get s", b"$10\r\nhelloworld\r\n");
    c.check("append new xx", b":2\r\n");
    c.check("strlen s", b":10\r\n");
    c.check("strlen nope", b":0\r\n");
    c.check(
        "strlen",
        b"-ERR wrong number of arguments for 'strlen' command\r\n",
    );
}

#[test]
fn connection_commands() {
    let mut c = Client::plain();
    c.check("ping", b"+PONG\r\n");
    c.check("PING hi", b"$2\r\nhi\r\n");
    c.check(
        "ping a b",
        b"-ERR wrong number of arguments for 'ping' command\r\n",
    );
    c.check("echo hi", b"$2\r\nhi\r\n");
    c.check(
        "echo",
        b"-ERR wrong number of arguments for 'echo' command\r\n",
    );
    c.check(
        "echo a b",
        b"-ERR wrong number of arguments for 'echo' command\r\n",
    );
    c.check("select 0", b"+OK\r\n");
    // Redis has 16 databases by default; dinomo has one, so every other index is out of range.
    c.check("select 1", b"-ERR DB index is out of range\r\n");
    c.check(
        "select x",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check("select -1", b"-ERR DB index is out of range\r\n");
    c.check(
        "select 99999999999",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check(
        "FOO a b",
        b"-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n",
    );
    c.check(
        "foo",
        b"-ERR unknown command 'foo', with args beginning with: \r\n",
    );
    c.check("quit x", b"+OK\r\n");
    assert!(c.closed);
}

#[test]
fn unknown_command_arguments_are_cut_at_128_bytes() {
    let mut c = Client::plain();
    let long = "x".repeat(200);
    let mut want = b"-ERR unknown command 'nope', with args beginning with: '".to_vec();
    want.extend_from_slice(&[b'x'; 128]);
    want.extend_from_slice(b"' \r\n");
    c.check(&format!("nope {long} more"), &want);
}

#[test]
fn client_commands() {
    let mut c = Client::plain();
    c.check("Client getname", b"$-1\r\n");
    c.check(
        "client setname x y",
        b"-ERR wrong number of arguments for 'client|setname' command\r\n",
    );
    c.check(
        "client setname \"a b\"",
        b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n",
    );
    c.check("client setname myname", b"+OK\r\n");
    c.check("client getname", b"$6\r\nmyname\r\n");
    c.check("client setname \"\"", b"+OK\r\n");
    c.check("client getname", b"$-1\r\n");
    c.check(
        "client foo",
        b"-ERR unknown subcommand 'foo'. Try CLIENT HELP.\r\n",
    );
    c.check(
        "client",
        b"-ERR wrong number of arguments for 'client' command\r\n",
    );
    c.check("client id", b":1\r\n");
    // CLIENT SETINFO is Redis 7.2's; these are 7.2's replies.
    c.check("client setinfo lib-name redis-py", b"+OK\r\n");
    c.check("client setinfo LIB-VER 5.0.1", b"+OK\r\n");
    c.check(
        "client setinfo foo 1",
        b"-ERR Unrecognized option 'foo'\r\n",
    );
    c.check(
        "client setinfo lib-name \"a b\"",
        b"-ERR lib-name cannot contain spaces, newlines or special characters.\r\n",
    );
    let info = c.send(b"client info\r\n");
    let text = String::from_utf8(info).unwrap();
    assert!(text.starts_with('$'), "{text}");
    assert!(
        text.contains("id=1 addr=127.0.0.1:50000 laddr=127.0.0.1:6379 name= "),
        "{text}"
    );
    assert!(
        text.contains("resp=2 lib-name=redis-py lib-ver=5.0.1\n"),
        "{text}"
    );
    let help = c.send(b"client help\r\n");
    assert!(help.starts_with(b"*20\r\n+CLIENT <subcommand>"), "{help:?}");
}

#[test]
fn hello_switches_protocols() {
    let mut c = Client::plain();
    c.check("hello 4", b"-NOPROTO unsupported protocol version\r\n");
    c.check(
        "hello x",
        b"-ERR Protocol version is not an integer or out of range\r\n",
    );
    c.check(
        "hello 3 foo",
        b"-ERR Syntax error in HELLO option 'foo'\r\n",
    );
    // The same fields as Redis; the server is named for what it is, with the Redis version it follows.
    let hello = |proto: &str| {
        let head = if proto == "3" { "%7" } else { "*14" };
        format!(
            "{head}\r\n$6\r\nserver\r\n$6\r\ndinomo\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:{proto}\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"
        )
    };
    c.check("hello 2", hello("2").as_bytes());
    c.check("hello 3", hello("3").as_bytes());
    c.check("get nothere", b"_\r\n");
    c.check("set k v", b"+OK\r\n");
    c.check("mget k nothere", b"*2\r\n$1\r\nv\r\n_\r\n");
    c.check("config get save", b"%1\r\n$4\r\nsave\r\n$0\r\n\r\n");
    c.check("client getname", b"_\r\n");
    c.check("hello", hello("3").as_bytes());
    c.check("hello 2 setname foo", hello("2").as_bytes());
    c.check("client getname", b"$3\r\nfoo\r\n");
    c.check(
        "hello 2 setname \"a b\"",
        b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n",
    );
    c.check("hello 2 auth default anything", hello("2").as_bytes());
    c.check(
        "hello 2 auth bob x",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
}

#[test]
fn auth_without_a_password() {
    let mut c = Client::plain();
    c.check(
        "auth foo",
        b"-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n",
    );
    c.check(
        "auth a b",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    c.check("auth default whatever", b"+OK\r\n");
    c.check("auth a b c", b"-ERR syntax error\r\n");
}

#[test]
fn requirepass_gates_everything_but_auth_hello_and_quit() {
    let config = ServerConfig {
        requirepass: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let mut c = Client::new(config.clone(), &MemoryBackend::new());
    c.check("get a", b"-NOAUTH Authentication required.\r\n");
    c.check("ping", b"-NOAUTH Authentication required.\r\n");
    c.check("client setname x", b"-NOAUTH Authentication required.\r\n");
    c.check("command count", b"-NOAUTH Authentication required.\r\n");
    // Unknown commands and arity are checked before authentication, as in Redis.
    c.check(
        "foo",
        b"-ERR unknown command 'foo', with args beginning with: \r\n",
    );
    c.check(
        "get",
        b"-ERR wrong number of arguments for 'get' command\r\n",
    );
    c.check(
        "hello 3",
        b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n",
    );
    c.check(
        "hello 2 auth default wrong",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    c.check(
        "auth wrong",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    c.check(
        "auth bob s3cret",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    // Before authentication the protocol limits are Redis's small ones.
    let mut big = Client::new(config.clone(), &MemoryBackend::new());
    assert_eq!(
        big.send(b"*11\r\n"),
        b"-ERR Protocol error: unauthenticated multibulk length\r\n"
    );
    assert!(big.closed);
    c.check("auth s3cret", b"+OK\r\n");
    c.check("get a", b"$-1\r\n");
    // A failed AUTH keeps an authenticated connection authenticated, as in Redis.
    c.check(
        "auth wrong",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    c.check("get a", b"$-1\r\n");
    let mut h = Client::new(config, &MemoryBackend::new());
    c.check("quit", b"+OK\r\n");
    let three = h.send(b"hello 3 auth default s3cret\r\nget x\r\n");
    assert!(three.starts_with(b"%7\r\n"));
    assert!(three.ends_with(b"_\r\n"));
}

#[test]
fn dbsize_and_info() {
    let store = MemoryBackend::new();
    let mut c = Client::new(ServerConfig::default(), &store);
    c.check("dbsize", b":0\r\n");
    c.check(
        "dbsize x",
        b"-ERR wrong number of arguments for 'dbsize' command\r\n",
    );
    c.check("info keyspace", b"$12\r\n# Keyspace\r\n\r\n");
    c.check("info nothere", b"$0\r\n\r\n");
    c.check("mset a 1 b 2 c 3", b"+OK\r\n");
    c.check("dbsize", b":3\r\n");
    c.check(
        "info keyspace",
        b"$44\r\n# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\n\r\n",
    );
    c.check("get a", b"$1\r\n1\r\n");
    c.check("get nothere", b"$-1\r\n");
    let all = String::from_utf8(c.send(b"info\r\n")).unwrap();
    for line in [
        "# Server\r\nredis_version:7.0.0\r\n",
        "\r\ntcp_port:6379\r\n",
        "\r\n\r\n# Clients\r\nconnected_clients:",
        "\r\n\r\n# Stats\r\n",
        "\r\nkeyspace_hits:1\r\nkeyspace_misses:1\r\n",
        "\r\n\r\n# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\n\r\n",
    ] {
        assert!(all.contains(line), "{line:?} in {all}");
    }
    let two = String::from_utf8(c.send(b"info STATS server\r\n")).unwrap();
    assert!(two.find("# Server").unwrap() < two.find("# Stats").unwrap());
    assert!(!two.contains("# Clients"));
    c.send(b"hello 3\r\n");
    c.check(
        "info keyspace",
        b"=48\r\ntxt:# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\n\r\n",
    );
}

#[test]
fn config_get() {
    let mut c = Client::plain();
    c.check("config get save", b"*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
    c.check(
        "config get appendonly",
        b"*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n",
    );
    c.check("config get nothere", b"*0\r\n");
    c.check(
        "config",
        b"-ERR wrong number of arguments for 'config' command\r\n",
    );
    c.check(
        "config get",
        b"-ERR wrong number of arguments for 'config|get' command\r\n",
    );
    c.check(
        "CONFIG GET MAXCLIENTS databases",
        b"*4\r\n$9\r\ndatabases\r\n$1\r\n1\r\n$10\r\nMAXCLIENTS\r\n$5\r\n10000\r\n",
    );
    c.check(
        "config set save x",
        b"-ERR unknown subcommand 'set'. Try CONFIG HELP.\r\n",
    );
    let all = c.send(b"config get *\r\n");
    assert!(
        all.starts_with(b"*22\r\n"),
        "{:?}",
        all.escape_ascii().to_string()
    );
}

#[test]
fn command_introspection() {
    let mut c = Client::plain();
    c.check("command count", b":55\r\n");
    c.check(
        "command info get nothere",
        b"*2\r\n*10\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*3\r\n+@read\r\n+@string\r\n+@fast\r\n*0\r\n*0\r\n*0\r\n*-1\r\n",
    );
    c.check(
        "command info client|setname",
        b"*1\r\n*10\r\n$14\r\nclient|setname\r\n:3\r\n*3\r\n+noscript\r\n+loading\r\n+stale\r\n:0\r\n:0\r\n:0\r\n*2\r\n+@slow\r\n+@connection\r\n*0\r\n*0\r\n*0\r\n",
    );
    c.check(
        "command docs get",
        b"*2\r\n$3\r\nget\r\n*8\r\n$7\r\nsummary\r\n$22\r\nGet the value of a key\r\n$5\r\nsince\r\n$5\r\n1.0.0\r\n$5\r\ngroup\r\n$6\r\nstring\r\n$10\r\ncomplexity\r\n$4\r\nO(1)\r\n",
    );
    c.check("command docs nothere", b"*0\r\n");
    c.check(
        "command foo",
        b"-ERR unknown subcommand 'foo'. Try COMMAND HELP.\r\n",
    );
    let all = c.send(b"command\r\n");
    assert!(all.starts_with(b"*55\r\n*10\r\n$3\r\nget\r\n"));
    let list = c.send(b"command list\r\n");
    assert!(list.starts_with(b"*70\r\n$3\r\nget\r\n$3\r\nset\r\n"));
    assert!(list.windows(14).any(|w| w == b"client|setname"));
    let docs = c.send(b"command docs client\r\n");
    assert!(
        docs.windows(11).any(|w| w == b"subcommands"),
        "a container lists its subcommands"
    );
    c.send(b"hello 3\r\n");
    c.check(
        "command info echo",
        b"*1\r\n*10\r\n$4\r\necho\r\n:2\r\n~1\r\n+fast\r\n:0\r\n:0\r\n:0\r\n~2\r\n+@fast\r\n+@connection\r\n*0\r\n*0\r\n*0\r\n",
    );
}

#[test]
fn protocol_errors_are_answered_then_the_connection_closes() {
    for (input, want) in [
        (
            b"*1\r\nx\r\n".as_slice(),
            b"-ERR Protocol error: expected '$', got 'x'\r\n".as_slice(),
        ),
        (
            b"*1\r\n$-5\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*a\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"\"unbalanced\r\n",
            b"-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ] {
        let mut c = Client::plain();
        assert_eq!(c.send(input), want);
        assert!(c.closed);
    }
    // Requests before the bad one are answered first, in order.
    let mut c = Client::plain();
    assert_eq!(
        c.send(b"set a 1\r\nget a\r\n*1\r\nx\r\n"),
        b"+OK\r\n$1\r\n1\r\n-ERR Protocol error: expected '$', got 'x'\r\n"
    );
}

#[test]
fn pipelined_replies_keep_request_order() {
    let mut c = Client::plain();
    let mut wire = Vec::new();
    crate::parse::encode_request(&["set", "k", "1"], &mut wire);
    wire.extend_from_slice(b"ping\r\n");
    crate::parse::encode_request(&["incr", "k"], &mut wire);
    wire.extend_from_slice(b"echo x\r\nhello 3\r\n");
    crate::parse::encode_request(&["get", "nothere"], &mut wire);
    crate::parse::encode_request(&["dbsize"], &mut wire);
    crate::parse::encode_request(&["hello", "2"], &mut wire);
    crate::parse::encode_request(&["get", "nothere"], &mut wire);
    let out = c.send(&wire);
    let text = out.escape_ascii().to_string();
    assert!(
        text.starts_with("+OK\\r\\n+PONG\\r\\n:2\\r\\n$1\\r\\nx\\r\\n%7\\r\\n"),
        "{text}"
    );
    assert!(
        text.ends_with("_\\r\\n:1\\r\\n*14\\r\\n$6\\r\\nserver\\r\\n$6\\r\\ndinomo\\r\\n$7\\r\\nversion\\r\\n$5\\r\\n7.0.0\\r\\n$5\\r\\nproto\\r\\n:2\\r\\n$2\\r\\nid\\r\\n:1\\r\\n$4\\r\\nmode\\r\\n$10\\r\\nstandalone\\r\\n$4\\r\\nrole\\r\\n$6\\r\\nmaster\\r\\n$7\\r\\nmodules\\r\\n*0\\r\\n$-1\\r\\n"),
        "a reply keeps the protocol of its request's moment: {text}"
    );
}

#[test]
fn binary_keys_and_values() {
    let mut c = Client::plain();
    let key = [0u8, 255, b'\r', b'\n', 7];
    let value: Vec<u8> = (0..=255u8).collect();
    let mut wire = Vec::new();
    crate::parse::encode_request(&[b"SET".as_slice(), &key, &value], &mut wire);
    crate::parse::encode_request(&[b"GET".as_slice(), &key], &mut wire);
    let mut want = b"+OK\r\n$256\r\n".to_vec();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\n");
    assert_eq!(c.send(&wire), want);
}

#[test]
fn store_errors_become_error_replies() {
    let store = MemoryBackend::with_max_value_len(4);
    let mut c = Client::new(ServerConfig::default(), &store);
    c.check(
        "set k 12345",
        b"-ERR value of 5 bytes exceeds the limit of 4 bytes\r\n",
    );
    // A multi-key command fails as a whole when one key failed; the keys that could be set were.
    c.check(
        "mset a 1 b 12345",
        b"-ERR value of 5 bytes exceeds the limit of 4 bytes\r\n",
    );
    c.check("get a", b"$1\r\n1\r\n");
}

/// A store whose writes all end with an unknown outcome, and whose reads are unavailable.
#[derive(Clone)]
struct Failing;

impl BackendConn for Failing {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        results.clear();
        for op in ops.drain(..) {
            results.push(Err(if op.is_write() {
                BackendError::Indeterminate("the memory node went away".into())
            } else {
                BackendError::Unavailable("no memory node".into())
            }));
        }
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        Err(BackendError::Unavailable("no memory node".into()))
    }
}

#[test]
fn writes_of_unknown_outcome_are_errors_never_ok() {
    let mut c = Client::on(ServerConfig::default(), Failing);
    let mut run = |line: &str| String::from_utf8(c.send(format!("{line}\r\n").as_bytes())).unwrap();
    let unknown = "-ERR write outcome unknown, it may or may not have been applied: the memory node went away\r\n";
    for write in [
        "set k v",
        "set k v nx",
        "setnx k v",
        "getset k v",
        "mset a 1 b 2",
        "del a b",
        "incr k",
        "append k v",
    ] {
        assert_eq!(run(write), unknown, "{write}");
    }
    assert_eq!(run("get k"), "-ERR no memory node\r\n");
    assert_eq!(run("mget a b"), "-ERR no memory node\r\n");
    assert_eq!(run("dbsize"), "-ERR no memory node\r\n");
    assert_eq!(run("ping"), "+PONG\r\n");
}

/// A full store: every write is refused for want of space, reads are served.
#[derive(Clone)]
struct Full(MemoryBackend);

impl BackendConn for Full {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        let writes = ops.iter().filter(|op| op.is_write()).count();
        ops.retain(|op| !op.is_write());
        self.0.execute(ops, results);
        for _ in 0..writes {
            results.push(Err(BackendError::OutOfSpace(
                "out of memory-node space, the write was not applied".into(),
            )));
        }
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        self.0.dbsize()
    }
}

#[test]
fn a_full_store_answers_writes_with_oom_as_redis_does_and_still_serves_reads() {
    let mut c = Client::on(ServerConfig::default(), Full(MemoryBackend::new()));
    let mut run = |line: &str| String::from_utf8(c.send(format!("{line}\r\n").as_bytes())).unwrap();
    let oom = "-OOM out of memory-node space, the write was not applied\r\n";
    for write in ["set k v", "incr n", "append k v", "del k"] {
        assert_eq!(run(write), oom, "{write}");
    }
    assert_eq!(run("get k"), "$-1\r\n");
    assert_eq!(run("dbsize"), ":0\r\n");
}

/// A store that counts fabric traffic: a fixed count, for `INFO fabric`.
#[derive(Clone)]
struct Counted(MemoryBackend);

impl BackendConn for Counted {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.0.execute(ops, results);
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        self.0.dbsize()
    }

    fn fabric_counts(&mut self) -> Option<crate::FabricCounts> {
        Some(crate::FabricCounts {
            round_trips: 7,
            bytes_out: 300,
            bytes_in: 1100,
        })
    }
}

#[test]
fn info_fabric_is_there_only_for_a_store_that_counts_it() {
    let mut c = Client::on(ServerConfig::default(), Counted(MemoryBackend::new()));
    let fabric = "# Fabric\r\nfabric_scope:process\r\nfabric_round_trips:7\r\nfabric_bytes_out:300\r\nfabric_bytes_in:1100\r\n";
    let one = String::from_utf8(c.send(b"info fabric\r\n")).unwrap();
    assert_eq!(one, format!("${}\r\n{fabric}\r\n", fabric.len()));
    let all = String::from_utf8(c.send(b"info\r\n")).unwrap();
    assert!(
        all.find("# Stats").unwrap() < all.find(fabric).unwrap()
            && all.find(fabric).unwrap() < all.find("# Keyspace").unwrap(),
        "{all}"
    );
    // The default: no section at all.
    let mut plain = Client::plain();
    assert_eq!(plain.send(b"info fabric\r\n"), b"$0\r\n\r\n");
    assert!(
        !String::from_utf8(plain.send(b"info\r\n"))
            .unwrap()
            .contains("Fabric")
    );
}

/// A store whose walk names its keys in sorted pages of `count` (the cursor is where the next page starts), and
/// names `ghost`, a key no longer there, as a walk may.
#[derive(Clone)]
struct Paged {
    store: MemoryBackend,
}

impl BackendConn for Paged {
    fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
        self.store.execute(ops, results);
    }

    fn dbsize(&mut self) -> Result<u64, BackendError> {
        self.store.dbsize()
    }

    fn scan(&mut self, cursor: u64, count: u32) -> Result<KeysPage, BackendError> {
        let mut keys = self.store.scan(0, 0)?.keys;
        keys.push(b"ghost".to_vec());
        keys.sort();
        let from = (cursor as usize).min(keys.len());
        let to = (from + count as usize).min(keys.len());
        Ok(KeysPage {
            cursor: if to == keys.len() { 0 } else { to as u64 },
            keys: keys[from..to].to_vec(),
        })
    }
}

fn paged(config: ServerConfig) -> Client<Paged> {
    let mut c = Client::on(
        config,
        Paged {
            store: MemoryBackend::new(),
        },
    );
    c.check("mset a 1 b 2 c 3 d 4", b"+OK\r\n");
    c
}

#[test]
fn scan_walks_in_steps_and_leaves_out_keys_no_longer_there() {
    let mut c = paged(ServerConfig::default());
    c.check(
        "scan 0 count 2",
        b"*2\r\n$1\r\n2\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n",
    );
    c.check(
        "scan 2 COUNT 2",
        b"*2\r\n$1\r\n4\r\n*2\r\n$1\r\nc\r\n$1\r\nd\r\n",
    );
    // The last step names only `ghost`, which is gone.
    c.check("scan 4 count 2", b"*2\r\n$1\r\n0\r\n*0\r\n");
    // Without COUNT a step is asked for ten keys.
    c.check(
        "scan 0 match [bd]",
        b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\nb\r\n$1\r\nd\r\n",
    );
    c.check(
        "scan 0 type string count 1",
        b"*2\r\n$1\r\n1\r\n*1\r\n$1\r\na\r\n",
    );
    c.check("scan 0 type hash", b"*2\r\n$1\r\n0\r\n*0\r\n");
    c.check(
        "scan 0 match * count 100 type STRING match c",
        b"*2\r\n$1\r\n0\r\n*1\r\n$1\r\nc\r\n",
    );
}

#[test]
fn scan_refuses_bad_arguments_as_redis_does() {
    let mut c = paged(ServerConfig::default());
    c.check("scan x", b"-ERR invalid cursor\r\n");
    c.check("scan -1", b"-ERR invalid cursor\r\n");
    c.check("scan 18446744073709551616", b"-ERR invalid cursor\r\n");
    c.check("scan 0 count 0", b"-ERR syntax error\r\n");
    c.check(
        "scan 0 count x",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check("scan 0 match", b"-ERR syntax error\r\n");
    c.check("scan 0 limit 5", b"-ERR syntax error\r\n");
    c.check("scan 0 type nosuch", b"-ERR unknown type name 'nosuch'\r\n");
    c.check(
        "scan",
        b"-ERR wrong number of arguments for 'scan' command\r\n",
    );
    // A cursor no walk gave out is a place to go on from, as in Redis.
    c.check("scan 18446744073709551615", b"*2\r\n$1\r\n0\r\n*0\r\n");
}

#[test]
fn keys_walks_everything_within_its_limit() {
    let mut c = paged(ServerConfig::default());
    c.check("keys c", b"*1\r\n$1\r\nc\r\n");
    c.check("keys nothing*", b"*0\r\n");
    c.check("keys g*", b"*0\r\n");
    let all = c.send(b"keys *\r\n");
    assert!(all.starts_with(b"*4\r\n"), "{}", all.escape_ascii());
    for k in ["a", "b", "c", "d"] {
        assert!(
            all.windows(7)
                .any(|w| w == format!("$1\r\n{k}\r\n").as_bytes()),
            "{k} in {}",
            all.escape_ascii()
        );
    }
    c.check(
        "keys",
        b"-ERR wrong number of arguments for 'keys' command\r\n",
    );

    let mut c = paged(ServerConfig {
        max_keys_reply: 2,
        ..ServerConfig::default()
    });
    let two = c.send(b"keys [ab]\r\n");
    assert!(two.starts_with(b"*2\r\n"), "{}", two.escape_ascii());
    c.check(
        "keys *",
        b"-ERR KEYS matches more than 2 keys (the server's max_keys_reply); use SCAN\r\n",
    );
}

#[test]
fn type_names_strings_and_absent_keys() {
    let mut c = paged(ServerConfig::default());
    c.check("type a", b"+string\r\n");
    c.check("type nothere", b"+none\r\n");
    c.check(
        "type",
        b"-ERR wrong number of arguments for 'type' command\r\n",
    );
}

#[test]
fn a_store_that_cannot_list_its_keys_says_so() {
    let mut c = Client::on(ServerConfig::default(), Counted(MemoryBackend::new()));
    c.check(
        "scan 0",
        b"-ERR this store cannot list its keys (SCAN, KEYS)\r\n",
    );
    c.check(
        "keys *",
        b"-ERR this store cannot list its keys (SCAN, KEYS)\r\n",
    );
}

#[test]
fn getdel_ranges_float_increments_and_expiry_probes() {
    let mut c = Client::plain();
    c.check("set k hello", b"+OK\r\n");
    c.check("getdel k", b"$5\r\nhello\r\n");
    c.check("getdel k", b"$-1\r\n");
    c.check("exists k", b":0\r\n");
    c.check("set s \"This is a string\"", b"+OK\r\n");
    c.check("getrange s 0 3", b"$4\r\nThis\r\n");
    c.check("getrange s -3 -1", b"$3\r\ning\r\n");
    c.check("substr s 10 100", b"$6\r\nstring\r\n");
    c.check("getrange nothere 0 -1", b"$0\r\n\r\n");
    c.check(
        "getrange s a 1",
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.check("set h \"Hello World\"", b"+OK\r\n");
    c.check("setrange h 6 Redis", b":11\r\n");
    c.check("get h", b"$11\r\nHello Redis\r\n");
    c.check("setrange z 3 ab", b":5\r\n");
    c.check("get z", b"$5\r\n\x00\x00\x00ab\r\n");
    c.check("setrange empty 5 \"\"", b":0\r\n");
    c.check("exists empty", b":0\r\n");
    c.check("setrange h -1 x", b"-ERR offset is out of range\r\n");
    c.check(
        "setrange h 536870911 xy",
        b"-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n",
    );
    c.check("set f 10.50", b"+OK\r\n");
    c.check("incrbyfloat f 0.1", b"$4\r\n10.6\r\n");
    c.check("incrbyfloat f -5", b"$3\r\n5.6\r\n");
    c.check("incrbyfloat newf 5.0e3", b"$4\r\n5000\r\n");
    c.check("incrbyfloat f abc", b"-ERR value is not a valid float\r\n");
    c.check("incrbyfloat h 1", b"-ERR value is not a valid float\r\n");
    c.check(
        "incrbyfloat f inf",
        b"-ERR increment would produce NaN or Infinity\r\n",
    );
    c.check("get f", b"$3\r\n5.6\r\n");
    c.check("ttl f", b":-1\r\n");
    c.check("pttl nothere", b":-2\r\n");
    c.check("expiretime f", b":-1\r\n");
    c.check("persist f", b":0\r\n");
    c.check("getex f", b"$3\r\n5.6\r\n");
    c.check("getex f persist", b"$3\r\n5.6\r\n");
    c.check("getex f persist persist", b"-ERR syntax error\r\n");
    c.check(
        "getex f ex 0",
        b"-ERR invalid expire time in 'getex' command\r\n",
    );
    c.check(
        "getex f px 100",
        b"-ERR dinomo keeps keys until they are deleted: expiry (EX, PX, EXAT, PXAT) is not supported\r\n",
    );
    c.check("touch f nothere f", b":2\r\n");
    let time = c.send(b"time\r\n");
    assert!(
        time.starts_with(b"*2\r\n$10\r\n"),
        "{}",
        time.escape_ascii()
    );
}

#[test]
fn flushdb_removes_every_key() {
    let mut c = Client::plain();
    for i in 0..2500 {
        c.send(format!("set key{i} {i}\r\n").as_bytes());
    }
    c.check("dbsize", b":2500\r\n");
    c.check("flushdb", b"+OK\r\n");
    c.check("dbsize", b":0\r\n");
    c.check("set a 1", b"+OK\r\n");
    c.check("flushall async", b"+OK\r\n");
    c.check("exists a", b":0\r\n");
    c.check("flushall sync", b"+OK\r\n");
    c.check("flushdb now", b"-ERR syntax error\r\n");
    c.check("flushdb async sync", b"-ERR syntax error\r\n");
}

/// An argument a client might send: numbers at and past every edge, the option words commands take, and bytes.
fn fuzz_arg() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let words = [
        "0",
        "1",
        "-1",
        "2",
        "7",
        "100",
        "65536",
        "536870911",
        "4294967296",
        "18446744073709551615",
        "9223372036854775807",
        "-9223372036854775808",
        "1.5",
        "inf",
        "-inf",
        "nan",
        "1e400",
        "BIT",
        "BYTE",
        "NX",
        "XX",
        "GET",
        "EX",
        "PX",
        "EXAT",
        "KEEPTTL",
        "PERSIST",
        "MATCH",
        "COUNT",
        "TYPE",
        "ASYNC",
        "SYNC",
        "*",
        "k",
        "",
        "3",
        "default",
    ];
    prop_oneof![
        4 => proptest::sample::select(words.to_vec()).prop_map(|w| w.as_bytes().to_vec()),
        2 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        1 => (-40i64..40).prop_map(|n| n.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

/// A command name from the table, in any case, a subcommand as its container's name and its own.
fn fuzz_command() -> impl proptest::strategy::Strategy<Value = Vec<Vec<u8>>> {
    use proptest::prelude::*;
    let mut names: Vec<Vec<Vec<u8>>> = Vec::new();
    for c in command::commands() {
        names.push(vec![c.name.as_bytes().to_vec()]);
        for sub in c.subcommands {
            let (container, name) = sub.name.split_once('|').expect("container|sub");
            names.push(vec![
                container.as_bytes().to_vec(),
                name.as_bytes().to_vec(),
            ]);
        }
    }
    (proptest::sample::select(names), any::<bool>()).prop_map(|(name, upper)| {
        name.into_iter()
            .map(|n| if upper { n.to_ascii_uppercase() } else { n })
            .collect()
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// Any command of the table with any arguments, in a pipeline of several, gets exactly one reply each (up to a
    /// `QUIT`, which closes the connection after its own), and nothing panics: bad arguments are error replies, and
    /// values past the store's limit (64 KiB here) are refused before any memory is taken for them.
    #[test]
    fn every_command_with_any_arguments_gets_exactly_one_reply(
        requests in proptest::collection::vec(
            (fuzz_command(), proptest::collection::vec(fuzz_arg(), 0..7)),
            1..8,
        )
    ) {
        let store = MemoryBackend::with_max_value_len(1 << 16);
        let mut c = Client::new(ServerConfig::default(), &store);
        let mut wire = Vec::new();
        let mut expected = 0;
        for (name, args) in &requests {
            let request: Vec<&[u8]> =
                name.iter().chain(args).map(Vec::as_slice).collect();
            crate::encode_request(&request, &mut wire);
            expected += 1;
            // QUIT takes any arguments, and closes.
            if name[0].eq_ignore_ascii_case(b"quit") {
                break;
            }
        }
        let out = c.send(&wire);
        let mut replies = 0;
        let mut rest = out.as_slice();
        while !rest.is_empty() {
            match crate::Value::parse(rest, &crate::ValueLimits::default()) {
                Ok(Some((_, used))) => {
                    rest = &rest[used..];
                    replies += 1;
                }
                other => proptest::prop_assert!(false, "not a reply: {other:?} in {}", out.escape_ascii()),
            }
        }
        proptest::prop_assert_eq!(replies, expected, "{}", out.escape_ascii());
    }
}

#[test]
fn client_list_shows_every_connection_and_client_kill_names_them() {
    let store = MemoryBackend::new();
    let mut a = Client::new(ServerConfig::default(), &store);
    let mut b = a.beside(&store);
    b.check("client setname bee", b"+OK\r\n");
    b.check("get k", b"$-1\r\n");
    let text = |reply: Vec<u8>| String::from_utf8(reply).unwrap();
    let list = text(a.send(b"client list\r\n"));
    assert!(
        list.contains("id=1 addr=127.0.0.1:50000 laddr=127.0.0.1:6379 name= ")
            && list.contains(" cmd=client|list "),
        "{list}"
    );
    assert!(
        list.contains("id=2 addr=127.0.0.1:50001 laddr=127.0.0.1:6379 name=bee ")
            && list.contains(" cmd=get "),
        "{list}"
    );
    assert!(
        list.find("id=1 ") < list.find("id=2 "),
        "in id order: {list}"
    );
    let only = text(a.send(b"client list id 2\r\n"));
    assert!(only.contains("id=2 ") && !only.contains("id=1 "), "{only}");
    a.check("client list type pubsub", b"$0\r\n\r\n");
    a.check("client list id 0", b"-ERR Invalid client ID\r\n");
    a.check(
        "client list type nobody",
        b"-ERR Unknown client type 'nobody'\r\n",
    );
    a.check("client list foo", b"-ERR syntax error\r\n");
    // The old form answers +OK or an error; the new one counts the clients it names (the asker is skipped unless
    // SKIPME no).
    a.check("client kill 10.0.0.1:1", b"-ERR No such client\r\n");
    a.check(
        "client kill id 0",
        b"-ERR client-id should be greater than 0\r\n",
    );
    a.check("client kill id 2 maxage", b"-ERR syntax error\r\n");
    a.check("client kill foo bar", b"-ERR syntax error\r\n");
    a.check("client kill type pubsub", b":0\r\n");
    a.check("client kill user nobody", b":0\r\n");
    a.check("client kill laddr 127.0.0.1:6379", b":1\r\n");
    a.check("client kill id 2 maxage 100", b":0\r\n");
    a.check("client kill addr 127.0.0.1:50001", b":1\r\n");
    assert!(!a.closed);
    a.check("client kill id 1 skipme no", b":1\r\n");
    assert!(
        a.closed,
        "a client that kills itself is closed after the reply"
    );
    drop(b);
    let mut c = a.beside(&store);
    let list = text(c.send(b"client list\r\n"));
    assert!(
        list.contains("id=1 ") && !list.contains("id=2 ") && list.contains("id=3 "),
        "a closed connection leaves the list: {list}"
    );
}

#[test]
fn reset_forgets_the_name_the_protocol_and_the_authentication() {
    let mut c = Client::plain();
    c.check("client setname abc", b"+OK\r\n");
    let hello = c.send(b"hello 3\r\n");
    assert!(hello.starts_with(b"%7\r\n"), "{}", hello.escape_ascii());
    c.check("reset", b"+RESET\r\n");
    c.check("client getname", b"$-1\r\n");
    c.check(
        "reset x",
        b"-ERR wrong number of arguments for 'reset' command\r\n",
    );
    // A RESP2 reply again: a map would be %.
    let hello = c.send(b"hello\r\n");
    assert!(hello.starts_with(b"*14\r\n"), "{}", hello.escape_ascii());

    let store = MemoryBackend::new();
    let mut locked = Client::new(
        ServerConfig {
            requirepass: Some("secret".into()),
            ..ServerConfig::default()
        },
        &store,
    );
    locked.check("auth secret", b"+OK\r\n");
    locked.check("get k", b"$-1\r\n");
    locked.check("reset", b"+RESET\r\n");
    locked.check("get k", b"-NOAUTH Authentication required.\r\n");
}

#[test]
fn shutdown_runs_the_hook_and_closes_without_a_reply_or_is_refused() {
    let mut refused = Client::plain();
    refused.check(
        "shutdown",
        b"-ERR SHUTDOWN is not enabled in this server (stop the process that serves it)\r\n",
    );
    refused.check("shutdown abort", b"-ERR No shutdown in progress.\r\n");
    refused.check("shutdown save nosave", b"-ERR syntax error\r\n");
    refused.check("shutdown now abort", b"-ERR syntax error\r\n");
    refused.check("shutdown later", b"-ERR syntax error\r\n");

    let stops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = stops.clone();
    let config = ServerConfig {
        shutdown: Some(crate::ShutdownHook::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })),
        ..ServerConfig::default()
    };
    let mut c = Client::new(config, &MemoryBackend::new());
    // The replies asked before go out; SHUTDOWN itself has none.
    let out = c.send(b"set k v\r\nshutdown nosave now\r\n");
    assert_eq!(out, b"+OK\r\n");
    assert!(c.closed);
    assert_eq!(stops.load(Ordering::SeqCst), 1);
}

#[test]
fn multi_queues_commands_and_exec_answers_them_in_one_array() {
    let mut c = Client::plain();
    c.check("exec", b"-ERR EXEC without MULTI\r\n");
    c.check("discard", b"-ERR DISCARD without MULTI\r\n");
    c.check("multi", b"+OK\r\n");
    c.check("multi", b"-ERR MULTI calls can not be nested\r\n");
    c.check("set a 1", b"+QUEUED\r\n");
    c.check("incr a", b"+QUEUED\r\n");
    c.check("incrby a x", b"+QUEUED\r\n");
    c.check("mget a b", b"+QUEUED\r\n");
    c.check("ping", b"+QUEUED\r\n");
    c.check(
        "exec",
        b"*5\r\n+OK\r\n:2\r\n-ERR value is not an integer or out of range\r\n*2\r\n$1\r\n2\r\n$-1\r\n+PONG\r\n",
    );
    c.check("get a", b"$1\r\n2\r\n");
    // An empty transaction.
    c.check("multi", b"+OK\r\n");
    c.check("exec", b"*0\r\n");
    // DISCARD drops what was queued.
    c.check("multi", b"+OK\r\n");
    c.check("set a 9", b"+QUEUED\r\n");
    c.check("discard", b"+OK\r\n");
    c.check("get a", b"$1\r\n2\r\n");
    // RESET ends the transaction too.
    c.check("multi", b"+OK\r\n");
    c.check("set a 9", b"+QUEUED\r\n");
    c.check("reset", b"+RESET\r\n");
    c.check("exec", b"-ERR EXEC without MULTI\r\n");
    c.check("get a", b"$1\r\n2\r\n");
}

#[test]
fn a_command_refused_while_queuing_discards_the_transaction() {
    let mut c = Client::plain();
    c.check("multi", b"+OK\r\n");
    c.check("set a 1", b"+QUEUED\r\n");
    c.check(
        "nosuchcommand",
        b"-ERR unknown command 'nosuchcommand', with args beginning with: \r\n",
    );
    c.check(
        "get",
        b"-ERR wrong number of arguments for 'get' command\r\n",
    );
    c.check(
        "exec",
        b"-EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    c.check("get a", b"$-1\r\n");
    // Here, not in Redis: the walks over every key and the connection's commands are refused in a transaction.
    c.check("multi", b"+OK\r\n");
    c.check(
        "keys *",
        b"-ERR Command not allowed inside a transaction here: 'keys'\r\n",
    );
    c.check("set a 1", b"+QUEUED\r\n");
    c.check(
        "exec",
        b"-EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    c.check("get a", b"$-1\r\n");
}

#[test]
fn a_pipeline_around_a_transaction_keeps_its_order() {
    let mut c = Client::plain();
    let got = c.send(
        b"SET k before\r\nMULTI\r\nGET k\r\nSET k inside\r\nEXEC\r\nGET k\r\nMULTI\r\nAPPEND k !\r\nEXEC\r\n",
    );
    assert_eq!(
        got.escape_ascii().to_string(),
        b"+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n$6\r\nbefore\r\n+OK\r\n$6\r\ninside\r\n+OK\r\n+QUEUED\r\n*1\r\n:7\r\n"
            .escape_ascii()
            .to_string()
    );
    // A transaction left open at the end of a pipeline stays open.
    let got = c.send(b"MULTI\r\nGET k\r\n");
    assert_eq!(got, b"+OK\r\n+QUEUED\r\n");
    c.check("exec", b"*1\r\n$7\r\ninside!\r\n");
}

#[test]
fn a_store_without_transactions_refuses_exec_and_applies_nothing() {
    /// A store that runs pipelines but not transactions.
    struct NoTransactions(MemoryBackend);
    impl BackendConn for NoTransactions {
        fn execute(&mut self, ops: &mut Vec<Op>, results: &mut Vec<OpResult>) {
            self.0.execute(ops, results)
        }
        fn dbsize(&mut self) -> Result<u64, BackendError> {
            self.0.dbsize()
        }
    }
    let store = MemoryBackend::new();
    let mut c = Client::on(ServerConfig::default(), NoTransactions(store.clone()));
    c.check("multi", b"+OK\r\n");
    c.check("set a 1", b"+QUEUED\r\n");
    c.check(
        "exec",
        b"-ERR the transaction did not run, nothing was applied: this store cannot run transactions (MULTI/EXEC)\r\n",
    );
    c.check("get a", b"$-1\r\n");
}

#[test]
fn watch_runs_exec_only_while_the_watched_values_stay_as_they_were() {
    let store = MemoryBackend::new();
    let mut a = Client::new(ServerConfig::default(), &store);
    let mut b = a.beside(&store);
    a.check("set k 1", b"+OK\r\n");
    // Another client changes a watched key: EXEC runs nothing and answers a null array.
    a.check("watch k nothere", b"+OK\r\n");
    b.check("set k 2", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("set k 3", b"+QUEUED\r\n");
    a.check("exec", b"*-1\r\n");
    a.check("get k", b"$1\r\n2\r\n");
    // EXEC forgot the watched keys: the next transaction runs.
    b.check("set k 4", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("incr k", b"+QUEUED\r\n");
    a.check("exec", b"*1\r\n:5\r\n");
    // Unchanged watched keys (one created meanwhile counts as a change): the transaction runs.
    a.check("watch k", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("incr k", b"+QUEUED\r\n");
    a.check("exec", b"*1\r\n:6\r\n");
    a.check("watch nothere", b"+OK\r\n");
    b.check("set nothere x", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("exec", b"*-1\r\n");
    // The client's own change of a watched key counts too.
    a.check("watch k", b"+OK\r\n");
    a.check("incr k", b":7\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("exec", b"*-1\r\n");
    // UNWATCH, DISCARD and RESET forget them; inside MULTI, WATCH is refused and UNWATCH waits for EXEC.
    a.check("watch k", b"+OK\r\n");
    b.check("set k 0", b"+OK\r\n");
    a.check("unwatch", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("exec", b"*0\r\n");
    a.check("watch k", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("discard", b"+OK\r\n");
    b.check("set k 1", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("watch k", b"-ERR WATCH inside MULTI is not allowed\r\n");
    a.check("unwatch", b"+QUEUED\r\n");
    a.check("get k", b"+QUEUED\r\n");
    a.check("exec", b"*2\r\n+OK\r\n$1\r\n1\r\n");
    a.check("watch k", b"+OK\r\n");
    b.check("set k 2", b"+OK\r\n");
    a.check("reset", b"+RESET\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("exec", b"*0\r\n");
    // RESP3's null.
    assert!(a.send(b"hello 3\r\n").starts_with(b"%"));
    a.check("watch k", b"+OK\r\n");
    b.check("set k 3", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("exec", b"_\r\n");
}

#[test]
fn watch_compares_values_so_a_write_of_the_same_bytes_is_no_change() {
    // Here, not in Redis (which aborts on any write of a watched key): the watched value is what is compared.
    let store = MemoryBackend::new();
    let mut a = Client::new(ServerConfig::default(), &store);
    let mut b = a.beside(&store);
    a.check("set k same", b"+OK\r\n");
    a.check("watch k", b"+OK\r\n");
    b.check("set k same", b"+OK\r\n");
    a.check("multi", b"+OK\r\n");
    a.check("get k", b"+QUEUED\r\n");
    a.check("exec", b"*1\r\n$4\r\nsame\r\n");
}
