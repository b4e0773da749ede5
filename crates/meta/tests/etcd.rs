//! `EtcdMeta` against a real etcd server started for the test (Debian package etcd-server, /usr/bin/etcd).
#![cfg(feature = "etcd")]

mod common;

use std::net::TcpListener;
use std::time::Duration;

use anyhow::{Result, bail};
use dinomo_meta::{EtcdConfig, EtcdMeta, LocalEtcd, MetaConfig, MetaError, MetaStore};

const MAX_RECORD: usize = 256 << 10;

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A client of `server` with keys under `prefix`.
fn connect(server: &mut LocalEtcd, prefix: &str) -> Result<EtcdMeta> {
    Ok(server.connect(EtcdConfig {
        prefix: prefix.into(),
        timeout: Duration::from_secs(2),
        min_ttl: Duration::from_secs(2),
        limits: MetaConfig {
            max_record_len: MAX_RECORD,
            ..MetaConfig::default()
        },
        ..EtcdConfig::default()
    })?)
}

fn params() -> common::Params {
    common::Params {
        max_record_len: MAX_RECORD,
        max_info_len: MetaConfig::default().max_info_len,
        // etcd's shortest TTL with default settings; expiry is noticed within about a second more.
        short_ttl: Duration::from_secs(2),
        long_ttl: Duration::from_secs(5),
        expiry_bound: Duration::from_secs(10),
    }
}

#[test]
fn etcd_store_behaves() -> Result<()> {
    let mut server = LocalEtcd::start()?;
    let meta = connect(&mut server, "/dinomo-test/")?;
    common::conformance(&meta, &params())?;

    // Another prefix is another store on the same cluster.
    let other = connect(&mut server, "/other/")?;
    assert_eq!(other.load()?, None);
    let v = other.store(None, b"x")?;
    assert!(matches!(
        meta.store(None, b"y"),
        Err(MetaError::Conflict { current: Some(_) })
    ));
    assert_ne!(meta.load()?.map(|r| r.version), Some(v));

    // Two M-nodes with their own clients: one wins, the other takes over when the winner's lease is revoked.
    let m1 = connect(&mut server, "/dinomo-test/")?;
    let m2 = connect(&mut server, "/dinomo-test/")?;
    let l1 = m1.grant(Duration::from_secs(10))?;
    let l2 = m2.grant(Duration::from_secs(10))?;
    assert!(m1.try_lead("m", "m1", l1)?);
    assert!(!m2.try_lead("m", "m2", l2)?);
    assert_eq!(m2.leader("m")?.as_deref(), Some("m1"));
    m1.revoke(l1)?;
    assert!(m2.try_lead("m", "m2", l2)?);
    assert_eq!(m1.leader("m")?.as_deref(), Some("m2"));
    assert!(matches!(
        m1.try_lead("m", "m1", l1),
        Err(MetaError::LeaseExpired(id)) if id == l1
    ));
    Ok(())
}

#[test]
fn ttls_are_whole_seconds_and_at_least_the_minimum() {
    let c = EtcdConfig::default();
    assert_eq!(c.etcd_ttl(Duration::from_millis(10)), 2);
    assert_eq!(c.etcd_ttl(Duration::from_millis(2001)), 3);
    assert_eq!(c.etcd_ttl(Duration::from_secs(7)), 7);
    assert_eq!(c.etcd_ttl(Duration::MAX), i64::MAX);
}

#[test]
fn an_unreachable_cluster_is_unavailable() -> Result<()> {
    let port = free_port()?;
    match EtcdMeta::connect(
        &[format!("http://127.0.0.1:{port}")],
        "/dinomo/",
        Duration::from_millis(500),
    ) {
        Err(MetaError::Unavailable(_)) => Ok(()),
        other => bail!("expected Unavailable, got {other:?}"),
    }
}
