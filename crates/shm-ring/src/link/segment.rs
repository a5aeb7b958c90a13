//! Shared-memory segments: a sealed memfd, mapped read-write, starting with a 64-byte header.
//! Every channel, named or anonymous, is one: a name is only the way to get its descriptor
//! (see `crate::rendezvous`); nothing is ever created in `/dev/shm`. The public constructor
//! reserves every page at creation (`fallocate`: `NoSpace` now, never `SIGBUS` later); a
//! channel reserves its headers and rings at creation and each pool block when it is first
//! loaned ([`Segment::commit`]), so its committed memory follows what is in flight.
//!
//! ```text
//! offset 0   magic u64 | 8 layout version u32 | 12 kind u32 | 16 creator pid u32 |
//!            24 creator start time u64 | 32 total size u64 | 40 ready flag u32 | 44..64 zero
//! offset 64  the user of the segment (a channel) lays out its own structures here
//! ```
//!
//! Who may touch a segment, and what we check (see docs/threat-model.md):
//! - A segment is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) as soon as its size is
//!   reserved: no holder of its descriptor can change its size under a mapping (`SIGBUS`).
//! - [`Segment::from_fd`] refuses a descriptor that is not a regular file with those seals,
//!   then reads the header once and validates it (magic, version, ready flag, size == file
//!   size, kind); each refusal says what is wrong for the way the descriptor came (passed by
//!   the caller, or served for a channel name).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use rustix::io::Errno;

use crate::error::Error;
use crate::ring::bytes::{ShmBytes, ShmBytesMut};
use crate::sys;

/// First bytes of every segment: `b"SHMPIPE\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMPIPE\0");
/// Version of the shared-memory layout and protocol; segments of other versions are refused.
/// Version 2: creators hold a shared `flock` on their segment and publish names by rename.
/// Version 3: every segment is a sealed memfd; channel names are served over a socket.
pub const LAYOUT_VERSION: u32 = 3;
/// Bytes taken by the segment header; the user area starts here (64-byte aligned).
pub const HEADER_SIZE: usize = 64;
const READY: u32 = 0x5245_4459;

// Header field offsets.
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const KIND_AT: usize = 12;
const PID_AT: usize = 16;
const START_AT: usize = 24;
const SIZE_AT: usize = 32;
const READY_AT: usize = 40;

#[cfg(feature = "unstable-internals")]
/// Where the segment header's fields lie (bytes from the segment's start), and the layout
/// version this build writes: for tests and tools that poke at a live segment. Not a stable
/// API; reached through [`crate::ChannelLayout::segment_wire`].
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentWire {
    /// u64 ([`MAGIC`]).
    pub magic: usize,
    /// u32 (see `layout_version`).
    pub version: usize,
    /// u32: what the user area holds (a channel, ...).
    pub kind: usize,
    /// u32.
    pub creator_pid: usize,
    /// u64: clock ticks since boot.
    pub creator_start: usize,
    /// u64: the segment's size, header included.
    pub size: usize,
    /// u32: set when the creator published the segment.
    pub ready: usize,
    /// Bytes of the header.
    pub header: usize,
    /// The layout version this build writes and accepts.
    pub layout_version: u32,
}

#[cfg(feature = "unstable-internals")]
pub(crate) const SEGMENT_WIRE: SegmentWire = SegmentWire {
    magic: MAGIC_AT,
    version: VERSION_AT,
    kind: KIND_AT,
    creator_pid: PID_AT,
    creator_start: START_AT,
    size: SIZE_AT,
    ready: READY_AT,
    header: HEADER_SIZE,
    layout_version: LAYOUT_VERSION,
};

/// A copy of a segment's header, read once from shared memory and validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The layout version (this build understands only its own).
    pub version: u32,
    /// Pid of the creating process (as the creator wrote it: a hint, never trusted for
    /// anything but error messages and liveness checks that treat "cannot tell" as alive).
    pub creator_pid: u32,
    /// Start time of the creating process (clock ticks since boot), to tell a recycled pid apart.
    pub creator_start: u64,
    /// Total size of the segment in bytes, header included (equal to the mapping's length).
    pub size: u64,
}

/// Every header field, each loaded exactly once.
struct RawHeader {
    magic: u64,
    version: u32,
    kind: u32,
    creator_pid: u32,
    creator_start: u64,
    size: u64,
    ready: u32,
}

/// A mapped shared-memory segment: a sealed memfd.
///
/// The memory lives until the last process unmaps it and the last descriptor closes.
///
/// # The memory behind [`Segment::as_ptr`]
/// Like [`memmap2::MmapRaw`], a `Segment` only hands out a raw pointer: every process that has
/// the segment's descriptor (the peer, or a process of the same user that takes it from one of
/// ours through `/proc/<pid>/fd`) may write any byte at any time. Whoever dereferences it must
/// read through atomics (or volatile copies), never create `&`/`&mut` to non-atomic data there,
/// and validate every value read before using it. Its size cannot change (sealed).
#[derive(Debug)]
pub struct Segment {
    /// What errors call it: the channel name, or "anon".
    label: String,
    info: SegmentInfo,
    map: MmapRaw,
    file: File,
    // Read only by `is_owner`, for tests (unstable-internals).
    #[cfg_attr(not(feature = "unstable-internals"), allow(dead_code))]
    owner: bool,
}

/// How a descriptor reached [`Segment::from_fd`]: it decides what a refusal tells the user.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reached<'a> {
    /// Passed by the caller ([`Segment::from_fd`], `Receiver::from_fd`).
    Descriptor,
    /// Served for the channel `name` by process `pid` (`Receiver::open`).
    Name {
        /// The channel name.
        name: &'a str,
        /// The serving process.
        pid: u32,
    },
}

impl Reached<'_> {
    /// [`Error::NotASegment`] for `problem`, with what to do about it.
    fn refuse(&self, problem: &str) -> Error {
        Error::NotASegment(match self {
            Reached::Descriptor => format!(
                "the descriptor {problem}: pass the descriptor of a channel made by \
                 Sender::anonymous (its sealed memfd), not another \
                 file, pipe or socket"
            ),
            Reached::Name { name, pid } => format!(
                "channel '{name}', served by pid {pid}: its descriptor {problem}: the process \
                 serving that name is not a shm-ring Sender of this version (build both \
                 processes against the same shm-ring) or is not to be trusted"
            ),
        })
    }
}

fn check_size(size: usize) -> Result<(), Error> {
    if size < HEADER_SIZE || isize::try_from(size).is_err() {
        return Err(Error::InvalidArgument(format!(
            "segment size {size}: at least {HEADER_SIZE} bytes"
        )));
    }
    Ok(())
}

fn is_regular(st: &rustix::fs::Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
}

/// An atomic view of the 8-byte header field at `at` (a constant offset).
fn word64(map: &MmapRaw, at: usize) -> &AtomicU64 {
    assert!(map.len() >= HEADER_SIZE && at.is_multiple_of(8) && at + 8 <= HEADER_SIZE);
    // SAFETY: in bounds and aligned (checked above; the mapping is page aligned); AtomicU64
    // is valid for any bit pattern, and another process writing the same bytes concurrently
    // is not a data race on an atomic. The reference lives no longer than the mapping.
    unsafe { &*map.as_mut_ptr().add(at).cast::<AtomicU64>() }
}

/// As [`word64`] for a 4-byte field.
fn word32(map: &MmapRaw, at: usize) -> &AtomicU32 {
    assert!(map.len() >= HEADER_SIZE && at.is_multiple_of(4) && at + 4 <= HEADER_SIZE);
    // SAFETY: as in `word64`.
    unsafe { &*map.as_mut_ptr().add(at).cast::<AtomicU32>() }
}

/// Loads every header field once (the ready flag first, with Acquire). The caller mapped at
/// least `HEADER_SIZE` bytes.
fn load_header(map: &MmapRaw) -> RawHeader {
    // SYNC POINT (Acquire): pairs with the Release store in `publish`: the header and the user
    // area written before it are visible.
    let ready = word32(map, READY_AT).load(Ordering::Acquire);
    RawHeader {
        ready,
        magic: word64(map, MAGIC_AT).load(Ordering::Relaxed),
        version: word32(map, VERSION_AT).load(Ordering::Relaxed),
        kind: word32(map, KIND_AT).load(Ordering::Relaxed),
        creator_pid: word32(map, PID_AT).load(Ordering::Relaxed),
        creator_start: word64(map, START_AT).load(Ordering::Relaxed),
        size: word64(map, SIZE_AT).load(Ordering::Relaxed),
    }
}

impl Segment {
    /// Creates a segment (a memfd) of `size` bytes, sealed against shrinking and growing,
    /// with every page reserved now. Share it with another process through its descriptor
    /// ([`Segment::file`]) and [`Segment::from_fd`] there.
    ///
    /// # Errors
    /// [`Error::NoSpace`] if the memory cannot be reserved, [`Error::InvalidArgument`] for a
    /// size below a header, [`Error::Os`].
    ///
    /// # Examples
    /// ```
    /// let seg = shm_ring::Segment::anonymous(4096)?;
    /// seg.publish(1);
    /// assert_eq!(seg.len(), 4096);
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    #[cfg_attr(not(feature = "unstable-internals"), allow(dead_code))]
    pub fn anonymous(size: usize) -> Result<Segment, Error> {
        Self::anonymous_reserving("anon", size, size)
    }

    /// [`Segment::anonymous`], reserving only the first `reserve` bytes now; the rest is
    /// address space until [`Segment::commit`] reserves it (a channel commits each pool block
    /// the first time it is loaned). `label` names the memfd (`/proc/<pid>/fd` shows
    /// `/memfd:shmpipe:<label>`) and the channel in errors.
    pub(crate) fn anonymous_reserving(
        label: &str,
        size: usize,
        reserve: usize,
    ) -> Result<Segment, Error> {
        check_size(size)?;
        let file = sys::memfd(&format!("shmpipe:{label}"))?;
        sys::reserve(&file, size as u64, reserve.min(size) as u64)
            .map_err(|e| no_space(e, &file, label, reserve))?;
        // From here on the size is fixed for good: no holder of the descriptor can shrink it
        // under another process's mapping (SIGBUS) or grow it.
        sys::seal(&file)?;
        let map = MmapOptions::new().len(size).map_raw(&file)?;
        let info = write_header(&map, size);
        Ok(Segment {
            label: label.to_string(),
            info,
            map,
            file,
            owner: true,
        })
    }

    /// Reserves the pages of `[off, off + len)` (inside the segment), which were address space
    /// only: after this, touching them cannot fail. Only the creator commits.
    ///
    /// # Errors
    /// [`Error::NoSpace`] when memory cannot hold them, naming the bytes the segment would
    /// then hold; [`Error::InvalidArgument`] for a range outside the segment; [`Error::Os`].
    pub(crate) fn commit(&self, off: usize, len: usize) -> Result<(), Error> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.len())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "commit of {len} bytes at {off} outside a segment of {}",
                    self.len()
                ))
            })?;
        sys::allocate(&self.file, off as u64, len as u64)
            .map_err(|e| no_space(e, &self.file, &self.label, end))
    }

    /// Gives back the pages of `[off, off + len)` (inside the segment): they become a hole
    /// again, address space only, reading as zeros until [`Segment::commit`] reserves them.
    /// Only the creator decommits, and only memory no peer is reading.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the segment; [`Error::Os`].
    pub(crate) fn decommit(&self, off: usize, len: usize) -> Result<(), Error> {
        if off.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(Error::InvalidArgument(format!(
                "decommit of {len} bytes at {off} outside a segment of {}",
                self.len()
            )));
        }
        sys::punch(&self.file, off as u64, len as u64).map_err(Error::from)
    }

    /// Marks the segment initialised, with the `kind` of what its user area holds. Nothing
    /// beyond the header may be written by the creator's peers before this; openers refuse a
    /// segment that is not published.
    pub fn publish(&self, kind: u32) {
        word32(&self.map, KIND_AT).store(kind, Ordering::Relaxed);
        // SYNC POINT (Release): the header and the whole user area are initialised; pairs with
        // the Acquire load in `load_header` of every opener.
        word32(&self.map, READY_AT).store(READY, Ordering::Release);
    }

    /// Maps a segment from a descriptor of its memfd (inherited, passed, or received from the
    /// process that made it), and validates it: a regular file sealed against shrinking and
    /// growing (as [`Segment::anonymous`] leaves it), whose header states its size.
    ///
    /// # Errors
    /// [`Error::NotASegment`] (not a sealed memfd, bad magic, size, kind, or not published:
    /// the message says which), [`Error::VersionMismatch`], [`Error::Os`].
    pub fn from_fd(fd: OwnedFd, kind: u32) -> Result<Segment, Error> {
        Self::from_fd_reached(fd, kind, Reached::Descriptor)
    }

    /// [`Segment::from_fd`] for a descriptor that came the way `how` says.
    pub(crate) fn from_fd_reached(
        fd: OwnedFd,
        kind: u32,
        how: Reached<'_>,
    ) -> Result<Segment, Error> {
        let file = File::from(fd);
        let st = sys::fstat(&file)?;
        if !is_regular(&st) {
            let what = sys::dir::kind_of(&st);
            return Err(how.refuse(&format!("is {what}, not a memfd")));
        }
        let want = sys::required_seals();
        let seals = sys::seals(&file).map_err(|e| {
            how.refuse(&format!(
                "is a file that cannot be sealed ({e}), not a memfd"
            ))
        })?;
        if !seals.contains(want) {
            return Err(how.refuse(&format!(
                "is a memfd with seals {seals:?} instead of {want:?} (a holder of it could \
                 truncate it under our mapping)"
            )));
        }
        // The size is read again now that the seals are known: before, a holder could still
        // shrink the file between our fstat and the seal check, and we would map (and touch)
        // pages past its end: SIGBUS (review 17). Sealed against shrink and grow, it is fixed.
        let st = sys::fstat(&file)?;
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len < HEADER_SIZE as u64 {
            return Err(how.refuse(&format!("holds {len} bytes, less than a segment header")));
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| isize::try_from(l).is_ok())
            .ok_or_else(|| how.refuse(&format!("holds {len} bytes, more than we can map")))?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        let h = load_header(&map);
        if h.magic != MAGIC {
            return Err(how.refuse(&format!(
                "does not start with a shm-ring header (magic {:#x})",
                h.magic
            )));
        }
        if h.version != LAYOUT_VERSION {
            return Err(Error::VersionMismatch {
                found: h.version,
                expected: LAYOUT_VERSION,
            });
        }
        if h.ready != READY {
            return Err(how.refuse("holds a channel its creator never finished setting up"));
        }
        if h.size != len as u64 {
            return Err(how.refuse(&format!(
                "holds {len} bytes while its header says {}",
                h.size
            )));
        }
        if h.kind != kind {
            return Err(how.refuse(&format!(
                "holds a segment of kind {} (expected {kind})",
                h.kind
            )));
        }
        Ok(Segment {
            label: match how {
                Reached::Descriptor => "(received)".to_string(),
                Reached::Name { name, .. } => name.to_string(),
            },
            info: SegmentInfo {
                version: h.version,
                creator_pid: h.creator_pid,
                creator_start: h.creator_start,
                size: h.size,
            },
            map,
            file,
            owner: false,
        })
    }

    /// The header, as read (once) and validated when the segment was created or opened.
    pub fn header(&self) -> SegmentInfo {
        self.info
    }

    /// Start of the mapping (the header). The user area starts at `HEADER_SIZE`. See the
    /// type's documentation for what may happen to this memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The whole mapping, to read (copies of checked ranges; see [`ShmBytes`]).
    pub(crate) fn bytes(&self) -> ShmBytes<'_> {
        // SAFETY: the mapping is `len()` bytes long and stays mapped while `self` lives (it
        // is unmapped only on drop; sealed, so its size cannot change).
        unsafe { ShmBytes::from_raw_parts(self.map.as_mut_ptr(), self.map.len()) }
    }

    /// The whole mapping, to write while this process holds the only handle (a creator
    /// filling a segment before it publishes and shares it).
    pub(crate) fn init_bytes(&mut self) -> ShmBytesMut<'_> {
        // SAFETY: mapped for `len()` bytes while `self` lives; `&mut self` means no reference
        // of this process into the mapping lives meanwhile (every one is derived from a
        // borrow of the segment).
        unsafe { ShmBytesMut::from_raw_parts(self.map.as_mut_ptr(), self.map.len()) }
    }

    /// Total size in bytes, header included.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a segment holds at least its header.
    #[cfg_attr(not(feature = "unstable-internals"), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memfd behind the mapping (to pass to another process).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether this handle created the segment.
    #[cfg_attr(not(feature = "unstable-internals"), allow(dead_code))]
    pub fn is_owner(&self) -> bool {
        self.owner
    }
}

/// `ENOSPC`/`EFBIG`/`ENOMEM` (a memory cgroup's limit) while reserving `needed` bytes of
/// `file` as [`Error::NoSpace`].
fn no_space(e: Errno, file: &File, name: &str, needed: usize) -> Error {
    match e {
        Errno::NOSPC | Errno::FBIG | Errno::NOMEM => Error::NoSpace {
            name: name.to_string(),
            needed: needed as u64,
            available: sys::free_bytes(file),
        },
        e => Error::from(e),
    }
}

/// Writes the header of a fresh segment (ready flag still 0) and returns its copy.
fn write_header(map: &MmapRaw, size: usize) -> SegmentInfo {
    let pid = sys::pid();
    let info = SegmentInfo {
        version: LAYOUT_VERSION,
        creator_pid: pid,
        creator_start: sys::process_start_time(pid).unwrap_or(0),
        size: size as u64,
    };
    word64(map, MAGIC_AT).store(MAGIC, Ordering::Relaxed);
    word32(map, VERSION_AT).store(info.version, Ordering::Relaxed);
    word32(map, PID_AT).store(pid, Ordering::Relaxed);
    word64(map, START_AT).store(info.creator_start, Ordering::Relaxed);
    word64(map, SIZE_AT).store(info.size, Ordering::Relaxed);
    info
}
