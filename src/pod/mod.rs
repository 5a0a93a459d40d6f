//! The pod: everything containerd's podsandbox controller would otherwise do, and which a
//! `sandboxer = "shim"` runtime must do itself:
//!
//! * [`spec`]: decode `CreateSandboxRequest.options` (a CRI `PodSandboxConfig`) and validate
//!   it into a plain [`PodSpec`] (`spec::decode`), the pod sysctls (`spec::sysctl`), and the
//!   pod-level decisions: where its network comes from, what member containers join, what CNI
//!   is told about it;
//! * [`files`]: the pod's `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname` and `/dev/shm`;
//! * [`mcs_level`]: one SELinux MCS level for all the pod's containers (containerd cannot give
//!   them the pause's);
//! * [`pause`]: the process that holds the pod's namespaces, in an empty root of its own;
//! * [`pause_image`]: the pause program it runs (embedded, from a sealed memfd);
//! * [`cgroup`]: the pod cgroup;
//! * [`sandbox`]: the Sandbox service's state and logic;
//! * [`sandbox_spec`]: the OCI spec of the running sandbox that StartSandbox reports (NRI);
//! * [`status_info`]: the verbose SandboxStatus `info` (`crictl inspectp`), in the shape
//!   containerd's CRI reads.
//!
//! Layer rule: imports `task` (a pod's members are tasks), `host`, `shim`, `records` and `cni`,
//! nothing of the layers above (`server`, `cli`). `hack/check-cycles.sh` checks it.

pub mod cgroup;
pub mod files;
pub mod mcs_level;
pub mod pause;
pub mod pause_image;
pub mod sandbox;
pub mod sandbox_spec;
pub mod scope;
pub mod spec;
pub mod status_info;
pub mod unrecorded_pause;

pub use files::{PodFiles, mount_shm, unmount_shm};
pub use spec::decode::{decode_pod_config, pod_config_bytes};
pub use spec::{
    CgroupParent, Dns, IpcMode, NetworkMode, PidMode, PodSpec, PortMapping, Protocol, SpecError,
    SysctlDefaults,
};
