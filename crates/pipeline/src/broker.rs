//! The parent's side of the start-up hand-over (see [`crate::handover`]): it gathers every
//! producer's channel descriptors, forwards them to their consumers, opens its own inputs, and
//! starts the data flow only once every channel of the pipeline is attached.
//!
//! Every wait is bounded ([`START_TIMEOUT`]) and watches the children: a child that dies or
//! gives up during start-up makes `start()` fail with the reason, never hang.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::error::Error;
use crate::handover::{CtrlError, Kind};
use crate::node::{self, Plan, Role, START_TIMEOUT};
use crate::supervisor::{ChildProc, Shared, describe_status};
use crate::wire::Rx;

/// Connects a pipeline whose children were just spawned. `own`: the parent's own outgoing
/// channels in enqueue mode (it is emitter 0). Returns the parent's inputs (one per worker of
/// the last stage), attached, with every other channel attached too.
pub(crate) fn connect(
    plan: &Plan,
    shared: &Shared,
    own: Vec<Option<OwnedFd>>,
) -> Result<Vec<Box<dyn Rx>>, Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    let roles: Vec<Role> = {
        let kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
        kids.iter().map(|c| c.role).collect()
    };
    // 1. Every producer's outgoing channels, by (layer, producer index).
    let outs = gather(shared, Kind::Outputs, deadline, |r| plan.outputs_of(r))?;
    let mut table: HashMap<(usize, usize), Vec<Option<OwnedFd>>> = HashMap::new();
    if plan.source.is_none() {
        table.insert((0, 0), own);
    }
    for (role, fds) in roles.iter().zip(outs) {
        let key = match *role {
            Role::Emitter(e) => (0, e),
            Role::Worker { stage, worker } => (stage + 1, worker),
        };
        table.insert(key, fds.into_iter().map(Some).collect());
    }
    let mut take = |layer: usize, producer: usize, consumer: usize| -> Result<OwnedFd, Error> {
        table
            .get_mut(&(layer, producer))
            .and_then(|v| v.get_mut(consumer))
            .and_then(Option::take)
            .ok_or_else(|| {
                Error::transport(format!(
                    "start-up: no channel from producer {producer} of layer {layer} to {consumer}"
                ))
            })
    };
    // 2. Every consumer child gets its inputs, in upstream order.
    let mut sends = Vec::new();
    for role in &roles {
        let fds = match *role {
            Role::Emitter(_) => Vec::new(),
            Role::Worker { stage, worker } => (0..plan.inputs_of(*role))
                .map(|u| take(stage, u, worker))
                .collect::<Result<Vec<_>, _>>()?,
        };
        sends.push(fds);
    }
    {
        let kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
        for (c, fds) in kids.iter().zip(&sends) {
            let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
            match c.ctrl.send(Kind::Inputs, &borrowed) {
                // A child that died already shows up in the next gather.
                Err(e) if !crate::handover::peer_gone(&e) => {
                    return Err(Error::transport(format!(
                        "start-up: cannot hand {} its {} inputs: {e}",
                        c.role.describe(),
                        borrowed.len()
                    )));
                }
                _ => {}
            }
        }
    }
    drop(sends);
    // 3. The parent's own inputs: the last stage's outputs.
    let last = plan.stages.len();
    let mut rxs = Vec::new();
    for w in 0..plan.stages[last - 1].workers {
        let fd = take(last, w, 0)?;
        rxs.push(node::open_rx(plan, fd, plan.lease)?);
    }
    // 4. Everyone attached: go.
    gather(shared, Kind::Attached, deadline, |_| 0)?;
    let kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
    for c in kids.iter() {
        c.ctrl
            .send(Kind::Go, &[])
            .map_err(|e| Error::transport(format!("start-up: {} : {e}", c.role.describe())))?;
    }
    Ok(rxs)
}

/// Waits for one message of `want` from every child (with `count(role)` descriptors), watching
/// for dead children and the deadline.
fn gather(
    shared: &Shared,
    want: Kind,
    deadline: Instant,
    count: impl Fn(Role) -> usize,
) -> Result<Vec<Vec<OwnedFd>>, Error> {
    let n = shared
        .children
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .len();
    let mut got: Vec<Option<Vec<OwnedFd>>> = (0..n).map(|_| None).collect();
    while got.iter().any(Option::is_none) {
        if let Some(e) = shared.take_primary() {
            return Err(e);
        }
        if Instant::now() > deadline {
            return Err(Error::transport(format!(
                "start-up: {} of {n} children did not connect within {START_TIMEOUT:?}",
                got.iter().filter(|g| g.is_none()).count()
            )));
        }
        let mut kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
        let pending: Vec<usize> = (0..n).filter(|&i| got[i].is_none()).collect();
        for i in readable(&kids, &pending)? {
            match read_reply(&mut kids[i], want, &count)? {
                Reply::Got(fds) => got[i] = Some(fds),
                Reply::Nothing => {}
                Reply::Gone(role, pid) => {
                    drop(kids);
                    return Err(died(shared, role, pid));
                }
            }
        }
    }
    Ok(got.into_iter().map(Option::unwrap_or_default).collect())
}

/// The children of `pending` whose control socket is readable within 10 ms (none after a
/// timeout or a signal).
fn readable(kids: &[ChildProc], pending: &[usize]) -> Result<Vec<usize>, Error> {
    let mut fds: Vec<PollFd<'_>> = pending
        .iter()
        .map(|&i| PollFd::new(&kids[i].ctrl, PollFlags::IN))
        .collect();
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    match poll(&mut fds, Some(&ts)) {
        Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
        Ok(_) => {}
        Err(e) => return Err(Error::transport(format!("start-up: poll: {e}"))),
    }
    Ok(pending
        .iter()
        .zip(&fds)
        .filter(|(_, f)| !f.revents().is_empty())
        .map(|(&i, _)| i)
        .collect())
}

/// What a child's control message during start-up says.
enum Reply {
    /// The message wanted, with its descriptors.
    Got(Vec<OwnedFd>),
    /// No message yet.
    Nothing,
    /// The child exits (it gave up, or closed its socket): its role and pid.
    Gone(String, u32),
}

/// Reads child `c`'s control message, if one is there: `want` with `count(role)` descriptors,
/// or the news that the child is gone; any other message is an error.
fn read_reply(
    c: &mut ChildProc,
    want: Kind,
    count: impl Fn(Role) -> usize,
) -> Result<Reply, Error> {
    match c
        .ctrl
        .recv_msg(Some(Duration::ZERO))
        .map(|m| (m.kind, m.fds, m.value))
    {
        Ok((k, fds, _)) if k == want && fds.len() == count(c.role) => Ok(Reply::Got(fds)),
        Ok((Kind::Exit, _, code)) => {
            // It gave up (its stderr says why) and exits.
            c.announced = i32::try_from(code).ok();
            Ok(Reply::Gone(c.role.describe(), c.child.id()))
        }
        Ok((k, fds, _)) => Err(Error::transport(format!(
            "start-up: {} sent {k:?} with {} descriptors, expected {want:?} with {}",
            c.role.describe(),
            fds.len(),
            count(c.role)
        ))),
        Err(CtrlError::Timeout) => Ok(Reply::Nothing),
        Err(CtrlError::Failed(why)) => Err(Error::transport(format!(
            "start-up: {} (pid {}) could not start: {why}",
            c.role.describe(),
            c.child.id()
        ))),
        Err(CtrlError::Eof) => Ok(Reply::Gone(c.role.describe(), c.child.id())),
        Err(e) => Err(Error::transport(format!(
            "start-up: {}: {e}",
            c.role.describe()
        ))),
    }
}

/// A child closed its control socket during start-up: it exited; name how.
fn died(shared: &Shared, role: String, pid: u32) -> Error {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        shared.poll_children();
        if let Some(e) = shared.take_primary() {
            return e;
        }
        let kids = shared.children.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = kids.iter().find(|c| c.child.id() == pid)
            && let Some(st) = c.status
        {
            return Error::ProcessDied {
                role,
                pid,
                status: describe_status(&st, st.code().is_some() && st.code() == c.announced),
            };
        }
        drop(kids);
        std::thread::sleep(Duration::from_millis(2));
    }
    Error::ProcessDied {
        role,
        pid,
        status: "closed its control socket during start-up".into(),
    }
}
