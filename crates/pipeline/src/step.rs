//! Steps (flat-maps), closure adapters and the registry of steps and sources by name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::item::Item;
use crate::source::{Source, SourceContext, SourceError};

/// A pipeline step: a flat-map from one input item to 0..n output items.
///
/// Each worker process builds its own instance from the registered factory, so any state
/// a step keeps (counters, random generators, caches) is per-worker state.
///
/// # Examples
/// ```
/// use shmpipe::{Item, Step, StepError};
/// struct Repeat(usize);
/// impl Step for Repeat {
///     fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
///         out.extend(std::iter::repeat_n(item, self.0));
///         Ok(())
///     }
/// }
/// let mut out = Vec::new();
/// Repeat(3).process(Item::new(), &mut out).unwrap();
/// assert_eq!(out.len(), 3);
/// ```
pub trait Step: Send + 'static {
    /// Processes one input; pushes its outputs (zero or more) to `out`.
    ///
    /// # Errors
    /// A [`StepError`] stops the pipeline; the consumer gets
    /// [`Error::Step`](crate::Error::Step) naming the step, the worker and the input.
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError>;

    /// End of stream: pushes whatever the step still holds (e.g. a last partial batch) to
    /// `out`. The default does nothing.
    ///
    /// Called once per worker, after the worker has received end of stream from all its
    /// inputs and processed everything, and before it sends its own end of stream. The
    /// outputs go downstream like any other: in the fused topology they pass through the
    /// later steps of the worker (each step is finished after the outputs of the earlier
    /// steps' `finish` went through it). Never called in an endless run
    /// ([`Epochs::Cycle`](crate::Epochs::Cycle)) or after a failure.
    ///
    /// Outputs of `finish` belong to no input: in the ordered mode they are delivered after
    /// every group of outputs of the inputs; in the staged topology they all go to one worker
    /// of the next stage (where a step that buffers them may emit them with the outputs of a
    /// later input, which then own them).
    ///
    /// # Errors
    /// Like [`process`](Step::process): the consumer gets [`Error::Step`](crate::Error::Step)
    /// naming the step and the worker, with input `"end of stream"`.
    ///
    /// # Examples
    /// ```
    /// use shmpipe::{Item, Step, StepError};
    /// /// Emits items in pairs; a last odd item is flushed at the end.
    /// struct Pairs(Vec<Item>);
    /// impl Step for Pairs {
    ///     fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
    ///         self.0.push(item);
    ///         if self.0.len() == 2 {
    ///             out.append(&mut self.0);
    ///         }
    ///         Ok(())
    ///     }
    ///     fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
    ///         out.append(&mut self.0);
    ///         Ok(())
    ///     }
    /// }
    /// let mut s = Pairs(Vec::new());
    /// let mut out = Vec::new();
    /// for _ in 0..3 {
    ///     s.process(Item::new(), &mut out).unwrap();
    /// }
    /// assert_eq!(out.len(), 2);
    /// s.finish(&mut out).unwrap();
    /// assert_eq!(out.len(), 3);
    /// ```
    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        let _ = out;
        Ok(())
    }

    /// Processes a run of inputs in one call: the items of one received batch. Takes every
    /// item out of `items` (leaving it empty) and, for each input in order, pushes its outputs
    /// to `out` and then `out.len()` to `ends`: the outputs of input `i` are
    /// `out[ends[i - 1]..ends[i]]` (from `out`'s length on entry for the first input).
    ///
    /// The default calls [`process`](Step::process) once per input. Override it when a call
    /// has a fixed cost worth sharing across a batch, e.g. entering an interpreter (the Python
    /// binding's steps take the interpreter lock once per batch, not once per item).
    ///
    /// # Errors
    /// Like [`process`](Step::process). The failing input is `ends.len()` (counted from
    /// `ends`' length on entry): the inputs before it were processed and their ends pushed.
    ///
    /// # Examples
    /// ```
    /// use shmpipe::{flat_map, Item, Step};
    /// let mut twice = flat_map(|it: Item, out: &mut Vec<Item>| {
    ///     out.push(it.clone());
    ///     out.push(it);
    ///     Ok(())
    /// });
    /// let (mut items, mut out, mut ends) = (vec![Item::new(), Item::new()], Vec::new(), Vec::new());
    /// twice.process_batch(&mut items, &mut out, &mut ends).unwrap();
    /// assert!(items.is_empty());
    /// assert_eq!((out.len(), ends), (4, vec![2, 4]));
    /// ```
    fn process_batch(
        &mut self,
        items: &mut Vec<Item>,
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), StepError> {
        for (i, it) in items.drain(..).enumerate() {
            crate::seed::select_input(i, 0);
            self.process(it, out)?;
            ends.push(out.len());
        }
        Ok(())
    }
}

impl Step for Box<dyn Step> {
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        (**self).process(item, out)
    }

    fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), StepError> {
        (**self).finish(out)
    }

    fn process_batch(
        &mut self,
        items: &mut Vec<Item>,
        out: &mut Vec<Item>,
        ends: &mut Vec<usize>,
    ) -> Result<(), StepError> {
        (**self).process_batch(items, out, ends)
    }
}

/// The error a step returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    message: String,
    /// The name the failure is reported under, when it is not the step's registry name
    /// (a step that runs several user functions names the one that failed).
    step: Option<String>,
}

impl StepError {
    /// An error with this message.
    ///
    /// # Examples
    /// ```
    /// let e = shmpipe::StepError::new("negative length");
    /// assert_eq!(e.to_string(), "negative length");
    /// ```
    pub fn new(message: impl fmt::Display) -> StepError {
        StepError {
            message: message.to_string(),
            step: None,
        }
    }

    /// An error reported as a failure of `step` rather than of the step's registry name:
    /// [`Error::Step::step`](crate::Error::Step) is then `step` (e.g. one of the user
    /// functions a step runs).
    ///
    /// # Examples
    /// ```
    /// let e = shmpipe::StepError::in_step("normalise", "negative length");
    /// assert_eq!((e.step(), e.message()), (Some("normalise"), "negative length"));
    /// ```
    pub fn in_step(step: impl Into<String>, message: impl fmt::Display) -> StepError {
        StepError {
            message: message.to_string(),
            step: Some(step.into()),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The name the failure is reported under, if not the step's own ([`StepError::in_step`]).
    pub fn step(&self) -> Option<&str> {
        self.step.as_deref()
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StepError {}

/// A step from a closure mapping one item to exactly one item. Built by [`map`].
pub struct Map<F>(F);
/// A step from a predicate keeping items for which it returns `true`. Built by [`filter`].
pub struct Filter<F>(F);
/// A step from a flat-map closure. Built by [`flat_map`].
pub struct FlatMap<F>(F);

macro_rules! opaque_debug {
    ($($t:ident),*) => {$(
        impl<F> fmt::Debug for $t<F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($t))
            }
        }
    )*};
}
opaque_debug!(Map, Filter, FlatMap);

/// A step mapping each item to one item.
///
/// # Examples
/// ```
/// use shmpipe::{map, Item, Step};
/// let mut s = map(|it: Item| Ok(it.with_meta("seen", 1)));
/// let mut out = Vec::new();
/// s.process(Item::new(), &mut out).unwrap();
/// assert_eq!(out[0].i64("seen"), Some(1));
/// ```
pub fn map<F>(f: F) -> Map<F>
where
    F: FnMut(Item) -> Result<Item, StepError> + Send + 'static,
{
    Map(f)
}

/// A step keeping the items for which `f` returns `true`.
///
/// # Examples
/// ```
/// use shmpipe::{filter, Item, Step};
/// let mut s = filter(|it: &Item| it.i64("n") == Some(1));
/// let mut out = Vec::new();
/// s.process(Item::new().with_meta("n", 2), &mut out).unwrap();
/// s.process(Item::new().with_meta("n", 1), &mut out).unwrap();
/// assert_eq!(out.len(), 1);
/// ```
pub fn filter<F>(f: F) -> Filter<F>
where
    F: FnMut(&Item) -> bool + Send + 'static,
{
    Filter(f)
}

/// A step from a flat-map closure (0..n outputs per input).
///
/// # Examples
/// ```
/// use shmpipe::{flat_map, Item, Step};
/// let mut s = flat_map(|it: Item, out: &mut Vec<Item>| {
///     out.push(it.clone());
///     out.push(it);
///     Ok(())
/// });
/// let mut out = Vec::new();
/// s.process(Item::new(), &mut out).unwrap();
/// assert_eq!(out.len(), 2);
/// ```
pub fn flat_map<F>(f: F) -> FlatMap<F>
where
    F: FnMut(Item, &mut Vec<Item>) -> Result<(), StepError> + Send + 'static,
{
    FlatMap(f)
}

impl<F> Step for Map<F>
where
    F: FnMut(Item) -> Result<Item, StepError> + Send + 'static,
{
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        out.push((self.0)(item)?);
        Ok(())
    }
}

impl<F> Step for Filter<F>
where
    F: FnMut(&Item) -> bool + Send + 'static,
{
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        if (self.0)(&item) {
            out.push(item);
        }
        Ok(())
    }
}

impl<F> Step for FlatMap<F>
where
    F: FnMut(Item, &mut Vec<Item>) -> Result<(), StepError> + Send + 'static,
{
    fn process(&mut self, item: Item, out: &mut Vec<Item>) -> Result<(), StepError> {
        (self.0)(item, out)
    }
}

/// Where a step instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Stage index (always 0 in the fused topology).
    pub stage: usize,
    /// Worker index within its stage, `0..workers`.
    pub worker: usize,
    /// Number of workers in this stage.
    pub workers: usize,
    /// This job's rank (see [`PipelineBuilder::shard`](crate::PipelineBuilder::shard)).
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Seed for this worker, derived from `(seed, rank, stage, worker)`.
    pub seed: u64,
}

/// What a step factory gets.
#[derive(Debug)]
pub struct StepContext<'a> {
    /// Arguments given with [`PipelineBuilder::step_with`](crate::PipelineBuilder::step_with)
    /// (`null` otherwise).
    pub args: &'a serde_json::Value,
    /// Where the instance will run.
    pub worker: WorkerInfo,
}

impl StepContext<'_> {
    /// The descriptor shared under argument `key` (a [`SharedFd`](crate::SharedFd) handle
    /// from [`PipelineBuilder::share_fd`](crate::PipelineBuilder::share_fd)): a sealed memfd
    /// opened read-only, checked when this worker received it, open until the worker exits.
    ///
    /// # Errors
    /// When `args[key]` is not a handle, or outside a pipeline's worker.
    pub fn shared_fd(&self, key: &str) -> Result<std::os::fd::BorrowedFd<'static>, StepError> {
        crate::share::from_args(self.args, key).map_err(StepError::new)
    }
}

type StepFactory = Arc<dyn Fn(&StepContext<'_>) -> Result<Box<dyn Step>, StepError> + Send + Sync>;
type SourceFactory =
    Arc<dyn Fn(&SourceContext<'_>) -> Result<Box<dyn Source>, SourceError> + Send + Sync>;

/// Steps and sources registered by name.
///
/// The parent and every child process build the same registry (it is code, not data), and
/// the pipeline refers to steps by name across processes.
///
/// # Examples
/// ```
/// use shmpipe::{map, Item, Registry};
/// let reg = Registry::new().step("id", |_cx| Ok(map(|it: Item| Ok(it))));
/// assert!(reg.has_step("id"));
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    steps: BTreeMap<String, StepFactory>,
    sources: BTreeMap<String, SourceFactory>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("steps", &self.steps.keys().collect::<Vec<_>>())
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers step `name`; `factory` runs once in every worker that runs the step.
    pub fn step<S, F>(mut self, name: &str, factory: F) -> Registry
    where
        S: Step,
        F: Fn(&StepContext<'_>) -> Result<S, StepError> + Send + Sync + 'static,
    {
        let f: StepFactory = Arc::new(move |cx| factory(cx).map(|s| Box::new(s) as Box<dyn Step>));
        self.steps.insert(name.to_owned(), f);
        self
    }

    /// Registers source `name`; `factory` runs once in every emitter process.
    pub fn source<S, F>(mut self, name: &str, factory: F) -> Registry
    where
        S: Source + 'static,
        F: Fn(&SourceContext<'_>) -> Result<S, SourceError> + Send + Sync + 'static,
    {
        let f: SourceFactory =
            Arc::new(move |cx| factory(cx).map(|s| Box::new(s) as Box<dyn Source>));
        self.sources.insert(name.to_owned(), f);
        self
    }

    /// Whether step `name` is registered.
    pub fn has_step(&self, name: &str) -> bool {
        self.steps.contains_key(name)
    }

    /// Whether source `name` is registered.
    pub fn has_source(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }

    /// Builds an instance of step `name`.
    ///
    /// # Errors
    /// When the name is unknown or the factory fails.
    pub fn build_step(&self, name: &str, cx: &StepContext<'_>) -> Result<Box<dyn Step>, StepError> {
        let f = self
            .steps
            .get(name)
            .ok_or_else(|| StepError::new(format!("no step named {name:?} is registered")))?;
        f(cx)
    }

    /// Builds source `name`.
    ///
    /// # Errors
    /// When the name is unknown or the factory fails.
    pub fn build_source(
        &self,
        name: &str,
        cx: &SourceContext<'_>,
    ) -> Result<Box<dyn Source>, SourceError> {
        let f = self
            .sources
            .get(name)
            .ok_or_else(|| SourceError::Other(format!("no source named {name:?} is registered")))?;
        f(cx)
    }
}
