//! Schemas: what every message of a channel holds, written once into the segment at creation
//! and validated once at open, instead of being re-described by every message.
//!
//! - [`ValueType`]: a *typed* channel ([`TypedSender`](crate::TypedSender) /
//!   [`TypedReceiver`](crate::TypedReceiver)) carries one fixed-size plain-old-data value per
//!   ring slot, nothing else.
//! - [`Schema`]: named fields (arrays of a dtype and rank, optionally of a fixed shape, and
//!   metadata keys) that a channel of general messages carries; fields are found by position
//!   ([`FieldId`], from [`Schema::field`]), an index built once.

mod error;
mod value;
pub(crate) mod wire;

use std::fmt;

pub use error::{FieldError, SchemaError};
pub use value::ValueType;

use crate::dtype::DType;

/// Most dimensions a schema's array field may have.
pub const MAX_FIELD_RANK: usize = 32;
/// Most fields a schema may have.
pub const MAX_FIELDS: usize = 4096;
/// Longest field name, in bytes.
pub const MAX_NAME: usize = 255;

/// What a field of a [`Schema`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldKind {
    /// An n-dimensional array.
    Array {
        /// Its element type.
        dtype: DType,
        /// Its number of dimensions.
        rank: usize,
        /// Its shape, if every message has the same (`None`: the dimensions vary).
        shape: Option<Vec<usize>>,
    },
    /// A metadata value.
    Meta,
}

/// One field of a [`Schema`]: a name and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// The field's name (unique in its schema).
    pub name: String,
    /// What it holds.
    pub kind: FieldKind,
}

/// The position of a field in its [`Schema`], found once by name with [`Schema::field`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldId(pub(crate) u32);

impl FieldId {
    /// The field's position in [`Schema::fields`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The fields every message of a channel holds, in order.
///
/// # Examples
/// ```
/// use shm_ring::{DType, Schema};
/// let schema = Schema::new()
///     .array("target", DType::F32, &[16])
///     .array_dyn("features", DType::F64, 2)
///     .meta("item_id");
/// let x = schema.field("target")?;
/// assert_eq!(x.index(), 0);
/// assert_eq!(schema.fields()[x.index()].name, "target");
/// assert_eq!(schema.len(), 3);
/// assert!(schema.field("nope").is_err());
/// # Ok::<(), shm_ring::FieldError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    fields: Vec<FieldSpec>,
}

impl Schema {
    /// A schema without fields.
    pub fn new() -> Schema {
        Schema::default()
    }

    /// Adds an array field of a fixed shape.
    #[must_use]
    pub fn array(mut self, name: &str, dtype: DType, shape: &[usize]) -> Schema {
        self.fields.push(FieldSpec {
            name: name.to_string(),
            kind: FieldKind::Array {
                dtype,
                rank: shape.len(),
                shape: Some(shape.to_vec()),
            },
        });
        self
    }

    /// Adds an array field of `rank` dimensions whose sizes vary per message.
    #[must_use]
    pub fn array_dyn(mut self, name: &str, dtype: DType, rank: usize) -> Schema {
        self.fields.push(FieldSpec {
            name: name.to_string(),
            kind: FieldKind::Array {
                dtype,
                rank,
                shape: None,
            },
        });
        self
    }

    /// Adds a metadata field.
    #[must_use]
    pub fn meta(mut self, name: &str) -> Schema {
        self.fields.push(FieldSpec {
            name: name.to_string(),
            kind: FieldKind::Meta,
        });
        self
    }

    /// The fields, in order ([`FieldId::index`] positions).
    pub fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the schema has no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The position of the field `name`: look it up once, then use the [`FieldId`].
    ///
    /// # Errors
    /// [`FieldError::NoSuchField`].
    pub fn field(&self, name: &str) -> Result<FieldId, FieldError> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .map(|i| FieldId(i as u32))
            .ok_or_else(|| FieldError::NoSuchField {
                name: name.to_string(),
                known: self.fields.iter().map(|f| f.name.clone()).collect(),
            })
    }

    /// The field at `id`.
    ///
    /// # Errors
    /// [`FieldError::OutOfRange`] for an id of another, longer schema.
    pub fn spec(&self, id: FieldId) -> Result<&FieldSpec, FieldError> {
        self.fields.get(id.index()).ok_or(FieldError::OutOfRange {
            index: id.index(),
            len: self.fields.len(),
        })
    }

    /// Checks the limits a schema must meet to be written into a segment (unique non-empty
    /// names of at most [`MAX_NAME`] bytes, ranks up to [`MAX_FIELD_RANK`], fixed shapes of the
    /// stated rank, at most [`MAX_FIELDS`] fields).
    ///
    /// # Errors
    /// The [`SchemaError`] naming the first problem.
    pub fn check(&self) -> Result<(), SchemaError> {
        if self.fields.len() > MAX_FIELDS {
            return Err(SchemaError::TooManyFields(self.fields.len() as u64));
        }
        for (i, f) in self.fields.iter().enumerate() {
            if f.name.is_empty() || f.name.len() > MAX_NAME {
                return Err(SchemaError::BadName {
                    field: i,
                    why: format!("{} bytes long (1 to {MAX_NAME})", f.name.len()),
                });
            }
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(SchemaError::DuplicateField(f.name.clone()));
            }
            if let FieldKind::Array { rank, shape, .. } = &f.kind {
                if *rank > MAX_FIELD_RANK {
                    return Err(SchemaError::BadRank {
                        field: i,
                        rank: *rank as u64,
                    });
                }
                if shape.as_ref().is_some_and(|s| s.len() != *rank) {
                    return Err(SchemaError::Inconsistent(format!(
                        "field '{}': a fixed shape of {} dimensions for rank {rank}",
                        f.name,
                        shape.as_ref().map_or(0, |s| s.len())
                    )));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match &field.kind {
                FieldKind::Array {
                    dtype,
                    shape: Some(s),
                    ..
                } => write!(f, "{}: {dtype}{s:?}", field.name)?,
                FieldKind::Array { dtype, rank, .. } => {
                    write!(f, "{}: {dtype} rank {rank}", field.name)?
                }
                FieldKind::Meta => write!(f, "{}: meta", field.name)?,
            }
        }
        f.write_str("}")
    }
}

/// What a channel's schema region holds (a private copy, validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChannelSchema {
    /// A typed channel: one value per slot.
    Value(ValueType),
    /// General messages with these fields.
    Fields(Schema),
}

impl fmt::Display for ChannelSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelSchema::Value(v) => write!(f, "a typed channel of {v}"),
            ChannelSchema::Fields(s) => write!(f, "a channel of messages {s}"),
        }
    }
}
