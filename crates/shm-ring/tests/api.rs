//! API guards: a loan cannot travel through another sender, `try_send` hands the whole
//! message (loans included) back, and field/record lookups fail with their own error types.
#![cfg(not(loom))]

use std::os::fd::AsFd;

use shm_ring::{
    ChannelConfig, Error, FieldError, Message, MessageBuilder, Receiver, SendError, Sender,
    TrySendError,
};

fn pair(cfg: &ChannelConfig) -> (Sender, Receiver) {
    let tx = Sender::<Message>::anonymous(cfg).unwrap();
    let rx = Receiver::<Message>::from_fd(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    (tx, rx)
}

#[test]
fn a_loan_from_another_sender_is_refused_and_goes_home() {
    let cfg = ChannelConfig::default();
    let (mut a, mut rx_a) = pair(&cfg);
    let (mut b, _rx_b) = pair(&cfg);
    let all = a.free_blocks().unwrap();
    let loan = a.loan::<f32>(&[8]).unwrap().fill(2.5);
    assert_eq!(a.free_blocks().unwrap(), all - 1);
    // Through the other sender: refused, and the message (with the loan) comes back.
    let back = match b.try_send(MessageBuilder::new().array_loan("x", loan)) {
        Err(TrySendError::Failed(SendError::InvalidArgument(why), msg)) => {
            assert!(why.contains("loaned from another sender"), "{why}");
            msg
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Through its own sender it travels.
    a.send(back).unwrap();
    let m = rx_a.recv().unwrap();
    assert_eq!(m.record(0).unwrap().slice::<f32>("x").unwrap(), &[2.5; 8]);
    drop(m);
    assert_eq!(a.free_blocks().unwrap(), all);
    // Refused by a blocking send, the loan is dropped with the message: its block goes back
    // to its own pool, not to the other sender's.
    let loan = a.loan::<f32>(&[8]).unwrap().fill(1.0);
    let e = b.send(MessageBuilder::new().array_loan("x", loan));
    assert!(matches!(e, Err(SendError::InvalidArgument(_))), "{e:?}");
    assert_eq!(a.free_blocks().unwrap(), all);
    assert_eq!(b.free_blocks().unwrap(), all);
}

#[test]
fn try_send_on_full_gives_the_message_back_with_its_loan() {
    let cfg = ChannelConfig {
        slots: 2,
        ..ChannelConfig::default()
    };
    let (mut tx, mut rx) = pair(&cfg);
    let small = [0u8; 8];
    while tx
        .try_send(
            MessageBuilder::new()
                .array_slice("s", &[8], &small)
                .unwrap(),
        )
        .is_ok()
    {}
    let loan = tx.loan::<u32>(&[4]).unwrap().write_with(|i| i as u32 * 10);
    let back = match tx.try_send(MessageBuilder::new().tag(9).array_loan("x", loan)) {
        Err(TrySendError::Full(msg)) => msg,
        other => panic!("expected Full, got {other:?}"),
    };
    while match rx.try_recv() {
        Ok(_) => true,
        Err(shm_ring::TryRecvError::Empty) => false,
        Err(e) => panic!("{e}"),
    } {}
    tx.try_send(back).unwrap();
    let m = rx.recv().unwrap();
    assert_eq!((m.tag(), m.view().len()), (9, 1)); // the message given back, whole
    assert_eq!(
        m.record(0).unwrap().slice::<u32>("x").unwrap(),
        &[0, 10, 20, 30]
    );
    drop(rx);
    let e = tx.try_send(MessageBuilder::new().tag(1));
    assert!(matches!(e, Err(TrySendError::Disconnected(_))), "{e:?}");
}

#[test]
fn lookups_fail_with_field_errors() {
    let (mut tx, mut rx) = pair(&ChannelConfig::default());
    tx.send(MessageBuilder::new().meta_i64("n", 1)).unwrap();
    let m = rx.recv().unwrap();
    match m.record(1) {
        Err(Error::Field(FieldError::NoSuchRecord { index: 1, len: 1 })) => {}
        other => panic!("expected NoSuchRecord, got {other:?}"),
    }
    match m.record(0).unwrap().array::<f32>("x") {
        Err(Error::Field(FieldError::NoSuchField { name, known })) => {
            assert_eq!(name, "x");
            assert_eq!(known, ["n"]);
        }
        other => panic!("expected NoSuchField, got {other:?}"),
    }
}
