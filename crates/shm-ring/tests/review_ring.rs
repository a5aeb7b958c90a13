//! Review of the trust-ring work (issue 16): reproducers of holes found in named channels,
//! liveness and fork handling. Each test asserts the behaviour the docs promise, so each one
//! FAILS while its hole is open (see the review report for what each failure looks like).
//! The tests that need another user (uid 65533/65534) or a private mount namespace skip
//! unless run as root (CI runs as root).
//!
//! Helper processes are this test binary run again (`rerun_test`) with `REVIEW_ROLE` set.
#![cfg(not(loom))]

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::named;
use shm_ring::{
    ChannelConfig, CreateError, LoanError, Message, MessageBuilder, OpenError, Receiver,
    Rendezvous, SendError, Sender, Transfer,
};
use shmpipe_test_kit::{ChildGuard, KillOnDrop, NOBODY, TempDir, is_root, rerun_test};

unsafe extern "C" {
    fn fork() -> i32;
    fn _exit(code: i32) -> !;
    fn setresuid(r: u32, e: u32, s: u32) -> i32;
    fn setresgid(r: u32, e: u32, s: u32) -> i32;
    fn setgroups(n: usize, list: *const u32) -> i32;
}

/// A third user, neither us nor the allowed peer.
const THIRD: u32 = 65533;
/// A group that is not the peer's.
const SHARED_GID: u32 = 4242;

fn role() -> Option<String> {
    std::env::var("REVIEW_ROLE").ok()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("helper needs ${k}"))
}

fn say(s: &str) {
    use std::io::Write;
    let mut o = std::io::stdout();
    let _ = writeln!(o, "{s}");
    let _ = o.flush();
}

fn no_linger(rdv: Rendezvous) -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    }
}

fn helper(test: &str, role: &str) -> Command {
    let mut c = rerun_test(test);
    c.env("REVIEW_ROLE", role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    c
}

/// The next line of a helper's stdout that is not libtest's own chatter ("running 1 test").
fn line(r: &mut impl BufRead) -> String {
    loop {
        let mut s = String::new();
        if r.read_line(&mut s).expect("read helper stdout") == 0 {
            return String::new();
        }
        let s = s.trim();
        if !s.is_empty() && !s.starts_with("running ") {
            return s.to_string();
        }
    }
}

fn leak(p: &Path) -> &'static Path {
    Box::leak(p.to_path_buf().into_boxed_path())
}

// ---------------------------------------------------------------------------------------
// R5. A fork()ed child (no exec) of a creator keeps the creator's listening socket. Once the
// creator is killed, the name is neither served nor stale: every open waits the 5 s answer
// bound and fails with Timeout, and every create of the name fails with AlreadyExists, for as
// long as the child lives (a multiprocessing/fork worker, a daemonised child...). The
// threat model lists only the opener's Timeout, with no test.

#[test]
fn review_a_forked_child_does_not_keep_a_dead_creators_name() {
    const T: &str = "review_a_forked_child_does_not_keep_a_dead_creators_name";
    if role().as_deref() == Some("fork-holder") {
        let _tx = Sender::<Message>::create(&env("REVIEW_NAME"), &no_linger(Rendezvous::default()))
            .expect("create");
        // SAFETY: the child only sleeps (nanosleep) and calls _exit: async-signal-safe.
        let pid = unsafe { fork() };
        if pid == 0 {
            std::thread::sleep(Duration::from_secs(30));
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { _exit(0) }
        }
        say(&format!("ready {pid}"));
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let (name, guard) = named("rv-forkhold");
    let mut creator = ChildGuard(
        helper(T, "fork-holder")
            .env("REVIEW_NAME", &name)
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(creator.stdout.take().unwrap());
    let ready = line(&mut out);
    let grandchild: u32 = ready
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("helper said {ready:?}"));
    let _kill_grandchild = KillOnDrop(vec![grandchild]);
    creator.kill(); // SIGKILL the creator, between two instructions
    let t0 = Instant::now();
    let opened = Receiver::<Message>::open(&name).map(|_| ());
    let open_took = t0.elapsed();
    let t0 = Instant::now();
    let created = Sender::<Message>::create(&name, &no_linger(Rendezvous::default())).map(|_| ());
    let create_took = t0.elapsed();
    drop(_kill_grandchild);
    let _ = shmpipe_test_kit::wait_gone(&[grandchild], Duration::from_secs(5));
    let _ = Rendezvous::default().remove_stale(&name);
    drop(guard);
    assert!(
        matches!(opened, Err(OpenError::NotFound(_)))
            && open_took < Duration::from_secs(1)
            && created.is_ok(),
        "a forked child holds the dead creator's socket: open {opened:?} after {open_took:?}; \
         create {created:?} after {create_took:?}"
    );
}

// ---------------------------------------------------------------------------------------
// R2. `Rendezvous::peer_uid` ("containers that share a volume but run as different users"):
// root creates a channel for user nobody in a directory root:nobody 0770. The socket file is
// made with the creator's umask (0755 under the usual 022), and connecting to a Unix socket
// needs write permission on it: the allowed peer cannot open. The existing test only has
// nobody create and root (who bypasses file permissions) open.

#[test]
fn review_the_allowed_peer_user_can_open_a_channel_made_for_it() {
    const T: &str = "review_the_allowed_peer_user_can_open_a_channel_made_for_it";
    if role().as_deref() == Some("peer-open") {
        let dir = std::path::PathBuf::from(env("REVIEW_DIR"));
        let rdv = Rendezvous {
            dir: Some(leak(&dir)),
            peer_uid: Some(0),
        };
        match Receiver::<Message>::open_in(&rdv, "shared", None) {
            Ok(mut rx) => say(&format!("opened, tag {:?}", rx.recv().map(|m| m.tag()))),
            Err(e) => say(&format!("open failed: {e}")),
        }
        return;
    }
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a peer as uid {NOBODY}");
        return;
    }
    let dir = TempDir::new("rv-peer");
    rustix::fs::chown(
        dir.path(),
        Some(rustix::fs::Uid::ROOT),
        Some(rustix::fs::Gid::from_raw(NOBODY)),
    )
    .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
    let rdv = Rendezvous {
        dir: Some(leak(dir.path())),
        peer_uid: Some(NOBODY),
    };
    let mut tx = Sender::<Message>::create("shared", &no_linger(rdv)).expect("create for the peer");
    tx.send(MessageBuilder::new().tag(5)).unwrap();
    let mode = std::fs::symlink_metadata(dir.path().join("shared"))
        .unwrap()
        .mode();
    let out = helper(T, "peer-open")
        .env("REVIEW_DIR", dir.path())
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    drop(tx);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("opened, tag Ok(5)"),
        "the allowed peer (uid {NOBODY}) could not open (socket mode {:o}): {said}",
        mode & 0o7777
    );
}

// ---------------------------------------------------------------------------------------
// R1. With `peer_uid` set, the socket directory may have group permissions, "group of that
// user" says the doc; the code accepts any group. A third user (neither us nor the peer) in
// that group removes our live channel's socket and squats the name with a FIFO.

#[test]
fn review_a_third_user_in_the_directorys_group_cannot_touch_our_names() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to run a process as uid {THIRD}");
        return;
    }
    let dir = TempDir::new("rv-group");
    rustix::fs::chown(
        dir.path(),
        Some(rustix::fs::Uid::ROOT),
        Some(rustix::fs::Gid::from_raw(SHARED_GID)),
    )
    .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
    let rdv = Rendezvous {
        dir: Some(leak(dir.path())),
        peer_uid: Some(NOBODY),
    };
    // The create is where a refusal of this directory would come.
    let tx = match Sender::<Message>::create("victim", &no_linger(rdv)) {
        Err(CreateError::Untrusted(why)) => {
            eprintln!("refused as it should be: {why}");
            return;
        }
        other => other.expect("create"),
    };
    let sock = dir.path().join("victim");
    let out = Command::new("sh")
        .args([
            "-c",
            &format!("rm -f {0} && mkfifo {0} && echo done", sock.display()),
        ])
        .uid(THIRD)
        .gid(SHARED_GID)
        .output()
        .unwrap();
    let opened = Receiver::<Message>::open_in(&rdv, "victim", None).map(|_| ());
    drop(tx);
    let said = String::from_utf8_lossy(&out.stdout);
    let kind = std::fs::symlink_metadata(&sock).map(|m| m.file_type());
    assert!(
        !said.contains("done"),
        "uid {THIRD} (group {SHARED_GID}, not the peer's) replaced our live socket by a FIFO \
         ({kind:?}); our open now says: {opened:?}"
    );
}

// ---------------------------------------------------------------------------------------
// R3. "Never take a live peer for a dead one." On a /proc mounted with hidepid=2 (hardened
// hosts; systemd's ProtectProc=invisible), another user's processes are invisible. The
// producer (uid 65534) judges the claim of its live consumer (uid 65533, allowed as a peer,
// here through an anonymous channel's descriptor) by `/proc/<pid>`: NotFound => Watch::Dead
// (`channel/sender/watch.rs`, judge_claim), then reclaims and reuses the block the consumer
// still reads.

#[test]
fn review_a_live_consumer_hidden_by_hidepid_is_not_taken_for_dead() {
    const T: &str = "review_a_live_consumer_hidden_by_hidepid_is_not_taken_for_dead";
    match role().as_deref() {
        Some("hidepid-producer") => return hidepid_producer(T),
        Some("hidepid-consumer") => return hidepid_consumer(),
        _ => {}
    }
    if !is_root() {
        eprintln!("SKIPPED: needs root for a private /proc mount and two other users");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t proc -o hidepid=2 proc /proc && exec \"$0\" --exact \"$1\" --nocapture",
        ])
        .arg(&exe)
        .arg(T)
        .env("REVIEW_ROLE", "hidepid-producer")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let verdict = said
        .lines()
        .find(|l| l.starts_with("verdict "))
        .unwrap_or_else(|| {
            panic!(
                "no verdict: {said}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(
        verdict, "verdict loan Timeout, consumer sum 1000",
        "the producer took its live consumer for dead: {said}"
    );
}

fn hidepid_producer(test: &str) {
    let cfg = ChannelConfig {
        blocks: 1,
        block_size: 64 << 10,
        transfer: Transfer::ZeroCopy,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::anonymous(&cfg).unwrap();
    let inherit = rustix::io::dup(tx.as_fd()).unwrap(); // dup: no close-on-exec
    let mut consumer = ChildGuard(
        helper(test, "hidepid-consumer")
            .env("REVIEW_FD", inherit.as_raw_fd().to_string())
            .uid(THIRD)
            .gid(THIRD)
            .spawn()
            .unwrap(),
    );
    drop(inherit);
    // Become user nobody: the consumer (uid 65533) is now hidden from us by hidepid=2.
    // SAFETY: plain system calls through glibc, which applies them to every thread.
    unsafe {
        assert_eq!(setgroups(0, std::ptr::null()), 0);
        assert_eq!(setresgid(NOBODY, NOBODY, NOBODY), 0);
        assert_eq!(setresuid(NOBODY, NOBODY, NOBODY), 0);
    }
    let cpid = consumer.id();
    say(&format!(
        "consumer {cpid} visible to us: {}",
        Path::new(&format!("/proc/{cpid}")).exists()
    ));
    let mut out = BufReader::new(consumer.stdout.take().unwrap());
    assert_eq!(line(&mut out), "attached");
    let loan = tx.loan::<u32>(&[1000]).unwrap().fill(1);
    tx.send(MessageBuilder::new().array_loan("x", loan))
        .unwrap();
    assert_eq!(line(&mut out), "got");
    // The consumer holds the only block: a loan must wait (Timeout), the consumer is alive.
    let second = tx.loan_timeout::<u32>(&[1000], Duration::from_millis(500));
    let what = match &second {
        Ok(_) => "Ok".to_string(),
        Err(LoanError::Timeout) => "Timeout".to_string(),
        Err(LoanError::Send(SendError::PeerDied { .. })) => "PeerDied".to_string(),
        Err(e) => format!("{e}"),
    };
    say(&format!(
        "second loan: {second:?}",
        second = second.as_ref().map(|_| ())
    ));
    drop(second);
    if what == "PeerDied" {
        // The block came back: fill it with 7s while the consumer still reads it.
        if let Ok(l) = tx.loan::<u32>(&[1000]) {
            let _ = tx.send(MessageBuilder::new().array_loan("x", l.fill(7)));
        }
    }
    {
        use std::io::Write;
        let stdin = consumer.stdin.as_mut().unwrap();
        writeln!(stdin, "check").unwrap();
        stdin.flush().unwrap();
    }
    let sum = line(&mut out);
    say(&format!("verdict loan {what}, consumer {sum}"));
}

fn hidepid_consumer() {
    let fd: i32 = env("REVIEW_FD").parse().unwrap();
    // SAFETY: the descriptor was left open for us by our parent (not close-on-exec) and is
    // owned by nobody else in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut rx = Receiver::<Message>::from_fd(fd).expect("attach");
    say("attached");
    let m = rx.recv().expect("recv");
    say("got");
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    let sum: u64 = m
        .record(0)
        .unwrap()
        .array::<u32>("x")
        .unwrap()
        .iter()
        .map(|&v| v as u64)
        .sum();
    say(&format!("sum {sum}"));
}

// ---------------------------------------------------------------------------------------
// R6. A test hook ships in the library: any process whose environment has
// SHM_RING_TEST_KILL_AFTER_BIND=<name> SIGKILLs itself in `Sender::<Message>::create(<name>)`
// (`rendezvous/server.rs`, test_hook_kill_after_bind), and every named create pays an
// environment lookup.

#[test]
fn review_the_library_has_no_self_kill_hook() {
    const T: &str = "review_the_library_has_no_self_kill_hook";
    if role().as_deref() == Some("hook") {
        let tx = Sender::<Message>::create(&env("REVIEW_NAME"), &no_linger(Rendezvous::default()));
        say(&format!("created: {}", tx.is_ok()));
        return;
    }
    let (name, guard) = named("rv-hook");
    let out = helper(T, "hook")
        .env("REVIEW_NAME", &name)
        .env("SHM_RING_TEST_KILL_AFTER_BIND", &name)
        .output()
        .unwrap();
    let _ = Rendezvous::default().remove_stale(&name);
    drop(guard);
    assert_eq!(
        out.status.signal(),
        None,
        "Sender::create killed its own process: {:?}",
        out.status
    );
}

// ---------------------------------------------------------------------------------------
// R8. The socket directory "is opened with O_DIRECTORY | O_NOFOLLOW and refused if a symlink"
// (named_security::a_socket_directory_that_is_a_symlink_or_not_a_directory_is_refused). A
// path with a trailing '/' (or '/.') resolves the symlink anyway: `SHMPIPE_DIR=/path/link/`.

#[test]
fn review_a_trailing_slash_does_not_get_a_symlinked_directory_past_the_check() {
    let target = TempDir::new("rv-slash");
    std::fs::set_permissions(target.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = target.path().with_extension("link");
    std::os::unix::fs::symlink(target.path(), &link).unwrap();
    let mut results = Vec::new();
    for suffix in ["/", "/."] {
        let p = std::path::PathBuf::from(format!("{}{suffix}", link.display()));
        let rdv = Rendezvous {
            dir: Some(leak(&p)),
            ..Rendezvous::default()
        };
        let r = Sender::<Message>::create("x", &no_linger(rdv)).map(|_| ());
        results.push((suffix, r));
    }
    let _ = std::fs::remove_file(&link);
    for (suffix, r) in results {
        assert!(
            matches!(&r, Err(CreateError::Untrusted(why)) if why.contains("symbolic link")),
            "a symlinked socket directory given as 'link{suffix}' was used: {r:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// R7 (suspicion tried). fork.rs: "To use a channel in a child, open it there". A process with
// another thread opening channels forks; the child opens a channel of its own. The child
// deadlocks if the fork came while the other thread held OWN_RECEIVERS (a process-wide
// std Mutex in channel/mod.rs, taken at every attach and drop of a Receiver).

#[test]
fn review_a_forked_child_can_open_a_channel_while_the_parent_opens_others() {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammers: Vec<_> = (0..2).map(|_| hammer_own_receivers(stop.clone())).collect();
    std::thread::sleep(Duration::from_millis(100));
    let (mut hung, mut ok, mut other) = (0, 0, 0);
    let mut stacks = String::new();
    let forks: u32 = std::env::var("REVIEW_FORKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1500);
    for _ in 0..forks {
        let pid = fork_a_channel_opener();
        match wait_up_to(pid, Duration::from_secs(3)).map(|st| st.exit_status()) {
            Some(Some(0)) => ok += 1,
            Some(_) => other += 1,
            None => {
                hung += 1;
                if stacks.is_empty() {
                    stacks = stack_of(pid);
                }
                shmpipe_test_kit::signal(pid as u32, rustix::process::Signal::KILL);
                let p = rustix::process::Pid::from_raw(pid);
                let _ = rustix::process::waitpid(p, rustix::process::WaitOptions::empty());
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hammers {
        h.join().unwrap();
    }
    eprintln!("forked children: {ok} ok, {hung} hung, {other} other");
    assert_eq!(
        hung, 0,
        "{hung} of {forks} forked children hung ({ok} ok, {other} other); a hung child:\n{stacks}"
    );
}

/// A thread that attaches receivers to a channel of its own, over and over, until `stop`: it
/// takes OWN_RECEIVERS all the time.
fn hammer_own_receivers(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let tx = Sender::<Message>::anonymous(&ChannelConfig::default()).unwrap();
        let _first =
            Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // Busy: the attach pushes and pops our entry under OWN_RECEIVERS.
            let _ = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap());
        }
    })
}

/// Forks a child that makes a channel, opens it and exits: 0 if both worked, 2 if the open
/// failed, 3 if the create did. Returns the child's pid.
fn fork_a_channel_opener() -> i32 {
    // SAFETY: the child only makes a channel, opens it and _exits (a hang is bounded by
    // the parent, which SIGKILLs it after 3 s).
    let pid = unsafe { fork() };
    if pid == 0 {
        let code = match Sender::<Message>::anonymous(&ChannelConfig::default()) {
            Ok(tx) => {
                match Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap()) {
                    Ok(_) => 0,
                    Err(_) => 2,
                }
            }
            Err(_) => 3,
        };
        // SAFETY: ends the forked child without running the parent's destructors.
        unsafe { _exit(code) }
    }
    pid
}

/// How child `pid` ended, or `None` if it still runs after `timeout` (it is left running).
fn wait_up_to(pid: i32, timeout: Duration) -> Option<rustix::process::WaitStatus> {
    let p = rustix::process::Pid::from_raw(pid);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((_, st)) =
            rustix::process::waitpid(p, rustix::process::WaitOptions::NOHANG).unwrap()
        {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The top frames of the stack of (hung) process `pid`, from gdb (empty without gdb).
fn stack_of(pid: i32) -> String {
    let bt = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-ex", "bt"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    bt.lines()
        .filter(|l| l.starts_with('#'))
        .take(14)
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------
// R9. An opener that connects just before the creator's Sender is dropped (linger zero, or
// the linger ending) is reset by the closing listener: `fetch` calls that a "malformed
// answer" of a live process and `open_timeout` gives up at once with NotASegment ("it is not
// a shm-ring Sender of this version ... or not a channel at all") instead of NotFound (and
// retrying until its timeout). Expected outcomes here: Ok or NotFound only.

#[test]
fn review_an_open_racing_a_dropped_sender_is_not_a_malformed_answer() {
    let (_dir, rdv) = common::private_rendezvous("rv-race");
    let mut tally = std::collections::BTreeMap::<String, u32>::new();
    let mut example = None;
    for i in 0..200u32 {
        let tx = Sender::<Message>::create("race", &no_linger(rdv)).unwrap();
        let opener = std::thread::spawn(move || {
            Receiver::<Message>::open_in(&rdv, "race", Some(Duration::from_millis(300))).map(|_| ())
        });
        // Give the opener a moment to connect, then drop the sender under it.
        std::thread::sleep(Duration::from_micros(u64::from(i % 20) * 25));
        drop(tx);
        let r = opener.join().unwrap();
        let kind = match &r {
            Ok(()) => "Ok".to_string(),
            Err(OpenError::NotFound(_)) => "NotFound".to_string(),
            Err(e) => {
                example.get_or_insert_with(|| e.to_string());
                format!("{e:?}").split('(').next().unwrap().to_string()
            }
        };
        *tally.entry(kind).or_default() += 1;
    }
    let bad: u32 = tally
        .iter()
        .filter(|(k, _)| *k != "Ok" && *k != "NotFound")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(bad, 0, "outcomes {tally:?}; e.g. {example:?}");
}

// ---------------------------------------------------------------------------------------
// R11. A name's server in a pid namespace the opener cannot see (a container that shares only
// the socket directory's volume): SO_PEERCRED gives pid 0, which rustix's `socket_peercred`
// turned into a non-zero pid type (undefined behaviour), and the open failed with a message
// about the header's creator. It must be refused, naming the cause.

#[test]
fn review_a_server_in_another_pid_namespace_is_refused_naming_the_cause() {
    const T: &str = "review_a_server_in_another_pid_namespace_is_refused_naming_the_cause";
    if role().as_deref() == Some("pidns-open") {
        let dir = std::path::PathBuf::from(env("REVIEW_DIR"));
        let rdv = Rendezvous {
            dir: Some(leak(&dir)),
            ..Rendezvous::default()
        };
        match Receiver::<Message>::open_in(&rdv, "ns", None) {
            Ok(_) => say("opened"),
            Err(e) => say(&format!("refused: {e}")),
        }
        return;
    }
    if !is_root() {
        eprintln!("SKIPPED: needs root for a new pid namespace");
        return;
    }
    let (dir, rdv) = common::private_rendezvous("rv-pidns");
    let tx = Sender::<Message>::create("ns", &no_linger(rdv)).unwrap();
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", T, "--nocapture"])
        .env("REVIEW_ROLE", "pidns-open")
        .env("REVIEW_DIR", dir.path())
        .output()
        .unwrap();
    drop(tx);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("refused:") && said.contains("pid namespace"),
        "an opener in another pid namespace: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
