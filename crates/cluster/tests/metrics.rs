//! The Prometheus endpoint of an in-process cluster: scraped with a plain TCP client before and after a known set of
//! operations, the text exposition is parsed and the counters must have moved with what was done; malformed
//! requests are refused with an HTTP error while the endpoint keeps serving.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use dinomo_cluster::metrics::{HttpConfig, MetricsServer};
use dinomo_cluster::{Client, ClientConfig, LocalCluster};

/// One HTTP exchange on a fresh connection: the status line and the body.
fn http(addr: SocketAddr, request: &[u8]) -> anyhow::Result<(String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of the response head")?;
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// Series (name with labels) → value, checking the exposition's structure on the way: every sample belongs to a
/// family declared by `# TYPE` before it, and counters end in `_total`.
fn parse(text: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut series = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').context("TYPE line")?;
            ensure!(
                kind != "counter" || name.ends_with("_total"),
                "counter {name}"
            );
            ensure!(
                types.insert(name.into(), kind.into()).is_none(),
                "{name} declared twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').context("sample without a value")?;
        let name = key.split('{').next().unwrap_or(key);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        ensure!(types.contains_key(family), "{name} has no TYPE before it");
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().with_context(|| format!("value of {key}"))?,
        };
        ensure!(series.insert(key.to_string(), v).is_none(), "{key} twice");
    }
    Ok(series)
}

fn scrape(addr: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let (status, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    if status != "HTTP/1.1 200 OK" {
        bail!("scrape answered {status}");
    }
    parse(&body)
}

/// The sum over every series of `name` whose labels include all of `labels`.
fn sum(m: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    m.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn scraped_counters_follow_the_operations() -> anyhow::Result<()> {
    let mut cfg = common::small_cluster(2);
    cfg.resp_listen = vec!["127.0.0.1:0".parse()?];
    let cluster = LocalCluster::start(cfg)?;
    let server = MetricsServer::start(HttpConfig::default(), cluster.metrics())?;
    let addr = server.local_addr();
    let before = scrape(addr)?;

    let mut client = Client::connect(ClientConfig {
        seeds: vec![cluster.rn_addr().to_string()],
        latency_report_period: Duration::ZERO,
        ..ClientConfig::default()
    })?;
    let (sets, gets, incrs, deletes) = (200u64, 150u64, 40u64, 25u64);
    for i in 0..sets {
        client.set(format!("k{i}").as_bytes(), b"value")?;
    }
    for i in 0..gets {
        ensure!(client.get(format!("k{i}").as_bytes())?.is_some());
    }
    for _ in 0..incrs {
        client.incr(b"counter", 1)?;
    }
    for i in 0..deletes {
        ensure!(client.delete(format!("k{i}").as_bytes())?);
    }
    let issued = sets + gets + incrs + deletes;
    let after = scrape(addr)?;
    let delta =
        |name: &str, labels: &[&str]| sum(&after, name, labels) - sum(&before, name, labels);

    // Operations by kind: every operation issued reached its owner's workers (retries could only add).
    for (op, n) in [
        ("get", gets),
        ("set", sets),
        ("incr", incrs),
        ("delete", deletes),
    ] {
        let d = delta("dinomo_kn_ops_total", &[&format!("op=\"{op}\"")]);
        ensure!(d >= n as f64, "{op}: {d} counted, {n} issued");
    }
    let all_ops = delta("dinomo_kn_ops_total", &[]);
    ensure!(
        all_ops >= issued as f64 && all_ops <= 2.0 * issued as f64,
        "{all_ops}"
    );
    // Gets, increments and deletes each look their key up; sets do not.
    let lookups = delta("dinomo_kn_lookups_total", &[]);
    ensure!(
        lookups >= (gets + incrs + deletes) as f64,
        "{lookups} lookups"
    );
    let answered = delta("dinomo_kn_lookup_answers_total", &[]);
    ensure!(
        answered == lookups,
        "{answered} answers of {lookups} lookups"
    );
    // The writes were logged: sets, increments and deletes of present keys.
    let writes = delta("dinomo_kn_writes_total", &[]);
    ensure!(writes >= (sets + incrs + deletes) as f64, "{writes} writes");
    ensure!(delta("dinomo_kn_group_commits_total", &[]) >= 1.0);
    ensure!(delta("dinomo_kn_round_trips_total", &[]) >= 1.0);
    ensure!(delta("dinomo_fabric_round_trips_total", &[]) >= 1.0);

    // Per node: hit ratios of the four kinds add up to 1 once there were lookups, the busy time grew, and the
    // node serves under the record's epoch.
    let epoch = sum(&after, "dinomo_ring_epoch", &[]);
    ensure!(epoch >= 1.0);
    let nodes: Vec<u32> = cluster.nodes().iter().map(|n| n.id()).collect();
    ensure!(sum(&after, "dinomo_ring_nodes", &[]) == nodes.len() as f64);
    for id in &nodes {
        let node = format!("node=\"{id}\"");
        let ratios = sum(&after, "dinomo_kn_hit_ratio", &[&node]);
        if sum(&after, "dinomo_kn_lookups_total", &[&node]) > 0.0 {
            ensure!(
                (ratios - 1.0).abs() < 1e-9,
                "node {id}: hit ratios add up to {ratios}"
            );
        }
        ensure!(sum(&after, "dinomo_kn_ring_epoch", &[&node]) == epoch);
        ensure!(sum(&after, "dinomo_kn_serving", &[&node]) == 1.0);
    }
    let shares = sum(&after, "dinomo_ring_share", &[]);
    ensure!((shares - 1.0).abs() < 1e-6, "shares add up to {shares}");

    // The clients' latency reports: at most one latency per operation, all in the +Inf bucket, cumulative.
    let reported = delta("dinomo_kn_client_latency_seconds_count", &[]);
    ensure!(
        reported >= 1.0 && reported <= issued as f64,
        "{reported} latencies reported"
    );
    ensure!(
        sum(
            &after,
            "dinomo_kn_client_latency_seconds_bucket",
            &["le=\"+Inf\""]
        ) == sum(&after, "dinomo_kn_client_latency_seconds_count", &[])
    );
    ensure!(sum(&after, "dinomo_kn_client_latency_seconds_sum", &[]) > 0.0);

    // The memory node: the pool holds the data, counters never went back.
    ensure!(sum(&after, "dinomo_pool_used_bytes", &[]) > 0.0);
    ensure!(sum(&after, "dinomo_pool_free_bytes", &[]) > 0.0);
    // The prefaulter is on by default and faults in the lowest free segments as soon as the pool opens.
    ensure!(sum(&after, "dinomo_pool_prefaulted_bytes_total", &[]) > 0.0);
    ensure!(sum(&after, "dinomo_mnode_leading", &[]) == 1.0);
    ensure!(
        after.contains_key("dinomo_mnode_reconfiguration_failures_total"),
        "the M-node counts its failed steps"
    );
    for (key, v) in &after {
        let name = key.split('{').next().unwrap_or_default();
        if name.ends_with("_total") {
            ensure!(
                *v >= before.get(key).copied().unwrap_or(0.0),
                "{key} went back"
            );
        }
    }
    drop(client);
    drop(server);
    cluster.stop();
    Ok(())
}

#[test]
fn malformed_requests_are_refused_and_the_endpoint_keeps_serving() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(common::small_cluster(1))?;
    let server = MetricsServer::start(
        HttpConfig {
            io_timeout: Duration::from_millis(500),
            ..HttpConfig::default()
        },
        cluster.metrics(),
    )?;
    let addr = server.local_addr();
    for (request, status) in [
        (&b"garbage\r\n\r\n"[..], "HTTP/1.1 400 Bad Request"),
        (b"GET /metrics HTTP/9\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            "HTTP/1.1 400 Bad Request",
        ),
        (b"\xff\xfe\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (
            b"POST /metrics HTTP/1.1\r\n\r\n",
            "HTTP/1.1 405 Method Not Allowed",
        ),
        (b"GET /other HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found"),
    ] {
        let (got, _) = http(addr, request)?;
        ensure!(got == status, "{request:?}: {got}");
    }
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 << 10));
    let (got, _) = http(addr, &huge)?;
    ensure!(
        got == "HTTP/1.1 431 Request Header Fields Too Large",
        "{got}"
    );
    // A client that sends half a request and goes away, and one that sends nothing until the timeout.
    TcpStream::connect(addr)?.write_all(b"GET /metr")?;
    let idle = TcpStream::connect(addr)?;
    let m = scrape(addr)?;
    ensure!(sum(&m, "dinomo_ring_nodes", &[]) == 1.0);
    let (status, body) = http(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n")?;
    ensure!(status == "HTTP/1.1 200 OK" && body.is_empty(), "{status}");
    drop(idle);
    drop(server);
    cluster.stop();
    Ok(())
}

/// With a bearer token set, a scrape without it, or with another, is answered 401 with a `WWW-Authenticate`
/// challenge, and one presenting it gets the page.
#[test]
fn a_bearer_token_guards_the_endpoint() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(common::small_cluster(1))?;
    let server = MetricsServer::start(
        HttpConfig {
            bearer_token: Some("scrape-secret".into()),
            ..HttpConfig::default()
        },
        cluster.metrics(),
    )?;
    let addr = server.local_addr();
    for request in [
        &b"GET /metrics HTTP/1.1\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer scrape-secreT\r\n\r\n",
        b"HEAD /metrics HTTP/1.1\r\nAuthorization: Basic c2NyYXBlLXNlY3JldA==\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(request)?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        ensure!(
            answer.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
            "{request:?}: {answer}"
        );
        ensure!(answer.contains("WWW-Authenticate: Bearer"), "{answer}");
        ensure!(!answer.contains("dinomo_ring_nodes"), "{answer}");
    }
    let (status, body) = http(
        addr,
        b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer scrape-secret\r\n\r\n",
    )?;
    ensure!(status == "HTTP/1.1 200 OK", "{status}");
    ensure!(sum(&parse(&body)?, "dinomo_ring_nodes", &[]) == 1.0);
    drop(server);
    cluster.stop();
    Ok(())
}
