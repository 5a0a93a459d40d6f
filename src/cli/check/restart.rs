//! What a containerd restart does to running rsandbox pods, judged for this node. Both are
//! containerd's CRI recovery (`internal/cri/server/restart.go`, the same in 2.1.9 through
//! 2.4.0-beta.0 and containerd's main; see docs/limitations.md), which rebuilds sandboxes of
//! a `shim` sandboxer from their store records only:
//!
//! - **their `CreatedAt` is Go's zero time** in `ListPodSandbox` (`sandboxstore.Status{State:
//!   state}`, restart.go:150). A kubelet older than 1.35 takes the newest of a pod's sandboxes
//!   by `CreatedAt` alone; kubernetes PR 130551 ("order sandbox by attempt or create time",
//!   first in v1.35.0) orders by attempt first. Such a kubelet may kill and re-create a pod
//!   that has an old NotReady sandbox next to its current one: a warning, by the kubelet's
//!   version ([`super::kubelet`]);
//! - **their names are not reserved** (restart.go:157 only adds them to the store; the
//!   podsandbox loop also calls `sandboxNameIndex.Reserve`, :87): a second `RunPodSandbox`
//!   with a running pod's name and attempt succeeds, where the runc path refuses it ("failed
//!   to reserve sandbox name"). Every kubelet: a note.

use super::kubelet::{Facts, KubeletVersion};
use super::report::{Finding, Status};

/// The first kubelet minor that orders a pod's sandboxes by attempt first (kubernetes PR
/// 130551, in v1.35.0; not cherry-picked to 1.34 or older, see docs/limitations.md).
pub const SANDBOX_ORDER_FIXED: (u32, u32) = (1, 35);

/// What happens to a pod, for a person deciding whether to restart containerd.
const ORDER_HAZARD: &str = "\
after a containerd restart, ListPodSandbox gives every rsandbox sandbox Go's zero time as its
CreatedAt (containerd's CRI recovery does not restore it for a shim sandboxer). A kubelet older
than 1.35 takes a pod's newest sandbox by CreatedAt alone: for a pod with an old NotReady sandbox
next to its current one (a pod whose sandbox died once; every pod after a node reboot, while the
kubelet keeps its exited containers) it may take the old one for the current one, kill the pod
and create it again. Kubelets from 1.35 order by attempt first (kubernetes PR 130551).";

pub fn judge(kubelet: &Facts) -> Vec<Finding> {
    vec![sandbox_order(kubelet), sandbox_names()]
}

fn sandbox_order(k: &Facts) -> Finding {
    let (fa, fb) = SANDBOX_ORDER_FIXED;
    let cannot_tell = |summary: String| {
        Finding::new("restart.sandbox-order", Status::Info, summary)
            .detail(format!("if it is older than {fa}.{fb}: {ORDER_HAZARD}"))
    };
    let Some(bin) = &k.binary else {
        return match &k.config {
            Some(c) => cannot_tell(format!(
                "the kubelet's version cannot be told: {} exists, but no kubelet binary was found \
                 (not running as `kubelet`, not in $PATH, /usr/bin or /usr/local/bin)",
                c.display()
            )),
            None => Finding::new(
                "restart.sandbox-order",
                Status::Info,
                "no kubelet on this node: no kubelet's sandbox order to judge",
            ),
        };
    };
    let bin = bin.describe();
    let v: &KubeletVersion = match &k.version {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            return cannot_tell(format!("the kubelet's version cannot be told: {bin}: {e}"));
        }
        None => unreachable!("gather runs --version when it finds the kubelet"),
    };
    match v.number {
        Some((0, _, _)) => cannot_tell(format!(
            "the kubelet's version cannot be told: {bin} says {:?} (a development build)",
            v.line
        )),
        // Merged during 1.35's development: which pre-release has it is not known here.
        Some((a, b, 0)) if (a, b) == SANDBOX_ORDER_FIXED && v.pre.is_some() => {
            cannot_tell(format!(
                "{bin}: {:?} is a {fa}.{fb} pre-release: whether it has kubernetes PR 130551 is not known",
                v.line
            ))
        }
        Some((a, b, _)) if (a, b) >= SANDBOX_ORDER_FIXED => Finding::new(
            "restart.sandbox-order",
            Status::Ok,
            format!(
                "{bin}: {}: orders a pod's sandboxes by attempt; a containerd restart's zero CreatedAt does not disturb it",
                v.line
            ),
        ),
        Some(_) => Finding::new(
            "restart.sandbox-order",
            Status::Warn,
            format!(
                "{bin}: {} is older than {fa}.{fb}: a containerd restart can make it kill and re-create rsandbox pods",
                v.line
            ),
        )
        .detail(ORDER_HAZARD)
        .fix(format!(
            "upgrade the kubelet to {fa}.{fb} or later (or to a build that carries kubernetes PR 130551); \
             until then restart containerd only with the node's rsandbox pods drained"
        )),
        None => cannot_tell(format!(
            "the kubelet's version cannot be told: {bin} says {:?}",
            v.line
        )),
    }
}

fn sandbox_names() -> Finding {
    Finding::new(
        "restart.sandbox-names",
        Status::Info,
        "after a containerd restart, rsandbox sandboxes' names are not reserved: a second RunPodSandbox with a running pod's name and attempt succeeds",
    )
    .detail(
        "\
containerd's CRI recovery reserves only the names of runc-path (podsandbox) sandboxes. After a
restart, a RunPodSandbox with the name and attempt of an rsandbox sandbox that still exists
creates a second sandbox of that name; the runc path refuses it
(\"failed to reserve sandbox name\") until the first is removed. Any kubelet; containerd 2.1 to 2.4.",
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::kubelet::Found;
    use super::*;

    fn facts(version: Option<Result<&str, &str>>, config: bool) -> Facts {
        Facts {
            binary: version
                .is_some()
                .then(|| Found::Installed("/usr/bin/kubelet".into())),
            version: version.map(|v| v.map(KubeletVersion::parse).map_err(String::from)),
            config: config.then(|| PathBuf::from("/var/lib/kubelet/config.yaml")),
        }
    }

    fn order(f: &Facts) -> Finding {
        judge(f)
            .into_iter()
            .find(|f| f.id == "restart.sandbox-order")
            .unwrap()
    }

    /// The kubelets the issue ran (1.36.2: not disturbed) and one built before PR 130551.
    #[test]
    fn a_kubelet_before_1_35_is_a_warning_and_1_35_on_is_fine() {
        for (line, want) in [
            ("Kubernetes v1.34.7", Status::Warn),
            ("Kubernetes v1.32.3-eks-4096722", Status::Warn),
            ("Kubernetes v1.29.0", Status::Warn),
            ("Kubernetes v1.35.0", Status::Ok),
            ("Kubernetes v1.35.0+k3s1", Status::Ok),
            ("Kubernetes v1.36.2", Status::Ok),
            ("Kubernetes v2.0.0", Status::Ok),
        ] {
            let f = order(&facts(Some(Ok(line)), true));
            assert_eq!(f.status, want, "{line}: {f:?}");
            assert!(f.summary.contains(line), "{f:?}");
        }
        let w = order(&facts(Some(Ok("Kubernetes v1.34.2")), true));
        assert!(w.detail.contains("zero time"), "{w:?}");
        assert!(w.detail.contains("kill the pod"), "{w:?}");
        assert!(w.fix.contains("1.35"), "{w:?}");
    }

    /// Not knowing is said, as a note that still tells the hazard; it never warns or blocks.
    #[test]
    fn what_cannot_be_told_is_a_note() {
        for f in [
            facts(Some(Err("run /usr/bin/kubelet: timed out")), true),
            facts(Some(Ok("kubelet, a fork")), false),
            facts(Some(Ok("Kubernetes v0.0.0-master+$Format:%H$")), true),
            facts(Some(Ok("Kubernetes v1.35.0-alpha.1")), true),
            // k3s: the kubelet is inside the k3s binary; only its config is found.
            facts(None, true),
        ] {
            let o = order(&f);
            assert_eq!(o.status, Status::Info, "{o:?}");
            assert!(
                o.summary.contains("cannot be told") || o.summary.contains("not known"),
                "{o:?}"
            );
            assert!(o.detail.contains("older than 1.35"), "{o:?}");
        }
    }

    /// A containerd host without Kubernetes: nothing to warn about.
    #[test]
    fn no_kubelet_at_all_is_neither_a_warning_nor_unknown() {
        let o = order(&facts(None, false));
        assert_eq!(o.status, Status::Info);
        assert!(o.summary.starts_with("no kubelet"), "{o:?}");
    }

    /// The duplicate-name note is there whatever the kubelet.
    #[test]
    fn the_name_hazard_is_always_noted() {
        for f in [
            facts(None, false),
            facts(Some(Ok("Kubernetes v1.36.2")), true),
        ] {
            let n = judge(&f)
                .into_iter()
                .find(|f| f.id == "restart.sandbox-names")
                .unwrap();
            assert_eq!(n.status, Status::Info);
            assert!(n.detail.contains("failed to reserve sandbox name"), "{n:?}");
        }
    }
}
