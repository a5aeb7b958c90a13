//! Randomness drawn per input from `ItemContext::seed` gives the same outputs whatever the
//! number of workers and the topology (issue 18: with per-worker generators, the windows a
//! loader drew depended on which worker got which series).

mod common;

use common::{ShmGuard, registry};
use shmpipe::{Epochs, Item, ItemContext, Pipeline, Step, StepError, Topology};

/// Tags each item with a number drawn for its input record (and one more draw from a
/// generator seeded by it, as a sampler would).
struct Draw;

impl Step for Draw {
    fn process(&mut self, _: Item, _: &mut Vec<Item>) -> Result<(), StepError> {
        Err(StepError::new("the pipeline calls process_in"))
    }
    fn process_in(
        &mut self,
        item: Item,
        cx: &ItemContext,
        out: &mut Vec<Item>,
    ) -> Result<(), StepError> {
        let second = shmpipe::derive_seed(&[cx.seed, 1]);
        out.push(
            item.with_meta("draw", (cx.seed >> 1) as i64)
                .with_meta("second", (second >> 1) as i64),
        );
        Ok(())
    }
}

fn draws(workers: usize, topology: Topology, seed: u64) -> Vec<(i64, i64, i64)> {
    let reg = registry().step("draw", |_| Ok(Draw));
    let p = Pipeline::builder(&reg)
        .source_named("range", serde_json::json!({"n": 300}))
        .emitters(2)
        .epochs(Epochs::Finite(2))
        .shuffle(true)
        .seed(seed)
        .step("fan")
        .step("draw")
        .workers(workers)
        .topology(topology)
        .start()
        .unwrap();
    let _g = ShmGuard::containing(p.id().to_owned());
    let mut v: Vec<(i64, i64, i64)> = p
        .map(|r| {
            let it = r.unwrap();
            (
                it.i64("n").unwrap(),
                it.i64("draw").unwrap(),
                it.i64("second").unwrap(),
            )
        })
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn per_item_seeds_do_not_depend_on_workers_or_topology() {
    let reg = registry().step("draw", |_| Ok(Draw));
    shmpipe::init(&reg);
    let one = draws(1, Topology::Fused, 5);
    assert!(one.len() > 300, "{} outputs", one.len());
    // Every output of a record shares its draw; different records draw differently.
    let mut distinct: Vec<i64> = one.iter().map(|t| t.1).collect();
    distinct.dedup();
    assert!(distinct.len() > 250, "{} distinct draws", distinct.len());
    assert_eq!(draws(2, Topology::Fused, 5), one);
    assert_eq!(draws(3, Topology::Fused, 5), one);
    assert_eq!(
        draws(
            2,
            Topology::Staged {
                workers: vec![2, 3]
            },
            5
        ),
        one
    );
    assert_ne!(
        draws(2, Topology::Fused, 6),
        one,
        "another seed, other draws"
    );
}
