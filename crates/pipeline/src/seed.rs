//! Per-item seeds: randomness in a step that depends on the pipeline's seed and on which input
//! is being processed, never on which worker (or how many workers) runs it.
//!
//! The thread that runs a step (a worker's main thread, or the caller's thread with
//! [`PipelineBuilder::workers(0)`](crate::PipelineBuilder::workers)) sets the seed of the
//! current input before every call of [`Step::process`](crate::Step::process); a step reads it
//! with [`item_seed`].

use std::cell::{Cell, RefCell};

use crate::shuffle::derive_seed;

thread_local! {
    /// The seed of the input the current step call processes; `None` outside a step call.
    static CURRENT: Cell<Option<u64>> = const { Cell::new(None) };
    /// The seeds of the inputs of the current [`Step::process_batch`](crate::Step::process_batch)
    /// call, in order (see [`select_input`]).
    static BATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The domain tag of an input's seed among the seeds a pipeline derives (the emitters'
/// shuffle seeds are derived from the same pipeline seed). "ITEMSEED", the tag of the
/// `bigitems` branch's `ItemContext::seed`, so that the two fold into one: an input's seed is
/// that context seed, and a step call's seed is derived from it and the step's index.
const ITEM_SEED: u64 = 0x4954_454D_5345_4544;

/// The seed of the input the calling step is processing, or `None` outside a step call.
///
/// It is `derive_seed(&[input_seed, step])`: `input_seed = derive_seed(&[seed, ITEM_SEED, e,
/// k])` from the pipeline's [`seed`](crate::PipelineBuilder::seed) and the input's identity
/// (emitter `e`, record `k` of that emitter, counted over all epochs; in enqueue mode `e = 0`
/// and `k` counts the enqueued items), and `step` the step's position in the pipeline (over
/// all stages, so the topology does not matter). So every run with the same seed, the same source order and any number of
/// workers gives every step call the same seed. All outputs of one input reach a later step
/// with the same seed: a step that draws for each of them should draw from one generator
/// per seed, in turn (the order of the outputs of one input is fixed). Outputs made by
/// [`Step::finish`](crate::Step::finish) depend on what the worker saw, and so on the worker
/// count; their input is `(u32::MAX, u64::MAX)`.
///
/// # Examples
/// ```
/// use shmpipe::{map, item_seed, Item, Registry};
/// let reg = Registry::new().step("jitter", |_| Ok(map(|it: Item| {
///     let s = item_seed().expect("set during a step call");
///     Ok(it.with_meta("noise", (s % 1000) as i64))
/// })));
/// assert_eq!(item_seed(), None); // not in a step
/// # let _ = reg;
/// ```
pub fn item_seed() -> Option<u64> {
    CURRENT.with(Cell::get)
}

/// The item seed of input `(e, k)` at global step index `step`.
pub(crate) fn for_input(seed: u64, e: u32, k: u64, step: usize) -> u64 {
    let input = derive_seed(&[seed, ITEM_SEED, u64::from(e), k]);
    derive_seed(&[input, step as u64])
}

/// For a [`Step::process_batch`](crate::Step::process_batch) that runs the inputs of its run
/// itself: makes [`item_seed`] that of input `i` of the run (the default `process_batch` does
/// this before each [`Step::process`](crate::Step::process)). `part` > 0 gives a seed of its
/// own to each part of a step that runs several user functions in turn on one input
/// (`derive_seed(&[seed, part])`); `part` 0 is the input's seed itself. Outside a run, or for
/// an `i` past its end, the item seed is `None`.
///
/// # Examples
/// ```
/// use shmpipe::{item_seed, select_input, Item, Step, StepError};
/// struct Each;
/// impl Step for Each {
///     fn process(&mut self, it: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
///         out.push(it);
///         Ok(())
///     }
///     fn process_batch(
///         &mut self,
///         items: &mut Vec<Item>,
///         out: &mut Vec<Item>,
///         ends: &mut Vec<usize>,
///     ) -> Result<(), StepError> {
///         for (i, it) in items.drain(..).enumerate() {
///             select_input(i, 0);
///             let s = item_seed(); // input i's seed during a pipeline run
///             out.push(it.with_meta("seed", s.map_or(-1, |s| (s % 1000) as i64)));
///             ends.push(out.len());
///         }
///         Ok(())
///     }
/// }
/// # let _ = Each;
/// ```
pub fn select_input(i: usize, part: u64) {
    let s = BATCH.with(|b| b.borrow().get(i).copied());
    set(match (s, part) {
        (Some(s), 0) => Some(s),
        (Some(s), p) => Some(derive_seed(&[s, p])),
        (None, _) => None,
    });
}

/// The seeds of the inputs of the next `process_batch` call.
pub(crate) fn set_batch(seeds: &[u64]) {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        b.extend_from_slice(seeds);
    });
}

/// No batch any more (outside a step call).
pub(crate) fn clear_batch() {
    BATCH.with(|b| b.borrow_mut().clear());
    set(None);
}

/// Sets the current item seed of this thread (`None`: outside a step call).
pub(crate) fn set(seed: Option<u64>) {
    CURRENT.with(|c| c.set(seed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_seeds_depend_on_every_part_of_the_identity() {
        let a = for_input(1, 0, 5, 0);
        assert_eq!(a, for_input(1, 0, 5, 0));
        for b in [
            for_input(2, 0, 5, 0),
            for_input(1, 1, 5, 0),
            for_input(1, 0, 6, 0),
            for_input(1, 0, 5, 1),
        ] {
            assert_ne!(a, b);
        }
        set(Some(a));
        assert_eq!(item_seed(), Some(a));
        set(None);
        assert_eq!(item_seed(), None);
    }
}
