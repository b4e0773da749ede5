//! What the tests that run `dinomo up` as a process share.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A child process stopped with SIGINT when dropped, and killed if it has not exited 10 s later.
pub struct Interrupted(Child);

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
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "{program}: {e} (scripts/test installs the Debian packages the tests need)"
            )
        })?;
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
