//! The transports the harness compares, and how each one is run.

use std::fmt;

/// Array sizes (f32 elements) the typed transport (`shm-typed`) is built for.
pub const TYPED_SIZES: [usize; 9] = [16, 64, 256, 1000, 1024, 4000, 4096, 16_000, 16_384];

/// One way of moving an `f32` array from a producer to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Transport {
    /// Single-thread `memcpy` of the array in one process: the yardstick of every ratio.
    Memcpy,
    /// In-process bounded channel between two pinned threads, buffers recycled (nothing is
    /// copied): the upper bound for any handoff.
    Channel,
    /// Hand-written minimal shared-memory SPSC ring (fixed slots, spinning): the brief's
    /// "minimal hand-written shm ring" anchor.
    RingMin,
    /// shm-ring, producer writes straight into a loaned block (`Transfer::ZeroCopy`).
    ShmZeroCopy,
    /// shm-ring, array copied from the producer's buffer (`Transfer::Copy`).
    ShmCopy,
    /// shm-ring with its default policy (`Transfer::Adaptive`): what a user gets.
    ShmAdaptive,
    /// shm-ring's typed path: `[f32; N]` values, one per ring slot (some sizes only).
    ShmTyped,
    /// Anonymous pipe between the two processes, length-prefixed frames.
    Pipe,
    /// Unix stream socket, length-prefixed frames.
    UnixSocket,
    /// iceoryx2 publish-subscribe with an `[f32]` slice payload (cargo feature `iceoryx2`).
    Iceoryx2,
}

/// How a transport's measurement is laid out over processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One process (memcpy: one thread; channel: two pinned threads).
    Solo,
    /// A producer process and a consumer process pinned to different cores.
    Pair,
}

impl Transport {
    /// Every transport, in table order.
    pub const ALL: [Transport; 10] = [
        Transport::Memcpy,
        Transport::Channel,
        Transport::RingMin,
        Transport::ShmZeroCopy,
        Transport::ShmCopy,
        Transport::ShmAdaptive,
        Transport::ShmTyped,
        Transport::Pipe,
        Transport::UnixSocket,
        Transport::Iceoryx2,
    ];

    /// The name used on the command line, in tables and in CSV files.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Memcpy => "memcpy",
            Transport::Channel => "channel",
            Transport::RingMin => "ring-min",
            Transport::ShmZeroCopy => "shm-zero-copy",
            Transport::ShmCopy => "shm-copy",
            Transport::ShmAdaptive => "shm-adaptive",
            Transport::ShmTyped => "shm-typed",
            Transport::Pipe => "pipe",
            Transport::UnixSocket => "unix-socket",
            Transport::Iceoryx2 => "iceoryx2",
        }
    }

    /// What the row of this transport is, in a few words (the table legend).
    pub fn describe(self) -> &'static str {
        match self {
            Transport::Memcpy => "one thread copying the array (the yardstick)",
            Transport::Channel => "in-process channel between two threads, nothing copied",
            Transport::RingMin => "a minimal hand-written shared-memory ring",
            Transport::ShmZeroCopy => "shm-ring, array written in place (Transfer::ZeroCopy)",
            Transport::ShmCopy => "shm-ring, array copied in (Transfer::Copy)",
            Transport::ShmAdaptive => "shm-ring's default, copy or zero-copy by size",
            Transport::ShmTyped => "shm-ring's typed path, [f32; N] per ring slot (N <= 16k)",
            Transport::Pipe => "a pipe between the two processes",
            Transport::UnixSocket => "a Unix stream socket",
            Transport::Iceoryx2 => "iceoryx2 publish-subscribe",
        }
    }

    /// Whether this binary can run the transport (iceoryx2 needs the cargo feature).
    pub fn is_built(self) -> bool {
        self != Transport::Iceoryx2 || cfg!(feature = "iceoryx2")
    }

    /// All transports this binary can run.
    pub fn built() -> Vec<Transport> {
        Transport::ALL
            .into_iter()
            .filter(|t| t.is_built())
            .collect()
    }

    /// Whether the transport can move arrays of `elements` floats (the typed path is built
    /// for a few sizes only; other rows are left out).
    pub fn supports(self, elements: usize) -> bool {
        self != Transport::ShmTyped || TYPED_SIZES.contains(&elements)
    }

    /// Process layout of the measurement.
    pub fn layout(self) -> Layout {
        match self {
            Transport::Memcpy | Transport::Channel => Layout::Solo,
            _ => Layout::Pair,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_match_the_command_line() {
        for t in Transport::ALL {
            let pv = t.to_possible_value().unwrap();
            assert_eq!(pv.get_name(), t.name());
            assert_eq!(Transport::from_str(t.name(), false), Ok(t));
        }
    }

    #[test]
    fn iceoryx2_only_with_its_feature() {
        assert_eq!(
            Transport::built().contains(&Transport::Iceoryx2),
            cfg!(feature = "iceoryx2")
        );
        assert_eq!(
            Transport::built().len(),
            9 + usize::from(cfg!(feature = "iceoryx2"))
        );
    }
}
