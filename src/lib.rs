//! rsandbox: `containerd-shim-rsandbox-v1`, a containerd runtime shim that runs whole pods.
//!
//! The binary's `main` is a one-liner into [`cli::main`]; everything else lives in library
//! modules so that tests never need the binary.
//!
//! The modules are layers, lowest first; a layer imports only itself and the layers below it
//! (checked by `hack/check-cycles.sh`, its `LAYERS`); each layer's `mod.rs` states its job and
//! its rule:
//!
//! 1. [`cni`]: a CNI client (configs, plugin execution, results), self-contained: it imports
//!    nothing else of the crate (it could be a crate of its own);
//! 2. [`records`]: the bundle and its state files, config, flags, version, validation, the error
//!    type, CRI types and OCI specs;
//! 3. [`shim`]: the shim process's own machinery (locks, blocking sections, reaper, waiters,
//!    log, panic hook, timing, the socket, ttrpc framing, events);
//! 4. [`host`]: mechanisms on the node (cgroups, placement, systemd, netns and CNI networking,
//!    mounts, idmap, SELinux/MCS, runc, reclaim), knowing nothing of the pod model;
//! 5. [`task`]: the task manager: containers and execs run through runc, with their stdio;
//! 6. [`pod`]: the sandbox, its pause process, spec, files, cgroup, network and status (a pod's
//!    members are tasks);
//! 7. [`server`]: the daemon and its ttrpc services (Sandbox, Task) over the pod and task
//!    managers;
//! 8. [`cli`]: the binary's actions (`start`, `delete` and its clean-up, `check`, `-info`,
//!    `-v`) and its entry point.
//!
//! Outside the layers: `fuzzing` (the fuzzers' entry points, `fuzz/` and
//! `tests/fuzz_corpus.rs`; above every layer) and `testutil` (the unit tests' helpers).

pub mod cli;
pub mod cni;
pub mod host;
pub mod pod;
pub mod records;
pub mod server;
pub mod shim;
pub mod task;

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod testutil;
