//! The schema region of a typed channel: the [`ValueType`] every slot holds, written once into
//! the segment at creation and validated once at open, instead of being re-described by every
//! message. A channel of messages has no schema region (each message describes itself).

mod error;
mod value;
pub(crate) mod wire;

pub use error::{FieldError, SchemaError};
pub(crate) use value::ValueType;
