//! Producer half of the two-process example: sends 1M-element f32 arrays zero-copy.
//!
//! ```text
//! cargo run --release -p shm-ring --example producer -- demo 2000     # terminal 1
//! cargo run --release -p shm-ring --example consumer -- demo          # terminal 2
//! ```
//! Element `i` of message `s` is `(31 s + i) mod 2^24` (exact in f32), so the consumer can verify every
//! element of every array.
use std::process::ExitCode;
use std::time::{Duration, Instant};

use shm_ring::{ChannelConfig, Message, MessageBuilder, Sender, Transfer};

const ELEMS: usize = 1_000_000;
/// How long the producer waits for a consumer to attach.
const WAIT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("producer: {e}"); // Display, not Debug: the message says what to change
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "demo".into());
    let count: u64 = args.next().map_or(Ok(2000), |s| s.parse())?;
    let cfg = ChannelConfig {
        blocks: 8,
        block_size: ELEMS * 4,
        transfer: Transfer::ZeroCopy,
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg)?;
    if tx.consumer_pid().is_none() {
        eprintln!(
            "producer: channel '{name}' ready; waiting up to {}s for a consumer \
             (cargo run --release -p shm-ring --example consumer -- {name})",
            WAIT.as_secs()
        );
    }
    let pid = tx
        .wait_for_consumer(WAIT)
        .ok_or_else(|| format!("no consumer opened '{name}' within {}s", WAIT.as_secs()))?;
    eprintln!(
        "producer: consumer pid {pid} attached; sending {count} arrays of {ELEMS} f32 (zero-copy)"
    );
    let start = Instant::now();
    for s in 0..count {
        let loan = tx.loan::<f32>(&[ELEMS])?.write_with(|i| {
            ((s as u32).wrapping_mul(31).wrapping_add(i as u32) & 0xff_ffff) as f32
        });
        tx.send(
            MessageBuilder::new()
                .meta_i64("seq", s as i64)
                .array_loan("x", loan),
        )?;
    }
    // Wait until the consumer has handed back every block, so it has read everything.
    while tx.free_blocks()? < cfg.blocks as usize {
        tx.check_consumer()?;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "producer: sent {count} messages in {secs:.2} s ({:.0} msgs/s, {:.2} GB/s)",
        count as f64 / secs,
        count as f64 * (ELEMS * 4) as f64 / secs / 1e9
    );
    Ok(())
}
