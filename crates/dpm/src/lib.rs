//! dpm
