//! Consistent hashing with virtual nodes: which KV node owns a key, versioned by epoch, with replication metadata.
