//! Anonymous channels (memfds) are sealed against shrinking and growing once laid out, so a
//! peer cannot truncate them under the other side (no SIGBUS), and an opener refuses a
//! descriptor that is not sealed.
#![cfg(not(loom))]

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::io::Errno;
use shm_ring::{ChannelConfig, Error, Message, MessageBuilder, OpenError, Receiver, Sender};
use shmpipe_test_kit::{in_small_dev_shm, is_root};

fn send_one(tx: &mut Sender, v: f32) {
    let data = [v; 16];
    tx.send(
        MessageBuilder::new()
            .array_slice("x", &[16], &data)
            .unwrap(),
    )
    .unwrap();
}

fn first(rx: &mut Receiver) -> Result<f32, Error> {
    first_within(rx, Duration::from_secs(2))
}

fn first_within(rx: &mut Receiver, limit: Duration) -> Result<f32, Error> {
    let m = rx.recv_timeout(limit)?;
    let r = m.record(0)?;
    let x = r.array::<f32>("x")?;
    Ok(x[[0]])
}

/// A second descriptor of the sender's memfd, as a child would receive it.
fn share(tx: &Sender) -> OwnedFd {
    tx.as_fd().try_clone_to_owned().unwrap()
}

#[test]
fn anonymous_channel_carries_the_three_seals() {
    let tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    let seals = rustix::fs::fcntl_get_seals(tx.as_fd()).unwrap();
    let want = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
    assert!(seals.contains(want), "seals {seals:?}, want {want:?}");
    // Writes stay allowed: the producer fills the pool in place.
    assert!(!seals.contains(SealFlags::WRITE));
}

#[test]
fn a_peer_cannot_truncate_or_grow_a_sealed_channel() {
    let mut tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::from_fd(share(&tx)).unwrap();
    send_one(&mut tx, 1.0);
    // The hostile peer: it holds the descriptor and tries to cut the segment short (which,
    // unsealed, makes the consumer's next touch of the lost pages a SIGBUS) or to grow it.
    let peer = share(&tx);
    let len = rustix::fs::fstat(&peer).unwrap().st_size as u64;
    assert_eq!(rustix::fs::ftruncate(&peer, 0), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(&peer, len / 2), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(&peer, len * 2), Err(Errno::PERM));
    assert_eq!(rustix::fs::fstat(&peer).unwrap().st_size as u64, len);
    // Another process of ours reaching the memfd through /proc/<pid>/fd: refused too.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&peer);
    let out = std::process::Command::new("truncate")
        .args(["-s", "0", &format!("/proc/{}/fd/{fd}", std::process::id())])
        .output()
        .expect("run truncate");
    assert!(
        !out.status.success(),
        "truncate from another process succeeded"
    );
    assert_eq!(rustix::fs::fstat(&peer).unwrap().st_size as u64, len);
    // The consumer keeps working.
    assert_eq!(first(&mut rx).unwrap(), 1.0);
    send_one(&mut tx, 2.0);
    assert_eq!(first(&mut rx).unwrap(), 2.0);
}

/// Hole punching is not stopped by SHRINK/GROW seals (only F_SEAL_WRITE, which would also stop
/// the producer, stops it). On a memfd a punched page reads back as zeros and is allocated
/// again on the next write: the same as a peer writing zeros. The consumer must get data or an
/// error, never a crash.
#[test]
fn punched_holes_read_as_zeros_and_give_data_or_an_error() {
    let mut tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    let mut rx = Receiver::<Message>::from_fd(share(&tx)).unwrap();
    send_one(&mut tx, 1.0);
    let peer = share(&tx);
    let len = rustix::fs::fstat(&peer).unwrap().st_size as u64;
    let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    // What the kernel does: the punch is allowed and the size is unchanged.
    rustix::fs::fallocate(&peer, punch, 0, len).unwrap();
    assert_eq!(rustix::fs::fstat(&peer).unwrap().st_size as u64, len);
    let mut page = [0xffu8; 64];
    rustix::io::pread(&peer, &mut page, 0).unwrap();
    assert_eq!(page, [0u8; 64], "a punched page reads back as zeros");
    // Every receive ends promptly in data or an error (the ring header is now all zeros).
    let limit = Duration::from_millis(200);
    for _ in 0..3 {
        let _ = first_within(&mut rx, limit);
    }
    let _ = tx.try_send(MessageBuilder::new().meta_i64("i", 1));
    let _ = first_within(&mut rx, limit);
}

/// Copies a sealed channel into a fresh memfd without seals: every byte is valid, only the
/// seals are missing, and that alone must be refused.
#[test]
fn from_fd_refuses_an_unsealed_copy() {
    let tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    let src = share(&tx);
    let len = rustix::fs::fstat(&src).unwrap().st_size as usize;
    let mut bytes = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(&File::from(src), &mut bytes, 0).unwrap();
    let copy = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
    let copy = File::from(copy);
    std::os::unix::fs::FileExt::write_all_at(&copy, &bytes, 0).unwrap();
    match Receiver::<Message>::from_fd(copy.into()) {
        Err(OpenError::NotASegment(why)) => assert!(why.contains("seal"), "{why}"),
        other => panic!("expected NotASegment naming the seals, got {other:?}"),
    }
    // The sealed original opens fine.
    Receiver::<Message>::from_fd(share(&tx)).unwrap();
}

#[test]
fn from_fd_refuses_a_sealed_memfd_of_the_wrong_size() {
    let tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
    let src = File::from(share(&tx));
    let len = src.metadata().unwrap().len() as usize;
    let mut bytes = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(&src, &mut bytes, 0).unwrap();
    let copy =
        rustix::fs::memfd_create("short", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    let copy = File::from(copy);
    // One page short of what the header says.
    std::os::unix::fs::FileExt::write_all_at(&copy, &bytes[..len - 4096], 0).unwrap();
    rustix::fs::fcntl_add_seals(&copy, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .unwrap();
    assert!(matches!(
        Receiver::<Message>::from_fd(copy.into()),
        Err(OpenError::NotASegment(_) | OpenError::Corrupt(_))
    ));
}

/// Channels are not bounded by the size of the `/dev/shm` mount: in a private mount namespace
/// with a 16 MB tmpfs on `/dev/shm` (a small container), a 64 MiB anonymous channel and a
/// 64 MiB named one are each reserved and written end to end (every block loaned and filled),
/// and nothing appears in `/dev/shm`.
#[test]
fn a_64_mib_channel_fills_under_a_16_mb_dev_shm() {
    if !is_root() {
        eprintln!("SKIPPED: needs root for a private mount namespace (unshare)");
        return;
    }
    let peer = env!("CARGO_BIN_EXE_shm-ring-peer");
    let name = format!("t-big-{}", std::process::id());
    let script = format!(
        "{peer} fill-anon 67108864 && {peer} create 67108864 {name} \
         && echo \"shm entries: $(ls -A /dev/shm | wc -l)\""
    );
    let (status, stdout, stderr) = in_small_dev_shm(&script);
    assert!(status.success(), "{stdout} {stderr}");
    assert!(
        stdout.contains("filled 67108864"),
        "the 64 MiB anonymous channel should fill: {stdout} {stderr}"
    );
    assert!(
        stdout.contains("created") && stdout.contains("loaned 16"),
        "the 64 MiB named channel should fill: {stdout} {stderr}"
    );
    assert!(stdout.contains("shm entries: 0"), "{stdout} {stderr}");
}

/// Issue 16: a refusal of a passed descriptor says what the descriptor is and what to pass,
/// in terms of descriptors: a pipe, a disk file and an unsealed memfd were once all told "the
/// name is taken by something else: pick another channel name".
#[test]
fn from_fd_refusals_speak_of_the_descriptor_not_of_a_name() {
    let (pipe, _w) = rustix::pipe::pipe().unwrap();
    let file: OwnedFd = File::open("/proc/self/exe").unwrap().into();
    let memfd = rustix::fs::memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
    for (fd, what) in [
        (pipe, "is a FIFO, not a memfd"),
        (file, "cannot be sealed"),
        (memfd, "instead of"),
    ] {
        let msg = Receiver::<Message>::from_fd(fd)
            .expect_err(what)
            .to_string();
        assert!(msg.contains(what), "{msg}");
        assert!(msg.contains("the descriptor"), "{msg}");
        assert!(msg.contains("Sender::anonymous"), "{msg}");
        assert!(!msg.contains("name"), "{msg}");
    }
}
