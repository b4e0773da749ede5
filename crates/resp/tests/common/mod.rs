//! A plain RESP client over TCP for the server tests.

// Each test binary uses its own share of these.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use dinomo_resp::encode_request;
use dinomo_resp::value::{Value, ValueLimits};

/// One connection: requests written whole, replies parsed as they arrive.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        let mut wire = Vec::new();
        encode_request(args, &mut wire);
        self.stream.write_all(&wire).unwrap();
    }

    pub fn read(&mut self) -> Option<Value> {
        loop {
            if let Some((v, used)) = Value::parse(&self.buf, &ValueLimits::default()).unwrap() {
                self.buf.drain(..used);
                return Some(v);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn call(&mut self, args: &[&[u8]]) -> Value {
        self.send(args);
        self.read().expect("a reply")
    }

    /// Whether the server closed the connection (after any replies still buffered).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0))
    }

    /// Whether nothing arrives within `wait`.
    pub fn silent_for(&mut self, wait: Duration) -> bool {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut b = [0u8; 1];
        let silent = matches!(
            self.stream.read(&mut b),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
        );
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        silent
    }
}
