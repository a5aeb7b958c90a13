//! A named segment is opened only if it is a regular file owned by us with no group/other
//! permission bits: nothing another user made, nothing behind a symlink, never a directory.
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{Peer, peer_cmd, shm_guard, shm_path, unique};
use shm_ring::{ChannelConfig, Receiver, Sender};
use shmpipe_test_kit::{NOBODY, as_nobody, is_root};

fn chmod(name: &str, mode: u32) {
    std::fs::set_permissions(shm_path(name), std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn segment_of_another_user_is_refused_even_when_world_writable() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a peer as uid {NOBODY} (nobody)");
        return;
    }
    let name = unique("foreign");
    let guard = shm_guard(&[&name]);
    // The attacker: another user creates a real channel under the name we are about to use
    // and makes it world-writable.
    let mut attacker = Peer::spawn_cmd(as_nobody(&mut peer_cmd()).args(["produce-hang", &name]));
    assert_eq!(attacker.line(), "ready");
    chmod(&name, 0o666);
    let err = Receiver::open(&name).expect_err("opened another user's segment");
    let msg = err.to_string();
    assert!(msg.contains(&format!("uid {NOBODY}")), "{msg}");
    assert!(msg.contains("0666"), "{msg}");
    assert!(msg.contains(&shm_path(&name)), "{msg}");
    // Our own create of that name fails instead of sharing the attacker's segment.
    assert!(Sender::create(&name, &ChannelConfig::default()).is_err());
    attacker.kill();
    // Not ours: reclaim leaves it alone.
    shm_ring::reclaim_stale().unwrap();
    assert!(std::path::Path::new(&shm_path(&name)).exists());
    drop(guard);
}

#[test]
fn own_segment_with_group_or_other_bits_is_refused() {
    let name = unique("mode");
    let guard = shm_guard(&[&name]);
    let tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    for mode in [0o640, 0o604, 0o660] {
        chmod(&name, mode);
        let msg = Receiver::open(&name)
            .expect_err("opened a segment others may write")
            .to_string();
        assert!(msg.contains(&format!("mode {mode:04o}")), "{msg}");
    }
    chmod(&name, 0o600);
    Receiver::open(&name).unwrap();
    drop(tx);
    guard.assert_gone();
}

#[test]
fn symlink_named_like_ours_is_not_followed() {
    let target = unique("target");
    let link = unique("link");
    let guard = shm_guard(&[&target, &link]);
    let tx = Sender::create(&target, &ChannelConfig::default()).unwrap();
    std::os::unix::fs::symlink(
        format!("{}{}", shm_ring::NAME_PREFIX, target),
        shm_path(&link),
    )
    .unwrap();
    let msg = Receiver::open(&link)
        .expect_err("followed a symlink")
        .to_string();
    assert!(msg.contains("symbolic link"), "{msg}");
    // reclaim neither follows nor removes it.
    shm_ring::reclaim_stale().unwrap();
    assert!(std::fs::symlink_metadata(shm_path(&link)).is_ok());
    // The real segment is intact.
    Receiver::open(&target).unwrap();
    drop(tx);
    drop(guard);
}

#[test]
fn directory_named_like_ours_is_refused_and_left_alone() {
    let name = unique("dir");
    let path = shm_path(&name);
    std::fs::create_dir(&path).unwrap();
    let _rm = shm_guard(&[&name]);
    let msg = Receiver::open(&name)
        .expect_err("opened a directory")
        .to_string();
    assert!(msg.contains("not a regular file"), "{msg}");
    assert!(Sender::create(&name, &ChannelConfig::default()).is_err());
    shm_ring::reclaim_stale().unwrap();
    assert!(std::path::Path::new(&path).is_dir());
}
