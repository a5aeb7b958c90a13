//! Issue 16, hole 6: handles are not fork-safe, and a forked child must not be able to act
//! on the handles it inherited. Its drop of an inherited message or receiver does nothing (the
//! parent still holds them); its send on an inherited sender is refused.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{Peer, named, producer_and_consumer_peer, send_filled, zero_copy_blocks};
use shm_ring::{LoanError, Message, MessageBuilder, Receiver};

#[test]
fn a_forked_childs_drops_do_not_free_what_the_parent_holds() {
    let (name, guard) = named("fork-drop");
    let cfg = zero_copy_blocks(1);
    let (mut tx, mut consumer) = producer_and_consumer_peer(&name, &cfg, &["fork-drop", &name]);
    send_filled(&mut tx, [1]);
    assert_eq!(consumer.line(), "got");
    assert_eq!(consumer.line(), "forked");
    // The child dropped its copy of the message and of the receiver, and exited. The parent
    // still holds the message: its block must not come back, and the channel stays open.
    let loaned = tx.loan_timeout::<u32>(&[1000], Duration::from_millis(300));
    let reused = loaned.map(|l| {
        let _ = tx.send(MessageBuilder::new().array_loan("x", l.fill(7)));
    });
    consumer.tell("check");
    let sum = consumer.line();
    assert!(
        matches!(reused, Err(LoanError::Timeout)),
        "the child's drop returned the parent's block: {reused:?}"
    );
    assert_eq!(sum, "sum 1000", "the parent's array changed under it");
    let sent = tx.send(MessageBuilder::new().tag(5));
    assert!(
        sent.is_ok(),
        "the child's drop closed the channel: {sent:?}"
    );
    consumer.tell("recv");
    assert_eq!(consumer.line(), "tag 5");
    consumer.kill();
    drop(tx);
    guard.assert_gone();
}

#[test]
fn a_forked_child_cannot_send_on_an_inherited_sender() {
    let (name, guard) = named("fork-send");
    let mut producer = Peer::spawn(&["fork-send", &name]);
    let mut rx = Receiver::<Message>::open_timeout(&name, Duration::from_secs(20)).unwrap();
    let child = producer.line();
    assert!(
        child.starts_with("child refused") && child.contains("fork"),
        "a forked child sent on its parent's sender: {child}"
    );
    assert_eq!(producer.line(), "parent sent");
    let m = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(m.record(0).unwrap().meta_i64("seq"), Some(1));
    assert!(common::got(rx.try_recv()).is_none());
    drop(m);
    producer.kill();
    drop(rx);
    drop(guard);
}

#[test]
fn a_forked_child_can_neither_send_nor_receive_on_typed_ends() {
    let (name, guard) = named("fork-typed");
    let peer = Peer::spawn(&["fork-typed", &name]);
    let (ok, out, err) = peer.finish(Duration::from_secs(20));
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with("child send: ") && lines[0].contains("fork()"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("child recv: ") && lines[1].contains("fork()"),
        "{out}"
    );
    // The child's drops neither closed the channel nor handed slots back: the parent reads
    // both values and the channel still works.
    assert_eq!(lines[2], "parent got 1 2", "{out}");
    assert_eq!(lines[3], "parent sent 3", "{out}");
    guard.assert_gone();
}
