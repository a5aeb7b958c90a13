//! The child roles: the start-up hand-over seen from a child, its parent watchdog, the emitter
//! and the worker loops, and what a child says on stderr (only real problems, named by role
//! and pid).

use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::handover::{Ctrl, CtrlError, Kind};
use crate::issued::Issued;
use crate::item::Item;
use crate::node::{
    ChildSpec, EXIT_OK, EXIT_ORPHAN, EXIT_PEER_LOST, EXIT_REPORTED, EXIT_SETUP, EXIT_STOPPED,
    Inputs, NextError, Outputs, Plan, Role, START_TIMEOUT, SourceSpec, create_tx, open_rx,
};
use crate::source::{
    ShuffleBuffer, Source, SourceContext, SourceError, buffer_seed, derive_seed, epoch_order,
};
use crate::step::{Registry, Step, StepContext, WorkerInfo};
use crate::wire::{FINISH_E, FINISH_K, Frame, Report, Rx, Stats, TransportError};
use crate::{Epochs, OnBadRecord};

/// The child's control socket and how it names itself (set once in [`run_child`]).
static CHILD: OnceLock<(Arc<Ctrl>, String)> = OnceLock::new();

/// Whether the parent is shutting the pipeline down on purpose (or is gone): then a lost peer
/// is no news and the child exits quietly. The parent tells its children one after another, so
/// a child may see a peer that already obeyed `STOP` exit before its own `STOP` is there: it
/// allows the message a moment to arrive (a real loss is reported at most that much later).
fn stopping() -> bool {
    const GRACE: Duration = Duration::from_millis(200);
    let Some((c, _)) = CHILD.get() else {
        return false;
    };
    if c.stop_or_eof_pending() {
        return true;
    }
    // After start-up only `STOP` (or the end of file) ever arrives on the control socket.
    let _ = c.wait_readable(Some(GRACE));
    c.stop_or_eof_pending()
}

/// Logs a real problem of this child on stderr, named by role and pid.
fn log(msg: &str) {
    let me = CHILD.get().map_or("child", |(_, m)| m.as_str());
    eprintln!("shmpipe {me}: {msg}");
}

/// What a child gets from the start-up hand-over.
struct Connected {
    outs: Outputs,
    ins: Vec<Box<dyn Rx>>,
    /// An emitter of an ordered pipeline: the issued counters it raises.
    issued: Option<Issued>,
}

/// The start-up hand-over of a child: takes its shared descriptors, creates its outputs and
/// sends their descriptors, gets its inputs, attaches, and waits for the parent's go.
/// `Err(code)`: exit with it.
fn hand_over(spec: &ChildSpec, ctrl: &Ctrl) -> Result<Connected, i32> {
    let (plan, role) = (&spec.plan, spec.role);
    let setup = |m: String| {
        log(&m);
        EXIT_SETUP
    };
    let quiet = |e: CtrlError| match e {
        // The parent is gone or gave up on us: nothing to say.
        CtrlError::Eof => EXIT_ORPHAN,
        e => setup(format!("start-up: {e}")),
    };
    // The shared descriptors come first, checked before anything else is set up.
    let mut issued = None;
    match ctrl.recv(Some(START_TIMEOUT)).map_err(quiet)? {
        (Kind::Shared, mut fds) => {
            if matches!(role, Role::Emitter(_)) && plan.ordered {
                let fd = fds
                    .pop()
                    .ok_or_else(|| setup("no issued counters from the parent".into()))?;
                issued = Some(
                    Issued::open(fd, plan.emitters)
                        .map_err(|e| setup(format!("issued counters: {e}")))?,
                );
            }
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
            issued,
        }),
        (Kind::Stop, _) => Err(EXIT_STOPPED),
        (k, _) => Err(setup(format!("expected go, got {k:?}"))),
    }
}

/// The parent watchdog: exits the child as soon as its control socket says `STOP` (quietly)
/// or reaches its end (the parent is gone, even SIGKILLed).
fn start_watchdog(ctrl: Arc<Ctrl>, parent: u32) {
    std::thread::spawn(move || {
        loop {
            if matches!(ctrl.wait_readable(None), Ok(true)) {
                if ctrl.stop_or_eof_pending() {
                    // Both are deliberate or final; the parent wants no word from us.
                    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32);
                    let orphan = ppid != Some(parent);
                    std::process::exit(if orphan { EXIT_ORPHAN } else { EXIT_STOPPED });
                }
                // Anything else after `GO` is unexpected: take it off and go on.
                let _ = ctrl.recv(Some(Duration::ZERO));
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
}

/// Runs a child role and returns its exit code.
pub(crate) fn run_child(reg: &Registry, spec: &ChildSpec, ctrl: Ctrl) -> i32 {
    crate::alloc::keep_freed_memory();
    let plan = &spec.plan;
    let ctrl = Arc::new(ctrl);
    let _ = CHILD.set((Arc::clone(&ctrl), spec.role.log_name()));
    let Connected { outs, ins, issued } = match hand_over(spec, &ctrl) {
        Ok(v) => v,
        Err(code) => return code,
    };
    start_watchdog(ctrl, plan.parent);
    match spec.role {
        Role::Emitter(e) => run_emitter(reg, plan, e, outs, issued.as_ref()),
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
    issued: Option<&Issued>,
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
    let mut source = match source {
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
        if let Some(c) = issued {
            c.raise(e, *k + 1);
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
    let len = source.len();
    let mut epoch = 0u64;
    let result: Result<(), i32> = (|| {
        loop {
            match plan.epochs {
                Epochs::Finite(n) if epoch >= n => return Ok(()),
                Epochs::Cycle if len == 0 => return Ok(()),
                _ => {}
            }
            let base = [plan.seed, epoch, plan.rank as u64, e as u64];
            let order = epoch_order(len, plan.shuffle.then(|| derive_seed(&base)));
            let mut buf = (plan.shuffle && plan.shuffle_buffer > 1)
                .then(|| ShuffleBuffer::new(plan.shuffle_buffer, buffer_seed(derive_seed(&base))));
            for idx in order {
                let item = match source.read(idx) {
                    Ok(item) => item,
                    Err(SourceError::BadRecord { .. })
                        if plan.on_bad_record == OnBadRecord::Skip =>
                    {
                        stats.skipped += 1;
                        continue;
                    }
                    Err(error) => {
                        out.report(Report::Source { emitter: e, error });
                        return Err(EXIT_REPORTED);
                    }
                };
                let item = match buf.as_mut() {
                    Some(b) => b.push(item),
                    None => Some(item),
                };
                if let Some(item) = item {
                    send(&mut out, item, &mut k).map_err(|e| lost("sending", &e))?;
                }
            }
            for item in buf.map(|mut b| b.drain()).unwrap_or_default() {
                send(&mut out, item, &mut k).map_err(|e| lost("sending", &e))?;
            }
            epoch += 1;
        }
    })();
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
        Err(e) => lost("ending", &e),
        Ok(()) => EXIT_OK,
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

/// The step instances of one worker, run in sequence on every run of inputs.
struct Chain {
    /// (name, instance, inputs processed, nanoseconds spent).
    steps: Vec<(String, Box<dyn Step>, u64, u64)>,
    stage: usize,
    worker: usize,
    /// Scratch buffers reused for every run of inputs (no allocation per item or batch).
    cur: Vec<Item>,
    next: Vec<Item>,
    /// Per original input of a run: the end of its outputs so far (in `cur`).
    bounds: Vec<usize>,
    /// Per input of the current step: the end of its outputs (in `next`).
    step_ends: Vec<usize>,
}

/// A step failure inside a run: (index of the original input, step name, message).
type Failure = (usize, String, String);

impl Chain {
    fn new(stage: usize, worker: usize) -> Chain {
        Chain {
            steps: Vec::new(),
            stage,
            worker,
            cur: Vec::new(),
            next: Vec::new(),
            bounds: Vec::new(),
            step_ends: Vec::new(),
        }
    }

    /// Runs all steps on the run `items` (taken out), each step once for the whole run
    /// ([`Step::process_batch`]). Outputs go to `out`, and for each input the end of its
    /// outputs in `out` to `ends`. On failure nothing of the run goes to `out`.
    fn run_batch(
        &mut self,
        items: &mut Vec<Item>,
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
        let mut r = Ok(());
        for s in 0..self.steps.len() {
            if s == 0 {
                r = self
                    .call(0, items, &mut cur, &mut bounds)
                    .map_err(|(i, m)| (i, 0, m));
            } else {
                let mut next = std::mem::take(&mut self.next);
                let mut step_ends = std::mem::take(&mut self.step_ends);
                next.clear();
                step_ends.clear();
                r = self
                    .call(s, &mut cur, &mut next, &mut step_ends)
                    .map_err(|(m_in, m)| {
                        // Input `m_in` of step `s` descends from the first original input
                        // whose outputs reach past it.
                        let j = bounds.iter().position(|&b| b > m_in).unwrap_or(n);
                        (j, s, m)
                    });
                if r.is_ok() {
                    for b in bounds.iter_mut() {
                        *b = if *b == 0 { 0 } else { step_ends[*b - 1] };
                    }
                    std::mem::swap(&mut cur, &mut next);
                }
                self.next = next;
                self.step_ends = step_ends;
            }
            if r.is_err() {
                break;
            }
        }
        let r = match r {
            Ok(()) => {
                let base = out.len();
                out.append(&mut cur);
                ends.extend(bounds.iter().map(|b| base + b));
                Ok(())
            }
            Err((j, s, m)) => {
                cur.clear();
                Err((j.min(n.saturating_sub(1)), self.steps[s].0.clone(), m))
            }
        };
        items.clear();
        self.cur = cur;
        self.bounds = bounds;
        r
    }

    /// Calls step `s` on `input` (taken out), timed, panics caught. `Err((index of the
    /// failing input of this step, message))`.
    fn call(
        &mut self,
        s: usize,
        input: &mut Vec<Item>,
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), (usize, String)> {
        let (_, step, calls, ns) = &mut self.steps[s];
        *calls += input.len() as u64;
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.process_batch(input, out, ends)));
        *ns += t0.elapsed().as_nanos() as u64;
        let message = match r {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => clip(e.to_string()),
            Err(p) => clip(panic_message(&*p)),
        };
        input.clear();
        Err((ends.len(), message))
    }

    fn failure(&self, step: String, input: String, message: String) -> Report {
        Report::Step {
            step,
            stage: self.stage,
            worker: self.worker,
            input,
            message,
        }
    }

    /// End of stream: finishes the steps in order, passing the outputs of step `i`'s
    /// `finish` through steps `i + 1..` before finishing step `i + 1`; outputs go to `out`.
    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), Report> {
        let input = || "end of stream".to_owned();
        for i in 0..self.steps.len() {
            let (name, step, _, ns) = &mut self.steps[i];
            let mut made = Vec::new();
            let t0 = Instant::now();
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| step.finish(&mut made)));
            *ns += t0.elapsed().as_nanos() as u64;
            let message = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(clip(e.to_string())),
                Err(p) => Some(clip(panic_message(&*p))),
            };
            if let Some(message) = message {
                let name = name.clone();
                return Err(self.failure(name, input(), message));
            }
            // Through the later steps: one run of inputs.
            let (mut cur, mut next, mut ends) = (made, Vec::new(), Vec::new());
            for s in i + 1..self.steps.len() {
                next.clear();
                ends.clear();
                if let Err((_, message)) = self.call(s, &mut cur, &mut next, &mut ends) {
                    let name = self.steps[s].0.clone();
                    return Err(self.failure(name, input(), message));
                }
                std::mem::swap(&mut cur, &mut next);
            }
            out.append(&mut cur);
        }
        Ok(())
    }
}

/// One run of items of a worker (the item frames of a batch between two control frames),
/// with scratch buffers reused from run to run.
#[derive(Default)]
struct Run {
    items: Vec<Item>,
    /// Per item: (emitter, record, last of its group, description for error messages).
    keys: Vec<(u32, u64, bool, String)>,
    outputs: Vec<Item>,
    ends: Vec<usize>,
}

impl Run {
    fn push(&mut self, e: u32, k: u64, last: bool, item: Item) {
        self.keys.push((e, k, last, item.describe()));
        self.items.push(item);
    }

    /// Runs the items through the chain and sends their outputs in order (in the ordered
    /// mode the last output of each group flagged, an empty group as a group end); on a step
    /// failure, reports it. `Err(exit code)`.
    fn process(&mut self, chain: &mut Chain, plan: &Plan, out: &mut Outputs) -> Result<(), i32> {
        if self.items.is_empty() {
            return Ok(());
        }
        let stage = chain.stage;
        if let Err((i, step, message)) =
            chain.run_batch(&mut self.items, &mut self.outputs, &mut self.ends)
        {
            let (e, k, _, desc) = &self.keys[i];
            let mut input = if (*e, *k) == (FINISH_E, FINISH_K) {
                format!(
                    "end of stream (finish output of stage {})",
                    stage.saturating_sub(1)
                )
            } else {
                format!("emitter {e}, record {k}")
            };
            if !desc.is_empty() {
                input = format!("{input} ({desc})");
            }
            out.report(chain.failure(step, input, message));
            return Err(EXIT_REPORTED);
        }
        let mut sent = Ok(());
        let mut done = 0;
        let mut outs = self.outputs.drain(..);
        for ((e, k, last, _), &end) in self.keys.drain(..).zip(&self.ends) {
            let dest = plan.route(stage, e, k);
            let n = end - done;
            done = end;
            for (i, item) in outs.by_ref().take(n).enumerate() {
                let last = plan.ordered && last && i + 1 == n;
                sent = sent.and_then(|()| out.push(dest, Frame::Item { e, k, last, item }));
            }
            if plan.ordered && last && n == 0 {
                sent = sent.and_then(|()| out.push(dest, Frame::GroupEnd { e, k }));
            }
        }
        drop(outs);
        self.ends.clear();
        sent.map_err(|e| lost("output", &e))
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
    let info = WorkerInfo {
        stage,
        worker: w,
        workers: plan.stages[stage].workers,
        rank: plan.rank,
        world_size: plan.world_size,
        seed: derive_seed(&[plan.seed, plan.rank as u64, stage as u64, w as u64]),
    };
    let mut chain = Chain::new(stage, w);
    for (name, args) in &plan.stages[stage].steps {
        match reg.build_step(name, &StepContext { args, worker: info }) {
            Ok(s) => chain.steps.push((name.clone(), s, 0, 0)),
            Err(e) => {
                out.report(Report::Step {
                    step: name.clone(),
                    stage,
                    worker: w,
                    input: "(none: building the step)".into(),
                    message: e.to_string(),
                });
                return EXIT_REPORTED;
            }
        }
    }
    let mut stats = Stats::default();
    let mut run = Run::default();
    loop {
        let next = ins.next(&mut || out.flush_all());
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
            Err(NextError::Idle(e)) => return lost("output", &e),
        };
        let mut frames = frames.into_iter().peekable();
        while frames.peek().is_some() {
            // A run of items: all through the chain at once, then their outputs in order.
            while let Some(Frame::Item { .. }) = frames.peek() {
                let Some(Frame::Item { e, k, last, item }) = frames.next() else {
                    break;
                };
                run.push(e, k, last, item);
            }
            if let Err(code) = run.process(&mut chain, plan, &mut out) {
                return code;
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
                return lost("output", &e);
            }
        }
    }
    let mut outputs = Vec::new();
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
        return lost("output", &e);
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
        Err(e) => lost("ending", &e),
        Ok(()) => EXIT_OK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(steps: Vec<Box<dyn Step>>) -> Chain {
        let mut c = Chain::new(0, 0);
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
        c.run_batch(&mut items, &mut out, &mut ends).unwrap();
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
        let (i, step, message) = c.run_batch(&mut items, &mut out, &mut ends).unwrap_err();
        assert_eq!((i, step.as_str(), message.as_str()), (5, "s1", "five"));
        assert!(out.is_empty() && ends.is_empty() && items.is_empty());
        let mut items: Vec<Item> = (6..9).map(|n| Item::new().with_meta("n", n)).collect();
        let (i, step, message) = c.run_batch(&mut items, &mut out, &mut ends).unwrap_err();
        assert_eq!((i, step.as_str()), (1, "s2"));
        assert!(message.contains("panicked: seven"), "{message}");
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
