//! Consumer half of the two-process example (see `producer.rs`): verifies every element of
//! every array and prints messages/s and GB/s.
use std::process::ExitCode;
use std::time::{Duration, Instant};

use shm_ring::{Message, Receiver, RecvError};

/// How long the consumer waits for the producer to create the channel.
const WAIT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("consumer: {e}"); // Display, not Debug: the message says what to change
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "demo".into());
    eprintln!(
        "consumer: waiting up to {}s for a producer to create channel '{name}' \
         (cargo run --release -p shm-ring --example producer -- {name})",
        WAIT.as_secs()
    );
    let mut rx = Receiver::<Message>::open_timeout(&name, WAIT)?;
    eprintln!(
        "consumer: attached to '{name}' (producer pid {})",
        rx.producer_pid()
    );
    let mut n = 0u64;
    let mut bytes = 0u64;
    let mut start = None;
    loop {
        let msg = match rx.recv() {
            Ok(m) => m,
            Err(RecvError::Disconnected) => break,
            Err(e) => return Err(e.into()),
        };
        start.get_or_insert_with(Instant::now);
        let rec = msg.record(0)?;
        let s = rec.meta_i64("seq").ok_or("no seq")? as u64;
        if s != n {
            return Err(format!("expected message {n}, got {s}").into());
        }
        let x = rec.array::<f32>("x")?;
        let x = x.as_slice().ok_or("not contiguous")?;
        if let Some(i) = (0..x.len()).find(|&i| {
            x[i] != ((s as u32).wrapping_mul(31).wrapping_add(i as u32) & 0xff_ffff) as f32
        }) {
            return Err(format!("message {s}: element {i} is {} (wrong)", x[i]).into());
        }
        bytes += (x.len() * 4) as u64;
        n += 1;
    }
    let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    println!(
        "consumer: verified {n} arrays ({:.1} MB) in {secs:.2} s: {:.0} msgs/s, {:.2} GB/s",
        bytes as f64 / 1e6,
        n as f64 / secs,
        bytes as f64 / secs / 1e9
    );
    Ok(())
}
