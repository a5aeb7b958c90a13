//! Byte-stream peers (pipe, Unix socket): length-prefixed frames, one `write` per message on
//! the producer (a message is handed off when it is sent), a buffered reader on the consumer.

use std::io::{self, BufReader, ErrorKind, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};

/// Bytes of the frame header: the payload length as a little-endian `u64`.
pub const HEADER: usize = 8;

/// Sends messages of `elements` floats as frames to `w` for `run`, then returns (the caller
/// closes the stream, which ends the consumer's loop).
///
/// # Errors
/// Write errors, e.g. a consumer that went away.
pub fn produce<W: Write>(w: &mut W, elements: usize, run: Duration) -> io::Result<u64> {
    // One buffer holds header and payload so that a frame is one `write`; the header takes the
    // first two f32 slots, which keeps the payload aligned for f32.
    let mut frame = vec![0f32; elements + HEADER / 4];
    let len = (elements * 4) as u64;
    bytemuck::cast_slice_mut::<f32, u8>(&mut frame[..HEADER / 4])
        .copy_from_slice(&len.to_le_bytes());
    let mut deadline = Deadline::new(run, stride_for(elements));
    let mut seq = 0u64;
    while deadline.keep_going() {
        kernel::fill(&mut frame[HEADER / 4..], seq);
        w.write_all(bytemuck::cast_slice(&frame))?;
        seq += 1;
    }
    w.flush()?;
    Ok(seq)
}

/// Reads a frame header; `Ok(None)` at a clean end of stream (between frames).
fn read_header<R: Read>(r: &mut R) -> io::Result<Option<u64>> {
    let mut hdr = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match r.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(u64::from_le_bytes(hdr)))
}

/// Receives frames of `elements` floats from `r` until the producer closes, summing and checking
/// every message.
///
/// # Errors
/// Read errors, a frame of the wrong length, or data that fails [`kernel::check`].
pub fn consume<R: Read>(r: R, elements: usize, warmup: Duration) -> Result<Outcome, BoxError> {
    let mut r = BufReader::with_capacity(64 * 1024, r);
    let mut buf = vec![0f32; elements];
    let mut meter = Meter::new(warmup, stride_for(elements));
    while let Some(len) = read_header(&mut r)? {
        if len != (elements * 4) as u64 {
            return Err(format!("frame of {len} bytes, expected {}", elements * 4).into());
        }
        r.read_exact(bytemuck::cast_slice_mut(&mut buf))?;
        let sum = kernel::check(&buf, meter.count())?;
        meter.record(sum);
    }
    Ok(meter.finish())
}

/// The abstract-namespace address `name` (no file to clean up).
fn address(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("shmpipe-bench-{name}").as_bytes())
}

/// Consumer side of the Unix socket: binds `name`, accepts one producer.
///
/// # Errors
/// Bind or accept errors.
pub fn socket_accept(name: &str) -> io::Result<UnixStream> {
    let listener = UnixListener::bind_addr(&address(name)?)?;
    let (stream, _) = listener.accept()?;
    Ok(stream)
}

/// Producer side of the Unix socket: connects to `name`, retrying until `patience` is spent
/// (the consumer may not be listening yet).
///
/// # Errors
/// The last connect error once `patience` is over.
pub fn socket_connect(name: &str, patience: Duration) -> io::Result<UnixStream> {
    let addr = address(name)?;
    let start = Instant::now();
    loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() >= patience => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_through_a_buffer() {
        let mut wire = Vec::new();
        let sent = produce(&mut wire, 33, Duration::from_millis(5)).unwrap();
        assert!(sent > 0);
        assert_eq!(wire.len() as u64, sent * (HEADER as u64 + 33 * 4));
        let o = consume(&wire[..], 33, Duration::ZERO).unwrap();
        // The window opens at a clock read after the first message: one every `stride`.
        let skipped = sent - o.messages;
        assert!(
            skipped >= 1 && (skipped - 1).is_multiple_of(u64::from(stride_for(33))),
            "{skipped}"
        );
        let expected: f64 = (0..sent)
            .map(|s| 33.0 * f64::from(kernel::value_for(s)))
            .sum();
        assert_eq!(o.checksum, expected);
    }

    #[test]
    fn wrong_length_torn_frame_and_bad_data_are_errors() {
        let mut wire = Vec::new();
        produce(&mut wire, 8, Duration::from_millis(1)).unwrap();
        assert!(
            consume(&wire[..], 9, Duration::ZERO).is_err(),
            "length mismatch"
        );
        let torn = &wire[..wire.len() - 1];
        assert!(consume(torn, 8, Duration::ZERO).is_err(), "torn last frame");
        let mut bad = wire.clone();
        bad[HEADER] ^= 0x40; // flip a bit of the first element
        assert!(
            consume(&bad[..], 8, Duration::ZERO).is_err(),
            "corrupted payload"
        );
    }

    #[test]
    fn socket_pair_by_name() {
        let name = format!("test-{}", std::process::id());
        let server = {
            let name = name.clone();
            std::thread::spawn(move || {
                let s = socket_accept(&name).unwrap();
                consume(s, 100, Duration::ZERO).unwrap()
            })
        };
        let mut s = socket_connect(&name, Duration::from_secs(5)).unwrap();
        let sent = produce(&mut s, 100, Duration::from_millis(20)).unwrap();
        drop(s);
        let o = server.join().unwrap();
        let skipped = sent - o.messages;
        assert!(
            skipped >= 1 && (skipped - 1).is_multiple_of(u64::from(stride_for(100))),
            "{skipped}"
        );
    }
}
