//! What a channel carries, as the type parameter of [`Sender<P>`](super::Sender) and
//! [`Receiver<P>`](super::Receiver): a [`Message`] of named n-dimensional arrays (the default)
//! or one plain-old-data value per message (any `bytemuck::Pod` type).
//!
//! The kind is written into the segment at creation (a typed channel's [`ValueType`] in its
//! schema region; a message channel has none) and checked once when a receiver opens it, so a
//! receiver of another payload is refused before it attaches.

use bytemuck::Pod;

use super::{ChannelConfig, Message};
use crate::error::Error;
use crate::schema::ValueType;

pub(super) mod sealed {
    use super::{ChannelConfig, Error, ValueType};

    /// What the crate needs of a payload; private, so that `Payload` is sealed and these stay
    /// out of the public API.
    pub trait Sealed {
        /// The value type written into a typed channel's segment (`None`: messages).
        fn value_type() -> Option<ValueType>;

        /// The geometry a channel of this payload is created with, from the user's `cfg`.
        fn channel_config(cfg: &ChannelConfig) -> Result<ChannelConfig, Error>;
    }
}

/// The payload of a channel: [`Message`] (named n-d arrays, self-describing) or any
/// `T: bytemuck::Pod` (a fixed-size value written straight into a ring slot). Sealed: the two
/// kinds are the crate's, the value type is yours.
pub trait Payload: sealed::Sealed {}

impl Payload for Message {}
impl<T: Pod> Payload for T {}

impl sealed::Sealed for Message {
    fn value_type() -> Option<ValueType> {
        None
    }

    fn channel_config(cfg: &ChannelConfig) -> Result<ChannelConfig, Error> {
        Ok(*cfg)
    }
}

impl<T: Pod> sealed::Sealed for T {
    fn value_type() -> Option<ValueType> {
        Some(ValueType::of::<T>())
    }

    fn channel_config(cfg: &ChannelConfig) -> Result<ChannelConfig, Error> {
        value_config::<T>(cfg)
    }
}

/// The geometry of a typed channel of `T`: slots sized for `T` (`size_of::<T>()` rounded up
/// to 64 bytes, at most 64 KiB), no pool.
pub(super) fn value_config<T>(cfg: &ChannelConfig) -> Result<ChannelConfig, Error> {
    let size = std::mem::size_of::<T>().max(1);
    let slot_size = size.div_ceil(64) * 64;
    if slot_size > 65536 {
        return Err(Error::TooLarge {
            what: "typed value",
            needed: size,
            limit: 65536,
            setting: "nothing: values of a typed channel are at most 64 KiB; send this as a Message (Sender<Message> with a loan)",
        });
    }
    Ok(ChannelConfig {
        slot_size: slot_size as u32,
        blocks: 0,
        block_size: 64,
        large_pool: 0,
        ..*cfg
    })
}
