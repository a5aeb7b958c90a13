//! The step instances of one worker (or, with [`workers(0)`](crate::PipelineBuilder::workers),
//! of the whole pipeline in the caller's thread), run in sequence on every run of inputs: each
//! step once per run ([`Step::process_batch`]), with the item seed of every input set for it
//! ([`crate::seed`]).

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use crate::item::Item;
use crate::node::Plan;
use crate::shuffle::derive_seed;
use crate::step::{Registry, Step, StepContext, WorkerInfo};
use crate::wire::{FINISH_E, FINISH_K, Report};

/// The step instances of one worker, run in sequence on every run of inputs.
pub(crate) struct Chain {
    /// (name, instance, inputs processed, nanoseconds spent).
    pub(crate) steps: Vec<(String, Box<dyn Step>, u64, u64)>,
    pub(crate) stage: usize,
    worker: usize,
    /// The pipeline's seed, and the global index of this chain's first step: what
    /// [`crate::seed::for_input`] needs besides the input.
    seed: u64,
    step_offset: usize,
    /// Scratch buffers reused for every run of inputs (no allocation per item or batch).
    cur: Vec<Item>,
    next: Vec<Item>,
    /// Per original input of a run: the end of its outputs so far (in `cur`).
    bounds: Vec<usize>,
    /// Per input of the current step: the end of its outputs (in `next`).
    step_ends: Vec<usize>,
    /// Per input of the current step: its item seed.
    seeds: Vec<u64>,
}

/// A step failure inside a run: (index of the original input, step name, message).
pub(crate) type Failure = (usize, String, String);

/// A failed call of a step: (index of its failing input, the name it reports, if not the
/// step's own ([`StepError::in_step`](crate::StepError::in_step)), message).
type CallFailure = (usize, Option<String>, String);

impl Chain {
    fn new(stage: usize, worker: usize, seed: u64, step_offset: usize) -> Chain {
        Chain {
            steps: Vec::new(),
            stage,
            worker,
            seed,
            step_offset,
            cur: Vec::new(),
            next: Vec::new(),
            bounds: Vec::new(),
            step_ends: Vec::new(),
            seeds: Vec::new(),
        }
    }

    /// Builds the steps of `stage` for worker `worker` (`workers(0)`: every step, as worker 0
    /// of stage 0). A step that cannot be built is reported as its failure.
    pub(crate) fn build(
        reg: &Registry,
        plan: &Plan,
        steps: &[(String, serde_json::Value)],
        stage: usize,
        worker: usize,
        workers: usize,
    ) -> Result<Chain, Report> {
        let info = WorkerInfo {
            stage,
            worker,
            workers,
            rank: plan.rank,
            world_size: plan.world_size,
            seed: derive_seed(&[plan.seed, plan.rank as u64, stage as u64, worker as u64]),
        };
        let offset = plan.stages[..stage].iter().map(|s| s.steps.len()).sum();
        let mut chain = Chain::new(stage, worker, plan.seed, offset);
        for (name, args) in steps {
            match reg.build_step(name, &StepContext { args, worker: info }) {
                Ok(s) => chain.steps.push((name.clone(), s, 0, 0)),
                Err(e) => {
                    return Err(Report::Step {
                        step: e.step().map_or_else(|| name.clone(), str::to_owned),
                        stage,
                        worker,
                        emitter: None,
                        record: None,
                        input: "(none: building the step)".into(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(chain)
    }

    /// Runs all steps on `item`, input `key` (`workers(0)`: one input at a time); outputs go
    /// to `out`. `input` names the input in a failure.
    pub(crate) fn run(
        &mut self,
        item: Item,
        key: (u32, u64),
        input: &dyn Fn() -> String,
        out: &mut Vec<Item>,
    ) -> Result<(), Report> {
        let desc = item.describe();
        let (mut items, mut ends) = (vec![item], Vec::new());
        self.run_batch(&mut items, &|_| key, out, &mut ends)
            .map_err(|(_, step, message)| {
                let mut input = input();
                if !desc.is_empty() {
                    input = format!("{input} ({desc})");
                }
                self.failure(step, Some(key), input, message)
            })
    }

    /// Runs all steps on the run `items` (taken out), each step once for the whole run
    /// ([`Step::process_batch`]); `key(i)`: the identity `(emitter, record)` of input `i`
    /// (its item seeds). Outputs go to `out`, and for each input the end of its outputs in
    /// `out` to `ends`. On a failure the inputs before the failing one are done (their outputs
    /// and ends are there, as if they had been a run of their own), the failing one and those
    /// after it are dropped.
    pub(crate) fn run_batch(
        &mut self,
        items: &mut Vec<Item>,
        key: &dyn Fn(usize) -> (u32, u64),
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), Failure> {
        let n = items.len();
        let mut cur = std::mem::take(&mut self.cur);
        let mut bounds = std::mem::take(&mut self.bounds);
        cur.clear();
        bounds.clear();
        if self.steps.is_empty() {
            cur.append(items);
            bounds.extend(1..=n);
        }
        // (original input, step, its reported name, message) of a failure: the inputs before
        // it go on.
        let mut failed: Option<(usize, usize, Option<String>, String)> = None;
        for s in 0..self.steps.len() {
            if s == 0 {
                self.set_seeds(0, n, None, key);
                if let Err((j, name, m)) = self.call(0, items, &mut cur, &mut bounds) {
                    // `bounds` ends at input `j`; what `j` pushed before failing is dropped.
                    cur.truncate(bounds.last().copied().unwrap_or(0));
                    failed = Some((j, 0, name, m));
                }
                continue;
            }
            if failed.is_some() && cur.is_empty() {
                break;
            }
            let mut next = std::mem::take(&mut self.next);
            let mut step_ends = std::mem::take(&mut self.step_ends);
            next.clear();
            step_ends.clear();
            self.set_seeds(s, cur.len(), Some(&bounds), key);
            if let Err((m_in, name, m)) = self.call(s, &mut cur, &mut next, &mut step_ends) {
                // Input `m_in` of step `s` descends from the first original input whose
                // outputs reach past it; the original inputs before it keep their outputs.
                let j = bounds
                    .iter()
                    .position(|&b| b > m_in)
                    .unwrap_or(bounds.len());
                bounds.truncate(j);
                let kept = bounds
                    .last()
                    .map_or(0, |&b| if b == 0 { 0 } else { step_ends[b - 1] });
                next.truncate(kept);
                failed = Some((j, s, name, m));
            }
            for b in bounds.iter_mut() {
                *b = if *b == 0 { 0 } else { step_ends[*b - 1] };
            }
            std::mem::swap(&mut cur, &mut next);
            self.next = next;
            self.step_ends = step_ends;
        }
        crate::seed::clear_batch();
        let base = out.len();
        out.append(&mut cur);
        ends.extend(bounds.iter().map(|b| base + b));
        let r = match failed {
            None => Ok(()),
            Some((j, s, name, m)) => {
                let name = name.unwrap_or_else(|| self.steps[s].0.clone());
                Err((j.min(n.saturating_sub(1)), name, m))
            }
        };
        items.clear();
        self.cur = cur;
        self.bounds = bounds;
        r
    }

    /// The item seeds of the `len` inputs of step `s`: input `m` descends from the original
    /// input `j` (`bounds`: the end of each original input's outputs; `None`: `j = m`).
    fn set_seeds(
        &mut self,
        s: usize,
        len: usize,
        bounds: Option<&[usize]>,
        key: &dyn Fn(usize) -> (u32, u64),
    ) {
        let step = self.step_offset + s;
        self.seeds.clear();
        let mut j = 0;
        for m in 0..len {
            if let Some(b) = bounds {
                while j < b.len() && b[j] <= m {
                    j += 1;
                }
            } else {
                j = m;
            }
            let (e, k) = key(j);
            self.seeds
                .push(crate::seed::for_input(self.seed, e, k, step));
        }
        crate::seed::set_batch(&self.seeds);
    }

    /// Calls step `s` on `input` (taken out), timed, panics caught. `Err((index of the
    /// failing input of this step, message))`.
    fn call(
        &mut self,
        s: usize,
        input: &mut Vec<Item>,
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), CallFailure> {
        let (_, step, calls, ns) = &mut self.steps[s];
        *calls += input.len() as u64;
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.process_batch(input, out, ends)));
        crate::seed::set(None);
        *ns += t0.elapsed().as_nanos() as u64;
        let (name, message) = match r {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => (e.step().map(str::to_owned), clip(e.to_string())),
            Err(p) => (None, clip(panic_message(&*p))),
        };
        input.clear();
        Err((ends.len(), name, message))
    }

    /// The report of a failure of `step` on input `key` (`(emitter, record)`; `None` at the
    /// end of stream), described as `input`.
    pub(crate) fn failure(
        &self,
        step: String,
        key: Option<(u32, u64)>,
        input: String,
        message: String,
    ) -> Report {
        Report::Step {
            step,
            stage: self.stage,
            worker: self.worker,
            emitter: key.map(|k| k.0 as usize),
            record: key.map(|k| k.1),
            input,
            message,
        }
    }

    /// End of stream: finishes the steps in order, passing the outputs of step `i`'s
    /// `finish` through steps `i + 1..` before finishing step `i + 1`; outputs go to `out`.
    /// Item seeds: those of the pseudo-input `(FINISH_E, FINISH_K)`.
    pub(crate) fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), Report> {
        let input = || "end of stream".to_owned();
        let key = (FINISH_E, FINISH_K);
        for i in 0..self.steps.len() {
            let seed = crate::seed::for_input(self.seed, key.0, key.1, self.step_offset + i);
            let (name, step, _, ns) = &mut self.steps[i];
            let mut made = Vec::new();
            let t0 = Instant::now();
            crate::seed::set(Some(seed));
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.finish(&mut made)));
            crate::seed::set(None);
            *ns += t0.elapsed().as_nanos() as u64;
            let failed = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some((e.step().map(str::to_owned), clip(e.to_string()))),
                Err(p) => Some((None, clip(panic_message(&*p)))),
            };
            if let Some((reported, message)) = failed {
                let name = reported.unwrap_or_else(|| name.clone());
                return Err(self.failure(name, None, input(), message));
            }
            // Through the later steps: one run of inputs.
            let (mut cur, mut next, mut ends) = (made, Vec::new(), Vec::new());
            for s in i + 1..self.steps.len() {
                next.clear();
                ends.clear();
                self.set_seeds(s, cur.len(), None, &|_| key);
                let r = self.call(s, &mut cur, &mut next, &mut ends);
                crate::seed::clear_batch();
                if let Err((_, reported, message)) = r {
                    let name = reported.unwrap_or_else(|| self.steps[s].0.clone());
                    return Err(self.failure(name, None, input(), message));
                }
                std::mem::swap(&mut cur, &mut next);
            }
            out.append(&mut cur);
        }
        Ok(())
    }
}

/// Keeps error messages well under the transport's metadata limit (64 KiB).
pub(crate) fn clip(mut s: String) -> String {
    const MAX: usize = 8192;
    if s.len() > MAX {
        let mut cut = MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(steps: Vec<Box<dyn Step>>) -> Chain {
        let mut c = Chain::new(0, 0, 0, 0);
        for (i, s) in steps.into_iter().enumerate() {
            c.steps.push((format!("s{i}"), s, 0, 0));
        }
        c
    }

    fn fan() -> Box<dyn Step> {
        // Input n gives n % 3 outputs (n, j).
        Box::new(crate::flat_map(|it: Item, out: &mut Vec<Item>| {
            let n = it.i64("n").unwrap_or(0);
            out.extend((0..n % 3).map(|j| it.clone().with_meta("j", j)));
            Ok(())
        }))
    }

    #[test]
    fn a_run_through_several_flat_map_steps_keeps_each_inputs_outputs_together() {
        let mut c = chain(vec![fan(), fan(), fan()]);
        let mut items: Vec<Item> = (0..9).map(|n| Item::new().with_meta("n", n)).collect();
        let (mut out, mut ends) = (vec![Item::new()], Vec::new());
        c.run_batch(&mut items, &|i| (0, i as u64), &mut out, &mut ends)
            .unwrap();
        assert!(items.is_empty());
        // n % 3 outputs per step, three steps: (n % 3)^3 outputs, after the one in `out`.
        let want: Vec<usize> = (0..9)
            .scan(1, |end, n| {
                *end += (n % 3usize).pow(3);
                Some(*end)
            })
            .collect();
        assert_eq!(ends, want);
        for (i, w) in ends.windows(2).enumerate() {
            assert!(
                out[w[0]..w[1]]
                    .iter()
                    .all(|o| o.i64("n") == Some(i as i64 + 1))
            );
        }
        assert_eq!(c.steps.iter().map(|s| s.2).collect::<Vec<_>>(), [9, 9, 15]);
    }

    #[test]
    fn a_failure_in_a_later_step_names_the_original_input() {
        let fail = Box::new(crate::map(|it: Item| match it.i64("n") {
            Some(5) => Err(crate::StepError::new("five")),
            _ => Ok(it),
        }));
        let boom = Box::new(crate::map(|it: Item| match it.i64("n") {
            Some(7) => panic!("seven"),
            _ => Ok(it),
        }));
        // Inputs 0, 3 and 6 have no output after `fan`: step 1's input indices differ from
        // the original ones.
        let mut c = chain(vec![fan(), fail, boom]);
        let mut items: Vec<Item> = (0..9).map(|n| Item::new().with_meta("n", n)).collect();
        let (mut out, mut ends) = (Vec::new(), Vec::new());
        let (i, step, message) = c
            .run_batch(&mut items, &|i| (0, i as u64), &mut out, &mut ends)
            .unwrap_err();
        assert_eq!((i, step.as_str(), message.as_str()), (5, "s1", "five"));
        // Inputs 0..5 went through every step: n % 3 outputs each.
        assert_eq!(ends, [0, 1, 3, 3, 4]);
        assert_eq!(out.len(), 4);
        assert!(items.is_empty());
        let (mut out, mut ends) = (Vec::new(), Vec::new());
        let mut items: Vec<Item> = (6..9).map(|n| Item::new().with_meta("n", n)).collect();
        let (i, step, message) = c
            .run_batch(&mut items, &|i| (0, i as u64), &mut out, &mut ends)
            .unwrap_err();
        assert_eq!((i, step.as_str()), (1, "s2"));
        assert!(message.contains("panicked: seven"), "{message}");
    }

    #[test]
    fn a_failure_reported_in_a_named_step_keeps_that_name_apart_from_the_message() {
        let inner = Box::new(crate::map(|it: Item| match it.i64("n") {
            Some(2) => Err(crate::StepError::in_step("normalise", "two")),
            _ => Ok(it),
        }));
        let mut c = chain(vec![fan(), inner]);
        let mut items: Vec<Item> = (0..4).map(|n| Item::new().with_meta("n", n)).collect();
        let (mut out, mut ends) = (Vec::new(), Vec::new());
        let (i, step, message) = c
            .run_batch(&mut items, &|i| (0, i as u64), &mut out, &mut ends)
            .unwrap_err();
        assert_eq!(
            (i, step.as_str(), message.as_str()),
            (2, "normalise", "two")
        );
        let r = c.failure(step, Some((0, 2)), "emitter 0, record 2".into(), message);
        let Report::Step {
            emitter, record, ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!((emitter, record), (Some(0), Some(2)));
    }

    #[test]
    fn long_messages_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(10_000);
        let c = clip(long.clone());
        assert!(c.len() <= 8192 + 3 && c.ends_with("..."));
        assert!(long.starts_with(c.trim_end_matches("...")));
        assert_eq!(clip("short".into()), "short");
    }
}
