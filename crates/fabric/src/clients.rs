//! Who is connected to a memory node, and revocation: how a memory node makes sure that a KV node the cluster has
//! taken over changes nothing in the pool any more (as RDMA moves a queue pair to the error state).
//!
//! A client that names itself in the handshake ([`ClientId`]: a KV node's id and the incarnation of its process)
//! gets a [`ClientGate`] per connection. A NIC thread executes one-sided verbs only while it holds its gate, and a
//! revocation marks the gate before it takes it, so once [`Clients::revoke_node`] returns, no verb of a revoked
//! connection runs any more, not even one already on its way when the revocation began. A revoked client is also
//! refused when it connects again, and its RPCs can be refused where the caller matters ([`Clients::is_revoked`]).
//! Connections that do not name themselves (the M-node, tools, benchmarks) are never revoked.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A client as the memory node knows it: a KV node's id and the incarnation of the process that runs it, so that
/// a restarted node (a new incarnation) is told apart from the one the cluster took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientId {
    /// The KV node's id.
    pub node: u32,
    /// The incarnation of its process.
    pub incarnation: u64,
}

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} (incarnation {:#x})",
            self.node, self.incarnation
        )
    }
}

/// One connection of a named client.
#[derive(Debug)]
pub(crate) struct ClientGate {
    revoked: AtomicBool,
    /// Held while one-sided verbs of the connection execute; a revocation takes it after marking the gate.
    exec: Mutex<()>,
    /// The connection's socket (TCP), shut down by a revocation so that a NIC thread waiting in `read` wakes.
    socket: Option<TcpStream>,
}

impl ClientGate {
    /// Whether the connection was revoked. A verb that reads `false` here may still be running when a revocation
    /// returns, unless it runs under [`ClientGate::enter`].
    #[inline]
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// The right to execute verbs until the guard is dropped, or `None` when the connection was revoked.
    #[inline]
    pub(crate) fn enter(&self) -> Option<MutexGuard<'_, ()>> {
        let guard = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        // Read under the lock: a revocation marks the gate before it takes the lock.
        (!self.revoked.load(Ordering::Acquire)).then_some(guard)
    }

    /// Marks the gate, waits for the verbs executing under it and closes the socket.
    fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        drop(self.exec.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(s) = &self.socket {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A named client's connection, registered for as long as this lives.
#[derive(Debug)]
pub(crate) struct Registration {
    id: ClientId,
    gate: Arc<ClientGate>,
    clients: Arc<Clients>,
}

impl Registration {
    pub(crate) fn gate(&self) -> &Arc<ClientGate> {
        &self.gate
    }

    pub(crate) fn id(&self) -> ClientId {
        self.id
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.clients.lock();
        if let Some(gates) = inner.live.get_mut(&self.id) {
            gates.retain(|g| !Arc::ptr_eq(g, &self.gate));
            if gates.is_empty() {
                inner.live.remove(&self.id);
            }
        }
    }
}

/// What one [`Clients::revoke_node`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocation {
    /// The clients refused from now on.
    pub clients: Vec<ClientId>,
    /// Connections closed.
    pub connections: usize,
}

#[derive(Debug, Default)]
struct Inner {
    live: HashMap<ClientId, Vec<Arc<ClientGate>>>,
    revoked: HashSet<ClientId>,
    /// Revoked clients, oldest first: the oldest is forgotten when more than the limit are kept.
    order: VecDeque<ClientId>,
}

impl Inner {
    /// Adds `id` to the revoked set, forgetting the oldest beyond `max`.
    fn remember(&mut self, id: ClientId, max: usize) {
        if self.revoked.insert(id) {
            self.order.push_back(id);
        }
        while self.order.len() > max {
            if let Some(old) = self.order.pop_front() {
                self.revoked.remove(&old);
            }
        }
    }
}

/// The named clients of a memory node and the ones it revoked.
#[derive(Debug)]
pub struct Clients {
    inner: Mutex<Inner>,
    max_revoked: usize,
    revoked_connections: AtomicU64,
}

impl Clients {
    /// A table that remembers up to `max_revoked` revoked clients (at least one).
    pub fn new(max_revoked: usize) -> Arc<Clients> {
        Arc::new(Clients {
            inner: Mutex::new(Inner::default()),
            max_revoked: max_revoked.max(1),
            revoked_connections: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection of `id`, refused when `id` was revoked.
    pub(crate) fn register(
        self: &Arc<Self>,
        id: ClientId,
        socket: Option<TcpStream>,
    ) -> Result<Registration, Refused> {
        let mut inner = self.lock();
        if inner.revoked.contains(&id) {
            return Err(Refused(id));
        }
        let gate = Arc::new(ClientGate {
            revoked: AtomicBool::new(false),
            exec: Mutex::new(()),
            socket,
        });
        inner.live.entry(id).or_default().push(gate.clone());
        Ok(Registration {
            id,
            gate,
            clients: self.clone(),
        })
    }

    /// Revokes KV node `node`'s `incarnation`, connected or not (it may connect later, from behind a partition), or
    /// with `None` every incarnation of it connected now: each is refused from now on, and each of their
    /// connections is closed once the verbs it is executing have completed, so that when this returns none of
    /// their verbs runs any more. Naming the incarnation leaves a newer one of the same node alone, which matters
    /// when the call comes late (from a management node that stalled while the node restarted).
    pub fn revoke_node(&self, node: u32, incarnation: Option<u64>) -> Revocation {
        let (clients, gates) = {
            let mut inner = self.lock();
            let clients: Vec<ClientId> = match incarnation {
                Some(incarnation) => vec![ClientId { node, incarnation }],
                None => inner
                    .live
                    .keys()
                    .filter(|c| c.node == node)
                    .copied()
                    .collect(),
            };
            let mut gates = Vec::new();
            for id in &clients {
                inner.remember(*id, self.max_revoked);
                // Off the table: a revoked connection is no longer counted as connected, even while its
                // endpoint (in process) or its NIC thread (TCP) is still around.
                gates.extend(inner.live.remove(id).into_iter().flatten());
            }
            (clients, gates)
        };
        // Outside the table's lock: waiting for a verb must not hold up connections of other clients.
        for gate in &gates {
            gate.revoke();
        }
        self.revoked_connections
            .fetch_add(gates.len() as u64, Ordering::Relaxed);
        Revocation {
            clients,
            connections: gates.len(),
        }
    }

    /// Revokes `ids` (oldest first), none of which may be connected yet: the revocations a memory node restarted on
    /// its pool still refuses. Beyond the table's limit, the oldest are forgotten.
    pub fn restore(&self, ids: &[ClientId]) {
        let mut inner = self.lock();
        for id in ids {
            inner.remember(*id, self.max_revoked);
        }
    }

    /// The most revoked clients remembered.
    pub fn max_revoked(&self) -> usize {
        self.max_revoked
    }

    /// Whether `id` was revoked (and is still remembered).
    pub fn is_revoked(&self, id: ClientId) -> bool {
        self.lock().revoked.contains(&id)
    }

    /// Named clients connected now (revoked ones are not).
    pub fn connected(&self) -> Vec<ClientId> {
        self.lock().live.keys().copied().collect()
    }

    /// Connections closed by revocations so far.
    pub fn revoked_connections(&self) -> u64 {
        self.revoked_connections.load(Ordering::Relaxed)
    }
}

/// A revoked client tried to connect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused(pub ClientId);

impl From<Refused> for crate::FabricError {
    fn from(r: Refused) -> Self {
        crate::FabricError::Revoked(r.to_string())
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} was revoked: the cluster took its keys over, so it may no longer reach the pool \
             (restart it to serve again)",
            self.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: u32, incarnation: u64) -> ClientId {
        ClientId { node, incarnation }
    }

    #[test]
    fn a_revoked_client_is_refused_and_others_are_not() {
        let clients = Clients::new(8);
        let a = clients.register(id(1, 10), None).unwrap();
        let b = clients.register(id(2, 20), None).unwrap();
        let r = clients.revoke_node(1, None);
        assert_eq!(r.clients, vec![id(1, 10)]);
        assert_eq!(r.connections, 1);
        assert!(a.gate().is_revoked() && a.gate().enter().is_none());
        assert!(!b.gate().is_revoked() && b.gate().enter().is_some());
        assert_eq!(clients.connected(), vec![id(2, 20)]);
        assert!(clients.register(id(1, 10), None).is_err());
        // A new incarnation of the same node is another client.
        assert!(clients.register(id(1, 11), None).is_ok());
        assert_eq!(clients.revoked_connections(), 1);
    }

    #[test]
    fn an_incarnation_named_is_refused_even_when_it_was_not_connected_and_others_are_left_alone() {
        let clients = Clients::new(8);
        let newer = clients.register(id(3, 8), None).unwrap();
        let r = clients.revoke_node(3, Some(7));
        assert_eq!((r.clients, r.connections), (vec![id(3, 7)], 0));
        assert!(clients.register(id(3, 7), None).is_err());
        assert!(clients.is_revoked(id(3, 7)));
        assert!(!newer.gate().is_revoked());
        assert_eq!(clients.connected(), vec![id(3, 8)]);
    }

    #[test]
    fn a_dropped_registration_leaves_the_table_and_old_revocations_are_forgotten_past_the_limit() {
        let clients = Clients::new(2);
        let r = clients.register(id(1, 1), None).unwrap();
        assert_eq!(clients.connected(), vec![id(1, 1)]);
        drop(r);
        assert!(clients.connected().is_empty());
        for inc in 0..3 {
            clients.revoke_node(5, Some(inc));
        }
        assert!(!clients.is_revoked(id(5, 0)), "the oldest is forgotten");
        assert!(clients.is_revoked(id(5, 1)) && clients.is_revoked(id(5, 2)));
    }

    #[test]
    fn a_revocation_waits_for_the_verbs_executing_under_the_gate() {
        let clients = Clients::new(8);
        let reg = clients.register(id(1, 1), None).unwrap();
        let gate = reg.gate().clone();
        let guard = gate.enter().expect("not revoked yet");
        let done = Arc::new(AtomicBool::new(false));
        let revoker = {
            let (clients, done) = (clients.clone(), done.clone());
            std::thread::spawn(move || {
                clients.revoke_node(1, None);
                done.store(true, Ordering::Release);
            })
        };
        // The revocation has marked the gate but cannot return while the verb runs.
        while !gate.is_revoked() {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!done.load(Ordering::Acquire), "returned while a verb ran");
        drop(guard);
        revoker.join().unwrap();
        assert!(done.load(Ordering::Acquire));
        assert!(gate.enter().is_none());
    }
}
