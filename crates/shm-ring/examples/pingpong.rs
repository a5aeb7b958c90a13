//! Round-trip latency of one 16-float message between two processes, next to a raw
//! futex-word ping-pong over shared memory in the same run.
//!
//! ```text
//! cargo run --release -p shm-ring --example pingpong -- [N] [PING_CPU PONG_CPU]
//! ```
//! Prints percentiles of N round trips (default 20000) for: `shm` (a self-describing message
//! with one `[16]` f32 array, default `WaitConfig`: spin, then sleep), `typed` (a
//! `Sender<[f32; 16]>`: one slot per value, no message encoding), `shm-sleep` (spin 0: every wait sleeps on the futex), `raw-spin` (two
//! processes spinning on one u32 each, PAUSE between loads) and `raw-futex` (the same words,
//! sleeping with `FUTEX_WAIT` / waking with `FUTEX_WAKE` every time).
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use shm_ring::{
    ChannelConfig, Message, MessageBuilder, Receiver, RecvError, RecvTimeoutError, Segment, Sender,
    WaitConfig,
};

const MODES: [&str; 5] = ["shm", "typed", "shm-sleep", "raw-spin", "raw-futex"];

fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        let _ = rustix::thread::sched_setaffinity(None, &set);
    }
}

fn wait_cfg(mode: &str) -> WaitConfig {
    WaitConfig {
        spin: if mode == "shm-sleep" {
            Duration::ZERO
        } else {
            WaitConfig::default().spin
        },
        ..WaitConfig::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pong") {
        return pong(&args[2], &args[3], args.get(4).and_then(|c| c.parse().ok()));
    }
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let ping_cpu = args.get(2).and_then(|a| a.parse().ok());
    let pong_cpu: Option<usize> = args.get(3).and_then(|a| a.parse().ok());
    pin(ping_cpu);
    for mode in MODES {
        let name = format!("pingpong-{}-{mode}", std::process::id());
        let mut rtt = if mode.starts_with("raw") {
            raw_ping(&name, mode, n, pong_cpu)?
        } else if mode == "typed" {
            typed_ping(&name, n, pong_cpu)?
        } else {
            shm_ping(&name, mode, n, pong_cpu)?
        };
        rtt.sort_unstable();
        let p = |q: f64| rtt[((rtt.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        println!(
            "{mode:10} round trip us: p50 {:7.3}  p90 {:7.3}  p99 {:7.3}  ({n} trips)",
            p(0.5),
            p(0.9),
            p(0.99)
        );
    }
    Ok(())
}

fn spawn_pong(mode: &str, name: &str, cpu: Option<usize>) -> std::io::Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["pong", mode, name]).stdout(Stdio::null());
    if let Some(c) = cpu {
        cmd.arg(c.to_string());
    }
    cmd.spawn()
}

fn shm_ping(
    name: &str,
    mode: &str,
    n: usize,
    cpu: Option<usize>,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let cfg = ChannelConfig {
        wait: wait_cfg(mode),
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&format!("{name}-a"), &cfg)?;
    let mut child = spawn_pong(mode, name, cpu)?;
    tx.wait_for_consumer(Duration::from_secs(10))
        .ok_or("no consumer attached within 10 s")?;
    let mut rx = Receiver::<Message>::open_timeout(&format!("{name}-b"), Duration::from_secs(10))?;
    rx.set_wait(wait_cfg(mode));
    let mut data = [1f32; 16];
    let mut out = Vec::with_capacity(n);
    let mut sum = 0f32;
    for i in 0..n + 1000 {
        data[0] = i as f32;
        let t0 = Instant::now();
        tx.send(MessageBuilder::new().array_slice("x", &[16], &data)?)?;
        rx.recv_batch(1, None, |m| {
            if let Ok(a) = m.record(0).and_then(|r| r.array::<f32>("x")) {
                sum += a[0];
            }
        })?;
        if i >= 1000 {
            out.push(t0.elapsed().as_nanos() as u64);
        }
    }
    drop(tx);
    child.wait()?;
    assert!(sum > 0.0);
    Ok(out)
}

fn pong(mode: &str, name: &str, cpu: Option<usize>) -> Result<(), Box<dyn std::error::Error>> {
    pin(cpu);
    if mode.starts_with("raw") {
        return raw_pong(name, mode);
    }
    if mode == "typed" {
        return typed_pong(name);
    }
    let cfg = ChannelConfig {
        wait: wait_cfg(mode),
        ..ChannelConfig::default()
    };
    let mut rx = Receiver::<Message>::open_timeout(&format!("{name}-a"), Duration::from_secs(10))?;
    rx.set_wait(wait_cfg(mode));
    let mut tx = Sender::<Message>::create(&format!("{name}-b"), &cfg)?;
    let mut data = [0f32; 16];
    loop {
        let got = rx.recv_batch(1, None, |m| {
            if let Ok(a) = m.record(0).and_then(|r| r.array::<f32>("x")) {
                for (d, s) in data.iter_mut().zip(a.iter()) {
                    *d = *s;
                }
            }
        });
        match got {
            Ok(_) => tx.send(MessageBuilder::new().array_slice("x", &[16], &data)?)?,
            Err(RecvTimeoutError::Failed(RecvError::Disconnected)) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The two words of the raw ping-pong, each on its own cache line pair.
fn words(seg: &Segment) -> (&AtomicU32, &AtomicU32) {
    // SAFETY: the segment is 4096 bytes; offsets 256 and 512 are 4-aligned and inside; both
    // processes only access these words atomically.
    unsafe {
        (
            &*seg.as_ptr().add(256).cast::<AtomicU32>(),
            &*seg.as_ptr().add(512).cast::<AtomicU32>(),
        )
    }
}

fn wait_for(word: &AtomicU32, want: u32, sleep: bool) {
    loop {
        let v = word.load(Ordering::Acquire);
        if v == want {
            return;
        }
        if sleep {
            let _ =
                rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), v, None);
        } else {
            std::hint::spin_loop();
        }
    }
}

fn post(word: &AtomicU32, v: u32, sleep: bool) {
    word.store(v, Ordering::Release);
    if sleep {
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), 1);
    }
}

fn raw_ping(
    name: &str,
    mode: &str,
    n: usize,
    cpu: Option<usize>,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let _ = name;
    let seg = Segment::anonymous(4096)?;
    seg.publish(7);
    let (a, b) = words(&seg);
    let sleep = mode == "raw-futex";
    // The child inherits a copy of the memfd (dup: without close-on-exec), named by number.
    let inherited = rustix::io::dup(seg.file())?;
    let fd_arg = format!("fd{}", std::os::fd::AsRawFd::as_raw_fd(&inherited));
    let mut child = spawn_pong(mode, &fd_arg, cpu)?;
    drop(inherited);
    wait_for(b, 1, false);
    let mut out = Vec::with_capacity(n);
    for i in 0..(n + 1000) as u32 {
        let t0 = Instant::now();
        post(a, i + 2, sleep);
        wait_for(b, i + 2, sleep);
        if i >= 1000 {
            out.push(t0.elapsed().as_nanos() as u64);
        }
    }
    post(a, u32::MAX, sleep);
    child.wait()?;
    Ok(out)
}

fn raw_pong(name: &str, mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    let fd: i32 = name.trim_start_matches("fd").parse()?;
    // SAFETY: the parent passed this descriptor (inherited, open, ours alone from here on).
    let owned = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    let seg = Segment::from_fd(owned, 7)?;
    let (a, b) = words(&seg);
    let sleep = mode == "raw-futex";
    post(b, 1, false);
    let mut seen = 0;
    loop {
        let v = loop {
            let v = a.load(Ordering::Acquire);
            if v != seen {
                break v;
            }
            if sleep {
                let _ =
                    rustix::thread::futex::wait(a, rustix::thread::futex::Flags::empty(), v, None);
            } else {
                std::hint::spin_loop();
            }
        };
        if v == u32::MAX {
            return Ok(());
        }
        seen = v;
        post(b, v, sleep);
    }
}

fn typed_ping(
    name: &str,
    n: usize,
    cpu: Option<usize>,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let mut tx = Sender::<[f32; 16]>::create(&format!("{name}-a"), &ChannelConfig::default())?;
    let mut child = spawn_pong("typed", name, cpu)?;
    let mut rx =
        Receiver::<[f32; 16]>::open_timeout(&format!("{name}-b"), Duration::from_secs(10))?;
    let mut data = [1f32; 16];
    let mut out = Vec::with_capacity(n);
    let mut sum = 0f32;
    for i in 0..n + 1000 {
        data[0] = i as f32;
        let t0 = Instant::now();
        tx.send(&data)?;
        sum += rx.recv()?[0];
        if i >= 1000 {
            out.push(t0.elapsed().as_nanos() as u64);
        }
    }
    drop(tx);
    child.wait()?;
    assert!(sum > 0.0);
    Ok(out)
}

fn typed_pong(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut rx =
        Receiver::<[f32; 16]>::open_timeout(&format!("{name}-a"), Duration::from_secs(10))?;
    let mut tx = Sender::<[f32; 16]>::create(&format!("{name}-b"), &ChannelConfig::default())?;
    loop {
        match rx.recv() {
            Ok(v) => tx.send(&v)?,
            Err(RecvError::Disconnected) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
