//! Revocation: a client the memory node revoked changes nothing in the pool any more, on either transport, not
//! even with requests it sent before the revocation; it cannot connect again; everyone else goes on.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::{Harness, TOKEN};
use dinomo_fabric::wire::{self, REQ_HEADER, ReqHeader};
use dinomo_fabric::{Batch, ClientId, DATA_REGION, FabricError, RpcError, RpcHandler};

const WAIT: Duration = Duration::from_secs(10);

fn named(node: u32, incarnation: u64) -> ClientId {
    ClientId { node, incarnation }
}

fn lost(r: Result<(), FabricError>) -> bool {
    matches!(r, Err(e) if e.is_connection_lost())
}

#[test]
fn a_revoked_client_changes_nothing_and_cannot_connect_again_while_others_go_on() -> Result<()> {
    for tcp in [false, true] {
        let h = Harness::new(1 << 20, 1 << 16);
        let base = h.connector(tcp);
        let (victim, other) = (named(7, 1), named(8, 1));
        // One endpoint of the revoked client per kind of round trip, each connected before the revocation.
        let mut revoked_eps = (0..7)
            .map(|_| base.for_client(victim).connect())
            .collect::<Result<Vec<_>, _>>()?;
        let mut other_ep = base.for_client(other).connect()?;
        let mut anonymous_ep = base.connect()?;
        let data = anonymous_ep
            .region(DATA_REGION)
            .context("data region")?
            .clone();
        let (a, b, c) = (
            data.at(data.start),
            data.at(data.start + 64),
            data.at(data.start + 128),
        );
        revoked_eps[0].write(a, &[1; 8])?;

        let r = h.node.clients().revoke_node(7, None);
        ensure!(r.clients == vec![victim], "tcp={tcp}: {r:?}");
        ensure!(r.connections == revoked_eps.len(), "tcp={tcp}: {r:?}");

        // Every kind of round trip fails, and none lands.
        let mut eps = revoked_eps.iter_mut();
        let mut next = || eps.next().expect("an endpoint per round trip");
        ensure!(
            lost(next().write(a, &[2; 8])),
            "tcp={tcp}: a write after revocation"
        );
        ensure!(lost(next().cas(a, 0, 3).map(drop)), "tcp={tcp}: a CAS");
        ensure!(lost(next().faa(a, 1).map(drop)), "tcp={tcp}: an FAA");
        let mut batch = Batch::new();
        batch.write(a, &[4; 8]);
        ensure!(lost(next().post(&mut batch)), "tcp={tcp}: a batch");
        let mut reads = Batch::new();
        reads.read(a, 8);
        ensure!(lost(next().post(&mut reads)), "tcp={tcp}: a batch of reads");
        let mut buf = [0u8; 8];
        ensure!(lost(next().read(a, &mut buf)), "tcp={tcp}: a read");
        let mut reply = Vec::new();
        ensure!(lost(next().rpc(1, b"", &mut reply)), "tcp={tcp}: an RPC");
        anonymous_ep.read(a, &mut buf)?;
        ensure!(
            buf == [1; 8],
            "tcp={tcp}: the pool changed after revocation: {buf:?}"
        );

        // Connecting again is refused, saying why.
        match base.for_client(victim).connect() {
            Err(FabricError::Revoked(why)) => {
                ensure!(
                    why.contains("node 7") && why.contains("revoked"),
                    "tcp={tcp}: {why}"
                )
            }
            other => anyhow::bail!("tcp={tcp}: a revoked client connected again: {other:?}"),
        }
        // Other nodes, anonymous clients and a new incarnation of the same node go on.
        other_ep.write(b, &[5; 8])?;
        anonymous_ep.write(c, &[6; 8])?;
        base.for_client(named(7, 2)).connect()?.write(c, &[7; 8])?;
        anonymous_ep.read(b, &mut buf)?;
        ensure!(buf == [5; 8], "tcp={tcp}");
        ensure!(h.node.clients().revoked_connections() == 7, "tcp={tcp}");
    }
    Ok(())
}

/// Blocks method 1 until the test lets it go, and tells the test who called.
struct Gatekeeper {
    entered: crossbeam_channel::Sender<Option<ClientId>>,
    release: Mutex<crossbeam_channel::Receiver<()>>,
}

impl RpcHandler for Gatekeeper {
    fn handle(
        &self,
        caller: Option<ClientId>,
        method: u16,
        _request: &[u8],
        _response: &mut Vec<u8>,
    ) -> Result<(), RpcError> {
        if method != 1 {
            return Err(RpcError::UnknownMethod(method));
        }
        let _ = self.entered.send(caller);
        let release = self.release.lock().unwrap_or_else(|p| p.into_inner());
        let _ = release.recv_timeout(WAIT);
        Ok(())
    }
}

fn gatekeeper(
    h: &Harness,
) -> (
    crossbeam_channel::Receiver<Option<ClientId>>,
    crossbeam_channel::Sender<()>,
) {
    let (entered_tx, entered_rx) = crossbeam_channel::unbounded();
    let (release_tx, release_rx) = crossbeam_channel::unbounded();
    h.node.set_rpc_handler(Arc::new(Gatekeeper {
        entered: entered_tx,
        release: Mutex::new(release_rx),
    }));
    (entered_rx, release_tx)
}

/// A connection to `h`'s server that sent a handshake with the right token and `identity`.
fn hello(h: &Harness, identity: [u8; wire::HANDSHAKE_IDENTITY]) -> Result<TcpStream> {
    let mut s = TcpStream::connect(h.server.local_addr())?;
    s.set_read_timeout(Some(WAIT))?;
    let mut hello = wire::HANDSHAKE_MAGIC.to_vec();
    hello.extend_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
    hello.extend_from_slice(&(TOKEN.len() as u16).to_le_bytes());
    hello.extend_from_slice(TOKEN.as_bytes());
    hello.extend_from_slice(&identity);
    s.write_all(&hello)?;
    Ok(s)
}

/// A connection past a handshake that named the client `id`.
fn raw_named_client(h: &Harness, id: ClientId) -> Result<TcpStream> {
    let mut s = hello(h, wire::encode_identity(Some(id)))?;
    let mut head = [0u8; 5];
    s.read_exact(&mut head)?;
    ensure!(head[0] == 0, "handshake refused");
    let mut body = vec![0u8; u32::from_le_bytes(head[1..5].try_into()?) as usize];
    s.read_exact(&mut body)?;
    Ok(s)
}

fn request(out: &mut Vec<u8>, h: ReqHeader) {
    h.encode(out);
}

#[test]
fn requests_sent_before_the_revocation_but_not_yet_executed_never_run() -> Result<()> {
    let h = Harness::new(1 << 20, 1 << 16);
    let (entered, release) = gatekeeper(&h);
    let data = h
        .connect(false)
        .region(DATA_REGION)
        .context("data region")?
        .clone();
    let before = h.data_image();
    let id = named(9, 42);
    let mut s = raw_named_client(&h, id)?;
    // One send: an RPC that the handler holds, then a WRITE and a CAS queued behind it on the same connection.
    let mut frames = Vec::new();
    request(
        &mut frames,
        ReqHeader {
            op: wire::op::RPC,
            flags: wire::FLAG_LAST,
            target: 1,
            rkey: 0,
            offset: 0,
            len: 0,
            id: 1,
            arg0: 0,
            arg1: 0,
        },
    );
    request(
        &mut frames,
        ReqHeader {
            op: wire::op::WRITE,
            flags: wire::FLAG_LAST,
            target: data.id,
            rkey: data.rkey,
            offset: data.start,
            len: 8,
            id: 2,
            arg0: 0,
            arg1: 0,
        },
    );
    frames.extend_from_slice(&[0xAB; 8]);
    request(
        &mut frames,
        ReqHeader {
            op: wire::op::CAS,
            flags: wire::FLAG_LAST,
            target: data.id,
            rkey: data.rkey,
            offset: data.start + 8,
            len: 0,
            id: 3,
            arg0: 0,
            arg1: 0xCD,
        },
    );
    assert_eq!(frames.len(), 3 * REQ_HEADER + 8);
    s.write_all(&frames)?;
    // The RPC reached the processor with the connection's identity: the WRITE and the CAS are in the node's
    // buffer, waiting behind it.
    let caller = entered.recv_timeout(WAIT).context("the RPC never ran")?;
    ensure!(caller == Some(id), "the handler saw caller {caller:?}");
    let r = h.node.clients().revoke_node(9, None);
    ensure!(r.connections == 1, "{r:?}");
    release.send(())?;
    // The connection closes with nothing more executed or answered.
    let t0 = Instant::now();
    while h.server.active_connections() > 0 {
        ensure!(
            t0.elapsed() < WAIT,
            "the revoked connection was never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    ensure!(
        rest.is_empty(),
        "{} bytes answered after the revocation",
        rest.len()
    );
    ensure!(
        h.data_image() == before,
        "a request queued before the revocation ran after it"
    );
    Ok(())
}

#[test]
fn an_rpc_handler_learns_who_calls_on_both_transports() -> Result<()> {
    let h = Harness::new(1 << 20, 1 << 16);
    let (entered, release) = gatekeeper(&h);
    for tcp in [false, true] {
        for client in [None, Some(named(3, 33))] {
            let base = h.connector(tcp);
            let mut ep = match client {
                Some(id) => base.for_client(id).connect()?,
                None => base.connect()?,
            };
            release.send(())?;
            ep.rpc(1, b"", &mut Vec::new())?;
            let caller = entered.recv_timeout(WAIT)?;
            ensure!(caller == client, "tcp={tcp}: {caller:?} != {client:?}");
        }
    }
    Ok(())
}

#[test]
fn a_revoked_handshake_is_answered_with_its_own_status() -> Result<()> {
    let h = Harness::new(1 << 20, 1 << 16);
    h.node.clients().revoke_node(4, Some(44));
    let mut reply = Vec::new();
    hello(&h, wire::encode_identity(Some(named(4, 44))))?.read_to_end(&mut reply)?;
    ensure!(reply.first() == Some(&wire::HANDSHAKE_REVOKED), "{reply:?}");
    // An identity flag other than 0 or 1 is refused as malformed.
    let mut reply = Vec::new();
    let mut bad_flag = [0u8; wire::HANDSHAKE_IDENTITY];
    bad_flag[0] = 9;
    hello(&h, bad_flag)?.read_to_end(&mut reply)?;
    ensure!(reply.first() == Some(&wire::HANDSHAKE_REFUSED), "{reply:?}");
    ensure!(String::from_utf8_lossy(&reply[5..]).contains("identity flag"));
    Ok(())
}
