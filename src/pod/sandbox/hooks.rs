//! What the pod gives its member containers (`crate::task::PodHooks`): its namespaces, its
//! files and /dev/shm, its membership record.

use std::path::PathBuf;

use crate::host::reclaim::Member;
use crate::pod::spec::{IpcMode, MemberNamespace};
use crate::records::error::{Context, Result};
use crate::records::oci::{self, NamespaceChoice, PodMount};
use crate::task::PodHooks;

use super::{Sandbox, SandboxManager, save_record};

/// Makes a container that asks for new network, IPC or UTS namespaces (and a new PID namespace
/// when the pod shares one) join the pod's instead: the pause process's, or the node's where
/// the pod uses the node's ([`PodSpec::member_namespace`]). A container of a pod lives in the
/// pod. Returns whether the spec changed.
///
/// [`PodSpec::member_namespace`]: crate::pod::spec::PodSpec::member_namespace
fn join_pod_namespaces(s: &Sandbox, spec: &mut serde_json::Value) -> bool {
    let pause_alive = s.pid != 0 && s.exit.is_none();
    oci::place_namespaces(spec, |kind| match s.spec.member_namespace(kind) {
        MemberNamespace::Host => NamespaceChoice::Node,
        MemberNamespace::Pause(name) if pause_alive => {
            NamespaceChoice::Join(format!("/proc/{}/ns/{name}", s.pid))
        }
        MemberNamespace::Pause(_) | MemberNamespace::Own => NamespaceChoice::Own,
    })
}

/// Whether a container (its namespaces already placed by [`join_pod_namespaces`]) lives in
/// the pod's IPC namespace, and so gets the pod's /dev/shm: it joins the pause process's
/// (the path CRI and [`join_pod_namespaces`] write), or its spec names no IPC namespace at all
/// (the node's, as in a host-IPC pod). One with an IPC namespace of its own, or another
/// process's, keeps its own /dev/shm: POSIX shared memory there must not meet the pod's.
fn shares_pod_ipc(s: &Sandbox, spec: &serde_json::Value) -> bool {
    match oci::namespace_place(spec, "ipc") {
        oci::NamespacePlace::Inherited => true,
        oci::NamespacePlace::New => false,
        oci::NamespacePlace::Joins(path) => s.pid != 0 && path == format!("/proc/{}/ns/ipc", s.pid),
    }
}

/// The level a pod's containers are moved to ([`crate::pod::mcs_level`]), if any.
fn pod_level(s: &Sandbox) -> Option<&str> {
    crate::pod::mcs_level::pod_level(
        s.record.mcs.as_ref().map(|r| r.level.as_str()),
        s.spec.selinux.as_ref(),
    )
}

/// The files the pod gives each container, and its /dev/shm to those in its IPC namespace.
fn pod_mounts(s: &Sandbox, shares_ipc: bool) -> Vec<PodMount> {
    let file = |destination: &'static str, name: &str| PodMount {
        destination,
        source: s.record.files_dir.join(name),
        follows_readonly_root: true,
    };
    let mut v = vec![
        file("/etc/hosts", crate::pod::files::HOSTS),
        file("/etc/resolv.conf", crate::pod::files::RESOLV_CONF),
        file("/etc/hostname", crate::pod::files::HOSTNAME),
    ];
    let shm = match &s.record.shm {
        _ if !shares_ipc => None,
        Some(shm) => Some(shm.clone()),
        None if s.spec.ipc == IpcMode::Host => Some(PathBuf::from("/dev/shm")),
        None => None,
    };
    if let Some(source) = shm {
        v.push(PodMount {
            destination: "/dev/shm",
            source,
            follows_readonly_root: false,
        });
    }
    v
}

impl PodHooks for SandboxManager {
    fn prepare_spec(&self, _container_id: &str, spec: &mut serde_json::Value) -> Result<bool> {
        let Some(s) = self.lock().clone() else {
            return Ok(false);
        };
        let joined = join_pod_namespaces(&s, spec);
        let shares_ipc = shares_pod_ipc(&s, spec);
        let moved = match pod_level(&s) {
            Some(level) => crate::pod::mcs_level::move_container(spec, level),
            None => None,
        };
        if let Some(m) = &moved {
            self.host
                .move_volume_labels(&m.volumes, &m.old_mount_label, &m.new_mount_label)
                .context("move the container's volumes to the pod's SELinux level")?;
        }
        // containerd gives each container a mount label (moved to the pod's level above); the
        // pod files it mounts get it where it is the pod's level, as containerd relabels them
        // on the runc path, else its shared form: a pod with no level (its containers' levels
        // differ), or a container at a level of its own, which must not take them from the
        // pod's other containers.
        if let Some(mount_label) = spec
            .pointer("/linux/mountLabel")
            .and_then(|l| l.as_str())
            .filter(|l| !l.is_empty())
        {
            self.host
                .label_pod_files(
                    &s.record.files_dir,
                    mount_label,
                    s.record.mcs.as_ref().map(|r| r.level.as_str()),
                )
                .context("label the pod files for the container")?;
        }
        let mounted = oci::add_pod_mounts(spec, &pod_mounts(&s, shares_ipc))?;
        Ok(joined || mounted || moved.is_some())
    }

    fn prepare_exec(&self, _container_id: &str, process: &mut serde_json::Value) -> Result<bool> {
        let Some(s) = self.lock().clone() else {
            return Ok(false);
        };
        Ok(pod_level(&s).is_some_and(|l| crate::pod::mcs_level::move_process(process, l)))
    }

    fn sandbox_pid(&self, id: &str) -> Option<u32> {
        self.lock()
            .as_ref()
            .filter(|s| s.id == id)
            .map(|s| s.pid as u32)
    }

    fn has_sandbox(&self) -> bool {
        self.lock().is_some()
    }

    fn add_member(&self, member: Member) -> Result<()> {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else {
            return Ok(());
        };
        s.record.members.retain(|m| m.id != member.id);
        s.record.members.push(member);
        save_record(&s.bundle, &s.record)
    }

    fn remove_member(&self, id: &str) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        let before = s.record.members.len();
        s.record.members.retain(|m| m.id != id);
        if s.record.members.len() != before
            && let Err(e) = save_record(&s.bundle, &s.record)
        {
            log::warn!("sandbox {}: {e}", s.id);
        }
    }
}
