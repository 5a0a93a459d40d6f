//! Issue 16: user-namespaced pods (`hostUsers: false`, CRI `userns_options` mode POD with one
//! mapping of 65536 ids, as the kubelet sends).
//!
//! Which part runs depends on the bench's runc (`$RSANDBOX_PREFIX/usr/bin/runc`, which
//! `RSANDBOX_RUNC=1.1|1.3` selects and `hack/test.sh` runs with each; else `runc` from PATH:
//! what both CRI handlers and the shim run), and one part always runs:
//! * runc >= 1.2 (idmapped mounts): the pod runs on the `rsandbox` handler and on containerd's
//!   own `runc` handler, and both agree: `id` in the container is 0:0, `/proc/self/uid_map` and
//!   `gid_map` show the mapping, a file the container's root creates in a hostPath volume is
//!   owned by the mapped host id on the node, the pod files are root's inside, /dev/shm is
//!   writable; on `rsandbox` the pause holds the user namespace with that mapping, its IPC and
//!   UTS namespaces belong to it and its mount namespace to the node's (issue 20).
//! * runc < 1.2: RunPodSandbox on `rsandbox` fails and names the runc version found, and leaves
//!   nothing behind.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{self, Pod, container_config};
use rsandbox_integration::*;

type R = Result<(), String>;

/// The host id container id 0 maps to (uids and gids), far from any id the node uses.
const HOST_ID: u32 = 1_200_000_000;
const SIZE: u32 = 65536;

/// The runc both handlers and the shim use on the bench.
fn bench_runc() -> PathBuf {
    let bench = prefix().join("usr/bin/runc");
    if bench.exists() {
        return bench;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("runc"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/runc"))
}

/// `runc --version`: its first line and (major, minor).
fn runc_version(runc: &Path) -> (String, (u32, u32)) {
    let out = Command::new(runc).arg("--version").output().unwrap();
    assert!(
        out.status.success(),
        "{} --version: {out:?}",
        runc.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_string();
    let number = line.split_whitespace().nth(2).unwrap_or("");
    let mut parts = number.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    (line, (major, minor))
}

fn mapping() -> Vec<IdMapping> {
    vec![IdMapping {
        host_id: HOST_ID,
        container_id: 0,
        length: SIZE,
    }]
}

fn userns_options() -> UserNamespace {
    UserNamespace {
        mode: NamespaceMode::Pod as i32,
        uids: mapping(),
        gids: mapping(),
    }
}

/// A pod of `hostUsers: false`.
fn userns_pod(name: &str, dir: &Path) -> PodSandboxConfig {
    let mut cfg = pods::pod_config(name, dir);
    if let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.userns_options = Some(userns_options());
    }
    cfg
}

/// A sleeping container of that pod (the kubelet repeats the pod's userns_options in each
/// container's config) with `volume` of the node at /vol (a hostPath volume).
fn member(volume: &Path) -> ContainerConfig {
    let mut c = container_config("sleeper", &["sleep", "3600"]);
    let linux = c.linux.get_or_insert_default();
    linux
        .security_context
        .get_or_insert_default()
        .namespace_options
        .get_or_insert_default()
        .userns_options = Some(userns_options());
    c.mounts.push(Mount {
        container_path: "/vol".into(),
        host_path: volume.to_string_lossy().into_owned(),
        ..Default::default()
    });
    c
}

/// The three numbers of a one-line `/proc/<pid>/{uid,gid}_map`.
fn map_fields(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

async fn probe(p: &mut Pod, cid: &str, volume: &Path) -> R {
    let h = p.handler.clone();
    let want = [0, HOST_ID, SIZE].map(|n| n.to_string()).to_vec();
    let (rc, out, err) = p.sh(cid, "id -u; id -g").await?;
    ensure!(rc == 0, "{h}: id: {err}");
    ensure!(
        out.split_whitespace().collect::<Vec<_>>() == ["0", "0"],
        "{h}: id in the container: {out:?}"
    );
    for map in ["uid_map", "gid_map"] {
        let (rc, out, err) = p.sh(cid, &format!("cat /proc/self/{map}")).await?;
        ensure!(rc == 0, "{h}: cat /proc/self/{map}: {err}");
        ensure!(
            map_fields(&out) == want,
            "{h}: /proc/self/{map} in the container: {out:?}"
        );
    }
    let file = format!("made-by-{h}");
    let (rc, _, err) = p.sh(cid, &format!("touch /vol/{file}")).await?;
    ensure!(rc == 0, "{h}: touch /vol/{file}: {err}");
    let meta = std::fs::metadata(volume.join(&file)).map_err(|e| format!("{h}: {e}"))?;
    ensure!(
        (meta.uid(), meta.gid()) == (HOST_ID, HOST_ID),
        "{h}: the file the container's root made in the volume is {}:{} on the node, want \
         {HOST_ID}:{HOST_ID}",
        meta.uid(),
        meta.gid()
    );
    // The pod files are the container root's, /dev/shm is writable.
    let (rc, out, err) = p
        .sh(
            cid,
            "stat -c '%u:%g' /etc/hosts /etc/hostname /etc/resolv.conf && touch /dev/shm/x",
        )
        .await?;
    ensure!(rc == 0, "{h}: stat the pod files, touch /dev/shm/x: {err}");
    ensure!(
        out.lines().all(|l| l == "0:0"),
        "{h}: owners of /etc/hosts, /etc/hostname, /etc/resolv.conf: {out:?}"
    );
    if h == HANDLER {
        // The pause holds the pod's user namespace with the mapping.
        let pause = pause_procs_of(&p.id);
        ensure!(pause.len() == 1, "{h}: pause processes {}", pause.len());
        let uid_map = std::fs::read_to_string(format!("/proc/{}/uid_map", pause[0].pid))
            .map_err(|e| format!("{h}: the pause's uid_map: {e}"))?;
        ensure!(
            map_fields(&uid_map) == want,
            "{h}: the pause's uid_map: {uid_map:?}"
        );
        // Issue 20: its IPC and UTS namespaces are the pod's user namespace's (the containers
        // join them), its mount namespace is the node's: no process of the pod can enter it.
        let pid = pause[0].pid;
        let user = ns_ino(&format!("/proc/{pid}/ns/user"))?;
        for kind in ["ipc", "uts"] {
            let owner = owner_of(&format!("/proc/{pid}/ns/{kind}"))?;
            ensure!(
                owner == user,
                "{h}: the pause's {kind} namespace is not the pod's"
            );
        }
        let node = ns_ino("/proc/self/ns/user")?;
        let owner = owner_of(&format!("/proc/{pid}/ns/mnt"))?;
        ensure!(
            owner == node && owner != user,
            "{h}: the pause's mount namespace belongs to user namespace {owner}, not the node's \
             ({node}; the pod's: {user})"
        );
    }
    Ok(())
}

/// The inode of the namespace at `path`.
fn ns_ino(path: &str) -> Result<u64, String> {
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|e| format!("stat {path}: {e}"))
}

/// The inode of the user namespace that owns the namespace at `path` (NS_GET_USERNS).
fn owner_of(path: &str) -> Result<u64, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let f = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    // SAFETY: NS_GET_USERNS returns a new descriptor (or -1), which we own.
    let fd = unsafe { libc::ioctl(f.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(format!(
            "NS_GET_USERNS {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above.
    let owner = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    owner
        .metadata()
        .map(|m| m.ino())
        .map_err(|e| format!("stat the owner of {path}: {e}"))
}

async fn run_userns_pod(handler: &str, dir: &Path) -> (R, Vec<String>) {
    let name = unique_id(&format!("userns-{handler}"));
    let volume = dir.join(format!("vol-{handler}"));
    std::fs::create_dir_all(&volume).unwrap();
    // A hostPath volume the pod's root may write to, as a node admin would prepare it.
    std::os::unix::fs::chown(&volume, Some(HOST_ID), Some(HOST_ID)).unwrap();
    let mut pod = match Pod::run(handler, userns_pod(&name, dir)).await {
        Ok(p) => p,
        Err(e) => return (Err(e), vec![name]),
    };
    let res = async {
        let cid = pod.start(member(&volume)).await?;
        probe(&mut pod, &cid, &volume).await
    }
    .await;
    let removed = pod.remove().await;
    let mut ids = pod.ids();
    ids.push(name);
    (res.and(removed), ids)
}

#[tokio::test]
async fn a_user_namespaced_pod_runs_or_is_refused_by_runc_version() {
    let g = Guard::new();
    let runc = bench_runc();
    let (line, version) = runc_version(&runc);
    let dir = scratch_dir(&unique_id("userns"));
    let mut all_ids = Vec::new();
    let mut failures = Vec::new();
    if version >= (1, 2) {
        eprintln!(
            "runc {} is {line:?}: running a user-namespaced pod on both handlers",
            runc.display()
        );
        for handler in [HANDLER, RUNC_HANDLER] {
            let (res, ids) = run_userns_pod(handler, &dir).await;
            if let Err(e) = res {
                failures.push(format!(
                    "{e}\n--- containerd log ---\n{}",
                    log_lines(&ids[0], 20)
                ));
            }
            all_ids.extend(ids);
        }
    } else {
        eprintln!(
            "runc {} is {line:?}: a user-namespaced pod must be refused (needs runc >= 1.2)",
            runc.display()
        );
        let name = unique_id("userns-refused");
        all_ids.push(name.clone());
        match Pod::run(HANDLER, userns_pod(&name, &dir)).await {
            Ok(mut pod) => {
                all_ids.extend(pod.ids());
                let _ = pod.remove().await;
                failures.push(format!("{HANDLER}: RunPodSandbox succeeded with {line:?}"));
            }
            Err(e) => {
                if !(e.contains("need runc >= 1.2") && e.contains(&line)) {
                    failures.push(format!(
                        "{HANDLER}: the refusal does not name the runc version {line:?}: {e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    g.assert_clean(&all_ids);
    let _ = std::fs::remove_dir_all(&dir);
}
