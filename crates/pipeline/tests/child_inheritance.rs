//! What a pipeline's children inherit from their parent, and what they pass on to the programs
//! their steps start (issue 16, holes 8 and 9):
//!
//! - a child gets exactly its control socket besides stdin/stdout/stderr: a descriptor the
//!   parent left without close-on-exec does not reach it;
//! - the role variable is not passed on: a program started by a step that itself calls
//!   `shmpipe::init` runs as an ordinary parent, it does not abort on a descriptor number that
//!   is not its own.

mod common;

use std::os::fd::AsFd;
use std::time::Duration;

use common::*;
use shmpipe::{Item, Pipeline, Registry, StepError, map};

/// Hole 8: a stray inheritable descriptor of the parent reached every child (`Command` closes
/// nothing but what is close-on-exec).
#[test]
fn children_do_not_inherit_a_stray_descriptor_of_the_parent() {
    let reg = registry();
    shmpipe::init(&reg);
    let stray = TempFile::new("stray-fd", "txt");
    std::fs::write(&stray.0, b"not for the children").unwrap();
    let f = std::fs::File::open(&stray.0).unwrap();
    // What a careless parent (or a library it uses) may leave: no close-on-exec.
    rustix::io::fcntl_setfd(f.as_fd(), rustix::io::FdFlags::empty()).unwrap();
    let stray_path = std::fs::canonicalize(&stray.0).unwrap();
    let mut p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 20, "len": 4}))
        // Endless: every child is still there when its descriptors are looked at.
        .epochs(shmpipe::Epochs::Cycle)
        .step("inc")
        .workers(2)
        .start()
        .unwrap();
    let (_, pids, _g) = guarded(&p);
    // Every child is running (and attached) now: look at what it holds.
    for &pid in &pids {
        let links = proc::fd_links(pid);
        assert!(!links.is_empty(), "no /proc/{pid}/fd");
        let leaked: Vec<_> = links.iter().filter(|(_, to)| *to == stray_path).collect();
        assert!(
            leaked.is_empty(),
            "child {pid} holds the parent's stray descriptor: {leaked:?}"
        );
    }
    let n = within(Duration::from_secs(20), "the run", move || {
        p.take_epoch(40).map(Result::unwrap).count()
    });
    assert_eq!(n, 40);
    drop(f);
}

/// The helper mode of a program started by a step: call `shmpipe::init` like any program
/// using shmpipe, then say it returned.
const GRANDCHILD: &str = "grandchild";
const GRANDCHILD_OK: &str = "GRANDCHILD-RAN-AS-A-PARENT";

fn registry_with_spawn(test: &'static str) -> Registry {
    registry().step("spawn_init", move |_| {
        Ok(map(move |it: Item| {
            let out = helper_command(test, GRANDCHILD)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| StepError::new(format!("spawn: {e}")))?;
            let status = format!("{:?}", out.status);
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            Ok(it
                .with_meta("ok", i64::from(out.status.success()))
                .with_meta("status", status)
                .with_meta("out", text))
        }))
    })
}

/// Hole 9: `SHMPIPE_ROLE` leaked to programs a step starts; one that calls `shmpipe::init`
/// took itself for a pipeline child and aborted ("IO Safety violation: owned file descriptor
/// already closed") on the control socket number, which is not open in it.
#[test]
fn a_program_started_by_a_step_is_not_a_pipeline_child() {
    const TEST: &str = "a_program_started_by_a_step_is_not_a_pipeline_child";
    let reg = registry_with_spawn(TEST);
    if helper_mode().as_deref() == Some(GRANDCHILD) {
        shmpipe::init(&reg);
        assert!(
            std::env::var_os(shmpipe::ROLE_ENV).is_none(),
            "the role variable reached a grandchild"
        );
        println!("{GRANDCHILD_OK}");
        std::process::exit(0);
    }
    shmpipe::init(&reg);
    let (p, _g) = start_guarded(Pipeline::builder(&reg).step("spawn_init").workers(1));
    let out = within(Duration::from_secs(60), "the run", move || {
        p.run([Item::new().with_meta("n", 1)])
    })
    .unwrap();
    assert_eq!(out.len(), 1);
    let it = &out[0];
    let text = it.str("out").unwrap_or_default();
    assert!(
        it.i64("ok") == Some(1) && text.contains(GRANDCHILD_OK),
        "the step's program failed ({}):\n{text}",
        it.str("status").unwrap_or_default()
    );
}
