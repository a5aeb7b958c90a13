//! `reclaim_stale` removes exactly the segments whose creator is gone: it never blocks on a
//! FIFO, never misjudges a live creator it cannot see, never leaves a half-built segment under
//! a name, and leaves segments of other layout versions alone.
#![cfg(not(loom))]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Peer, peer_cmd, shm_guard, shm_path, unique};
use shm_ring::{ChannelConfig, Sender};
use shmpipe_test_kit::{in_small_dev_shm, is_root, shm_entries};

fn exists(name: &str) -> bool {
    Path::new(&shm_path(name)).exists()
}

fn corrupt(name: &str, offset: u64, bytes: &[u8]) {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let (ok, out, err) =
        Peer::spawn(&["corrupt", name, &offset.to_string(), &hex]).finish(Duration::from_secs(10));
    assert!(ok && out.contains("corrupted"), "peer failed: {err}");
}

/// In a private mount namespace (so no other program on the machine meets our FIFO), a FIFO and
/// a symlink to a FIFO named like ours must not hang a create (which runs `reclaim_stale`);
/// `timeout` bounds the run so a regression fails instead of hanging the suite.
#[test]
fn fifo_named_like_ours_does_not_hang_create_or_reclaim() {
    if !is_root() {
        eprintln!("SKIPPED: needs root for a private mount namespace (unshare)");
        return;
    }
    let peer = env!("CARGO_BIN_EXE_shm-ring-peer");
    let p = shm_ring::NAME_PREFIX;
    let script = format!(
        "mkfifo /dev/shm/{p}fifo \
         && ln -s /dev/shm/{p}fifo /dev/shm/{p}fifolink \
         && timeout -s KILL 5 {peer} create 1048576 chan && test -p /dev/shm/{p}fifo \
         && test -L /dev/shm/{p}fifolink && echo fifo-kept"
    );
    let (status, stdout, stderr) = in_small_dev_shm(&script);
    assert!(
        status.success() && stdout.contains("created") && stdout.contains("fifo-kept"),
        "status {:?}: {stdout} {stderr}",
        status
    );
}

/// The creator pid in the header says "dead" (no such process), but the creator is alive and
/// holds its lock: the segment stays. Once the holder is killed, it goes.
#[test]
fn live_lock_holder_is_kept_whatever_its_header_says() {
    let name = unique("bogus-pid");
    let guard = shm_guard(&[&name]);
    let mut creator = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(creator.line(), "ready");
    // pid_max is at most 2^22: this pid never exists.
    corrupt(&name, 16, &0x7fff_fff0u32.to_le_bytes());
    shm_ring::reclaim_stale().unwrap();
    assert!(exists(&name), "reclaimed the segment of a live creator");
    creator.kill();
    assert!(shm_ring::reclaim_stale().unwrap() >= 1);
    guard.assert_gone();
}

/// A creator killed after reserving the memory and before writing the header leaves neither
/// the name taken nor any file behind once the next create has run.
#[test]
fn creator_killed_mid_creation_leaves_the_name_free() {
    let name = unique("orphan");
    let guard = shm_guard(&[&name]);
    let dying = Peer::spawn_cmd(
        peer_cmd()
            .env("SHM_RING_TEST_KILL_AFTER_RESERVE", &name)
            .args(["create-die", &name]),
    );
    let pid = dying.pid();
    let (ok, out, _) = dying.finish(Duration::from_secs(10));
    assert!(
        !ok && !out.contains("ready"),
        "the creator was not killed: {out}"
    );
    let no_linger = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let tx = Sender::create(&name, &no_linger)
        .expect("the name of a half-built segment must not stay taken");
    drop(tx);
    guard.assert_gone();
    let mut left = shm_entries(&name);
    left.extend(shm_entries(&format!(".tmp-{pid}-")));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A segment of another layout version may come from a build that does not lock its
/// segments: it is not ours to judge, even when nobody holds a lock on it.
#[test]
fn segments_of_another_layout_version_are_left_alone() {
    let name = unique("version");
    let guard = shm_guard(&[&name]);
    let mut creator = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(creator.line(), "ready");
    corrupt(&name, 8, &99u32.to_le_bytes());
    creator.kill();
    shm_ring::reclaim_stale().unwrap();
    assert!(
        exists(&name),
        "reclaimed a segment of another layout version"
    );
    drop(guard);
}

/// Names are removed by inode, never by name alone (issue 8, "unlinks by name"): an owner
/// whose name was removed and taken by a new segment meanwhile must leave the new one alone
/// when it is dropped, and so must `reclaim_stale` for a name that now leads to a live file.
#[test]
fn a_name_is_removed_only_while_it_still_leads_to_the_same_file() {
    let name = unique("reused");
    let guard = shm_guard(&[&name]);
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let old = Sender::create(&name, &cfg).unwrap();
    // Someone removes the name (as a reclaimer that misjudged it would), and another producer
    // creates a channel of the same fixed name.
    std::fs::remove_file(shm_path(&name)).unwrap();
    let new = Sender::create(&name, &cfg).unwrap();
    drop(old);
    assert!(exists(&name), "the old owner removed the new owner's name");
    let mut rx = shm_ring::Receiver::open(&name).expect("the new channel is still reachable");
    assert_eq!(rx.try_recv().map(|m| m.is_some()).ok(), Some(false));
    shm_ring::reclaim_stale().unwrap();
    assert!(exists(&name), "reclaimed a live creator's name");
    drop((rx, new));
    guard.assert_gone();
}
