//! Least-frequently-used order over adaptive shortcut entries: an indexed binary min-heap.
//!
//! Entries are ordered by `(hits, tick)`: fewest accesses first and, among equal counts,
//! least recently touched first (`tick` is unique, so the order is total and deterministic).
//! Every node in the heap records its position in [`Node::heap_pos`], so removing or
//! re-keying an arbitrary entry costs O(log n) and never allocates.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::node::{NIL, Node};

/// One heap slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub tick: u64,
    pub hits: u32,
    pub node: u32,
}

impl Item {
    #[inline]
    fn key(&self) -> (u32, u64) {
        (self.hits, self.tick)
    }

    #[inline]
    fn before(&self, other: &Item) -> bool {
        self.key() < other.key()
    }
}

/// A heap position ordered by the key of the item it holds, for ascending walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    hits: u32,
    tick: u64,
    pos: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.hits, self.tick).cmp(&(other.hits, other.tick))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Reusable space for [`Lfu::ascending`].
pub(crate) type Frontier = BinaryHeap<Reverse<Candidate>>;

#[derive(Debug, Default)]
pub(crate) struct Lfu {
    items: Vec<Item>,
}

impl Lfu {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    #[cfg(test)]
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// Renames every node through `map` (positions are unchanged) and releases spare
    /// capacity.
    pub fn renumber(&mut self, map: impl Fn(u32) -> u32) {
        for item in &mut self.items {
            item.node = map(item.node);
        }
        self.items.shrink_to_fit();
    }

    /// The least frequently used entry.
    #[inline]
    pub fn min(&self) -> Option<Item> {
        self.items.first().copied()
    }

    pub fn push(&mut self, nodes: &mut [Node], node: u32, hits: u32, tick: u64) {
        crate::grow_for_push(&mut self.items);
        let pos = self.items.len();
        self.items.push(Item { tick, hits, node });
        nodes[node as usize].heap_pos = pos as u32;
        self.sift_up(nodes, pos);
    }

    pub fn remove(&mut self, nodes: &mut [Node], node: u32) {
        let pos = nodes[node as usize].heap_pos as usize;
        debug_assert_eq!(self.items[pos].node, node);
        nodes[node as usize].heap_pos = NIL;
        let last = self.items.pop().expect("node is in the heap");
        if pos < self.items.len() {
            self.items[pos] = last;
            nodes[last.node as usize].heap_pos = pos as u32;
            self.sift_up(nodes, pos);
            self.sift_down(nodes, pos);
        }
    }

    /// Re-keys `node` after an access; the new key must not be smaller than the old one.
    #[inline]
    pub fn touch(&mut self, nodes: &mut [Node], node: u32, hits: u32, tick: u64) {
        let pos = nodes[node as usize].heap_pos as usize;
        let item = &mut self.items[pos];
        debug_assert_eq!(item.node, node);
        debug_assert!((hits, tick) >= item.key());
        item.hits = hits;
        item.tick = tick;
        self.sift_down(nodes, pos);
    }

    /// Calls `visit` on entries in ascending `(hits, tick)` order until it returns `false`
    /// or the heap is exhausted, without changing the heap. Visiting `k` entries costs
    /// O(k log k); `frontier` is scratch space kept by the caller so that a warm call does
    /// not allocate.
    pub fn ascending(&self, frontier: &mut Frontier, mut visit: impl FnMut(Item) -> bool) {
        frontier.clear();
        let candidate = |pos: usize| {
            let it = &self.items[pos];
            Reverse(Candidate {
                hits: it.hits,
                tick: it.tick,
                pos: pos as u32,
            })
        };
        if !self.items.is_empty() {
            frontier.push(candidate(0));
        }
        while let Some(Reverse(next)) = frontier.pop() {
            let pos = next.pos as usize;
            if !visit(self.items[pos]) {
                break;
            }
            for child in [2 * pos + 1, 2 * pos + 2] {
                if child < self.items.len() {
                    frontier.push(candidate(child));
                }
            }
        }
        frontier.clear();
    }

    fn sift_up(&mut self, nodes: &mut [Node], mut pos: usize) {
        let item = self.items[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            let above = self.items[parent];
            if !item.before(&above) {
                break;
            }
            self.items[pos] = above;
            nodes[above.node as usize].heap_pos = pos as u32;
            pos = parent;
        }
        self.items[pos] = item;
        nodes[item.node as usize].heap_pos = pos as u32;
    }

    fn sift_down(&mut self, nodes: &mut [Node], mut pos: usize) {
        let len = self.items.len();
        let item = self.items[pos];
        loop {
            let left = 2 * pos + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.items[right].before(&self.items[left]) {
                right
            } else {
                left
            };
            let below = self.items[child];
            if !below.before(&item) {
                break;
            }
            self.items[pos] = below;
            nodes[below.node as usize].heap_pos = pos as u32;
            pos = child;
        }
        self.items[pos] = item;
        nodes[item.node as usize].heap_pos = pos as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Node> {
        (0..n).map(|_| Node::free(NIL)).collect()
    }

    fn drain(lfu: &mut Lfu, nodes: &mut [Node]) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(min) = lfu.min() {
            lfu.remove(nodes, min.node);
            out.push(min.node);
        }
        out
    }

    #[test]
    fn orders_by_hits_then_tick_through_touch_and_remove() {
        let mut ns = nodes(6);
        let mut lfu = Lfu::default();
        // node, hits, tick
        for (node, hits, tick) in [
            (0, 5, 1),
            (1, 1, 2),
            (2, 3, 3),
            (3, 1, 4),
            (4, 9, 5),
            (5, 2, 6),
        ] {
            lfu.push(&mut ns, node, hits, tick);
        }
        lfu.touch(&mut ns, 1, 4, 7); // 1 now (4, 7)
        lfu.remove(&mut ns, 2);
        let mut seen = Vec::new();
        let mut frontier = Frontier::new();
        lfu.ascending(&mut frontier, |it| {
            seen.push(it.node);
            true
        });
        assert_eq!(seen, vec![3, 5, 1, 0, 4]);
        let mut first_two = Vec::new();
        lfu.ascending(&mut frontier, |it| {
            first_two.push(it.node);
            first_two.len() < 2
        });
        assert_eq!(first_two, vec![3, 5]);
        assert_eq!(lfu.len(), 5);
        assert_eq!(drain(&mut lfu, &mut ns), vec![3, 5, 1, 0, 4]);
        assert!(ns.iter().all(|n| n.heap_pos == NIL));
    }

    #[test]
    fn ascending_matches_sorted_order_for_many_keys() {
        let n = 300u32;
        let mut ns = nodes(n as usize);
        let mut lfu = Lfu::default();
        let mut expected = Vec::new();
        for node in 0..n {
            let hits = (node * 7919) % 13;
            lfu.push(&mut ns, node, hits, u64::from(node));
            expected.push((hits, u64::from(node), node));
        }
        for node in (0..n).step_by(3) {
            lfu.remove(&mut ns, node);
            expected.retain(|e| e.2 != node);
        }
        expected.sort();
        let mut seen = Vec::new();
        lfu.ascending(&mut Frontier::new(), |it| {
            seen.push(it.node);
            true
        });
        let want: Vec<u32> = expected.iter().map(|e| e.2).collect();
        assert_eq!(seen, want);
        assert_eq!(drain(&mut lfu, &mut ns), want);
    }
}
