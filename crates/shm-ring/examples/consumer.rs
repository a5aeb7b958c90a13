//! Consumer half of the two-process example (see `producer.rs`): verifies every element of
//! every array and prints messages/s and GB/s.
use std::time::{Duration, Instant};

use shm_ring::{Error, Receiver};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "demo".into());
    // Wait up to 30 s for the producer to create the channel.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rx = loop {
        match Receiver::open(&name) {
            Ok(rx) => break rx,
            Err(Error::NotFound(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(e.into()),
        }
    };
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
            Err(Error::Disconnected) => break,
            Err(e) => return Err(e.into()),
        };
        let t0 = *start.get_or_insert_with(Instant::now);
        let _ = t0;
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
