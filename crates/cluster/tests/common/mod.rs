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
