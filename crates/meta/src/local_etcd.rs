//! A private, single-member etcd on loopback (the Debian `etcd-server` binary), started and owned by this process:
//! for integration tests of the etcd store and for trying a cluster on one machine without an etcd deployment.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{EtcdConfig, EtcdMeta, MetaError};

/// Where Debian's etcd-server installs etcd.
pub const ETCD_BINARY: &str = "/usr/bin/etcd";

/// How long [`LocalEtcd::connect`] waits for a new server to answer.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd with its data in a temporary directory; killed and its data removed on drop.
pub struct LocalEtcd {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, MetaError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| MetaError::Unavailable(format!("no free loopback port: {e}")))
}

impl LocalEtcd {
    /// Starts etcd on two free loopback ports. Fails with a message naming the package when etcd is missing.
    pub fn start() -> Result<LocalEtcd, MetaError> {
        if !Path::new(ETCD_BINARY).exists() {
            return Err(MetaError::Unavailable(format!(
                "{ETCD_BINARY} is missing: install etcd-server (apt-get install etcd-server)"
            )));
        }
        let io = |e: std::io::Error| MetaError::Unavailable(format!("starting {ETCD_BINARY}: {e}"));
        let dir = tempfile::tempdir().map_err(io)?;
        let url = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("etcd.log")).map_err(io)?;
        let child = Command::new(ETCD_BINARY)
            .args(["--name", "dinomo-local", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .arg("--initial-cluster")
            .arg(format!("dinomo-local={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io)?)
            .stderr(log)
            .spawn()
            .map_err(io)?;
        Ok(LocalEtcd { child, url, dir })
    }

    /// The client URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The last lines etcd logged.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Connects with `config` (its endpoints replaced by this server's), waiting up to [`STARTUP_TIMEOUT`] for a
    /// server that is still starting.
    pub fn connect(&mut self, config: EtcdConfig) -> Result<EtcdMeta, MetaError> {
        let config = EtcdConfig {
            endpoints: vec![self.url.clone()],
            ..config
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(MetaError::Unavailable(format!(
                    "etcd exited with {status}:\n{}",
                    self.log_tail()
                )));
            }
            match EtcdMeta::connect_with(config.clone()) {
                Ok(m) => return Ok(m),
                Err(_) if start.elapsed() < STARTUP_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(MetaError::Unavailable(format!(
                        "etcd did not answer within {STARTUP_TIMEOUT:?}: {e}\n{}",
                        self.log_tail()
                    )));
                }
            }
        }
    }
}
