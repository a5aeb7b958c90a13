//! Why a child ended is said by the child, over its control socket, not guessed from its exit
//! code (review of issue 16's pipeline part, minor finding): a step that calls
//! `process::exit(3)` was reported as "could not set up its connections", because 3 is also
//! the pipeline's own setup-failure code; one that called `exit(0)`, `exit(2)` or `exit(6)`
//! passed for a child that ended as planned.

mod common;

use std::time::Duration;

use common::*;
use shmpipe::{Error, Item, Pipeline, Registry, map};

fn reg() -> Registry {
    registry().step("exit_on", |cx| {
        let bad = cx.args["n"].as_i64().unwrap_or(-1);
        let code = cx.args["code"].as_i64().unwrap_or(1) as i32;
        Ok(map(move |it: Item| {
            if it.i64("n") == Some(bad) {
                std::process::exit(code);
            }
            Ok(it)
        }))
    })
}

/// Every code the pipeline uses for its own exits, called by a step: the consumer gets the
/// worker's death with its code, and no explanation that belongs to the pipeline's own codes.
#[test]
fn a_step_that_exits_is_reported_as_such_whatever_its_code() {
    let reg = reg();
    shmpipe::init(&reg);
    for code in [0, 2, 3, 4, 5, 6] {
        let p = Pipeline::builder(&reg)
            .step_with("exit_on", serde_json::json!({"n": 5, "code": code}))
            .workers(2)
            .start()
            .unwrap();
        let (_, pids, _g) = guarded(&p);
        let r = within(Duration::from_secs(20), "the run", move || {
            p.run((0..40).map(|n| Item::new().with_meta("n", n)))
        });
        match r {
            Err(Error::ProcessDied { role, pid, status }) => {
                // Item 5 goes to worker 5 % 2.
                assert_eq!((role.as_str(), pid), ("worker 1 (stage 0)", pids[1]));
                assert!(
                    status.contains(&format!("exited with code {code}"))
                        && !status.contains("set up")
                        && !status.contains("lost a peer"),
                    "code {code}: {status}"
                );
            }
            Err(e) => panic!("code {code}: expected worker 1's exit, got {e}"),
            Ok(out) => panic!("code {code}: the run succeeded with {} outputs", out.len()),
        }
    }
}
