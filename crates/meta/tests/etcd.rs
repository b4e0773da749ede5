//! `EtcdMeta` against a real etcd server started for the test (Debian package etcd-server, /usr/bin/etcd).
#![cfg(feature = "etcd")]

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dinomo_meta::{EtcdConfig, EtcdMeta, MetaConfig, MetaError, MetaStore};

const ETCD: &str = "/usr/bin/etcd";
const MAX_RECORD: usize = 256 << 10;

/// A private etcd server; killed and its data removed on drop.
struct EtcdServer {
    child: Child,
    client_url: String,
    dir: tempfile::TempDir,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    fn start() -> Result<EtcdServer> {
        if !Path::new(ETCD).exists() {
            bail!(
                "{ETCD} is missing: install etcd-server (apt-get install etcd-server) to run the etcd tests"
            );
        }
        let dir = tempfile::tempdir()?;
        let client_url = format!("http://127.0.0.1:{}", free_port()?);
        let peer_url = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("etcd.log"))?;
        let child = Command::new(ETCD)
            .arg("--name")
            .arg("dinomo-test")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("dinomo-test={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {ETCD}"))?;
        Ok(EtcdServer {
            child,
            client_url,
            dir,
        })
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Connects once the server answers (bounded).
    fn connect(&mut self, prefix: &str) -> Result<EtcdMeta> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("etcd exited with {status}:\n{}", self.log_tail());
            }
            match EtcdMeta::connect_with(EtcdConfig {
                endpoints: vec![self.client_url.clone()],
                prefix: prefix.into(),
                timeout: Duration::from_secs(2),
                min_ttl: Duration::from_secs(2),
                limits: MetaConfig {
                    max_record_len: MAX_RECORD,
                    ..MetaConfig::default()
                },
            }) {
                Ok(m) => return Ok(m),
                Err(_) if start.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => bail!("etcd did not answer within 30 s: {e}\n{}", self.log_tail()),
            }
        }
    }
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
    let mut server = EtcdServer::start()?;
    let meta = server.connect("/dinomo-test/")?;
    common::conformance(&meta, &params())?;

    // Another prefix is another store on the same cluster.
    let other = server.connect("/other/")?;
    assert_eq!(other.load()?, None);
    let v = other.store(None, b"x")?;
    assert!(matches!(
        meta.store(None, b"y"),
        Err(MetaError::Conflict { current: Some(_) })
    ));
    assert_ne!(meta.load()?.map(|r| r.version), Some(v));

    // Two M-nodes with their own clients: one wins, the other takes over when the winner's lease is revoked.
    let m1 = server.connect("/dinomo-test/")?;
    let m2 = server.connect("/dinomo-test/")?;
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
