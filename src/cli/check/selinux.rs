//! SELinux as the shim finds it (`crate::host::selinux::Selinux::detect`): off, permissive or
//! enforcing, and whether the policy names container contexts (`lxc_contexts`), without
//! which the shim labels nothing.

use std::path::Path;

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `None`: no writable selinuxfs (disabled); else whether `enforce` is 1 (an `enforce`
    /// that cannot be read counts as enforcing: the shim labels all the same).
    pub enforcing: Option<bool>,
    /// The policy names container contexts: the shim labels pod files and the pause.
    pub container_contexts: bool,
}

pub fn gather(node: &dyn Node) -> Facts {
    let mountinfo = node
        .read(Path::new("/proc/self/mountinfo"))
        .unwrap_or_default();
    let enforcing = crate::host::selinux::writable_selinuxfs(&mountinfo).map(|fs| {
        node.read(&fs.join("enforce"))
            .map_or(true, |e| e.trim() == "1")
    });
    let detected =
        crate::host::selinux::Selinux::detect_with(&mountinfo, Path::new("/etc/selinux"), &|p| {
            node.read(p)
        });
    Facts {
        enforcing,
        container_contexts: detected.enabled(),
    }
}

pub fn facts_json(f: &Facts) -> Value {
    json!({
        "mode": match f.enforcing {
            None => "disabled",
            Some(false) => "permissive",
            Some(true) => "enforcing",
        },
        "container_contexts": f.container_contexts,
    })
}

pub fn judge(f: &Facts) -> Finding {
    match (f.enforcing, f.container_contexts) {
        (None, _) => Finding::new("selinux", Status::Ok, "SELinux is disabled"),
        (Some(e), true) => Finding::new(
            "selinux",
            Status::Ok,
            format!(
                "SELinux {}: the shim labels the pod files, /dev/shm and the pause with the policy's container contexts",
                if e { "enforcing" } else { "permissive" }
            ),
        ),
        (Some(false), false) => Finding::new(
            "selinux",
            Status::Info,
            "SELinux permissive, and the policy names no container contexts: nothing is labelled",
        ),
        (Some(true), false) => Finding::new(
            "selinux",
            Status::Warn,
            "SELinux enforcing, but the policy names no container contexts (lxc_contexts)",
        )
        .detail("the shim labels nothing and the pause runs under the shim's own label; the policy may deny pods")
        .fix("install the container policy (container-selinux)"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::node::fake::FakeNode;
    use super::*;

    const MOUNTINFO: &str =
        "22 1 0:21 / /sys/fs/selinux rw,relatime shared:4 - selinuxfs selinuxfs rw\n";
    const LXC: &str = "process = \"system_u:system_r:container_t:s0\"\nfile = \"system_u:object_r:container_file_t:s0\"\n";

    #[test]
    fn each_selinux_state_has_its_verdict() {
        let n = FakeNode::default();
        let f = gather(&n);
        assert_eq!(judge(&f).status, Status::Ok);
        assert_eq!(facts_json(&f)["mode"], "disabled");

        // Enforcing with container-selinux's contexts (a Fedora/RHEL node).
        let mut n = FakeNode::default();
        n.file("/proc/self/mountinfo", MOUNTINFO)
            .file("/sys/fs/selinux/enforce", "1")
            .file(
                "/etc/selinux/config",
                "SELINUX=enforcing\nSELINUXTYPE=targeted\n",
            )
            .file("/etc/selinux/targeted/contexts/lxc_contexts", LXC);
        let f = gather(&n);
        assert_eq!(
            f,
            Facts {
                enforcing: Some(true),
                container_contexts: true
            }
        );
        assert_eq!(judge(&f).status, Status::Ok);
        assert_eq!(facts_json(&f)["mode"], "enforcing");

        // Enforcing without them.
        n.files
            .remove(Path::new("/etc/selinux/targeted/contexts/lxc_contexts"));
        assert_eq!(judge(&gather(&n)).status, Status::Warn);

        // Permissive without them.
        n.file("/sys/fs/selinux/enforce", "0");
        let f = gather(&n);
        assert_eq!(judge(&f).status, Status::Info);
        assert_eq!(facts_json(&f)["mode"], "permissive");
    }
}
