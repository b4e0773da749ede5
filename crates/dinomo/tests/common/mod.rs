//! What the tests that run `dinomo up` as a process share.

use std::io::{BufRead, BufReader};
use std::process::Child;
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
