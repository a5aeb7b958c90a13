//! A record header of the descriptor ring as the receiver read and validated it. Apart from
//! `records.rs` (which reads them) so that `receiver.rs` can use it without a circle.

pub(super) fn n_of(rec: &Rec) -> u32 {
    match *rec {
        Rec::Inline { n_slots, .. } => n_slots,
        Rec::Block { .. } => 1,
        Rec::Pad(n) => n,
    }
}

/// A received record header, validated.
pub(super) enum Rec {
    Pad(u32),
    Inline {
        n_slots: u32,
        body_len: usize,
    },
    /// A body in block (or large extent) `block`, at `at` in the segment.
    Block {
        block: u32,
        at: usize,
        body_len: usize,
    },
}
