//! TCP wire format: a handshake, then fixed little-endian headers for verbs and RPCs.
//!
//! ```text
//! handshake   client → node: "DNMF" u16 version u16 token_len, token, u8 named u32 node u64 incarnation
//!             (named = 1: the client is that KV-node incarnation; 0: it names itself not, and the rest is zero)
//!             node → client: u8 status (0 = ok, 1 = refused, 2 = revoked) u32 len, body (postcard
//!             HandshakeReply, or an error message)
//! request     48 B: u8 opcode u8 flags u16 0 | u32 region_or_method | u64 rkey | u64 offset | u32 len | u32 id
//!                   | u64 arg0 | u64 arg1, then `len` payload bytes for WRITE and RPC
//! response    24 B: u32 id u8 status u8 0 u16 0 | u32 len u32 0 | u64 value, then `len` payload bytes
//!             (READ data, RPC reply, or an RPC error message)
//! ```
//! Requests on one connection are executed and answered in order; ids let the client check that they match.

use serde::{Deserialize, Serialize};

use crate::clients::ClientId;
use crate::verbs::{RegionInfo, VerbKind};

/// Handshake magic.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"DNMF";
/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u16 = 2;
/// Bytes of the client's identity after the token: u8 named, u32 node, u64 incarnation.
pub const HANDSHAKE_IDENTITY: usize = 13;
/// The identity that follows the token in a handshake: who the client is, if it names itself.
pub fn encode_identity(client: Option<ClientId>) -> [u8; HANDSHAKE_IDENTITY] {
    let mut b = [0u8; HANDSHAKE_IDENTITY];
    if let Some(id) = client {
        b[0] = 1;
        b[1..5].copy_from_slice(&id.node.to_le_bytes());
        b[5..13].copy_from_slice(&id.incarnation.to_le_bytes());
    }
    b
}

/// Decodes [`encode_identity`]'s bytes; a flag other than 0 or 1 is returned as the error.
pub fn decode_identity(b: &[u8; HANDSHAKE_IDENTITY]) -> Result<Option<ClientId>, u8> {
    match b[0] {
        0 => Ok(None),
        1 => Ok(Some(ClientId {
            node: u32_at(b, 1),
            incarnation: u64_at(b, 5),
        })),
        other => Err(other),
    }
}

/// Handshake status: refused (the message says why).
pub const HANDSHAKE_REFUSED: u8 = 1;
/// Handshake status: the client named itself as one the memory node revoked.
pub const HANDSHAKE_REVOKED: u8 = 2;
/// Longest cluster token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Size of a request header.
pub const REQ_HEADER: usize = 48;
/// Size of a response header.
pub const RESP_HEADER: usize = 24;

/// Opcodes.
pub mod op {
    /// READ.
    pub const READ: u8 = 1;
    /// WRITE.
    pub const WRITE: u8 = 2;
    /// CAS.
    pub const CAS: u8 = 3;
    /// FAA.
    pub const FAA: u8 = 4;
    /// Two-sided call.
    pub const RPC: u8 = 5;
}

/// Flag: the last verb of a batch (a failure skips the rest of the batch up to this verb).
pub const FLAG_LAST: u8 = 1;

/// Response status codes beyond the verb errors (which use `VerbError::code`).
pub mod status {
    /// Success.
    pub const OK: u8 = 0;
    /// RPC method unknown.
    pub const RPC_UNKNOWN: u8 = 32;
    /// RPC handler failed; the payload is the message.
    pub const RPC_FAILED: u8 = 33;
    /// RPC codec error; the payload is the message.
    pub const RPC_CODEC: u8 = 34;
    /// Processor down.
    pub const RPC_DOWN: u8 = 35;
    /// RPC handler out of pool space; the payload is the message.
    pub const RPC_NO_SPACE: u8 = 36;
    /// Malformed request; the node closes the connection after this reply.
    pub const BAD_REQUEST: u8 = 64;
}

/// What the node tells a client after accepting it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandshakeReply {
    /// Identity of the pool served (changes if the pool file is replaced).
    pub pool_id: u64,
    /// Registered regions with their keys.
    pub regions: Vec<RegionInfo>,
    /// Largest payload accepted in one verb or RPC.
    pub max_message_len: u32,
}

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqHeader {
    /// Opcode.
    pub op: u8,
    /// Flags.
    pub flags: u8,
    /// Region id, or RPC method.
    pub target: u32,
    /// Region key.
    pub rkey: u64,
    /// Pool offset.
    pub offset: u64,
    /// Payload length (WRITE, RPC) or bytes to read (READ).
    pub len: u32,
    /// Request id, echoed in the response.
    pub id: u32,
    /// CAS expected / FAA addend.
    pub arg0: u64,
    /// CAS new value.
    pub arg1: u64,
}

impl ReqHeader {
    /// Appends the encoded header to `out`.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; REQ_HEADER];
        b[0] = self.op;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.target.to_le_bytes());
        b[8..16].copy_from_slice(&self.rkey.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..40].copy_from_slice(&self.arg0.to_le_bytes());
        b[40..48].copy_from_slice(&self.arg1.to_le_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes a header from exactly [`REQ_HEADER`] bytes.
    #[inline]
    pub fn decode(b: &[u8; REQ_HEADER]) -> ReqHeader {
        ReqHeader {
            op: b[0],
            flags: b[1],
            target: u32_at(b, 4),
            rkey: u64_at(b, 8),
            offset: u64_at(b, 16),
            len: u32_at(b, 24),
            id: u32_at(b, 28),
            arg0: u64_at(b, 32),
            arg1: u64_at(b, 40),
        }
    }

    /// Bytes of payload that follow this header on the wire.
    #[inline]
    pub fn payload_len(&self) -> usize {
        match self.op {
            op::WRITE | op::RPC => self.len as usize,
            _ => 0,
        }
    }
}

/// A decoded response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespHeader {
    /// Id of the request answered.
    pub id: u32,
    /// Status code.
    pub status: u8,
    /// Payload length.
    pub len: u32,
    /// Previous value (CAS, FAA).
    pub value: u64,
}

impl RespHeader {
    /// Appends the encoded header to `out`.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; RESP_HEADER];
        b[0..4].copy_from_slice(&self.id.to_le_bytes());
        b[4] = self.status;
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.value.to_le_bytes());
        out.extend_from_slice(&b);
    }

    /// Decodes a header from exactly [`RESP_HEADER`] bytes.
    #[inline]
    pub fn decode(b: &[u8; RESP_HEADER]) -> RespHeader {
        RespHeader {
            id: u32_at(b, 0),
            status: b[4],
            len: u32_at(b, 8),
            value: u64_at(b, 16),
        }
    }
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Opcode of a verb.
#[inline]
pub fn opcode(kind: VerbKind) -> u8 {
    match kind {
        VerbKind::Read => op::READ,
        VerbKind::Write => op::WRITE,
        VerbKind::Cas => op::CAS,
        VerbKind::Faa => op::FAA,
    }
}

/// Wire bytes of one verb (request header + payload out, response header + payload in), used by the counters of
/// every transport.
#[inline]
pub fn verb_bytes(kind: VerbKind, len: u64) -> (u64, u64) {
    match kind {
        VerbKind::Read => (REQ_HEADER as u64, RESP_HEADER as u64 + len),
        VerbKind::Write => (REQ_HEADER as u64 + len, RESP_HEADER as u64),
        VerbKind::Cas | VerbKind::Faa => (REQ_HEADER as u64, RESP_HEADER as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_header_roundtrip(op in any::<u8>(), flags in any::<u8>(), target in any::<u32>(), rkey in any::<u64>(),
                                    offset in any::<u64>(), len in any::<u32>(), id in any::<u32>(), a0 in any::<u64>(), a1 in any::<u64>()) {
            let h = ReqHeader { op, flags, target, rkey, offset, len, id, arg0: a0, arg1: a1 };
            let mut out = Vec::new();
            h.encode(&mut out);
            prop_assert_eq!(out.len(), REQ_HEADER);
            prop_assert_eq!(ReqHeader::decode(out.as_slice().try_into().unwrap()), h);
        }

        #[test]
        fn response_header_roundtrip(id in any::<u32>(), status in any::<u8>(), len in any::<u32>(), value in any::<u64>()) {
            let h = RespHeader { id, status, len, value };
            let mut out = Vec::new();
            h.encode(&mut out);
            prop_assert_eq!(out.len(), RESP_HEADER);
            prop_assert_eq!(RespHeader::decode(out.as_slice().try_into().unwrap()), h);
        }
    }
}
