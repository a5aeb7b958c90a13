//! Named channels meet through a socket in a directory only their user can enter: another
//! user can neither open a channel of ours, nor squat its directory or its name, nor make it
//! fail; a socket directory we do not own, or that others may enter, or that is a symlink, is
//! refused with an error naming path, owner and mode; and a process of the same user that
//! gets hold of a channel's memory cannot resize it (no SIGBUS for anyone).
//! (Issue 16, hole 10; these replace the `/dev/shm` file checks of issue 8.)
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{Peer, mem_path, named, peer_cmd, private_rendezvous, socket_dir, unique};
use shm_ring::{
    ChannelConfig, Message, MessageBuilder, OpenError, Receiver, Rendezvous, Sender, Transfer,
};
use shmpipe_test_kit::{NOBODY, TempDir, as_nobody, is_root};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn no_linger(rdv: Rendezvous) -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    }
}

/// Root's channel in its default socket directory; user nobody tries to connect to it, to
/// bind a socket next to it, to make a file in the directory, and to make a directory next to
/// it (where it would squat the directory of a user that has none yet): the kernel refuses
/// each, and the channel works on.
#[test]
fn another_user_can_neither_open_nor_squat_nor_break_a_named_channel() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a peer as uid {NOBODY} (nobody)");
        return;
    }
    let (name, guard) = named("foreign");
    let mut tx = Sender::<Message>::create(&name, &no_linger(Rendezvous::default())).unwrap();
    let dir = socket_dir();
    let st = std::fs::metadata(&dir).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&st), 0);
    assert_eq!(st.permissions().mode() & 0o777, 0o700, "{}", dir.display());
    let attacker =
        Peer::spawn_cmd(as_nobody(&mut peer_cmd()).args(["squat", dir.to_str().unwrap(), &name]));
    let (ok, out, err) = attacker.finish(Duration::from_secs(10));
    assert!(ok, "{err}");
    for step in ["connect", "bind", "file", "sibling"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{step}: ")))
            .unwrap_or_else(|| panic!("no {step} in {out}"));
        assert!(
            line.contains("Permission denied") || line.contains("permission denied"),
            "nobody's {step} was not refused: {out}"
        );
    }
    // Nothing of nobody's appeared, and the channel is intact.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&name))
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from(&name)]);
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    tx.send(MessageBuilder::new().tag(3)).unwrap();
    assert_eq!(rx.recv().unwrap().tag(), 3);
    drop((tx, rx));
    guard.assert_gone();
}

/// A socket directory owned by another user is refused (by creators and openers), even when
/// a live channel of that user waits there; allowing that user (`Rendezvous::peer_uid`) on
/// both sides lets the channel be opened. A server that does not allow us answers nothing.
#[test]
fn a_socket_directory_of_another_user_is_refused_unless_that_user_is_allowed() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a peer as uid {NOBODY} (nobody)");
        return;
    }
    let dir = TempDir::new("foreign-dir");
    rustix::fs::chown(
        dir.path(),
        Some(rustix::fs::Uid::from_raw(NOBODY)),
        Some(rustix::fs::Gid::from_raw(NOBODY)),
    )
    .unwrap();
    chmod(dir.path(), 0o700);
    let path: &'static Path = Box::leak(dir.path().to_path_buf().into_boxed_path());
    let strict = Rendezvous {
        dir: Some(path),
        ..Rendezvous::default()
    };
    let msg = Sender::<Message>::create("x", &no_linger(strict))
        .expect_err("created in another user's directory")
        .to_string();
    assert!(msg.contains(&format!("uid {NOBODY}")), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    let mut theirs = Peer::spawn_cmd(
        as_nobody(&mut peer_cmd())
            .env("SHMPIPE_DIR", path)
            .env("SHM_RING_PEER_UID", "0")
            .args(["produce-hang", "theirs"]),
    );
    assert_eq!(theirs.line(), "ready");
    let msg = Receiver::<Message>::open_in(&strict, "theirs", None)
        .expect_err("opened another user's channel")
        .to_string();
    assert!(msg.contains(&format!("uid {NOBODY}")), "{msg}");
    let allowing = Rendezvous {
        peer_uid: Some(NOBODY),
        ..strict
    };
    let rx =
        Receiver::<Message>::open_in(&allowing, "theirs", None).expect("allowed user's channel");
    assert_eq!(rx.producer_pid(), theirs.pid());
    drop(rx);
    theirs.kill();
    // Their server, if it does not allow us, closes on us without a word.
    let mut strict_theirs = Peer::spawn_cmd(
        as_nobody(&mut peer_cmd())
            .env("SHMPIPE_DIR", path)
            .args(["produce-hang", "strict"]),
    );
    assert_eq!(strict_theirs.line(), "ready");
    match Receiver::<Message>::open_in(&allowing, "strict", None) {
        Err(OpenError::NotASegment(why)) => assert!(why.contains("refuse our user"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    strict_theirs.kill();
}

#[test]
fn own_socket_directory_with_group_or_other_bits_is_refused() {
    let (dir, rdv) = private_rendezvous("mode");
    for mode in [0o750, 0o705, 0o770, 0o701] {
        chmod(dir.path(), mode);
        let msg = Sender::<Message>::create("x", &no_linger(rdv))
            .expect_err("a socket directory others may enter")
            .to_string();
        assert!(msg.contains(&format!("mode {mode:04o}")), "{msg}");
        let msg = Receiver::<Message>::open_in(&rdv, "x", None)
            .expect_err("a socket directory others may enter")
            .to_string();
        assert!(msg.contains(&format!("mode {mode:04o}")), "{msg}");
    }
    chmod(dir.path(), 0o700);
    let tx = Sender::<Message>::create("x", &no_linger(rdv)).unwrap();
    drop(Receiver::<Message>::open_in(&rdv, "x", None).unwrap());
    drop(tx);
    assert!(shmpipe_test_kit::entries_of(dir.path(), "").is_empty());
}

#[test]
fn a_socket_directory_that_is_a_symlink_or_not_a_directory_is_refused() {
    let (dir, rdv) = private_rendezvous("target");
    let link = dir.path().with_extension("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    let _rm = scopeguard_remove(link.clone());
    let via_link = Rendezvous {
        dir: Some(Box::leak(link.clone().into_boxed_path())),
        ..rdv
    };
    let msg = Sender::<Message>::create("x", &no_linger(via_link))
        .expect_err("followed a symlink")
        .to_string();
    assert!(msg.contains("a symbolic link"), "{msg}");
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let at_file = Rendezvous {
        dir: Some(Box::leak(file.into_boxed_path())),
        ..rdv
    };
    let msg = Receiver::<Message>::open_in(&at_file, "x", None)
        .expect_err("a file as socket directory")
        .to_string();
    assert!(msg.contains("a regular file"), "{msg}");
}

/// Removes a path on drop.
struct Remove(std::path::PathBuf);
impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
fn scopeguard_remove(p: std::path::PathBuf) -> Remove {
    Remove(p)
}

/// A process of the same user that gets a named channel's memory (from its server, as any
/// process of ours may, or through `/proc/<pid>/fd`) can neither shrink nor grow it; both ends
/// then touch every page of the pool and never see SIGBUS.
#[test]
fn a_same_user_process_cannot_resize_a_named_channel() {
    let (name, guard) = named("resize");
    let cfg = ChannelConfig {
        blocks: 4,
        block_size: 1 << 20,
        transfer: Transfer::ZeroCopy,
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let mut rx = Receiver::<Message>::open(&name).unwrap();
    for target in [name.clone(), mem_path(&tx)] {
        let (ok, out, err) = Peer::spawn(&["resize", &target]).finish(Duration::from_secs(10));
        assert!(ok, "{err}");
        assert!(
            out.contains("shrink: Operation not permitted")
                && out.contains("grow: Operation not permitted"),
            "resized through {target}: {out}"
        );
    }
    for round in 0..2u8 {
        let mut held = Vec::new();
        for b in 0..4u8 {
            let loan = tx.loan::<u8>(&[1 << 20]).unwrap().fill(round * 4 + b);
            tx.send(MessageBuilder::new().array_loan("x", loan))
                .unwrap();
            let m = rx.recv().unwrap();
            let x = m.record(0).unwrap().array::<u8>("x").unwrap();
            assert!(x.iter().all(|&v| v == round * 4 + b));
            held.push(m);
        }
    }
    drop((tx, rx));
    guard.assert_gone();
}

/// Issue 16, hole 10: user nobody makes `/dev/shm/shmpipe-<name>` (what named channels used to
/// be) before our create; our channel of that name is made, opened and used as if nothing were
/// there (it lives in no file), and nobody's file is left alone.
#[test]
fn a_name_squatted_in_dev_shm_by_another_user_changes_nothing() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a child as uid {NOBODY} (nobody)");
        return;
    }
    let name = unique("squat");
    let squat = format!("/dev/shm/shmpipe-{name}");
    let _rm = scopeguard_remove(squat.clone().into());
    let made = as_nobody(&mut std::process::Command::new("sh"))
        .args(["-c", &format!("echo x > {squat} && chmod 666 {squat}")])
        .status()
        .unwrap();
    assert!(made.success());
    let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default()).expect("squatted");
    let mut rx = Receiver::<Message>::open(&name).expect("squatted");
    tx.send(MessageBuilder::new().tag(9)).unwrap();
    assert_eq!(rx.recv().unwrap().tag(), 9);
    drop((tx, rx));
    assert_eq!(std::fs::read(&squat).unwrap(), b"x\n");
}
