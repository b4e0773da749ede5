//! The native protocol between clients (and the M-node) and KV nodes or routing nodes: length-prefixed frames
//! (`u32` little-endian length, then a postcard body) carrying a request id, so a connection can keep many requests
//! in flight and replies may come back in any order.
//!
//! Every connection opens with a handshake: the client's first request is [`RequestBody::Hello`] with the
//! protocol version and the cluster token, and the server answers [`ResponseBody::Welcome`], or refuses
//! ([`ErrorKind::Refused`]) and closes the connection. Nothing else is served before a welcome.

use std::io::{self, Read, Write};

use dinomo_kn::DataOp;

use crate::latency::LatencySummary;
use crate::stats::NodeEpochStats;
use dinomo_ring::{NodeId, Ring};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the native protocol, checked in the handshake: both ends must speak the same one.
pub const PROTOCOL_VERSION: u32 = 3;

/// Default bound on one frame: a value of the largest allowed size plus its key and headers fit comfortably.
pub const DEFAULT_MAX_FRAME: u32 = 8 << 20;

/// Who owns what and where to reach them: what routing nodes serve and clients cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Routing {
    /// The ownership ring (its epoch versions the whole table).
    pub ring: Ring,
    /// The native-protocol address of every node in the ring.
    pub addrs: BTreeMap<NodeId, String>,
    /// The keys shared by several nodes (a replication factor above 1 in the ring) and their indirect cells in the
    /// memory node's pool.
    pub cells: BTreeMap<Vec<u8>, u64>,
}

impl Routing {
    /// The version of this table.
    pub fn epoch(&self) -> u64 {
        self.ring.epoch()
    }
}

/// A secret on the wire: encoded as the plain string, shown by `Debug` only as its length.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_string())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<secret of {} bytes>", self.0.len())
    }
}

/// A request; `id` comes back in its [`Response`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the caller; unique among its requests in flight on the connection.
    pub id: u64,
    /// What to do.
    pub body: RequestBody,
}

/// What a request asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RequestBody {
    /// An operation on one key, served by the key's owner.
    Data(DataOp),
    /// The routing table the server knows.
    Routing,
    /// Load and cache statistics of a KV node.
    Stats,
    /// M-node only: serve under this routing table from now on (see the reconfiguration protocol).
    Install(Routing),
    /// Liveness probe.
    Ping,
    /// A client's latencies since its previous report, kept by the node until the M-node collects them (sent
    /// before a data request on the same connection; answered with `Done`).
    LatencyReport(LatencySummary),
    /// M-node only: the node's statistics of the monitoring epoch that ends now (a new one starts).
    EpochStats,
    /// The statistics of the KV node's memory node (pool space, merge backlog, index), which the node fetches
    /// with the memory node's `STATS` call; answered with `Stats`, a JSON `ProcessorStats`.
    MemoryStats,
    /// One step of a walk over every key of the cluster (Redis's `SCAN`), which the node takes from its memory
    /// node: answered with `Keys`. From `cursor` (0 starts a walk), about `count` keys.
    ScanKeys {
        /// The cursor of the previous step's answer, or 0.
        cursor: u64,
        /// About how many keys to name.
        count: u32,
    },
    /// The handshake, first on every connection: answered with `Welcome`, or refused and the connection closed.
    Hello {
        /// [`PROTOCOL_VERSION`] of the client.
        version: u32,
        /// The cluster's shared secret (`fabric.token`; empty when the cluster has none).
        token: Secret,
    },
}

impl RequestBody {
    /// The key of a data request.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            RequestBody::Data(op) => Some(op.key()),
            _ => None,
        }
    }

    /// Whether the request may change data.
    pub fn is_write(&self) -> bool {
        matches!(self, RequestBody::Data(op) if op.is_write())
    }
}

/// A request to be sent, borrowing its body: encodes exactly like [`Request`], without copying keys and values.
#[derive(Debug, Serialize)]
pub struct RequestRef<'a> {
    /// As in [`Request`].
    pub id: u64,
    /// As in [`Request`].
    pub body: &'a RequestBody,
}

/// A reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// The id of the request.
    pub id: u64,
    /// The outcome.
    pub body: ResponseBody,
}

/// What a reply says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// A value or none (a byte string on the wire, as in [`DataOp`]).
    Value(#[serde(with = "serde_bytes")] Option<Vec<u8>>),
    /// Whether a write applied.
    Applied(bool),
    /// An integer result.
    Int(i64),
    /// The server does not own the key under its routing table of `epoch`; refresh and retry.
    NotOwner {
        /// The server's epoch.
        epoch: u64,
    },
    /// The routing table.
    Routing(Routing),
    /// Statistics (a JSON document, so tools can show fields they do not know).
    Stats(String),
    /// Done (Install, Ping, LatencyReport).
    Done,
    /// The request failed.
    Error {
        /// The kind of failure.
        kind: ErrorKind,
        /// For people.
        message: String,
    },
    /// A node's statistics of one monitoring epoch.
    EpochStats(Box<NodeEpochStats>),
    /// A step of a walk over the keys (`ScanKeys`). The keys are the memory node's candidates: some may have been
    /// deleted (their delete not merged yet), and the client asks their owners.
    Keys {
        /// Where the next step starts; 0 when the walk is over.
        cursor: u64,
        /// The keys named.
        keys: Vec<serde_bytes::ByteBuf>,
    },
    /// The handshake was accepted.
    Welcome {
        /// The server's [`PROTOCOL_VERSION`].
        version: u32,
        /// The KV node answering; `None` from a routing node.
        node: Option<NodeId>,
        /// The pool of the memory node the server's cluster runs on (0 while it does not know it). With `node`, it
        /// tells a client that reached an address another server took since (its node stopped) that it is not
        /// where it meant to be.
        pool: u64,
    },
}

/// Kinds of failure a client acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request is wrong (a limit, a type); retrying will not help.
    Invalid,
    /// The write may or may not have been applied (the node lost the memory node or its lease mid-write).
    Indeterminate,
    /// The node cannot serve now (stopping, fenced, the memory node unreachable before anything was written); the
    /// request was not applied and may be retried elsewhere.
    Unavailable,
    /// The handshake was refused (a wrong cluster token, another protocol version, or no handshake at all); the
    /// server closes the connection.
    Refused,
    /// The memory node has no room for the write: the store is full. It was not applied; retrying helps only once
    /// the memory node has reclaimed space.
    OutOfSpace,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// The announced length is beyond the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The body does not decode.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Writes `msg` as one frame (into `buf`, reused between calls, then to `w`).
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    append_frame(buf, msg)?;
    w.write_all(buf)
}

/// Appends `msg` as one frame to `out`.
pub(crate) fn append_frame<T: Serialize>(out: &mut Vec<u8>, msg: &T) -> io::Result<()> {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Err(e) = postcard::to_io(msg, &mut *out) {
        out.truncate(at);
        return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
    }
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Reads one frame of at most `max` bytes into `buf` and decodes it.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    max: u32,
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    // Read what arrives rather than zero-fill what the prefix announces: a peer that sends only a length must not
    // make this connection hold `max` bytes.
    buf.clear();
    let got = r.take(u64::from(len)).read_to_end(buf)?;
    if got < len as usize {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    postcard::from_bytes(buf).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys and values are length-prefixed byte strings: these are the exact bytes of a frame, so a change of
    /// encoding (for speed, say) cannot silently change the protocol.
    #[test]
    fn keys_and_values_are_length_prefixed_bytes_on_the_wire() {
        let mut wire = Vec::new();
        let mut buf = Vec::new();
        let set = Request {
            id: 5,
            body: RequestBody::Data(DataOp::Set(b"k".to_vec(), vec![0xAB; 130])),
        };
        write_frame(&mut wire, &set, &mut buf).unwrap();
        // id 5, RequestBody::Data (0), DataOp::Set (1), key: length 1 and its byte, value: length 130 as a varint
        // (0x82 0x01) and its bytes.
        let mut expected = vec![5, 0, 1, 1, b'k', 0x82, 0x01];
        expected.extend_from_slice(&[0xAB; 130]);
        assert_eq!(wire[..4], (expected.len() as u32).to_le_bytes());
        assert_eq!(wire[4..], expected);

        wire.clear();
        let reply = Response {
            id: 5,
            body: ResponseBody::Value(Some(b"vv".to_vec())),
        };
        write_frame(&mut wire, &reply, &mut buf).unwrap();
        // id 5, ResponseBody::Value (0), Some (1), length 2, the bytes.
        assert_eq!(wire[4..], [5, 0, 1, 2, b'v', b'v']);
        let back: Response = read_frame(&mut &wire[..], &mut buf, DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(back.body, reply.body);
    }

    proptest! {
        #[test]
        fn frames_round_trip(id in any::<u64>(), key in proptest::collection::vec(any::<u8>(), 0..64),
                             value in proptest::collection::vec(any::<u8>(), 0..256), delta in any::<i64>()) {
            let mut wire = Vec::new();
            let mut buf = Vec::new();
            let reqs = [
                RequestBody::Data(DataOp::Get(key.clone())),
                RequestBody::Data(DataOp::Set(key.clone(), value.clone())),
                RequestBody::Data(DataOp::Incr(key.clone(), delta)),
                RequestBody::Data(DataOp::Append(key.clone(), value.clone())),
                RequestBody::Data(DataOp::Exists(key.clone())),
                RequestBody::Data(DataOp::Strlen(key.clone())),
                RequestBody::Data(DataOp::Take(key.clone())),
                RequestBody::Data(DataOp::GetRange(key.clone(), delta, -delta.saturating_abs())),
                RequestBody::Data(DataOp::SetRange(key.clone(), delta.unsigned_abs(), value.clone())),
                RequestBody::Data(DataOp::IncrFloat(key.clone(), value.clone())),
                RequestBody::Data(DataOp::InsertGet(key.clone(), value.clone())),
                RequestBody::Data(DataOp::UpdateGet(key.clone(), value.clone())),
                RequestBody::Data(DataOp::SetBit(key.clone(), delta.unsigned_abs(), delta < 0)),
                RequestBody::Data(DataOp::BitCount(key.clone(), Some((delta, -delta.saturating_abs(), true)))),
                RequestBody::Data(DataOp::BitPos(key.clone(), false, Some((delta, None, false)))),
                RequestBody::Ping,
                RequestBody::LatencyReport(LatencySummary {
                    count: 1,
                    sum_ns: delta.unsigned_abs(),
                    max_ns: 7,
                    buckets: vec![(7, 1)],
                }),
                RequestBody::EpochStats,
                RequestBody::ScanKeys { cursor: id, count: delta as u32 },
                RequestBody::Hello { version: PROTOCOL_VERSION, token: Secret(String::from_utf8_lossy(&key).into_owned()) },
            ];
            for body in &reqs {
                write_frame(&mut wire, &Request { id, body: body.clone() }, &mut buf).unwrap();
                let mut borrowed = Vec::new();
                write_frame(&mut borrowed, &RequestRef { id, body }, &mut buf).unwrap();
                prop_assert!(wire.ends_with(&borrowed), "a borrowed request encodes like an owned one");
            }
            let mut r = &wire[..];
            for body in &reqs {
                let got: Request = read_frame(&mut r, &mut buf, DEFAULT_MAX_FRAME).unwrap();
                prop_assert_eq!(got.id, id);
                prop_assert_eq!(format!("{:?}", got.body), format!("{body:?}"));
            }
            prop_assert!(r.is_empty());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut r = &bytes[..];
            let mut buf = Vec::new();
            // Whatever the bytes, each read ends in a frame or an error (never a panic); every read consumes at
            // least the 4-byte length, so 64 reads cover 256 of them.
            for _ in 0..64 {
                if r.is_empty() { break; }
                let _ = read_frame::<Request>(&mut r, &mut buf, 256);
            }
        }
    }

    #[test]
    fn a_hello_shows_its_token_only_as_a_length() {
        let hello = RequestBody::Hello {
            version: PROTOCOL_VERSION,
            token: Secret("hunter2-secret".into()),
        };
        let shown = format!("{hello:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<secret of 14 bytes>"), "{shown}");
    }

    #[test]
    fn a_request_this_version_does_not_know_is_an_error_not_a_panic() {
        // What an older node sees for a variant added after it: id 5, then a variant index it has no case for.
        let mut wire = Vec::new();
        let body = [5u8, 120];
        wire.extend_from_slice(&(body.len() as u32).to_le_bytes());
        wire.extend_from_slice(&body);
        let mut buf = Vec::new();
        let err = read_frame::<Request>(&mut &wire[..], &mut buf, DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, FrameError::Malformed(_)), "{err}");
    }

    #[test]
    fn oversized_frames_are_refused_before_reading_the_body() {
        let mut wire = (1u32 << 30).to_le_bytes().to_vec();
        wire.extend_from_slice(&[0; 16]);
        let mut buf = Vec::new();
        let err = read_frame::<Request>(&mut &wire[..], &mut buf, DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len, .. } if len == 1 << 30));
        assert!(
            buf.capacity() < 1 << 20,
            "no buffer was sized by the announced length"
        );
    }
}
