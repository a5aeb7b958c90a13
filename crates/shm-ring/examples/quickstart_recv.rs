// Process B (crates/shm-ring/examples/quickstart_recv.rs): opens the channel "frames",
// waiting up to 10 s for A to create it, and reads the array in place, without a copy.
use std::time::Duration;

use shm_ring::{Message, Receiver};

fn main() {
    if let Err(e) = run() {
        eprintln!("B: {e}"); // Display: says what to change
        std::process::exit(1);
    }
}

fn run() -> Result<(), shm_ring::Error> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "frames".into());
    println!("B: waiting up to 10 s for A to create '{name}'");
    let mut rx = Receiver::<Message>::open_timeout(&name, Duration::from_secs(10))?;
    let msg = rx.recv()?; // a guard: the pool block goes back to A when it drops
    let rec = msg.record(0)?;
    let x = rec.array::<f32>("x")?; // an ndarray view of A's memory
    let id = rec.meta_str("id").unwrap_or("?");
    println!(
        "B: got {id}, shape {:?}, x[999, 999] = {}",
        x.shape(),
        x[[999, 999]]
    );
    Ok(())
}
