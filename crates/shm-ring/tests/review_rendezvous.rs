//! Review of named channels (issue 16), second pass: attacks by a process of the same user on
//! a name's server. Each test failed while its hole was open.
#![cfg(not(loom))]

mod common;

use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{open_fds, private_rendezvous, seqpacket, unique};
use rustix::net::SocketAddrUnix;
use shm_ring::{ChannelConfig, Message, Sender};
use shmpipe_test_kit::within;

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
    let tx = Sender::<Message>::create(&name, &cfg).unwrap();
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

/// Root runs with the `$XDG_RUNTIME_DIR` of another user (as `sudo` may leave it). That is not
/// root's runtime directory: its owner could rename the socket directory root made inside it
/// and make root's channels fail (an opener finds nothing). A `$XDG_RUNTIME_DIR` that is not
/// ours, or that others may write, is passed over (root then uses `/run/shmpipe`).
#[test]
fn another_users_xdg_runtime_dir_is_not_used() {
    const T: &str = "another_users_xdg_runtime_dir_is_not_used";
    if std::env::var("REVIEW_ROLE").as_deref() == Ok("xdg-victim") {
        return xdg_victim();
    }
    if !shmpipe_test_kit::is_root() {
        eprintln!("SKIPPED: needs root to make a directory of user nobody");
        return;
    }
    use std::io::{BufRead, Write};
    let xdg = shmpipe_test_kit::TempDir::new("rv-xdg");
    rustix::fs::chown(
        xdg.path(),
        Some(rustix::fs::Uid::from_raw(shmpipe_test_kit::NOBODY)),
        Some(rustix::fs::Gid::from_raw(shmpipe_test_kit::NOBODY)),
    )
    .unwrap();
    let name = unique("rv-xdg");
    let mut victim = shmpipe_test_kit::ChildGuard(
        shmpipe_test_kit::rerun_test(T)
            .env("REVIEW_ROLE", "xdg-victim")
            .env("REVIEW_NAME", &name)
            .env("XDG_RUNTIME_DIR", xdg.path())
            .env_remove("SHMPIPE_DIR")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(victim.stdout.take().unwrap());
    let mut said = String::new();
    while !said.starts_with("created") && out.read_line(&mut said).unwrap() > 0 {
        if !said.starts_with("created") {
            said.clear();
        }
    }
    // The owner of that directory moves whatever root made in it out of the way.
    let moved = std::process::Command::new("sh")
        .args(["-c", "mv \"$0/shmpipe\" \"$0/moved\" 2>/dev/null; true"])
        .arg(xdg.path())
        .uid(shmpipe_test_kit::NOBODY)
        .gid(shmpipe_test_kit::NOBODY)
        .status()
        .unwrap();
    assert!(moved.success());
    writeln!(victim.stdin.as_mut().unwrap(), "open").unwrap();
    let mut opened = String::new();
    out.read_line(&mut opened).unwrap();
    let _ = victim.wait();
    assert!(
        opened.starts_with("opened"),
        "root's channel in {said:?} after nobody's move: {opened:?}"
    );
}

fn xdg_victim() {
    use shm_ring::{Receiver, Rendezvous};
    use std::io::Write;
    let name = std::env::var("REVIEW_NAME").unwrap();
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let tx = Sender::<Message>::create(&name, &cfg).expect("create");
    let mut o = std::io::stdout();
    writeln!(
        o,
        "created in {}",
        Rendezvous::default().socket_dir().display()
    )
    .unwrap();
    o.flush().unwrap();
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    let r = Receiver::<Message>::open(&name);
    writeln!(
        o,
        "{}",
        if r.is_ok() {
            "opened".to_string()
        } else {
            format!("failed: {r:?}")
        }
    )
    .unwrap();
    o.flush().unwrap();
    drop((r, tx));
}
