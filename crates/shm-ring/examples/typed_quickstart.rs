//! The typed path between two processes: `[f32; 16]` values, one per message.
//!
//! ```text
//! cargo run --release -p shm-ring --example typed_quickstart -- recv demo &   # consumer
//! cargo run --release -p shm-ring --example typed_quickstart -- send demo 10000000
//! ```
//! The sender creates the channel `demo`, sends N values (value i holds i in every element) in
//! bursts of 64 with `send_batch`, and closes; the receiver (started before or after, within
//! the linger time) checks every value, and both print their rate. Without arguments it runs
//! both ends in one process, two threads, for a quick look.
use std::time::{Duration, Instant};

use shm_ring::{ChannelConfig, Receiver, RecvError, Sender};

type V = [f32; 16];

fn send(name: &str, n: u64) -> Result<(), shm_ring::Error> {
    let mut tx = Sender::<V>::create(name, &ChannelConfig::default())?;
    let t = Instant::now();
    let mut burst = Vec::with_capacity(64);
    let mut i = 0u64;
    while i < n {
        burst.clear();
        while burst.len() < 64 && i < n {
            burst.push([i as f32; 16]);
            i += 1;
        }
        tx.send_batch(&burst)?;
    }
    let s = t.elapsed().as_secs_f64();
    println!("sent {n} values in {s:.3} s: {:.2} M/s", n as f64 / s / 1e6);
    Ok(())
}

fn recv(name: &str) -> Result<(), shm_ring::Error> {
    let mut rx = Receiver::<V>::open_timeout(name, Duration::from_secs(30))?;
    let mut n = 0u64;
    let mut t = None;
    loop {
        match rx.recv() {
            Ok(v) => {
                t.get_or_insert_with(Instant::now);
                // f32 holds every integer below 2^24 exactly; the check covers that range.
                if n < 1 << 24 {
                    assert_eq!(v, [n as f32; 16], "value {n}");
                }
                n += 1;
            }
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let s = t.map_or(0.0, |t| t.elapsed().as_secs_f64());
    println!(
        "received {n} values in {s:.3} s: {:.2} M/s",
        n as f64 / s / 1e6
    );
    Ok(())
}

fn main() -> Result<(), shm_ring::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("send") => send(
            &args[1],
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1 << 20),
        ),
        Some("recv") => recv(&args[1]),
        _ => {
            let name = format!("typed-quickstart-{}", std::process::id());
            let consumer = std::thread::spawn({
                let name = name.clone();
                move || recv(&name)
            });
            send(&name, 1 << 20)?;
            consumer.join().expect("consumer thread")
        }
    }
}
