//! The input side of enqueue mode: the [`Input`] handle (its drop closes the input) and the
//! parent's input thread that batches enqueued items to the first stage.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::credit::Gate;
use crate::error::Error;
use crate::item::Item;
use crate::node::Outputs;
use crate::wire::{Frame, Stats, TransportError};

// An item is a few hundred bytes (its fields inline); boxing it would cost an allocation
// per item.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Feed {
    Item(Item),
    Items(Vec<Item>),
    Close,
}

/// What the consumer knows of the input side (enqueue mode), for the idle warning.
#[derive(Debug)]
pub(crate) struct InputState {
    /// The input was closed (by `close_input` or by dropping the [`Input`]).
    pub(crate) closed: AtomicBool,
    /// When an item was last enqueued, in milliseconds since `epoch`.
    pub(crate) last_send_ms: AtomicU64,
    pub(crate) epoch: Instant,
    /// Why the input thread stopped, and when (it is not taken: every caller sees it).
    pub(crate) failure: Mutex<Option<(Instant, String)>>,
    /// The process that started the pipeline (the input thread runs there only).
    pub(crate) owner: shm_ring::Owner,
    /// Items sent with [`Input::send`] that the input thread has not yet handed to a channel,
    /// and their array bytes (see [`Input::queued_items`]).
    queued_items: AtomicUsize,
    queued_bytes: AtomicUsize,
}

impl InputState {
    pub(crate) fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_send_ms.store(ms, Ordering::Relaxed);
    }
    pub(crate) fn failure(&self) -> Option<(Instant, String)> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// The input thread (or, with `workers(0)`, the consumer) took an item of `bytes` array
    /// bytes off the queue.
    pub(crate) fn dequeued(&self, bytes: usize) {
        self.queued_items.fetch_sub(1, Ordering::Relaxed);
        self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
    pub(crate) fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_send_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// The input of a pipeline in enqueue mode, from [`Pipeline::input`](crate::Pipeline::input): send items with
/// [`Input::send`]; dropping it (or [`Input::close`]) closes the input, like dropping a
/// channel's sender, and the consumer's stream then ends after the outputs of every item
/// sent. It can be moved to another thread.
///
/// # Examples
/// ```no_run
/// use shmpipe::{map, Item, Pipeline, Registry};
/// let reg = Registry::new().step("inc", |_| Ok(map(|it: Item| {
///     let n = it.i64("n").unwrap_or(0);
///     Ok(it.with_meta("n", n + 1))
/// })));
/// shmpipe::init(&reg);
/// let mut p = Pipeline::builder(&reg).step("inc").start()?;
/// let mut input = p.input()?;
/// std::thread::spawn(move || {
///     for n in 0..10 {
///         input.send(Item::new().with_meta("n", n)).unwrap();
///     } // `input` is dropped here: end of input
/// });
/// assert_eq!(p.count(), 10);
/// # Ok::<(), shmpipe::Error>(())
/// ```
#[derive(Debug)]
pub struct Input {
    tx: mpsc::Sender<Feed>,
    state: Arc<InputState>,
}

impl Input {
    /// Feeds one item. Never blocks.
    ///
    /// # Errors
    /// What stopped the pipeline's input thread (e.g. an item too large for the channel, or
    /// the pipeline is gone); [`Error::Forked`] in a forked child (the input thread runs in
    /// the process that started the pipeline only).
    pub fn send(&mut self, item: Item) -> Result<(), Error> {
        if !self.state.owner.is_current() {
            return Err(Error::Forked {
                owner: self.state.owner.pid(),
                caller: std::process::id(),
            });
        }
        self.state.touch();
        let bytes = item.nbytes();
        self.state.queued_items.fetch_add(1, Ordering::Relaxed);
        self.state.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.tx.send(Feed::Item(item)).map_err(|_| {
            self.state.dequeued(bytes);
            match self.state.failure() {
                Some((_, m)) => Error::transport(format!("enqueue: {m}")),
                None => Error::Closed("the pipeline's input thread stopped".into()),
            }
        })
    }

    /// Feeds several items at once. Never blocks. The same as [`send`](Input::send) for each,
    /// with one hand-over to the input thread (one wake-up of it, not one per item).
    ///
    /// # Errors
    /// As [`send`](Input::send).
    pub fn send_batch(&mut self, items: Vec<Item>) -> Result<(), Error> {
        if !self.state.owner.is_current() {
            return Err(Error::Forked {
                owner: self.state.owner.pid(),
                caller: std::process::id(),
            });
        }
        if items.is_empty() {
            return Ok(());
        }
        self.state.touch();
        let (n, bytes) = (items.len(), items.iter().map(Item::nbytes).sum::<usize>());
        self.state.queued_items.fetch_add(n, Ordering::Relaxed);
        self.state.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.tx.send(Feed::Items(items)).map_err(|_| {
            self.state.queued_items.fetch_sub(n, Ordering::Relaxed);
            self.state.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            match self.state.failure() {
                Some((_, m)) => Error::transport(format!("enqueue: {m}")),
                None => Error::Closed("the pipeline's input thread stopped".into()),
            }
        })
    }

    /// Items sent that the pipeline's input thread has not yet handed to a worker's channel.
    /// `send` never blocks, so a caller that reads its items from somewhere (a generator, a
    /// file) keeps this small to stream them with back-pressure: channels that are full stop
    /// the input thread, and the queue in front of it then grows.
    ///
    /// # Examples
    /// ```no_run
    /// use shmpipe::{map, Item, Pipeline, Registry};
    /// let reg = Registry::new().step("id", |_| Ok(map(|it: Item| Ok(it))));
    /// shmpipe::init(&reg);
    /// let mut p = Pipeline::builder(&reg).step("id").start()?;
    /// let mut input = p.input()?;
    /// let mut source = (0..1_000_000).map(|n| Item::new().with_meta("n", n));
    /// let mut seen = 0;
    /// loop {
    ///     while input.queued_items() < 256 {
    ///         match source.next() {
    ///             Some(it) => input.send(it)?,
    ///             None => break,
    ///         }
    ///     }
    ///     if input.queued_items() < 256 {
    ///         break; // the source is exhausted
    ///     }
    ///     // Consume outputs meanwhile (here: one).
    ///     seen += p.next().transpose()?.map_or(0, |_| 1);
    /// }
    /// drop(input);
    /// seen += p.count();
    /// assert_eq!(seen, 1_000_000);
    /// # Ok::<(), shmpipe::Error>(())
    /// ```
    pub fn queued_items(&self) -> usize {
        self.state.queued_items.load(Ordering::Relaxed)
    }

    /// Array bytes of the [`queued_items`](Input::queued_items).
    pub fn queued_bytes(&self) -> usize {
        self.state.queued_bytes.load(Ordering::Relaxed)
    }

    /// Closes the input (the same as dropping it).
    pub fn close(self) {}
}

impl Drop for Input {
    fn drop(&mut self) {
        self.state.closed.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Feed::Close);
    }
}

/// Enqueue mode: a thread of the parent that batches enqueued items to the workers.
pub(crate) struct Feeder {
    /// The pipeline's own input, until [`Pipeline::input`] hands it out or the input closes.
    pub(crate) input: Option<Input>,
    pub(crate) state: Arc<InputState>,
    pub(crate) handle: Option<JoinHandle<()>>,
    /// Raised at teardown: a send blocked on a full channel gives up.
    pub(crate) cancel: Arc<AtomicBool>,
}

impl Feeder {
    /// A feeder without a thread: whoever holds the returned receiver takes the items
    /// (`workers(0)`: the consumer runs the steps itself).
    pub(crate) fn inline(cancel: Arc<AtomicBool>) -> (Feeder, mpsc::Receiver<Feed>) {
        let (tx, rx) = mpsc::channel::<Feed>();
        let state = Arc::new(InputState {
            closed: AtomicBool::new(false),
            last_send_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            failure: Mutex::new(None),
            owner: shm_ring::Owner::current(),
            queued_items: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
        });
        let input = Input {
            tx,
            state: Arc::clone(&state),
        };
        let f = Feeder {
            input: Some(input),
            state,
            handle: None,
            cancel,
        };
        (f, rx)
    }

    /// `gate` (ordered mode): the consumer's grant, waited for before each item goes out, as
    /// an emitter does.
    pub(crate) fn start(
        out: Outputs,
        workers: usize,
        cancel: Arc<AtomicBool>,
        gate: Option<Arc<Gate>>,
    ) -> Feeder {
        let (mut f, rx) = Feeder::inline(cancel);
        let mut thread = FeedThread {
            out,
            workers,
            stop: Arc::clone(&f.cancel),
            st: Arc::clone(&f.state),
            gate,
            k: 0,
        };
        let handle = std::thread::spawn(move || {
            if let Err(e) = thread.run(&rx)
                && !thread.stop.load(Ordering::Relaxed)
            {
                let mut f = thread.st.failure.lock().unwrap_or_else(|e| e.into_inner());
                f.get_or_insert((Instant::now(), e.to_string()));
            }
        });
        f.handle = Some(handle);
        f
    }
}

/// The feeder thread's state: where items go and how many went.
struct FeedThread {
    out: Outputs,
    workers: usize,
    /// Raised at teardown.
    stop: Arc<AtomicBool>,
    st: Arc<InputState>,
    /// Ordered mode: the consumer's grant.
    gate: Option<Arc<Gate>>,
    /// Items sent so far (the next item's `k`).
    k: u64,
}

impl FeedThread {
    /// Sends what comes from `rx` until the input closes (then the end of stream), the
    /// pipeline stops, or a send fails.
    fn run(&mut self, rx: &mpsc::Receiver<Feed>) -> Result<(), TransportError> {
        loop {
            let Some(msg) = next_feed(rx, &mut self.out, &self.stop)? else {
                return Ok(());
            };
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            match msg {
                Feed::Item(item) => {
                    if !self.push(item)? {
                        return Ok(());
                    }
                }
                Feed::Items(items) => {
                    let mut items = items.into_iter();
                    for item in items.by_ref() {
                        match self.push(item) {
                            Ok(true) => {}
                            r => {
                                // What was not sent is no longer queued.
                                for it in items {
                                    self.st.dequeued(it.nbytes());
                                }
                                return r.map(|_| ());
                            }
                        }
                    }
                }
                Feed::Close => {
                    let k = self.k;
                    self.out.broadcast(&Frame::EmitterDone { e: 0, n: k })?;
                    self.out.broadcast(&Frame::Eos(Stats::default()))?;
                    return self.out.flush_all();
                }
            }
        }
    }

    /// Sends one item; `Ok(false)`: the pipeline is stopping (nothing sent).
    fn push(&mut self, item: Item) -> Result<bool, TransportError> {
        if let Some(g) = &self.gate {
            while !g.allows(self.k) {
                // What was sent must reach the consumer, whose grants follow what it delivers.
                self.out.flush_all()?;
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                g.park();
            }
        }
        let bytes = item.nbytes();
        let k = self.k;
        let sent = self.out.push(
            (k % self.workers as u64) as usize,
            Frame::Item {
                e: 0,
                k,
                last: true,
                item,
            },
        );
        self.st.dequeued(bytes);
        self.k += 1;
        sent.map(|()| true)
    }
}

/// The next message for the feeder thread. With none queued, what was sent goes out first
/// (the consumer may be waiting for it), then the wait is in steps of 100 ms so that a stop
/// is seen. `None`: the input is gone or the pipeline is stopping.
fn next_feed(
    rx: &mpsc::Receiver<Feed>,
    out: &mut Outputs,
    stop: &AtomicBool,
) -> Result<Option<Feed>, TransportError> {
    match rx.try_recv() {
        Ok(m) => Ok(Some(m)),
        Err(mpsc::TryRecvError::Empty) => {
            out.flush_all()?;
            loop {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => return Ok(Some(m)),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(None);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
                }
            }
        }
        Err(mpsc::TryRecvError::Disconnected) => Ok(None),
    }
}
