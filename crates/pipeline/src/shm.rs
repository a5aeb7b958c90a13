//! The shared-memory transport: one `shm-ring` channel per connection, one message per batch,
//! one record per frame (encoding in [`crate::wire`]). Item arrays become record arrays (copied
//! or zero-copy according to the [`Transfer`](crate::Transfer) policy).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use shm_ring::{ChannelConfig, Message, Receiver, SendTimeoutError, Sender, WaitConfig};

use crate::plan::Plan;
use crate::wire::{self, Frame, Rx, TransportError, Tx};

fn map_err(e: shm_ring::Error) -> TransportError {
    match e {
        shm_ring::Error::Disconnected => TransportError::Closed,
        shm_ring::Error::PeerDied { .. } => TransportError::PeerDied(e.to_string()),
        shm_ring::Error::TooLarge {
            what,
            needed,
            limit,
            ..
        } => TransportError::TooLarge(format!(
            "{what} needs {needed} bytes but this pipeline's channels carry at most {limit}: \
             raise ChannelGeometry::large_pool (PipelineBuilder::channel; the default \
             shm_ring::machine_large_pool() carries any item the machine holds) or \
             ChannelGeometry::block_size"
        )),
        other => TransportError::Channel(Arc::new(other)),
    }
}

/// Bytes per ring slot.
const SLOT_SIZE: u32 = 64;

/// The channel configuration of a plan: a descriptor ring of eight batches unless the plan
/// says otherwise (see [`ChannelGeometry::slots`](crate::ChannelGeometry::slots)).
pub(crate) fn channel_config(plan: &Plan) -> ChannelConfig {
    let want = (plan.batch_bytes.saturating_mul(8) / SLOT_SIZE as usize).clamp(64, 1 << 16);
    let slots = if plan.channel.slots > 0 {
        plan.channel.slots
    } else {
        want.next_power_of_two() as u32
    };
    ChannelConfig {
        slots,
        slot_size: SLOT_SIZE,
        blocks: plan.channel.blocks,
        block_size: plan.channel.block_size,
        large_pool: plan.channel.large_pool,
        transfer: plan.transfer,
        wait: sender_wait(plan.process_count(), cpus()),
        ..ChannelConfig::default()
    }
}

/// CPUs this process may run on (affinity and cgroup quota included).
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How a producer waits for room: spinning first (shm-ring's default) pays only when its
/// consumer runs at the same time on another CPU. With more processes than CPUs the spin burns
/// the time slice the consumer (or another worker) needs to make that room (a measured share
/// of all CPU samples, with its date, is in `docs/figures.md`). Then a producer sleeps on the
/// futex at once.
pub(crate) fn sender_wait(processes: usize, cpus: usize) -> WaitConfig {
    let mut w = WaitConfig::default();
    if processes > cpus {
        w.spin = Duration::ZERO;
    }
    w
}

/// Creates an anonymous channel (a memfd sealed against shrinking and growing) and returns its
/// producer end and a descriptor for the consumer. `cancel`: see [`crate::node::create_tx`].
pub(crate) fn create_tx(
    plan: &Plan,
    cancel: Option<Arc<AtomicBool>>,
) -> Result<(Box<dyn Tx>, OwnedFd), crate::Error> {
    let tx = Sender::<Message>::anonymous(&channel_config(plan))
        .map_err(|e| crate::Error::transport_from("cannot create a channel", e))?;
    let fd = tx
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| crate::Error::transport_from("cannot share a channel", e))?;
    Ok((Box::new(ShmTx { tx, cancel }), fd))
}

/// Opens the consumer end of a channel from its descriptor; with `lease_cap`, zero-copy arrays
/// of received items stay in shared memory (pinning at most `lease_cap` pool blocks at a time).
pub(crate) fn open_rx(fd: OwnedFd, lease_cap: Option<usize>) -> Result<Box<dyn Rx>, crate::Error> {
    let mut rx = Receiver::<Message>::from_fd(fd)
        .map_err(|e| crate::Error::transport_from("cannot open a channel", e))?;
    // The pipeline's input loop spins itself and polls several rings: a poll must not spin
    // inside one of them.
    rx.set_wait(WaitConfig {
        spin: Duration::ZERO,
        ..WaitConfig::default()
    });
    Ok(Box::new(ShmRx {
        rx,
        recheck: false,
        lease: lease_cap.map(|m| (Vec::new(), m)),
    }))
}

struct ShmTx {
    tx: Sender,
    /// Set: a blocked send gives up (with `Closed`) once the flag is raised.
    cancel: Option<Arc<AtomicBool>>,
}

/// How often a cancellable send looks at its flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

impl Tx for ShmTx {
    fn send(&mut self, frames: &[Frame]) -> Result<(), TransportError> {
        let build = |seg| wire::build(seg).map_err(TransportError::Other);
        for seg in wire::segments(frames) {
            let Some(cancel) = self.cancel.clone() else {
                self.tx.send(build(seg)?).map_err(|e| map_err(e.into()))?;
                continue;
            };
            loop {
                // A timed-out send published nothing and gave its blocks back: build it again.
                match self.tx.send_timeout(build(seg)?, CANCEL_POLL) {
                    Err(SendTimeoutError::Timeout(_)) if !cancel.load(Ordering::Relaxed) => {}
                    Err(SendTimeoutError::Timeout(_)) => return Err(TransportError::Closed),
                    r => break r.map_err(|e| map_err(e.into()))?,
                }
            }
        }
        Ok(())
    }

    fn transfer_counts(&self) -> (u64, u64) {
        let s = self.tx.stats();
        (s.zero_copy_arrays, s.copied_arrays)
    }

    fn idle(&mut self) {
        // Large extents the consumer is done with, unused for a while, give their pages back
        // even if this producer sends nothing more for a long time.
        let _ = self.tx.trim_memory(shm_ring::LARGE_KEEP);
    }
}

struct ShmRx {
    rx: Receiver,
    /// Set while re-checking a reported peer death.
    recheck: bool,
    /// Consumer only: keep zero-copy arrays in place: the messages with live leases, and the
    /// most pool blocks they may pin.
    lease: Option<(Vec<Weak<Message>>, usize)>,
}

impl Rx for ShmRx {
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<Frame>>, TransportError> {
        match self.recv_once(timeout.unwrap_or(Duration::ZERO)) {
            // A producer that sends its last batch, closes and exits between two checks of a
            // waiting consumer is reported dead although its data and its close are in the
            // ring: look once more before believing it.
            Err(shm_ring::Error::PeerDied { .. }) if !self.recheck => {
                self.recheck = true;
                let r = self.recv_once(Duration::ZERO);
                self.recheck = false;
                match r {
                    Err(shm_ring::Error::Timeout) => Err(TransportError::PeerDied(
                        "producer died without closing the channel".into(),
                    )),
                    other => self.finish(other),
                }
            }
            other => self.finish(other),
        }
    }
}

impl ShmRx {
    fn recv_once(&mut self, timeout: Duration) -> Result<Vec<Frame>, shm_ring::Error> {
        let mut frames = Vec::new();
        if let Some((live, cap)) = &mut self.lease {
            let msg = Arc::new(self.rx.recv_timeout(timeout)?);
            // A leased array pins every pool block of its message until the last item
            // referring to it is dropped. Keep at most `cap` (half of the producer's pool)
            // pinned, so the producer can always go on (one message never needs more than half
            // of its blocks); beyond that, copy.
            live.retain(|w| w.strong_count() > 0);
            let (pinned, pinned_large) = live
                .iter()
                .filter_map(Weak::upgrade)
                .fold((0, 0), |(n, b), m| {
                    (n + m.leased_blocks(), b + m.leased_large_bytes())
                });
            // Extents of the large size class: at most half of what the producer may have out
            // (larger items are copied out), so it always finds room for the next one.
            let lease = msg.leased_blocks() > 0
                && pinned + msg.leased_blocks() <= *cap
                && pinned_large + msg.leased_large_bytes() <= shm_ring::LARGE_IN_FLIGHT / 2;
            let cx = lease.then_some(&msg);
            wire::decode(msg.view(), &mut frames, cx).map_err(shm_ring::Error::Corrupt)?;
            if lease && Arc::strong_count(&msg) > 1 {
                live.push(Arc::downgrade(&msg));
            }
            return Ok(frames);
        }
        let mut bad = Ok(());
        self.rx.recv_batch(8, Some(timeout), |m| {
            if bad.is_ok() {
                bad = wire::decode(m, &mut frames, None);
            }
        })?;
        bad.map(|()| frames).map_err(shm_ring::Error::Corrupt)
    }

    fn finish(
        &mut self,
        r: Result<Vec<Frame>, shm_ring::Error>,
    ) -> Result<Option<Vec<Frame>>, TransportError> {
        match r {
            Ok(frames) => Ok(Some(frames)),
            Err(shm_ring::Error::Timeout) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }
}
/// Checks that the machine can hold every channel of the plan, before any process starts.
/// Channels are anonymous shared memory: RAM (charged to the memory cgroup), not `/dev/shm`.
///
/// # Errors
/// A message naming the memory needed, the memory available, and what to shrink.
pub(crate) fn check_memory(plan: &Plan) -> Result<(), String> {
    let cfg = channel_config(plan);
    let per = cfg.slots as u64 * u64::from(cfg.slot_size)
        + u64::from(cfg.blocks) * cfg.block_size as u64
        + (64 << 10);
    let n = plan.connection_count() as u64;
    let needed = per.saturating_mul(n);
    let Some(available) = available_memory() else {
        return Ok(());
    };
    if available < needed {
        return Err(format!(
            "this pipeline's {n} channels need about {:.1} MiB of memory ({:.1} MiB each) but \
             only {:.1} MiB is available; shrink the channels with PipelineBuilder::channel \
             (blocks x block_size) or use fewer workers",
            needed as f64 / 1048576.0,
            per as f64 / 1048576.0,
            available as f64 / 1048576.0
        ));
    }
    Ok(())
}

/// Memory available to this process: `MemAvailable`, lowered by the room left under our
/// cgroup's `memory.max` (cgroup v2) when there is one.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let mut avail = kib.saturating_mul(1024);
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok();
    if let Some(path) = cg
        .as_deref()
        .and_then(|c| c.lines().find_map(|l| l.strip_prefix("0::")))
    {
        let dir = format!("/sys/fs/cgroup{}", path.trim());
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(format!("{dir}/{f}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        if let (Some(max), Some(cur)) = (read("memory.max"), read("memory.current")) {
            avail = avail.min(max.saturating_sub(cur));
        }
    }
    Some(avail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producers_spin_only_when_every_process_has_a_cpu() {
        let spin = WaitConfig::default().spin;
        assert!(!spin.is_zero());
        assert_eq!(sender_wait(4, 2).spin, Duration::ZERO);
        assert_eq!(sender_wait(3, 2).spin, Duration::ZERO);
        assert_eq!(sender_wait(4, 4).spin, spin);
        assert_eq!(sender_wait(2, 8).spin, spin);
        // Only the spin changes: liveness checks stay as they are.
        assert_eq!(
            sender_wait(4, 2).liveness_check,
            WaitConfig::default().liveness_check
        );
    }
}
