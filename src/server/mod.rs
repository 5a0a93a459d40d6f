//! The server: the daemon a shim process runs (start-up, managers, shutdown) and the ttrpc
//! services it answers (containerd's Sandbox and Task), translating each call into the pod and
//! task managers below.
//!
//! Layer rule: imports `pod`, `task`, `host`, `shim`, `records` and `cni`, nothing of `cli`.
//! `hack/check-cycles.sh` checks it.

pub mod daemon;
pub mod rpc;
