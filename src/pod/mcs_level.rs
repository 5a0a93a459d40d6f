//! One SELinux MCS level for all the containers of a pod, as on containerd's runc path.
//!
//! On the runc path every container of a pod runs at the pause's level: containerd gives a
//! container without SELinux options of its own the sandbox's process label
//! (`internal/cri/server/container_create.go:767-781`, `selinux.DupSecOpt(sandbox.ProcessLabel)`).
//! A shim sandboxer cannot hand containerd that label: the sandbox API's StartSandboxResponse
//! has no labels (containerd 2.1 to today's main), so `sandbox.ProcessLabel` stays empty and
//! containerd draws fresh categories for each container, relabelling each one's volumes with
//! that container's own mount label (`label.Relabel(src, mountLabel, false)`,
//! `internal/cri/opts/spec_linux_opts.go:203-206`). A pod's containers could then not share
//! files: an emptyDir of two containers is usable only by the one created last, and what one
//! writes is at a level the other does not dominate.
//!
//! So a container of a pod whose level the shim chose (its `selinux_options` name no level) is
//! moved to the pod's level before `runc create`: its process label and its mount label get the
//! pause's level ([`move_container`]), and each volume containerd relabelled for it (a bind
//! mount whose source carries exactly the container's original mount label) is relabelled with
//! the new one ([`crate::host::relabel::move_tree`]). An exec is moved the same way
//! ([`move_process`]): containerd sends it with the container's original label.
//!
//! A pod whose options name a level is left alone: the kubelet gives that level to each of its
//! containers that names none, so a container at another level asked for it. In a pod without a
//! level, a container that names a level of its own is moved too: nothing in what containerd
//! sends tells a level it drew from one a pod asked for.

use serde_json::Value;

use crate::host::selinux::Label;

/// A container moved to the pod's level: the mount label containerd gave it and the one it now
/// has, and the bind mount sources that may carry the old one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedContainer {
    pub old_mount_label: String,
    pub new_mount_label: String,
    pub volumes: Vec<std::path::PathBuf>,
}

/// Whether a pod's containers are moved to its level: a level was reserved for the pod (SELinux
/// labels its pause) and its options name none.
pub fn pod_level<'a>(
    reserved: Option<&'a str>,
    options: Option<&crate::host::selinux::SelinuxOptions>,
) -> Option<&'a str> {
    let asked = options.is_some_and(|o| !o.level.is_empty());
    reserved.filter(|_| !asked)
}

/// `label` at `level`, if it is a label at another level (`None`: nothing to move).
fn relevel(label: &str, level: &str) -> Option<String> {
    let mut l = Label::parse(label)?;
    if l.level.is_empty() || l.level == level {
        return None;
    }
    l.level = level.to_string();
    Some(l.to_string())
}

/// Moves an exec's process (`process.json`) to the pod's `level`; whether it changed.
pub fn move_process(process: &mut Value, level: &str) -> bool {
    let Some(new) = process
        .get("selinuxLabel")
        .and_then(Value::as_str)
        .and_then(|l| relevel(l, level))
    else {
        return false;
    };
    process["selinuxLabel"] = Value::String(new);
    true
}

/// Moves a container's spec to the pod's `level`: `process.selinuxLabel` and
/// `linux.mountLabel`, or the mount label alone for a privileged container (containerd clears
/// its process label, `container_create.go:329-333` in v2.1.9, but keeps its mount label at
/// the categories it drew and relabels its volumes with it; on the runc path that label is the
/// sandbox's). `None` when it is at that level already or a label is not one.
pub fn move_container(spec: &mut Value, level: &str) -> Option<MovedContainer> {
    let old_mount_label = spec
        .pointer("/linux/mountLabel")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let new_mount_label = relevel(&old_mount_label, level)?;
    let unlabelled = spec
        .pointer("/process/selinuxLabel")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    // A labelled process and its mounts move together or not at all: a process moved over
    // mounts left at the old level could not read its own files. An unlabelled one (spc_t)
    // reads either.
    if !unlabelled && !move_process(spec.get_mut("process")?, level) {
        return None;
    }
    spec["linux"]["mountLabel"] = Value::String(new_mount_label.clone());
    Some(MovedContainer {
        old_mount_label,
        new_mount_label,
        volumes: bind_sources(spec),
    })
}

/// The absolute sources of the spec's bind mounts (the volumes CRI may have relabelled).
fn bind_sources(spec: &Value) -> Vec<std::path::PathBuf> {
    let Some(mounts) = spec.get("mounts").and_then(Value::as_array) else {
        return Vec::new();
    };
    mounts
        .iter()
        .filter(|m| {
            m.get("type").and_then(Value::as_str) == Some("bind")
                || m.get("options")
                    .and_then(Value::as_array)
                    .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
        })
        .filter_map(|m| m.get("source").and_then(Value::as_str))
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::selinux::SelinuxOptions;
    use serde_json::json;

    /// What containerd 2.1.9's CRI writes for a container of a shim-sandboxer pod without
    /// options: `WithSelinuxLabels(processLabel, mountLabel)` at categories it drew, its
    /// volumes as `WithMounts` adds them (`rbind`), the rootfs and /proc untouched.
    fn cri_spec() -> Value {
        json!({
            "process": {
                "args": ["sh"],
                "selinuxLabel": "system_u:system_r:container_t:s0:c4,c811"
            },
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
                {"destination": "/data", "type": "bind",
                 "source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/data",
                 "options": ["rbind", "rprivate", "rw"]},
                {"destination": "/etc/hosts", "source": "/run/x/hosts", "options": ["rbind", "ro"]},
                {"destination": "/rel", "type": "bind", "source": "relative", "options": ["rbind"]}
            ],
            "linux": {"mountLabel": "system_u:object_r:container_file_t:s0:c4,c811"}
        })
    }

    #[test]
    fn a_container_at_its_own_categories_moves_to_the_pods_with_its_volumes() {
        let mut spec = cri_spec();
        let moved = move_container(&mut spec, "s0:c17,c90").unwrap();
        assert_eq!(
            spec["process"]["selinuxLabel"],
            "system_u:system_r:container_t:s0:c17,c90"
        );
        assert_eq!(
            spec["linux"]["mountLabel"],
            "system_u:object_r:container_file_t:s0:c17,c90"
        );
        assert_eq!(
            moved,
            MovedContainer {
                old_mount_label: "system_u:object_r:container_file_t:s0:c4,c811".into(),
                new_mount_label: "system_u:object_r:container_file_t:s0:c17,c90".into(),
                volumes: vec![
                    "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/data".into(),
                    "/run/x/hosts".into()
                ],
            }
        );
        // Moved once: a second pass finds it at the pod's level.
        assert_eq!(move_container(&mut spec, "s0:c17,c90"), None);
    }

    /// A privileged container: containerd clears its process label and keeps its mount label
    /// at the categories it drew, relabelling its volumes with it; they move to the pod's
    /// level (an emptyDir it shares with the pod's other containers stays theirs), its process
    /// stays unlabelled.
    #[test]
    fn a_privileged_container_s_mounts_move_and_its_process_stays_unlabelled() {
        for unlabelled in [json!(""), Value::Null] {
            let mut spec = cri_spec();
            match &unlabelled {
                Value::Null => {
                    spec["process"]
                        .as_object_mut()
                        .unwrap()
                        .remove("selinuxLabel");
                }
                l => spec["process"]["selinuxLabel"] = l.clone(),
            }
            let moved = move_container(&mut spec, "s0:c1,c2").expect("its mounts move");
            assert_eq!(
                moved.new_mount_label,
                "system_u:object_r:container_file_t:s0:c1,c2"
            );
            assert_eq!(moved.volumes.len(), 2);
            assert_eq!(spec["linux"]["mountLabel"], moved.new_mount_label.as_str());
            assert_eq!(
                spec["process"].get("selinuxLabel"),
                unlabelled.as_str().map(|_| &unlabelled)
            );
        }
    }

    #[test]
    fn odd_labels_stay() {
        let mut spec = cri_spec();
        spec["process"]["selinuxLabel"] = json!("system_u:system_r:container_t");
        assert_eq!(move_container(&mut spec, "s0:c1,c2"), None);
        spec["process"]["selinuxLabel"] = json!("bad label\"");
        assert_eq!(move_container(&mut spec, "s0:c1,c2"), None);
        assert_eq!(move_container(&mut json!({}), "s0:c1,c2"), None);
        // A process label without a mount label to move with it: neither moves.
        let mut spec = cri_spec();
        spec["linux"]["mountLabel"] = json!("");
        let before = spec.clone();
        assert_eq!(move_container(&mut spec, "s0:c1,c2"), None);
        assert_eq!(spec, before);
    }

    #[test]
    fn an_exec_moves_with_its_container() {
        let mut p =
            json!({"args": ["ls"], "selinuxLabel": "system_u:system_r:container_t:s0:c4,c811"});
        assert!(move_process(&mut p, "s0:c17,c90"));
        assert_eq!(
            p["selinuxLabel"],
            "system_u:system_r:container_t:s0:c17,c90"
        );
        assert!(!move_process(&mut p, "s0:c17,c90"));
        assert!(!move_process(&mut json!({"args": ["ls"]}), "s0:c17,c90"));
    }

    #[test]
    fn only_a_pod_without_a_level_of_its_own_moves_its_containers() {
        let none = SelinuxOptions::default();
        let typed = SelinuxOptions {
            kind: "spc_t".into(),
            ..Default::default()
        };
        let leveled = SelinuxOptions {
            level: "s0:c1,c2".into(),
            ..Default::default()
        };
        assert_eq!(pod_level(Some("s0:c5,c6"), None), Some("s0:c5,c6"));
        assert_eq!(pod_level(Some("s0:c5,c6"), Some(&none)), Some("s0:c5,c6"));
        assert_eq!(pod_level(Some("s0:c5,c6"), Some(&typed)), Some("s0:c5,c6"));
        assert_eq!(pod_level(Some("s0:c1,c2"), Some(&leveled)), None);
        assert_eq!(pod_level(None, None), None);
    }
}
