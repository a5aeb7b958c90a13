//! Shared-memory segments: a named (`/dev/shm/shmpipe-<name>`) or anonymous (sealed memfd)
//! file, mapped read-write, starting with a 64-byte header. The public constructors reserve
//! every page at creation (`fallocate`: `NoSpace` now, never `SIGBUS` later); a channel
//! reserves its headers and rings at creation and each pool block when it is first loaned
//! ([`Segment::commit`]), so its committed memory follows what is in flight.
//!
//! ```text
//! offset 0   magic u64 | 8 layout version u32 | 12 kind u32 | 16 creator pid u32 |
//!            24 creator start time u64 | 32 total size u64 | 40 ready flag u32 | 44..64 zero
//! offset 64  the user of the segment (a channel) lays out its own structures here
//! ```
//!
//! Who may touch a segment, and what we check (see ARCHITECTURE.md, "Threat model"):
//! - A named segment is created under a temporary name (`shmpipe-.tmp-<pid>-<random>`), mode
//!   0600, locked (`flock(LOCK_SH)`, held for the creator's whole life), sized, laid out, and
//!   only then published under its final name with `renameat2(RENAME_NOREPLACE)`: the final
//!   name never holds a half-built segment, and an existing name is never replaced.
//! - Opening by name never follows a symlink and never blocks (`O_NOFOLLOW | O_NONBLOCK`),
//!   then requires a regular file owned by our effective uid with no group/other permission
//!   bits and at least a header's size; the header is then read once and validated (magic,
//!   version, ready flag, size == file size, kind).
//! - An anonymous segment is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) as soon as its
//!   size is reserved; [`Segment::from_fd`] refuses a descriptor without those seals.
//! - [`reclaim_stale`] removes a name only if it can lock the file exclusively (no live
//!   creator holds its shared lock): locks die with their process, so this cannot misfire on a
//!   live creator, whatever its pid says.

use std::fs::File;
use std::hash::BuildHasher;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use rustix::io::Errno;

use crate::error::Error;
use crate::sys;

/// Prefix of every segment name this crate creates in `/dev/shm`.
pub const NAME_PREFIX: &str = "shmpipe-";
/// Prefix of a named segment still being built (never opened by name, reclaimed once its
/// creator's lock is gone).
const TMP_PREFIX: &str = "shmpipe-.tmp-";
/// First bytes of every segment: `b"SHMPIPE\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMPIPE\0");
/// Version of the shared-memory layout and protocol; segments of other versions are refused.
/// Version 2: creators hold a shared `flock` on their segment and publish names by rename.
pub const LAYOUT_VERSION: u32 = 2;
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

#[cfg(feature = "layout-internals")]
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

#[cfg(feature = "layout-internals")]
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

/// A mapped shared-memory segment.
///
/// The creating handle (the owner) unlinks the name when dropped; the memory itself lives
/// until the last process unmaps it.
///
/// # The memory behind [`Segment::as_ptr`]
/// Like [`memmap2::MmapRaw`], a `Segment` only hands out a raw pointer: every process that has
/// the segment open (the peer, or any process of the same user for a named segment) may write
/// any byte at any time. Whoever dereferences it must read through atomics (or volatile
/// copies), never create `&`/`&mut` to non-atomic data there, and validate every value read
/// before using it. The size cannot change under an anonymous segment (sealed); under a named
/// one, a process of the same user can still truncate the file (see ARCHITECTURE.md).
#[derive(Debug)]
pub struct Segment {
    /// Name given at creation or open (without the prefix).
    name: Option<String>,
    /// The creator's temporary entry in `/dev/shm` until [`Segment::publish`] renames it.
    tmp: Option<String>,
    published: AtomicBool,
    /// Device and inode of the file, to unlink our own file only.
    id: (u64, u64),
    info: SegmentInfo,
    map: MmapRaw,
    file: File,
    owner: bool,
}

fn entry_name(name: &str) -> String {
    format!("{NAME_PREFIX}{name}")
}

fn path_of(entry: &str) -> String {
    format!("{}/{entry}", sys::SHM_DIR)
}

fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "segment name {name:?}: use 1-200 characters from [A-Za-z0-9._-], not starting with '.'"
        )))
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

/// Whether a named segment's file is one we may trust: a regular file owned by our effective
/// uid, with no group/other permission bits.
fn trusted(st: &rustix::fs::Stat) -> bool {
    is_regular(st) && st.st_uid == sys::euid() && st.st_mode & 0o077 == 0
}

fn untrusted(path: &str, st: &rustix::fs::Stat) -> Error {
    let what = if is_regular(st) {
        ""
    } else {
        ", not a regular file"
    };
    Error::Untrusted(format!(
        "{path} is owned by uid {} with mode {:04o}{what}; refusing to open it: only a regular \
         file owned by uid {} with no group/other permissions is trusted",
        st.st_uid,
        st.st_mode & 0o7777,
        sys::euid()
    ))
}

/// A temporary name that no other process picks: our pid and 64 random bits.
fn tmp_entry() -> String {
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{TMP_PREFIX}{}-{r:016x}", sys::pid())
}

/// Creates, locks and returns a fresh temporary entry. A reclaimer may see the file between
/// our create and our lock and remove it; we then notice that the name no longer leads to our
/// file, and start over with a new name.
fn create_locked_tmp(dir: &OwnedFd) -> Result<(File, String, (u64, u64)), Error> {
    for _ in 0..16 {
        let tmp = tmp_entry();
        let file = match sys::create_entry(dir, &tmp) {
            Ok(f) => f,
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        };
        let st = sys::fstat(&file)?;
        let id = (st.st_dev, st.st_ino);
        if sys::try_lock_shared(&file) && sys::entry_id(dir, &tmp) == Some(id) {
            return Ok((file, tmp, id));
        }
        sys::unlink_entry_if(dir, &tmp, id);
    }
    Err(Error::Os(std::io::Error::other(
        "could not create and lock a temporary segment in /dev/shm (16 attempts)",
    )))
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
    /// Creates the segment `/dev/shm/shmpipe-<name>` of `size` bytes (header included), mode
    /// 0600, with every page reserved now. Stale segments of dead creators are reclaimed first.
    ///
    /// The segment is built under a temporary name and gets its final name only in
    /// [`Segment::publish`]; until then [`Segment::open`] does not find it.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] (anything of that name, whoever made it), [`Error::NoSpace`]
    /// when `/dev/shm` is too small (never a `SIGBUS` later), [`Error::InvalidArgument`] for a
    /// bad name, [`Error::Os`].
    ///
    /// # Examples
    /// ```
    /// let seg = shm_ring::Segment::create(&format!("doc-seg-{}", std::process::id()), 4096)?;
    /// seg.publish(1)?;
    /// assert_eq!(seg.len(), 4096);
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    pub fn create(name: &str, size: usize) -> Result<Segment, Error> {
        Self::create_reserving(name, size, size)
    }

    /// [`Segment::create`], reserving only the first `reserve` bytes now; the rest is address
    /// space until [`Segment::commit`] reserves it (a channel commits each pool block the first
    /// time it is loaned).
    pub(crate) fn create_reserving(
        name: &str,
        size: usize,
        reserve: usize,
    ) -> Result<Segment, Error> {
        check_name(name)?;
        check_size(size)?;
        let _ = reclaim_stale();
        let dir = sys::shm_dir()?;
        // Early, friendly refusal; the authority is the no-replace rename in `publish`.
        if sys::entry_id(&dir, &entry_name(name)).is_some() {
            return Err(Error::AlreadyExists(name.to_string()));
        }
        let (file, tmp, id) = create_locked_tmp(&dir)?;
        // From here on the temporary name exists: remove it again on any error.
        let unlink_on_err = |e: Error| {
            sys::unlink_entry_if(&dir, &tmp, id);
            e
        };
        Self::reserve(&file, name, size, reserve).map_err(unlink_on_err)?;
        test_hook_kill_after_reserve(name);
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&file)
            .map_err(|e| unlink_on_err(Error::Os(e)))?;
        let info = write_header(&map, size);
        Ok(Segment {
            name: Some(name.to_string()),
            tmp: Some(tmp),
            published: AtomicBool::new(false),
            id,
            info,
            map,
            file,
            owner: true,
        })
    }

    /// Creates an anonymous segment (a memfd) of `size` bytes, sealed against shrinking and
    /// growing. Share it with another process through its descriptor ([`Segment::file`]) and
    /// [`Segment::from_fd`] there.
    ///
    /// # Errors
    /// [`Error::NoSpace`] if the memory cannot be reserved, [`Error::Os`].
    pub fn anonymous(size: usize) -> Result<Segment, Error> {
        Self::anonymous_reserving(size, size)
    }

    /// [`Segment::anonymous`], reserving only the first `reserve` bytes now (see
    /// [`Segment::create_reserving`]).
    pub(crate) fn anonymous_reserving(size: usize, reserve: usize) -> Result<Segment, Error> {
        check_size(size)?;
        let file = sys::memfd("shmpipe-anon")?;
        Self::reserve(&file, "(anonymous)", size, reserve)?;
        // From here on the size is fixed for good: no holder of the descriptor can shrink it
        // under another process's mapping (SIGBUS) or grow it.
        sys::seal(&file)?;
        let st = sys::fstat(&file)?;
        let map = MmapOptions::new().len(size).map_raw(&file)?;
        let info = write_header(&map, size);
        Ok(Segment {
            name: None,
            tmp: None,
            published: AtomicBool::new(false),
            id: (st.st_dev, st.st_ino),
            info,
            map,
            file,
            owner: true,
        })
    }

    fn reserve(file: &File, name: &str, size: usize, reserve: usize) -> Result<(), Error> {
        sys::reserve(file, size as u64, reserve as u64)
            .map_err(|e| no_space(e, file, name, reserve))
    }

    /// Reserves the pages of `[off, off + len)` (inside the segment), which were address space
    /// only: after this, touching them cannot fail. Only the creator commits.
    ///
    /// # Errors
    /// [`Error::NoSpace`] when `/dev/shm` (or memory, for an anonymous segment) cannot hold
    /// them, naming the bytes the segment would then hold; [`Error::InvalidArgument`] for a
    /// range outside the segment; [`Error::Os`].
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
        let name = self.name.as_deref().unwrap_or("(anonymous)");
        sys::allocate(&self.file, off as u64, len as u64)
            .map_err(|e| no_space(e, &self.file, name, end))
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

    /// Marks the segment initialised, with the `kind` of what its user area holds, and (for
    /// a named segment) gives it its final name. Nothing beyond the header may be written by
    /// the creator's peers before this; openers refuse a segment that is not published.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] if something took the name meanwhile (it is not replaced),
    /// [`Error::Os`].
    pub fn publish(&self, kind: u32) -> Result<(), Error> {
        word32(&self.map, KIND_AT).store(kind, Ordering::Relaxed);
        // SYNC POINT (Release): the header and the whole user area are initialised; pairs with
        // the Acquire load in `load_header` of every opener.
        word32(&self.map, READY_AT).store(READY, Ordering::Release);
        if let (Some(name), Some(tmp)) = (&self.name, &self.tmp)
            && !self.published.load(Ordering::Relaxed)
        {
            let dir = sys::shm_dir()?;
            sys::publish_entry(&dir, tmp, &entry_name(name)).map_err(|e| match e {
                Errno::EXIST => Error::AlreadyExists(name.clone()),
                e => Error::from(e),
            })?;
            self.published.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Opens the existing segment `/dev/shm/shmpipe-<name>`, made by a process of this user.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Untrusted`] for a symlink, a directory, FIFO or other
    /// non-regular file, a file of another user or with group/other permission bits;
    /// [`Error::NotASegment`] (bad magic, size, kind, or not published);
    /// [`Error::VersionMismatch`]; [`Error::Os`].
    pub fn open(name: &str, kind: u32) -> Result<Segment, Error> {
        check_name(name)?;
        let dir = sys::shm_dir()?;
        let entry = entry_name(name);
        let path = path_of(&entry);
        let refuse = |why: &str| Error::Untrusted(format!("{path} {why}; refusing to open it"));
        let file = sys::open_entry(&dir, &entry, true).map_err(|e| match e {
            Errno::NOENT => Error::NotFound(name.to_string()),
            Errno::LOOP => refuse("is a symbolic link"),
            e => match rustix::fs::statat(&dir, &entry, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if !trusted(&st) => untrusted(&path, &st),
                _ => Error::from(e),
            },
        })?;
        let st = sys::fstat(&file)?;
        if !trusted(&st) {
            return Err(untrusted(&path, &st));
        }
        let mut seg = Self::map_existing(file, st, kind, &path)?;
        seg.name = Some(name.to_string());
        Ok(seg)
    }

    /// Maps an anonymous segment from a descriptor of its memfd (inherited or received from the
    /// creating process), and validates it: a regular file sealed against shrinking and growing
    /// (as [`Segment::anonymous`] leaves it), whose header states its size.
    ///
    /// # Errors
    /// [`Error::NotASegment`] (not a sealed memfd, bad magic, size, kind, or not published),
    /// [`Error::VersionMismatch`], [`Error::Os`].
    pub fn from_fd(fd: OwnedFd, kind: u32) -> Result<Segment, Error> {
        let file = File::from(fd);
        let st = sys::fstat(&file)?;
        if !is_regular(&st) {
            return Err(Error::NotASegment(format!(
                "descriptor is not a regular file (mode {:o})",
                st.st_mode
            )));
        }
        let want = sys::required_seals();
        let seals = sys::seals(&file).map_err(|e| {
            Error::NotASegment(format!(
                "descriptor cannot be sealed ({e}): only a sealed memfd is accepted"
            ))
        })?;
        if !seals.contains(want) {
            return Err(Error::NotASegment(format!(
                "memfd has seals {seals:?}, needs {want:?}: a peer could truncate it under us"
            )));
        }
        Self::map_existing(file, st, kind, "(anonymous)")
    }

    /// Maps a file already checked by the caller and validates its header.
    fn map_existing(
        file: File,
        st: rustix::fs::Stat,
        kind: u32,
        what: &str,
    ) -> Result<Segment, Error> {
        let len = u64::try_from(st.st_size).unwrap_or(0);
        if len < HEADER_SIZE as u64 {
            return Err(Error::NotASegment(format!(
                "{what}: {len} bytes, smaller than a segment header"
            )));
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| isize::try_from(l).is_ok())
            .ok_or_else(|| Error::NotASegment(format!("{what}: {len} bytes")))?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        let h = load_header(&map);
        if h.magic != MAGIC {
            return Err(Error::NotASegment(format!("{what}: magic {:#x}", h.magic)));
        }
        if h.version != LAYOUT_VERSION {
            return Err(Error::VersionMismatch {
                found: h.version,
                expected: LAYOUT_VERSION,
            });
        }
        if h.ready != READY {
            return Err(Error::NotASegment(format!(
                "{what}: never initialised by its creator"
            )));
        }
        if h.size != len as u64 {
            return Err(Error::NotASegment(format!(
                "{what}: header says {} bytes, file has {len}",
                h.size
            )));
        }
        if h.kind != kind {
            return Err(Error::NotASegment(format!(
                "{what}: kind {} (expected {kind})",
                h.kind
            )));
        }
        Ok(Segment {
            name: None,
            tmp: None,
            published: AtomicBool::new(false),
            id: (st.st_dev, st.st_ino),
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

    /// Total size in bytes, header included.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The name given at creation (without the `shmpipe-` prefix), if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The file behind the mapping (for an anonymous segment: the sealed memfd to pass to
    /// another process).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether this handle created the segment (and will unlink its name on drop).
    pub fn is_owner(&self) -> bool {
        self.owner
    }
}

/// `ENOSPC`/`EFBIG` while reserving `needed` bytes of `file` as [`Error::NoSpace`].
fn no_space(e: Errno, file: &File, name: &str, needed: usize) -> Error {
    match e {
        Errno::NOSPC | Errno::FBIG => Error::NoSpace {
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

impl Drop for Segment {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let entry = match (&self.name, &self.tmp) {
            (Some(name), _) if self.published.load(Ordering::Relaxed) => entry_name(name),
            (_, Some(tmp)) => tmp.clone(),
            _ => return,
        };
        // Our file only: if the name was removed and reused meanwhile, it is not ours.
        if let Ok(dir) = sys::shm_dir() {
            sys::unlink_entry_if(&dir, &entry, self.id);
        }
    }
}

/// Test hook: a creator killed at the worst instant (memory reserved, no header yet).
/// `SHM_RING_TEST_KILL_AFTER_RESERVE=<name>` makes the create of `<name>` SIGKILL its own
/// process right there; used by `tests/reclaim.rs`.
fn test_hook_kill_after_reserve(name: &str) {
    if std::env::var_os("SHM_RING_TEST_KILL_AFTER_RESERVE").is_some_and(|v| v == name) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

/// Removes every `/dev/shm/shmpipe-*` segment of ours whose creator is gone, and every
/// half-built one (`shmpipe-.tmp-*`) whose creator died, and returns how many were removed.
///
/// "Gone" is decided by a lock, never by a pid: every creator holds a shared `flock` on its
/// segment for its whole life, and an entry is removed only if we can lock it exclusively.
/// Left alone: anything that is not a regular file (FIFOs, symlinks, directories: opened with
/// `O_NOFOLLOW | O_NONBLOCK`, never read), files of other users or with group/other permission
/// bits, and segments of another layout version (their creators may not lock: not ours to
/// judge). The name is removed only if it still leads to the file we locked; what remains is
/// described at `sys::unlink_entry_if`. Also run by [`Segment::create`].
///
/// # Errors
/// None in practice: entries that cannot be inspected are skipped.
///
/// # Examples
/// ```
/// let removed = shm_ring::reclaim_stale()?;
/// println!("reclaimed {removed} stale segments");
/// # Ok::<(), shm_ring::Error>(())
/// ```
pub fn reclaim_stale() -> Result<usize, Error> {
    let Ok(dir) = sys::shm_dir() else {
        return Ok(0);
    };
    Ok(sys::list_shm(NAME_PREFIX)
        .iter()
        .filter(|entry| reclaim_one(&dir, entry))
        .count())
}

fn reclaim_one(dir: &OwnedFd, entry: &str) -> bool {
    let Ok(file) = sys::open_entry(dir, entry, false) else {
        return false;
    };
    let Ok(st) = sys::fstat(&file) else {
        return false;
    };
    if !trusted(&st) || !sys::try_lock_exclusive(&file) {
        return false; // not ours to judge, or its creator is alive
    }
    if !entry.starts_with(TMP_PREFIX) {
        // A published name: a segment of our layout version, or not ours to judge.
        let mut h = [0u8; 16];
        if std::os::unix::fs::FileExt::read_exact_at(&file, &mut h, 0).is_err() {
            return false;
        }
        let magic = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        if magic != MAGIC || version != LAYOUT_VERSION {
            return false;
        }
    }
    // The lock is released when `file` closes, after the unlink.
    sys::unlink_entry_if(dir, entry, (st.st_dev, st.st_ino))
}
