//! Linearizability checking of recorded key-value histories (Wing-Gong search with per-key partitioning).
