//! `PipelineBuilder::child_program`: children run the given program instead of a re-exec of
//! the current executable (hosts such as a Python interpreter need it).

mod common;

use common::*;
use shmpipe::{Error, Item, Pipeline, Registry, map};

const MARK: &str = "SHMPIPE_TEST_VIA_PROGRAM";

fn reg() -> Registry {
    registry().step("via_program", |_| {
        Ok(map(|it: Item| {
            let via = std::env::var_os(MARK).is_some();
            Ok(it.with_meta("via", i64::from(via)))
        }))
    })
}

#[test]
fn children_run_the_given_program() {
    let reg = reg();
    shmpipe::init(&reg);
    let exe = std::env::current_exe().unwrap();
    // `/bin/sh` marks the environment, then execs this test binary on this test: the step
    // sees the mark only if the children were started as the given program.
    let script = format!("{MARK}=1 exec \"$0\" \"$@\"");
    let mut p = Pipeline::builder(&reg)
        .step("via_program")
        .workers(2)
        .child_program(
            "/bin/sh",
            [
                "-c".to_owned(),
                script,
                exe.to_string_lossy().into_owned(),
                "children_run_the_given_program".to_owned(),
                "--exact".to_owned(),
            ],
        )
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let _k = KillOnDrop(p.pids());
    for n in 0..10 {
        p.enqueue(Item::new().with_meta("n", n)).unwrap();
    }
    p.close_input();
    let vias: Vec<i64> = p.by_ref().map(|r| r.unwrap().i64("via").unwrap()).collect();
    assert_eq!(vias, vec![1; 10]);
    assert!(std::env::var_os(MARK).is_none(), "the parent is not marked");
}

#[test]
fn a_missing_child_program_is_a_spawn_error() {
    let reg = reg();
    shmpipe::init(&reg);
    let r = Pipeline::builder(&reg)
        .step("via_program")
        .workers(1)
        .child_program("/nonexistent/shmpipe-child", Vec::<String>::new())
        .start();
    match r {
        Err(Error::Spawn(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        other => panic!("expected a spawn error, got {other:?}"),
    }
}
