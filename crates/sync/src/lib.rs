//! Synchronisation pieces shared by the servers' event loops:
//! - [`doorbell`]: the lock-free handshake between a loop that sleeps in `poll` and the threads that post it
//!   work, small enough to model-check: built on `loom`'s atomics under `--cfg dinomo_loom`, which then explores
//!   every interleaving (and every outcome the memory model allows) of its tests;
//! - [`mailbox`]: a loop's mailbox built on it (a channel, the doorbell and a mio waker), which the native and the
//!   RESP servers both use (left out of the loom build);
//! - [`rendezvous`]: where the parts of a KV node's transaction meet, one per worker, before any of them runs
//!   (model-checked with loom too).

pub mod doorbell;
#[cfg(not(dinomo_loom))]
pub mod mailbox;
pub mod rendezvous;

pub use doorbell::Doorbell;
#[cfg(not(dinomo_loom))]
pub use mailbox::{Inbox, Mailbox};
pub use rendezvous::{Parted, Rendezvous};
