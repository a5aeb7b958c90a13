//! Measures where zero-copy starts to beat copying on this machine (`shm_ring::calibrate`).
//!
//! `cargo run --release -p shm-ring --example calibrate [budget_ms]`
fn main() -> Result<(), shm_ring::Error> {
    let ms: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let cal = shm_ring::calibrate(std::time::Duration::from_millis(ms))?;
    println!(
        "{:>10} {:>14} {:>14} {:>8}",
        "bytes", "copy msg/s", "zero-copy msg/s", "zc/copy"
    );
    for (bytes, c, z) in &cal.points {
        println!("{bytes:>10} {c:>14.0} {z:>15.0} {:>8.2}", z / c);
    }
    println!(
        "crossover: {} bytes (DEFAULT_THRESHOLD is {})",
        cal.threshold,
        shm_ring::DEFAULT_THRESHOLD
    );
    Ok(())
}
