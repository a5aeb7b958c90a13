//! What travels between processes: frames (items and control markers) in batches, their
//! encoding as shm-ring messages (the same for both transports), and the small transport
//! trait the pipeline logic is written against.
//!
//! # Encoding
//! One shm-ring message per batch (message tag [`TAG_BATCH`]): one record per frame, whose u64
//! record tag says what the record is and carries the ordering fields ([`pack`]): an item's
//! fields are the item's arrays and metadata, nothing reserved. The end of stream
//! ([`TAG_EOS`]) and an error report ([`TAG_ERROR`]) are messages of their own whose fields
//! are the counters / the report (no JSON). The socket transport sends the same messages,
//! encoded with `shm_ring::MessageBuilder::encode_inline`.

use std::sync::Arc;
use std::time::Duration;

use shm_ring::{FieldRef, MessageBuilder, MessageView, MetaValue};

use crate::array::Array;
use crate::item::{Item, Leased, Meta};
use crate::source::SourceError;

/// The `(e, k)` of the items made by [`Step::finish`](crate::Step::finish) (and of what later
/// steps make from them): they belong to no input. In the ordered mode their group sorts
/// after every real group and is never released before the end of stream.
pub(crate) const FINISH_E: u32 = u32::MAX;
/// See [`FINISH_E`].
pub(crate) const FINISH_K: u64 = u64::MAX;

/// One entry of a batch.
#[derive(Debug, Clone, PartialEq)]
// An item is a few hundred bytes (its fields inline); boxing it would cost an allocation
// per item.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Frame {
    /// An item derived from record `k` of emitter `e`. `last` marks the last item of the
    /// group of outputs of that record (the ordered mode releases groups by it; both modes
    /// count finished inputs by it).
    Item {
        e: u32,
        k: u64,
        last: bool,
        item: Item,
    },
    /// The group of record `(e, k)` ended (sent when its last output was not
    /// marked `last`, e.g. when the record had no outputs).
    GroupEnd { e: u32, k: u64 },
    /// Emitter `e` sent `n` records in total (forwarded to every downstream peer).
    EmitterDone { e: u32, n: u64 },
    /// End of stream on this connection; nothing follows.
    Eos(Stats),
    /// A failure upstream; the consumer reports it and shuts the pipeline down.
    Error(Report),
}

/// Counters a producer reports with its end marker.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Stats {
    /// Bad records skipped (emitters).
    pub skipped: u64,
    /// Per step name: (inputs processed, nanoseconds spent).
    pub steps: Vec<(String, u64, u64)>,
    /// Arrays sent zero-copy / copied, by this producer.
    pub zero_copy: u64,
    /// Arrays copied.
    pub copied: u64,
}

impl Stats {
    pub(crate) fn merge(&mut self, o: &Stats) {
        self.skipped += o.skipped;
        self.zero_copy += o.zero_copy;
        self.copied += o.copied;
        for (name, n, ns) in &o.steps {
            match self.steps.iter_mut().find(|s| &s.0 == name) {
                Some(s) => {
                    s.1 += n;
                    s.2 += ns;
                }
                None => self.steps.push((name.clone(), *n, *ns)),
            }
        }
    }
}

/// A failure reported by a child through the data path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Report {
    Step {
        step: String,
        stage: usize,
        worker: usize,
        /// The failing input's emitter and record (`None`: end of stream, building).
        emitter: Option<usize>,
        record: Option<u64>,
        input: String,
        message: String,
    },
    Source {
        emitter: usize,
        error: SourceError,
    },
    Other {
        role: String,
        message: String,
    },
    /// An item or batch too large for the channel (`TransportError::TooLarge`).
    TooLarge {
        role: String,
        message: String,
    },
}

/// Why a transport operation failed.
#[derive(Debug, Clone)]
pub(crate) enum TransportError {
    /// The peer closed the connection (or exited) and everything sent was received.
    Closed,
    /// The peer died.
    PeerDied(String),
    /// What was to be sent exceeds what the connection carries (a setting to raise; the
    /// message says which).
    TooLarge(String),
    /// A failure of the shared-memory channel, typed (kept as the source of the pipeline's
    /// [`Error::Transport`](crate::Error::Transport) when this process reports it).
    Channel(std::sync::Arc<shm_ring::Error>),
    /// Anything else.
    Other(String),
}

impl PartialEq for TransportError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (TransportError::Closed, TransportError::Closed) => true,
            (TransportError::PeerDied(a), TransportError::PeerDied(b))
            | (TransportError::TooLarge(a), TransportError::TooLarge(b))
            | (TransportError::Other(a), TransportError::Other(b)) => a == b,
            (TransportError::Channel(a), TransportError::Channel(b)) => {
                a.to_string() == b.to_string()
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Closed => f.write_str("connection closed"),
            TransportError::PeerDied(m) => write!(f, "peer died: {m}"),
            TransportError::TooLarge(m) | TransportError::Other(m) => f.write_str(m),
            TransportError::Channel(e) => e.fmt(f),
        }
    }
}

/// The sending end of one connection.
pub(crate) trait Tx: Send {
    /// Sends one batch; blocks while the connection is full.
    fn send(&mut self, frames: &[Frame]) -> Result<(), TransportError>;
    /// (arrays sent zero-copy, arrays copied) so far.
    fn transfer_counts(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Called while the node waits for input: a chance to give back memory held for
    /// large items that stopped coming.
    fn idle(&mut self) {}
}

/// The receiving end of one connection.
pub(crate) trait Rx: Send {
    /// Receives one batch: waits up to `timeout` (`None`: do not wait).
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<Frame>>, TransportError>;
}

// ----- the encoding: shm-ring messages

/// Message tag of a batch of records (items and ordering markers).
pub(crate) const TAG_BATCH: u32 = 1;
/// Message tag of the end of stream: record 0 holds the counters, one record per step follows.
pub(crate) const TAG_EOS: u32 = 2;
/// Message tag of an error report (one record; its tag says which kind of report).
pub(crate) const TAG_ERROR: u32 = 3;

/// Record kinds of a batch (bits 62..64 of the record tag).
const R_ITEM: u64 = 0;
const R_ITEM_LAST: u64 = 1;
const R_GROUP_END: u64 = 2;
const R_EMITTER_DONE: u64 = 3;

/// Bits of the record index (or count) in a record tag; the emitter takes the 16 above it.
const K_BITS: u32 = 46;
const K_MAX: u64 = (1 << K_BITS) - 1;
const E_MAX: u64 = 0xffff;

/// The record tag of a batch record: kind (2 bits), emitter (16 bits), record index (46 bits).
/// [`FINISH_E`]/[`FINISH_K`] take the all-ones values of their fields.
pub(crate) fn pack(kind: u64, e: u32, k: u64) -> Result<u64, String> {
    let e = if e == FINISH_E { E_MAX } else { u64::from(e) };
    let k = if k == FINISH_K { K_MAX } else { k };
    if e > E_MAX || k > K_MAX || (e == E_MAX) != (k == K_MAX) {
        return Err(format!(
            "record ({e}, {k}) does not fit a record tag (at most {E_MAX} emitters and 2^{K_BITS} records)"
        ));
    }
    Ok(kind << 62 | e << K_BITS | k)
}

/// The inverse of [`pack`].
pub(crate) fn unpack(tag: u64) -> (u64, u32, u64) {
    let (e, k) = ((tag >> K_BITS) & E_MAX, tag & K_MAX);
    if e == E_MAX {
        (tag >> 62, FINISH_E, FINISH_K)
    } else {
        (tag >> 62, e as u32, k)
    }
}

/// The messages a batch of frames becomes: runs of batch records, and each end-of-stream or
/// error frame on its own.
pub(crate) fn segments(frames: &[Frame]) -> impl Iterator<Item = &[Frame]> {
    let control = |f: &Frame| matches!(f, Frame::Eos(_) | Frame::Error(_));
    let mut rest = frames;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = if control(&rest[0]) {
            1
        } else {
            rest.iter().position(control).unwrap_or(rest.len())
        };
        let (seg, r) = rest.split_at(n);
        rest = r;
        Some(seg)
    })
}

/// Longest string a metadata field holds.
const MAX_STR: usize = 60_000;

fn clip(s: &str) -> &str {
    if s.len() <= MAX_STR {
        return s;
    }
    let mut end = MAX_STR;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Adds an item's arrays and metadata to the current record of `b`, in place (the builder is
/// a few hundred bytes: moving it per field cost a quarter of the small-item pipeline's CPU).
fn add_item<'a>(b: &mut MessageBuilder<'a>, item: &'a Item) -> Result<(), String> {
    for (name, a) in item.arrays() {
        b.push_array_raw(name, a.dtype(), a.shape(), a.bytes())
            .map_err(|e| format!("array {name:?}: {e}"))?;
    }
    for (name, m) in item.metas() {
        b.push_meta(
            name,
            match m {
                Meta::I64(v) => MetaValue::I64(*v),
                Meta::F64(v) => MetaValue::F64(*v),
                Meta::Str(s) => MetaValue::Str(s.as_str().into()),
            },
        );
    }
    Ok(())
}

/// One message for a segment (see [`segments`]).
pub(crate) fn build(seg: &[Frame]) -> Result<MessageBuilder<'_>, String> {
    let mut b = MessageBuilder::new();
    match seg {
        [Frame::Eos(s)] => {
            b = b
                .tag(TAG_EOS)
                .meta_i64("skipped", s.skipped as i64)
                .meta_i64("zero_copy", s.zero_copy as i64)
                .meta_i64("copied", s.copied as i64);
            for (name, n, ns) in &s.steps {
                b = b
                    .next_record()
                    .meta_str("step", clip(name))
                    .meta_i64("n", *n as i64)
                    .meta_i64("ns", *ns as i64);
            }
            return Ok(b);
        }
        [Frame::Error(r)] => return Ok(report(b.tag(TAG_ERROR), r)),
        _ => {}
    }
    b.set_tag(TAG_BATCH);
    for (i, f) in seg.iter().enumerate() {
        if i > 0 {
            b.push_next_record();
        }
        match f {
            Frame::Item { e, k, last, item } => {
                let kind = if *last { R_ITEM_LAST } else { R_ITEM };
                b.set_record_tag(pack(kind, *e, *k)?);
                add_item(&mut b, item)?;
            }
            Frame::GroupEnd { e, k } => b.set_record_tag(pack(R_GROUP_END, *e, *k)?),
            Frame::EmitterDone { e, n } => b.set_record_tag(pack(R_EMITTER_DONE, *e, *n)?),
            Frame::Eos(_) | Frame::Error(_) => return Err("control frame inside a batch".into()),
        }
    }
    Ok(b)
}

/// Report kinds (the record tag of an error message).
const REP_STEP: u64 = 1;
const REP_BAD_RECORD: u64 = 2;
const REP_IO: u64 = 3;
const REP_SOURCE_OTHER: u64 = 4;
const REP_OTHER: u64 = 5;
const REP_TOO_LARGE: u64 = 6;

fn report<'a>(b: MessageBuilder<'a>, r: &'a Report) -> MessageBuilder<'a> {
    match r {
        Report::Step {
            step,
            stage,
            worker,
            emitter,
            record,
            input,
            message,
        } => {
            let mut b = b
                .record_tag(REP_STEP)
                .meta_str("step", clip(step))
                .meta_i64("stage", *stage as i64)
                .meta_i64("worker", *worker as i64)
                .meta_str("input", clip(input))
                .meta_str("message", clip(message));
            if let (Some(e), Some(k)) = (emitter, record) {
                b = b
                    .meta_i64("emitter", *e as i64)
                    .meta_i64("record", *k as i64);
            }
            b
        }
        Report::Source { emitter, error } => {
            let b = b.meta_i64("emitter", *emitter as i64);
            match error {
                SourceError::BadRecord {
                    file,
                    line,
                    field,
                    message,
                } => {
                    let b = b
                        .record_tag(REP_BAD_RECORD)
                        .meta_str("file", clip(file))
                        .meta_i64("line", *line as i64)
                        .meta_str("message", clip(message));
                    match field {
                        Some(f) => b.meta_str("field", clip(f)),
                        None => b,
                    }
                }
                SourceError::Io { file, message } => b
                    .record_tag(REP_IO)
                    .meta_str("file", clip(file))
                    .meta_str("message", clip(message)),
                SourceError::Other(m) => {
                    b.record_tag(REP_SOURCE_OTHER).meta_str("message", clip(m))
                }
            }
        }
        Report::Other { role, message } => b
            .record_tag(REP_OTHER)
            .meta_str("role", clip(role))
            .meta_str("message", clip(message)),
        Report::TooLarge { role, message } => b
            .record_tag(REP_TOO_LARGE)
            .meta_str("role", clip(role))
            .meta_str("message", clip(message)),
    }
}

fn read_report(r: &shm_ring::RecordView<'_>) -> Result<Report, String> {
    let s = |n: &str| {
        r.meta_str(n)
            .map(str::to_owned)
            .ok_or_else(|| format!("error report without {n:?}"))
    };
    // Each number is read once and must be an index (>= 0); whether it is one of this
    // pipeline's (stage, worker, emitter) is checked by the consumer against its plan
    // (`Plan::check_report`). Never cast: -1 would become 2^64 - 1 (review 18, hole 4).
    let opt = |n: &str| -> Result<Option<u64>, String> {
        r.meta_i64(n)
            .map(|v| {
                u64::try_from(v)
                    .map_err(|_| format!("an error report naming {n} {v}, not an index"))
            })
            .transpose()
    };
    let i = |n: &str| opt(n)?.ok_or_else(|| format!("error report without {n:?}"));
    let to_usize = |n: &str, v: u64| {
        usize::try_from(v).map_err(|_| format!("an error report naming {n} {v}, not an index"))
    };
    let idx = |n: &str| i(n).and_then(|v| to_usize(n, v));
    let emitter = || idx("emitter");
    Ok(match r.tag() {
        REP_STEP => Report::Step {
            step: s("step")?,
            stage: idx("stage")?,
            worker: idx("worker")?,
            emitter: opt("emitter")?
                .map(|v| to_usize("emitter", v))
                .transpose()?,
            record: opt("record")?,
            input: s("input")?,
            message: s("message")?,
        },
        REP_BAD_RECORD => Report::Source {
            emitter: emitter()?,
            error: SourceError::BadRecord {
                file: s("file")?,
                line: i("line")?,
                field: r.meta_str("field").map(str::to_owned),
                message: s("message")?,
            },
        },
        REP_IO => Report::Source {
            emitter: emitter()?,
            error: SourceError::Io {
                file: s("file")?,
                message: s("message")?,
            },
        },
        REP_SOURCE_OTHER => Report::Source {
            emitter: emitter()?,
            error: SourceError::Other(s("message")?),
        },
        REP_OTHER => Report::Other {
            role: s("role")?,
            message: s("message")?,
        },
        REP_TOO_LARGE => Report::TooLarge {
            role: s("role")?,
            message: s("message")?,
        },
        t => return Err(format!("unknown error report kind {t}")),
    })
}

/// Decodes one message into frames. `lease`: the received message, when zero-copy arrays may
/// stay in it (read in place by the items).
pub(crate) fn decode(
    m: MessageView<'_>,
    out: &mut Vec<Frame>,
    lease: Option<&Arc<shm_ring::Message>>,
) -> Result<(), String> {
    match m.tag() {
        TAG_BATCH => {}
        TAG_EOS => {
            let mut stats = Stats::default();
            for (i, r) in m.records().enumerate() {
                let r = r.map_err(|e| e.to_string())?;
                let v = |n: &str| r.meta_i64(n).unwrap_or(0) as u64;
                if i == 0 {
                    stats.skipped = v("skipped");
                    stats.zero_copy = v("zero_copy");
                    stats.copied = v("copied");
                } else {
                    let name = r.meta_str("step").ok_or("step counters without a name")?;
                    stats.steps.push((name.to_owned(), v("n"), v("ns")));
                }
            }
            out.push(Frame::Eos(stats));
            return Ok(());
        }
        TAG_ERROR => {
            let r = m.record(0).map_err(|e| e.to_string())?;
            out.push(Frame::Error(read_report(&r)?));
            return Ok(());
        }
        t => return Err(format!("unknown message kind {t}")),
    }
    out.reserve(m.len());
    // Small arrays are copied into one buffer for the whole batch; the cell is set whatever
    // happens, so no item can see it unset.
    let shared: crate::arena::Shared = Arc::default();
    let mut arena = crate::arena::BatchArrays::default();
    let r = decode_batch(m, out, lease, &shared, &mut arena);
    let _ = shared.set(arena);
    r
}

fn decode_batch(
    m: MessageView<'_>,
    out: &mut Vec<Frame>,
    lease: Option<&Arc<shm_ring::Message>>,
    shared: &crate::arena::Shared,
    arena: &mut crate::arena::BatchArrays,
) -> Result<(), String> {
    for (r, rec) in m.records().enumerate() {
        let rec = rec.map_err(|e| e.to_string())?;
        let (kind, e, k) = unpack(rec.tag());
        let item = match kind {
            R_ITEM | R_ITEM_LAST => read_item(&rec, r, lease, shared, arena)?,
            R_GROUP_END => {
                out.push(Frame::GroupEnd { e, k });
                continue;
            }
            _ => {
                out.push(Frame::EmitterDone { e, n: k });
                continue;
            }
        };
        out.push(Frame::Item {
            e,
            k,
            last: kind == R_ITEM_LAST,
            item,
        });
    }
    Ok(())
}

fn read_item(
    rec: &shm_ring::RecordView<'_>,
    r: usize,
    lease: Option<&Arc<shm_ring::Message>>,
    shared: &crate::arena::Shared,
    arena: &mut crate::arena::BatchArrays,
) -> Result<Item, String> {
    let mut item = Item::new();
    for f in rec.fields() {
        match f.map_err(|e| e.to_string())? {
            FieldRef::Meta(name, v) => item.push_meta(
                name,
                match v {
                    MetaValue::I64(v) => Meta::I64(v),
                    MetaValue::F64(v) => Meta::F64(v),
                    MetaValue::Str(s) => Meta::Str(s.into_owned()),
                },
            ),
            FieldRef::Array(a) => match lease {
                Some(msg) if a.zero_copy && a.dtype != shm_ring::DType::Bool => {
                    item.insert_leased(
                        a.name,
                        Leased::new(Arc::clone(msg), r, a.name, a.dtype, &a.shape),
                    );
                }
                _ => {
                    if let Some(i) = arena.push(a.dtype, &a.shape, a.bytes) {
                        item.push_batch_array(a.name, shared, i);
                        continue;
                    }
                    let arr = Array::from_bytes(a.dtype, &a.shape, a.bytes)
                        .map_err(|m| format!("array {:?}: {m}", a.name))?;
                    item.push_array(a.name, arr);
                }
            },
        }
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let mut out = Vec::new();
        for seg in segments(frames) {
            let b = build(seg).unwrap();
            let (words, len) = b.encode_inline().unwrap();
            let body = &bytemuck::cast_slice::<u64, u8>(&words)[..len];
            decode(shm_ring::MessageView::decode(body).unwrap(), &mut out, None).unwrap();
        }
        out
    }

    #[test]
    fn frames_round_trip_through_shm_ring_messages() {
        let frames = vec![
            Frame::Item {
                e: 1,
                k: 9,
                last: true,
                item: Item::new()
                    .with("x", array![[1.0f32, 2.0], [3.0, 4.0]])
                    .with("c", array![true, false])
                    .with("h", array![half::f16::from_f32(0.5)])
                    .with("b", array![half::bf16::from_f32(-3.0)])
                    .with("u", array![u64::MAX])
                    .with_meta("id", "é")
                    .with_meta("s", -0.25)
                    .with_meta("n", -3),
            },
            Frame::GroupEnd { e: 0, k: 2 },
            Frame::Item {
                e: FINISH_E,
                k: FINISH_K,
                last: false,
                item: Item::new(),
            },
            Frame::EmitterDone { e: 2, n: 100 },
            Frame::Eos(Stats {
                skipped: 3,
                steps: vec![("a".into(), 4, 5), ("b".into(), 6, 7)],
                zero_copy: 1,
                copied: 2,
            }),
            Frame::Error(Report::Other {
                role: "w".into(),
                message: "m".into(),
            }),
            Frame::Error(Report::Source {
                emitter: 1,
                error: SourceError::BadRecord {
                    file: "f".into(),
                    line: 3,
                    field: None,
                    message: "bad".into(),
                },
            }),
            Frame::Error(Report::Step {
                step: "s".into(),
                stage: 1,
                worker: 2,
                emitter: Some(0),
                record: Some(3),
                input: "emitter 0, record 3".into(),
                message: "boom".into(),
            }),
        ];
        assert_eq!(segments(&frames).count(), 5);
        assert_eq!(round_trip(&frames), frames);
    }

    #[test]
    fn record_tags_pack_and_refuse_what_does_not_fit() {
        for (kind, e, k) in [(0, 0, 0), (3, 65_534, K_MAX - 1), (1, FINISH_E, FINISH_K)] {
            assert_eq!(unpack(pack(kind, e, k).unwrap()), (kind, e, k));
        }
        assert!(pack(0, 65_535, 0).is_err());
        assert!(pack(0, 0, K_MAX).is_err());
        assert!(pack(0, 0, 1 << 50).is_err());
    }
}
