//! Synchronisation pieces shared by the servers, small enough to model-check: built on `loom`'s atomics under
//! `--cfg dinomo_loom`, which then explores every interleaving (and every outcome the memory model allows) of
//! the tests in [`doorbell`].

pub mod doorbell;

pub use doorbell::Doorbell;
