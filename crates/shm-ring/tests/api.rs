//! API guards: a loan cannot travel through another sender, `try_send` hands the whole
//! message (loans included) back, and field/record lookups fail with their own error types.
#![cfg(not(loom))]

use std::os::fd::AsFd;

use shm_ring::{
    CalibrateError, ChannelConfig, DType, DecodeError, EncodeError, Error, FieldError, Message,
    MessageBuilder, MessageView, Receiver, SendError, Sender, TrySendError,
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
        Err(FieldError::NoSuchRecord { index: 1, len: 1 }) => {}
        other => panic!("expected NoSuchRecord, got {other:?}"),
    }
    match m.record(0).unwrap().array::<f32>("x") {
        Err(FieldError::NoSuchField { name, known }) => {
            assert_eq!(name, "x");
            assert_eq!(known, ["n"]);
        }
        other => panic!("expected NoSuchField, got {other:?}"),
    }
}

/// Reading an array as another element type fails with both dtypes, and the umbrella
/// [`Error`] keeps the variant whole.
#[test]
fn a_wrong_dtype_names_both_and_converts_whole() {
    let (mut tx, mut rx) = pair(&ChannelConfig::default());
    let x = [1.0f32, 2.0];
    tx.send(MessageBuilder::new().array_slice("x", &[2], &x).unwrap())
        .unwrap();
    let m = rx.recv().unwrap();
    let r = m.record(0).unwrap();
    let e = r.array::<f64>("x").unwrap_err();
    let wrong = FieldError::WrongDType {
        name: "x".into(),
        found: DType::F32,
        expected: DType::F64,
    };
    assert_eq!(e, wrong);
    assert_eq!(
        r.slice::<i32>("x").unwrap_err(),
        FieldError::WrongDType {
            name: "x".into(),
            found: DType::F32,
            expected: DType::I32,
        }
    );
    assert_eq!(
        r.array_bool("x").unwrap_err(),
        FieldError::WrongDType {
            name: "x".into(),
            found: DType::F32,
            expected: DType::Bool,
        }
    );
    assert!(e.to_string().contains("read it as f32"), "{e}");
    assert!(matches!(Error::from(e), Error::Field(f) if f == wrong));
}

/// A byte other than 0 or 1 in a boolean array is refused with the array's name and the byte.
#[test]
fn a_bool_array_holding_another_byte_is_not_a_bool() {
    let b = ndarray::arr1(&[true, false, true]);
    let (words, len) = MessageBuilder::new()
        .array_bool("b", &b)
        .encode_inline()
        .unwrap();
    let mut body = bytemuck::cast_slice::<u64, u8>(&words)[..len].to_vec();
    // The array's data is the body's last (padded) word.
    let at = len - 8;
    assert_eq!(body[at..at + 3], [1, 0, 1]);
    body[at + 2] = 2;
    let m = MessageView::decode(&body).unwrap();
    let e = m.record(0).unwrap().array_bool("b").unwrap_err();
    let bad = FieldError::NotABool {
        name: "b".into(),
        byte: 2,
    };
    assert_eq!(e, bad);
    assert!(matches!(Error::from(e), Error::Field(f) if f == bad));
}

/// Garbage is not a message: decoding it fails with what is malformed, and the umbrella
/// [`Error`] keeps the variant whole.
#[test]
fn garbage_does_not_decode() {
    let garbage = [0xA5u8; 64];
    let e = MessageView::decode(&garbage).unwrap_err();
    match &e {
        DecodeError::Malformed(why) => assert!(why.contains("message magic"), "{why}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
    assert!(matches!(Error::from(e.clone()), Error::Decode(d) if d == e));
    // A valid body cut short claims more bytes than it has.
    let (words, len) = MessageBuilder::new()
        .meta_i64("n", 1)
        .encode_inline()
        .unwrap();
    let body = &bytemuck::cast_slice::<u64, u8>(&words)[..len];
    match MessageView::decode(&body[..len - 8]) {
        Err(DecodeError::Malformed(why)) => assert!(why.contains("claims"), "{why}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

/// A message outside the encoding's limits, or holding a loan, is refused by `encode_inline`
/// with what to change; the umbrella [`Error`] keeps the variant whole.
#[test]
fn encode_inline_names_the_limit_broken() {
    let long = "n".repeat(EncodeError::MAX_NAME + 1);
    let e = MessageBuilder::new()
        .meta_i64(long.as_str(), 1)
        .encode_inline()
        .unwrap_err();
    assert_eq!(e, EncodeError::NameTooLong { name: long.clone() });
    assert!(
        matches!(Error::from(e), Error::Encode(EncodeError::NameTooLong { name }) if name == long)
    );

    let text = "t".repeat(EncodeError::MAX_STR + 1);
    let e = MessageBuilder::new()
        .meta_str("s", text.as_str())
        .encode_inline()
        .unwrap_err();
    assert_eq!(
        e,
        EncodeError::StringTooLong {
            name: "s".into(),
            len: EncodeError::MAX_STR + 1
        }
    );

    let deep = ndarray::ArrayD::<u8>::zeros(ndarray::IxDyn(&[1; EncodeError::MAX_NDIM + 1]));
    let e = MessageBuilder::new()
        .array("a", &deep)
        .encode_inline()
        .unwrap_err();
    assert_eq!(
        e,
        EncodeError::TooManyDims {
            name: "a".into(),
            ndim: EncodeError::MAX_NDIM + 1
        }
    );

    let e = MessageBuilder::new()
        .meta_i64("d", 1)
        .meta_f64("d", 2.0)
        .encode_inline()
        .unwrap_err();
    assert_eq!(
        e,
        EncodeError::DuplicateField {
            name: "d".into(),
            record: 0
        }
    );
    assert!(e.to_string().contains("rename one"), "{e}");

    let (mut tx, _rx) = pair(&ChannelConfig::default());
    let loan = tx.loan::<f32>(&[4]).unwrap().fill(1.0);
    let e = MessageBuilder::new()
        .array_loan("l", loan)
        .encode_inline()
        .unwrap_err();
    assert_eq!(e, EncodeError::Loaned { name: "l".into() });
    assert!(e.to_string().contains("Sender::send"), "{e}");
}

/// `calibrate`'s error names the step that failed and converts whole into [`Error`], its
/// source kept.
#[test]
fn a_calibration_error_converts_whole() {
    let lost = CalibrateError::LostData {
        sent: 4096,
        received: 1024,
    };
    assert!(
        lost.to_string().contains("4096 sent but 1024 received"),
        "{lost}"
    );
    assert!(matches!(
        Error::from(lost),
        Error::Calibrate(CalibrateError::LostData {
            sent: 4096,
            received: 1024
        })
    ));
    let recv = Error::from(CalibrateError::Recv(shm_ring::RecvError::Disconnected));
    assert!(recv.to_string().contains("receiving"), "{recv}");
}

/// A wrapped error's text is part of its wrapper's `Display`, so walking `source()` never
/// prints a message that the one above it already said (a user's "caused by:" chain).
#[test]
fn an_error_chain_prints_each_message_once() {
    let errors: Vec<Box<dyn std::error::Error>> = vec![
        Box::new(Error::from(CalibrateError::Recv(
            shm_ring::RecvError::Disconnected,
        ))),
        Box::new(shm_ring::LoanError::Send(shm_ring::SendError::Os(
            std::io::Error::from_raw_os_error(libc_enomem()),
        ))),
        Box::new(Error::from(shm_ring::RecvTimeoutError::Failed(
            shm_ring::RecvError::Corrupt("a record header past the ring".into()),
        ))),
    ];
    for e in errors {
        let mut chain = vec![e.to_string()];
        let mut next = e.source();
        while let Some(inner) = next {
            chain.push(inner.to_string());
            next = inner.source();
        }
        for pair in chain.windows(2) {
            assert!(!pair[0].contains(&pair[1]), "printed twice: {chain:?}");
        }
    }
}

/// An empty channel is not a timeout: `try_recv`'s `Empty` stays `Empty` in the umbrella error.
#[test]
fn an_empty_channel_converts_to_empty_not_to_a_timeout() {
    let (_tx, mut rx) = pair(&ChannelConfig::default());
    let e = rx.try_recv().expect_err("nothing was sent");
    assert!(matches!(e, shm_ring::TryRecvError::Empty), "{e}");
    let umbrella = Error::from(e);
    assert!(matches!(umbrella, Error::Empty), "{umbrella:?}");
    assert_eq!(
        umbrella.to_string(),
        shm_ring::TryRecvError::Empty.to_string()
    );
}

/// ENOMEM, without a libc dependency in this test.
fn libc_enomem() -> i32 {
    12
}

/// An array whose bytes do not match its shape, or of too many dimensions, is refused when
/// added, with what to change; the umbrella [`Error`] keeps the variant whole.
#[test]
fn an_array_of_the_wrong_length_is_refused_when_added() {
    let e = MessageBuilder::new()
        .array_slice("x", &[2, 3], &[0f32; 5])
        .unwrap_err();
    let wrong = EncodeError::ShapeMismatch {
        name: "x".into(),
        shape: vec![2, 3],
        dtype: DType::F32,
        bytes: 20,
    };
    assert_eq!(e, wrong);
    assert!(e.to_string().contains("its elements times 4 bytes"), "{e}");
    assert!(matches!(Error::from(e), Error::Encode(w) if w == wrong));
    let e = MessageBuilder::new()
        .array_raw("y", DType::U8, &[1; EncodeError::MAX_NDIM + 1], &[0])
        .unwrap_err();
    assert_eq!(
        e,
        EncodeError::TooManyDims {
            name: "y".into(),
            ndim: EncodeError::MAX_NDIM + 1
        }
    );
}
