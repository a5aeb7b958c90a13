//! Measures where zero-copy starts to beat copying on this machine (`shm_ring::calibrate`).
//!
//! `cargo run --release -p shm-ring --example calibrate [budget_ms]`
use std::process::ExitCode;

fn main() -> ExitCode {
    let ms: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let cal = match shm_ring::calibrate(std::time::Duration::from_millis(ms)) {
        Ok(cal) => cal,
        Err(e) => {
            eprintln!("calibrate: {e}"); // Display, not Debug: the message says what to change
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{:>10} {:>14} {:>15} {:>8}",
        "bytes", "copy msg/s", "zero-copy msg/s", "zc/copy"
    );
    for (bytes, c, z) in &cal.points {
        println!("{bytes:>10} {c:>14.0} {z:>15.0} {:>8.2}", z / c);
    }
    println!(
        "(bytes: size of the one array in each message; msg/s: messages per second between two \
         threads over a real channel in that mode; zc/copy > 1: zero-copy is faster)"
    );
    println!(
        "crossover: {} bytes (DEFAULT_THRESHOLD is {})",
        cal.threshold,
        shm_ring::DEFAULT_THRESHOLD
    );
    ExitCode::SUCCESS
}
