//! The name server and its clients against hostile processes of the same user: a fake server
//! at a channel's name (a wrong greeting, no descriptor, several, a pipe, an unsealed memfd, a
//! message too long, no answer at all) gives the opener an error that names the channel and
//! the serving pid, within a bound, and leaks no descriptor; connectors that never read, or
//! write garbage, or flood the queue, block neither the server nor the creator.
#![cfg(not(loom))]

mod common;

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use common::{open_fds, private_rendezvous, seqpacket, unique};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix};
use shm_ring::{
    ChannelConfig, CreateError, Message, MessageBuilder, OpenError, Receiver, Rendezvous, Sender,
};
use shmpipe_test_kit::within;

const HELLO: &[u8; 16] = b"shmpipe-name-v1\0";

/// A fake server at `<dir>/<name>` that answers one connection with `bytes` and `fds` (or,
/// with `None`, accepts and never answers), on a thread; returns when it is listening.
fn fake_server(dir: &std::path::Path, name: &str, answer: Answer) -> std::thread::JoinHandle<()> {
    let listener = seqpacket();
    rustix::net::bind(&listener, &SocketAddrUnix::new(dir.join(name)).unwrap()).unwrap();
    rustix::net::listen(&listener, 4).unwrap();
    std::thread::spawn(move || {
        let conn = rustix::net::accept(&listener).unwrap();
        let Some((bytes, fds)) = answer else {
            std::thread::sleep(Duration::from_secs(8));
            return;
        };
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(250))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            assert!(anc.push(SendAncillaryMessage::ScmRights(&borrowed)));
        }
        let _ = rustix::net::sendmsg(
            &conn,
            &[IoSlice::new(&bytes)],
            &mut anc,
            SendFlags::NOSIGNAL,
        );
        // Keep the connection open until the opener is done with it.
        std::thread::sleep(Duration::from_millis(500));
    })
}

/// What a fake server answers: bytes and descriptors (`None`: nothing, ever).
type Answer = Option<(Vec<u8>, Vec<OwnedFd>)>;

fn memfd(sealed: bool) -> OwnedFd {
    let anon = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    if sealed {
        return anon.as_fd().try_clone_to_owned().unwrap();
    }
    // The same bytes in a memfd without seals.
    let f = rustix::fs::memfd_create("fake", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let mut bytes = vec![0u8; anon.segment().len()];
    std::os::unix::fs::FileExt::read_exact_at(anon.segment().file(), &mut bytes, 0).unwrap();
    let file = std::fs::File::from(f);
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
    file.into()
}

/// Opens `name` against a fake server answering `answer`; returns the error and how long it
/// took. No descriptor of ours may be left open afterwards.
fn open_against(answer: Answer) -> (String, Duration) {
    let (dir, rdv) = private_rendezvous("fake-server");
    let name = unique("fake");
    // The answer's descriptors go to the server thread, which closes them when done.
    let before = open_fds() - answer.as_ref().map_or(0, |(_, fds)| fds.len());
    let server = fake_server(dir.path(), &name, answer);
    let t0 = Instant::now();
    let err = within(Duration::from_secs(20), "open", move || {
        Receiver::<Message>::open_in(&rdv, &name, None).map(|_| ())
    })
    .expect_err("a fake server's answer was accepted");
    let took = t0.elapsed();
    server.join().unwrap();
    assert_eq!(open_fds(), before, "a descriptor leaked: {err}");
    (err.to_string(), took)
}

#[test]
fn malformed_answers_are_refused_with_the_channel_and_its_server_named() {
    let me = std::process::id();
    let cases: Vec<(&str, Answer, &str)> = vec![
        (
            "another greeting",
            Some((b"shmpipe-name-v9\0".to_vec(), vec![memfd(true)])),
            "not the greeting",
        ),
        (
            "no descriptor",
            Some((HELLO.to_vec(), vec![])),
            "with 0 descriptors",
        ),
        (
            "two descriptors",
            Some((HELLO.to_vec(), vec![memfd(true), memfd(true)])),
            "with 2 descriptors",
        ),
        (
            "two hundred descriptors",
            Some((HELLO.to_vec(), {
                let one = memfd(true);
                (0..200).map(|_| rustix::io::dup(&one).unwrap()).collect()
            })),
            "(truncated)",
        ),
        (
            "too long",
            Some(([HELLO.as_slice(), b"and more"].concat(), vec![memfd(true)])),
            "that are not the greeting",
        ),
        (
            "a pipe",
            Some((HELLO.to_vec(), vec![rustix::pipe::pipe().unwrap().0])),
            "is a FIFO, not a memfd",
        ),
        (
            "an unsealed memfd",
            Some((HELLO.to_vec(), vec![memfd(false)])),
            "instead of",
        ),
        (
            "a file",
            Some((
                HELLO.to_vec(),
                vec![std::fs::File::open("/proc/self/exe").unwrap().into()],
            )),
            "cannot be sealed",
        ),
    ];
    for (what, answer, expect) in cases {
        let (err, took) = open_against(answer);
        assert!(err.contains(expect), "{what}: {err}");
        assert!(
            err.contains("channel '") && err.contains(&format!("pid {me}")),
            "{what}: {err}"
        );
        assert!(!err.contains("name is taken"), "{what}: {err}");
        assert!(took < Duration::from_secs(2), "{what}: took {took:?}");
    }
}

#[test]
fn a_server_that_never_answers_is_a_timeout_within_the_bound() {
    let (err, took) = open_against(None);
    assert!(err.contains("timed out"), "{err}");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(8),
        "took {took:?}"
    );
}

/// A server that hands out the memfd of a real channel made by another process (which any
/// process of the user may get): the opener refuses it, since only a channel's creator serves
/// its name.
#[test]
fn a_server_that_is_not_the_channels_creator_is_refused() {
    let name = unique("real");
    let guard = common::name_guard(&[&name]);
    let mut creator = common::Peer::spawn(&["produce-hang", &name]);
    assert_eq!(creator.line(), "ready");
    let theirs = shm_ring::fetch_descriptor(&Rendezvous::default(), &name).unwrap();
    let (err, _) = open_against(Some((HELLO.to_vec(), vec![theirs])));
    assert!(
        err.contains(&format!("served by pid {}", std::process::id()))
            && err.contains(&format!("names pid {} as its creator", creator.pid())),
        "{err}"
    );
    creator.kill();
    drop(guard);
}

/// Connectors that never read, one that writes garbage, and a flood of connections that close
/// at once: the server answers a real opener meanwhile, and the creator's drop does not wait.
#[test]
fn hostile_connectors_block_neither_the_server_nor_the_creator() {
    let (dir, rdv) = private_rendezvous("flood");
    let name = unique("flood");
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg).unwrap();
    let path = SocketAddrUnix::new(dir.path().join(&name)).unwrap();
    let mut idle = Vec::new();
    for _ in 0..200 {
        let s = seqpacket();
        if rustix::net::connect(&s, &path).is_ok() {
            idle.push(s);
        }
    }
    let garbage = seqpacket();
    rustix::net::connect(&garbage, &path).unwrap();
    let _ = rustix::net::send(&garbage, &[0xff; 4096], SendFlags::NOSIGNAL);
    for _ in 0..500 {
        let s = seqpacket();
        let _ = rustix::net::connect(&s, &path);
    }
    let t0 = Instant::now();
    let mut rx = within(Duration::from_secs(10), "open", move || {
        Receiver::<Message>::open_in(&rdv, &name, Some(Duration::from_secs(5)))
    })
    .expect("a real opener is served");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    tx.send(MessageBuilder::new().tag(4)).unwrap();
    assert_eq!(rx.recv().unwrap().tag(), 4);
    let t0 = Instant::now();
    drop(tx);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        t0.elapsed()
    );
    drop((rx, idle, garbage));
    assert!(shmpipe_test_kit::entries_of(dir.path(), "").is_empty());
}

/// Open and create leave no descriptor behind, whatever they end with.
#[test]
fn opens_and_creates_leak_no_descriptor() {
    let (_dir, rdv) = private_rendezvous("fds");
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    };
    let before = open_fds();
    for i in 0..20 {
        let name = format!("c{i}");
        assert!(matches!(
            Receiver::<Message>::open_in(&rdv, &name, None),
            Err(OpenError::NotFound(_))
        ));
        let tx = Sender::<Message>::create(&name, &cfg).unwrap();
        assert!(matches!(
            Sender::<Message>::create(&name, &cfg),
            Err(CreateError::AlreadyExists(_))
        ));
        let rx = Receiver::<Message>::open_in(&rdv, &name, None).unwrap();
        assert!(matches!(
            Receiver::<Message>::open_in(&rdv, &name, None),
            Err(OpenError::Busy(_))
        ));
        drop((rx, tx));
    }
    assert_eq!(open_fds(), before);
}
