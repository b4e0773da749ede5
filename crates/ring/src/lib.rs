//! Consistent hashing with virtual nodes: which KV node owns a key, versioned by epoch, with replication metadata.
//!
//! This is the cluster's ownership map (DINOMO §3.4, "Ownership metadata" and "Selective replication"). The global
//! ring places every KV node (KN) at [`Ring::vnodes`] pseudo-random points on a 64-bit circle; a key belongs to the
//! node of the first point at or clockwise after [`ring_hash`]`(key)`. Hot keys may be given a replication factor
//! `R > 1`: their owners are the primary and the next `R - 1` distinct nodes clockwise. KNs, routing nodes, clients
//! and the management node all hold a copy; every change bumps the [`Ring::epoch`], so a holder can tell which of
//! two copies is newer. The ring is `serde`-serialisable for the network and for persistence; the virtual-node
//! points are not sent but rebuilt from the node set, so a deserialised ring answers exactly like the original.
//!
//! Lookups ([`Ring::primary`], [`Ring::owners`], [`Ring::is_owner`]) are a binary search over the sorted points and
//! do not allocate (for replication factors up to [`OWNERS_INLINE`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

mod owners;

pub use owners::{OWNERS_INLINE, Owners};

/// The identifier of a KV node.
pub type NodeId = u32;

/// The default number of virtual nodes (points on the ring) per KV node.
///
/// A node's share of the hash space is the sum of `vnodes` arcs, so its relative spread between nodes is about
/// `1 / sqrt(vnodes)`: 12.5% at 64. A node then strays beyond ±50% of the mean share (four standard deviations)
/// about once in 12,000 nodes and beyond ±60% about once in 100,000 (simulated over random 4–16-node rings), while a
/// lookup stays a binary search of about `log2(64 · nodes)` steps (10 for 16 nodes) over 12 bytes per point
/// (768 bytes per node). Halving the spread again would cost four times the points.
pub const DEFAULT_VNODES: u32 = 64;

/// The largest accepted number of virtual nodes per node; [`Ring::new`] clamps to `1..=MAX_VNODES`, and a
/// deserialised ring outside that range is refused. Beyond this the spread barely improves while memory grows.
pub const MAX_VNODES: u32 = 1024;

/// The largest number of virtual-node points a ring holds (`nodes × vnodes`): 1 Mi points, 12 MiB. It bounds the
/// memory a ring received from the network can make its holder allocate (the node set costs a few bytes per node on
/// the wire, its points 12 bytes × vnodes per node). With [`DEFAULT_VNODES`] this admits 16,384 nodes.
pub const MAX_POINTS: usize = 1 << 20;

/// The largest replication factor a key can have; [`Ring::set_replication`] clamps to it and a deserialised ring
/// with a larger factor is refused. Finding `R` distinct owners walks the ring and checks each candidate against the
/// owners found so far, so `R` is kept small enough for that to stay cheap; hot keys need a handful of owners.
pub const MAX_REPLICATION: u32 = 64;

/// The seed of [`ring_hash`] and of the virtual-node positions (ASCII "dinomoRG"). It is non-zero so that ring
/// positions are independent of `dinomo_log::key_hash` (XXH3, seed 0), which picks the thread inside a node and lays
/// out the index: with correlated hashes, the keys a node owns would crowd onto a few of its threads.
pub const RING_HASH_SEED: u64 = 0x6469_6e6f_6d6f_5247;

/// The position of a key on the ring (XXH3-64 with [`RING_HASH_SEED`], so it is independent of
/// `dinomo_log::key_hash`, which picks the thread inside a node and lays out the index; correlated hashes would skew
/// threads). Part of the cluster's persistent format: never change it.
#[inline]
pub fn ring_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, RING_HASH_SEED)
}

/// The position of virtual node `index` of `node`: XXH3-64 with [`RING_HASH_SEED`] over the 8 bytes
/// `node.to_le_bytes() ++ index.to_le_bytes()`. Part of the cluster's persistent format: never change it.
#[inline]
pub fn vnode_hash(node: NodeId, index: u32) -> u64 {
    let mut buf = [0u8; 8];
    buf[..4].copy_from_slice(&node.to_le_bytes());
    buf[4..].copy_from_slice(&index.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&buf, RING_HASH_SEED)
}

/// Errors of ring operations that can be refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A virtual-node count outside `1..=MAX_VNODES`.
    #[error("virtual nodes per node must be in 1..={max}, got {got}")]
    BadVnodes {
        /// The count given.
        got: u32,
        /// [`MAX_VNODES`].
        max: u32,
    },
    /// The ring would hold more than [`MAX_POINTS`] virtual-node points.
    #[error("{nodes} nodes × {vnodes} virtual nodes exceeds the limit of {max} points")]
    TooManyPoints {
        /// Nodes the ring would hold.
        nodes: usize,
        /// Virtual nodes per node.
        vnodes: u32,
        /// [`MAX_POINTS`].
        max: usize,
    },
    /// A stored replication factor outside `2..=MAX_REPLICATION` (factor 1 is never stored).
    #[error("replication factor {got} is outside 2..={max}")]
    BadReplication {
        /// The factor found.
        got: u32,
        /// [`MAX_REPLICATION`].
        max: u32,
    },
    /// A stored ring lists the same key twice in its replication factors.
    #[error("replicated key listed twice ({len} bytes)")]
    DuplicateReplicatedKey {
        /// The length of the key.
        len: usize,
    },
}

/// The sorted virtual-node points: `hashes[i]` belongs to `owners[i]`, ordered by `(hash, node)` so that points
/// with equal hashes (astronomically rare) are ordered by node id, which makes every answer deterministic.
/// Two parallel vectors keep the binary search on a dense array of hashes.
#[derive(Clone, Default, PartialEq, Eq)]
struct Points {
    hashes: Vec<u64>,
    owners: Vec<NodeId>,
}

impl Points {
    /// All points of `nodes` with `vnodes` each.
    fn build(vnodes: u32, nodes: &BTreeSet<NodeId>) -> Points {
        let mut all: Vec<(u64, NodeId)> = Vec::with_capacity(nodes.len() * vnodes as usize);
        for &node in nodes {
            all.extend((0..vnodes).map(|i| (vnode_hash(node, i), node)));
        }
        all.sort_unstable();
        let (hashes, owners) = all.into_iter().unzip();
        Points { hashes, owners }
    }

    /// Merges the points of a node not yet on the ring.
    fn insert(&mut self, vnodes: u32, node: NodeId) {
        let mut new: Vec<(u64, NodeId)> =
            (0..vnodes).map(|i| (vnode_hash(node, i), node)).collect();
        new.sort_unstable();
        let total = self.hashes.len() + new.len();
        let mut hashes = Vec::with_capacity(total);
        let mut owners = Vec::with_capacity(total);
        let mut old = self
            .hashes
            .iter()
            .copied()
            .zip(self.owners.iter().copied())
            .peekable();
        let mut new = new.into_iter().peekable();
        loop {
            let next = match (old.peek(), new.peek()) {
                (Some(a), Some(b)) => {
                    if a <= b {
                        old.next()
                    } else {
                        new.next()
                    }
                }
                (Some(_), None) => old.next(),
                (None, Some(_)) => new.next(),
                (None, None) => break,
            };
            if let Some((h, n)) = next {
                hashes.push(h);
                owners.push(n);
            }
        }
        self.hashes = hashes;
        self.owners = owners;
    }

    /// Drops every point of `node`.
    fn remove(&mut self, node: NodeId) {
        let mut keep = self.owners.iter().map(|&n| n != node);
        self.hashes.retain(|_| keep.next().unwrap_or(true));
        self.owners.retain(|&n| n != node);
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    /// The index of the first point at or after `hash`, wrapping to 0; `None` when there are no points.
    #[inline]
    fn successor(&self, hash: u64) -> Option<usize> {
        if self.hashes.is_empty() {
            return None;
        }
        let i = self.hashes.partition_point(|&h| h < hash);
        Some(if i == self.hashes.len() { 0 } else { i })
    }

    /// The length of the arc point `i` is the successor for: the hashes in `(previous point, point i]`.
    fn arc(&self, i: usize) -> u128 {
        let here = self.hashes[i];
        let prev = if i == 0 {
            self.hashes[self.hashes.len() - 1]
        } else {
            self.hashes[i - 1]
        };
        if i == 0 && prev == here {
            // Every point sits at the same hash: the first one receives the whole circle.
            1u128 << 64
        } else {
            u128::from(here.wrapping_sub(prev))
        }
    }
}

/// The wire and storage form of a [`Ring`]: everything but the virtual-node points, which are rebuilt (and the
/// input validated) when it is read back. Field order matches [`Ring`]'s serialised fields. Replication factors are
/// a sequence of `(key, factor)` pairs rather than a map, because formats such as JSON only allow string map keys.
#[derive(Deserialize)]
struct RingRecord {
    epoch: u64,
    vnodes: u32,
    nodes: BTreeSet<NodeId>,
    replication: Vec<(Vec<u8>, u32)>,
}

/// Writes the replication map as the `(key, factor)` sequence [`RingRecord`] reads.
fn serialize_pairs<S: serde::Serializer>(
    map: &BTreeMap<Vec<u8>, u32>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(map)
}

impl TryFrom<RingRecord> for Ring {
    type Error = RingError;

    fn try_from(r: RingRecord) -> Result<Ring, RingError> {
        if r.vnodes == 0 || r.vnodes > MAX_VNODES {
            return Err(RingError::BadVnodes {
                got: r.vnodes,
                max: MAX_VNODES,
            });
        }
        if r.nodes.len().saturating_mul(r.vnodes as usize) > MAX_POINTS {
            return Err(RingError::TooManyPoints {
                nodes: r.nodes.len(),
                vnodes: r.vnodes,
                max: MAX_POINTS,
            });
        }
        let mut replication = BTreeMap::new();
        for (key, f) in r.replication {
            if !(2..=MAX_REPLICATION).contains(&f) {
                return Err(RingError::BadReplication {
                    got: f,
                    max: MAX_REPLICATION,
                });
            }
            let len = key.len();
            if replication.insert(key, f).is_some() {
                return Err(RingError::DuplicateReplicatedKey { len });
            }
        }
        let points = Points::build(r.vnodes, &r.nodes);
        Ok(Ring {
            epoch: r.epoch,
            vnodes: r.vnodes,
            nodes: r.nodes,
            replication,
            points,
        })
    }
}

/// The global hash ring: KV nodes on a consistent-hashing circle with virtual nodes, per-key replication factors,
/// and an epoch that grows with every change.
///
/// Serialised as `(epoch, vnodes, nodes, replication)`; deserialising validates the limits ([`MAX_VNODES`],
/// [`MAX_POINTS`], [`MAX_REPLICATION`]) and rebuilds the points, so the copy answers exactly like the original.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RingRecord")]
pub struct Ring {
    epoch: u64,
    vnodes: u32,
    nodes: BTreeSet<NodeId>,
    /// Keys with a replication factor of 2 or more (factor 1 is the default and never stored).
    #[serde(serialize_with = "serialize_pairs")]
    replication: BTreeMap<Vec<u8>, u32>,
    #[serde(skip_serializing)]
    points: Points,
}

impl Ring {
    /// An empty ring at epoch 0 whose nodes get `vnodes` points each (clamped to `1..=MAX_VNODES`).
    pub fn new(vnodes: u32) -> Ring {
        Ring {
            epoch: 0,
            vnodes: vnodes.clamp(1, MAX_VNODES),
            nodes: BTreeSet::new(),
            replication: BTreeMap::new(),
            points: Points::default(),
        }
    }

    /// A ring holding `nodes`, at epoch 1 if there are any (0 otherwise). `vnodes` is clamped as in [`Ring::new`].
    /// Should the nodes need more than [`MAX_POINTS`] points, only the lowest node ids that fit are kept, so the
    /// result never depends on the order the nodes come in; [`Ring::try_with_nodes`] refuses instead.
    pub fn with_nodes(vnodes: u32, nodes: impl IntoIterator<Item = NodeId>) -> Ring {
        let mut ring = Ring::new(vnodes);
        let mut set: BTreeSet<NodeId> = nodes.into_iter().collect();
        let cap = ring.node_capacity();
        while set.len() > cap {
            set.pop_last();
        }
        ring.install(set);
        ring
    }

    /// Like [`Ring::with_nodes`], but `vnodes` outside `1..=MAX_VNODES` or more than [`MAX_POINTS`] points are an
    /// error.
    pub fn try_with_nodes(
        vnodes: u32,
        nodes: impl IntoIterator<Item = NodeId>,
    ) -> Result<Ring, RingError> {
        if vnodes == 0 || vnodes > MAX_VNODES {
            return Err(RingError::BadVnodes {
                got: vnodes,
                max: MAX_VNODES,
            });
        }
        let mut ring = Ring::new(vnodes);
        let set: BTreeSet<NodeId> = nodes.into_iter().collect();
        if set.len() > ring.node_capacity() {
            return Err(RingError::TooManyPoints {
                nodes: set.len(),
                vnodes,
                max: MAX_POINTS,
            });
        }
        ring.install(set);
        Ok(ring)
    }

    fn install(&mut self, nodes: BTreeSet<NodeId>) {
        self.points = Points::build(self.vnodes, &nodes);
        self.epoch = u64::from(!nodes.is_empty());
        self.nodes = nodes;
    }

    /// How many nodes fit under [`MAX_POINTS`] with this ring's virtual-node count.
    pub fn node_capacity(&self) -> usize {
        MAX_POINTS / self.vnodes as usize
    }

    /// The version of this ring: it grows by one with every change (node added or removed, replication factor
    /// changed), so of two copies the one with the larger epoch is newer. It saturates at `u64::MAX`.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Virtual nodes (points on the ring) per node.
    #[inline]
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The nodes, in ascending order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        self.nodes.iter().copied()
    }

    /// The number of nodes.
    #[inline]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the ring holds no nodes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// True when `node` is on the ring.
    #[inline]
    pub fn contains(&self, node: NodeId) -> bool {
        self.nodes.contains(&node)
    }

    fn bump(&mut self) {
        self.epoch = self.epoch.saturating_add(1);
    }

    /// Adds `node`. Returns true (and bumps the epoch) if it was not there yet; false if it was, or if the ring is
    /// full ([`Ring::node_capacity`]; [`Ring::try_add_node`] tells the two apart).
    pub fn add_node(&mut self, node: NodeId) -> bool {
        self.try_add_node(node).unwrap_or(false)
    }

    /// Adds `node`: `Ok(true)` (and the epoch bumped) if it was added, `Ok(false)` if it was already there, an error
    /// if the ring would exceed [`MAX_POINTS`]. Only keys on the new node's arcs change primary, and only to it.
    pub fn try_add_node(&mut self, node: NodeId) -> Result<bool, RingError> {
        if self.nodes.contains(&node) {
            return Ok(false);
        }
        if self.nodes.len() >= self.node_capacity() {
            return Err(RingError::TooManyPoints {
                nodes: self.nodes.len() + 1,
                vnodes: self.vnodes,
                max: MAX_POINTS,
            });
        }
        self.nodes.insert(node);
        self.points.insert(self.vnodes, node);
        self.bump();
        Ok(true)
    }

    /// Removes `node`. Returns true (and bumps the epoch) if it was there. Only the keys it was primary for change
    /// primary. Replication factors are kept: they belong to keys, not nodes.
    pub fn remove_node(&mut self, node: NodeId) -> bool {
        if !self.nodes.remove(&node) {
            return false;
        }
        self.points.remove(node);
        self.bump();
        true
    }

    /// The primary owner of `key`; `None` only when the ring is empty.
    #[inline]
    pub fn primary(&self, key: &[u8]) -> Option<NodeId> {
        self.primary_for_hash(ring_hash(key))
    }

    /// The primary owner of the ring position `hash` (a [`ring_hash`]); `None` only when the ring is empty.
    #[inline]
    pub fn primary_for_hash(&self, hash: u64) -> Option<NodeId> {
        self.points.successor(hash).map(|i| self.points.owners[i])
    }

    /// The owners of `key`: `min(replication(key), len())` distinct nodes, the primary first, then the next
    /// distinct nodes clockwise. Empty only when the ring is empty.
    pub fn owners(&self, key: &[u8]) -> Owners {
        self.owners_with(key, self.replication(key))
    }

    /// The first `min(factor, len())` distinct nodes at or clockwise after `key`'s position.
    fn owners_with(&self, key: &[u8], factor: u32) -> Owners {
        let mut out = Owners::new();
        let Some(start) = self.points.successor(ring_hash(key)) else {
            return out;
        };
        let want = (factor as usize).min(self.nodes.len());
        let owners = &self.points.owners;
        out.push(owners[start]);
        if want <= 1 {
            return out;
        }
        // Every node has at least one point, so one turn of the circle meets `want <= len()` distinct nodes.
        for &node in owners[start + 1..].iter().chain(&owners[..start]) {
            if !out.contains(node) {
                out.push(node);
                if out.len() == want {
                    break;
                }
            }
        }
        out
    }

    /// True when `node` owns `key`, as primary or secondary.
    #[inline]
    pub fn is_owner(&self, node: NodeId, key: &[u8]) -> bool {
        if !self.nodes.contains(&node) {
            return false;
        }
        match self.replication(key) {
            1 => self.primary(key) == Some(node),
            factor => self.owners_with(key, factor).contains(node),
        }
    }

    /// The replication factor of `key`: 1 unless set with [`Ring::set_replication`].
    #[inline]
    pub fn replication(&self, key: &[u8]) -> u32 {
        if self.replication.is_empty() {
            return 1;
        }
        self.replication.get(key).copied().unwrap_or(1)
    }

    /// Sets the replication factor of `key` to `r` (clamped to [`MAX_REPLICATION`]); `r <= 1` removes the entry.
    /// Returns true (and bumps the epoch) if that changed anything. The factor may exceed the node count: a key then
    /// gets every node, and more as nodes join.
    pub fn set_replication(&mut self, key: &[u8], r: u32) -> bool {
        let r = r.min(MAX_REPLICATION);
        let changed = if r <= 1 {
            self.replication.remove(key).is_some()
        } else if let Some(f) = self.replication.get_mut(key) {
            std::mem::replace(f, r) != r
        } else {
            self.replication.insert(key.to_vec(), r);
            true
        };
        if changed {
            self.bump();
        }
        changed
    }

    /// The keys with a replication factor above 1 and their factors, in key order.
    pub fn replicated(&self) -> impl ExactSizeIterator<Item = (&[u8], u32)> + '_ {
        self.replication.iter().map(|(k, &r)| (k.as_slice(), r))
    }

    /// The fraction of the hash space `node` is primary for (0 when it is not on the ring). The shares of all nodes
    /// sum to 1 (up to rounding). Takes time linear in the number of points.
    pub fn share(&self, node: NodeId) -> f64 {
        if !self.nodes.contains(&node) {
            return 0.0;
        }
        let arc: u128 = (0..self.points.len())
            .filter(|&i| self.points.owners[i] == node)
            .map(|i| self.points.arc(i))
            .sum();
        arc as f64 / (1u128 << 64) as f64
    }

    /// [`Ring::share`] of every node, in one pass over the points.
    pub fn shares(&self) -> BTreeMap<NodeId, f64> {
        let mut arcs: BTreeMap<NodeId, u128> = self.nodes.iter().map(|&n| (n, 0)).collect();
        for i in 0..self.points.len() {
            if let Some(a) = arcs.get_mut(&self.points.owners[i]) {
                *a += self.points.arc(i);
            }
        }
        arcs.into_iter()
            .map(|(n, a)| (n, a as f64 / (1u128 << 64) as f64))
            .collect()
    }

    /// Raises the epoch to `epoch` if it is lower (used when a persisted record is newer than this copy's history,
    /// so the next change gets an epoch above it); never lowers it.
    pub fn set_epoch_at_least(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }
}

impl Default for Ring {
    /// An empty ring with [`DEFAULT_VNODES`].
    fn default() -> Ring {
        Ring::new(DEFAULT_VNODES)
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The points are derived from the node set; printing them would swamp the output.
        f.debug_struct("Ring")
            .field("epoch", &self.epoch)
            .field("vnodes", &self.vnodes)
            .field("nodes", &self.nodes)
            .field("replicated_keys", &self.replication.len())
            .field("points", &self.points.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> impl Iterator<Item = Vec<u8>> {
        (0..n).map(|i| format!("key-{i}").into_bytes())
    }

    #[test]
    fn empty_ring_answers_nothing() {
        let r = Ring::new(DEFAULT_VNODES);
        assert_eq!(r.epoch(), 0);
        assert!(r.is_empty());
        assert_eq!(r.len(), 0);
        assert_eq!(r.nodes().count(), 0);
        assert_eq!(r.primary(b"k"), None);
        assert!(r.owners(b"k").is_empty());
        assert!(!r.is_owner(0, b"k"));
        assert_eq!(r.share(0), 0.0);
        assert!(r.shares().is_empty());
        let r = Ring::with_nodes(DEFAULT_VNODES, []);
        assert_eq!(r.epoch(), 0);
        assert_eq!(r, Ring::default());
    }

    #[test]
    fn single_node_owns_everything() {
        for vnodes in [1, 2, DEFAULT_VNODES] {
            let mut r = Ring::with_nodes(vnodes, [7]);
            assert_eq!(r.epoch(), 1);
            assert!(r.set_replication(b"key-3", 3));
            for k in keys(500) {
                assert_eq!(r.primary(&k), Some(7));
                assert_eq!(r.owners(&k).as_slice(), &[7]);
                assert!(r.is_owner(7, &k));
                assert!(!r.is_owner(8, &k));
            }
            assert_eq!(r.share(7), 1.0);
            assert_eq!(r.shares().into_iter().collect::<Vec<_>>(), vec![(7, 1.0)]);
            for h in [0, 1, u64::MAX / 2, u64::MAX] {
                assert_eq!(r.primary_for_hash(h), Some(7));
            }
        }
    }

    #[test]
    fn vnodes_are_clamped_or_refused() {
        assert_eq!(Ring::new(0).vnodes(), 1);
        assert_eq!(Ring::new(u32::MAX).vnodes(), MAX_VNODES);
        assert_eq!(
            Ring::try_with_nodes(0, [1]),
            Err(RingError::BadVnodes {
                got: 0,
                max: MAX_VNODES
            })
        );
        assert!(matches!(
            Ring::try_with_nodes(MAX_VNODES + 1, [1]),
            Err(RingError::BadVnodes { .. })
        ));
        let r = Ring::try_with_nodes(3, [1, 2]).expect("valid");
        assert_eq!((r.vnodes(), r.len(), r.points.len()), (3, 2, 6));
    }

    #[test]
    fn capacity_is_enforced_without_panicking() {
        let cap = MAX_POINTS / MAX_VNODES as usize;
        let over = cap as u32 + 3;
        assert!(matches!(
            Ring::try_with_nodes(MAX_VNODES, 0..over),
            Err(RingError::TooManyPoints { .. })
        ));
        // Too many nodes: the lowest ids are kept whatever the order they come in.
        let mut r = Ring::with_nodes(MAX_VNODES, (0..over).rev());
        assert_eq!(r.len(), cap);
        assert_eq!(r.node_capacity(), cap);
        assert_eq!(r.points.len(), MAX_POINTS);
        assert_eq!(r.nodes().last(), Some(cap as u32 - 1));
        let epoch = r.epoch();
        assert!(!r.add_node(u32::MAX));
        assert!(matches!(
            r.try_add_node(u32::MAX),
            Err(RingError::TooManyPoints { .. })
        ));
        assert_eq!(r.try_add_node(0), Ok(false));
        assert_eq!(r.epoch(), epoch);
        assert!(!r.contains(u32::MAX));
        // Room again after a removal.
        assert!(r.remove_node(0));
        assert_eq!(r.try_add_node(u32::MAX), Ok(true));
        assert_eq!(r.points.len(), MAX_POINTS);
    }

    #[test]
    fn epochs_bump_only_on_change() {
        let mut r = Ring::new(16);
        assert!(r.add_node(1));
        assert_eq!(r.epoch(), 1);
        assert!(!r.add_node(1));
        assert_eq!(r.epoch(), 1);
        assert!(r.add_node(2));
        assert_eq!(r.epoch(), 2);
        assert!(!r.remove_node(3));
        assert_eq!(r.epoch(), 2);
        assert!(r.remove_node(2));
        assert_eq!(r.epoch(), 3);
        assert!(!r.remove_node(2));
        assert_eq!(r.epoch(), 3);

        assert!(!r.set_replication(b"a", 1));
        assert!(!r.set_replication(b"a", 0));
        assert_eq!(r.epoch(), 3);
        assert!(r.set_replication(b"a", 2));
        assert_eq!(r.epoch(), 4);
        assert!(!r.set_replication(b"a", 2));
        assert_eq!(r.epoch(), 4);
        assert!(r.set_replication(b"a", 3));
        assert_eq!(r.epoch(), 5);
        assert!(r.set_replication(b"a", 1));
        assert_eq!(r.epoch(), 6);
        assert_eq!(r.replication(b"a"), 1);
        assert_eq!(r.replicated().count(), 0);

        r.set_epoch_at_least(3);
        assert_eq!(r.epoch(), 6);
        r.set_epoch_at_least(40);
        assert_eq!(r.epoch(), 40);
        assert!(r.add_node(9));
        assert_eq!(r.epoch(), 41);
        r.set_epoch_at_least(u64::MAX);
        assert!(r.add_node(10));
        assert_eq!(r.epoch(), u64::MAX);
    }

    #[test]
    fn replication_clamps_to_node_count() {
        let mut r = Ring::with_nodes(DEFAULT_VNODES, [10, 20, 30]);
        assert_eq!(r.replication(b"hot"), 1);
        assert!(r.set_replication(b"hot", 5));
        assert_eq!(r.replication(b"hot"), 5);
        let o = r.owners(b"hot");
        assert_eq!(o.len(), 3);
        assert_eq!(o.primary(), r.primary(b"hot"));
        let mut sorted = o.as_slice().to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![10, 20, 30]);
        for n in [10, 20, 30] {
            assert!(r.is_owner(n, b"hot"));
        }
        assert!(!r.is_owner(40, b"hot"));
        // A fourth node joins: the key gains it as an owner, up to the factor.
        assert!(r.add_node(40));
        assert_eq!(r.owners(b"hot").len(), 4);
        assert!(r.is_owner(40, b"hot"));
        // The factor itself is clamped to MAX_REPLICATION.
        assert!(r.set_replication(b"hot", u32::MAX));
        assert_eq!(r.replication(b"hot"), MAX_REPLICATION);
        // Unreplicated keys keep one owner; is_owner agrees with owners() for every node.
        assert!(r.set_replication(b"two", 2));
        for k in keys(300).chain([b"hot".to_vec(), b"two".to_vec()]) {
            let o = r.owners(&k);
            assert_eq!(o.len(), (r.replication(&k) as usize).min(r.len()));
            for n in r.nodes() {
                assert_eq!(r.is_owner(n, &k), o.contains(n), "node {n} key {k:?}");
            }
        }
        let listed: Vec<(Vec<u8>, u32)> = r.replicated().map(|(k, f)| (k.to_vec(), f)).collect();
        assert_eq!(
            listed,
            vec![(b"hot".to_vec(), MAX_REPLICATION), (b"two".to_vec(), 2)]
        );
    }

    #[test]
    fn replication_factor_above_inline_capacity_spills() {
        let nodes: Vec<NodeId> = (0..20).collect();
        let mut r = Ring::with_nodes(8, nodes.iter().copied());
        r.set_replication(b"k", 12);
        let o = r.owners(b"k");
        assert_eq!(o.len(), 12);
        let distinct: BTreeSet<NodeId> = o.iter().collect();
        assert_eq!(distinct.len(), 12);
        assert_eq!(o.primary(), r.primary(b"k"));
        r.set_replication(b"k", 64);
        assert_eq!(r.owners(b"k").len(), 20);
    }

    #[test]
    fn secondaries_follow_the_ring_clockwise() {
        let r = {
            let mut r = Ring::with_nodes(4, [1, 2, 3, 4, 5]);
            r.set_replication(b"x", 3);
            r
        };
        let h = ring_hash(b"x");
        let start = r.points.successor(h).expect("non-empty");
        // Walk the points by hand and collect the first three distinct nodes.
        let mut want = Vec::new();
        for step in 0..r.points.len() {
            let n = r.points.owners[(start + step) % r.points.len()];
            if !want.contains(&n) {
                want.push(n);
            }
            if want.len() == 3 {
                break;
            }
        }
        assert_eq!(r.owners(b"x").as_slice(), &want[..]);
        // The primary's point is the first at or after the key's hash.
        assert!(r.points.hashes[start] >= h || start == 0);
        if start > 0 {
            assert!(r.points.hashes[start - 1] < h);
        }
    }

    #[test]
    fn lookup_wraps_and_hits_points_exactly() {
        let r = Ring::with_nodes(4, [1, 2, 3]);
        let (first, last) = (r.points.hashes[0], *r.points.hashes.last().expect("points"));
        assert_eq!(
            r.primary_for_hash(last.wrapping_add(1)),
            Some(r.points.owners[0])
        );
        assert_eq!(
            r.primary_for_hash(u64::MAX),
            if last == u64::MAX {
                Some(r.points.owners[r.points.len() - 1])
            } else {
                Some(r.points.owners[0])
            }
        );
        assert_eq!(r.primary_for_hash(first), Some(r.points.owners[0]));
        for i in 0..r.points.len() {
            assert_eq!(
                r.primary_for_hash(r.points.hashes[i]),
                Some(r.points.owners[i])
            );
        }
    }

    #[test]
    fn equal_hashes_are_ordered_by_node_id() {
        let mut p = Points {
            hashes: vec![5, 10],
            owners: vec![3, 3],
        };
        // Insert by hand: a node whose points collide with existing ones sorts by node id.
        let mut all: Vec<(u64, NodeId)> = vec![(5, 3), (10, 3), (10, 1), (5, 9)];
        all.sort_unstable();
        let (h, o): (Vec<u64>, Vec<NodeId>) = all.into_iter().unzip();
        assert_eq!(h, vec![5, 5, 10, 10]);
        assert_eq!(o, vec![3, 9, 1, 3]);
        p.hashes = h;
        p.owners = o;
        assert_eq!(p.successor(5), Some(0));
        assert_eq!(p.successor(6), Some(2));
        assert_eq!(p.successor(11), Some(0));
        // The second of two equal points receives an empty arc; the arcs cover the circle exactly.
        assert_eq!(p.arc(1), 0);
        assert_eq!((0..4).map(|i| p.arc(i)).sum::<u128>(), 1u128 << 64);
        let same = Points {
            hashes: vec![7, 7],
            owners: vec![1, 2],
        };
        assert_eq!(same.arc(0), 1u128 << 64);
        assert_eq!(same.arc(1), 0);
    }

    #[test]
    fn incremental_points_equal_a_full_rebuild() {
        let mut r = Ring::new(32);
        for n in [9, 3, 12, 1, 7] {
            r.add_node(n);
        }
        r.remove_node(12);
        r.remove_node(1);
        let set: BTreeSet<NodeId> = [9, 3, 7].into_iter().collect();
        assert!(r.points == Points::build(32, &set));
        assert!(r.points.hashes.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn shares_sum_to_one_and_match_share() {
        let r = Ring::with_nodes(DEFAULT_VNODES, [4, 8, 15, 16, 23, 42]);
        let shares = r.shares();
        let total: f64 = shares.values().sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        for (&n, &s) in &shares {
            assert_eq!(r.share(n), s);
            assert!(s > 0.0);
        }
        assert_eq!(r.share(99), 0.0);
    }

    fn assert_same_answers(a: &Ring, b: &Ring) {
        assert_eq!(a, b);
        assert_eq!(a.epoch(), b.epoch());
        assert_eq!(a.vnodes(), b.vnodes());
        assert_eq!(a.nodes().collect::<Vec<_>>(), b.nodes().collect::<Vec<_>>());
        assert_eq!(
            a.replicated().collect::<Vec<_>>(),
            b.replicated().collect::<Vec<_>>()
        );
        for k in keys(2000).chain([b"hot".to_vec(), b"warm".to_vec()]) {
            assert_eq!(a.primary(&k), b.primary(&k));
            assert_eq!(a.owners(&k), b.owners(&k));
        }
        assert_eq!(a.shares(), b.shares());
    }

    fn sample_ring() -> Ring {
        let mut r = Ring::with_nodes(DEFAULT_VNODES, [3, 1, 4, 15, 9, 26]);
        r.remove_node(4);
        r.set_replication(b"hot", 4);
        r.set_replication(b"warm", 2);
        r.set_epoch_at_least(77);
        r
    }

    #[test]
    fn postcard_round_trip_answers_identically() {
        let r = sample_ring();
        let bytes = postcard::to_stdvec(&r).expect("serialize");
        let back: Ring = postcard::from_bytes(&bytes).expect("deserialize");
        assert_same_answers(&r, &back);
        // The points are not on the wire: the record is small.
        assert!(bytes.len() < 64, "{} bytes", bytes.len());
    }

    #[test]
    fn json_round_trip_answers_identically() {
        let r = sample_ring();
        let text = serde_json::to_string(&r).expect("serialize");
        assert!(!text.contains("points"), "{text}");
        let back: Ring = serde_json::from_str(&text).expect("deserialize");
        assert_same_answers(&r, &back);
    }

    #[derive(Serialize)]
    struct RawRecord {
        epoch: u64,
        vnodes: u32,
        nodes: BTreeSet<NodeId>,
        replication: Vec<(Vec<u8>, u32)>,
    }

    fn decode(raw: &RawRecord) -> Result<Ring, postcard::Error> {
        postcard::from_bytes(&postcard::to_stdvec(raw).expect("serialize"))
    }

    #[test]
    fn bad_records_are_refused() {
        let good = RawRecord {
            epoch: 3,
            vnodes: 8,
            nodes: [1, 2].into_iter().collect(),
            replication: Vec::new(),
        };
        let r = decode(&good).expect("valid record");
        let mut want = Ring::with_nodes(8, [1, 2]);
        want.set_epoch_at_least(3);
        assert_eq!(r, want);

        for vnodes in [0, MAX_VNODES + 1, u32::MAX] {
            assert!(
                decode(&RawRecord {
                    vnodes,
                    ..clone_raw(&good)
                })
                .is_err(),
                "vnodes {vnodes}"
            );
        }
        let many: BTreeSet<NodeId> = (0..(MAX_POINTS / MAX_VNODES as usize) as u32 + 1).collect();
        assert!(
            decode(&RawRecord {
                vnodes: MAX_VNODES,
                nodes: many,
                ..clone_raw(&good)
            })
            .is_err()
        );
        for f in [0, 1, MAX_REPLICATION + 1] {
            let replication = vec![(b"k".to_vec(), f)];
            assert!(
                decode(&RawRecord {
                    replication,
                    ..clone_raw(&good)
                })
                .is_err(),
                "factor {f}"
            );
        }
        let replication = vec![(b"k".to_vec(), 2), (b"j".to_vec(), 3), (b"k".to_vec(), 4)];
        assert!(
            decode(&RawRecord {
                replication,
                ..clone_raw(&good)
            })
            .is_err()
        );
        let replication = vec![(b"k".to_vec(), 2), (b"j".to_vec(), 3)];
        let r = decode(&RawRecord {
            replication,
            ..clone_raw(&good)
        })
        .expect("pairs in any order");
        assert_eq!(
            r.replicated().collect::<Vec<_>>(),
            vec![(&b"j"[..], 3), (&b"k"[..], 2)]
        );
        // Truncated input is an error, not a panic.
        let bytes = postcard::to_stdvec(&sample_ring()).expect("serialize");
        for cut in 0..bytes.len() {
            assert!(
                postcard::from_bytes::<Ring>(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        // The refusal says why.
        let err = Ring::try_from(RingRecord {
            epoch: 0,
            vnodes: 0,
            nodes: BTreeSet::new(),
            replication: Vec::new(),
        });
        assert_eq!(
            err.expect_err("refused").to_string(),
            format!("virtual nodes per node must be in 1..={MAX_VNODES}, got 0")
        );
    }

    fn clone_raw(r: &RawRecord) -> RawRecord {
        RawRecord {
            epoch: r.epoch,
            vnodes: r.vnodes,
            nodes: r.nodes.clone(),
            replication: r.replication.clone(),
        }
    }

    #[test]
    fn ring_hash_is_stable_and_independent_of_the_thread_hash() {
        // Part of the persistent format: these values must never change.
        assert_eq!(ring_hash(b""), 0x4bc0_f8a4_54cc_20d5);
        assert_eq!(ring_hash(b"user1"), 0xd850_8de2_5c7c_93ad);
        assert_eq!(vnode_hash(5, 2), 0x70fa_35aa_15f3_c5e6);
        let r = Ring::with_nodes(DEFAULT_VNODES, [1, 2, 3]);
        let placed: Vec<Option<NodeId>> = keys(8).map(|k| r.primary(&k)).collect();
        assert_eq!(placed, [1, 3, 3, 2, 3, 2, 1, 2].map(Some));
        let seed0 = xxhash_rust::xxh3::xxh3_64(b"user1");
        assert_ne!(ring_hash(b"user1"), seed0);
        assert_eq!(
            ring_hash(b"user1"),
            xxhash_rust::xxh3::xxh3_64_with_seed(b"user1", 0x6469_6e6f_6d6f_5247)
        );
        let mut buf = Vec::new();
        buf.extend_from_slice(&5u32.to_le_bytes());
        buf.extend_from_slice(&2u32.to_le_bytes());
        assert_eq!(
            vnode_hash(5, 2),
            xxhash_rust::xxh3::xxh3_64_with_seed(&buf, RING_HASH_SEED)
        );
        // Low bits of the two hashes (as used to pick a thread) are not correlated: over many keys, the ring
        // position's low bits agree with the thread hash's about as often as chance predicts.
        let n = 4096;
        let same = keys(n)
            .filter(|k| ring_hash(k) & 7 == xxhash_rust::xxh3::xxh3_64(k) & 7)
            .count();
        assert!((n / 8 - 120..n / 8 + 120).contains(&same), "{same}");
    }
}
