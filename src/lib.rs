//! rsandbox: `containerd-shim-rsandbox-v1`, a containerd runtime shim that runs whole pods.
//!
//! The binary's `main` is a one-liner into [`cli::main`]; everything else lives in library
//! modules so that tests never need the binary.
//!
//! The modules are layers, lowest first; a layer imports only the layers below it (checked by
//! `hack/check-cycles.sh`): `cni`, `records`, `shim`, `host`, `task`, `pod`, `server`, `cli`.

/// The binary's actions (`start`, `delete` and its clean-up, `check`, `-info`, `-v`) and its
/// entry point. May import every layer.
pub mod cli;
/// A CNI client (configs, plugin execution, results), self-contained: it imports nothing else
/// of the crate (it could be a crate of its own).
pub mod cni;
/// Mechanisms on the node (cgroups, placement, systemd, netns and CNI networking, mounts,
/// idmap, SELinux/MCS, runc, reclaim), knowing nothing of the pod model. Imports the layers
/// below.
pub mod host;
/// The pod: the sandbox, its pause process, spec, files, cgroup, network and status. Imports
/// the layers below (`task` included: a pod's members are tasks).
pub mod pod;
/// Records: the bundle and its state files, config, flags, version, validation, the error type,
/// CRI types and OCI specs. Imports only `cni`.
pub mod records;
/// The daemon and its ttrpc services (Sandbox, Task) over the pod and task managers. Imports
/// the layers below.
pub mod server;
/// The shim process's own machinery (locks, blocking sections, reaper, waiters, log, panic
/// hook, timing, the socket, ttrpc framing, events). Imports `records` and `cni`.
pub mod shim;
/// The task manager: containers and execs run through runc, with their stdio. Imports the
/// layers below.
pub mod task;

/// Entry points for the fuzzers (`fuzz/`, `tests/fuzz_corpus.rs`); above every layer.
#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod testutil;
