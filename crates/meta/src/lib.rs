//! Cluster metadata store: the cluster record, liveness leases and M-node election; embedded (served by the memory
//! node, persisted in the pool) or etcd.
//!
//! The management node (M-node) keeps the **cluster record** (the ring with its epoch, membership, replication
//! factors, policy settings; opaque bytes here) in a [`MetaStore`] with compare-and-set versions. KV nodes hold
//! **leases** that they keep alive with heartbeats; a KV node whose lease expires is considered failed and its
//! registration ([`MetaStore::register`]) vanishes. Several M-node processes may run; exactly one is **leader** of
//! an election ([`MetaStore::try_lead`]), and a standby takes over when the leader's lease ends.
//!
//! Three implementations:
//! - [`EmbeddedMeta`]: the default, hosted by the memory node. The record lives crash-safely in the pool (root slot
//!   [`CLUSTER_META_ROOT`]); leases, members and elections are soft state in DRAM that nodes re-register after a
//!   memory-node restart.
//! - [`RemoteMeta`]: the same store reached over the fabric; the memory node answers with a [`MetaService`]
//!   (RPC methods [`META_METHODS`]).
//! - `EtcdMeta` (cargo feature `etcd`): an etcd cluster.

mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod local_etcd;
mod record;
mod remote;
mod service;
mod soft;

use std::time::Duration;

pub use embedded::EmbeddedMeta;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdMeta};
#[cfg(feature = "etcd")]
pub use local_etcd::{ETCD_BINARY, LocalEtcd};
pub use remote::RemoteMeta;
pub use service::{
    DEFAULT_DEDUP_WINDOW, META_GRANT, META_KEEP_ALIVE, META_LEADER, META_LOAD, META_MEMBERS,
    META_METHODS, META_REGISTER, META_REVOKE, META_STORE, META_TRY_LEAD, MetaService,
};

/// Pool root slot holding the offset of the cluster record's header (0 before the first store).
pub const CLUSTER_META_ROOT: usize = 3;

/// Pool allocation tag of the cluster record's header and blobs, so they are found again after a crash.
pub const CLUSTER_META_TAG: u16 = 0x30;

/// Identifies a lease. Never 0.
pub type LeaseId = u64;

/// A value with the version it was stored under.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Versioned {
    /// Version of the value; every successful store gives a strictly larger one.
    pub version: u64,
    /// The value.
    pub value: Vec<u8>,
}

/// What a metadata operation can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum MetaError {
    /// A compare-and-set lost: the record is not at the expected version.
    #[error("cluster record changed concurrently: current version is {current:?}")]
    Conflict {
        /// The record's version now (`None`: there is no record).
        current: Option<u64>,
    },
    /// The lease expired or was revoked (or never existed); it never comes back.
    #[error("lease {0:#x} has expired or was revoked")]
    LeaseExpired(LeaseId),
    /// The store cannot be reached or cannot take the operation now; retrying later may succeed.
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    /// The stored metadata is damaged.
    #[error("metadata store is corrupt: {0}")]
    Corrupt(String),
    /// A bad argument: too large, a bad name, a zero TTL, a limit reached.
    #[error("invalid metadata request: {0}")]
    Invalid(String),
}

/// The metadata store of a cluster. All methods are synchronous and safe to call from many threads.
pub trait MetaStore: Send + Sync {
    /// The cluster record and its version, or `None` before the first store.
    fn load(&self) -> Result<Option<Versioned>, MetaError>;

    /// Writes `value` only if the record's current version is `expected` (`None`: no record yet); returns the new
    /// version, strictly larger than every earlier one. Fails with [`MetaError::Conflict`] otherwise, changing
    /// nothing.
    fn store(&self, expected: Option<u64>, value: &[u8]) -> Result<u64, MetaError>;

    /// A lease that expires unless kept alive within `ttl` (stores may round `ttl` up to their granularity).
    fn grant(&self, ttl: Duration) -> Result<LeaseId, MetaError>;

    /// Restarts the lease's `ttl`. [`MetaError::LeaseExpired`] once it has expired: it never comes back.
    fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError>;

    /// Ends the lease now, with everything attached to it. [`MetaError::LeaseExpired`] if it had already ended.
    fn revoke(&self, lease: LeaseId) -> Result<(), MetaError>;

    /// Publishes `member` (a name such as `"kn/3"`) with `info` while `lease` lives; re-registering replaces the
    /// info (and the lease it is attached to).
    fn register(&self, member: &str, info: &[u8], lease: LeaseId) -> Result<(), MetaError>;

    /// Live members whose name starts with `prefix`, sorted by name.
    fn members(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError>;

    /// Becomes leader of `election` as `candidate` if nobody (alive) leads it; true if `candidate` leads it now.
    /// Leadership ends when the lease it was won with expires or is revoked. Fails with
    /// [`MetaError::LeaseExpired`] when `lease` is not alive.
    fn try_lead(&self, election: &str, candidate: &str, lease: LeaseId) -> Result<bool, MetaError>;

    /// The current (alive) leader of `election`.
    fn leader(&self, election: &str) -> Result<Option<String>, MetaError>;
}

/// Limits of a metadata store. Requests beyond them fail with [`MetaError::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetaConfig {
    /// Largest cluster record, in bytes. Default 16 MiB.
    pub max_record_len: usize,
    /// Largest member info, in bytes. Default 64 KiB.
    pub max_info_len: usize,
    /// Longest member, election or candidate name (and member prefix), in bytes. Default 256.
    pub max_name_len: usize,
    /// Live leases at once. Default 65 536.
    pub max_leases: usize,
    /// Registered members at once. Default 65 536.
    pub max_members: usize,
    /// Elections with a leader at once. Default 1024.
    pub max_elections: usize,
    /// Longest lease TTL. Default 1 hour.
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            max_record_len: 16 << 20,
            max_info_len: 64 << 10,
            max_name_len: 256,
            max_leases: 65_536,
            max_members: 65_536,
            max_elections: 1024,
            max_ttl: Duration::from_secs(3600),
        }
    }
}

impl MetaConfig {
    /// Checks a member, election or candidate name: not empty, at most `max_name_len` bytes, no control characters
    /// (names become keys and log fields).
    pub fn check_name(&self, what: &str, name: &str) -> Result<(), MetaError> {
        if name.is_empty() {
            return Err(MetaError::Invalid(format!("{what} name is empty")));
        }
        self.check_prefix(what, name)
    }

    /// Checks a name prefix: like [`MetaConfig::check_name`] but may be empty.
    pub fn check_prefix(&self, what: &str, name: &str) -> Result<(), MetaError> {
        if name.len() > self.max_name_len {
            return Err(MetaError::Invalid(format!(
                "{what} name of {} bytes exceeds the limit of {}",
                name.len(),
                self.max_name_len
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(MetaError::Invalid(format!(
                "{what} name {name:?} contains control characters"
            )));
        }
        Ok(())
    }

    /// Checks the size of a cluster record.
    pub fn check_record(&self, len: usize) -> Result<(), MetaError> {
        if len > self.max_record_len {
            return Err(MetaError::Invalid(format!(
                "cluster record of {len} bytes exceeds the limit of {} bytes",
                self.max_record_len
            )));
        }
        Ok(())
    }

    /// Checks the size of a member's info.
    pub fn check_info(&self, len: usize) -> Result<(), MetaError> {
        if len > self.max_info_len {
            return Err(MetaError::Invalid(format!(
                "member info of {len} bytes exceeds the limit of {} bytes",
                self.max_info_len
            )));
        }
        Ok(())
    }

    /// Checks a lease TTL: positive and at most `max_ttl`.
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), MetaError> {
        if ttl.is_zero() {
            return Err(MetaError::Invalid("lease TTL is zero".into()));
        }
        if ttl > self.max_ttl {
            return Err(MetaError::Invalid(format!(
                "lease TTL {ttl:?} exceeds the limit of {:?}",
                self.max_ttl
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        let c = MetaConfig {
            max_name_len: 8,
            ..MetaConfig::default()
        };
        assert!(c.check_name("member", "kn/3").is_ok());
        assert!(matches!(
            c.check_name("member", ""),
            Err(MetaError::Invalid(_))
        ));
        assert!(c.check_prefix("member", "").is_ok());
        assert!(matches!(
            c.check_name("member", "123456789"),
            Err(MetaError::Invalid(_))
        ));
        assert!(matches!(
            c.check_name("member", "a\nb"),
            Err(MetaError::Invalid(_))
        ));
        assert!(matches!(
            c.check_ttl(Duration::ZERO),
            Err(MetaError::Invalid(_))
        ));
        assert!(c.check_ttl(Duration::from_millis(1)).is_ok());
        assert!(matches!(
            c.check_ttl(Duration::from_secs(3601)),
            Err(MetaError::Invalid(_))
        ));
        assert!(c.check_record(16 << 20).is_ok());
        assert!(c.check_record((16 << 20) + 1).is_err());
    }

    #[test]
    fn errors_round_trip_through_the_wire_codec() {
        for e in [
            MetaError::Conflict { current: Some(7) },
            MetaError::Conflict { current: None },
            MetaError::LeaseExpired(42),
            MetaError::Unavailable("x".into()),
            MetaError::Corrupt("y".into()),
            MetaError::Invalid("z".into()),
        ] {
            let mut buf = Vec::new();
            dinomo_fabric::encode(&e, &mut buf).unwrap();
            let back: MetaError = dinomo_fabric::decode(&buf).unwrap();
            assert_eq!(back, e);
        }
    }
}
