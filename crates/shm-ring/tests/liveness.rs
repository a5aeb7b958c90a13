//! "Cannot tell" is not "dead": a consumer that cannot read `/proc` (here: out of file
//! descriptors) must keep waiting for its live producer, not report it dead.
//!
//! Alone in its own test binary because it exhausts the process's file descriptors.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use common::{ShmGuard, unique};
use rustix::process::{Resource, Rlimit};
use shm_ring::{ChannelConfig, Error, Receiver, Sender};

#[test]
fn out_of_file_descriptors_is_not_a_dead_producer() {
    let name = unique("emfile");
    let guard = ShmGuard::new(&[&name]);
    let tx = Sender::create(&name, &ChannelConfig::default()).unwrap();
    let mut rx = Receiver::open(&name).unwrap();
    let old = rustix::process::getrlimit(Resource::Nofile);
    rustix::process::setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(256),
            maximum: old.maximum,
        },
    )
    .unwrap();
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    // The producer is alive (it is us); several liveness checks run during this wait.
    let res = rx.recv_timeout(Duration::from_millis(500));
    drop(hog);
    rustix::process::setrlimit(Resource::Nofile, old).unwrap();
    assert!(
        matches!(res, Err(Error::Timeout)),
        "expected Timeout, got {res:?}"
    );
    drop((tx, rx));
    guard.assert_gone();
}
