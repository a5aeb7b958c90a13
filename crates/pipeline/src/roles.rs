//! The child roles: the start-up hand-over seen from a child, and the emitter and the worker
//! loops. The child's watch over its parent, its log and its exit are in [`crate::child`].

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::chain::Chain;
use crate::child::{log, stopping};
use crate::config::Epochs;
use crate::credit::Gate;
use crate::handover::{Ctrl, CtrlError, Kind};
use crate::item::Item;
use crate::node::{
    ChildSpec, EXIT_OK, EXIT_ORPHAN, EXIT_PEER_LOST, EXIT_REPORTED, EXIT_SETUP, EXIT_STOPPED,
    Inputs, NextError, Outputs, Plan, Role, START_TIMEOUT, SourceSpec, create_tx, open_rx,
};
use crate::records::{ReadOrder, Records};
use crate::source::{Source, SourceContext, SourceError};
use crate::step::Registry;
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
        let (tx, fd) = create_tx(plan, None).map_err(|e| setup(e.to_string()))?;
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
        .map_err(|e| setup(e.to_string()))?;
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
    crate::heap::keep_freed_memory();
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
    let source = match open_source(reg, plan, e) {
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
    end_emitter(out, e, k, stats)
}

/// Emitter `e`'s part of the source: part `rank * emitters + e` of `world_size * emitters`.
fn open_source(reg: &Registry, plan: &Plan, e: usize) -> Result<Box<dyn Source>, SourceError> {
    let parts = plan.world_size * plan.emitters;
    let part = plan.rank * plan.emitters + e;
    match &plan.source {
        Some(SourceSpec::JsonLines(j)) => {
            j.open(part, parts).map(|p| Box::new(p) as Box<dyn Source>)
        }
        Some(SourceSpec::Named { name, args }) => {
            reg.build_source(name, &SourceContext { args, part, parts })
        }
        None => Err(SourceError::Other(
            "emitter started without a source".into(),
        )),
    }
}

/// The emitter's end of stream, after its `k` records: its end marker to every worker, the
/// end markers (its counters on output 0), then the outputs' end. The exit code.
fn end_emitter(mut out: Outputs, e: usize, k: u64, mut stats: Stats) -> i32 {
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
        TransportError::Other(_) | TransportError::Channel(_) => {
            let message = format!("{what}: {e}");
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

    /// Takes the item frames at the front of `frames` into the run: at most `cap` items and
    /// about `max_bytes` of their arrays (it stops at the first frame that is not an item).
    fn fill(
        &mut self,
        frames: &mut std::iter::Peekable<impl Iterator<Item = Frame>>,
        cap: usize,
        max_bytes: usize,
    ) {
        let mut in_bytes = 0usize;
        while self.items.len() < cap
            && in_bytes < max_bytes
            && let Some(Frame::Item { .. }) = frames.peek()
        {
            let Some(Frame::Item { e, k, last, item }) = frames.next() else {
                break;
            };
            in_bytes += item.nbytes();
            self.push(e, k, last, item);
        }
    }

    /// Runs the items through the chain and sends their outputs in order (the last output of
    /// each group flagged, an empty group as a group end); on a step
    /// failure, reports it. `Ok(array bytes of the outputs)`, `Err(exit code)`.
    fn process(&mut self, chain: &mut Chain, plan: &Plan, out: &mut Outputs) -> Result<usize, i32> {
        if self.items.is_empty() {
            return Ok(0);
        }
        let stage = chain.stage;
        let keys = &self.keys;
        let key = |i: usize| (keys[i].0, keys[i].1);
        let failed = chain
            .run_batch(&mut self.items, &key, &mut self.outputs, &mut self.ends)
            .err();
        let out_bytes = self.outputs.iter().map(Item::nbytes).sum::<usize>();
        // The inputs before a failing one are done: their outputs go out first.
        let mut sent = Ok(());
        let mut done = 0;
        let mut outs = self.outputs.drain(..);
        for ((e, k, last, _), &end) in self.keys.iter().zip(&self.ends) {
            let (e, k, last) = (*e, *k, *last);
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
        self.ends.clear();
        if let Some((i, step, message)) = failed {
            let (e, k, _, desc) = &self.keys[i];
            let finish = (*e, *k) == (FINISH_E, FINISH_K);
            let key = (!finish).then_some((*e, *k));
            let mut input = if finish {
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
            if let Err(e) = sent {
                return Err(output_failed(out, "output", e));
            }
            out.report(chain.failure(step, key, input, message));
            return Err(EXIT_REPORTED);
        }
        self.keys.clear();
        sent.map_err(|e| output_failed(out, "output", e))?;
        Ok(out_bytes)
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
    let run_bytes = plan.batch_bytes.saturating_mul(4).max(64 << 10);
    let mut stats = Stats::default();
    let mut run = Run::default();
    // Output bytes per input of the last run.
    let mut per_input: Option<usize> = None;
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
            // A run of items: all through the chain at once, then their outputs in order. A run
            // holds about `run_bytes` of outputs at most (issue 18: a batch of many small
            // records whose outputs are large grew every worker's heap by megabytes): its
            // length follows the output bytes per input of the run before (one input first).
            let cap = match per_input {
                None => 1,
                Some(b) => (run_bytes / b.max(1)).max(1),
            };
            run.fill(&mut frames, cap, run_bytes);
            let n = run.items.len();
            match run.process(&mut chain, plan, &mut out) {
                Ok(bytes) if n > 0 => per_input = Some(bytes / n),
                Ok(_) => {}
                Err(code) => return code,
            }
            if let Some(Frame::Item { .. }) = frames.peek() {
                continue; // the run ended on its bytes: the next one
            }
            let Some(f) = frames.next() else { break };
            if let Err(code) = pass_control(f, plan, stage, &mut out, &mut stats) {
                return code;
            }
        }
    }
    end_worker(chain, plan, stage, out, stats)
}

/// Passes on a control frame that follows a run of items (a group end to its route, an
/// emitter's end to every output, an end of stream into `stats`); a reported error ends the
/// worker. `Err(exit code)` when the worker ends.
fn pass_control(
    f: Frame,
    plan: &Plan,
    stage: usize,
    out: &mut Outputs,
    stats: &mut Stats,
) -> Result<(), i32> {
    let sent = match f {
        // Not reached: the run before took every item up to here.
        Frame::Item { .. } => Ok(()),
        Frame::GroupEnd { e, k } => out.push(plan.route(stage, e, k), Frame::GroupEnd { e, k }),
        f @ Frame::EmitterDone { .. } => out.broadcast(&f),
        Frame::Eos(s) => {
            stats.merge(&s);
            Ok(())
        }
        Frame::Error(r) => {
            out.report(r);
            return Err(EXIT_REPORTED);
        }
    };
    sent.map_err(|e| output_failed(out, "output", e))
}

/// The worker's end of stream: the steps' `finish` outputs, then the end markers (the
/// inputs' counters and the worker's own on output 0), then the outputs' end. The exit code.
fn end_worker(
    mut chain: Chain,
    plan: &Plan,
    stage: usize,
    mut out: Outputs,
    mut stats: Stats,
) -> i32 {
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
