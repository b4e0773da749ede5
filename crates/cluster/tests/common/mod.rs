//! What the cluster tests share.

use std::time::Duration;

use dinomo_cluster::{LocalClusterConfig, MNodeConfig, NodeConfig};
use dinomo_dpm::ProcessorConfig;
use dinomo_kn::KnConfig;

/// A small in-process cluster with short leases, so failures are noticed within about 300 ms (with room for heartbeats delayed by a loaded machine).
pub fn small_cluster(kns: usize) -> LocalClusterConfig {
    LocalClusterConfig {
        pool_size: 256 << 20,
        processor: ProcessorConfig {
            merge_threads: 2,
            segment_size: 1 << 20,
            ..ProcessorConfig::default()
        },
        kns,
        node: NodeConfig {
            kn: KnConfig {
                threads: 2,
                max_value_len: 64 << 10,
                ..KnConfig::default()
            },
            lease_ttl: Duration::from_millis(300),
            heartbeat: Duration::from_millis(20),
            ..NodeConfig::default()
        },
        mnode: MNodeConfig {
            lease_ttl: Duration::from_secs(1),
            ..MNodeConfig::default()
        },
        ..LocalClusterConfig::default()
    }
}

/// Checks a recorded history; one that is not linearizable is saved to the temporary directory as `file` (to
/// replay it) and the test fails with the checker's explanation.
#[allow(dead_code)] // Not every test file records histories.
pub fn assert_linearizable(history: &dinomo_lincheck::History, file: &str) -> anyhow::Result<()> {
    use dinomo_lincheck::{CheckConfig, Verdict, check};
    match check(history, &CheckConfig::default())? {
        Verdict::Linearizable => Ok(()),
        other => {
            let path = std::env::temp_dir().join(file);
            let _ = history.save(&path);
            panic!("{other:?} (history saved to {})", path.display());
        }
    }
}

/// One request on a session of its own with the node at `addr` (greeted with `token`), and its reply: for the
/// requests the client does not make itself (statistics, routing, a raw data request).
#[allow(dead_code)] // Not every test file sends raw requests.
pub fn raw_call(
    addr: &str,
    token: &str,
    body: dinomo_cluster::wire::RequestBody,
) -> anyhow::Result<dinomo_cluster::wire::ResponseBody> {
    use dinomo_cluster::wire::{Request, Response, read_frame, write_frame};
    use std::io::Write;
    let mut s = dinomo_cluster::open_session(addr, Duration::from_secs(5), token)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    write_frame(&mut s, &Request { id: 7, body }, &mut buf)?;
    s.flush()?;
    let r: Response = read_frame(&mut s, &mut buf, 64 << 20)?;
    anyhow::ensure!(r.id == 7, "a reply to request {} instead of 7", r.id);
    Ok(r.body)
}

/// What a [`HookedMeta`] does in place of forwarding a call (a test's fault); the defaults forward.
#[allow(dead_code)] // Not every test file hooks the store.
pub trait MetaHooks: Send + Sync {
    fn store(
        &self,
        inner: &dyn dinomo_meta::MetaStore,
        expected: Option<u64>,
        value: &[u8],
    ) -> Result<u64, dinomo_meta::MetaError> {
        inner.store(expected, value)
    }

    fn keep_alive(
        &self,
        inner: &dyn dinomo_meta::MetaStore,
        lease: dinomo_meta::LeaseId,
    ) -> Result<(), dinomo_meta::MetaError> {
        inner.keep_alive(lease)
    }
}

/// A metadata store that forwards every call to `inner`, except where its hooks step in. It derefs to the hooks,
/// so a test controls the fault through it.
#[allow(dead_code)] // Not every test file hooks the store.
pub struct HookedMeta<H> {
    pub inner: std::sync::Arc<dyn dinomo_meta::MetaStore>,
    pub hooks: H,
}

impl<H> std::ops::Deref for HookedMeta<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hooks
    }
}

impl<H: MetaHooks> dinomo_meta::MetaStore for HookedMeta<H> {
    fn load(&self) -> Result<Option<dinomo_meta::Versioned>, dinomo_meta::MetaError> {
        self.inner.load()
    }
    fn store(&self, expected: Option<u64>, value: &[u8]) -> Result<u64, dinomo_meta::MetaError> {
        self.hooks.store(&*self.inner, expected, value)
    }
    fn grant(&self, ttl: Duration) -> Result<dinomo_meta::LeaseId, dinomo_meta::MetaError> {
        self.inner.grant(ttl)
    }
    fn keep_alive(&self, lease: dinomo_meta::LeaseId) -> Result<(), dinomo_meta::MetaError> {
        self.hooks.keep_alive(&*self.inner, lease)
    }
    fn revoke(&self, lease: dinomo_meta::LeaseId) -> Result<(), dinomo_meta::MetaError> {
        self.inner.revoke(lease)
    }
    fn register(
        &self,
        member: &str,
        info: &[u8],
        lease: dinomo_meta::LeaseId,
    ) -> Result<(), dinomo_meta::MetaError> {
        self.inner.register(member, info, lease)
    }
    fn members(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, dinomo_meta::MetaError> {
        self.inner.members(prefix)
    }
    fn try_lead(
        &self,
        election: &str,
        candidate: &str,
        lease: dinomo_meta::LeaseId,
    ) -> Result<bool, dinomo_meta::MetaError> {
        self.inner.try_lead(election, candidate, lease)
    }
    fn leader(&self, election: &str) -> Result<Option<String>, dinomo_meta::MetaError> {
        self.inner.leader(election)
    }
}
