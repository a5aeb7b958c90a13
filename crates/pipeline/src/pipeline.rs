//! The public builder and the consumer side of a pipeline (the parent process).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::item::Item;
use crate::node::{
    self, CONSUMER, ChannelPlan, ChildSpec, Inputs, NextError, Outputs, Plan, Role, SourceSpec,
    StagePlan,
};
use crate::process::{self, ChildProc, Shared};
use crate::source::JsonLines;
use crate::step::Registry;
use crate::transport::TransportKind;
use crate::wire::{Frame, Stats, TransportError};

/// How arrays cross process boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transfer {
    /// Always copy arrays inline into the ring.
    Copy,
    /// Always place arrays in the producer's payload pool (zero-copy handoff).
    ZeroCopy,
    /// Copy arrays under `threshold` bytes, zero-copy above.
    Adaptive {
        /// Size in bytes from which arrays go zero-copy.
        threshold: usize,
    },
}

impl Transfer {
    /// Whether an array of `bytes` bytes goes zero-copy under this policy.
    pub fn zero_copy(&self, bytes: usize) -> bool {
        match *self {
            Transfer::Copy => false,
            Transfer::ZeroCopy => bytes > 0,
            Transfer::Adaptive { threshold } => bytes >= threshold && bytes > 0,
        }
    }
}

/// How the steps are laid out over worker processes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Topology {
    /// Every worker runs all steps: one queue in, one queue out (the default; the seed found
    /// it faster).
    #[default]
    Fused,
    /// One stage per step with queues between stages.
    Staged {
        /// Workers per stage; empty: [`PipelineBuilder::workers`] for every stage.
        workers: Vec<usize>,
    },
}

/// How many passes over the data the emitters make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Epochs {
    /// This many epochs, then the end of stream.
    Finite(u64),
    /// Endless: epoch after epoch (each with its own permutation when shuffling). Use
    /// [`Pipeline::take_epoch`] to take a fixed number of outputs per training epoch.
    Cycle,
}

/// What an emitter does with a malformed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum OnBadRecord {
    /// Stop the pipeline with [`Error::BadRecord`] (the default).
    #[default]
    Fail,
    /// Skip it and count it ([`Metrics::skipped_records`]).
    Skip,
}

/// The default batch size in bytes (see `docs/pipeline.md` for the measurement behind it).
pub const DEFAULT_BATCH_BYTES: usize = 16 << 10;

/// Default adaptive threshold of a pipeline: arrays of at least this many bytes go zero-copy.
///
/// Higher than shm-ring's own [`shm_ring::DEFAULT_THRESHOLD`] (which is measured for producers
/// that fill loans in place): a pipeline's items are ordinary heap arrays, so zero-copy costs a
/// copy into a pool block plus a block per array (which also caps how many arrays a batch may
/// hold). Measured with `pipeline_bench` (trivial step, 2 workers): zero-copy 0.39x copy at
/// 1 KiB arrays, the two within ~10% from 16 KiB to 1 MiB (docs/pipeline.md).
pub const DEFAULT_PIPELINE_THRESHOLD: usize = 64 << 10;

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
    channel: ChannelPlan,
    ctrl_c: bool,
    lease: bool,
}

impl PipelineBuilder {
    /// Zero-copy arrays reaching the consumer stay in shared memory and are read in place
    /// ([`Item::array`], [`Item::is_shared`]) instead of being copied out (default on; at most
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
    /// Shuffle buffer size in items (default 256; 0 or 1: permutation only).
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
    /// Shared-memory channel sizing: ring slots, and the payload pool (blocks of
    /// `block_size` bytes; one zero-copy array or one large batch per block).
    pub fn channel(mut self, slots: u32, blocks: u32, block_size: usize) -> Self {
        self.channel.slots = slots;
        self.channel.blocks = blocks;
        self.channel.block_size = block_size;
        self
    }
    /// Turn SIGINT (Ctrl-C) into [`Error::Interrupted`] at the consumer (default on; a second
    /// Ctrl-C exits at once).
    pub fn handle_ctrl_c(mut self, on: bool) -> Self {
        self.ctrl_c = on;
        self
    }

    fn plan(&self) -> Result<Plan, Error> {
        let cfg = |m: &str| Err(Error::Config(m.to_owned()));
        if self.workers == 0 {
            return cfg("workers must be at least 1");
        }
        if self.source.is_some() && self.emitters == 0 {
            return cfg("emitters must be at least 1");
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
        let stages = match &self.topology {
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
        };
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
            // Segments of processes that died without cleaning up (a SIGKILLed parent's own
            // channels in enqueue mode) do not survive the next start: `Sender::create` (in
            // this process or in the children) runs `shm_ring::reclaim_stale`.
            crate::shm::check_space(&plan).map_err(Error::Config)?;
        }
        if self.ctrl_c {
            interrupt_flag(true).store(false, Ordering::SeqCst);
        }
        let shared = Arc::new(Shared::default());
        let mut p = Pipeline {
            inputs: None,
            feeder: None,
            shared: Arc::clone(&shared),
            supervisor: None,
            ready: VecDeque::new(),
            reorder: plan.ordered.then(|| Reorder::new(plan.emitters)),
            finished: false,
            failed: false,
            stats: Stats::default(),
            items: 0,
            bytes: 0,
            started: Instant::now(),
            last_check: Instant::now(),
            ctrl_c: self.ctrl_c,
            plan,
        };
        let plan = &p.plan;
        // Enqueue mode: the parent is emitter 0; its connections exist before the workers.
        if plan.source.is_none() {
            let me = node::emitter_node(0);
            let txs: Result<Vec<_>, _> = (0..plan.stages[0].workers)
                .map(|w| node::create_tx(plan, &plan.conn(&me, &node::worker_node(0, w))))
                .collect();
            let outs = Outputs::new(txs.map_err(Error::Transport)?, plan);
            p.feeder = Some(Feeder::start(
                outs,
                plan.stages[0].workers,
                Arc::clone(&shared),
            ));
        }
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
            let spec = ChildSpec {
                plan: plan.clone(),
                role,
            };
            let child = process::spawn(&spec, self.child_program.as_deref(), &args)?;
            shared
                .children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ChildProc {
                    role,
                    child,
                    status: None,
                });
        }
        p.supervisor = Some(process::supervise(Arc::clone(&shared)));
        let last = plan.stages.len() - 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut rxs = Vec::new();
        for w in 0..plan.stages[last].workers {
            let name = plan.conn(&node::worker_node(last, w), CONSUMER);
            loop {
                match node::open_rx(
                    plan,
                    &name,
                    Instant::now() + Duration::from_millis(50),
                    plan.lease,
                ) {
                    Ok(rx) => {
                        rxs.push(rx);
                        break;
                    }
                    Err(e) => {
                        if let Some(err) = shared.take_primary() {
                            return Err(err);
                        }
                        if Instant::now() > deadline {
                            return Err(Error::Transport(e));
                        }
                    }
                }
            }
        }
        p.inputs = Some(Inputs::new(rxs));
        p.started = Instant::now();
        Ok(p)
    }
}

/// The process-wide Ctrl-C flag; registers the handlers on first use when `install`.
fn interrupt_flag(install: bool) -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        if install {
            // A second Ctrl-C (flag already set) exits at once with the conventional status.
            let _ = signal_hook::flag::register_conditional_shutdown(
                signal_hook::consts::SIGINT,
                130,
                Arc::clone(&flag),
            );
            let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&flag));
        }
        flag
    })
}

/// Throughput and transfer counters. Step times and transfer counts arrive with the end
/// markers, so they are complete once the stream has ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Items delivered to the consumer.
    pub items: u64,
    /// Array bytes delivered to the consumer.
    pub bytes: u64,
    /// Time since start.
    pub elapsed: Duration,
    /// Per step: (name, inputs processed over all workers, total time in the step).
    pub steps: Vec<(String, u64, Duration)>,
    /// Fraction of the consumer's receive attempts that found a batch waiting (near 1: the
    /// workers are ahead of the consumer; near 0: the consumer waits for the workers).
    pub queue_occupancy: f64,
    /// Arrays that crossed a process boundary zero-copy.
    pub arrays_zero_copy: u64,
    /// Arrays that were copied.
    pub arrays_copied: u64,
    /// Malformed records skipped ([`OnBadRecord::Skip`]).
    pub skipped_records: u64,
}

impl Metrics {
    /// Items per second.
    pub fn items_per_sec(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Array bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The reorder buffer of the ordered mode: groups of outputs keyed by input `(k, e)`,
/// released in the order `k`, then `e`.
#[derive(Debug)]
struct Reorder {
    emitters: u32,
    /// Records sent by each emitter, once known.
    counts: Vec<Option<u64>>,
    /// Cursor: the next group to release is `(k, e)`.
    k: u64,
    e: u32,
    groups: HashMap<(u64, u32), (Vec<Item>, bool)>,
}

impl Reorder {
    fn new(emitters: usize) -> Reorder {
        Reorder {
            emitters: emitters as u32,
            counts: vec![None; emitters],
            k: 0,
            e: 0,
            groups: HashMap::new(),
        }
    }
    fn add(&mut self, e: u32, k: u64, item: Option<Item>, last: bool) {
        let g = self.groups.entry((k, e)).or_default();
        g.0.extend(item);
        g.1 |= last;
    }
    fn release(&mut self, ready: &mut VecDeque<Item>) {
        loop {
            let all_known = self.counts.iter().all(|c| c.is_some_and(|n| self.k >= n));
            if all_known {
                return;
            }
            let skip = self.counts[self.e as usize].is_some_and(|n| self.k >= n);
            if !skip {
                match self.groups.get(&(self.k, self.e)) {
                    Some((_, true)) => {
                        let (items, _) = self.groups.remove(&(self.k, self.e)).unwrap_or_default();
                        ready.extend(items);
                    }
                    _ => return,
                }
            }
            self.e += 1;
            if self.e == self.emitters {
                self.e = 0;
                self.k += 1;
            }
        }
    }
    fn flush(&mut self, ready: &mut VecDeque<Item>) {
        let mut rest: Vec<_> = self.groups.drain().collect();
        rest.sort_by_key(|(key, _)| *key);
        ready.extend(rest.into_iter().flat_map(|(_, (items, _))| items));
    }
}

enum Feed {
    Item(Item),
    Close,
}

/// Enqueue mode: a thread of the parent that batches enqueued items to the workers.
struct Feeder {
    tx: Option<mpsc::Sender<Feed>>,
    handle: Option<JoinHandle<()>>,
    closed: bool,
}

impl Feeder {
    fn start(mut out: Outputs, workers: usize, shared: Arc<Shared>) -> Feeder {
        let (tx, rx) = mpsc::channel::<Feed>();
        let handle = std::thread::spawn(move || {
            let mut k = 0u64;
            let r: Result<(), TransportError> = (|| loop {
                let msg = match rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::TryRecvError::Empty) => {
                        out.flush_all()?;
                        match rx.recv() {
                            Ok(m) => m,
                            Err(_) => return Ok(()),
                        }
                    }
                    Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                };
                match msg {
                    Feed::Item(item) => {
                        out.push(
                            (k % workers as u64) as usize,
                            Frame::Item {
                                e: 0,
                                k,
                                last: true,
                                item,
                            },
                        )?;
                        k += 1;
                    }
                    Feed::Close => {
                        out.broadcast(&Frame::EmitterDone { e: 0, n: k })?;
                        out.broadcast(&Frame::Eos(Stats::default()))?;
                        return out.flush_all();
                    }
                }
            })();
            if let Err(e) = r {
                let mut s = shared.secondary.lock().unwrap_or_else(|e| e.into_inner());
                s.get_or_insert(Error::Transport(format!("enqueue: {e}")));
            }
        });
        Feeder {
            tx: Some(tx),
            handle: Some(handle),
            closed: false,
        }
    }
}

/// A running pipeline: the consumer end. Iterate it (or call [`Pipeline::dequeue`]) to get
/// the outputs; dropping it shuts every process down and removes every segment.
///
/// # Examples
/// ```no_run
/// use shmpipe::{map, Item, Pipeline, Registry};
/// let reg = Registry::new().step("inc", |_| Ok(map(|it: Item| {
///     let n = it.i64("n").unwrap_or(0);
///     Ok(it.with_i64("n", n + 1))
/// })));
/// shmpipe::init(&reg); // first thing in main: child processes divert here
/// let mut p = Pipeline::builder(&reg).step("inc").step("inc").workers(2).start()?;
/// p.enqueue(Item::new().with_i64("n", 3))?;
/// p.close_input();
/// assert_eq!(p.dequeue()?.unwrap().i64("n"), Some(5));
/// assert!(p.dequeue()?.is_none());
/// # Ok::<(), shmpipe::Error>(())
/// ```
pub struct Pipeline {
    plan: Plan,
    inputs: Option<Inputs>,
    feeder: Option<Feeder>,
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
    ready: VecDeque<Item>,
    reorder: Option<Reorder>,
    finished: bool,
    failed: bool,
    stats: Stats,
    items: u64,
    bytes: u64,
    started: Instant,
    /// When the consumer last looked for a dead child.
    last_check: Instant,
    ctrl_c: bool,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("id", &self.plan.id)
            .field("finished", &self.finished)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A builder using the steps and sources of `reg`.
    pub fn builder(reg: &Registry) -> PipelineBuilder {
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
            channel: ChannelPlan {
                slots: 256,
                slot_size: 64,
                blocks: 8,
                block_size: 1 << 20,
            },
            ctrl_c: true,
            lease: true,
        }
    }

    /// The pipeline's id (the infix of its connection and segment names).
    pub fn id(&self) -> &str {
        &self.plan.id
    }

    /// Pids of the child processes (emitters, then workers by stage).
    pub fn pids(&self) -> Vec<u32> {
        let kids = self
            .shared
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        kids.iter().map(|c| c.child.id()).collect()
    }

    /// Names of the shared-memory segments of this pipeline (under `/dev/shm`).
    pub fn segment_names(&self) -> Vec<String> {
        if self.plan.transport != TransportKind::Shm {
            return Vec::new();
        }
        self.plan
            .all_connections()
            .iter()
            .map(|c| format!("shmpipe-{c}"))
            .collect()
    }

    /// Enqueue mode (no source): feeds one item. Never blocks.
    ///
    /// # Errors
    /// [`Error::Closed`] with a source configured, after [`Pipeline::close_input`], or when
    /// the pipeline has failed.
    pub fn enqueue(&mut self, item: Item) -> Result<(), Error> {
        let f = self
            .feeder
            .as_mut()
            .ok_or_else(|| Error::Closed("enqueue needs a pipeline without a source".into()))?;
        if f.closed || self.failed {
            return Err(Error::Closed("input already closed".into()));
        }
        if f.tx
            .as_ref()
            .and_then(|tx| tx.send(Feed::Item(item)).ok())
            .is_some()
        {
            return Ok(());
        }
        // The input thread stopped: hand over what stopped it (e.g. an item too large for the
        // channel), not just the fact.
        self.failed = true;
        Err(self
            .shared
            .take_secondary()
            .unwrap_or_else(|| Error::Closed("the input thread stopped".into())))
    }

    /// Enqueue mode: marks the end of the input. The consumer's stream ends after the outputs
    /// of every enqueued item.
    pub fn close_input(&mut self) {
        if let Some(f) = self.feeder.as_mut()
            && !f.closed
        {
            f.closed = true;
            if let Some(tx) = &f.tx {
                let _ = tx.send(Feed::Close);
            }
        }
    }

    /// The next output; `Ok(None)` after the end of stream (or after a failure was reported).
    ///
    /// # Errors
    /// The first failure of the pipeline (a step error, a bad record, a dead process, Ctrl-C);
    /// the pipeline is shut down before the error is returned.
    pub fn dequeue(&mut self) -> Result<Option<Item>, Error> {
        loop {
            if let Some(it) = self.ready.pop_front() {
                self.items += 1;
                self.bytes += it.nbytes() as u64;
                return Ok(Some(it));
            }
            if self.finished || self.failed {
                return Ok(None);
            }
            // A busy consumer rarely waits (where `idle` checks): look at the supervisor here too.
            if self.last_check.elapsed() > Duration::from_millis(20) {
                self.last_check = Instant::now();
                if let Some(e) = self.shared.take_primary() {
                    return Err(self.fail(e));
                }
            }
            let Some(inputs) = self.inputs.as_mut() else {
                return Ok(None);
            };
            let shared = Arc::clone(&self.shared);
            let ctrl_c = self.ctrl_c;
            let mut idle = || -> Result<(), Error> {
                if ctrl_c && interrupt_flag(false).load(Ordering::Relaxed) {
                    return Err(Error::Interrupted);
                }
                // Only primary failures here: a secondary one (a child that lost a peer) may
                // race with the error report that explains it, which is still in a ring.
                match shared.take_primary() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            };
            match inputs.next(&mut idle) {
                Ok(Some((_, frames))) => self.handle(frames)?,
                Ok(None) => {
                    self.finished = true;
                    if let Some(r) = self.reorder.as_mut() {
                        r.flush(&mut self.ready);
                    }
                }
                Err(NextError::Idle(e)) => return Err(self.fail(e)),
                Err(NextError::Input(i, e)) => {
                    // A lost connection is usually the consequence of a dead process: give the
                    // supervisor a moment to name it.
                    let deadline = Instant::now() + Duration::from_millis(500);
                    let err = loop {
                        self.shared.poll_children();
                        if let Some(err) = self.shared.take_primary() {
                            break err;
                        }
                        if Instant::now() > deadline {
                            let last = self.plan.stages.len() - 1;
                            break self.shared.take_secondary().unwrap_or_else(|| {
                                Error::Transport(format!(
                                    "connection from worker {i} (stage {last}): {e}"
                                ))
                            });
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    };
                    return Err(self.fail(err));
                }
            }
        }
    }

    fn handle(&mut self, frames: Vec<Frame>) -> Result<(), Error> {
        for f in frames {
            match (f, self.reorder.as_mut()) {
                (Frame::Item { item, .. }, None) => self.ready.push_back(item),
                (Frame::Item { e, k, last, item }, Some(r)) => r.add(e, k, Some(item), last),
                (Frame::GroupEnd { e, k }, Some(r)) => r.add(e, k, None, true),
                (Frame::EmitterDone { e, n }, Some(r)) => {
                    if let Some(c) = r.counts.get_mut(e as usize) {
                        *c = Some(n);
                    }
                }
                (Frame::Eos(s), _) => self.stats.merge(&s),
                (Frame::Error(rep), _) => return Err(self.fail(rep.into())),
                _ => {}
            }
        }
        if let Some(r) = self.reorder.as_mut() {
            r.release(&mut self.ready);
        }
        Ok(())
    }

    /// Marks the pipeline failed and stops its processes; returns `e`.
    fn fail(&mut self, e: Error) -> Error {
        self.failed = true;
        self.ready.clear();
        self.teardown();
        e
    }

    /// Endless mode ([`Epochs::Cycle`]): the next `n` outputs, one training epoch.
    pub fn take_epoch(&mut self, n: usize) -> std::iter::Take<&mut Pipeline> {
        self.by_ref().take(n)
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        let (hit, miss) = self
            .inputs
            .as_ref()
            .map_or((0, 0), |i| (i.ready_polls, i.empty_polls));
        Metrics {
            items: self.items,
            bytes: self.bytes,
            elapsed: self.started.elapsed(),
            steps: self
                .stats
                .steps
                .iter()
                .map(|(n, c, ns)| (n.clone(), *c, Duration::from_nanos(*ns)))
                .collect(),
            queue_occupancy: if hit + miss == 0 {
                0.0
            } else {
                hit as f64 / (hit + miss) as f64
            },
            arrays_zero_copy: self.stats.zero_copy,
            arrays_copied: self.stats.copied,
            skipped_records: self.stats.skipped,
        }
    }

    /// Whether the end of stream was reached.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Stops every process and removes every segment (also done by `Drop`).
    fn teardown(&mut self) {
        if let Some(f) = self.feeder.as_mut() {
            f.tx = None;
        }
        self.inputs = None;
        let grace = if self.finished {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        self.shared.stop_children(grace);
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
        if let Some(h) = self.feeder.as_mut().and_then(|f| f.handle.take()) {
            let _ = h.join();
        }
        if self.plan.transport == TransportKind::Shm {
            process::unlink_segments(&self.plan.all_connections());
        }
    }
}

impl Iterator for Pipeline {
    type Item = Result<Item, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        self.dequeue().transpose()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: i64) -> Item {
        Item::new().with_i64("n", n)
    }

    #[test]
    fn reorder_releases_groups_in_k_then_e_order_and_skips_ended_emitters() {
        let mut r = Reorder::new(2);
        let mut ready = VecDeque::new();
        // Emitter 1 has one record, emitter 0 has three; groups arrive out of order.
        r.add(0, 1, Some(item(10)), false);
        r.add(0, 1, Some(item(11)), true);
        r.add(1, 0, None, true); // record (e=1, k=0) had no outputs
        r.release(&mut ready);
        assert!(ready.is_empty(), "(k=0, e=0) is still missing");
        r.add(0, 0, Some(item(0)), true);
        r.release(&mut ready);
        // (0,0), then the empty group (0,1), then (1,0); (1,1) is unknown yet.
        let ns = |ready: &VecDeque<Item>| {
            ready
                .iter()
                .map(|i| i.i64("n").unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(ns(&ready), vec![0, 10, 11]);
        r.add(0, 2, Some(item(20)), true);
        r.release(&mut ready);
        assert_eq!(ready.len(), 3, "(k=1, e=1) may still come");
        // Emitter 1 ended after one record: (k=1, e=1) is skipped.
        r.counts[1] = Some(1);
        r.release(&mut ready);
        assert_eq!(ns(&ready), vec![0, 10, 11, 20]);
        r.counts[0] = Some(3);
        r.release(&mut ready);
        assert_eq!(ready.len(), 4);
        assert!(r.groups.is_empty());
    }
}
