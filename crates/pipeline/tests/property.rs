//! Property test: random emitters, workers, topology, batch size, transfer mode and a
//! flat-map with 0..5 outputs give the same outputs as a single-process reference run (the
//! same multiset unordered, the same sequence in ordered mode).

mod common;

use common::*;
use proptest::prelude::*;
use shmpipe::{
    Item, Pipeline, Registry, Step, StepContext, Topology, Transfer, WorkerInfo, part_range,
};

/// Runs the steps in this process, on the emitters' records taken in the order `(k, e)`.
fn reference(
    reg: &Registry,
    n: i64,
    emitters: usize,
    steps: &[(&str, serde_json::Value)],
) -> Vec<Item> {
    let items = range_items(n, 3);
    let parts: Vec<Vec<Item>> = (0..emitters)
        .map(|e| items[part_range(items.len(), e, emitters)].to_vec())
        .collect();
    let info = WorkerInfo {
        stage: 0,
        worker: 0,
        workers: 1,
        rank: 0,
        world_size: 1,
        seed: 0,
    };
    let mut built: Vec<Box<dyn Step>> = steps
        .iter()
        .map(|(name, args)| {
            reg.build_step(name, &StepContext { args, worker: info })
                .unwrap()
        })
        .collect();
    let mut out = Vec::new();
    let longest = parts.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..longest {
        for part in &parts {
            let Some(item) = part.get(k) else { continue };
            let mut cur = vec![item.clone()];
            for s in &mut built {
                let mut next = Vec::new();
                for it in cur {
                    s.process(it, &mut next).unwrap();
                }
                cur = next;
            }
            out.extend(cur);
        }
    }
    out
}

fn key(it: &Item) -> (i64, i64, Vec<u32>) {
    let x = it
        .array::<f32>("x")
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    (it.i64("n").unwrap(), it.i64("sub").unwrap_or(-1), x)
}

#[derive(Debug, Clone)]
struct Case {
    n: i64,
    emitters: usize,
    workers: usize,
    staged: Option<Vec<usize>>,
    batch_bytes: usize,
    max_out: i64,
    ordered: bool,
    transfer: Transfer,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0i64..300,
        1usize..=3,
        1usize..=4,
        prop_oneof![
            Just(None),
            proptest::collection::vec(1usize..=3, 2).prop_map(Some)
        ],
        prop_oneof![Just(64usize), Just(1000), Just(16 << 10), Just(64 << 10)],
        0i64..=5,
        any::<bool>(),
        prop_oneof![
            Just(Transfer::Copy),
            Just(Transfer::ZeroCopy),
            Just(Transfer::Adaptive { threshold: 16 })
        ],
    )
        .prop_map(
            |(n, emitters, workers, staged, batch_bytes, max_out, ordered, transfer)| Case {
                n,
                emitters,
                workers,
                staged,
                batch_bytes,
                max_out,
                ordered,
                transfer,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 16, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn pipeline_equals_single_process_reference(c in case()) {
        let reg = registry();
        shmpipe::init(&reg);
        let steps = [("fan", serde_json::json!({"max": c.max_out})), ("inc", serde_json::Value::Null)];
        let want = reference(&reg, c.n, c.emitters, &steps);
        let mut b = Pipeline::builder(&reg)
            .source_named("range", serde_json::json!({"n": c.n, "len": 3}))
            .emitters(c.emitters)
            .workers(c.workers)
            .batch_bytes(c.batch_bytes)
            .transfer(c.transfer)
            .ordered(c.ordered);
        for (name, args) in &steps {
            b = b.step_with(name, args.clone());
        }
        if let Some(w) = &c.staged {
            b = b.topology(Topology::Staged { workers: w.clone() });
        }
        let p = b.start().unwrap();
        let id = p.id().to_owned();
        let _g = ShmGuard::containing(id.clone());
        let got: Vec<Item> = p.map(|r| r.unwrap()).collect();
        let (mut g, mut w): (Vec<_>, Vec<_>) = (got.iter().map(key).collect(), want.iter().map(key).collect());
        if c.ordered {
            prop_assert_eq!(g, w);
        } else {
            g.sort();
            w.sort();
            prop_assert_eq!(g, w);
        }
        prop_assert!(shm_entries(&id).is_empty());
    }
}
