//! Chaos on named channels (issue 16): one side of a named channel is SIGKILLed at a random
//! instant (before it binds or opens, while it connects, mid-stream, while it lingers or
//! closes), 200 times. The side that lives, this test process, must end with an error or with
//! exactly the data sent (in order, checksums intact, and everything up to an error intact),
//! and nothing may be left behind: no socket, no descriptor of this process, no process.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, checksum, named, open_fds};
use shm_ring::{
    ChannelConfig, Error, Message, MessageBuilder, Receiver, SendError, SendTimeoutError, Sender,
};

const RUNS: u32 = 200;
/// More messages than the ring holds (1024 slots, one per message): a producer must wait for
/// its consumer, so it meets a killed consumer too.
const COUNT: u64 = 3000;

/// xorshift64: the instants, reproducible from the seed printed on failure.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Kills `peer` after `delay` on a thread; joins to the peer, reaped. `None`: the peer is left to
/// finish on its own (at most 60 s), so that runs which end with all the data happen whatever
/// the machine's load, not only when a random delay outlasts the stream.
fn kill_after(mut peer: Peer, delay: Option<Duration>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || match delay {
        Some(delay) => {
            std::thread::sleep(delay);
            peer.kill();
        }
        None => {
            peer.finish(Duration::from_secs(60));
        }
    })
}

/// We consume; the producer peer is killed. Returns what the run ended with.
fn consumer_run(name: &str, delay: Option<Duration>) -> String {
    let producer = Peer::spawn(&["produce", name, &COUNT.to_string(), "300"]);
    let pid = producer.pid();
    let killer = kill_after(producer, delay);
    let mut next = 0u64;
    match Receiver::<Message>::open_timeout(name, Duration::from_millis(400)) {
        Err(e) => {
            killer.join().unwrap();
            verdict(e.into(), next, pid)
        }
        Ok(mut rx) => {
            let end = loop {
                match rx.recv_timeout(Duration::from_secs(10)) {
                    Ok(m) => {
                        let r = m.record(0).unwrap();
                        assert_eq!(r.meta_i64("seq"), Some(next as i64), "out of order");
                        let data = r.array_bytes("data").unwrap();
                        assert_eq!(
                            checksum(data),
                            r.meta_i64("sum").unwrap() as u64,
                            "seq {next}"
                        );
                        next += 1;
                    }
                    Err(e) => break e,
                }
            };
            // Drop the receiver once the producer is gone for sure (killed or done).
            killer.join().unwrap();
            drop(rx);
            verdict(end.into(), next, pid)
        }
    }
}

fn verdict(e: Error, got: u64, pid: u32) -> String {
    match e {
        Error::Disconnected => {
            assert_eq!(got, COUNT, "a clean end after {got} of {COUNT} messages");
            "all".into()
        }
        Error::PeerDied { pid: p, .. } => {
            assert_eq!(p, pid);
            "died".into()
        }
        Error::NotFound(_) => "not found".into(),
        other => panic!("unexpected end after {got} messages: {other:?}"),
    }
}

/// We produce; the consumer peer is killed.
fn producer_run(name: &str, delay: Option<Duration>) -> String {
    let cfg = ChannelConfig {
        linger: Duration::from_millis(300),
        attach_timeout: Duration::from_millis(500),
        ..ChannelConfig::default()
    };
    let mut tx = Sender::<Message>::create(name, &cfg).unwrap();
    let consumer = Peer::spawn(&["consume", name, &COUNT.to_string(), "2000"]);
    let killer = kill_after(consumer, delay);
    let mut data = [0f32; 16];
    let mut end = "all";
    for seq in 0..COUNT {
        for (i, x) in data.iter_mut().enumerate() {
            *x = seq as f32 * 0.5 + i as f32;
        }
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let msg = MessageBuilder::new()
            .meta_i64("seq", seq as i64)
            .meta_i64("sum", checksum(bytes) as i64)
            .array_slice("data", &[16], &data)
            .unwrap();
        match tx.send_timeout(msg, Duration::from_secs(10)) {
            Ok(()) => {}
            Err(SendTimeoutError::Failed(SendError::PeerDied { .. }, _)) => {
                end = "died";
                break;
            }
            Err(SendTimeoutError::Failed(SendError::NoConsumer { .. }, _)) => {
                end = "no consumer";
                break;
            }
            Err(SendTimeoutError::Disconnected(_)) => {
                end = "disconnected";
                break;
            }
            Err(e) => panic!("seq {seq}: {e:?}"),
        }
    }
    drop(tx);
    killer.join().unwrap();
    end.into()
}

#[test]
fn sigkill_of_either_side_of_a_named_channel_at_a_random_instant_200_times() {
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut rng = Rng(seed);
    let fds = open_fds();
    let mut ends = std::collections::BTreeMap::<String, u32>::new();
    let t0 = Instant::now();
    for run in 0..RUNS {
        let (name, guard) = named("chaos");
        // One run in ten (both sides) is not killed: the clean end is covered by design.
        let delay = (run % 10 >= 2).then(|| Duration::from_micros(rng.below(80_000)));
        let side = if run % 2 == 0 { "consumer" } else { "producer" };
        let end = if run % 2 == 0 {
            consumer_run(&name, delay)
        } else {
            producer_run(&name, delay)
        };
        *ends.entry(format!("{side} saw: {end}")).or_default() += 1;
        let left = guard_left(&guard);
        assert!(
            left.is_empty(),
            "run {run} (seed {seed}, {side}, killed after {delay:?}, ended {end}): left {left:?}"
        );
        assert_eq!(
            open_fds(),
            fds,
            "run {run} (seed {seed}, {side}, killed after {delay:?}): a descriptor leaked"
        );
        drop(guard);
    }
    assert!(
        shmpipe_test_kit::proc::children_of(std::process::id()).is_empty(),
        "a peer is left"
    );
    eprintln!("{RUNS} runs in {:?}: {ends:?}", t0.elapsed());
    // Both kinds of end happened: the instants covered deaths before the end and after it.
    assert!(ends.keys().any(|k| k.contains("died")), "{ends:?}");
    assert!(ends.keys().any(|k| k.ends_with("all")), "{ends:?}");
}

fn guard_left(g: &common::NameGuard) -> Vec<String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.assert_gone())) {
        Ok(()) => vec![],
        Err(e) => vec![
            e.downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "?".into()),
        ],
    }
}
