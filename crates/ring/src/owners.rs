//! [`Owners`]: the owners of one key, primary first, kept on the stack for small replication factors.

use crate::NodeId;

/// How many owners an [`Owners`] holds without touching the heap. Replication factors above this are allowed (up to
/// [`crate::MAX_REPLICATION`]) and spill to a `Vec`; hot keys in practice get a handful of owners.
pub const OWNERS_INLINE: usize = 8;

/// Owners of one key: the primary first, then the secondaries (distinct nodes, in clockwise order on the ring).
///
/// Up to [`OWNERS_INLINE`] owners live inline, so computing the owners of a key does not allocate in the common case.
#[derive(Clone)]
pub struct Owners {
    len: usize,
    inline: [NodeId; OWNERS_INLINE],
    /// All owners once there are more than [`OWNERS_INLINE`]; empty (and unallocated) before that.
    spill: Vec<NodeId>,
}

impl Owners {
    /// No owners (the answer of an empty ring).
    pub const fn new() -> Owners {
        Owners {
            len: 0,
            inline: [0; OWNERS_INLINE],
            spill: Vec::new(),
        }
    }

    /// Appends `node`; the caller keeps the entries distinct.
    pub(crate) fn push(&mut self, node: NodeId) {
        if self.len < OWNERS_INLINE {
            self.inline[self.len] = node;
        } else {
            if self.len == OWNERS_INLINE {
                self.spill.reserve(OWNERS_INLINE * 2);
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(node);
        }
        self.len += 1;
    }

    /// The primary owner, `None` only when there are no owners (empty ring).
    #[inline]
    pub fn primary(&self) -> Option<NodeId> {
        self.as_slice().first().copied()
    }

    /// The secondary owners (every owner but the primary), in clockwise order.
    #[inline]
    pub fn secondaries(&self) -> &[NodeId] {
        self.as_slice().get(1..).unwrap_or(&[])
    }

    /// The owners, primary first.
    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        self.as_slice().iter().copied()
    }

    /// The number of owners.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no owners (empty ring).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `node` is one of the owners (primary or secondary).
    #[inline]
    pub fn contains(&self, node: NodeId) -> bool {
        self.as_slice().contains(&node)
    }

    /// The owners as a slice, primary first.
    #[inline]
    pub fn as_slice(&self) -> &[NodeId] {
        if self.len <= OWNERS_INLINE {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl Default for Owners {
    fn default() -> Owners {
        Owners::new()
    }
}

impl PartialEq for Owners {
    fn eq(&self, other: &Owners) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Owners {}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl AsRef<[NodeId]> for Owners {
    fn as_ref(&self) -> &[NodeId] {
        self.as_slice()
    }
}

impl<'a> IntoIterator for &'a Owners {
    type Item = NodeId;
    type IntoIter = std::iter::Copied<std::slice::Iter<'a, NodeId>>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_then_spill_keeps_order() {
        let mut o = Owners::new();
        assert!(o.is_empty());
        assert_eq!(o.primary(), None);
        assert_eq!(o.secondaries(), &[] as &[NodeId]);
        for n in 0..20u32 {
            o.push(100 + n);
            assert_eq!(o.len(), n as usize + 1);
            let want: Vec<NodeId> = (0..=n).map(|i| 100 + i).collect();
            assert_eq!(o.as_slice(), &want[..]);
            assert_eq!(o.iter().collect::<Vec<_>>(), want);
            assert_eq!((&o).into_iter().collect::<Vec<_>>(), want);
            assert_eq!(o.primary(), Some(100));
            assert_eq!(o.secondaries(), &want[1..]);
            assert!(o.contains(100 + n));
            assert!(!o.contains(100 + n + 1));
        }
    }

    #[test]
    fn equality_is_by_content() {
        let mut a = Owners::new();
        let mut b = Owners::new();
        for n in [3, 1, 2] {
            a.push(n);
            b.push(n);
        }
        assert_eq!(a, b);
        b.push(9);
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "[3, 1, 2]");
    }
}
