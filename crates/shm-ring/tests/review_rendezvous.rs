//! Review of named channels (issue 16), second pass: attacks by a process of the same user on
//! a name's server. Each test failed while its hole was open.
#![cfg(not(loom))]

mod common;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{private_rendezvous, unique};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use shm_ring::{ChannelConfig, Sender};
use shmpipe_test_kit::within;

fn seqpacket() -> OwnedFd {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// Threads that connect to a name's socket and close at once, without pause, while the
/// creator drops its sender: the server thread must still see its stop signal, so the drop
/// returns within its bound (it joins that thread), the name is gone, and no descriptor of the
/// server (listener, connections, wake-up pipe, memfd) is left open.
#[test]
fn a_flood_of_connections_does_not_hold_the_senders_drop() {
    let (dir, rdv) = private_rendezvous("rv-flood");
    let name = unique("rv-flood");
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    };
    let fds_before = open_fds();
    let tx = Sender::create(&name, &cfg).unwrap();
    let path = SocketAddrUnix::new(dir.path().join(&name)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..3)
        .map(|_| {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let s = seqpacket();
                    if rustix::net::connect(&s, &path).is_ok() {
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    within(Duration::from_secs(20), "drop", move || drop(tx));
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let connects: u64 = flooders.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(
        took < Duration::from_secs(3),
        "the sender's drop took {took:?} under a flood of {connects} connections"
    );
    assert!(shmpipe_test_kit::entries_of(dir.path(), "").is_empty());
    assert_eq!(
        open_fds(),
        fds_before,
        "descriptors left open by the server"
    );
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
