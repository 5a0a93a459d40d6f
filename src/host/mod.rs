//! Mechanisms on the node, knowing nothing of containerd's services or of the pod model:
//! cgroups and which are a container's own, placement, systemd scopes, network namespaces and
//! the CNI plugin chain, mounts and id-mapped mounts, SELinux and MCS levels, client paths,
//! runc, and taking down the runc containers a dead shim left (reclaim).
//!
//! Layer rule: imports `shim`, `records` and `cni` only, nothing of the layers above (`task`,
//! `pod`, `server`, `cli`). `hack/check-cycles.sh` checks it.

pub mod cgroup_ownership;
pub mod cgroups;
pub mod client_paths;
pub mod idmap;
pub mod mcs;
pub mod mount;
pub mod netns;
pub mod network;
pub mod placement;
pub mod reclaim;
pub mod relabel;
pub mod runtime;
pub mod selinux;
pub mod systemd;
