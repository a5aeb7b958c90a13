//! The plan every process of a pipeline shares (sent to each child as JSON in its
//! environment), the roles of the children, their exit codes, and the channel geometry.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shm_ring::Transfer;

use crate::config::{Epochs, OnBadRecord};
use crate::jsonl::JsonLines;
use crate::shuffle::derive_seed;
use crate::wire::Report;

/// Which transport carries the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TransportKind {
    /// `shm-ring` shared-memory rings (the default).
    #[default]
    Shm,
    /// Unix stream sockets (socket pairs handed over by descriptor). Slower; a reference.
    Socket,
}

/// `Transfer` (shm-ring's) in the plan's JSON.
mod transfer_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    enum T {
        Copy,
        ZeroCopy,
        Adaptive { threshold: usize },
    }

    pub(super) fn serialize<S: Serializer>(t: &super::Transfer, s: S) -> Result<S::Ok, S::Error> {
        match *t {
            super::Transfer::Copy => T::Copy,
            super::Transfer::ZeroCopy => T::ZeroCopy,
            super::Transfer::Adaptive { threshold } => T::Adaptive { threshold },
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<super::Transfer, D::Error> {
        Ok(match T::deserialize(d)? {
            T::Copy => super::Transfer::Copy,
            T::ZeroCopy => super::Transfer::ZeroCopy,
            T::Adaptive { threshold } => super::Transfer::Adaptive { threshold },
        })
    }
}

/// Exit code of a child that completed.
pub(crate) const EXIT_OK: i32 = 0;
/// Exit code of a child that reported a failure downstream (the consumer has the details).
pub(crate) const EXIT_REPORTED: i32 = 2;
/// Exit code of a child that could not set itself up (details on stderr).
pub(crate) const EXIT_SETUP: i32 = 3;
/// Exit code of a child that lost a peer (a consequence of another failure).
pub(crate) const EXIT_PEER_LOST: i32 = 4;
/// Exit code of a child whose parent died.
pub(crate) const EXIT_ORPHAN: i32 = 5;
/// Exit code of a child told to stop (a deliberate shutdown by the parent).
pub(crate) const EXIT_STOPPED: i32 = 6;

/// How long the start-up hand-over of channels may take, in the parent and in each child.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the records come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum SourceSpec {
    JsonLines(JsonLines),
    Named {
        name: String,
        args: serde_json::Value,
    },
}

/// One stage: the steps each of its workers runs, in order, and its worker count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StagePlan {
    pub steps: Vec<(String, serde_json::Value)>,
    pub workers: usize,
}

/// Shared-memory channel geometry of a pipeline ([`PipelineBuilder::channel`]).
///
/// [`PipelineBuilder::channel`]: crate::PipelineBuilder::channel
///
/// ```
/// use shmpipe::ChannelGeometry;
/// let g = ChannelGeometry { blocks: 4, block_size: 8 << 20, ..ChannelGeometry::default() };
/// assert_eq!(g.slots, 0); // sized from the batch size
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelGeometry {
    /// Descriptor ring slots of 64 bytes (a power of two); 0 (the default): room for eight
    /// batches, so a batch of up to twice `batch_bytes` travels inline in the ring (shm-ring
    /// keeps a message inline up to a quarter of the ring) and small items never take a
    /// pool block.
    pub slots: u32,
    /// Payload pool blocks: one per zero-copy array or per batch too large for the ring.
    pub blocks: u32,
    /// Bytes per pool block: arrays up to this size (and batches too large for the ring) go
    /// into blocks, whose pages stay reserved once used.
    pub block_size: usize,
    /// Address space for arrays and batches larger than a block (shm-ring's
    /// [`ChannelConfig::large_pool`](shm_ring::ChannelConfig::large_pool)): each goes
    /// zero-copy into an extent of its own size, whose pages are reserved while large items
    /// keep coming and given back after. Default [`shm_ring::machine_large_pool`] (twice the
    /// machine's memory: items of any size it can hold travel). 0: none, so every array must
    /// fit a block (and a larger one is an error naming this setting).
    pub large_pool: usize,
}

impl Default for ChannelGeometry {
    fn default() -> Self {
        ChannelGeometry {
            slots: 0,
            blocks: 8,
            block_size: 1 << 20,
            large_pool: shm_ring::machine_large_pool(),
        }
    }
}

/// Everything a process of the pipeline needs to know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub id: String,
    pub parent: u32,
    pub emitters: usize,
    /// `None`: enqueue mode, the parent is emitter 0.
    pub source: Option<SourceSpec>,
    pub stages: Vec<StagePlan>,
    pub ordered: bool,
    /// Ordered mode: records an emitter may run ahead of the consumer, at most (see
    /// [`crate::credit`]).
    pub reorder_window: u64,
    pub batch_bytes: usize,
    #[serde(with = "transfer_serde")]
    pub transfer: Transfer,
    pub transport: TransportKind,
    pub channel: ChannelGeometry,
    pub seed: u64,
    pub shuffle: bool,
    pub shuffle_buffer: usize,
    pub epochs: Epochs,
    pub rank: usize,
    pub world_size: usize,
    pub on_bad_record: OnBadRecord,
    /// The consumer keeps zero-copy arrays in shared memory.
    pub lease: bool,
}

/// What a child process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    Emitter(usize),
    Worker { stage: usize, worker: usize },
}

impl Role {
    pub(crate) fn describe(self) -> String {
        match self {
            Role::Emitter(e) => format!("emitter {e}"),
            Role::Worker { stage, worker } => format!("worker {worker} (stage {stage})"),
        }
    }
}

impl Role {
    /// How the child names itself on stderr: role and pid.
    pub(crate) fn log_name(self) -> String {
        let pid = std::process::id();
        match self {
            Role::Emitter(e) => format!("emitter {e} (pid {pid})"),
            Role::Worker { stage, worker } => {
                format!("worker {worker} of stage {stage} (pid {pid})")
            }
        }
    }
}

/// The env var payload of a child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    pub plan: Plan,
    pub role: Role,
    /// The inherited descriptor of the child's end of its control socket.
    pub ctrl_fd: i32,
    /// The shared descriptors ([`crate::SharedFd`] tokens) this child receives in its
    /// `SHARED` message, in that order: those its own arguments name.
    pub shared: Vec<u64>,
}

impl Plan {
    /// Number of producers feeding each worker of stage `stage`.
    pub(crate) fn upstream_count(&self, stage: usize) -> usize {
        if stage == 0 {
            self.emitters
        } else {
            self.stages[stage - 1].workers
        }
    }
    /// Number of connections of the pipeline.
    /// Processes that move data: emitters, every worker of every stage, and the consumer.
    pub(crate) fn process_count(&self) -> usize {
        self.emitters + self.stages.iter().map(|s| s.workers).sum::<usize>() + 1
    }
    pub(crate) fn connection_count(&self) -> usize {
        let mut n = 0;
        for s in 0..self.stages.len() {
            n += self.stages[s].workers * self.upstream_count(s);
        }
        n + self.stages.last().map_or(0, |s| s.workers)
    }
    /// Number of connections a role creates (as the producer), in downstream order.
    pub(crate) fn outputs_of(&self, role: Role) -> usize {
        match role {
            Role::Emitter(_) => self.stages[0].workers,
            Role::Worker { stage, .. } if stage + 1 == self.stages.len() => 1,
            Role::Worker { stage, .. } => self.stages[stage + 1].workers,
        }
    }
    /// Number of connections a role consumes, in upstream order.
    pub(crate) fn inputs_of(&self, role: Role) -> usize {
        match role {
            Role::Emitter(_) => 0,
            Role::Worker { stage, .. } => self.upstream_count(stage),
        }
    }
    /// Checks the indices of an error report a worker sent against this plan: the stage,
    /// worker and emitter it names must exist (a hostile or broken worker could otherwise
    /// blame one that does not, review 18, hole 4). `Err` says what is wrong.
    pub(crate) fn check_report(&self, r: &Report) -> Result<(), String> {
        let emitter_ok = |e: usize| {
            (e < self.emitters).then_some(()).ok_or_else(|| {
                format!(
                    "an error report naming emitter {e}, which does not exist ({} emitters)",
                    self.emitters
                )
            })
        };
        match r {
            Report::Step {
                stage,
                worker,
                emitter,
                ..
            } => {
                let Some(s) = self.stages.get(*stage) else {
                    return Err(format!(
                        "an error report naming stage {stage}, which does not exist ({} stages)",
                        self.stages.len()
                    ));
                };
                if *worker >= s.workers {
                    return Err(format!(
                        "an error report naming worker {worker} of stage {stage}, which does \
                         not exist ({} workers)",
                        s.workers
                    ));
                }
                emitter.map_or(Ok(()), emitter_ok)
            }
            Report::Source { emitter, .. } => emitter_ok(*emitter),
            Report::Other { .. } | Report::TooLarge { .. } => Ok(()),
        }
    }
    /// Which worker of stage `stage + 1` gets the outputs of record `(e, k)` after `stage`.
    pub(crate) fn route(&self, stage: usize, e: u32, k: u64) -> usize {
        if stage + 1 == self.stages.len() {
            return 0;
        }
        let n = self.stages[stage + 1].workers as u64;
        (derive_seed(&[stage as u64, u64::from(e), k]) % n) as usize
    }
}
