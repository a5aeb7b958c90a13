//! `dir-watch` records a name that exists for an instant only (created and removed at once),
//! as `.ci/run` needs to vouch that nothing of ours ever appeared in `/dev/shm`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shmpipe_test_kit::{ChildGuard, TempDir, TempFile};

#[test]
fn a_name_that_lives_for_an_instant_is_recorded() {
    let dir = TempDir::new("watched");
    let log = TempFile::new("watch-log", "txt");
    let mut w = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_dir-watch"))
            .arg(dir.path())
            .arg(log.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    BufReader::new(w.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "watching");
    for name in ["brief-1", "brief-2"] {
        let p = dir.path().join(name);
        std::fs::write(&p, b"").unwrap();
        std::fs::remove_file(&p).unwrap();
    }
    std::fs::create_dir(dir.path().join("a-dir")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = std::fs::read_to_string(log.path()).unwrap_or_default();
        if ["brief-1", "brief-2", "a-dir"]
            .iter()
            .all(|n| seen.lines().any(|l| l == *n))
        {
            break;
        }
        assert!(Instant::now() < deadline, "not recorded: {seen:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    w.kill();
}
