// Process A (crates/shm-ring/examples/quickstart_send.rs): creates the channel "frames" and
// sends one 1000 x 1000 f32 array, written in place in shared memory.
use shm_ring::{ChannelConfig, Message, MessageBuilder, Sender};

fn main() {
    if let Err(e) = run() {
        eprintln!("A: {e}"); // Display: says what to change
        std::process::exit(1);
    }
}

fn run() -> Result<(), shm_ring::Error> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "frames".into());
    let cfg = ChannelConfig {
        block_size: 4 << 20, // one 4 MB array per pool block
        ..Default::default()
    };
    let mut tx = Sender::<Message>::create(&name, &cfg)?;
    let loan = tx.loan::<f32>(&[1000, 1000])?.write_with(|i| i as f32); // fill shared memory in place
    tx.send(
        MessageBuilder::new()
            .meta_str("id", "frame-1")
            .array_loan("x", loan),
    )?;
    if tx.consumer_pid().is_none() {
        println!(
            "A: sent frame-1; waiting up to {:?} for B to open '{name}'",
            cfg.linger
        );
    }
    Ok(()) // dropping `tx` keeps the name until B has opened it (or `cfg.linger` ended)
}
