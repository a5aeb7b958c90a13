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

/// Starts `b` with one worker of `read_shared` reading `data` and runs one item through it
/// (at most 20 s), the pipeline guarded meanwhile.
fn run_read_shared_once(
    b: shmpipe::PipelineBuilder,
    data: serde_json::Value,
) -> Result<Vec<Item>, Error> {
    let (p, _g) = start_guarded(
        b.step_with("read_shared", serde_json::json!({ "data": data }))
            .workers(1),
    );
    within(Duration::from_secs(20), "the run", move || {
        p.run([Item::new().with_meta("n", 0)])
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
    let (_, pids, _g) = guarded(&p);
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
    let (p, _g) = start_guarded(
        b.step_with(
            "read_shared",
            serde_json::json!({"data": h, "build_delay_ms": 300}),
        )
        .workers(2),
    );
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
    let e = run_read_shared_once(b, serde_json::json!(3)).unwrap_err();
    assert!(
        e.to_string().contains("not a shared descriptor handle"),
        "{e}"
    );
}

/// A `SharedFd` was a bare index into the builder that made it: a handle of pipeline A used
/// in pipeline B silently named B's descriptor of the same index (B's workers read B's data
/// where the arguments meant A's). A handle names one descriptor of one builder: any other
/// builder refuses it, at `start()`, saying so.
#[test]
fn a_handle_of_another_builder_is_refused() {
    let reg = reg();
    shmpipe::init(&reg);
    let (a, b_data) = (sealed("dataset A"), sealed("dataset B"));
    let mut builder_a = Pipeline::builder(&reg);
    let ha = builder_a.share_fd(a.as_fd()).unwrap();
    let mut builder_b = Pipeline::builder(&reg);
    let _hb = builder_b.share_fd(b_data.as_fd()).unwrap();
    let started = builder_b
        .step_with("read_shared", serde_json::json!({"data": ha}))
        .workers(1)
        .start();
    let p = match started {
        Err(Error::Config(m)) => {
            assert!(m.contains("another builder"), "{m}");
            return;
        }
        Err(e) => panic!("refused, but not as a configuration error: {e}"),
        Ok(p) => p,
    };
    let _g = guarded(&p);
    let out = within(Duration::from_secs(20), "the run", move || {
        p.run([Item::new().with_meta("n", 0)])
    });
    let data = out.map(|o| o[0].str("data").map(str::to_owned));
    panic!("pipeline B accepted pipeline A's handle; its worker read {data:?}");
}

/// Clones of a builder share what was shared before the clone (the same descriptors); what
/// each shares afterwards is its own: a handle the one made is refused by the other, though
/// both hold a descriptor at the same place in their lists.
#[test]
fn handles_made_after_a_clone_belong_to_one_clone() {
    let reg = reg();
    shmpipe::init(&reg);
    let (x, y, z) = (sealed("X"), sealed("Y"), sealed("Z"));
    let mut a = Pipeline::builder(&reg);
    let hx = a.share_fd(x.as_fd()).unwrap();
    let mut b = a.clone();
    let hy = a.share_fd(y.as_fd()).unwrap();
    let _hz = b.share_fd(z.as_fd()).unwrap();
    let e = b
        .clone()
        .step_with("read_shared", serde_json::json!({"data": hy}))
        .start()
        .unwrap_err();
    assert!(
        matches!(&e, Error::Config(m) if m.contains("another builder")),
        "{e}"
    );
    // The handle made before the clone names X in both.
    let out = run_read_shared_once(b, serde_json::json!(hx)).unwrap();
    assert_eq!(out[0].str("data"), Some("X"));
}

/// `share_fd` accepted up to 128 descriptors, but an emitter of an ordered pipeline also got
/// the issued counters in the same message: 129 descriptors, which the control socket refused;
/// the error was discarded, so the emitter waited for a message that never came and `start()`
/// failed only after the 30 s start-up timeout, saying only that a child did not connect.
#[test]
fn an_ordered_emitter_with_128_shared_descriptors_starts() {
    let reg = reg();
    shmpipe::init(&reg);
    let data = sealed("x");
    let mut b = Pipeline::builder(&reg);
    let hs: Vec<_> = (0..128)
        .map(|_| b.share_fd(data.as_fd()).unwrap())
        .collect();
    assert!(
        matches!(b.share_fd(data.as_fd()), Err(Error::Config(m)) if m.contains("128")),
        "a 129th shared descriptor"
    );
    let b = b
        .source_named("range", serde_json::json!({"n": 4, "len": 1, "fds": hs}))
        .ordered(true)
        .step("inc")
        .workers(1);
    let t0 = std::time::Instant::now();
    let r = within(Duration::from_secs(90), "start", move || {
        b.start().map(|p| {
            let ids = (p.id().to_owned(), p.pids());
            (p.run(std::iter::empty()).map(|o| o.len()), ids)
        })
    });
    let took = t0.elapsed();
    match r {
        Ok((n, (id, pids))) => {
            drop((ShmGuard::containing(id), KillOnDrop(pids)));
            assert_eq!(n.unwrap(), 4);
        }
        Err(e) => panic!("start failed after {took:?}: {e}"),
    }
}
