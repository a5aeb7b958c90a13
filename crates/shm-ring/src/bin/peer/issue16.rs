//! The peer's commands of issue 16: processes whose main thread ended, forks, another user
//! against a socket directory, a same-user process resizing a channel, and a 64 MiB pool
//! between two processes (see the command list in `shm-ring-peer.rs`).

use std::time::Duration;

use shm_ring::{ChannelConfig, Message, OpenError, Receiver, RecvTimeoutError, Sender};

use crate::process::{exit_child, exit_this_thread_only, fork_now, reap, say, stdin_lines, sum_x};

pub(super) fn hold_leaderless(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let mut rx = Receiver::<Message>::open_timeout(&arg(1), Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let n: usize = arg(2).parse().unwrap_or(1);
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(rx.recv().map_err(|e| e.to_string())?);
    }
    std::thread::spawn(move || {
        let _rx = rx;
        for line in stdin_lines() {
            if line == "check" {
                let sums: Vec<String> = held.iter().map(|m| sum_x(m).to_string()).collect();
                say(&format!("sums {}", sums.join(" ")));
            }
        }
        std::process::exit(0)
    });
    say("held");
    exit_this_thread_only()
}

pub(super) fn produce_leaderless(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let mut tx =
        Sender::<Message>::create(&arg(1), &ChannelConfig::default()).map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for line in stdin_lines() {
            if line == "send" {
                match tx.send(shm_ring::MessageBuilder::new().meta_i64("seq", 0)) {
                    Ok(()) => say("sent"),
                    Err(e) => say(&format!("send failed: {e}")),
                }
            }
        }
        std::process::exit(0)
    });
    say("ready");
    exit_this_thread_only()
}

pub(super) fn fork_drop(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let mut rx = Receiver::<Message>::open_timeout(&arg(1), Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let m = rx.recv().map_err(|e| e.to_string())?;
    say("got");
    match fork_now().ok_or("fork failed")? {
        0 => {
            drop(m);
            drop(rx);
            exit_child()
        }
        child => reap(child),
    }
    say("forked");
    for line in stdin_lines() {
        match line.as_str() {
            "check" => say(&format!("sum {}", sum_x(&m))),
            "recv" => match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(m) => say(&format!("tag {}", m.tag())),
                Err(e) => say(&format!("recv failed: {e}")),
            },
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn fork_send(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let mut tx =
        Sender::<Message>::create(&arg(1), &ChannelConfig::default()).map_err(|e| e.to_string())?;
    tx.wait_for_consumer(Duration::from_secs(10))
        .ok_or("no consumer attached within 10 s")?;
    match fork_now().ok_or("fork failed")? {
        0 => {
            match tx.send(shm_ring::MessageBuilder::new().meta_i64("seq", 99)) {
                Ok(()) => say("child sent"),
                Err(e) => say(&format!("child refused: {e}")),
            }
            exit_child()
        }
        child => reap(child),
    }
    tx.send(shm_ring::MessageBuilder::new().meta_i64("seq", 1))
        .map_err(|e| e.to_string())?;
    say("parent sent");
    for _ in stdin_lines() {}
    Ok(())
}

pub(super) fn fork_typed(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let mut tx = shm_ring::Sender::<[f32; 16]>::create(&arg(1), &cfg).map_err(|e| e.to_string())?;
    let mut rx = shm_ring::Receiver::<[f32; 16]>::open(&arg(1)).map_err(|e| e.to_string())?;
    tx.send(&[1.0; 16]).map_err(|e| e.to_string())?;
    tx.send(&[2.0; 16]).map_err(|e| e.to_string())?;
    let verdict = |r: Result<(), String>| r.map_or_else(|e| e, |()| "ok".into());
    match fork_now().ok_or("fork failed")? {
        0 => {
            let sent = tx.send(&[9.0; 16]).map_err(|e| e.to_string());
            say(&format!("child send: {}", verdict(sent)));
            let got = rx.try_recv().map(|_| ()).map_err(|e| e.to_string());
            say(&format!("child recv: {}", verdict(got)));
            drop(rx);
            drop(tx);
            exit_child()
        }
        child => reap(child),
    }
    let a = rx.recv().map_err(|e| e.to_string())?[0];
    let b = rx.recv().map_err(|e| e.to_string())?[0];
    say(&format!("parent got {a} {b}"));
    tx.send(&[3.0; 16]).map_err(|e| e.to_string())?;
    let c = rx.recv().map_err(|e| e.to_string())?[0];
    say(&format!("parent sent {c}"));
    Ok(())
}

/// What any process of the user can do to get a named channel's memfd: connect to its socket
/// and take the descriptor its server hands out (written by hand, as a hostile peer would).
fn take_descriptor(name: &str) -> Result<std::os::fd::OwnedFd, String> {
    use rustix::net::{
        AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketAddrUnix,
        SocketFlags, SocketType,
    };
    let path = shm_ring::Rendezvous::default().socket_dir().join(name);
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| e.to_string())?;
    let addr = SocketAddrUnix::new(&path).map_err(|e| e.to_string())?;
    rustix::net::connect(&s, &addr).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 64];
    rustix::net::recvmsg(
        &s,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| e.to_string())?;
    let fd = anc.drain().find_map(|m| match m {
        RecvAncillaryMessage::ScmRights(mut it) => it.next(),
        _ => None,
    });
    fd.ok_or_else(|| "no descriptor came".to_string())
}

pub(super) fn resize(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let target = arg(1);
    let fd: std::os::fd::OwnedFd = if target.starts_with('/') {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .map_err(|e| format!("{target}: {e}"))?
            .into()
    } else {
        take_descriptor(&target)?
    };
    let len = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?.st_size as u64;
    let verdict = |r: rustix::io::Result<()>| r.map_or_else(|e| e.to_string(), |()| "ok".into());
    say(&format!(
        "shrink: {}",
        verdict(rustix::fs::ftruncate(&fd, 0))
    ));
    say(&format!(
        "grow: {}",
        verdict(rustix::fs::ftruncate(&fd, len * 2))
    ));
    Ok(())
}

pub(super) fn squat(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let dir = std::path::PathBuf::from(arg(1));
    let name = arg(2);
    let verdict = |r: Result<(), String>| r.map_or_else(|e| e, |()| "ok".to_string());
    let sock = || {
        rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| e.to_string())
    };
    let at = |n: &str| SocketAddrUnix::new(dir.join(n)).map_err(|e| e.to_string());
    let connect =
        sock().and_then(|s| rustix::net::connect(&s, &at(&name)?).map_err(|e| e.to_string()));
    say(&format!("connect: {}", verdict(connect)));
    let bind = sock().and_then(|s| {
        rustix::net::bind(&s, &at(&format!("{name}-squat"))?).map_err(|e| e.to_string())
    });
    say(&format!("bind: {}", verdict(bind)));
    let file = std::fs::write(dir.join(format!("{name}-file")), b"x").map_err(|e| e.to_string());
    say(&format!("file: {}", verdict(file)));
    let parent = dir.parent().ok_or("no parent")?;
    let sibling = std::fs::create_dir(parent.join(format!("shmpipe-squat-{name}")))
        .map_err(|e| e.to_string());
    say(&format!("sibling: {}", verdict(sibling)));
    Ok(())
}

pub(super) fn fill_named(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let bytes: usize = arg(1).parse().map_err(|_| "bad size")?;
    let cfg = ChannelConfig {
        blocks: 16,
        block_size: bytes / 16,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&arg(2), &cfg).map_err(|e| e.to_string())?;
    tx.wait_for_consumer(Duration::from_secs(30))
        .ok_or("no consumer attached within 30 s")?;
    for i in 0..16u8 {
        let loan = tx.loan::<u8>(&[bytes / 16]).map_err(|e| e.to_string())?;
        tx.send(shm_ring::MessageBuilder::new().array_loan("x", loan.fill(i)))
            .map_err(|e| e.to_string())?;
    }
    say("sent 16");
    Ok(())
}

pub(super) fn drain_named(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    let mut rx = Receiver::<Message>::open_timeout(&arg(1), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let mut held = Vec::new();
    let mut total = 0usize;
    for i in 0..16u8 {
        let m = rx.recv().map_err(|e| e.to_string())?;
        let r = m.record(0).map_err(|e| e.to_string())?;
        let x = r.array::<u8>("x").map_err(|e| e.to_string())?;
        if x.iter().any(|&b| b != i) {
            return Err(format!("block {i} does not hold byte {i}"));
        }
        total += x.len();
        held.push(m);
    }
    say(&format!("verified {total}"));
    Ok(())
}

/// One of several new consumers racing for a dead consumer's claim: opens on "go".
pub(super) fn race_open(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
    say("ready");
    let mut lines = stdin_lines();
    if lines.next().as_deref() != Some("go") {
        return Err("expected go".into());
    }
    match Receiver::<Message>::open(&arg(1)) {
        Ok(mut rx) => {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(m) => say(&format!("opened {}", m.tag())),
                Err(RecvTimeoutError::Timeout) => say("opened none"),
                Err(e) => return Err(e.to_string()),
            }
            for _ in lines {}
            Ok(())
        }
        Err(OpenError::Busy(pid)) => {
            say(&format!("busy {pid}"));
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}
