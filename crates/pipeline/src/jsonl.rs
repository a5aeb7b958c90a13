//! The JSON-lines source: a file split into line-aligned byte ranges, one record per line.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use crate::array::Array;
use crate::item::Item;
use crate::source::{Source, SourceError};

/// Splits a file into `parts` line-aligned byte ranges (the seed's `split_seeks`).
///
/// The nominal boundaries `size * i / parts` move forward to the next line start; a line
/// belongs to the range holding its first byte. The ranges are disjoint, cover the file, and
/// some may be empty.
///
/// # Errors
/// When the file cannot be read.
///
/// # Examples
/// ```
/// let p = std::env::temp_dir().join(format!("split-doc-{}.jsonl", std::process::id()));
/// std::fs::write(&p, "{}\n{}\n{}\n").unwrap();
/// let r = shmpipe::split_seeks(&p, 2).unwrap();
/// assert_eq!(r, vec![0..6, 6..9]);
/// std::fs::remove_file(&p).unwrap();
/// ```
pub fn split_seeks(path: &Path, parts: usize) -> std::io::Result<Vec<Range<u64>>> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let mut bounds = vec![0u64];
    for i in 1..parts.max(1) {
        let nominal = (size as u128 * i as u128 / parts as u128) as u64;
        let prev = *bounds.last().unwrap_or(&0);
        bounds.push(next_line_start(&mut f, nominal.max(prev), size)?);
    }
    bounds.push(size);
    Ok(bounds.windows(2).map(|w| w[0]..w[1]).collect())
}

/// The first line start at or after `pos`: `pos` itself when `pos == 0` or the byte before
/// it is a newline.
fn next_line_start(f: &mut File, pos: u64, size: u64) -> std::io::Result<u64> {
    if pos == 0 || pos >= size {
        return Ok(pos.min(size));
    }
    f.seek(SeekFrom::Start(pos - 1))?;
    let mut buf = [0u8; 8192];
    let mut at = pos - 1;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(size);
        }
        if let Some(i) = buf[..n].iter().position(|&b| b == b'\n') {
            return Ok(at + i as u64 + 1);
        }
        at += n as u64;
    }
}

/// How a JSON field is converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FieldKind {
    /// A (nested, rectangular) number array -> `f32` array. `"NaN"` strings and `null` are NaN.
    F32Array,
    /// A number array -> `f64` array.
    F64Array,
    /// An integer array -> `i64` array.
    I64Array,
    /// An integer -> `i64` metadata.
    I64,
    /// A number -> `f64` metadata.
    F64,
    /// A string -> string metadata.
    Str,
}

/// A JSON-lines file source: one JSON object per line, each becoming an [`Item`].
///
/// Declared fields are required and converted as declared; other fields are inferred:
/// number arrays become `f32` arrays, integers `i64`, other numbers `f64`, strings strings,
/// booleans `0/1`, `null` is skipped. Malformed records give [`SourceError::BadRecord`] naming
/// the file, the line and the field. Emitters read line-aligned byte ranges ([`split_seeks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonLines {
    path: PathBuf,
    fields: Vec<(String, FieldKind)>,
}

impl JsonLines {
    /// A source reading `path`.
    pub fn new(path: impl AsRef<Path>) -> JsonLines {
        JsonLines {
            path: path.as_ref().to_owned(),
            fields: Vec::new(),
        }
    }

    /// Declares a required field and its conversion.
    pub fn field(mut self, name: &str, kind: FieldKind) -> JsonLines {
        self.fields.push((name.to_owned(), kind));
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens part `part` of `parts`.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub fn open(&self, part: usize, parts: usize) -> Result<JsonLinesPart, SourceError> {
        let io = |e: std::io::Error| SourceError::Io {
            file: self.path.display().to_string(),
            message: e.to_string(),
        };
        let ranges = split_seeks(&self.path, parts).map_err(io)?;
        let range = ranges[part].clone();
        let mut f = File::open(&self.path).map_err(io)?;
        f.seek(SeekFrom::Start(range.start)).map_err(io)?;
        let mut data = vec![0u8; (range.end - range.start) as usize];
        f.read_exact(&mut data).map_err(io)?;
        let mut lines = Vec::new();
        let mut start = 0usize;
        let mut line_no = 0u64;
        for i in 0..=data.len() {
            if i == data.len() || data[i] == b'\n' {
                if i > start && !data[start..i].iter().all(u8::is_ascii_whitespace) {
                    lines.push((start..i, line_no));
                }
                line_no += 1;
                start = i + 1;
            }
        }
        Ok(JsonLinesPart {
            spec: self.clone(),
            data,
            lines,
            base_offset: range.start,
            base_line: None,
        })
    }
}

/// One emitter's part of a [`JsonLines`] file.
#[derive(Debug)]
pub struct JsonLinesPart {
    spec: JsonLines,
    data: Vec<u8>,
    /// Byte range in `data` and line number relative to the part start, of every non-blank line.
    lines: Vec<(Range<usize>, u64)>,
    base_offset: u64,
    /// 1-based line number of the part's first line; computed on the first error.
    base_line: Option<u64>,
}

impl JsonLinesPart {
    fn line_number(&mut self, rel: u64) -> u64 {
        let base = *self.base_line.get_or_insert_with(|| {
            let mut n = 1u64;
            if let Ok(f) = File::open(&self.spec.path) {
                let mut r = std::io::BufReader::new(f).take(self.base_offset);
                let mut buf = [0u8; 65536];
                while let Ok(k) = r.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                    n += buf[..k].iter().filter(|&&b| b == b'\n').count() as u64;
                }
            }
            n
        });
        base + rel
    }
}

impl Source for JsonLinesPart {
    fn len(&self) -> usize {
        self.lines.len()
    }

    fn read(&mut self, index: usize) -> Result<Item, SourceError> {
        let (range, rel) = self
            .lines
            .get(index)
            .cloned()
            .ok_or_else(|| SourceError::Other(format!("index {index} out of range")))?;
        match parse_record(&self.data[range], &self.spec.fields) {
            Ok(item) => Ok(item),
            Err((field, message)) => Err(SourceError::BadRecord {
                file: self.spec.path.display().to_string(),
                line: self.line_number(rel),
                field,
                message,
            }),
        }
    }
}

type FieldErr = (Option<String>, String);

fn parse_record(line: &[u8], fields: &[(String, FieldKind)]) -> Result<Item, FieldErr> {
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| (None, format!("invalid JSON: {e}")))?;
    let serde_json::Value::Object(obj) = v else {
        return Err((None, "a record must be a JSON object".into()));
    };
    let mut item = Item::new();
    for (name, kind) in fields {
        let v = obj
            .get(name)
            .ok_or_else(|| (Some(name.clone()), "missing required field".to_owned()))?;
        convert(&mut item, name, v, Some(*kind)).map_err(|m| (Some(name.clone()), m))?;
    }
    for (name, v) in &obj {
        if fields.iter().any(|(n, _)| n == name) || name.starts_with("__") {
            continue;
        }
        convert(&mut item, name, v, None).map_err(|m| (Some(name.clone()), m))?;
    }
    Ok(item)
}

fn convert(
    item: &mut Item,
    name: &str,
    v: &serde_json::Value,
    kind: Option<FieldKind>,
) -> Result<(), String> {
    use serde_json::Value as J;
    match (kind, v) {
        (None, J::Null) => {}
        (None, J::Bool(b)) => item.insert_meta(name, i64::from(*b)),
        (None | Some(FieldKind::I64), J::Number(n)) if n.is_i64() => {
            item.insert_meta(name, n.as_i64().unwrap_or_default())
        }
        (Some(FieldKind::I64), _) => {
            return Err(format!("expected an integer, got {}", kind_of(v)));
        }
        (None | Some(FieldKind::F64), J::Number(n)) => {
            item.insert_meta(name, n.as_f64().unwrap_or(f64::NAN))
        }
        (Some(FieldKind::F64), _) => return Err(format!("expected a number, got {}", kind_of(v))),
        (None | Some(FieldKind::Str), J::String(s)) => item.insert_meta(name, s),
        (Some(FieldKind::Str), _) => return Err(format!("expected a string, got {}", kind_of(v))),
        (None | Some(FieldKind::F32Array), J::Array(_)) => {
            let (shape, flat) = flatten(v, &|x| float(x).map(|f| f as f32))?;
            item.insert(name, Array::F32(shaped(shape, flat)?));
        }
        (Some(FieldKind::F64Array), J::Array(_)) => {
            let (shape, flat) = flatten(v, &float)?;
            item.insert(name, Array::F64(shaped(shape, flat)?));
        }
        (Some(FieldKind::I64Array), J::Array(_)) => {
            let (shape, flat) = flatten(v, &|x: &J| x.as_i64().ok_or(()))?;
            item.insert(name, Array::I64(shaped(shape, flat)?));
        }
        (Some(_), _) => return Err(format!("expected an array, got {}", kind_of(v))),
        (None, J::Object(_)) => return Err("nested objects are not supported".into()),
    }
    Ok(())
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn float(x: &serde_json::Value) -> Result<f64, ()> {
    match x {
        serde_json::Value::Number(n) => n.as_f64().ok_or(()),
        serde_json::Value::Null => Ok(f64::NAN),
        serde_json::Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "nan" => Ok(f64::NAN),
            "inf" | "infinity" => Ok(f64::INFINITY),
            "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(()),
        },
        _ => Err(()),
    }
}

fn shaped<T>(shape: Vec<usize>, flat: Vec<T>) -> Result<ArrayD<T>, String> {
    ArrayD::from_shape_vec(shape, flat).map_err(|e| e.to_string())
}

/// Flattens a nested rectangular JSON array; errors name ragged rows and bad elements.
fn flatten<T>(
    v: &serde_json::Value,
    elem: &dyn Fn(&serde_json::Value) -> Result<T, ()>,
) -> Result<(Vec<usize>, Vec<T>), String> {
    let mut shape = Vec::new();
    let mut cur = v;
    while let serde_json::Value::Array(a) = cur {
        shape.push(a.len());
        match a.first() {
            Some(x) => cur = x,
            None => break,
        }
    }
    let mut flat = Vec::with_capacity(shape.iter().product());
    fn walk<T>(
        v: &serde_json::Value,
        shape: &[usize],
        depth: usize,
        elem: &dyn Fn(&serde_json::Value) -> Result<T, ()>,
        out: &mut Vec<T>,
    ) -> Result<(), String> {
        match (v, shape.get(depth)) {
            (serde_json::Value::Array(a), Some(&n)) => {
                if a.len() != n {
                    return Err(format!(
                        "ragged array: length {} at depth {depth}, expected {n}",
                        a.len()
                    ));
                }
                a.iter()
                    .try_for_each(|x| walk(x, shape, depth + 1, elem, out))
            }
            (serde_json::Value::Array(_), None) => {
                Err(format!("ragged array: too deep at depth {depth}"))
            }
            (x, None) => {
                out.push(elem(x).map_err(|()| format!("bad array element {x}"))?);
                Ok(())
            }
            (x, Some(_)) => Err(format!("ragged array: {x} where an array was expected")),
        }
    }
    walk(v, &shape, 0, elem, &mut flat)?;
    Ok((shape, flat))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    struct TempFile(PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn temp(name: &str, content: &str) -> TempFile {
        let p = std::env::temp_dir().join(format!("shmpipe-src-{}-{name}", std::process::id()));
        std::fs::File::create(&p)
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        TempFile(p)
    }

    #[test]
    fn split_seeks_is_line_aligned_disjoint_and_complete() {
        let mut content = String::new();
        for i in 0..200 {
            content.push_str(&format!(
                "{{\"i\": {i}, \"pad\": \"{}\"}}\n",
                "x".repeat(i % 17)
            ));
        }
        let f = temp("split.jsonl", &content);
        let src = JsonLines::new(&f.0);
        for parts in 1..9 {
            let ranges = split_seeks(&f.0, parts).unwrap();
            assert_eq!(ranges.len(), parts);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[parts - 1].end, content.len() as u64);
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                let s = w[1].start as usize;
                assert!(s == content.len() || content.as_bytes()[s - 1] == b'\n');
            }
            let mut seen = Vec::new();
            for p in 0..parts {
                let mut part = src.open(p, parts).unwrap();
                for k in 0..part.len() {
                    seen.push(part.read(k).unwrap().i64("i").unwrap());
                }
            }
            assert_eq!(seen, (0..200).collect::<Vec<_>>());
        }
    }

    #[test]
    fn bad_records_name_file_line_and_field() {
        let f = temp(
            "bad.jsonl",
            "{\"target\": [1, 2]}\n\n{\"target\": [[1, 2], [3]]}\n{\"target\": [1, \"x\"]}\nnot json\n{\"target\": 3}\n",
        );
        let src = JsonLines::new(&f.0).field("target", FieldKind::F32Array);
        let mut part = src.open(1, 2).unwrap();
        let mut all = src.open(0, 1).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(
            all.read(0).unwrap().array::<f32>("target").unwrap().len(),
            2
        );
        let err = |e: SourceError| match e {
            SourceError::BadRecord {
                line,
                field,
                message,
                file,
            } => {
                assert!(file.ends_with("bad.jsonl"));
                (line, field, message)
            }
            other => panic!("unexpected {other}"),
        };
        let (line, field, msg) = err(all.read(1).unwrap_err());
        assert_eq!((line, field.as_deref()), (3, Some("target")));
        assert!(msg.contains("ragged"), "{msg}");
        let (line, field, _) = err(all.read(2).unwrap_err());
        assert_eq!((line, field.as_deref()), (4, Some("target")));
        let (line, field, _) = err(all.read(3).unwrap_err());
        assert_eq!((line, field), (5, None));
        let (line, field, msg) = err(all.read(4).unwrap_err());
        assert_eq!((line, field.as_deref()), (6, Some("target")));
        assert!(msg.contains("expected an array"), "{msg}");
        // Line numbers are absolute in every part.
        let last = part.len() - 1;
        let (line, _, _) = err(part.read(last).unwrap_err());
        assert_eq!(line, 6);
    }

    #[test]
    fn nan_strings_and_inference() {
        let f = temp(
            "infer.jsonl",
            "{\"t\": [1.5, \"NaN\", null], \"id\": \"a\", \"n\": 3, \"x\": 0.5, \"b\": true}\n",
        );
        let mut p = JsonLines::new(&f.0).open(0, 1).unwrap();
        let it = p.read(0).unwrap();
        let t = it.array::<f32>("t").unwrap();
        assert_eq!(t[0], 1.5);
        assert!(t[1].is_nan() && t[2].is_nan());
        assert_eq!(it.str("id"), Some("a"));
        assert_eq!(it.i64("n"), Some(3));
        assert_eq!(it.f64("x"), Some(0.5));
        assert_eq!(it.i64("b"), Some(1));
    }
}
