//! Shared-memory segments: a named (`shm_open`) or anonymous (`memfd`) file, fully reserved
//! at creation and mapped read-write, starting with a [`SegmentHeader`].
//!
//! ```text
//! offset 0   SegmentHeader (64 bytes): magic, layout version, kind, creator pid + start time,
//!            total size, ready flag
//! offset 64  the user of the segment (a channel) lays out its own structures here
//! ```

use std::fs::File;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::Error;
use crate::sys;

/// Prefix of every segment name this crate creates in `/dev/shm`.
pub const NAME_PREFIX: &str = "shmpipe-";
/// First bytes of every segment: `b"SHMPIPE\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMPIPE\0");
/// Version of the shared-memory layout; segments of other versions are refused.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes taken by the segment header; the user area starts here (64-byte aligned).
pub const HEADER_SIZE: usize = 64;
const READY: u32 = 0x5245_4459;

/// The header at offset 0 of every segment.
#[repr(C)]
#[derive(Debug)]
pub struct SegmentHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// What the user area holds (1: a channel).
    pub kind: u32,
    /// Pid of the creating process.
    pub creator_pid: u32,
    _pad0: u32,
    /// Start time of the creating process (clock ticks since boot), to tell a recycled pid apart.
    pub creator_start: u64,
    /// Total size of the segment in bytes, header included.
    pub size: u64,
    /// `READY` once the creator has initialised the user area.
    ready: AtomicU32,
    _pad1: [u32; 5],
}
const _: () = assert!(std::mem::size_of::<SegmentHeader>() == HEADER_SIZE);

/// A mapped shared-memory segment.
///
/// The creating handle (the owner) unlinks the name when dropped; the memory itself lives
/// until the last process unmaps it. Mapping is `unsafe` in general because another process may
/// change the bytes at any time: this crate only reads shared memory through atomics or through
/// plain-old-data types for which every bit pattern is valid, and validates every offset and
/// length it reads before using it.
#[derive(Debug)]
pub struct Segment {
    name: Option<String>,
    map: MmapRaw,
    file: File,
    owner: bool,
}

fn os_name(name: &str) -> String {
    format!("/{NAME_PREFIX}{name}")
}

fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "segment name {name:?}: use 1-200 characters from [A-Za-z0-9._-]"
        )))
    }
}

impl Segment {
    /// Creates the segment `/dev/shm/shmpipe-<name>` of `size` bytes (header included), mode
    /// 0600, with every page reserved now. Stale segments of dead creators are reclaimed first.
    ///
    /// The segment is not visible to [`Segment::open`] until [`Segment::publish`] is called.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`], [`Error::NoSpace`] when `/dev/shm` is too small (never a
    /// `SIGBUS` later), [`Error::InvalidArgument`] for a bad name, [`Error::Os`].
    ///
    /// # Examples
    /// ```
    /// let seg = shm_ring::Segment::create(&format!("doc-seg-{}", std::process::id()), 4096)?;
    /// seg.publish(1);
    /// assert_eq!(seg.len(), 4096);
    /// # Ok::<(), shm_ring::Error>(())
    /// ```
    pub fn create(name: &str, size: usize) -> Result<Segment, Error> {
        check_name(name)?;
        if size < HEADER_SIZE {
            return Err(Error::InvalidArgument(format!(
                "segment size {size} < {HEADER_SIZE}"
            )));
        }
        let _ = reclaim_stale();
        let os = os_name(name);
        let file = sys::shm_create(&os).map_err(|e| match e {
            rustix::io::Errno::EXIST => Error::AlreadyExists(name.to_string()),
            e => Error::from(e),
        })?;
        // From here on the name exists: remove it again on any error.
        let unlink_on_err = |e: Error| {
            let _ = sys::shm_unlink(&os);
            e
        };
        Self::reserve(&file, name, size).map_err(unlink_on_err)?;
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&file)
            .map_err(|e| unlink_on_err(Error::Os(e)))?;
        let seg = Segment {
            name: Some(name.to_string()),
            map,
            file,
            owner: true,
        };
        seg.write_header(size);
        Ok(seg)
    }

    /// Creates an anonymous segment (`memfd_create`) of `size` bytes. Share it with a child
    /// process through its file descriptor ([`Segment::file`]) and [`Segment::from_file`].
    ///
    /// # Errors
    /// [`Error::NoSpace`] if the memory cannot be reserved, [`Error::Os`].
    pub fn anonymous(size: usize) -> Result<Segment, Error> {
        if size < HEADER_SIZE {
            return Err(Error::InvalidArgument(format!(
                "segment size {size} < {HEADER_SIZE}"
            )));
        }
        let file = sys::memfd("shmpipe-anon")?;
        Self::reserve(&file, "(anonymous)", size)?;
        // From here on the size is fixed for good: no holder of the descriptor can shrink it
        // under another process's mapping (SIGBUS) or grow it.
        sys::seal(&file)?;
        let map = MmapOptions::new().len(size).map_raw(&file)?;
        let seg = Segment {
            name: None,
            map,
            file,
            owner: true,
        };
        seg.write_header(size);
        Ok(seg)
    }

    fn reserve(file: &File, name: &str, size: usize) -> Result<(), Error> {
        sys::reserve(file, size as u64).map_err(|e| match e {
            rustix::io::Errno::NOSPC | rustix::io::Errno::FBIG => Error::NoSpace {
                name: name.to_string(),
                needed: size as u64,
                available: sys::free_bytes(file),
            },
            e => Error::from(e),
        })
    }

    fn write_header(&self, size: usize) {
        let pid = sys::pid();
        let header = SegmentHeader {
            magic: 0,
            version: LAYOUT_VERSION,
            kind: 0,
            creator_pid: pid,
            _pad0: 0,
            creator_start: sys::process_start_time(pid).unwrap_or(0),
            size: size as u64,
            ready: AtomicU32::new(0),
            _pad1: [0; 5],
        };
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page aligned, and nobody else can
        // see it before `publish` (openers wait for the ready flag).
        unsafe { self.map.as_mut_ptr().cast::<SegmentHeader>().write(header) };
        // SAFETY: offset 0 is 8-aligned and inside the mapping; AtomicU64 has u64's layout.
        let magic = unsafe { &*self.map.as_mut_ptr().cast::<std::sync::atomic::AtomicU64>() };
        // SYNC POINT (Release): the magic goes in last, so `reclaim_stale` in another process
        // never sees our magic with a creator pid not yet written (and mistakes us for dead).
        magic.store(MAGIC, Ordering::Release);
    }

    /// Marks the segment initialised, with the `kind` of what its user area holds.
    /// Openers wait for this before they read anything beyond the header.
    pub fn publish(&self, kind: u32) {
        // SAFETY: kind is a plain u32 of the header, written before the Release below publishes it.
        unsafe { (*self.map.as_mut_ptr().cast::<SegmentHeader>()).kind = kind };
        // SYNC POINT (Release): the header and the whole user area are initialised; pairs with
        // the Acquire load in `open`.
        self.header().ready.store(READY, Ordering::Release);
    }

    /// Opens the existing segment `/dev/shm/shmpipe-<name>`, made by any process of this user.
    /// Waits up to a second for a segment that is still being initialised.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::NotASegment`] (bad magic, size or kind),
    /// [`Error::VersionMismatch`], [`Error::Os`].
    pub fn open(name: &str, kind: u32) -> Result<Segment, Error> {
        check_name(name)?;
        let file = sys::shm_open_rw(&os_name(name)).map_err(|e| match e {
            rustix::io::Errno::NOENT => Error::NotFound(name.to_string()),
            e => Error::from(e),
        })?;
        let mut seg = Self::from_file(file, kind)?;
        seg.name = Some(name.to_string());
        Ok(seg)
    }

    /// Maps an anonymous segment from a descriptor of its memfd (inherited or received from the
    /// creating process), and validates its header.
    ///
    /// # Errors
    /// As [`Segment::from_file`].
    pub fn from_fd(fd: std::os::fd::OwnedFd, kind: u32) -> Result<Segment, Error> {
        let file = File::from(fd);
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
        Self::from_file(file, kind)
    }

    /// Maps a segment from an open file (e.g. a memfd inherited from the parent process), and
    /// validates its header.
    ///
    /// # Errors
    /// As [`Segment::open`].
    pub fn from_file(file: File, kind: u32) -> Result<Segment, Error> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let len = sys::file_len(&file)?;
            if len >= HEADER_SIZE as u64 {
                let len = usize::try_from(len).map_err(|_| Error::NotASegment("size".into()))?;
                let map = MmapOptions::new().len(len).map_raw(&file)?;
                // SAFETY: the mapping is at least HEADER_SIZE bytes and page aligned; `ready` is
                // an atomic, valid for any bit pattern.
                let ready = unsafe { &(*map.as_mut_ptr().cast::<SegmentHeader>()).ready };
                // SYNC POINT (Acquire): pairs with `publish`; the header and user area are initialised.
                if ready.load(Ordering::Acquire) == READY {
                    let seg = Segment {
                        name: None,
                        map,
                        file,
                        owner: false,
                    };
                    seg.validate(kind)?;
                    return Ok(seg);
                }
            }
            if Instant::now() > deadline {
                return Err(Error::NotASegment(format!(
                    "{len} bytes, never initialised by its creator"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn validate(&self, kind: u32) -> Result<(), Error> {
        let h = self.header();
        if h.magic != MAGIC {
            return Err(Error::NotASegment(format!("magic {:#x}", h.magic)));
        }
        if h.version != LAYOUT_VERSION {
            return Err(Error::VersionMismatch {
                found: h.version,
                expected: LAYOUT_VERSION,
            });
        }
        if h.size != self.map.len() as u64 {
            return Err(Error::NotASegment(format!(
                "header says {} bytes, file has {}",
                h.size,
                self.map.len()
            )));
        }
        if h.kind != kind {
            return Err(Error::NotASegment(format!(
                "kind {} (expected {kind})",
                h.kind
            )));
        }
        Ok(())
    }

    /// The header.
    pub fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping is at least HEADER_SIZE bytes and page aligned; the header is
        // plain data plus an atomic, valid for any bit pattern.
        unsafe { &*self.map.as_mut_ptr().cast::<SegmentHeader>() }
    }

    /// Start of the mapping (the header). The user area starts at `HEADER_SIZE`.
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

    /// The file behind the mapping (for passing an anonymous segment to a child process).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether this handle created the segment (and will unlink its name on drop).
    pub fn is_owner(&self) -> bool {
        self.owner
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner
            && let Some(name) = &self.name
        {
            let _ = sys::shm_unlink(&os_name(name));
        }
    }
}

/// Removes every `/dev/shm/shmpipe-*` segment whose creator process no longer exists and
/// returns how many were removed. Segments of live processes, and files that are not our
/// segments, are left alone. Also run by [`Segment::create`].
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
    let mut removed = 0;
    for entry in sys::list_shm(NAME_PREFIX) {
        let os = format!("/{entry}");
        let Ok(file) = sys::shm_open_ro(&os) else {
            continue;
        };
        let Ok(len) = sys::file_len(&file) else {
            continue;
        };
        if len < HEADER_SIZE as u64 {
            continue; // being created right now, or not ours
        }
        let mut header = [0u8; HEADER_SIZE];
        if std::os::unix::fs::FileExt::read_exact_at(&file, &mut header, 0).is_err() {
            continue;
        }
        let field = |at: usize, n: usize| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&header[at..at + n]);
            u64::from_le_bytes(b)
        };
        if field(0, 8) != MAGIC {
            continue;
        }
        let pid = field(16, 4) as u32;
        let start = field(24, 8);
        if pid == 0 {
            continue; // never a creator: a header being written or not ours
        }
        if !sys::process_alive(pid, start) && sys::shm_unlink(&os).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}
