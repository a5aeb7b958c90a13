//! # shm-ring: zero-copy numeric arrays between processes
//!
//! A [`Sender`] creates a channel in shared memory (a sealed memfd, never a file in
//! `/dev/shm`) and serves it by name on a Unix socket in a directory only its user can enter
//! (see [`Rendezvous`]); a [`Receiver`] in another process opens it by name
//! ([`Receiver::open_timeout`] waits for a producer that starts later), or from a descriptor
//! ([`Sender::anonymous`], [`Receiver::from_fd`]). Messages are sets of named n-dimensional arrays (f32, f64,
//! i8..i64, u8..u64, f16, bf16 through [`Element`]; bool as one checked byte per element
//! through [`MessageBuilder::array_bool`] and [`RecordView::array_bool`]) with small metadata.
//! Small arrays are copied inline through a lock-free ring; large ones travel zero-copy: the
//! producer fills a block of its pool in place ([`Sender::loan`]) and the consumer reads that
//! very memory through an [`ndarray::ArrayView`], handing the block back when the [`Message`]
//! is dropped.
//!
//! Everything read from shared memory is validated before use: a buggy or hostile peer yields
//! [`Error::Corrupt`], never undefined behaviour or an out-of-bounds read. A peer that dies is
//! reported as [`Error::PeerDied`] within [`WaitConfig::liveness_check`] of a blocked call, and
//! a producer takes back every block a dead consumer held. Every [`Error`]'s `Display` says what
//! to change: print errors with `{}`, not `{:?}`.
//!
//! For small fixed-size data there is a faster, typed path: a [`TypedSender<T>`] /
//! [`TypedReceiver<T>`] channel carries one `bytemuck::Pod` value per message (`[f32; 16]`, a
//! `#[repr(C)]` struct), written straight into a ring slot — no names, dtypes or shapes per
//! message. The channel's type ([`ValueType`]) is written into the segment once and checked
//! once at open.
//!
//! A tour of the whole API, compiled and run as doc tests: `docs/shm-ring-api.md`; two real
//! processes: the examples `quickstart_send` and `quickstart_recv` (the README's quick start),
//! and `typed_quickstart` for the typed path.
//!
//! ## Fork
//! Handles are not fork-safe. A child made by `fork()` inherits copies of every [`Sender`],
//! [`Receiver`], [`Message`] and loan of its parent, but they stay the parent's: in the child,
//! sends, loans and receives fail with [`Error::Forked`], and drops do nothing to the channel
//! (no pool block is handed back, the channel is not closed), so the parent keeps every lease
//! it holds. The child may read the messages and arrays it inherited while the parent keeps
//! them, and `exec` or exit; to use a channel in the child, open it there (by name, or from a
//! descriptor passed to it) or create one. Forks are noticed through `pthread_atfork`, so they
//! must go through the C library (`fork()`, Python's `os.fork` and `multiprocessing` do).
//!
//! ## Quick start
//! ```
//! use shm_ring::{ChannelConfig, MessageBuilder, Receiver, Sender, TypedReceiver, TypedSender};
//!
//! let name = format!("quickstart-{}", std::process::id());
//! let mut tx = Sender::create(&name, &ChannelConfig::default())?;
//! let mut rx = Receiver::open(&name)?; // normally in another process
//!
//! // Zero-copy: loan an array in shared memory, fill it in place, send it.
//! let loan = tx.loan::<f32>(&[1000, 3])?.write_with(|i| i as f32);
//! tx.send(MessageBuilder::new().meta_str("item_id", "A-17").array_loan("x", loan))?;
//!
//! let msg = rx.recv()?;
//! let rec = msg.record(0)?;
//! let x = rec.array::<f32>("x")?; // a view into shared memory, tied to `msg`
//! assert_eq!(x.shape(), &[1000, 3]);
//! assert_eq!(rec.meta_str("item_id"), Some("A-17"));
//!
//! // The typed path: one [f32; 16] per message, nothing else.
//! let mut ttx = TypedSender::<[f32; 16]>::create(&format!("{name}-typed"), &ChannelConfig::default())?;
//! let mut trx = TypedReceiver::<[f32; 16]>::open(&format!("{name}-typed"))?;
//! ttx.send(&[1.5; 16])?;
//! assert_eq!(trx.recv()?, [1.5; 16]);
//! # Ok::<(), shm_ring::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
mod calibrate;
#[cfg(not(loom))]
mod channel;
#[cfg(not(loom))]
pub mod dtype;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod fork;
#[cfg(not(loom))]
pub mod message;
#[cfg(not(loom))]
mod op_error;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
pub mod rendezvous;
pub mod ring;
#[cfg(not(loom))]
pub mod schema;
#[cfg(not(loom))]
mod segment;
mod sync;
#[cfg(not(loom))]
mod sys;
#[cfg(not(loom))]
pub mod transfer;

#[cfg(not(loom))]
pub use calibrate::{Calibration, calibrate};
#[cfg(not(loom))]
pub use channel::{
    ChannelConfig, LARGE_IN_FLIGHT, LARGE_KEEP, MAX_LARGE_POOL, Message, Receiver, Sender,
    SenderStats, TypedReceiver, TypedSender, WaitConfig, machine_large_pool,
};
#[cfg(all(not(loom), feature = "layout-internals"))]
#[doc(hidden)]
pub use channel::{ChannelLayout, SchemaWire, channel_layout, typed_channel_layout};
#[cfg(not(loom))]
pub use dtype::{DType, Element};
#[cfg(not(loom))]
pub use error::{BLOCK_OR_LARGE_POOL, Error};
#[cfg(not(loom))]
pub use fork::Owner;
#[cfg(not(loom))]
pub use message::{ArrayInfo, FieldRef, MessageBuilder, MessageView, MetaValue, RecordView};
#[cfg(not(loom))]
pub use op_error::{RecvError, SendError, TrySendError};
#[cfg(not(loom))]
pub use pool::{ArrayLoan, ArrayLoanUninit, BlockPin};
#[cfg(not(loom))]
pub use rendezvous::Rendezvous;
#[cfg(not(loom))]
pub use schema::{FieldError, SchemaError, ValueType};
#[cfg(not(loom))]
pub use segment::{Segment, SegmentInfo};
#[cfg(not(loom))]
pub use transfer::{DEFAULT_THRESHOLD, Transfer};

// The Rust blocks of docs/shm-ring-api.md run as doc tests of this crate
// (`cargo test -p shm-ring --doc`), so the page cannot drift from the code.
#[cfg(all(doctest, not(loom)))]
#[doc = include_str!("../../../docs/shm-ring-api.md")]
struct ApiTourDoctests;
