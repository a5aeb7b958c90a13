//! Tests that need root: another user's process, a small `/dev/shm` in a private mount
//! namespace.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};

/// The uid and gid of user `nobody`.
pub const NOBODY: u32 = 65534;

/// Whether this process runs as root (the tests below need it; others skip with a message).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Makes `cmd` run as user and group `nobody` (another user than the test's). Needs root.
pub fn as_nobody(cmd: &mut Command) -> &mut Command {
    cmd.uid(NOBODY).gid(NOBODY)
}

/// A command that runs `script` with `sh -c` in a private mount namespace whose `/dev/shm` is
/// a fresh 16 MB tmpfs (a small container's); add environment variables before running it.
/// Needs root. Nothing the script leaves in that `/dev/shm` outlives the command.
pub fn small_dev_shm_command(script: &str) -> Command {
    let script = format!("mount -t tmpfs -o size=16m tmpfs /dev/shm && {script}");
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    c
}

/// Runs [`small_dev_shm_command`]`(script)` and returns its exit status, stdout and stderr.
///
/// # Panics
/// If `unshare` cannot be run.
pub fn in_small_dev_shm(script: &str) -> (ExitStatus, String, String) {
    let out = small_dev_shm_command(script).output().expect("run unshare");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_dev_shm_is_a_private_16_mb_tmpfs() {
        if !is_root() {
            eprintln!("SKIPPED: needs root for a private mount namespace (unshare)");
            return;
        }
        let name = crate::unique_name("kit-ns");
        let (status, out, err) = in_small_dev_shm(&format!(
            "touch /dev/shm/{name} && df -k /dev/shm | tail -1"
        ));
        assert!(status.success(), "{err}");
        let kib: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(kib, 16 * 1024, "{out}");
        // Made in the private tmpfs, not in ours.
        assert!(crate::shm_entries(&name).is_empty());
    }

    #[test]
    fn as_nobody_runs_as_another_user() {
        if !is_root() {
            eprintln!("SKIPPED: needs root to run a child as nobody");
            return;
        }
        let out = as_nobody(&mut Command::new("id"))
            .arg("-u")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            NOBODY.to_string()
        );
    }
}
