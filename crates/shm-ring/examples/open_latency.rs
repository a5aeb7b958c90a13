//! Latency of `Receiver::open` + the first message of a named channel, across two processes.
//!
//! `open_latency N` starts itself as a producer child, then N times: the child creates a fresh
//! named channel and sends one 16-float message into it; the parent times
//! `Receiver::<Message>::open(name)` + `recv()` of that message. Prints the median, p10 and p90 in
//! microseconds. (Run two builds alternately to compare them: the figures move with load.)
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};

fn produce() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ChannelConfig {
        linger: Duration::from_secs(5),
        ..ChannelConfig::default()
    };
    let mut held: Option<Sender> = None;
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let name = line?;
        drop(held.take());
        let mut tx = Sender::<Message>::create(&name, &cfg)?;
        tx.send(MessageBuilder::new().array_slice("x", &[16], &[1.5f32; 16])?)?;
        held = Some(tx);
        writeln!(out, "ready")?;
        out.flush()?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let first = args.next().unwrap_or_default();
    if first == "produce" {
        return produce();
    }
    let n: usize = first.parse().unwrap_or(200);
    let mut child = Command::new(std::env::current_exe()?)
        .arg("produce")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to = child.stdin.take().ok_or("stdin")?;
    let mut from = BufReader::new(child.stdout.take().ok_or("stdout")?);
    let mut us = Vec::with_capacity(n);
    let mut line = String::new();
    for i in 0..n {
        let name = format!("open-lat-{}-{i}", std::process::id());
        writeln!(to, "{name}")?;
        to.flush()?;
        line.clear();
        from.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("producer said {line:?}").into());
        }
        let t0 = Instant::now();
        let mut rx = Receiver::<Message>::open(&name)?;
        let m = rx.recv()?;
        let dt = t0.elapsed();
        assert_eq!(m.record(0)?.array::<f32>("x")?.sum(), 24.0);
        drop(m);
        drop(rx);
        us.push(dt.as_secs_f64() * 1e6);
    }
    drop(to);
    child.wait()?;
    us.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| us[((us.len() - 1) as f64 * p) as usize];
    println!(
        "open+first message, {n} channels: median {:.1} us, p10 {:.1} us, p90 {:.1} us",
        q(0.5),
        q(0.1),
        q(0.9)
    );
    Ok(())
}
