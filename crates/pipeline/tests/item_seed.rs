//! Randomness drawn per input from [`shmpipe::item_seed`] gives the same outputs whatever the
//! number of emitters' workers and the topology (issue 18: with per-worker generators, the
//! windows a loader drew depended on which worker got which series). `tests/seed.rs` covers
//! the worker count with one emitter; this covers two emitters, staged topologies and a
//! second seed.

mod common;

use std::time::Duration;

use common::*;
use shmpipe::{Epochs, Pipeline, Topology};

fn draws(workers: usize, topology: Topology, seed: u64) -> Vec<(i64, i64, i64)> {
    let reg = registry();
    let (p, _k) = start_killing_on_drop(
        Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": 300}))
            .emitters(2)
            .epochs(Epochs::Finite(2))
            .shuffle(true)
            .seed(seed)
            .step_with("fan", serde_json::json!({"max": 3}))
            .step("tag_seed")
            .workers(workers)
            .topology(topology),
    );
    within(Duration::from_secs(60), "run", move || {
        let mut v: Vec<(i64, i64, i64)> = p
            .map(|r| {
                let it = r.unwrap();
                (
                    it.i64("n").unwrap(),
                    it.i64("sub").unwrap(),
                    it.i64("iseed").unwrap(),
                )
            })
            .collect();
        v.sort_unstable();
        v
    })
}

#[test]
fn per_item_seeds_do_not_depend_on_workers_or_topology() {
    shmpipe::init(&registry());
    let one = draws(1, Topology::Fused, 5);
    assert!(one.len() > 300, "{} outputs", one.len());
    // Outputs of one input share its seed; different inputs (and epochs) draw differently.
    let distinct: std::collections::HashSet<i64> = one.iter().map(|t| t.2).collect();
    assert!(distinct.len() > 350, "{} distinct seeds", distinct.len());
    assert_eq!(draws(2, Topology::Fused, 5), one);
    assert_eq!(draws(3, Topology::Fused, 5), one);
    let staged = Topology::Staged {
        workers: vec![2, 3],
    };
    assert_eq!(draws(2, staged, 5), one);
    assert_ne!(
        draws(2, Topology::Fused, 6),
        one,
        "another seed, other draws"
    );
}
