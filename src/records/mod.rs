//! Records: what the shim reads and writes as data, and nothing it does with it: the bundle and
//! its state files, the shim's config and flags, the version, the checks of names and paths, the
//! error type, the CRI types and the OCI spec edits.
//!
//! Layer rule: imports only `cni` (the bottom layer), nothing of the layers above (`shim`,
//! `host`, `task`, `pod`, `server`, `cli`). `hack/check-cycles.sh` checks it.

pub mod bundle;
pub mod config;
pub mod cri;
pub mod error;
pub mod flags;
pub mod oci;
pub mod state_file;
pub mod validate;
pub mod version;
