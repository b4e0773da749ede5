//! The behaviour every `MetaStore` must show, as one function over `&dyn MetaStore`, run against each
//! implementation by the test files that include this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dinomo_meta::{MetaError, MetaStore, Versioned};

/// How a store is exercised.
#[derive(Debug, Clone)]
pub struct Params {
    /// Record size limit the store was configured with.
    pub max_record_len: usize,
    /// Member info size limit the store was configured with.
    pub max_info_len: usize,
    /// TTL of leases that are meant to expire during the test.
    pub short_ttl: Duration,
    /// TTL of leases kept alive across a short lease's expiry (several times `short_ttl`).
    pub long_ttl: Duration,
    /// Longest wait for an expiry the store should have noticed.
    pub expiry_bound: Duration,
}

impl Params {
    /// For stores with exact, in-memory expiry.
    pub fn embedded(max_record_len: usize) -> Params {
        Params {
            max_record_len,
            max_info_len: dinomo_meta::MetaConfig::default().max_info_len,
            short_ttl: Duration::from_millis(200),
            long_ttl: Duration::from_secs(1),
            expiry_bound: Duration::from_secs(5),
        }
    }
}

/// Runs every check; the store must be fresh (no record, no members, no leaders).
pub fn conformance(store: &dyn MetaStore, p: &Params) -> Result<()> {
    record_cas(store, p).context("record compare-and-set")?;
    leases_and_members(store, p).context("leases and members")?;
    election(store, p).context("election")?;
    Ok(())
}

fn conflict(r: Result<u64, MetaError>) -> Result<Option<u64>> {
    match r {
        Err(MetaError::Conflict { current }) => Ok(current),
        other => bail!("expected a conflict, got {other:?}"),
    }
}

pub fn record_cas(s: &dyn MetaStore, p: &Params) -> Result<()> {
    ensure!(s.load()?.is_none(), "a fresh store has no record");
    ensure!(conflict(s.store(Some(1), b"x"))? == None);
    ensure!(conflict(s.store(Some(0), b"x"))? == None);
    ensure!(s.load()?.is_none(), "a lost CAS wrote nothing");
    let v1 = s.store(None, b"first")?;
    ensure!(
        s.load()?
            == Some(Versioned {
                version: v1,
                value: b"first".to_vec()
            })
    );
    ensure!(conflict(s.store(None, b"again"))? == Some(v1));
    ensure!(conflict(s.store(Some(v1 + 1000), b"x"))? == Some(v1));
    ensure!(conflict(s.store(Some(0), b"x"))? == Some(v1));
    let v2 = s.store(Some(v1), b"second")?;
    ensure!(v2 > v1, "versions increase: {v1} then {v2}");
    ensure!(conflict(s.store(Some(v1), b"stale"))? == Some(v2));
    ensure!(s.load()?.map(|v| (v.version, v.value)) == Some((v2, b"second".to_vec())));
    // Empty and maximal records are records too.
    let v3 = s.store(Some(v2), b"")?;
    ensure!(v3 > v2);
    ensure!(
        s.load()?
            == Some(Versioned {
                version: v3,
                value: Vec::new()
            })
    );
    let big: Vec<u8> = (0..p.max_record_len).map(|i| (i * 7 % 251) as u8).collect();
    let v4 = s.store(Some(v3), &big)?;
    ensure!(v4 > v3);
    ensure!(s.load()?.map(|v| v.value) == Some(big.clone()));
    // One byte over the limit: refused, nothing changed.
    let over = vec![1u8; p.max_record_len + 1];
    match s.store(Some(v4), &over) {
        Err(MetaError::Invalid(_)) => {}
        other => bail!("oversized record: expected Invalid, got {other:?}"),
    }
    ensure!(
        s.load()?
            == Some(Versioned {
                version: v4,
                value: big
            }),
        "an oversized store changed the record"
    );
    let mut last = v4;
    for i in 0..5u32 {
        let v = s.store(Some(last), &i.to_le_bytes())?;
        ensure!(v > last, "versions strictly increase: {last} then {v}");
        last = v;
    }
    ensure!(s.load()?.map(|v| (v.version, v.value)) == Some((last, 4u32.to_le_bytes().to_vec())));
    Ok(())
}

fn names(v: &[(String, Vec<u8>)]) -> Vec<&str> {
    v.iter().map(|(n, _)| n.as_str()).collect()
}

fn expired<T: std::fmt::Debug>(r: Result<T, MetaError>, lease: u64) -> Result<()> {
    match r {
        Err(MetaError::LeaseExpired(id)) if id == lease => Ok(()),
        other => bail!("expected LeaseExpired({lease}), got {other:?}"),
    }
}

fn invalid<T: std::fmt::Debug>(r: Result<T, MetaError>) -> Result<()> {
    match r {
        Err(MetaError::Invalid(_)) => Ok(()),
        other => bail!("expected Invalid, got {other:?}"),
    }
}

/// Polls `done` until it holds, keeping `alive` leases alive meanwhile; fails after `bound`.
fn wait_until(
    s: &dyn MetaStore,
    p: &Params,
    alive: &[u64],
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let step = (p.short_ttl / 6).min(Duration::from_millis(250));
    while !done()? {
        if start.elapsed() > p.expiry_bound {
            bail!("{what}: not after {:?}", p.expiry_bound);
        }
        for &l in alive {
            s.keep_alive(l)
                .with_context(|| format!("keeping lease {l} alive"))?;
        }
        std::thread::sleep(step);
    }
    Ok(())
}

pub fn leases_and_members(s: &dyn MetaStore, p: &Params) -> Result<()> {
    invalid(s.grant(Duration::ZERO))?;
    let granted = Instant::now();
    let short = s.grant(p.short_ttl)?;
    let long = s.grant(p.long_ttl)?;
    ensure!(short != long && short != 0 && long != 0);
    s.register("kn/2", b"two", long)?;
    s.register("kn/1", b"one", short)?;
    s.register("mn/1", b"m", long)?;
    let kn = s.members("kn/")?;
    ensure!(
        kn == vec![
            ("kn/1".to_string(), b"one".to_vec()),
            ("kn/2".to_string(), b"two".to_vec())
        ],
        "members by prefix, sorted: {kn:?}"
    );
    ensure!(names(&s.members("")?) == ["kn/1", "kn/2", "mn/1"]);
    ensure!(s.members("zz")?.is_empty());
    // Re-registering replaces the info.
    s.register("kn/2", b"TWO", long)?;
    ensure!(s.members("kn/2")? == vec![("kn/2".to_string(), b"TWO".to_vec())]);
    invalid(s.register("", b"x", long))?;
    invalid(s.register("kn/3", &vec![0u8; p.max_info_len + 1], long))?;
    // The short lease expires and takes its member with it; the kept-alive one keeps its members.
    wait_until(s, p, &[long], "short lease expiry", || {
        Ok(!names(&s.members("kn/")?).contains(&"kn/1"))
    })?;
    ensure!(names(&s.members("")?) == ["kn/2", "mn/1"]);
    expired(s.keep_alive(short), short)?;
    expired(s.register("kn/1", b"back", short), short)?;
    ensure!(
        names(&s.members("kn/")?) == ["kn/2"],
        "a dead lease registers nothing"
    );
    // Keep-alives carry `long` past its original deadline.
    let past = p.long_ttl + p.short_ttl;
    wait_until(
        s,
        p,
        &[long],
        "outliving the long lease's first deadline",
        || Ok(granted.elapsed() > past),
    )?;
    ensure!(
        names(&s.members("")?) == ["kn/2", "mn/1"],
        "kept-alive members stay"
    );
    s.revoke(long)?;
    ensure!(
        s.members("")?.is_empty(),
        "revoking removes the lease's members"
    );
    expired(s.keep_alive(long), long)?;
    expired(s.revoke(long), long)?;
    Ok(())
}

pub fn election(s: &dyn MetaStore, p: &Params) -> Result<()> {
    let a = s.grant(p.short_ttl)?;
    let b = s.grant(p.long_ttl)?;
    ensure!(s.leader("m-node")? == None);
    ensure!(s.try_lead("m-node", "m1", a)?, "the first candidate wins");
    ensure!(
        !s.try_lead("m-node", "m2", b)?,
        "the second candidate loses"
    );
    ensure!(s.try_lead("m-node", "m1", a)?, "the leader still leads");
    ensure!(
        !s.try_lead("m-node", "m1", b)?,
        "the leader's name under another lease does not lead"
    );
    ensure!(s.leader("m-node")?.as_deref() == Some("m1"));
    ensure!(s.leader("other")?.is_none(), "elections are independent");
    invalid(s.try_lead("", "m1", a))?;
    invalid(s.try_lead("m-node", "", a))?;
    // m1 stops heartbeating: its leadership ends with its lease and the standby takes over.
    wait_until(s, p, &[b], "leader lease expiry", || {
        Ok(s.leader("m-node")? != Some("m1".to_string()))
    })?;
    ensure!(s.leader("m-node")? == None);
    expired(s.try_lead("m-node", "m1", a), a)?;
    ensure!(s.try_lead("m-node", "m2", b)?, "the standby takes over");
    ensure!(s.leader("m-node")?.as_deref() == Some("m2"));
    // Revoking ends leadership at once.
    let c = s.grant(p.long_ttl)?;
    ensure!(!s.try_lead("m-node", "m3", c)?);
    s.revoke(b)?;
    ensure!(s.leader("m-node")? == None);
    ensure!(s.try_lead("m-node", "m3", c)?);
    ensure!(s.leader("m-node")?.as_deref() == Some("m3"));
    s.revoke(c)?;
    ensure!(s.leader("m-node")? == None);
    Ok(())
}
