//! kn
