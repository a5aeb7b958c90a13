//! `workers(0)`: the steps run in the consumer's own thread, inside
//! [`Pipeline::dequeue`](crate::Pipeline::dequeue), one enqueued item at a time. For
//! debugging (a debugger's breakpoint in a step just works) and for tests: the outputs, their
//! order and the item seeds are those of the ordered mode with any number of workers, and a
//! failing step is the same [`Error::Step`](crate::Error::Step) (worker 0, stage 0).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::chain::Chain;
use crate::error::Error;
use crate::input::{Feed, InputState};
use crate::item::Item;
use crate::node::Plan;
use crate::ready::Ready;
use crate::step::Registry;

/// The steps of an in-process pipeline and its input.
pub(crate) struct Inline {
    chain: Chain,
    rx: Receiver<Feed>,
    /// The input's counts of queued items and bytes: taken off here, as the input thread
    /// does with workers (else they only grow and a caller bounding them stops feeding).
    state: Arc<InputState>,
    /// Index of the next enqueued item.
    k: u64,
}

/// How long one wait for input lasts before Ctrl-C and the deadline are looked at again.
const SLICE: Duration = Duration::from_millis(50);

/// What [`Inline::next`] did.
pub(crate) enum Progress {
    /// An input went through the steps: its outputs are in `ready`.
    Input,
    /// The input was closed: the outputs of `finish` are in `ready`; nothing follows.
    End,
}

impl Inline {
    fn run(&mut self, item: Item, ready: &mut Ready, out: &mut Vec<Item>) -> Result<(), Error> {
        let k = self.k;
        self.k += 1;
        let input = || format!("emitter 0, record {k}");
        self.chain.run(item, (0, k), &input, out)?;
        ready.extend(out.drain(..));
        ready.end_group();
        Ok(())
    }

    pub(crate) fn new(
        reg: &Registry,
        plan: &Plan,
        rx: Receiver<Feed>,
        state: Arc<InputState>,
    ) -> Result<Inline, Error> {
        let steps: Vec<_> = plan.stages.iter().flat_map(|s| s.steps.clone()).collect();
        let chain = Chain::build(reg, plan, &steps, 0, 0, 1)?;
        Ok(Inline {
            chain,
            rx,
            state,
            k: 0,
        })
    }

    /// Waits (until `deadline`) for the next enqueued item and runs it through the steps.
    /// `interrupted`: checked between waits (Ctrl-C).
    ///
    /// # Errors
    /// [`Error::Timeout`] at the deadline (nothing is lost), the step's failure, or what
    /// `interrupted` returns.
    pub(crate) fn next(
        &mut self,
        ready: &mut Ready,
        deadline: Option<Instant>,
        interrupted: &dyn Fn() -> Option<Error>,
    ) -> Result<Progress, Error> {
        let feed = loop {
            if let Some(e) = interrupted() {
                return Err(e);
            }
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            match self.rx.recv_timeout(slice) {
                Ok(f) => break f,
                // Every input handle is gone: it closed when it was dropped.
                Err(RecvTimeoutError::Disconnected) => break Feed::Close,
                Err(RecvTimeoutError::Timeout) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout);
                    }
                }
            }
        };
        let mut out = Vec::new();
        match feed {
            Feed::Item(item) => {
                self.state.dequeued(item.nbytes());
                self.run(item, ready, &mut out)?;
                Ok(Progress::Input)
            }
            Feed::Items(items) => {
                // One input at a time, as enqueued: a failure leaves the outputs of the
                // inputs before it in `ready`.
                for item in &items {
                    self.state.dequeued(item.nbytes());
                }
                for item in items {
                    self.run(item, ready, &mut out)?;
                }
                Ok(Progress::Input)
            }
            Feed::Close => {
                self.chain.finish(&mut out)?;
                ready.extend(out);
                Ok(Progress::End)
            }
        }
    }
}
