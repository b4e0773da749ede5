//! CentralDS (pDPM §4.3).
