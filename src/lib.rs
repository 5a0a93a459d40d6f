//! rsandbox: `containerd-shim-rsandbox-v1`, a containerd runtime shim that runs whole pods.
//!
//! The binary's `main` is a one-liner into [`cli::main`]; everything else lives in library
//! modules so that tests never need the binary.

pub mod blocking;
pub mod bundle;
pub mod cgroup_ownership;
pub mod cgroups;
pub mod cleanup;
pub mod cli;
pub mod client_paths;
pub mod cni;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod error;
pub mod events;
pub mod flags;
#[doc(hidden)]
pub mod fuzzing;
pub mod idmap;
pub mod logger;
pub mod mcs;
pub mod mount;
pub mod netns;
pub mod network;
pub mod oci;
pub mod panic_hook;
pub mod placement;
pub mod pod;
pub mod reaper;
pub mod reclaim;
pub mod rpc;
pub mod runtime;
pub mod selinux;
pub mod socket;
pub mod state_file;
pub mod stdio;
pub mod sync;
pub mod systemd;
pub mod task;
pub mod timing;
pub mod util;
pub mod validate;
pub mod version;
pub mod waiters;
pub mod wire;

#[cfg(test)]
mod testutil;
