//! The shim process's own machinery, knowing nothing of the node's mechanisms or of pods:
//! panic-proof locks, blocking sections, the reaper of child processes, waiters, the log and
//! the panic hook, timing, small helpers, and the plumbing to containerd (the socket's address,
//! ttrpc framing, events).
//!
//! Layer rule: imports `records` and `cni` only, nothing of the layers above (`host`, `task`,
//! `pod`, `server`, `cli`). `hack/check-cycles.sh` checks it.

pub mod blocking;
pub mod events;
pub mod logger;
pub mod panic_hook;
pub mod reaper;
pub mod socket;
pub mod sync;
pub mod timing;
pub mod util;
pub mod waiters;
pub mod wire;
