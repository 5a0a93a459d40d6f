//! rsandbox: `containerd-shim-rsandbox-v1`, a containerd runtime shim that runs whole pods.
//!
//! The binary's `main` is a one-liner into [`cli::main`]; everything else lives in library
//! modules so that tests never need the binary.

pub mod cli;
pub mod cri;
pub mod netns;
pub mod pod;
