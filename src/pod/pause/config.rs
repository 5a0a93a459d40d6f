//! What the pause process should be: [`PauseConfig`] (what the sandbox manager asks for) and
//! the pause's fixed identity (`argv[0]`, uid and gid).
//!
//! Plain data and pure decisions from the pod spec: no system call, nothing of the child.

use std::path::{Path, PathBuf};

use crate::pod::spec::{IpcMode, NetworkMode, PidMode, PodSpec, SysctlDefaults, UserNamespace};

/// The pause process's `argv[0]`; `argv[1]` is the pod ID (`ps`: `rsandbox-pause <pod id>`,
/// never taken for a shim by `pgrep -f containerd-shim-rsandbox-v1`); its `comm` is `pause`.
pub const PAUSE_ARGV0: &str = "rsandbox-pause";

/// The identity the pause process runs as (as Kubernetes' pause image).
pub const PAUSE_UID: u32 = 65535;
pub const PAUSE_GID: u32 = 65535;

/// What the pause process should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PauseConfig {
    /// Network namespace to join; `None` stays in the shim's (host) netns.
    pub netns: Option<PathBuf>,
    /// New IPC namespace (false: hostIPC).
    pub new_ipc: bool,
    /// New UTS namespace (false: host network pods keep the host's).
    pub new_uts: bool,
    /// New PID namespace with the pause as PID 1 (shareProcessNamespace).
    pub new_pid: bool,
    /// Hostname to set in the new UTS namespace.
    pub hostname: Option<String>,
    /// (name, value) sysctls, written under /proc/sys from inside the namespaces (names in
    /// either form; see [`sysctl_path`]).
    pub sysctls: Vec<(String, String)>,
    /// The pod ID, shown in the command line (`rsandbox-pause <pod id>`).
    pub pod_id: String,
    /// An existing directory the pause mounts its empty root on, in its own mount namespace
    /// only (the sandbox bundle): nothing is created or mounted on the node. The child mounts
    /// it with the node's privileges, also in a user-namespaced pod (before it enters the
    /// user namespace).
    pub root_mountpoint: PathBuf,
    /// A new user namespace with these maps, owning the new mount, IPC, UTS and PID
    /// namespaces (see "User-namespaced pods" in the module docs); `None`: the node's.
    pub userns: Option<UserNamespace>,
    /// The pod's `selinux_options`, for its labels.
    pub selinux_options: Option<crate::host::selinux::SelinuxOptions>,
    /// SELinux labels of the pause (where the node has SELinux): `None` runs it under the
    /// shim's own label.
    pub labels: Option<PauseLabels>,
    /// The MCS level reserved for the pod's pause (see [`crate::host::mcs`]), where it gets labels.
    pub mcs_level: Option<String>,
}

/// The SELinux labels of the pause ([`crate::host::selinux::Selinux::pause_labels`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseLabels {
    /// Its process label (`user:role:type:level`), set for its exec.
    pub process: String,
    /// The label of the program it runs (the sealed memfd), one its domain may enter.
    pub program: String,
}

impl PauseConfig {
    /// The pause process of a pod: `netns` is the pod's network namespace (given by the caller
    /// or made by the shim), `defaults` what the host allows of containerd's default sysctls,
    /// `bundle` the sandbox bundle (see [`PauseConfig::root_mountpoint`]).
    ///
    /// As containerd's podsandbox controller:
    /// * a host-network pod keeps the host's network and UTS namespaces (no netns is joined even
    ///   if one is given) and gets no default sysctls;
    /// * hostIPC keeps the host's IPC namespace;
    /// * the pause process gets a PID namespace of its own unless the pod asks for the node's:
    ///   CRI puts a container whose own namespace_options say pid=POD into
    ///   `/proc/<pause>/ns/pid` whatever the pod's mode, and a pause left in the host's PID
    ///   namespace would hand it the node's processes.
    pub fn for_pod(
        pod_id: &str,
        spec: &PodSpec,
        netns: Option<&Path>,
        defaults: SysctlDefaults,
        bundle: &Path,
    ) -> PauseConfig {
        let host_network = spec.network == NetworkMode::Host;
        PauseConfig {
            pod_id: pod_id.to_string(),
            netns: netns.filter(|_| !host_network).map(Path::to_path_buf),
            new_ipc: spec.ipc == IpcMode::Pod,
            new_uts: !spec.host_uts(),
            new_pid: spec.pid != PidMode::Host,
            hostname: Some(spec.hostname.clone()).filter(|h| !h.is_empty() && !spec.host_uts()),
            sysctls: spec.effective_sysctls(defaults),
            root_mountpoint: bundle.to_path_buf(),
            userns: spec.userns.clone(),
            selinux_options: spec.selinux.clone(),
            labels: None,
            mcs_level: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_requires_the_pause_ids() {
        use crate::pod::spec::REQUIRED_MAPPED_IDS;
        assert!(REQUIRED_MAPPED_IDS.contains(&PAUSE_UID));
        assert!(REQUIRED_MAPPED_IDS.contains(&PAUSE_GID));
        assert!(REQUIRED_MAPPED_IDS.contains(&0));
    }
}
