//! iceoryx2 0.10 publish-subscribe with an `[f32]` slice payload: the producer loans an
//! uninitialised slice, writes it in place and sends it; the consumer polls, sums in place.
//! A zero-length slice ends the stream (iceoryx2 has no end-of-stream of its own).

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use iceoryx2::prelude::*;

use crate::BoxError;
use crate::kernel;
use crate::meter::{Deadline, Meter, Outcome, stride_for};
use crate::transports::channel::pool_size;

pub(crate) fn service_name(name: &str) -> Result<ServiceName, BoxError> {
    Ok(format!("shmpipe-bench/{name}").as_str().try_into()?)
}

pub(crate) fn node() -> Result<Node<ipc::Service>, BoxError> {
    // Its default level warns on every start that no config file exists; errors still show.
    set_log_level(LogLevel::Error);
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    // Workers killed by an earlier failure leave their nodes behind: reclaim them.
    let _ = node.try_cleanup_dead_nodes();
    Ok(node)
}

/// Publishes `elements`-float slices for `run`, then the end marker, then waits (at most
/// `patience`) for the subscriber to leave, since its samples live in our data segment.
///
/// # Errors
/// iceoryx2 errors, or no subscriber within `patience`.
pub fn produce(
    name: &str,
    elements: usize,
    run: Duration,
    patience: Duration,
) -> Result<(), BoxError> {
    let node = node()?;
    let depth = pool_size(elements);
    let service = node
        .service_builder(&service_name(name)?)
        .publish_subscribe::<[f32]>()
        .enable_safe_overflow(false)
        .history_size(0)
        .subscriber_max_buffer_size(depth)
        .subscriber_max_borrowed_samples(2)
        .max_publishers(1)
        .max_subscribers(1)
        .create()?;
    let publisher = service
        .publisher_builder()
        .initial_max_slice_len(elements)
        .max_loaned_samples(2)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()?;
    let start = Instant::now();
    while service.dynamic_config().number_of_subscribers() == 0 {
        if start.elapsed() > patience {
            return Err("no iceoryx2 subscriber showed up".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut deadline = Deadline::new(run, stride_for(elements));
    let mut seq = 0u64;
    while deadline.keep_going() {
        let mut sample = publisher.loan_slice_uninit(elements)?;
        kernel::fill_uninit(sample.payload_mut(), seq);
        // SAFETY: `fill_uninit` initialised every element of the payload just above.
        let sample = unsafe { sample.assume_init() };
        sample.send()?;
        seq += 1;
    }
    let end = publisher.loan_slice_uninit(0)?;
    // SAFETY: an empty slice has no element to initialise.
    let end = unsafe { end.assume_init() };
    end.send()?;
    let start = Instant::now();
    while service.dynamic_config().number_of_subscribers() > 0 && start.elapsed() < patience {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Subscribes to `name` (waiting at most `patience` for it to exist) and sums and checks every
/// slice until the end marker.
///
/// # Errors
/// iceoryx2 errors, no service within `patience`, or data that fails the check.
pub fn consume(
    name: &str,
    elements: usize,
    warmup: Duration,
    patience: Duration,
) -> Result<Outcome, BoxError> {
    let node = node()?;
    let service_name = service_name(name)?;
    let start = Instant::now();
    let service = loop {
        match node
            .service_builder(&service_name)
            .publish_subscribe::<[f32]>()
            .open()
        {
            Ok(s) => break s,
            Err(e) if start.elapsed() > patience => return Err(format!("{e:?}").into()),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let subscriber = service
        .subscriber_builder()
        .buffer_size(pool_size(elements))
        .create()?;
    let mut meter = Meter::new(warmup, stride_for(elements));
    let mut idle = 0u32;
    loop {
        match subscriber.receive()? {
            Some(sample) => {
                idle = 0;
                let xs = sample.payload();
                if xs.is_empty() {
                    break;
                }
                if xs.len() != elements {
                    return Err(format!("slice of {} floats, expected {elements}", xs.len()).into());
                }
                let sum = kernel::check(xs, meter.count())?;
                meter.record(sum);
            }
            // Poll, yielding every 256 empty polls like `ring-min` (the cores are shared).
            None => {
                idle += 1;
                if idle.is_multiple_of(256) {
                    std::thread::yield_now();
                } else {
                    spin_loop();
                }
            }
        }
    }
    Ok(meter.finish())
}
