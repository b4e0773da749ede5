//! Disaggregated Adaptive Caching.
