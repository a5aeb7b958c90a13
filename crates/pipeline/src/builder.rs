//! The public builder of a pipeline, and `start()`: spawning the children and connecting them.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Transfer;
use crate::credit::{Credit, DEFAULT_REORDER_WINDOW, Gate, Grantee};
use crate::error::Error;
use crate::handover::{Ctrl, Kind};
use crate::inline::Inline;
use crate::input::Feeder;
use crate::jsonl::JsonLines;
use crate::node::{
    self, ChannelGeometry, ChildSpec, Inputs, Outputs, Plan, Role, SourceSpec, StagePlan,
};
use crate::pipeline::{
    DEFAULT_BATCH_BYTES, DEFAULT_PIPELINE_THRESHOLD, DEFAULT_WARN_IDLE, Epochs, OnBadRecord,
    Pipeline, Reorder, Topology, interrupt_flag,
};
use crate::plan::TransportKind;
use crate::process;
use crate::ready::Ready;
use crate::share::{self, SharedFd};
use crate::step::Registry;
use crate::supervisor::{self, ChildProc, Shared};
use crate::wire::Stats;

/// Builds a [`Pipeline`]. Created by [`Pipeline::builder`].
#[derive(Debug, Clone)]
pub struct PipelineBuilder {
    reg: Registry,
    source: Option<SourceSpec>,
    emitters: usize,
    steps: Vec<(String, serde_json::Value)>,
    workers: usize,
    topology: Topology,
    batch_bytes: usize,
    transfer: Transfer,
    ordered: bool,
    reorder_window: u64,
    seed: u64,
    shuffle: bool,
    shuffle_buffer: usize,
    epochs: Epochs,
    rank: usize,
    world_size: usize,
    on_bad_record: OnBadRecord,
    child_args: Option<Vec<String>>,
    child_program: Option<std::path::PathBuf>,
    transport: TransportKind,
    channel: ChannelGeometry,
    ctrl_c: bool,
    lease: bool,
    warn_idle: Duration,
    /// Descriptors shared with the children ([`PipelineBuilder::share_fd`]): read-only
    /// reopenings, close-on-exec, each with the token of its [`SharedFd`].
    shared: Vec<(u64, Arc<OwnedFd>)>,
}

impl Pipeline {
    /// A builder using the steps and sources of `reg`.
    pub fn builder(reg: &Registry) -> PipelineBuilder {
        PipelineBuilder::new(reg)
    }
}

impl PipelineBuilder {
    pub(crate) fn new(reg: &Registry) -> PipelineBuilder {
        PipelineBuilder {
            reg: reg.clone(),
            source: None,
            emitters: 1,
            steps: Vec::new(),
            workers: 2,
            topology: Topology::Fused,
            batch_bytes: DEFAULT_BATCH_BYTES,
            transfer: Transfer::Adaptive {
                threshold: DEFAULT_PIPELINE_THRESHOLD,
            },
            ordered: false,
            reorder_window: DEFAULT_REORDER_WINDOW,
            seed: 0,
            shuffle: false,
            shuffle_buffer: 256,
            epochs: Epochs::Finite(1),
            rank: 0,
            world_size: 1,
            on_bad_record: OnBadRecord::Fail,
            child_args: None,
            child_program: None,
            transport: TransportKind::Shm,
            channel: ChannelGeometry::default(),
            ctrl_c: true,
            lease: true,
            warn_idle: DEFAULT_WARN_IDLE,
            shared: Vec::new(),
        }
    }

    /// Shares a sealed memfd with the pipeline's children: returns a handle to put in the
    /// arguments of steps or of the source (`json!({"data": handle})`); a step or source
    /// factory gets the descriptor with [`StepContext::shared_fd`] /
    /// [`SourceContext::shared_fd`]. Each child receives, through its control socket at start,
    /// exactly the descriptors its own arguments name, checks them and keeps them until it
    /// exits. The pipeline holds its own read-only reopening of `fd` (close-on-exec) from
    /// now until it is dropped, so the caller may close `fd` at once; nothing names the
    /// descriptor by number.
    ///
    /// `fd` must be a memfd sealed `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
    /// F_SEAL_SEAL`: its bytes and size can never change, so a child validates it once and
    /// maps it without risk of SIGBUS.
    ///
    /// The handle works with this builder, and with clones of it made afterwards (they hold
    /// the same descriptor); any other builder refuses it at [`start`](Self::start).
    ///
    /// # Errors
    /// [`Error::Config`] when `fd` is not such a memfd, cannot be reopened read-only, or more
    /// than 128 descriptors are shared (the most one control message carries).
    ///
    /// [`StepContext::shared_fd`]: crate::StepContext::shared_fd
    /// [`SourceContext::shared_fd`]: crate::SourceContext::shared_fd
    pub fn share_fd(&mut self, fd: BorrowedFd<'_>) -> Result<SharedFd, Error> {
        if self.shared.len() >= crate::handover::MAX_FDS {
            return Err(Error::Config(format!(
                "share_fd: at most {} shared descriptors",
                crate::handover::MAX_FDS
            )));
        }
        let ro = share::read_only_copy(fd).map_err(|e| Error::Config(format!("share_fd: {e}")))?;
        let h = SharedFd::draw().map_err(|e| Error::Config(format!("share_fd: {e}")))?;
        self.shared.push((h.token(), Arc::new(ro)));
        Ok(h)
    }

    /// The descriptor shared under `token`, if this builder holds it.
    fn shared_fd(&self, token: u64) -> Option<&Arc<OwnedFd>> {
        self.shared
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, fd)| fd)
    }

    /// The shared descriptors that `role` receives: the tokens its arguments name, in order.
    fn shared_for(&self, plan: &Plan, role: Role) -> Vec<u64> {
        let mut idx = Vec::new();
        match role {
            Role::Emitter(_) => {
                if let Some(SourceSpec::Named { args, .. }) = &plan.source {
                    share::handles_in(args, &mut idx);
                }
            }
            Role::Worker { stage, .. } => {
                for (_, args) in &plan.stages[stage].steps {
                    share::handles_in(args, &mut idx);
                }
            }
        }
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    /// Zero-copy arrays reaching the consumer stay in shared memory and are read in place
    /// ([`Item::array`](crate::Item::array), [`ArrayRef::is_shared`](crate::ArrayRef::is_shared)) instead of being copied out (default on; at most
    /// half of each worker's pool blocks are held by the consumer's items at a time, further
    /// arrays are copied). Off: every received array is copied to the heap.
    pub fn consumer_zero_copy(mut self, on: bool) -> Self {
        self.lease = on;
        self
    }

    /// Reads a JSON-lines file, split over the emitters by line-aligned byte ranges.
    pub fn source(mut self, src: JsonLines) -> Self {
        self.source = Some(SourceSpec::JsonLines(src));
        self
    }
    /// Reads a source registered under `name` (see [`Registry::source`]).
    pub fn source_named(mut self, name: &str, args: serde_json::Value) -> Self {
        self.source = Some(SourceSpec::Named {
            name: name.to_owned(),
            args,
        });
        self
    }
    /// Number of emitter processes (default 1).
    pub fn emitters(mut self, n: usize) -> Self {
        self.emitters = n;
        self
    }
    /// Appends registered step `name` (arguments `null`).
    pub fn step(self, name: &str) -> Self {
        self.step_with(name, serde_json::Value::Null)
    }
    /// Appends registered step `name` with arguments for its factory.
    pub fn step_with(mut self, name: &str, args: serde_json::Value) -> Self {
        self.steps.push((name.to_owned(), args));
        self
    }
    /// Worker processes (per stage in the staged topology; default 2).
    ///
    /// `0`: no process at all. The steps run in the calling thread, inside
    /// [`Pipeline::dequeue`], on the items given to [`Pipeline::enqueue`] (a source is
    /// refused: read it with [`Records`](crate::Records) and enqueue its items). For
    /// debugging: a breakpoint in a step stops the caller. Outputs come in order, equal to
    /// those of the ordered mode with any worker count (item seeds included, see
    /// [`item_seed`](crate::item_seed)); a step's failure is the same
    /// [`Error::Step`](crate::Error::Step), naming worker 0.
    ///
    /// # Examples
    /// ```
    /// use shmpipe::{map, Item, Pipeline, Registry};
    /// let reg = Registry::new().step("inc", |_| Ok(map(|it: Item| {
    ///     let n = it.i64("n").unwrap_or(0);
    ///     Ok(it.with_meta("n", n + 1))
    /// })));
    /// shmpipe::init(&reg);
    /// let mut p = Pipeline::builder(&reg).step("inc").step("inc").workers(0).start()?;
    /// assert!(p.pids().is_empty());
    /// p.enqueue(Item::new().with_meta("n", 3))?;
    /// assert_eq!(p.dequeue()?.unwrap().i64("n"), Some(5)); // ran here, just now
    /// # Ok::<(), shmpipe::Error>(())
    /// ```
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }
    /// Fused (default) or staged.
    pub fn topology(mut self, t: Topology) -> Self {
        self.topology = t;
        self
    }
    /// Target batch size in bytes (default [`DEFAULT_BATCH_BYTES`]).
    pub fn batch_bytes(mut self, n: usize) -> Self {
        self.batch_bytes = n;
        self
    }
    /// How arrays cross processes (default adaptive).
    pub fn transfer(mut self, t: Transfer) -> Self {
        self.transfer = t;
        self
    }
    /// Yield outputs in input order (default: unordered).
    pub fn ordered(mut self, on: bool) -> Self {
        self.ordered = on;
        self
    }
    /// Ordered mode: how many records each emitter may run ahead of the first output the
    /// consumer still waits for, at most (default [`DEFAULT_REORDER_WINDOW`]; at least 1).
    /// Fewer while the outputs held for reordering take more than 16 MiB
    /// ([`REORDER_BYTES`](crate::REORDER_BYTES)): then each emitter may issue only the next
    /// record the consumer needs from it. So a slow emitter holds the others back instead of
    /// filling the consumer's memory.
    pub fn reorder_window(mut self, records: u64) -> Self {
        self.reorder_window = records.max(1);
        self
    }
    /// Seed for shuffling and for the per-worker seeds (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Shuffle: a per-epoch permutation of each emitter's records plus a shuffle buffer.
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// Shuffle buffer size in items (default 256; 0 or 1: permutation only; at most
    /// [`MAX_SHUFFLE_BUFFER`](crate::MAX_SHUFFLE_BUFFER), checked by
    /// [`start`](PipelineBuilder::start)). Room is taken as items arrive, not up front.
    pub fn shuffle_buffer(mut self, n: usize) -> Self {
        self.shuffle_buffer = n;
        self
    }
    /// Number of epochs (default `Finite(1)`).
    pub fn epochs(mut self, e: Epochs) -> Self {
        self.epochs = e;
        self
    }
    /// This job's shard: `rank` of `world_size` jobs reading the same data.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.rank = rank;
        self.world_size = world_size;
        self
    }
    /// What to do with malformed records (default fail).
    pub fn on_bad_record(mut self, p: OnBadRecord) -> Self {
        self.on_bad_record = p;
        self
    }
    /// Command-line arguments for the re-executed children (default: this process's own
    /// arguments, which re-run the same test under a test harness).
    pub fn child_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.child_args = Some(args.into_iter().map(Into::into).collect());
        self
    }
    /// Spawns the children as `program args..` instead of re-executing the current executable
    /// with [`child_args`](PipelineBuilder::child_args). For hosts whose executable is not
    /// the program that calls [`init`](crate::init), e.g. a Python interpreter, whose
    /// children run `python -m some_worker_module`; `program` must call `init` with a
    /// registry holding the same steps and sources.
    pub fn child_program<P, I, S>(mut self, program: P, args: I) -> Self
    where
        P: Into<std::path::PathBuf>,
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.child_program = Some(program.into());
        self.child_args(args)
    }
    /// Use Unix sockets instead of shared memory (a slower reference transport).
    pub fn socket_transport(mut self, on: bool) -> Self {
        self.transport = if on {
            TransportKind::Socket
        } else {
            TransportKind::Shm
        };
        self
    }
    /// Shared-memory channel geometry: ring slots, and the payload pool (blocks of
    /// `block_size` bytes; one zero-copy array or one large batch per block). Default:
    /// [`ChannelGeometry::default`].
    pub fn channel(mut self, geometry: ChannelGeometry) -> Self {
        self.channel = geometry;
        self
    }
    /// Enqueue mode: when the consumer has waited this long for an output while nothing was
    /// enqueued and the input is still open, say once on stderr that the pipeline waits for
    /// input (a forgotten [`Pipeline::close_input`] is otherwise a silent hang). Default 5 s;
    /// `Duration::ZERO` turns it off.
    pub fn warn_idle_after(mut self, after: Duration) -> Self {
        self.warn_idle = after;
        self
    }
    /// Turn SIGINT (Ctrl-C) into [`Error::Interrupted`] at the consumer (default on; a second
    /// Ctrl-C exits at once). SIGTERM keeps its default action: the parent ends at once and
    /// its children follow within milliseconds (their control sockets close); with anonymous
    /// channels nothing is left behind.
    pub fn handle_ctrl_c(mut self, on: bool) -> Self {
        self.ctrl_c = on;
        self
    }

    /// Refuses a configuration no plan can be made of: the error says what to change.
    fn check(&self) -> Result<(), Error> {
        let cfg = |m: &str| Err(Error::Config(m.to_owned()));
        if self.workers == 0 && self.source.is_some() {
            return cfg(
                "workers(0) runs the steps in this process on enqueued items: without a source \
                 (read one with shmpipe::Records and enqueue its items)",
            );
        }
        if self.source.is_some() && self.emitters == 0 {
            return cfg("emitters must be at least 1");
        }
        let widest = self.emitters.max(self.workers).max(match &self.topology {
            Topology::Staged { workers } => workers.iter().copied().max().unwrap_or(0),
            Topology::Fused => 0,
        });
        if widest > crate::handover::MAX_FDS {
            return Err(Error::Config(format!(
                "at most {} emitters or workers per stage",
                crate::handover::MAX_FDS
            )));
        }
        if self.shuffle_buffer > crate::MAX_SHUFFLE_BUFFER {
            return Err(Error::Config(format!(
                "PipelineBuilder::shuffle_buffer got {} items: at most {} (2^32); a buffer \
                 as large as an emitter's part already shuffles it whole",
                self.shuffle_buffer,
                crate::MAX_SHUFFLE_BUFFER
            )));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return cfg("shard: rank must be in 0..world_size");
        }
        for (name, _) in &self.steps {
            if !self.reg.has_step(name) {
                return Err(Error::Config(format!(
                    "no step named {name:?} is registered"
                )));
            }
        }
        if let Some(SourceSpec::Named { name, .. }) = &self.source
            && !self.reg.has_source(name)
        {
            return Err(Error::Config(format!(
                "no source named {name:?} is registered"
            )));
        }
        let mut named = Vec::new();
        if let Some(SourceSpec::Named { args, .. }) = &self.source {
            share::handles_in(args, &mut named);
        }
        for (_, args) in &self.steps {
            share::handles_in(args, &mut named);
        }
        if let Some(t) = named.into_iter().find(|&t| self.shared_fd(t).is_none()) {
            return Err(Error::Config(format!(
                "the arguments name shared descriptor {t:016x}, which this builder did not \
                 share: a handle of another builder, or of a clone of this one made after the \
                 clone (each builder's PipelineBuilder::share_fd gives its own handles)"
            )));
        }
        Ok(())
    }

    /// The stages of the plan: one per step (`Topology::Staged`), or one holding every step
    /// (in this process with `workers(0)`).
    fn stages(&self) -> Result<Vec<StagePlan>, Error> {
        let cfg = |m: &str| Err(Error::Config(m.to_owned()));
        Ok(match &self.topology {
            // In this process, the steps in one chain.
            _ if self.workers == 0 => vec![StagePlan {
                steps: self.steps.clone(),
                workers: 0,
            }],
            Topology::Staged { workers } if !self.steps.is_empty() => {
                if !workers.is_empty() && workers.len() != self.steps.len() {
                    return cfg("Staged: one worker count per step");
                }
                if workers.contains(&0) {
                    return cfg("Staged: every stage needs a worker");
                }
                self.steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| StagePlan {
                        steps: vec![s.clone()],
                        workers: workers.get(i).copied().unwrap_or(self.workers),
                    })
                    .collect()
            }
            _ => vec![StagePlan {
                steps: self.steps.clone(),
                workers: self.workers,
            }],
        })
    }

    fn plan(&self) -> Result<Plan, Error> {
        self.check()?;
        let stages = self.stages()?;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let pid = std::process::id();
        Ok(Plan {
            id: format!(
                "{pid}x{}x{:x}",
                SEQ.fetch_add(1, Ordering::Relaxed),
                nanos & 0xfffff
            ),
            parent: pid,
            emitters: if self.source.is_some() {
                self.emitters
            } else {
                1
            },
            source: self.source.clone(),
            stages,
            ordered: self.ordered,
            reorder_window: self.reorder_window,
            batch_bytes: self.batch_bytes,
            transfer: self.transfer,
            transport: self.transport,
            channel: self.channel,
            seed: self.seed,
            shuffle: self.shuffle,
            shuffle_buffer: self.shuffle_buffer,
            epochs: self.epochs,
            rank: self.rank,
            world_size: self.world_size,
            on_bad_record: self.on_bad_record,
            lease: self.lease,
        })
    }

    /// Spawns every emitter and worker of `plan` into `shared.children`, each with its shared
    /// descriptors queued on its control socket.
    fn spawn_children(&self, plan: &Plan, shared: &Shared) -> Result<(), Error> {
        let args = self
            .child_args
            .clone()
            .unwrap_or_else(|| std::env::args().skip(1).collect());
        let mut roles: Vec<Role> = Vec::new();
        if plan.source.is_some() {
            roles.extend((0..plan.emitters).map(Role::Emitter));
        }
        for (s, st) in plan.stages.iter().enumerate() {
            roles.extend((0..st.workers).map(|w| Role::Worker {
                stage: s,
                worker: w,
            }));
        }
        for role in roles {
            let mut spec = ChildSpec {
                plan: plan.clone(),
                role,
                ctrl_fd: -1,
                shared: self.shared_for(plan, role),
            };
            let (ctrl, theirs) = Ctrl::pair().map_err(Error::Spawn)?;
            let child = process::spawn(&mut spec, self.child_program.as_deref(), &args, theirs)?;
            // Its shared descriptors first of all (queued on its socket before it reads; a
            // child that died already shows up in the broker's first gather).
            // Every token was checked against `shared` by `plan`.
            let fds: Vec<BorrowedFd<'_>> = spec
                .shared
                .iter()
                .filter_map(|&t| self.shared_fd(t))
                .map(|fd| fd.as_fd())
                .collect();
            let sent = ctrl.send(Kind::Shared, &fds);
            shared
                .children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ChildProc {
                    role,
                    child,
                    status: None,
                    ctrl,
                    announced: None,
                });
            match sent {
                // A child that is already gone: the broker's first gather names how it ended.
                Err(e) if !crate::handover::peer_gone(&e) => {
                    return Err(Error::transport(format!(
                        "start-up: cannot hand {} its {} shared descriptors: {e}",
                        role.describe(),
                        fds.len()
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Starts the emitter and worker processes and connects the consumer.
    ///
    /// # Errors
    /// [`Error::Config`] for invalid settings (or when called in a pipeline child, i.e. when
    /// [`init`](crate::init) was not called first), [`Error::Spawn`] / [`Error::Transport`] /
    /// [`Error::ProcessDied`] when the processes cannot be started and connected.
    pub fn start(self) -> Result<Pipeline, Error> {
        if process::is_child() {
            return Err(Error::Config(
                "Pipeline::start in a pipeline child: call shmpipe::init(&registry) first in main \
                 (and in every test that starts a pipeline)"
                    .into(),
            ));
        }
        let plan = self.plan()?;
        if plan.transport == TransportKind::Shm {
            crate::shm::check_memory(&plan).map_err(Error::Config)?;
        }
        if self.ctrl_c {
            interrupt_flag(true).store(false, Ordering::SeqCst);
        }
        let shared = Arc::new(Shared::default());
        let (reorder, gate) = reorder_and_gate(&plan, &shared);
        let mut p = Pipeline {
            inputs: None,
            feeder: None,
            shared: Arc::clone(&shared),
            supervisor: None,
            inline: None,
            ready: Ready::default(),
            reorder,
            owner: shm_ring::Owner::current(),
            finished: false,
            failed: false,
            stats: Stats::default(),
            items: 0,
            bytes: 0,
            started: Instant::now(),
            last_check: Instant::now(),
            ctrl_c: self.ctrl_c,
            warn_idle: self.warn_idle,
            waiting_since: None,
            warned: false,
            plan,
            _shared: self.shared.iter().map(|(_, fd)| Arc::clone(fd)).collect(),
        };
        if p.plan.stages[0].workers == 0 {
            let (feeder, rx) = Feeder::inline(Arc::new(AtomicBool::new(false)));
            p.inline = Some(Inline::new(
                &self.reg,
                &p.plan,
                rx,
                Arc::clone(&feeder.state),
            )?);
            p.feeder = Some(feeder);
            return Ok(p);
        }
        let plan = &p.plan;
        let mut own_outputs = Vec::new();
        if plan.source.is_none() {
            let (feeder, fds) = feed_from_parent(plan, gate)?;
            p.feeder = Some(feeder);
            own_outputs = fds;
        }
        self.spawn_children(plan, &shared)?;
        p.supervisor = Some(supervisor::supervise(Arc::clone(&shared)));
        let rxs = crate::broker::connect(plan, &shared, own_outputs)?;
        p.inputs = Some(Inputs::new(rxs));
        p.started = Instant::now();
        Ok(p)
    }
}

/// Ordered mode: the consumer grants each emitter what it may issue; in enqueue mode the
/// parent's own input thread is emitter 0, with a gate in this process (returned beside the
/// reorder). `workers(0)` needs neither: its outputs are in order as they are made.
fn reorder_and_gate(plan: &Plan, shared: &Arc<Shared>) -> (Option<Reorder>, Option<Arc<Gate>>) {
    let reorders = plan.ordered && plan.stages[0].workers > 0;
    let gate = (reorders && plan.source.is_none())
        .then(|| Arc::new(Gate::new(crate::credit::initial(plan.reorder_window))));
    let reorder = reorders.then(|| {
        let to = match &gate {
            Some(g) => Grantee::Local(Arc::clone(g)),
            None => Grantee::Emitters(Arc::clone(shared)),
        };
        Reorder::new(
            plan.emitters,
            Credit::new(plan.emitters, plan.reorder_window, to),
        )
    });
    (reorder, gate)
}

/// Enqueue mode: the parent is emitter 0 and creates its channels to the first stage itself.
/// Returns the input thread feeding them and the channels' descriptors (for the workers).
fn feed_from_parent(
    plan: &Plan,
    gate: Option<Arc<Gate>>,
) -> Result<(Feeder, Vec<Option<OwnedFd>>), Error> {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut txs = Vec::new();
    let mut fds = Vec::new();
    for _ in 0..plan.stages[0].workers {
        let (tx, fd) = node::create_tx(plan, Some(Arc::clone(&cancel)))?;
        txs.push(tx);
        fds.push(Some(fd));
    }
    let feeder = Feeder::start(
        Outputs::new(txs, plan),
        plan.stages[0].workers,
        cancel,
        gate,
    );
    Ok((feeder, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 9: with the default geometry a batch (plus one item beyond `batch_bytes`) travels
    /// inline in the ring (shm-ring keeps messages inline up to a quarter of the ring), so
    /// small items never take a pool block. The old default (256 slots of 64 bytes) kept only
    /// 4 KiB inline: every 16 KiB batch took a block.
    #[test]
    fn default_channels_carry_a_batch_inline() {
        for batch in [256, 4 << 10, DEFAULT_BATCH_BYTES, 64 << 10] {
            let plan = Pipeline::builder(&Registry::new())
                .batch_bytes(batch)
                .plan()
                .unwrap();
            let cfg = crate::shm::channel_config(&plan);
            let max_inline = cfg.slots as usize * cfg.slot_size as usize / 4;
            assert!(max_inline >= 2 * batch, "{batch}: {max_inline}");
        }
    }
}
