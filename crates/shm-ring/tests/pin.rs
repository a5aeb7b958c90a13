//! Block pins: a sent loan's block is not reused while a pin of it lives (whatever order the
//! consumer's release and the pin's drop come in), the pool stays mapped under a pin after
//! the sender is gone; bool loans; the pool geometry a receiver reads at open; a send that
//! waits in slices without losing its message (`try_send_timeout`).
#![cfg(not(loom))]

use std::os::fd::AsFd;

use shm_ring::{ChannelConfig, DType, Message, MessageBuilder, Receiver, Sender};

fn pair(cfg: &ChannelConfig) -> (Sender, Receiver) {
    let tx = Sender::<Message>::anonymous(cfg).unwrap();
    let rx = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    (tx, rx)
}

fn cfg(blocks: u32) -> ChannelConfig {
    ChannelConfig {
        blocks,
        block_size: 4096,
        ..ChannelConfig::default()
    }
}

/// Loans, fills with `v` and sends one block; the consumer reads and releases it.
fn round(tx: &mut Sender, rx: &mut Receiver, v: f32) -> f32 {
    let loan = tx.loan::<f32>(&[16]).unwrap().fill(v);
    tx.send(MessageBuilder::new().array_loan("x", loan))
        .unwrap();
    let m = rx.recv().unwrap();
    m.record(0).unwrap().slice::<f32>("x").unwrap()[0]
}

#[test]
fn a_pinned_block_is_not_reused_until_the_pin_goes_whichever_comes_first() {
    for pin_first in [false, true] {
        let (mut tx, mut rx) = pair(&cfg(2));
        let loan = tx.loan::<f32>(&[16]).unwrap().fill(1.0);
        let pin = loan.pin().expect("a pool block");
        let ptr = pin.as_ptr().cast::<f32>();
        tx.send(MessageBuilder::new().array_loan("x", loan))
            .unwrap();
        let m = rx.recv().unwrap();
        if pin_first {
            drop(pin);
            drop(m);
            assert_eq!(tx.free_blocks().unwrap(), 2, "released and unpinned: free");
            continue;
        }
        drop(m);
        assert_eq!(
            tx.free_blocks().unwrap(),
            1,
            "released but pinned: not free"
        );
        for v in 2..6 {
            assert_eq!(round(&mut tx, &mut rx, v as f32), v as f32);
        }
        // SAFETY: the pin keeps the block mapped and unused by later messages.
        let first = unsafe { ptr.read_volatile() };
        assert_eq!(first, 1.0, "a later loan wrote the pinned block");
        drop(pin);
        assert_eq!(tx.free_blocks().unwrap(), 2);
    }
}

#[test]
fn a_pin_of_a_loan_dropped_unsent_holds_the_block_too() {
    let (mut tx, _rx) = pair(&cfg(2));
    let loan = tx.loan::<u8>(&[8]).unwrap().fill(7);
    let pin = loan.pin().expect("a pool block");
    let second = loan.pin().expect("a pool block");
    drop(loan);
    assert_eq!(tx.free_blocks().unwrap(), 1);
    drop(pin);
    assert_eq!(tx.free_blocks().unwrap(), 1, "one pin still holds it");
    drop(second);
    assert_eq!(tx.free_blocks().unwrap(), 2);
}

#[test]
fn a_pin_keeps_the_pool_mapped_after_sender_and_receiver_are_gone() {
    let (mut tx, rx) = pair(&cfg(2));
    let loan = tx.loan::<u32>(&[4]).unwrap().fill(0xABCD);
    let pin = loan.pin().expect("a pool block");
    drop(loan);
    drop(tx);
    drop(rx);
    // SAFETY: the pin holds the mapping of the pool.
    let v = unsafe { pin.as_ptr().cast::<u32>().read_volatile() };
    assert_eq!(v, 0xABCD);
    assert_eq!(pin.block_size(), 4096);
}

#[test]
fn dropping_the_last_pin_of_a_block_in_flight_frees_nothing() {
    let (mut tx, mut rx) = pair(&cfg(1));
    let loan = tx.loan::<f32>(&[16]).unwrap().fill(3.0);
    let pin = loan.pin().expect("a pool block");
    tx.send(MessageBuilder::new().array_loan("x", loan))
        .unwrap();
    // The consumer holds the message: the block is in flight, whatever the pin does.
    let m = rx.recv().unwrap();
    drop(pin);
    assert_eq!(
        tx.free_blocks().unwrap(),
        0,
        "in flight: the pin's drop frees nothing"
    );
    drop(m);
    assert_eq!(tx.free_blocks().unwrap(), 1);
}

#[test]
fn a_bool_loan_travels_as_bool_and_the_receiver_knows_the_pool() {
    let (mut tx, mut rx) = pair(&cfg(3));
    assert_eq!(rx.pool_geometry(), (3, 4096));
    let loan = tx
        .loan::<u8>(&[2, 3])
        .unwrap()
        .write_with(|i| (i % 2) as u8);
    tx.send(MessageBuilder::new().array_loan_bool("b", loan))
        .unwrap();
    let m = rx.recv().unwrap();
    let rec = m.record(0).unwrap();
    let f = rec
        .fields()
        .find_map(|f| match f.unwrap() {
            shm_ring::FieldRef::Array(a) => Some((a.dtype, a.shape.to_vec(), a.bytes.to_vec())),
            _ => None,
        })
        .unwrap();
    assert_eq!(f, (DType::Bool, vec![2, 3], vec![0, 1, 0, 1, 0, 1]));
    assert_eq!(m.leased_blocks(), 1, "zero-copy");
}

#[test]
fn send_timeout_waits_and_gives_the_message_back_with_its_loan() {
    let cfg = ChannelConfig { slots: 2, ..cfg(4) };
    let (mut tx, mut rx) = pair(&cfg);
    while tx.try_send(MessageBuilder::new().tag(1)).is_ok() {}
    let loan = tx.loan::<u32>(&[4]).unwrap().fill(9);
    let t0 = std::time::Instant::now();
    let back = match tx.send_timeout(
        MessageBuilder::new().tag(2).array_loan("x", loan),
        std::time::Duration::from_millis(30),
    ) {
        Err(shm_ring::SendTimeoutError::Timeout(m)) => m,
        other => panic!("expected Timeout, got {other:?}"),
    };
    assert!(t0.elapsed() >= std::time::Duration::from_millis(25));
    while match rx.try_recv() {
        Ok(_) => true,
        Err(shm_ring::TryRecvError::Empty) => false,
        Err(e) => panic!("{e}"),
    } {}
    tx.send_timeout(back, std::time::Duration::from_secs(5))
        .unwrap();
    let m = rx.recv().unwrap();
    assert_eq!(m.tag(), 2);
    assert_eq!(m.record(0).unwrap().slice::<u32>("x").unwrap(), &[9; 4]);
}
