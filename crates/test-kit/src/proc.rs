//! Reading `/proc`: a process's stat fields, CPU ticks, fd links, environment and command
//! line, and the processes that match one of them. Every reader returns `None` (or nothing)
//! for a process that is gone: processes end while a test looks at them.

use std::path::PathBuf;

/// The fields of `/proc/<pid>/stat` the tests use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The command name (field 2, without its parentheses; it may hold spaces and `)`).
    pub comm: String,
    /// The state letter (field 3): `R`, `S`, `D`, `Z` (zombie), ...
    pub state: char,
    /// The parent's pid (field 4).
    pub ppid: u32,
    /// CPU time in user mode, in clock ticks (field 14).
    pub utime: u64,
    /// CPU time in kernel mode, in clock ticks (field 15).
    pub stime: u64,
    /// The start time in clock ticks since boot (field 22).
    pub start_time: u64,
}

impl Stat {
    /// User plus kernel CPU time, in clock ticks (usually 10 ms).
    pub fn cpu_ticks(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Parses the text of a `/proc/<pid>/stat` file. The command name is found by the last `)`,
/// since the name itself may contain spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    // Fields from 3 (state) on; field n is at index n - 3.
    let f: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let mut state = f.first()?.chars();
    let (Some(letter), None) = (state.next(), state.next()) else {
        return None;
    };
    Some(Stat {
        comm,
        state: letter,
        ppid: u32::try_from(num(4)?).ok()?,
        utime: num(14)?,
        stime: num(15)?,
        start_time: num(22)?,
    })
}

/// The stat fields of process `pid`, or `None` if it is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU ticks (user + kernel) process `pid` has used so far, or `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.cpu_ticks())
}

/// Pids of every process now in `/proc`.
pub fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Pids of the live (not zombie) processes whose parent is `ppid`.
pub fn children_of(ppid: u32) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|&p| stat(p).is_some_and(|s| s.ppid == ppid && s.state != 'Z'))
        .collect()
}

/// The `KEY=value` entries of process `pid`'s environment (as it was at exec), or `None` if
/// it is gone or not ours to read.
pub fn environ(pid: u32) -> Option<Vec<Vec<u8>>> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        env.split(|&b| b == 0)
            .filter(|kv| !kv.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// Pids of the live (not zombie) processes whose environment holds exactly `key=value`.
pub fn processes_with_env(key: &str, value: &str) -> Vec<u32> {
    let needle = format!("{key}={value}");
    pids()
        .into_iter()
        // Live: its stat is readable and it is not a zombie (the opposite of `crate::gone`,
        // which is written in terms of this module).
        .filter(|&p| stat(p).is_some_and(|s| s.state != 'Z'))
        .filter(|&p| environ(p).is_some_and(|e| e.iter().any(|kv| kv == needle.as_bytes())))
        .collect()
}

/// The command line of process `pid`, arguments joined by spaces, or `None` if it is gone.
pub fn cmdline(pid: u32) -> Option<String> {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&cmd).replace('\0', " "))
}

/// The command lines of the other processes (not this one) whose command line contains
/// `needle`: a test's stray children, which got their parent's arguments.
pub fn processes_with_cmdline(needle: &str) -> Vec<String> {
    let me = std::process::id();
    pids()
        .into_iter()
        .filter(|&p| p != me)
        .filter_map(cmdline)
        .filter(|c| c.contains(needle))
        .collect()
}

/// The open file descriptors of process `pid`: `(/proc/<pid>/fd/<n>, what it leads to)`.
pub fn fd_links(pid: u32) -> Vec<(PathBuf, PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.path(), std::fs::read_link(e.path()).ok()?)))
        .collect()
}

/// The `/proc/<pid>/fd/<n>` paths of process `pid`'s memory files (`/memfd:...`).
pub fn memfds(pid: u32) -> Vec<PathBuf> {
    fd_links(pid)
        .into_iter()
        .filter(|(_, to)| to.to_string_lossy().starts_with("/memfd:"))
        .map(|(fd, _)| fd)
        .collect()
}

/// Bytes of memory allocated to the distinct memfds that processes `pids` hold open
/// (`st_blocks x 512`, each file counted once): what shared-memory channels commit.
pub fn memfd_bytes(pids: &[u32]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashMap::new();
    for &pid in pids {
        for fd in memfds(pid) {
            // `metadata` follows the link to the memfd's inode.
            if let Ok(m) = std::fs::metadata(&fd) {
                seen.insert((m.dev(), m.ino()), m.blocks() * 512);
            }
        }
    }
    seen.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stat_finds_fields_after_a_hostile_command_name() {
        // Field 2 with spaces and a ") " inside, as a process may name itself.
        let text = "4242 (a) S 1 (x) R 77 4242 4242 0 -1 4194560 100 0 0 0 \
                    123 45 6 7 20 0 1 0 998877 1000 10 18446744073709551615";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.comm, "a) S 1 (x");
        assert_eq!(s.state, 'R');
        assert_eq!(s.ppid, 77);
        assert_eq!((s.utime, s.stime), (123, 45));
        assert_eq!(s.cpu_ticks(), 168);
        assert_eq!(s.start_time, 998877);
    }

    #[test]
    fn parse_stat_refuses_truncated_or_garbled_text() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("1 (x) S 0 1 1"), None);
        let good = "1 (x) S 0 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 9";
        assert!(parse_stat(good).is_some());
        assert_eq!(parse_stat(&good.replace(" S ", " SS ")), None);
        assert_eq!(parse_stat(&good.replace(" 5 6 ", " 5 x ")), None);
    }

    #[test]
    fn our_own_stat_fd_links_and_environment() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert_ne!(s.state, 'Z');
        assert_eq!(
            s.ppid,
            rustix::process::getppid().unwrap().as_raw_nonzero().get() as u32
        );
        assert!(cpu_ticks(me).is_some());
        let t = crate::TempFile::new("kit-fd", "txt");
        std::fs::write(&t.0, b"x").unwrap();
        let f = std::fs::File::open(&t.0).unwrap();
        assert!(
            fd_links(me).iter().any(|(_, to)| *to == t.0),
            "{:?}",
            fd_links(me)
        );
        drop(f);
        assert!(!fd_links(me).iter().any(|(_, to)| *to == t.0));
        assert!(
            environ(me)
                .unwrap()
                .iter()
                .any(|kv| kv.starts_with(b"PATH="))
        );
        assert!(cmdline(me).is_some());
        assert!(stat(u32::MAX).is_none());
    }

    #[test]
    fn children_env_and_cmdline_find_a_child() {
        let token = crate::unique_name("kit-proc");
        let child = std::process::Command::new("sleep")
            .arg("30")
            .env("SHMPIPE_TEST_KIT_TOKEN", &token)
            .spawn()
            .unwrap();
        let g = crate::ChildGuard(child);
        assert!(children_of(std::process::id()).contains(&g.id()));
        assert_eq!(
            processes_with_env("SHMPIPE_TEST_KIT_TOKEN", &token),
            vec![g.id()]
        );
        assert!(
            processes_with_cmdline("sleep 30")
                .iter()
                .any(|c| c.starts_with("sleep"))
        );
        drop(g);
        assert!(processes_with_env("SHMPIPE_TEST_KIT_TOKEN", &token).is_empty());
    }

    #[test]
    fn memfds_lists_our_memfd() {
        let name = crate::unique_name("kit-memfd");
        let fd = rustix::fs::memfd_create(name.as_str(), rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let ours = |fds: Vec<PathBuf>| {
            fds.iter()
                .any(|p| std::fs::read_link(p).is_ok_and(|l| l.to_string_lossy().contains(&name)))
        };
        assert!(ours(memfds(std::process::id())));
        let me = [std::process::id()];
        let before = memfd_bytes(&me);
        rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
        rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, 1 << 20).unwrap();
        assert_eq!(memfd_bytes(&me), before + (1 << 20));
        drop(fd);
        assert!(!ours(memfds(std::process::id())));
        assert_eq!(memfd_bytes(&me), before);
    }
}
