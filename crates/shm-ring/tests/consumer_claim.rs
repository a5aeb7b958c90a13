//! The consumer claim of a channel (one word: pid and start time) against dead, live, racing
//! and hostile claimants. A dead consumer's claim must not keep a new consumer out; a live
//! one's must (`Busy`); two new consumers racing for a dead one's claim get one winner; the
//! dead consumer's leased blocks come back to the producer, never a live consumer's.
#![cfg(not(loom))]

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::{
    NameGuard, Peer, named, poke, producer_and_consumer_peer, send_filled, zero_copy_blocks,
};
use shm_ring::{
    ChannelConfig, LoanError, Message, MessageBuilder, OpenError, Receiver, Rendezvous, SendError,
    Sender, channel_layout,
};

fn no_linger(rdv: Rendezvous) -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        rendezvous: rdv,
        ..ChannelConfig::default()
    }
}

/// Two 64 KiB blocks, arrays always zero-copy: a consumer holding two messages holds the pool.
fn two_blocks() -> ChannelConfig {
    zero_copy_blocks(2)
}

/// Sends two messages whose u32 array "x" (1000 values) holds `first`, then `first + 1`.
fn send_two(tx: &mut Sender, first: u32) {
    send_filled(tx, first..first + 2);
}

/// A channel of [`two_blocks`] named after `tag` and its guard, whose consumer (the peer
/// `cmd <name> 2`) has been sent the two messages of `send_two(tx, 1)`.
fn consumer_holding_two(tag: &str, cmd: &str) -> (String, NameGuard, Sender, Peer) {
    let (name, guard) = named(tag);
    let (mut tx, peer) = producer_and_consumer_peer(&name, &two_blocks(), &[cmd, &name, "2"]);
    send_two(&mut tx, 1);
    (name, guard, tx, peer)
}

/// A channel (no linger) named after `tag` and its guard, whose consumer (the peer
/// `hold <name> 1`) has been sent one message (tag 1).
fn consumer_holding_one(tag: &str) -> (String, NameGuard, Sender, Peer) {
    let (name, guard) = named(tag);
    let (mut tx, peer) = producer_and_consumer_peer(
        &name,
        &no_linger(Rendezvous::default()),
        &["hold", &name, "1"],
    );
    tx.send(MessageBuilder::new().tag(1)).unwrap();
    (name, guard, tx, peer)
}

/// Sum of the u32 array "x" of a message.
fn sum_x(m: &shm_ring::Message) -> u64 {
    let r = m.record(0).unwrap();
    r.array::<u32>("x")
        .unwrap()
        .iter()
        .map(|&v| u64::from(v))
        .sum()
}

/// A consumer claim word (pid, low 32 bits of the start time), as the channel header holds it.
fn word(pid: u32, start: u64) -> [u8; 8] {
    ((u64::from(pid) << 32) | (start & 0xffff_ffff)).to_le_bytes()
}

/// The pid and start time of a process that existed and is gone (spawned, killed, reaped).
fn a_dead_process() -> (u32, u64) {
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    let start = shmpipe_test_kit::proc::stat(pid).unwrap().start_time;
    child.kill().unwrap();
    child.wait().unwrap();
    (pid, start)
}

/// Review R10 (restored from commit 9ba6f73 of review_ring.rs). A consumer that died was only
/// noticed by the producer's next *blocked* call. A new consumer (the old one restarted) got
/// `Busy`, naming the dead pid, for as long as the producer did not block: with a producer
/// that sends now and then into a ring with room, forever.
#[test]
fn a_dead_consumers_claim_does_not_keep_a_new_consumer_out() {
    let (name, guard, mut tx, mut old) = consumer_holding_one("rv-busy");
    assert_eq!(old.line(), "held 0");
    let dead = old.pid();
    old.kill();
    // The producer keeps sending now and then (its ring has room: it never blocks).
    let t0 = Instant::now();
    let mut last = None;
    let mut opened = None;
    while t0.elapsed() < Duration::from_secs(3) {
        let _ = tx.send(MessageBuilder::new().tag(2));
        match Receiver::<Message>::open(&name) {
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

/// A consumer that died holding two blocks, and messages sent after its death: a new consumer
/// opens at once, receives what the dead one did not take (not dropped), and the two blocks
/// the dead one held come back to the producer, which sees a live consumer (no `PeerDied`).
#[test]
fn a_new_consumer_reads_on_where_the_dead_one_stopped_and_its_blocks_come_back() {
    let (name, guard, mut tx, mut old) = consumer_holding_two("claim-reads-on", "hold");
    assert_eq!(old.line(), "held 2");
    assert_eq!(tx.free_blocks().unwrap(), 0);
    old.kill();
    tx.send(MessageBuilder::new().tag(5)).unwrap(); // inline: the ring has room
    let mut rx = Receiver::<Message>::open(&name).expect("a dead consumer's claim kept us out");
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap().tag(), 5);
    // The dead consumer's blocks came back through the completion ring.
    let deadline = Instant::now() + Duration::from_secs(5);
    while tx.free_blocks().unwrap() < 2 {
        assert!(
            Instant::now() < deadline,
            "the dead consumer's blocks never came back"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    tx.check_consumer().expect("the new consumer is alive");
    send_two(&mut tx, 7);
    let (a, b) = (rx.recv().unwrap(), rx.recv().unwrap());
    assert_eq!((sum_x(&a), sum_x(&b)), (7000, 8000));
    drop((a, b));
    assert_eq!(tx.free_blocks().unwrap(), 2);
    drop((rx, tx));
    guard.assert_gone();
}

/// A live consumer's claim is never taken: a second consumer gets `Busy` naming it, and the
/// producer gets none of the blocks it holds.
#[test]
fn a_live_consumers_claim_is_never_taken() {
    let (name, guard, mut tx, mut live) = consumer_holding_two("claim-live", "hold");
    assert_eq!(live.line(), "held 2");
    for _ in 0..3 {
        match Receiver::<Message>::open(&name) {
            Err(OpenError::Busy(pid)) => assert_eq!(pid, live.pid()),
            other => panic!("expected Busy naming the live consumer, got {other:?}"),
        }
    }
    assert_eq!(
        tx.free_blocks().unwrap(),
        0,
        "a live consumer's blocks came back"
    );
    tx.check_consumer()
        .expect("the live consumer was judged gone");
    live.kill();
    drop(tx);
    guard.assert_gone();
}

/// A consumer whose main thread ended while another thread holds its messages shows `Z` for
/// its leader and is alive: its claim stays, and its arrays do not change.
#[test]
fn a_consumer_whose_main_thread_ended_keeps_its_claim() {
    let (name, guard, mut tx, mut live) =
        consumer_holding_two("claim-leaderless", "hold-leaderless");
    assert_eq!(live.line(), "held");
    live.wait_leader_zombie();
    let opened = Receiver::<Message>::open(&name);
    assert!(
        matches!(opened, Err(OpenError::Busy(pid)) if pid == live.pid()),
        "expected Busy naming the leaderless consumer, got {opened:?}"
    );
    assert_eq!(
        tx.free_blocks().unwrap(),
        0,
        "a live consumer's blocks came back"
    );
    live.tell("check");
    assert_eq!(live.line(), "sums 1000 2000");
    live.kill();
    drop(tx);
    guard.assert_gone();
}

/// Three new consumers (processes) open at the same instant a channel whose consumer died:
/// exactly one gets it (and the message the dead one did not take), the others `Busy` naming
/// the winner.
#[test]
fn new_consumers_racing_for_a_dead_claim_get_one_winner() {
    for round in 0..5 {
        let (name, guard, mut tx, mut old) = consumer_holding_one("claim-race");
        assert_eq!(old.line(), "held 0");
        old.kill();
        tx.send(MessageBuilder::new().tag(2)).unwrap();
        let mut racers: Vec<Peer> = (0..3).map(|_| Peer::spawn(&["race-open", &name])).collect();
        for r in &mut racers {
            assert_eq!(r.line(), "ready");
        }
        for r in &mut racers {
            r.tell("go");
        }
        let said: Vec<(u32, String)> = racers.iter_mut().map(|r| (r.pid(), r.line())).collect();
        let winners: Vec<u32> = said
            .iter()
            .filter(|(_, s)| s == "opened 2")
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {said:?}");
        let busy = format!("busy {}", winners[0]);
        assert!(
            said.iter().all(|(p, s)| *p == winners[0] || *s == busy),
            "round {round}: {said:?}"
        );
        assert_eq!(tx.consumer_pid(), Some(winners[0]));
        drop((racers, tx));
        guard.assert_gone();
    }
}

/// The producer's own reclaim (its blocked call notices the death) and a new consumer's
/// takeover race for the same dead claim: one of them wins, never both. Either way the new
/// consumer gets the channel, the producer gets both blocks back exactly once (no "returned
/// block not in flight"), and what is sent next arrives intact.
#[test]
fn the_producers_reclaim_and_a_takeover_have_one_winner() {
    let mut outcomes = std::collections::BTreeMap::<&str, u32>::new();
    for round in 0..8u64 {
        let (name, guard, mut tx, mut old) = consumer_holding_two("claim-reclaim", "hold");
        assert_eq!(old.line(), "held 2");
        old.kill();
        // The producer waits for a block (and so checks its consumer) while we open.
        let producer = std::thread::spawn(move || {
            let r = tx
                .loan_timeout::<u32>(&[1000], Duration::from_secs(5))
                .map(|l| l.fill(9));
            (tx, r)
        });
        std::thread::sleep(Duration::from_millis(round * 15));
        let mut rx = Receiver::<Message>::open(&name).expect("no consumer after a dead one");
        let (mut tx, loaned) = producer.join().unwrap();
        let loan = match loaned {
            Ok(l) => {
                *outcomes.entry("taken over").or_default() += 1;
                l
            }
            Err(LoanError::Send(SendError::PeerDied { reclaimed: 2, .. })) => {
                *outcomes.entry("producer reclaimed").or_default() += 1;
                tx.loan_timeout::<u32>(&[1000], Duration::from_secs(5))
                    .unwrap()
                    .fill(9)
            }
            Err(e) => panic!("round {round}: the producer's wait ended with {e:?}"),
        };
        tx.send(MessageBuilder::new().array_loan("x", loan))
            .unwrap();
        let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(sum_x(&m), 9000);
        drop(m);
        let deadline = Instant::now() + Duration::from_secs(5);
        while tx.free_blocks().expect("blocks accounted twice") < 2 {
            assert!(
                Instant::now() < deadline,
                "round {round}: a block never came back"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        tx.check_consumer().unwrap();
        drop((rx, tx));
        guard.assert_gone();
    }
    eprintln!("outcomes: {outcomes:?}");
}

/// Claim words a hostile peer wrote are judged as copies, never trusted: no pid, our own pid
/// without a receiver, a live process (init), a consumer that closed, and the producer's
/// "reclaiming" mark left for ever keep an opener out with `Busy` (the closed one with
/// `ConsumerClosed`, the last after a bounded wait); a pid whose start time is not the claim's, or a process that is gone, is a dead
/// consumer, whose claim the opener takes.
#[test]
fn hostile_claim_words_are_judged_never_trusted() {
    let cfg = ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    };
    let l = channel_layout(&cfg).unwrap();
    let init = shmpipe_test_kit::proc::stat(1).expect("/proc/1/stat must be readable here");
    let me = std::process::id();
    let (gone, gone_start) = a_dead_process();
    let open = |tx: &Sender, claim: [u8; 8], closed: bool| {
        poke(tx, l.channel_wire.consumer, &claim);
        if closed {
            poke(tx, l.channel_wire.consumer_closed, &1u32.to_le_bytes());
        }
        let t0 = Instant::now();
        let r = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap());
        (r, t0.elapsed())
    };
    let busy = [
        ("no pid", 0x1234_5678u64.to_le_bytes(), false, 0),
        ("our pid, no receiver", word(me, 42), false, me),
        ("init, alive", word(1, init.start_time), false, 1),
        (
            "a dead consumer that closed",
            word(gone, gone_start),
            true,
            gone,
        ),
        (
            "reclaiming, for ever",
            0xffff_ffffu64.to_le_bytes(),
            false,
            0,
        ),
    ];
    for (what, claim, closed, pid) in busy {
        let tx = Sender::<Message>::anonymous(&cfg).unwrap();
        let (r, took) = open(&tx, claim, closed);
        assert!(
            match r {
                Err(OpenError::ConsumerClosed(p)) => closed && p == pid,
                Err(OpenError::Busy(p)) => !closed && p == pid,
                _ => false,
            },
            "{what}: expected Busy({pid}) (ConsumerClosed if closed), got {r:?}"
        );
        assert!(took < Duration::from_secs(4), "{what}: waited {took:?}");
    }
    let taken = [
        (
            "init's pid, another start time",
            word(1, init.start_time + 1),
        ),
        ("a process that is gone", word(gone, gone_start)),
    ];
    for (what, claim) in taken {
        let mut tx = Sender::<Message>::anonymous(&cfg).unwrap();
        let (r, _) = open(&tx, claim, false);
        let rx = r.unwrap_or_else(|e| panic!("{what}: the dead claim was not taken: {e:?}"));
        tx.check_consumer().expect("the new consumer is alive");
        assert_eq!(tx.consumer_pid(), Some(me));
        drop(rx);
    }
}
