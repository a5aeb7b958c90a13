//! A peer process for shm-ring's cross-process tests, and a tool to poke at channels by hand.
//!
//! ```text
//! shm-ring-peer consume NAME COUNT [MS]   receive COUNT messages, verify seq + checksum, print "ok COUNT"
//!                                         (with MS: wait up to MS ms for the channel to appear)
//! shm-ring-peer produce NAME COUNT [LINGER_MS]  create NAME, send COUNT 16-float messages, print
//!                                         "sent", drop the sender (lingers), print "closed"
//! shm-ring-peer sink NAME [CORE]        receive and sum array "x" of every message until closed
//! shm-ring-peer hold NAME N               receive N messages, keep them (and their blocks), print "held", sleep
//! shm-ring-peer produce-hang NAME         create channel NAME, print "ready", sleep (to be killed);
//!                                         $SHM_RING_PEER_UID: one more uid allowed as its consumer
//! shm-ring-peer typed-produce NAME COUNT [close]  create typed [f32; 16] channel NAME, send COUNT
//!                                         values (value i: sixteen times i), print "sent", then
//!                                         sleep (to be killed) or with "close" drop it, print "closed"
//! shm-ring-peer typed-take NAME N         open typed [f32; 16] channel NAME, receive N, print
//!                                         "took N", sleep (to be killed)
//! shm-ring-peer create BYTES NAME         create a channel whose pool totals about BYTES; print "created",
//!                                         then loan and fill its 16 blocks, printing "loaned K" after each
//! shm-ring-peer open NAME                 try to open NAME as its consumer; print "opened" or "busy PID"
//! shm-ring-peer scribble PATH MS SEED BLOCKS BLOCK_SIZE   for MS ms write random bytes at random
//!                                         offsets of the channel whose memory PATH reaches (e.g.
//!                                         /proc/<pid>/fd/<n>): headers, rings, pool; print "done N"
//! shm-ring-peer corrupt PATH OFFSET HEX   write the bytes HEX at OFFSET of the memory PATH reaches
//! shm-ring-peer resize NAME|PATH          get channel NAME's memfd from its server (or open PATH),
//!                                         try to truncate it to 0 and to grow it; print
//!                                         "shrink: R" and "grow: R" (R: "ok" or the error)
//! shm-ring-peer squat DIR NAME           what another user tries against channel NAME in socket
//!                                         directory DIR: connect to its socket, bind a socket of
//!                                         its own next to it, make a file in DIR, make a directory
//!                                         next to DIR; prints "connect: R", "bind: R", "file: R",
//!                                         "sibling: R" (R: "ok" or the error)
//! shm-ring-peer fill-named BYTES NAME     create channel NAME with 16 blocks totalling BYTES, wait
//!                                         for its consumer, fill block i with byte i and send each;
//!                                         print "sent 16"
//! shm-ring-peer drain-named NAME          open NAME (waiting up to 30 s), receive 16 messages and
//!                                         keep them all, check every byte; print "verified BYTES"
//! shm-ring-peer fill-anon BYTES           create an anonymous channel whose pool totals BYTES,
//!                                         write every pool byte; print "filled BYTES"
//! shm-ring-peer hold-leaderless NAME N    receive N messages and keep them in a second thread, print
//!                                         "held", then end the main thread only (its leader shows
//!                                         `State: Z` while the process lives on); on stdin "check"
//!                                         print "sums S1 S2 ..." (sum of u32 array "x" of each)
//! shm-ring-peer produce-leaderless NAME   create NAME, hand the sender to a second thread, print
//!                                         "ready", end the main thread only; on stdin "send" send a
//!                                         message (meta "seq" = 0) and print "sent"
//! shm-ring-peer fork-drop NAME            receive one message, fork; the child drops the message
//!                                         and the receiver and exits; print "forked"; then on stdin
//!                                         "check" print "sum S" (u32 array "x"), on "recv" receive
//!                                         one more and print "tag T"
//! shm-ring-peer fork-send NAME            create NAME, wait for its consumer, fork; the child tries
//!                                         to send (meta "seq" = 99) and prints "child sent" or
//!                                         "child refused: ERROR"; then the parent sends seq 1 and
//!                                         prints "parent sent"; waits for stdin to close
//! shm-ring-peer fork-typed NAME           make typed [f32; 16] channel NAME and open it here, send
//!                                         1.0 and 2.0, fork; the child tries a send and a receive and
//!                                         prints "child send: R" and "child recv: R" (R: "ok" or the
//!                                         error); the parent then prints "parent got A B" and the
//!                                         sender's free slots check "parent sent"
//! shm-ring-peer race-open NAME            print "ready", wait for "go" on stdin, then open NAME
//!                                         once: print "opened TAG" (TAG: tag of the first message,
//!                                         received with 2 s to wait; "none" without one) and keep
//!                                         the receiver until stdin closes, or "busy PID"
//! ```
#[cfg(loom)]
fn main() {}

#[cfg(not(loom))]
fn main() {
    real::main()
}

#[cfg(not(loom))]
#[path = "peer/issue16.rs"]
mod issue16;

#[cfg(not(loom))]
#[path = "peer/process.rs"]
mod process;

#[cfg(not(loom))]
mod real {
    use std::time::Duration;

    use shm_ring::{
        ChannelConfig, Message, OpenError, Receiver, RecvError, RecvTimeoutError, Sender,
    };

    use super::issue16;
    use super::process::say;

    fn checksum(data: &[u8]) -> u64 {
        // FNV-1a over the bytes.
        data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    pub(crate) fn sleep_forever() -> ! {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    fn consume(name: &str, count: u64, wait_ms: Option<u64>) -> Result<(), String> {
        let mut rx = match wait_ms {
            Some(ms) => Receiver::<Message>::open_timeout(name, Duration::from_millis(ms)),
            None => Receiver::<Message>::open(name),
        }
        .map_err(|e| e.to_string())?;
        let mut next = 0u64;
        loop {
            let m = match rx.recv() {
                Ok(m) => m,
                Err(RecvError::Disconnected) => break,
                Err(e) => return Err(format!("after {next} messages: {e}")),
            };
            let r = m.record(0).map_err(|e| e.to_string())?;
            let seq = r.meta_i64("seq").ok_or("no seq")? as u64;
            if seq != next {
                return Err(format!("expected seq {next}, got {seq}"));
            }
            let data = r.array_bytes("data").map_err(|e| e.to_string())?;
            let want = r.meta_i64("sum").ok_or("no sum")? as u64;
            if checksum(data) != want {
                return Err(format!("checksum mismatch at seq {seq}"));
            }
            next += 1;
        }
        if next != count {
            return Err(format!("received {next} messages, expected {count}"));
        }
        say(&format!("ok {next}"));
        Ok(())
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
        let result: Result<(), String> = match arg(0).as_str() {
            "consume" => consume(&arg(1), arg(2).parse().unwrap_or(0), arg(3).parse().ok()),
            "produce" => produce(&arg),
            "sink" => sink(&arg),
            "hold" => hold(&arg),
            "typed-produce" => typed_produce(&arg),
            "typed-take" => typed_take(&arg),
            "produce-hang" => produce_hang(&arg),
            "create" => create(&arg),
            "fill-anon" => fill_anon(&arg),
            "open" => match Receiver::<Message>::open(&arg(1)) {
                Ok(_) => {
                    say("opened");
                    Ok(())
                }
                Err(OpenError::Busy(pid)) => {
                    say(&format!("busy {pid}"));
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
            #[cfg(feature = "unstable-internals")]
            "scribble" => scribble(&arg),
            "corrupt" => corrupt(&arg),
            "hold-leaderless" => issue16::hold_leaderless(&arg),
            "produce-leaderless" => issue16::produce_leaderless(&arg),
            "fork-drop" => issue16::fork_drop(&arg),
            "fork-send" => issue16::fork_send(&arg),
            "fork-typed" => issue16::fork_typed(&arg),
            "race-open" => issue16::race_open(&arg),
            "resize" => issue16::resize(&arg),
            "squat" => issue16::squat(&arg),
            "fill-named" => issue16::fill_named(&arg),
            "drain-named" => issue16::drain_named(&arg),
            other => Err(format!("unknown command {other:?}")),
        };
        if let Err(e) = result {
            eprintln!("shm-ring-peer: {e}");
            std::process::exit(1);
        }
    }

    fn produce(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let mut cfg = ChannelConfig::default();
        if let Ok(ms) = arg(3).parse::<u64>() {
            cfg.linger = Duration::from_millis(ms);
        }
        let mut tx = Sender::<Message>::create(&arg(1), &cfg).map_err(|e| e.to_string())?;
        let count: u64 = arg(2).parse().map_err(|_| "bad count")?;
        let mut data = [0f32; 16];
        for seq in 0..count {
            for (i, x) in data.iter_mut().enumerate() {
                *x = seq as f32 * 0.5 + i as f32;
            }
            let bytes: &[u8] = bytemuck::cast_slice(&data);
            let msg = shm_ring::MessageBuilder::new()
                .meta_i64("seq", seq as i64)
                .meta_i64("sum", checksum(bytes) as i64)
                .array_slice("data", &[16], &data)
                .map_err(|e| e.to_string())?;
            tx.send(msg).map_err(|e| e.to_string())?;
        }
        say("sent");
        drop(tx);
        say("closed");
        Ok(())
    }

    fn sink(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        if let Ok(core) = arg(2).parse::<usize>() {
            let mut set = rustix::thread::CpuSet::new();
            set.set(core);
            let _ = rustix::thread::sched_setaffinity(None, &set);
        }
        let mut rx = Receiver::<Message>::open(&arg(1)).map_err(|e| e.to_string())?;
        let mut sum = 0f64;
        let mut n = 0u64;
        loop {
            let r = rx.recv_batch(256, None, |m| {
                if let Ok(rec) = m.record(0)
                    && let Ok(x) = rec.array::<f32>("x")
                {
                    sum += x.sum() as f64;
                }
                n += 1;
            });
            match r {
                Ok(_) => {}
                Err(RecvTimeoutError::Failed(RecvError::Disconnected)) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        say(&format!("sink {n} {sum}"));
        Ok(())
    }

    fn hold(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let mut rx = Receiver::<Message>::open(&arg(1)).map_err(|e| e.to_string())?;
        let n: usize = arg(2).parse().unwrap_or(1);
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(rx.recv().map_err(|e| e.to_string())?);
        }
        let blocks: usize = held.iter().map(|m| m.leased_blocks()).sum();
        say(&format!("held {blocks}"));
        sleep_forever()
    }

    fn typed_produce(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        // A typed [f32; 16] channel: send COUNT values (value i: all i), print "sent",
        // then hang (to be killed) or, with "close", drop the sender.
        let mut tx = shm_ring::Sender::<[f32; 16]>::create(&arg(1), &ChannelConfig::default())
            .map_err(|e| e.to_string())?;
        let count: u64 = arg(2).parse().map_err(|_| "bad count")?;
        for i in 0..count {
            tx.send(&[i as f32; 16]).map_err(|e| e.to_string())?;
        }
        say("sent");
        if arg(3) == "close" {
            drop(tx);
            say("closed");
            return Ok(());
        }
        sleep_forever()
    }

    fn typed_take(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        // Open typed [f32; 16] channel NAME, receive N values, print "took N", hang.
        let mut rx =
            shm_ring::Receiver::<[f32; 16]>::open_timeout(&arg(1), Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
        let n: u64 = arg(2).parse().map_err(|_| "bad count")?;
        for _ in 0..n {
            rx.recv().map_err(|e| e.to_string())?;
        }
        say(&format!("took {n}"));
        sleep_forever()
    }

    fn produce_hang(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        // SHM_RING_PEER_UID: one more user allowed to open it (Rendezvous::peer_uid).
        let mut cfg = ChannelConfig::default();
        cfg.rendezvous.peer_uid = std::env::var("SHM_RING_PEER_UID")
            .ok()
            .and_then(|u| u.parse().ok());
        let _tx = Sender::<Message>::create(&arg(1), &cfg).map_err(|e| e.to_string())?;
        say("ready");
        sleep_forever()
    }

    fn create(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let bytes: usize = arg(1).parse().map_err(|_| "bad size")?;
        let cfg = ChannelConfig {
            blocks: 16,
            block_size: bytes / 16,
            linger: Duration::ZERO,
            ..ChannelConfig::default()
        };
        let mut tx = Sender::<Message>::create(&arg(2), &cfg).map_err(|e| e.to_string())?;
        say("created");
        // Pool blocks are committed when first loaned: loan (and write) every one.
        let mut loans = Vec::new();
        for i in 0..16u8 {
            let loan = tx.loan::<u8>(&[bytes / 16]).map_err(|e| e.to_string())?;
            loans.push(loan.fill(i));
            say(&format!("loaned {}", i + 1));
        }
        Ok(())
    }

    fn fill_anon(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let bytes: usize = arg(1).parse().map_err(|_| "bad size")?;
        let cfg = ChannelConfig {
            blocks: 16,
            block_size: bytes / 16,
            ..ChannelConfig::default()
        };
        let mut tx = Sender::<Message>::anonymous(&cfg).map_err(|e| e.to_string())?;
        let mut loans = Vec::new();
        for i in 0..16u8 {
            let loan = tx.loan::<u8>(&[bytes / 16]).map_err(|e| e.to_string())?;
            loans.push(loan.fill(i));
        }
        let mut total = 0;
        for (i, l) in loans.iter().enumerate() {
            let s = l.as_slice();
            if s.last() != Some(&(i as u8)) {
                return Err(format!("block {i} does not read back"));
            }
            total += s.len();
        }
        say(&format!("filled {total}"));
        Ok(())
    }

    // Needs the segment's layout: built with the `unstable-internals` feature (as the
    // tests build it).
    #[cfg(feature = "unstable-internals")]
    fn scribble(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let ms: u64 = arg(2).parse().map_err(|_| "bad ms")?;
        let mut x: u64 = arg(3).parse::<u64>().map_err(|_| "bad seed")? | 1;
        let cfg = ChannelConfig {
            blocks: arg(4).parse().map_err(|_| "bad blocks")?,
            block_size: arg(5).parse().map_err(|_| "bad block size")?,
            ..ChannelConfig::default()
        };
        let l = shm_ring::channel_layout(&cfg).map_err(|e| e.to_string())?;
        let path = arg(1);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        let mut rnd = move || {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Hot spots: the channel header, both rings' indices, record headers and
        // bodies in the descriptor slots, completion entries, and anywhere at all.
        let desc_bytes = l.slots * l.slot_size;
        let deadline = std::time::Instant::now() + Duration::from_millis(ms);
        let mut n = 0u64;
        while std::time::Instant::now() < deadline {
            let r = rnd();
            let off = match r % 64 {
                0 => l.channel_header + (r >> 8) as usize % 64,
                1 => [l.desc_ring, l.desc_head, l.comp_ring, l.comp_head][(r >> 8) as usize % 4],
                2..=40 => l.desc_slots + (r >> 8) as usize % desc_bytes,
                41..=46 => l.comp_slots + (r >> 8) as usize % 64,
                47..=56 => l.pool + (r >> 8) as usize % (l.total - l.pool).max(1),
                _ => 64 + (r >> 8) as usize % (l.total - 64),
            };
            let v = rnd().to_le_bytes();
            let len = 1 + (r >> 40) as usize % 8;
            let _ = std::os::unix::fs::FileExt::write_all_at(&f, &v[..len], off as u64);
            n += 1;
            if n.is_multiple_of(4) {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        say(&format!("done {n}"));
        Ok(())
    }

    fn corrupt(arg: &dyn Fn(usize) -> String) -> Result<(), String> {
        let path = arg(1);
        let off: u64 = arg(2).parse().map_err(|_| "bad offset")?;
        let hex = arg(3);
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        std::os::unix::fs::FileExt::write_all_at(&f, &bytes, off).map_err(|e| e.to_string())?;
        say("corrupted");
        Ok(())
    }
}
