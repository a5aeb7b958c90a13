//! # shm-ring: zero-copy numeric arrays between processes
//!
//! One channel family, the payload its type parameter (as iceoryx2's
//! `publish_subscribe::<T>()`): pick the payload, and the verbs are the same.
//!
//! | payload | type | example |
//! |---|---|---|
//! | named n-d arrays and metadata, any shape, zero-copy when large | [`Sender<Message>`] / [`Receiver<Message>`] (the default type parameter: `let tx: Sender = ..`; in calls write `Sender::<Message>::create`) | `tx.send(MessageBuilder::new().array_loan("x", loan))` |
//! | one fixed-size value per message (`[f32; 16]`, a `#[repr(C)]` struct) | [`Sender<T>`] / [`Receiver<T>`], `T: bytemuck::Pod` | `tx.send(&[1.5; 16])` |
//!
//! ```
//! use shm_ring::{ChannelConfig, Message, MessageBuilder, Receiver, Sender};
//!
//! let name = format!("quickstart-{}", std::process::id());
//! // Messages of named arrays: loan an array in shared memory, fill it in place, send it.
//! let mut tx = Sender::<Message>::create(&name, &ChannelConfig::default())?;
//! let mut rx = Receiver::<Message>::open(&name)?; // normally in another process
//! let loan = tx.loan::<f32>(&[1000, 3])?.write_with(|i| i as f32);
//! tx.send(MessageBuilder::new().meta_str("item_id", "A-17").array_loan("x", loan))?;
//! let msg = rx.recv()?;
//! let rec = msg.record(0)?;
//! assert_eq!(rec.array::<f32>("x")?.shape(), &[1000, 3]); // a view into shared memory
//! assert_eq!(rec.meta_str("item_id"), Some("A-17"));
//!
//! // One value per message: written straight into a ring slot, nothing else travels.
//! let mut tx = Sender::<[f32; 16]>::create(&format!("{name}-v"), &ChannelConfig::default())?;
//! let mut rx = Receiver::<[f32; 16]>::open(&format!("{name}-v"))?;
//! tx.send(&[1.5; 16])?;
//! assert_eq!(rx.recv()?, [1.5; 16]);
//! # Ok::<(), shm_ring::Error>(())
//! ```
//!
//! The verbs, for either payload: [`Sender::create`] / [`Sender::anonymous`],
//! [`Receiver::open`] / [`Receiver::open_timeout`] / [`Receiver::from_fd`]; `loan` (a pool
//! array for a message, a ring slot for a value: written in place, then sent); `send`,
//! `try_send`, `send_timeout`, `send_batch`; `recv`, `try_recv`, `recv_timeout`, `recv_batch`
//! (a burst handed back with one index store). Each operation has its own error
//! ([`CreateError`], [`OpenError`], [`LoanError`], [`SendError`], [`TrySendError`] and
//! [`SendTimeoutError`] with the value inside, [`RecvError`], [`TryRecvError`],
//! [`RecvTimeoutError`]); each converts into [`Error`] with its variant and fields (every
//! kind of timeout becomes [`Error::Timeout`]: the call that returned it says which wait ran
//! out), so `?` works.
//!
//! A [`Sender`] creates a channel in shared memory (a sealed memfd, never a file in
//! `/dev/shm`) and serves it by name on a Unix socket in a directory only its user can enter
//! (see [`Rendezvous`]); a [`Receiver`] in another process opens it by name, or from a
//! descriptor. The payload kind is written into the segment and checked once at open: a
//! receiver of another payload gets [`OpenError::Schema`]. Message arrays are f32, f64,
//! i8..i64, u8..u64, f16, bf16 through [`Element`], and bool as one checked byte per element
//! ([`MessageBuilder::array_bool`], [`RecordView::array_bool`]). Small arrays are copied
//! inline through a lock-free ring; large ones travel zero-copy: the producer fills a block of
//! its pool in place and the consumer reads that very memory through an
//! [`ndarray::ArrayView`], handing the block back when the [`Message`] is dropped.
//!
//! Everything read from shared memory is validated before use: a buggy or hostile peer yields
//! a `Corrupt` error, never undefined behaviour or an out-of-bounds read. A peer that dies is
//! reported as `PeerDied` within [`WaitConfig::liveness_check`] of a blocked call, and a
//! producer takes back every block a dead consumer held. Every error's `Display` says what
//! to change: print errors with `{}`, not `{:?}`.
//!
//! A tour of the whole API, compiled and run as doc tests: `docs/shm-ring-api.md`; two real
//! processes: the examples `quickstart_send` and `quickstart_recv` (the README's quick start),
//! and `typed_quickstart` for a channel of values.
//!
//! ## Fork
//! Handles are not fork-safe. A child made by `fork()` inherits copies of every [`Sender`],
//! [`Receiver`], [`Message`] and loan of its parent, but they stay the parent's: in the child,
//! sends, loans and receives fail with a `Forked` error, and drops do nothing to the channel
//! (no pool block is handed back, the channel is not closed), so the parent keeps every lease
//! it holds. The child may read the messages and arrays it inherited while the parent keeps
//! them, and `exec` or exit; to use a channel in the child, open it there (by name, or from a
//! descriptor passed to it) or create one. Forks are noticed through `pthread_atfork`, so they
//! must go through the C library (`fork()`, Python's `os.fork` and `multiprocessing` do).
#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
mod calibrate;
#[cfg(not(loom))]
mod channel;
#[cfg(not(loom))]
mod dtype;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
mod fork;
#[cfg(not(loom))]
mod link;
#[cfg(not(loom))]
mod message;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
mod rendezvous;
// The SPSC ring: public only for the loom models, the ring conformance tests and the harness.
#[cfg(any(loom, feature = "unstable-internals"))]
pub mod ring;
#[cfg(not(any(loom, feature = "unstable-internals")))]
mod ring;
#[cfg(not(loom))]
mod schema;
mod sync;
#[cfg(not(loom))]
mod sys;
#[cfg(not(loom))]
mod transfer;

#[cfg(not(loom))]
pub use calibrate::{CalibrateError, Calibration, calibrate};
#[cfg(not(loom))]
pub use channel::{
    ChannelConfig, CreateError, LARGE_IN_FLIGHT, LARGE_KEEP, LoanError, MAX_LARGE_POOL, Message,
    OpenError, Payload, Receiver, RecvError, RecvTimeoutError, SendError, SendTimeoutError, Sender,
    SenderStats, TryRecvError, TrySendError, ValueLoan, WaitConfig, machine_large_pool,
};
#[cfg(all(not(loom), feature = "unstable-internals"))]
#[doc(hidden)]
pub use channel::{ChannelLayout, SchemaWire, channel_layout, typed_channel_layout};
#[cfg(not(loom))]
pub use dtype::{DType, Element};
#[cfg(not(loom))]
pub use error::Error;
#[cfg(not(loom))]
pub use fork::Owner;
#[cfg(all(not(loom), feature = "unstable-internals"))]
#[doc(hidden)]
pub use link::segment::{Segment, SegmentInfo};
#[cfg(all(not(loom), feature = "unstable-internals"))]
#[doc(hidden)]
pub use message::read_in_place;
#[cfg(not(loom))]
pub use message::{
    ArrayInfo, DecodeError, EncodeError, FieldRef, Fields, MessageBuilder, MessageView, MetaValue,
    RecordView, Records,
};
#[cfg(not(loom))]
pub use pool::{ArrayLoan, ArrayLoanUninit, BlockPin};
#[cfg(not(loom))]
pub use rendezvous::Rendezvous;
#[cfg(all(not(loom), feature = "unstable-internals"))]
#[doc(hidden)]
pub use rendezvous::fetch_descriptor;
#[cfg(not(loom))]
pub use schema::{FieldError, SchemaError};
#[cfg(not(loom))]
pub use transfer::{DEFAULT_THRESHOLD, Transfer};

// The Rust blocks of docs/shm-ring-api.md run as doc tests of this crate
// (`cargo test -p shm-ring --doc`), so the page cannot drift from the code.
#[cfg(all(doctest, not(loom)))]
#[doc = include_str!("../../../docs/shm-ring-api.md")]
struct ApiTourDoctests;
