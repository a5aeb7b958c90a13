//! iceoryx2 peers (cargo feature `iceoryx2`): one publish-subscribe service per direction
//! (`<name>-ping`, `<name>-pong`) with an `[f32]` slice payload of 16 elements, loaned,
//! written in place and sent; the receiver checks it in place and copies it out.
//! - `iceoryx2-poll`: the receiver polls `receive()` (yielding every
//!   [`SPINS_PER_YIELD`](super::SPINS_PER_YIELD) empty polls, like the raw spinning peers);
//! - `iceoryx2-event`: plus one event service per direction; the sender notifies after each
//!   send, the receiver sleeps in the listener's `timed_wait` while nothing is there.

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::Notifier;
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;

use super::peer::{ELEMENTS, Peer, PingPong, SPINS_PER_YIELD, Side, check_message};
use crate::BoxError;
use crate::kernel;
use crate::transports::iox::{node, service_name};

/// How long an event-mode receiver sleeps before it polls again.
const SLEEP_SLICE: Duration = Duration::from_millis(100);

/// One end of an iceoryx2 peer.
pub struct Iox {
    publisher: Publisher<ipc::Service, [f32], ()>,
    subscriber: Subscriber<ipc::Service, [f32], ()>,
    events: Option<(Notifier<ipc::Service>, Listener<ipc::Service>)>,
    buf: [f32; ELEMENTS],
    // Keeps the services and the node alive as long as the ports.
    _node: Node<ipc::Service>,
}

impl std::fmt::Debug for Iox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iox").finish_non_exhaustive()
    }
}

impl Iox {
    /// Opens or creates both directions' services, publishes on this side's, subscribes to
    /// the other's, and waits (at most `patience`) until the other side has subscribed.
    ///
    /// # Errors
    /// iceoryx2 errors; no other side within `patience`.
    pub fn connect(
        peer: Peer,
        name: &str,
        side: Side,
        patience: Duration,
    ) -> Result<Iox, BoxError> {
        let node = node()?;
        let (mine, theirs) = match side {
            Side::Ping => ("ping", "pong"),
            _ => ("pong", "ping"),
        };
        let pubsub = |dir: &str| {
            node.service_builder(&service_name(&format!("{name}-{dir}"))?)
                .publish_subscribe::<[f32]>()
                .history_size(0)
                .subscriber_max_buffer_size(2)
                .max_publishers(1)
                .max_subscribers(1)
                .open_or_create()
                .map_err(|e| -> BoxError { format!("{e:?}").into() })
        };
        let out = pubsub(mine)?;
        let inp = pubsub(theirs)?;
        let publisher = out
            .publisher_builder()
            .initial_max_slice_len(ELEMENTS)
            .create()?;
        let subscriber = inp.subscriber_builder().create()?;
        let events = if peer == Peer::Iceoryx2Event {
            let event = |dir: &str| {
                node.service_builder(&service_name(&format!("{name}-{dir}-ev"))?)
                    .event()
                    .open_or_create()
                    .map_err(|e| -> BoxError { format!("{e:?}").into() })
            };
            let notifier = event(mine)?.notifier_builder().create()?;
            let listener = event(theirs)?.listener_builder().create()?;
            Some((notifier, listener))
        } else {
            None
        };
        let start = Instant::now();
        while out.dynamic_config().number_of_subscribers() == 0 {
            if start.elapsed() > patience {
                return Err(format!("no {peer} peer subscribed").into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Iox {
            publisher,
            subscriber,
            events,
            buf: [0.0; ELEMENTS],
            _node: node,
        })
    }

    fn send(&mut self) -> Result<(), BoxError> {
        let mut sample = self.publisher.loan_slice_uninit(ELEMENTS)?;
        for (d, s) in sample.payload_mut().iter_mut().zip(&self.buf) {
            d.write(*s);
        }
        // SAFETY: the loop above wrote all ELEMENTS elements of the payload.
        let sample = unsafe { sample.assume_init() };
        sample.send()?;
        if let Some((notifier, _)) = &self.events {
            notifier.notify()?;
        }
        Ok(())
    }

    fn recv(&mut self, seq: u64) -> Result<(), BoxError> {
        let mut polls = 0u32;
        loop {
            if let Some(sample) = self.subscriber.receive()? {
                let xs = sample.payload();
                check_message(xs, seq)?;
                self.buf.copy_from_slice(xs);
                return Ok(());
            }
            match &self.events {
                Some((_, listener)) => {
                    listener.timed_wait(|_| {}, SLEEP_SLICE)?;
                }
                None => {
                    polls += 1;
                    if polls.is_multiple_of(SPINS_PER_YIELD) {
                        std::thread::yield_now();
                    } else {
                        spin_loop();
                    }
                }
            }
        }
    }
}

impl PingPong for Iox {
    fn round_trip(&mut self, seq: u64) -> Result<(), BoxError> {
        kernel::fill(&mut self.buf, seq);
        self.send()?;
        self.recv(seq)
    }

    fn echo(&mut self, seq: u64) -> Result<(), BoxError> {
        self.recv(seq)?;
        self.send()
    }
}
