//! The allocator's purge delay: `dinomo` sets it at start (see `ALLOCATOR_PURGE_DELAY_MS` in main.rs), and
//! `MIMALLOC_PURGE_DELAY` in the environment overrides it. Read back from mimalloc's own report of its options.

use std::process::Command;

/// The purge delay mimalloc reports for a short `dinomo` run with `env`.
fn reported_purge_delay(env: &[(&str, &str)]) -> anyhow::Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dinomo"))
        .args(["config", "defaults"])
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .envs(env.iter().copied())
        .output()?;
    anyhow::ensure!(out.status.success(), "dinomo config defaults failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("option 'purge_delay'"))
        .ok_or_else(|| anyhow::anyhow!("mimalloc reported no purge delay:\n{stderr}"))?;
    Ok(line
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string())
}

#[test]
fn the_purge_delay_is_a_second_unless_the_environment_says_otherwise() -> anyhow::Result<()> {
    assert_eq!(reported_purge_delay(&[])?, "1000");
    assert_eq!(
        reported_purge_delay(&[("MIMALLOC_PURGE_DELAY", "20")])?,
        "20"
    );
    Ok(())
}
