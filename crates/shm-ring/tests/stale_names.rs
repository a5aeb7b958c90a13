//! The names of dead creators are cleaned up, and only those: a stale socket (nobody listens
//! on it) is taken over by the next create and removed by the next open; a live creator's
//! socket is never taken for stale, whatever its channel's header says; nothing at a name that
//! is not a socket is opened, waited on, or removed; and a sender removes its own socket only
//! while the name still leads to it. (Issue 16: these replace the `/dev/shm` reclaim tests,
//! `reclaim.rs`, whose lock-based reclaim no longer exists.)
#![cfg(not(loom))]

mod common;

use std::os::unix::fs::symlink;
use std::time::Duration;

use common::{Peer, channel_memfd, named, private_rendezvous, socket_path};
use shm_ring::{ChannelConfig, CreateError, Message, OpenError, Receiver, Sender};
use shmpipe_test_kit::within;

fn no_linger() -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

/// A FIFO, a symlink to it, a regular file and a directory at channel names: create and open
/// refuse each at once (never opening, following or waiting on it), and leave it in place.
#[test]
fn what_is_not_a_socket_at_a_name_is_refused_at_once_and_left_alone() {
    let (dir, rdv) = private_rendezvous("not-socket");
    let d = dir.path().to_path_buf();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        d.join("fifo").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RWXU,
        0,
    )
    .unwrap();
    symlink(d.join("fifo"), d.join("fifolink")).unwrap();
    std::fs::write(d.join("file"), b"x").unwrap();
    std::fs::create_dir(d.join("dir")).unwrap();
    let cfg = ChannelConfig {
        rendezvous: rdv,
        ..no_linger()
    };
    for (name, what) in [
        ("fifo", "a FIFO"),
        ("fifolink", "a symbolic link"),
        ("file", "a regular file"),
        ("dir", "a directory"),
    ] {
        let created = within(Duration::from_secs(10), "create", move || {
            Sender::<Message>::create(name, &cfg).map(|_| ())
        });
        match created {
            Err(CreateError::Untrusted(why)) => assert!(why.contains(what), "{why}"),
            other => panic!("create over {what}: {other:?}"),
        }
        let opened = within(Duration::from_secs(10), "open", move || {
            Receiver::<Message>::open_in(&rdv, name, None).map(|_| ())
        });
        match opened {
            Err(OpenError::Untrusted(why)) => assert!(why.contains(what), "{why}"),
            other => panic!("open of {what}: {other:?}"),
        }
        assert!(
            d.join(name).symlink_metadata().is_ok(),
            "{what} was removed"
        );
    }
}

/// A live creator whose channel header names a pid that does not exist: its socket is live,
/// so its name is never taken over or removed, and an opener refuses the channel (its server
/// is not the creator its header names). Once the creator is killed, the next open removes
/// the stale socket.
#[test]
fn a_live_creator_is_never_taken_for_stale_whatever_its_header_says() {
    let (name, guard) = named("bogus-pid");
    let mut creator = Peer::spawn(&["produce-hang", &name]);
    assert_eq!(creator.line(), "ready");
    let mem = channel_memfd(creator.pid(), &name).expect("the creator's memfd");
    let at = shm_ring::channel_layout(&ChannelConfig::default())
        .unwrap()
        .segment_wire
        .creator_pid;
    let hex: String = 0x7fff_fff0u32
        .to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (ok, _, err) =
        Peer::spawn(&["corrupt", &mem, &at.to_string(), &hex]).finish(Duration::from_secs(10));
    assert!(ok, "{err}");
    assert!(matches!(
        Sender::<Message>::create(&name, &no_linger()),
        Err(CreateError::AlreadyExists(_))
    ));
    match Receiver::<Message>::open(&name) {
        Err(OpenError::NotASegment(why)) => assert!(
            why.contains(&format!("served by pid {}", creator.pid()))
                && why.contains("names pid 2147483632"),
            "{why}"
        ),
        other => panic!("expected NotASegment, got {other:?}"),
    }
    assert!(
        socket_path(&name).exists(),
        "a live creator's socket was removed"
    );
    creator.kill();
    assert!(matches!(
        Receiver::<Message>::open(&name),
        Err(OpenError::NotFound(_))
    ));
    guard.assert_gone();
}

/// A creator killed after binding its socket and before serving it (the worst instant)
/// leaves a socket nobody listens on: the next create takes the name over. The kill closes the
/// creator's descriptors; here the listening socket is bound and closed the same way.
#[test]
fn a_creator_killed_between_bind_and_serve_leaves_the_name_free() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let (name, guard) = named("orphan");
    // The socket directory exists once a channel was made there.
    drop(Sender::<Message>::create(&name, &no_linger()).unwrap());
    let listener = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&listener, &SocketAddrUnix::new(socket_path(&name)).unwrap()).unwrap();
    rustix::net::listen(&listener, 4).unwrap();
    drop(listener); // what a SIGKILL does to it
    assert!(socket_path(&name).exists(), "the killed creator's socket");
    let tx = Sender::<Message>::create(&name, &no_linger())
        .expect("the name of a killed creator must not stay taken");
    let rx = Receiver::<Message>::open(&name).unwrap();
    assert_eq!(rx.producer_pid(), std::process::id());
    drop((rx, tx));
    guard.assert_gone();
}

/// Names are removed by inode, never by name alone: a sender whose socket was removed and
/// whose name a new sender took meanwhile leaves the new socket alone when dropped.
#[test]
fn a_name_is_removed_only_while_it_still_leads_to_the_same_socket() {
    let (name, guard) = named("reused");
    let old = Sender::<Message>::create(&name, &no_linger()).unwrap();
    std::fs::remove_file(socket_path(&name)).unwrap();
    let new = Sender::<Message>::create(&name, &no_linger()).unwrap();
    drop(old);
    assert!(
        socket_path(&name).exists(),
        "the old sender removed the new one's socket"
    );
    let mut rx = Receiver::<Message>::open(&name).expect("the new channel is still reachable");
    assert!(matches!(rx.try_recv(), Err(shm_ring::TryRecvError::Empty)));
    drop((rx, new));
    guard.assert_gone();
}
