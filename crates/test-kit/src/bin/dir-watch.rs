//! Records every name created in (or moved into) a directory, for as long as it runs:
//! `.ci/run` watches `/dev/shm` through the whole test suite, the examples and the demo, and
//! fails if a name of ours ever appeared there, even for a microsecond (a periodic `ls` would
//! miss a file made and removed between two looks).
//!
//! ```text
//! dir-watch DIR LOG      append each new name in DIR to LOG, one per line; print "watching"
//!                        once the watch is in place; "!overflow" in LOG if the kernel dropped
//!                        events (then nothing can be vouched for); runs until killed
//! ```
use std::io::Write;
use std::mem::MaybeUninit;

use rustix::fs::inotify;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(log)) = (args.first(), args.get(1)) else {
        eprintln!("usage: dir-watch DIR LOG");
        std::process::exit(2);
    };
    if let Err(e) = watch(dir, log) {
        eprintln!("dir-watch: {e}");
        std::process::exit(1);
    }
}

fn watch(dir: &str, log: &str) -> std::io::Result<()> {
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC)?;
    inotify::add_watch(
        &fd,
        dir,
        inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO,
    )?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    println!("watching");
    std::io::stdout().flush()?;
    let mut buf = [MaybeUninit::<u8>::uninit(); 64 * 1024];
    let mut events = inotify::Reader::new(&fd, &mut buf);
    loop {
        let e = match events.next() {
            Ok(e) => e,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if e.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
            writeln!(out, "!overflow")?;
        }
        if let Some(name) = e.file_name() {
            writeln!(out, "{}", name.to_string_lossy())?;
        }
        out.flush()?;
    }
}
