//! The link between two processes: the shared segment (create, seal, map, validate at open) and
//! the one spin-then-futex wait loop of blocked calls.

pub(crate) mod claim;
pub(crate) mod geometry;
pub(crate) mod layout;
pub(crate) mod segment;
pub(crate) mod wait;
