//! Channels with a schema carry data-only messages: fields set and read by position
//! (`SchemaMessage` + `FieldId`, `Receiver::recv_positional`). Round trips (fixed and dynamic
//! shapes, zero-copy loans, metadata, several records), fields refused at send, and the two
//! encodings never mixed.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{name_guard, unique};
use shm_ring::{
    ChannelConfig, DType, Error, FieldError, MessageBuilder, Receiver, Schema, SchemaMessage,
    Sender,
};

fn cfg() -> ChannelConfig {
    ChannelConfig {
        linger: Duration::ZERO,
        ..ChannelConfig::default()
    }
}

fn schema() -> Schema {
    Schema::new()
        .array("target", DType::F32, &[16])
        .array_dyn("feats", DType::F64, 2)
        .meta("item_id")
        .meta("scale")
        .meta("start")
}

#[test]
fn round_trip_fixed_dynamic_loans_meta_and_records() {
    let name = unique("pos-rt");
    let guard = name_guard(&[&name]);
    let s = schema();
    let [t, f, id, scale, start] =
        ["target", "feats", "item_id", "scale", "start"].map(|n| s.field(n).unwrap());
    let mut tx = Sender::with_schema(&name, &cfg(), &s).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    let target: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let feats = ndarray::Array2::from_shape_fn((3, 5), |(i, j)| (i * 10 + j) as f64);
    let feats2 = ndarray::Array2::from_shape_fn((2, 1), |(i, _)| -(i as f64));
    let loan = tx
        .loan::<f32>(&[16])
        .unwrap()
        .write_with(|i| 100.0 + i as f32);
    let loan_ptr_block = tx.free_blocks().unwrap();
    let msg = SchemaMessage::new(&s)
        .tag(9)
        .slice(t, &target)
        .array(f, &feats)
        .meta_str(id, "A-17")
        .meta_f64(scale, 0.5)
        .meta_i64(start, 1_700_000_000)
        .next_record()
        .loan(t, loan)
        .array(f, &feats2)
        .meta_str(id, "")
        .meta_f64(scale, -1.0)
        .meta_i64(start, -3);
    assert_eq!(msg.len(), 2);
    tx.send(msg).unwrap();
    assert_eq!(tx.stats().zero_copy_arrays, 1, "the loan went zero-copy");
    let mut seen = 0;
    let n = rx
        .recv_positional(4, Some(Duration::from_secs(5)), |m| {
            assert_eq!((m.tag(), m.len()), (9, 2));
            let r0 = m.record(0).unwrap();
            assert_eq!(r0.slice::<f32>(t).unwrap(), &target[..]);
            assert_eq!(r0.array::<f64>(f).unwrap(), feats.view().into_dyn());
            assert_eq!(r0.meta_str(id).unwrap(), "A-17");
            assert_eq!(r0.meta_f64(scale).unwrap(), 0.5);
            assert_eq!(r0.meta_i64(start).unwrap(), 1_700_000_000);
            let r1 = m.record(1).unwrap();
            let a = r1.array::<f32>(t).unwrap();
            assert_eq!(a.shape(), &[16]);
            assert_eq!(a[[3]], 103.0);
            assert_eq!(r1.array::<f64>(f).unwrap(), feats2.view().into_dyn());
            assert_eq!(r1.meta_str(id).unwrap(), "");
            assert_eq!(r1.meta_i64(start).unwrap(), -3);
            assert!(matches!(
                m.record(2),
                Err(Error::Field(FieldError::NoSuchRecord { index: 2, len: 2 }))
            ));
            seen += 1;
        })
        .unwrap();
    assert_eq!((n, seen), (1, 1));
    // The loan's block came back once the batch ended.
    assert_eq!(tx.free_blocks().unwrap(), loan_ptr_block + 1);
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn wrong_type_lookups_are_field_errors() {
    let name = unique("pos-type");
    let guard = name_guard(&[&name]);
    let s = schema();
    let [t, f, id, scale, start] =
        ["target", "feats", "item_id", "scale", "start"].map(|n| s.field(n).unwrap());
    let mut tx = Sender::with_schema(&name, &cfg(), &s).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    let target = [1.0f32; 16];
    let feats = ndarray::Array2::<f64>::zeros((1, 2));
    tx.send(
        tx.schema_message()
            .unwrap()
            .slice(t, &target)
            .array(f, &feats)
            .meta_i64(id, 1)
            .meta_f64(scale, 2.0)
            .meta_i64(start, 3),
    )
    .unwrap();
    rx.recv_positional(1, Some(Duration::from_secs(5)), |m| {
        let r = m.record(0).unwrap();
        let e = r.slice::<f64>(t).unwrap_err();
        assert!(
            matches!(&e, Error::Field(FieldError::WrongType { name, .. }) if name == "target"),
            "{e:?}"
        );
        assert!(matches!(
            r.array::<f32>(id),
            Err(Error::Field(FieldError::NotAnArray { .. }))
        ));
        assert!(matches!(
            r.meta_i64(t),
            Err(Error::Field(FieldError::WrongType { .. }))
        ));
        assert!(matches!(
            r.meta_str(id),
            Err(Error::Field(FieldError::WrongType { .. }))
        ));
        assert!(matches!(
            r.meta_i64(scale),
            Err(Error::Field(FieldError::WrongType { .. }))
        ));
        let other = Schema::new()
            .meta("a")
            .meta("b")
            .meta("c")
            .meta("d")
            .meta("e")
            .meta("f");
        let far = other.field("f").unwrap();
        assert!(matches!(
            r.meta(far),
            Err(Error::Field(FieldError::OutOfRange { .. }))
        ));
    })
    .unwrap();
    drop((tx, rx));
    guard.assert_gone();
}

#[test]
fn missing_and_wrongly_typed_fields_are_refused_at_send() {
    let name = unique("pos-refuse");
    let guard = name_guard(&[&name]);
    let s = schema();
    let [t, f, id, scale, _start] =
        ["target", "feats", "item_id", "scale", "start"].map(|n| s.field(n).unwrap());
    let mut tx = Sender::with_schema(&name, &cfg(), &s).unwrap();
    let short = [0f32; 15];
    let full = [0f32; 16];
    let wrong_dtype = [0f64; 16];
    let feats = ndarray::Array2::<f64>::zeros((1, 2));
    let feats3 = ndarray::Array3::<f64>::zeros((1, 2, 1));
    // Missing: `start` is not set.
    let e = tx
        .send(
            SchemaMessage::new(&s)
                .slice(t, &full)
                .array(f, &feats)
                .meta_i64(id, 1)
                .meta_f64(scale, 1.0),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Field(FieldError::Missing { name, record: 0 }) if name == "start"),
        "{e:?}"
    );
    // A fixed shape of another length, another dtype, another rank, an array for metadata.
    let cases: Vec<(SchemaMessage<'_>, &str)> = vec![
        (SchemaMessage::new(&s).slice(t, &short), "target"),
        (SchemaMessage::new(&s).slice(t, &wrong_dtype), "target"),
        (
            SchemaMessage::new(&s).slice(t, &full).array(f, &feats3),
            "feats",
        ),
        (
            SchemaMessage::new(&s)
                .slice(t, &full)
                .array(f, &feats)
                .slice(id, &full),
            "item_id",
        ),
        (SchemaMessage::new(&s).meta_i64(t, 1), "target"),
    ];
    for (m, field) in cases {
        let e = tx.send(m).unwrap_err();
        assert!(
            matches!(&e, Error::Field(FieldError::WrongType { name, .. }) if name == field),
            "{field}: {e:?}"
        );
    }
    // A FieldId past the schema.
    let longer = Schema::new()
        .meta("a")
        .meta("b")
        .meta("c")
        .meta("d")
        .meta("e")
        .meta("f");
    let far = longer.field("f").unwrap();
    let e = tx
        // (then more fields and records: the builder stays usable, the send refuses it)
        .send(
            SchemaMessage::new(&s)
                .meta_i64(far, 1)
                .meta_i64(id, 2)
                .next_record()
                .meta_i64(id, 3),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::Field(FieldError::OutOfRange { .. })),
        "{e:?}"
    );
    assert_eq!(tx.stats().messages, 0);
    drop(tx);
    guard.assert_gone();
}

#[test]
fn the_two_encodings_never_mix() {
    let (a, b) = (unique("pos-mix-s"), unique("pos-mix-p"));
    let guard = name_guard(&[&a, &b]);
    let s = Schema::new().meta("n");
    let n = s.field("n").unwrap();
    let mut stx = Sender::with_schema(&a, &cfg(), &s).unwrap();
    let mut srx = Receiver::open(&a).unwrap();
    let mut ptx = Sender::create(&b, &cfg()).unwrap();
    let mut prx = Receiver::open(&b).unwrap();
    // Self-describing on a schema channel, data-only on a plain one: refused at send.
    let e = stx
        .send(MessageBuilder::new().meta_i64("n", 1))
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(w) if w.contains("SchemaMessage")),
        "{e:?}"
    );
    let e = ptx.send(SchemaMessage::new(&s).meta_i64(n, 1)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(w) if w.contains("without a schema")),
        "{e:?}"
    );
    assert!(matches!(
        ptx.schema_message(),
        Err(Error::InvalidArgument(_))
    ));
    // The self-describing receive calls refuse a schema channel, and the reverse.
    stx.send(SchemaMessage::new(&s).meta_i64(n, 5)).unwrap();
    ptx.send(MessageBuilder::new().meta_i64("n", 6)).unwrap();
    assert!(matches!(
        srx.recv_batch(1, Some(Duration::ZERO), |_| {}),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(srx.try_recv(), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        prx.recv_positional(1, Some(Duration::ZERO), |_| {}),
        Err(Error::InvalidArgument(_))
    ));
    // Nothing was consumed by the refusals: each message is read the right way.
    let mut got = 0;
    srx.recv_positional(1, Some(Duration::from_secs(5)), |m| {
        got = m.record(0).unwrap().meta_i64(n).unwrap()
    })
    .unwrap();
    assert_eq!(got, 5);
    assert_eq!(
        prx.recv().unwrap().record(0).unwrap().meta_i64("n"),
        Some(6)
    );
    drop((stx, srx, ptx, prx));
    guard.assert_gone();
}
