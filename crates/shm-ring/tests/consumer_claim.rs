//! The consumer claim of a channel (one word: pid and start time) against dead, live, racing
//! and hostile claimants. A dead consumer's claim must not keep a new consumer out; a live
//! one's must (`Busy`); two new consumers racing for a dead one's claim get one winner; the
//! dead consumer's leased blocks come back to the producer, never a live consumer's.
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{name_guard, unique};
use shm_ring::{ChannelConfig, MessageBuilder, Receiver, Rendezvous, Sender};

fn no_linger(rdv: Rendezvous) -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    }
}

/// Review R10 (restored from commit 9ba6f73 of review_ring.rs). A consumer that died was only
/// noticed by the producer's next *blocked* call. A new consumer (the old one restarted) got
/// `Busy`, naming the dead pid, for as long as the producer did not block: with a producer
/// that sends now and then into a ring with room, forever.
#[test]
fn a_dead_consumers_claim_does_not_keep_a_new_consumer_out() {
    let name = unique("rv-busy");
    let guard = name_guard(&[&name]);
    let mut tx = Sender::create(&name, &no_linger(Rendezvous::default())).unwrap();
    let mut old = common::Peer::spawn(&["hold", &name, "1"]);
    tx.wait_for_consumer(Duration::from_secs(20)).unwrap();
    tx.send(MessageBuilder::new().tag(1)).unwrap();
    assert_eq!(old.line(), "held 0");
    let dead = old.pid();
    old.kill();
    // The producer keeps sending now and then (its ring has room: it never blocks).
    let t0 = Instant::now();
    let mut last = None;
    let mut opened = None;
    while t0.elapsed() < Duration::from_secs(3) {
        let _ = tx.send(MessageBuilder::new().tag(2));
        match Receiver::open(&name) {
            Ok(rx) => {
                opened = Some(rx);
                break;
            }
            Err(e) => last = Some(e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ok = opened.is_some();
    drop((opened, tx));
    drop(guard);
    assert!(
        ok,
        "3 s after consumer {dead} was SIGKILLed a new consumer still cannot open: {last:?}"
    );
}
