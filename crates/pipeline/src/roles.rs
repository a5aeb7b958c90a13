//! The child roles: the start-up hand-over seen from a child, and the emitter and the worker
//! loops. The child's watch over its parent, its log and its exit are in [`crate::child`].

use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use crate::Epochs;
use crate::child::{log, stopping};
use crate::credit::Gate;
use crate::handover::{Ctrl, CtrlError, Kind};
use crate::item::Item;
use crate::node::{
    ChildSpec, EXIT_OK, EXIT_ORPHAN, EXIT_PEER_LOST, EXIT_REPORTED, EXIT_SETUP, EXIT_STOPPED,
    Inputs, NextError, Outputs, Plan, Role, START_TIMEOUT, SourceSpec, create_tx, open_rx,
};
use crate::records::{ReadOrder, Records};
use crate::source::{Source, SourceContext, SourceError, derive_seed};
use crate::step::{Registry, Step, StepContext, WorkerInfo};
use crate::wire::{FINISH_E, FINISH_K, Frame, Report, Rx, Stats, TransportError};

/// What a child gets from the start-up hand-over.
struct Connected {
    outs: Outputs,
    ins: Vec<Box<dyn Rx>>,
}

/// The start-up hand-over of a child: takes its shared descriptors, creates its outputs and
/// sends their descriptors, gets its inputs, attaches, and waits for the parent's go.
/// `Err(code)`: exit with it.
fn hand_over(spec: &ChildSpec, ctrl: &Ctrl) -> Result<Connected, i32> {
    let (plan, role) = (&spec.plan, spec.role);
    // The reason goes to the parent too, which reports it as what the pipeline failed of.
    let setup = |m: String| {
        log(&m);
        let _ = ctrl.send_failure(&m);
        EXIT_SETUP
    };
    let quiet = |e: CtrlError| match e {
        // The parent is gone or gave up on us: nothing to say.
        CtrlError::Eof => EXIT_ORPHAN,
        e => setup(format!("start-up: {e}")),
    };
    // The shared descriptors come first, checked before anything else is set up.
    match ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)? {
        (Kind::Shared, fds) => {
            crate::share::install(&spec.shared, fds).map_err(setup)?;
        }
        (Kind::Stop, _) => return Err(EXIT_STOPPED),
        (k, _) => return Err(setup(format!("expected shared descriptors, got {k:?}"))),
    }
    let mut txs = Vec::new();
    let mut fds = Vec::new();
    for _ in 0..plan.outputs_of(role) {
        let (tx, fd) = create_tx(plan, None).map_err(setup)?;
        txs.push(tx);
        fds.push(fd);
    }
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    ctrl.send(Kind::Outputs, &borrowed)
        .map_err(|e| setup(format!("cannot hand over its channels: {e}")))?;
    drop(borrowed);
    drop(fds);
    let (kind, fds) = ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)?;
    match kind {
        Kind::Inputs if fds.len() == plan.inputs_of(role) => {}
        Kind::Stop => return Err(EXIT_STOPPED),
        k => {
            return Err(setup(format!(
                "expected {} input descriptors, got {k:?} with {}",
                plan.inputs_of(role),
                fds.len()
            )));
        }
    }
    let rxs = fds
        .into_iter()
        .map(|fd| open_rx(plan, fd, true))
        .collect::<Result<Vec<_>, _>>()
        .map_err(setup)?;
    ctrl.send(Kind::Attached, &[])
        .map_err(|e| setup(format!("control socket: {e}")))?;
    match ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)? {
        (Kind::Go, _) => Ok(Connected {
            outs: Outputs::new(txs, plan),
            ins: rxs,
        }),
        (Kind::Stop, _) => Err(EXIT_STOPPED),
        (k, _) => Err(setup(format!("expected go, got {k:?}"))),
    }
}

/// Runs a child role and returns its exit code.
pub(crate) fn run_child(reg: &Registry, spec: &ChildSpec, ctrl: Ctrl) -> i32 {
    crate::alloc::keep_freed_memory();
    let plan = &spec.plan;
    let ctrl = Arc::new(ctrl);
    crate::child::set(
        Arc::clone(&ctrl),
        spec.role.log_name(),
        spec.role.describe(),
    );
    let Connected { outs, ins } = match hand_over(spec, &ctrl) {
        Ok(v) => v,
        Err(code) => return code,
    };
    // An emitter of an ordered pipeline issues only what the consumer grants.
    let gate = (plan.ordered && matches!(spec.role, Role::Emitter(_)))
        .then(|| Arc::new(Gate::new(crate::credit::initial(plan.reorder_window))));
    crate::child::start_watchdog(ctrl, plan.parent, gate.clone());
    match spec.role {
        Role::Emitter(e) => run_emitter(reg, plan, e, outs, gate.as_deref()),
        Role::Worker { stage, worker } => {
            run_worker(reg, plan, stage, worker, Inputs::new(ins), outs)
        }
    }
}

fn run_emitter(
    reg: &Registry,
    plan: &Plan,
    e: usize,
    mut out: Outputs,
    gate: Option<&Gate>,
) -> i32 {
    let parts = plan.world_size * plan.emitters;
    let part = plan.rank * plan.emitters + e;
    let source: Result<Box<dyn Source>, SourceError> = match &plan.source {
        Some(SourceSpec::JsonLines(j)) => {
            j.open(part, parts).map(|p| Box::new(p) as Box<dyn Source>)
        }
        Some(SourceSpec::Named { name, args }) => {
            reg.build_source(name, &SourceContext { args, part, parts })
        }
        None => Err(SourceError::Other(
            "emitter started without a source".into(),
        )),
    };
    let source = match source {
        Ok(s) => s,
        Err(error) => {
            out.report(Report::Source { emitter: e, error });
            return EXIT_REPORTED;
        }
    };
    let workers = out.len() as u64;
    let mut k = 0u64;
    let mut stats = Stats::default();
    let send = |out: &mut Outputs, item: Item, k: &mut u64| {
        if let Some(g) = gate {
            while !g.allows(*k) {
                // What was issued must be able to reach the consumer, whose grants follow
                // what it delivers.
                out.flush_all()?;
                g.park();
            }
        }
        let r = out.push(
            (*k % workers) as usize,
            Frame::Item {
                e: e as u32,
                k: *k,
                last: true,
                item,
            },
        );
        *k += 1;
        r
    };
    let mut records = Records::new(
        source,
        ReadOrder {
            seed: plan.seed,
            shuffle: plan.shuffle,
            shuffle_buffer: plan.shuffle_buffer,
            rank: plan.rank,
            emitter: e,
            on_bad_record: plan.on_bad_record,
        },
    );
    let mut epoch = 0u64;
    let result: Result<(), i32> = (|| {
        loop {
            match plan.epochs {
                Epochs::Finite(n) if epoch >= n => return Ok(()),
                Epochs::Cycle if records.is_empty() => return Ok(()),
                _ => {}
            }
            records.start_epoch(epoch);
            for r in records.by_ref() {
                let item = r.map_err(|error| {
                    out.report(Report::Source { emitter: e, error });
                    EXIT_REPORTED
                })?;
                if let Err(e) = send(&mut out, item, &mut k) {
                    return Err(output_failed(&mut out, "sending", e));
                }
            }
            epoch += 1;
        }
    })();
    stats.skipped = records.skipped();
    if let Err(code) = result {
        return code;
    }
    (stats.zero_copy, stats.copied) = out.transfer_counts();
    let end = out
        .broadcast(&Frame::EmitterDone { e: e as u32, n: k })
        .and_then(|()| out.push(0, Frame::Eos(stats)))
        .and_then(|()| (1..out.len()).try_for_each(|i| out.push(i, Frame::Eos(Stats::default()))))
        .and_then(|()| out.finish());
    match end {
        Err(e) => output_failed(&mut out, "ending", e),
        Ok(()) => EXIT_OK,
    }
}

/// A send on an output failed: a lost peer is a consequence ([`lost`]); anything else is
/// this child's own failure (a batch too large for the channel, say), reported downstream
/// as what it is, so the parent raises it instead of "lost a peer". Returns the exit code.
fn output_failed(out: &mut Outputs, what: &str, e: TransportError) -> i32 {
    let role = crate::child::role_name();
    match e {
        TransportError::Closed | TransportError::PeerDied(_) => lost(what, &e),
        _ if stopping() => EXIT_STOPPED,
        TransportError::TooLarge(message) => {
            log(&format!("{what}: {message}"));
            out.report(Report::TooLarge { role, message });
            EXIT_REPORTED
        }
        TransportError::Other(m) => {
            let message = format!("{what}: {m}");
            log(&message);
            out.report(Report::Other { role, message });
            EXIT_REPORTED
        }
    }
}

/// Logs why a child lost a peer (unless the pipeline is being shut down on purpose) and
/// returns the exit code for it.
fn lost(what: &str, e: &TransportError) -> i32 {
    if stopping() {
        return EXIT_STOPPED;
    }
    log(&format!("{what}: {e}"));
    EXIT_PEER_LOST
}

/// Keeps error messages well under the transport's metadata limit (64 KiB).
fn clip(mut s: String) -> String {
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

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}

/// The step instances of one worker, run in sequence on every input (also the whole pipeline
/// of [`workers(0)`](crate::PipelineBuilder::workers), in the caller's thread).
pub(crate) struct Chain {
    pub(crate) steps: Vec<(String, Box<dyn Step>, u64, u64)>,
    stage: usize,
    worker: usize,
    /// The pipeline's seed, and the global index of this chain's first step: what
    /// [`crate::seed::for_input`] needs besides the input.
    seed: u64,
    step_offset: usize,
    /// Scratch buffers reused for every input (no allocation per item).
    cur: Vec<Item>,
    next: Vec<Item>,
    /// Time every step call. Off for a one-step chain: the worker then times runs of inputs
    /// as a whole (two clock reads per run of a batch, not per item).
    per_call: bool,
}

impl Chain {
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
        let mut chain = Chain {
            steps: Vec::new(),
            stage,
            worker,
            seed: plan.seed,
            step_offset: plan.stages[..stage].iter().map(|s| s.steps.len()).sum(),
            cur: Vec::new(),
            next: Vec::new(),
            per_call: steps.len() != 1,
        };
        for (name, args) in steps {
            match reg.build_step(name, &StepContext { args, worker: info }) {
                Ok(s) => chain.steps.push((name.clone(), s, 0, 0)),
                Err(e) => {
                    return Err(Report::Step {
                        step: name.clone(),
                        stage,
                        worker,
                        input: "(none: building the step)".into(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(chain)
    }

    /// Runs all steps on `item`, input `(e, k)`; outputs go to `out`.
    pub(crate) fn run(
        &mut self,
        item: Item,
        key: (u32, u64),
        input: &dyn Fn() -> String,
        out: &mut Vec<Item>,
    ) -> Result<(), Report> {
        let mut cur = std::mem::take(&mut self.cur);
        cur.push(item);
        let r = self.run_from(0, &mut cur, key, input, out);
        cur.clear();
        self.cur = cur;
        r
    }

    /// Runs steps `start..` on the items `cur` of input `key`; outputs go to `out`.
    fn run_from(
        &mut self,
        start: usize,
        cur: &mut Vec<Item>,
        key: (u32, u64),
        input: &dyn Fn() -> String,
        out: &mut Vec<Item>,
    ) -> Result<(), Report> {
        let (stage, worker) = (self.stage, self.worker);
        let (seed, offset) = (self.seed, self.step_offset);
        let mut next = std::mem::take(&mut self.next);
        for (i, (name, step, calls, ns)) in self.steps.iter_mut().enumerate().skip(start) {
            next.clear();
            crate::seed::set(Some(crate::seed::for_input(seed, key.0, key.1, offset + i)));
            for it in cur.drain(..) {
                let desc = it.describe();
                let t0 = self.per_call.then(Instant::now);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.process(it, &mut next)));
                if let Some(t0) = t0 {
                    *ns += t0.elapsed().as_nanos() as u64;
                }
                *calls += 1;
                let message = match r {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => clip(e.to_string()),
                    Err(p) => clip(panic_message(&*p)),
                };
                let mut input = input();
                if !desc.is_empty() {
                    input = format!("{input} ({desc})");
                }
                crate::seed::set(None);
                return Err(Report::Step {
                    step: name.clone(),
                    stage,
                    worker,
                    input,
                    message,
                });
            }
            std::mem::swap(cur, &mut next);
        }
        crate::seed::set(None);
        out.append(cur);
        self.next = next;
        Ok(())
    }

    /// End of stream: finishes the steps in order, passing the outputs of step `i`'s
    /// `finish` through steps `i + 1..` before finishing step `i + 1`; outputs go to `out`.
    /// Item seeds: those of the pseudo-input `(FINISH_E, FINISH_K)`.
    pub(crate) fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), Report> {
        let input = || "end of stream".to_owned();
        let key = (FINISH_E, FINISH_K);
        for i in 0..self.steps.len() {
            let (name, step, _, ns) = &mut self.steps[i];
            let mut made = Vec::new();
            let t0 = Instant::now();
            let s = crate::seed::for_input(self.seed, key.0, key.1, self.step_offset + i);
            crate::seed::set(Some(s));
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.finish(&mut made)));
            crate::seed::set(None);
            *ns += t0.elapsed().as_nanos() as u64;
            let message = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(clip(e.to_string())),
                Err(p) => Some(clip(panic_message(&*p))),
            };
            if let Some(message) = message {
                return Err(Report::Step {
                    step: name.clone(),
                    stage: self.stage,
                    worker: self.worker,
                    input: input(),
                    message,
                });
            }
            self.run_from(i + 1, &mut made, key, &input, out)?;
        }
        Ok(())
    }
}

fn run_worker(
    reg: &Registry,
    plan: &Plan,
    stage: usize,
    w: usize,
    mut ins: Inputs,
    mut out: Outputs,
) -> i32 {
    let steps = &plan.stages[stage].steps;
    let mut chain = match Chain::build(reg, plan, steps, stage, w, plan.stages[stage].workers) {
        Ok(c) => c,
        Err(r) => {
            out.report(r);
            return EXIT_REPORTED;
        }
    };
    // Most bytes of outputs a run of inputs holds before they go out (see the loop below).
    let run_bytes = (4 * plan.batch_bytes).max(64 << 10);
    let mut stats = Stats::default();
    let mut outputs = Vec::new();
    // Per input of a run: (emitter, record, last, end of its outputs in `outputs`).
    let mut groups: Vec<(u32, u64, bool, usize)> = Vec::new();
    loop {
        let next = ins.next(&mut || out.idle());
        let frames = match next {
            Ok(Some((_, frames))) => frames,
            Ok(None) => break,
            Err(NextError::Input(i, TransportError::Closed)) => {
                return lost(
                    &format!("input {i}"),
                    &TransportError::Other("closed before its end of stream".into()),
                );
            }
            Err(NextError::Input(i, e)) => return lost(&format!("input {i}"), &e),
            Err(NextError::Idle(e)) => return output_failed(&mut out, "output", e),
        };
        let mut frames = frames.into_iter().peekable();
        while frames.peek().is_some() {
            // A run of items: all through the chain first (timed as a whole when the chain
            // has one step), then their outputs in order. A run ends once its outputs hold
            // `run_bytes` of arrays: a batch of many small records (row numbers, say) whose
            // outputs are large is not all held at once (issue 18: it grew every worker's heap
            // by megabytes, so the memory of a shared dataset grew with the workers).
            let t0 = (!chain.per_call).then(Instant::now);
            let mut failed = None;
            let mut run_out = 0usize;
            while run_out < run_bytes
                && let Some(Frame::Item { .. }) = frames.peek()
            {
                let Some(Frame::Item { e, k, last, item }) = frames.next() else {
                    break;
                };
                let input = || {
                    if (e, k) == (FINISH_E, FINISH_K) {
                        format!(
                            "end of stream (finish output of stage {})",
                            stage.saturating_sub(1)
                        )
                    } else {
                        format!("emitter {e}, record {k}")
                    }
                };
                let before = outputs.len();
                if let Err(r) = chain.run(item, (e, k), &input, &mut outputs) {
                    failed = Some(r);
                    break;
                }
                run_out += outputs[before..].iter().map(Item::nbytes).sum::<usize>();
                groups.push((e, k, last, outputs.len()));
            }
            if let (Some(t0), Some(step)) = (t0, chain.steps.first_mut()) {
                step.3 += t0.elapsed().as_nanos() as u64;
            }
            let mut sent = Ok(());
            let mut done = 0;
            let mut outs = outputs.drain(..);
            for (e, k, last, end) in groups.drain(..) {
                let dest = plan.route(stage, e, k);
                let n = end - done;
                done = end;
                // Group ends travel in both modes: the consumer counts finished inputs
                // (`Pipeline::inputs_done`); the ordered mode also releases by them.
                for (i, item) in outs.by_ref().take(n).enumerate() {
                    let last = last && i + 1 == n;
                    sent = sent.and_then(|()| out.push(dest, Frame::Item { e, k, last, item }));
                }
                if last && n == 0 {
                    sent = sent.and_then(|()| out.push(dest, Frame::GroupEnd { e, k }));
                }
            }
            drop(outs);
            if let Err(e) = sent {
                return output_failed(&mut out, "output", e);
            }
            if let Some(r) = failed {
                out.report(r);
                return EXIT_REPORTED;
            }
            if let Some(Frame::Item { .. }) = frames.peek() {
                continue; // the run ended on its bytes: the next one
            }
            let Some(f) = frames.next() else { break };
            let sent = match f {
                // Not reached: the run above took every item up to here.
                Frame::Item { .. } => Ok(()),
                Frame::GroupEnd { e, k } => {
                    out.push(plan.route(stage, e, k), Frame::GroupEnd { e, k })
                }
                f @ Frame::EmitterDone { .. } => out.broadcast(&f),
                Frame::Eos(s) => {
                    stats.merge(&s);
                    Ok(())
                }
                Frame::Error(r) => {
                    out.report(r);
                    return EXIT_REPORTED;
                }
            };
            if let Err(e) = sent {
                return output_failed(&mut out, "output", e);
            }
        }
    }
    if let Err(r) = chain.finish(&mut outputs) {
        out.report(r);
        return EXIT_REPORTED;
    }
    let dest = plan.route(stage, FINISH_E, FINISH_K);
    let (e, k) = (FINISH_E, FINISH_K);
    let sent = outputs.drain(..).try_for_each(|item| {
        out.push(
            dest,
            Frame::Item {
                e,
                k,
                last: false,
                item,
            },
        )
    });
    if let Err(e) = sent {
        return output_failed(&mut out, "output", e);
    }
    let mut own = Stats {
        steps: chain
            .steps
            .iter()
            .map(|(n, _, c, ns)| (n.clone(), *c, *ns))
            .collect(),
        ..Stats::default()
    };
    (own.zero_copy, own.copied) = out.transfer_counts();
    stats.merge(&own);
    let end = out
        .push(0, Frame::Eos(stats))
        .and_then(|()| (1..out.len()).try_for_each(|i| out.push(i, Frame::Eos(Stats::default()))))
        .and_then(|()| out.finish());
    match end {
        Err(e) => output_failed(&mut out, "ending", e),
        Ok(()) => EXIT_OK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(10_000);
        let c = clip(long.clone());
        assert!(c.len() <= 8192 + 3 && c.ends_with("..."));
        assert!(long.starts_with(c.trim_end_matches("...")));
        assert_eq!(clip("short".into()), "short");
    }
}
