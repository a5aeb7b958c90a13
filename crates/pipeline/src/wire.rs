//! What travels between processes: frames (items and control markers) in batches, and the
//! small transport trait the pipeline logic is written against.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::item::{Array, Item, Meta};
use crate::source::SourceError;

/// The `(e, k)` of the items made by [`Step::finish`](crate::Step::finish) (and of what later
/// steps make from them): they belong to no input. In the ordered mode their group sorts
/// after every real group and is never released before the end of stream.
pub(crate) const FINISH_E: u32 = u32::MAX;
/// See [`FINISH_E`].
pub(crate) const FINISH_K: u64 = u64::MAX;

/// One entry of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    /// An item derived from record `k` of emitter `e`. `last` (ordered mode only) marks the
    /// last item of the group of outputs of that record.
    Item {
        e: u32,
        k: u64,
        last: bool,
        item: Item,
    },
    /// Ordered mode: the group of record `(e, k)` ended (sent when its last output was not
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Report {
    Step {
        step: String,
        stage: usize,
        worker: usize,
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
}

/// Why a transport operation failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TransportError {
    /// The peer closed the connection (or exited) and everything sent was received.
    Closed,
    /// The peer died.
    PeerDied(String),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportError::Closed => f.write_str("connection closed"),
            TransportError::PeerDied(m) => write!(f, "peer died: {m}"),
            TransportError::Other(m) => f.write_str(m),
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
}

/// The receiving end of one connection.
pub(crate) trait Rx: Send {
    /// Receives one batch: waits up to `timeout` (`None`: do not wait).
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<Frame>>, TransportError>;
}

// ----- a compact binary encoding (used by the socket transport and for tests)

const F_ITEM: u8 = 1;
const F_GROUP_END: u8 = 2;
const F_EMITTER_DONE: u8 = 3;
const F_EOS: u8 = 4;
const F_ERROR: u8 = 5;

pub(crate) fn encode(frames: &[Frame], out: &mut Vec<u8>) {
    put_u32(out, frames.len() as u32);
    for f in frames {
        match f {
            Frame::Item { e, k, last, item } => {
                out.push(F_ITEM);
                put_u32(out, *e);
                put_u64(out, *k);
                out.push(u8::from(*last));
                encode_item(item, out);
            }
            Frame::GroupEnd { e, k } => {
                out.push(F_GROUP_END);
                put_u32(out, *e);
                put_u64(out, *k);
            }
            Frame::EmitterDone { e, n } => {
                out.push(F_EMITTER_DONE);
                put_u32(out, *e);
                put_u64(out, *n);
            }
            Frame::Eos(stats) => {
                out.push(F_EOS);
                put_str(out, &serde_json::to_string(stats).unwrap_or_default());
            }
            Frame::Error(r) => {
                out.push(F_ERROR);
                put_str(out, &serde_json::to_string(r).unwrap_or_default());
            }
        }
    }
}

fn encode_item(item: &Item, out: &mut Vec<u8>) {
    put_u32(out, item.arrays().count() as u32);
    for (name, a) in item.arrays() {
        put_str(out, name);
        out.push(a.code());
        put_u32(out, a.shape().len() as u32);
        for &d in a.shape() {
            put_u64(out, d as u64);
        }
        a.with_bytes(|b| {
            put_u64(out, b.len() as u64);
            out.extend_from_slice(b);
        });
    }
    put_u32(out, item.metas().count() as u32);
    for (name, m) in item.metas() {
        put_str(out, name);
        match m {
            Meta::I64(v) => {
                out.push(0);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::F64(v) => {
                out.push(1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.push(2);
                put_str(out, s);
            }
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

/// A bounds-checked reader over an encoded batch.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| format!("truncated batch at byte {}", self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|e| e.to_string())
    }
}

pub(crate) fn decode(buf: &[u8]) -> Result<Vec<Frame>, String> {
    let mut r = Reader { buf, pos: 0 };
    let n = r.u32()? as usize;
    let mut frames = Vec::with_capacity(n.min(buf.len()));
    for _ in 0..n {
        let f = match r.u8()? {
            F_ITEM => {
                let e = r.u32()?;
                let k = r.u64()?;
                let last = r.u8()? != 0;
                Frame::Item {
                    e,
                    k,
                    last,
                    item: decode_item(&mut r)?,
                }
            }
            F_GROUP_END => Frame::GroupEnd {
                e: r.u32()?,
                k: r.u64()?,
            },
            F_EMITTER_DONE => Frame::EmitterDone {
                e: r.u32()?,
                n: r.u64()?,
            },
            F_EOS => Frame::Eos(serde_json::from_str(r.str()?).map_err(|e| e.to_string())?),
            F_ERROR => Frame::Error(serde_json::from_str(r.str()?).map_err(|e| e.to_string())?),
            other => return Err(format!("unknown frame kind {other}")),
        };
        frames.push(f);
    }
    if r.pos != buf.len() {
        return Err("trailing bytes after batch".into());
    }
    Ok(frames)
}

fn decode_item(r: &mut Reader<'_>) -> Result<Item, String> {
    let mut item = Item::new();
    let na = r.u32()?;
    for _ in 0..na {
        let name = r.str()?;
        let code = r.u8()?;
        let ndim = r.u32()? as usize;
        if ndim > 32 {
            return Err(format!("array {name:?} has {ndim} dimensions"));
        }
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            shape.push(usize::try_from(r.u64()?).map_err(|e| e.to_string())?);
        }
        let len = usize::try_from(r.u64()?).map_err(|e| e.to_string())?;
        let bytes = r.take(len)?;
        item.insert(name, Array::from_bytes(code, &shape, bytes)?);
    }
    let nm = r.u32()?;
    for _ in 0..nm {
        let name = r.str()?;
        let m = match r.u8()? {
            0 => Meta::I64(r.u64()? as i64),
            1 => Meta::F64(f64::from_bits(r.u64()?)),
            2 => Meta::Str(r.str()?.to_owned()),
            t => return Err(format!("unknown metadata type {t}")),
        };
        item.set_meta(name, m);
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn batches_round_trip_and_truncation_is_an_error() {
        let frames = vec![
            Frame::Item {
                e: 1,
                k: 9,
                last: true,
                item: Item::new()
                    .with_array("x", array![[1.0f32, 2.0], [3.0, 4.0]])
                    .with_array("c", array![1u8, 0])
                    .with_str("id", "é")
                    .with_f64("s", -0.25)
                    .with_i64("n", -3),
            },
            Frame::GroupEnd { e: 0, k: 2 },
            Frame::EmitterDone { e: 2, n: 100 },
            Frame::Eos(Stats {
                skipped: 3,
                steps: vec![("a".into(), 4, 5)],
                zero_copy: 1,
                copied: 2,
            }),
            Frame::Error(Report::Other {
                role: "w".into(),
                message: "m".into(),
            }),
        ];
        let mut buf = Vec::new();
        encode(&frames, &mut buf);
        assert_eq!(decode(&buf).unwrap(), frames);
        for cut in [1, 10, buf.len() / 2, buf.len() - 1] {
            assert!(decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }
}
