//! `containerd-shim-rsandbox-v1 check` (issue 25 item 2) against the bench's real containerd
//! 2.1.9: the installed shim binary judges the bench's config, and configs the test writes
//! (each read by containerd's own `config dump`): rsandbox as the default runtime, an options
//! table on the handler, a drop-in (the .deb's snippet, hack/release/rsandbox.toml) imported or
//! not, a drop-in of a higher config version; and a kubelet older than 1.35 in `$PATH`. The verdicts for containerd versions CI does not
//! run are the unit tests' (src/cli/check/containerd/tests.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

use rsandbox_integration::*;

fn shim() -> PathBuf {
    prefix().join("usr/bin").join(SHIM)
}

fn containerd() -> PathBuf {
    prefix().join("usr/bin/containerd")
}

/// Runs `check -json` with `args`; the exit status and the document.
fn check(args: &[&str]) -> (i32, serde_json::Value) {
    check_with_env(&[], args)
}

/// `check` with `env` set for it.
fn check_with_env(env: &[(&str, &str)], args: &[&str]) -> (i32, serde_json::Value) {
    let out = run_timeout(
        {
            let mut c = Command::new(shim());
            c.arg("check").arg("-json").args(args);
            c.envs(env.iter().copied());
            c
        },
        None,
        HANG,
    );
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check printed no JSON ({e}): {}\n{}",
            out.stdout, out.stderr
        )
    });
    (out.code.unwrap_or(-1), doc)
}

/// The status of finding `id` (the worst if several).
fn status(doc: &serde_json::Value, id: &str) -> String {
    let order = ["ok", "info", "warn", "block"];
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == id)
        .filter_map(|f| f["status"].as_str())
        .max_by_key(|s| order.iter().position(|o| o == s))
        .unwrap_or_else(|| panic!("no finding {id}: {doc:#}"))
        .to_string()
}

/// `check` against the bench: its containerd, config, the rsandbox handler and runc, then
/// `extra`, with `env` set for it.
fn check_bench(env: &[(&str, &str)], extra: &[&str]) -> (i32, serde_json::Value) {
    let (ctd, runc) = (containerd(), prefix().join("usr/bin/runc"));
    let bench_config = prefix().join("conf/containerd.toml");
    let mut args = vec![
        "-containerd",
        ctd.to_str().unwrap(),
        "-containerd-config",
        bench_config.to_str().unwrap(),
        "-runtime",
        "rsandbox",
        "-runc",
        runc.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    check_with_env(env, &args)
}

/// A containerd root config of the bench's layout in `dir` with `extra` appended.
fn config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const HANDLER_V3: &str = "version = 3\n\
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n\
    \x20 runtime_type = 'io.containerd.rsandbox.v1'\n  sandboxer = 'shim'\n";

#[test]
fn the_bench_is_fine_with_the_hostnetwork_warning() {
    let (code, doc) = check_bench(&[], &[]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["schema"], "rsandbox-check/v1");
    assert_eq!(doc["verdict"], "warn", "{doc:#}");
    assert_eq!(doc["facts"]["containerd"]["version"], "2.1.9");
    assert_eq!(status(&doc, "containerd.runtime"), "ok");
    assert_eq!(status(&doc, "containerd.host-network"), "warn");
    assert_eq!(status(&doc, "containerd.default-runtime"), "ok");
    assert_eq!(status(&doc, "containerd.options-table"), "ok");
    // The shim config comes from containerd's shim manager env, as the shim gets it.
    assert_eq!(
        doc["facts"]["shim_config"]["path"],
        prefix().join("conf/rsandbox.toml").to_str().unwrap()
    );
    assert_eq!(status(&doc, "shim.config"), "ok");
    assert_eq!(status(&doc, "runc.version"), "ok");
    // This binary is the one containerd starts (next to it).
    assert_eq!(status(&doc, "containerd.shim-binary"), "ok");
    for id in ["kernel.openat2", "kernel.pidfd", "kernel.memfd-seals"] {
        assert_eq!(status(&doc, id), "ok");
    }
    // No kubelet on the bench: notes, not warnings.
    assert_eq!(status(&doc, "restart.sandbox-order"), "info");
    assert_eq!(status(&doc, "restart.sandbox-names"), "info");
}

/// A kubelet 1.34 (before kubernetes PR 130551) where a node has one: `kubelet` in `$PATH`
/// (none runs on the bench, so `check` goes on to `$PATH` as on a node whose kubelet is
/// stopped). `check` runs it for its version and warns that a containerd restart can make it
/// re-create rsandbox pods; the warning does not block.
#[test]
fn a_kubelet_before_1_35_is_warned_about() {
    let dir = scratch_dir(&unique_id("check-kubelet"));
    let kubelet = dir.join("kubelet");
    std::fs::write(
        &kubelet,
        "#!/bin/sh\n[ \"$1\" = --version ] || exit 2\necho 'Kubernetes v1.34.2'\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &kubelet,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (code, doc) = check_bench(&[("PATH", &path)], &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(
        doc["facts"]["kubelet"]["binary"],
        kubelet.to_str().unwrap(),
        "{doc:#}"
    );
    assert_eq!(doc["facts"]["kubelet"]["version"], "1.34.2");
    assert_eq!(status(&doc, "restart.sandbox-order"), "warn");
    assert_eq!(status(&doc, "restart.sandbox-names"), "info");
}

/// Static pods bypass admission: a kubelet config whose `staticPodPath` holds a hostNetwork
/// pod on the rsandbox class (a kubeadm control-plane manifest with the class added) blocks on
/// containerd 2.1.9, whose CRI panics on it at every attempt; the same pod without hostNetwork
/// is a note (the admission policies do not see it).
#[test]
fn a_static_hostnetwork_pod_on_rsandbox_blocks() {
    let dir = scratch_dir(&unique_id("check-static"));
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let kubelet_config = config(
        &dir,
        "kubelet.yaml",
        &format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\n",
            manifests.display()
        ),
    );
    let pod = |host_network: bool| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\nspec:\n  \
             containers:\n  - command:\n    - etcd\n    image: registry.k8s.io/etcd:3.6.4-0\n    name: etcd\n  \
             hostNetwork: {host_network}\n  runtimeClassName: rsandbox\n"
        )
    };
    let args = ["-kubelet-config", kubelet_config.to_str().unwrap()];
    std::fs::write(manifests.join("etcd.yaml"), pod(true)).unwrap();
    let (code, doc) = check_bench(&[], &args);
    std::fs::write(manifests.join("etcd.yaml"), pod(false)).unwrap();
    let (code_plain, doc_plain) = check_bench(&[], &args);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(status(&doc, "static-pods.admission"), "block", "{doc:#}");
    assert_eq!(
        doc["facts"]["static_pods"]["on_rsandbox"][0]["host_network"], true,
        "{doc:#}"
    );
    assert_eq!(code_plain, 0, "{doc_plain:#}");
    assert_eq!(
        status(&doc_plain, "static-pods.admission"),
        "info",
        "{doc_plain:#}"
    );
}

/// Each hazard as containerd 2.1.9 itself reads the config.
#[test]
fn hazards_of_real_configs_on_2_1_9() {
    let dir = scratch_dir(&unique_id("check"));
    let conf_d = dir.join("conf.d");
    std::fs::create_dir_all(&conf_d).unwrap();
    let drop_in = conf_d.join("rsandbox.toml");
    let run = |root: &Path, runtime: Option<&str>| {
        let mut args = vec![
            "-containerd".to_string(),
            containerd().to_string_lossy().into_owned(),
            "-containerd-config".into(),
            root.to_string_lossy().into_owned(),
            "-drop-in".into(),
            drop_in.to_string_lossy().into_owned(),
        ];
        if let Some(r) = runtime {
            args.extend(["-runtime".into(), r.into()]);
        }
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        check(&a)
    };

    // rsandbox as the default runtime: blocking on 2.1.9.
    let root = config(
        &dir,
        "default.toml",
        &format!(
            "{HANDLER_V3}[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'rsandbox'\n"
        ),
    );
    let (code, doc) = run(&root, None);
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(doc["verdict"], "blocking");
    assert_eq!(status(&doc, "containerd.default-runtime"), "block");

    // An options table on the handler: blocking on 2.1.9.
    let root = config(
        &dir,
        "options.toml",
        &format!(
            "{HANDLER_V3}[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox.options]\n  SystemdCgroup = false\n"
        ),
    );
    let (code, doc) = run(&root, Some("rsandbox"));
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(status(&doc, "containerd.options-table"), "block");

    // The .deb's drop-in, in a conf.d the root config does not import: containerd reads no
    // handler; the installer's check (-runtime) blocks, a person's warns.
    let snippet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/release/rsandbox.toml");
    std::fs::copy(&snippet, &drop_in).unwrap();
    let root = config(&dir, "plain.toml", "version = 3\n");
    let (code, doc) = run(&root, Some("rsandbox"));
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(status(&doc, "containerd.drop-in"), "warn");
    assert_eq!(status(&doc, "containerd.runtime"), "block");
    let (code, doc) = run(&root, None);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(status(&doc, "containerd.runtime"), "warn");

    // Imported (relative, as containerd resolves it): containerd 2.1.9 reads the snippet and
    // finds the handler; nothing blocks.
    let root = config(
        &dir,
        "imports.toml",
        "version = 3\nimports = ['conf.d/*.toml']\n",
    );
    let (code, doc) = run(&root, Some("rsandbox"));
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(status(&doc, "containerd.drop-in"), "ok");
    assert_eq!(status(&doc, "containerd.runtime"), "ok");
    assert_eq!(status(&doc, "containerd.config-version"), "ok");
    assert_eq!(
        doc["facts"]["containerd"]["rsandbox_runtimes"],
        serde_json::json!(["rsandbox"])
    );

    // The same snippet (version 3) imported by a version 2 root: blocking.
    let root = config(
        &dir,
        "v2.toml",
        "version = 2\nimports = ['conf.d/*.toml']\n",
    );
    let (code, doc) = run(&root, Some("rsandbox"));
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(status(&doc, "containerd.config-version"), "block");

    // A config containerd cannot parse: blocking, with containerd's own message.
    let root = config(&dir, "broken.toml", "version = 3\n[plugins\n");
    let (code, doc) = run(&root, None);
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(status(&doc, "containerd.config"), "block");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let out = run_timeout(
        {
            let mut c = Command::new(shim());
            c.args(["check", "-no-such-flag"]);
            c
        },
        None,
        HANG,
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("-no-such-flag"), "{out:?}");
    let out = run_timeout(
        {
            let mut c = Command::new(shim());
            c.args(["check", "-h"]);
            c
        },
        None,
        HANG,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("-containerd-config"), "{out:?}");
}
