//! Persistent hash index (P-CLHT style) in the pool.
