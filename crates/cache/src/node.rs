//! Cache entries kept in a slab, and intrusive recency lists over them.

use crate::Shortcut;

/// Index of no node (end of a list, empty free list).
pub(crate) const NIL: u32 = u32::MAX;

/// What a slab slot currently holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An unused slot, chained into the free list through `next`.
    Free,
    /// In the key table but in no list and charged nothing (being re-placed).
    Detached,
    /// A value entry, in the value recency list.
    Value,
    /// A shortcut entry, in the frequency heap (adaptive) or shortcut recency list (static).
    Shortcut,
}

/// One cache entry. Its key and (for value entries) its value share one exact-size heap
/// allocation, so an entry costs one allocation whatever its kind.
#[derive(Debug)]
pub(crate) struct Node {
    /// The key, followed by the value for value entries.
    pub buf: Box<[u8]>,
    pub shortcut: Shortcut,
    /// Access count: lookups that found the key, fills and writes. Saturates.
    pub hits: u32,
    pub key_len: u32,
    /// Recency-list links (toward the most recently used end and the other way).
    pub prev: u32,
    pub next: u32,
    /// Position in the frequency heap while this is an adaptive shortcut entry.
    pub heap_pos: u32,
    pub kind: Kind,
    /// A value entry recording that the key has no value (see [`crate::Dac::fill_absent`]); its value is empty.
    pub absent: bool,
}

impl Node {
    pub fn free(next: u32) -> Node {
        Node {
            buf: Box::default(),
            shortcut: Shortcut { ptr: 0, seq: 0 },
            hits: 0,
            key_len: 0,
            prev: NIL,
            next,
            heap_pos: NIL,
            kind: Kind::Free,
            absent: false,
        }
    }

    #[inline]
    pub fn key(&self) -> &[u8] {
        &self.buf[..self.key_len as usize]
    }

    #[inline]
    pub fn value(&self) -> &[u8] {
        &self.buf[self.key_len as usize..]
    }

    /// Makes the buffer hold the key followed by `value`, reusing it when the length matches.
    pub fn set_value(&mut self, value: &[u8]) {
        let key_len = self.key_len as usize;
        if self.buf.len() == key_len + value.len() {
            self.buf[key_len..].copy_from_slice(value);
        } else {
            let mut buf = Vec::with_capacity(key_len + value.len());
            buf.extend_from_slice(self.key());
            buf.extend_from_slice(value);
            self.buf = buf.into_boxed_slice();
        }
    }

    /// Makes the buffer hold only the key, releasing the memory of a value.
    pub fn drop_value(&mut self) {
        if self.buf.len() != self.key_len as usize {
            self.buf = Box::from(self.key());
        }
    }
}

/// An intrusive doubly-linked list through [`Node::prev`] and [`Node::next`]; the head is
/// the most recently used entry, the tail the least recently used.
#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    pub head: u32,
    pub tail: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
        }
    }
}

impl List {
    pub fn push_front(&mut self, nodes: &mut [Node], id: u32) {
        let old = self.head;
        {
            let n = &mut nodes[id as usize];
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail = id;
        } else {
            nodes[old as usize].prev = id;
        }
        self.head = id;
    }

    pub fn unlink(&mut self, nodes: &mut [Node], id: u32) {
        let (prev, next) = {
            let n = &mut nodes[id as usize];
            let links = (n.prev, n.next);
            n.prev = NIL;
            n.next = NIL;
            links
        };
        if prev == NIL {
            self.head = next;
        } else {
            nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            nodes[next as usize].prev = prev;
        }
    }

    #[inline]
    pub fn move_to_front(&mut self, nodes: &mut [Node], id: u32) {
        if self.head != id {
            self.unlink(nodes, id);
            self.push_front(nodes, id);
        }
    }

    /// The least recently used entry.
    #[inline]
    pub fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }
}
