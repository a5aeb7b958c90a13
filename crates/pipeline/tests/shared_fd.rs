//! Descriptors shared with a pipeline's children (`PipelineBuilder::share_fd`): they reach
//! exactly the children whose arguments name them, through the control socket, never by
//! number; a descriptor dropped by the parent after `start()` and a new one that reuses its
//! number cannot be confused (issue 16, hole 3, in its general form).

mod common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use common::*;
use rustix::fs::{MemfdFlags, SealFlags};
use shmpipe::{Epochs, Error, Item, Pipeline, Registry, SharedFd, Topology, map};

const MEMFD_NAME: &str = "shmpipe-test-shared";

/// A memfd holding `text`, sealed for good (close-on-exec).
fn sealed(text: &str) -> OwnedFd {
    let fd = rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::ALLOW_SEALING | MemfdFlags::CLOEXEC)
        .unwrap();
    rustix::io::write(&fd, text.as_bytes()).unwrap();
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )
    .unwrap();
    fd
}

fn read_all(fd: std::os::fd::BorrowedFd<'_>) -> String {
    let mut buf = vec![0u8; 256];
    let n = rustix::io::pread(fd, &mut buf, 0).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn reg() -> Registry {
    registry()
        // Reads its shared descriptor when built (as a dataset step maps its store), after
        // an optional delay: the parent has moved on by then.
        .step("read_shared", |cx| {
            if let Some(ms) = cx.args["build_delay_ms"].as_u64() {
                std::thread::sleep(Duration::from_millis(ms));
            }
            let text = read_all(cx.shared_fd("data")?);
            Ok(map(move |it: Item| Ok(it.with_meta("data", text.clone()))))
        })
        .source("shared_text", |cx| {
            let text = read_all(cx.shared_fd("data")?);
            let n = cx.args["n"].as_i64().unwrap_or(4);
            Ok(shmpipe::MemorySource::new(
                (0..n)
                    .map(|i| Item::new().with_meta("n", i).with_meta("src", text.clone()))
                    .collect(),
            )
            .part(cx.part, cx.parts))
        })
}

fn memfds_named(pid: u32) -> usize {
    proc::fd_links(pid)
        .iter()
        .filter(|(_, to)| to.to_string_lossy().contains(MEMFD_NAME))
        .count()
}

/// The source's descriptor reaches the emitters only, the first stage's the first stage's
/// workers only; the second stage holds neither.
#[test]
fn shared_descriptors_reach_exactly_the_children_that_name_them() {
    let reg = reg();
    shmpipe::init(&reg);
    let (src, data) = (sealed("for the emitters"), sealed("for stage 0"));
    let mut b = Pipeline::builder(&reg);
    let hs = b.share_fd(src.as_fd()).unwrap();
    let hd = b.share_fd(data.as_fd()).unwrap();
    // The builder holds its own copies: the caller's descriptors may go at once.
    drop((src, data));
    let mut p = b
        .source_named("shared_text", serde_json::json!({"data": hs, "n": 6}))
        .emitters(2)
        // Endless: the emitters are still there when their descriptors are looked at.
        .epochs(Epochs::Cycle)
        .step_with("read_shared", serde_json::json!({"data": hd}))
        .step("inc")
        .topology(Topology::Staged {
            workers: vec![2, 2],
        })
        .start()
        .unwrap();
    let (id, pids) = (p.id().to_owned(), p.pids());
    let _g = (ShmGuard::containing(id), KillOnDrop(pids.clone()));
    // pids: emitters 0, 1; stage 0 workers 2, 3; stage 1 workers 4, 5.
    let held: Vec<usize> = pids.iter().map(|&pid| memfds_named(pid)).collect();
    assert_eq!(
        held,
        vec![1, 1, 1, 1, 0, 0],
        "shared memfds held by each child"
    );
    let out = within(Duration::from_secs(20), "the run", move || {
        p.take_epoch(12).collect::<Result<Vec<_>, _>>()
    })
    .unwrap();
    assert_eq!(out.len(), 12);
    for it in &out {
        assert_eq!(it.str("src"), Some("for the emitters"));
        assert_eq!(it.str("data"), Some("for stage 0"));
    }
}

/// Hole 3's scenario for any shared descriptor: the parent drops the memfd right after
/// `start()` and makes another one, which takes the same number; workers that read their
/// descriptor later still read the first.
#[test]
fn a_dropped_descriptor_and_a_new_one_with_its_number_are_not_confused() {
    let reg = reg();
    shmpipe::init(&reg);
    let a = sealed("dataset A");
    let mut b = Pipeline::builder(&reg);
    let h = b.share_fd(a.as_fd()).unwrap();
    let p = b
        .step_with(
            "read_shared",
            serde_json::json!({"data": h, "build_delay_ms": 300}),
        )
        .workers(2)
        .start()
        .unwrap();
    let (id, pids) = (p.id().to_owned(), p.pids());
    let _g = (ShmGuard::containing(id), KillOnDrop(pids));
    let number = a.as_raw_fd();
    drop(a);
    let b_fd = sealed("dataset B");
    assert_eq!(b_fd.as_raw_fd(), number, "the new memfd reuses the number");
    let out = within(Duration::from_secs(20), "the run", move || {
        p.run((0..4).map(|n| Item::new().with_meta("n", n)))
    })
    .unwrap();
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|it| it.str("data") == Some("dataset A")));
}

/// What cannot be shared, and handles the builder never gave out, are configuration errors
/// at once; a step that asks for an argument that is no handle gets a step error.
#[test]
fn unsealed_files_and_unknown_handles_are_refused() {
    let reg = reg();
    shmpipe::init(&reg);
    let mut b = Pipeline::builder(&reg);
    let unsealed = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
    let e = b.share_fd(unsealed.as_fd()).unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("F_SEAL_WRITE")),
        "{e}"
    );
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    assert!(b.share_fd(file.as_fd()).is_err());
    let forged: SharedFd =
        serde_json::from_value(serde_json::json!({"shmpipe_shared_fd": 5})).unwrap();
    let e = b
        .clone()
        .step_with("read_shared", serde_json::json!({"data": forged}))
        .start()
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("did not share")),
        "{e}"
    );
    let p = b
        .step_with("read_shared", serde_json::json!({"data": 3}))
        .workers(1)
        .start()
        .unwrap();
    let (id, pids) = (p.id().to_owned(), p.pids());
    let _g = (ShmGuard::containing(id), KillOnDrop(pids));
    let e = within(Duration::from_secs(20), "the run", move || {
        p.run([Item::new().with_meta("n", 0)])
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("not a shared descriptor handle"),
        "{e}"
    );
}
