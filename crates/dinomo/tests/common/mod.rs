//! What the tests that run `dinomo up` as a process share.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A child process stopped with SIGINT when dropped, and killed if it has not exited 10 s later.
// Not every test binary starts `dinomo up` itself.
#[allow(dead_code)]
pub struct Interrupted(Child);

impl From<Child> for Interrupted {
    fn from(child: Child) -> Interrupted {
        Interrupted(child)
    }
}

impl Drop for Interrupted {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the banner of `dinomo up` (started with stdout piped), handing each line to `on_line` until it returns
/// true; stdout is drained from then on so the child never blocks on a full pipe.
#[allow(dead_code)]
pub fn read_banner(
    mut child: Child,
    mut on_line: impl FnMut(&str) -> anyhow::Result<bool>,
) -> anyhow::Result<Interrupted> {
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    loop {
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            anyhow::bail!("dinomo up exited before it served: {:?}", child.wait()?);
        }
        if on_line(line.trim())? {
            break;
        }
    }
    std::thread::spawn(move || for _ in stdout.lines() {});
    Ok(Interrupted(child))
}

/// Runs a program with a deadline; its output.
// Not every test binary runs programs.
#[allow(dead_code)]
pub fn run(program: &str, args: &[String], limit: Duration) -> anyhow::Result<Output> {
    let mut child = spawn(
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )?;
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            return Ok(child.wait_with_output()?);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            anyhow::bail!(
                "{program} {args:?} ran past {limit:?}; output: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a program, saying where a missing one comes from.
#[allow(dead_code)]
pub fn spawn(command: &mut Command) -> anyhow::Result<Child> {
    command.spawn().map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (scripts/test installs the Debian packages the tests need)",
            command.get_program().to_string_lossy()
        )
    })
}

/// Runs `redis-benchmark -t TESTS -n REQUESTS -q` against `addr` within `limit`, and checks that it succeeded
/// without an error and printed a result for each of `results` (`label` names the server in failures).
#[allow(dead_code)]
pub fn redis_benchmark(
    addr: SocketAddr,
    tests: &str,
    requests: u32,
    results: &[&str],
    limit: Duration,
    label: &str,
) -> anyhow::Result<()> {
    let args: Vec<String> = [
        "-h",
        &addr.ip().to_string(),
        "-p",
        &addr.port().to_string(),
        "-t",
        tests,
        "-n",
        &requests.to_string(),
        "-q",
    ]
    .map(String::from)
    .to_vec();
    let out = run("redis-benchmark", &args, limit)?;
    // Progress lines end with \r; the results end with \n.
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{label}: redis-benchmark failed: {text} {errors}"
    );
    assert!(
        !text.contains("ERR") && !text.to_lowercase().contains("error"),
        "{text}"
    );
    for test in results {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{test}: ")) && l.contains("requests per second")),
            "no result for {test}: {text}"
        );
    }
    Ok(())
}

/// `redis-cli -p PORT args...` (raw output, as when not on a terminal).
#[allow(dead_code)]
pub fn cli(addr: SocketAddr, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec![
        "-h".to_string(),
        addr.ip().to_string(),
        "-p".into(),
        addr.port().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    let out = run("redis-cli", &all, Duration::from_secs(30))?;
    anyhow::ensure!(out.status.success(), "redis-cli {args:?}: {out:?}");
    Ok(String::from_utf8(out.stdout)?)
}
