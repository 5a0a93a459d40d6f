//! containerd's sandbox controller API (`containerd.services.sandbox.v1.Controller`) with the
//! `shim` sandboxer and our runtime, without CRI, with a netns made by the test (`ip netns
//! add`): the lifecycle, and the pause process's name. Without a netns the shim owns the pod's
//! network: see `network.rs`.

use rsandbox_integration::controller::*;
use rsandbox_integration::events::EventStream;
use rsandbox_integration::*;

/// A named netns (`ip netns add`), deleted on drop.
struct NetNs(String);

impl NetNs {
    fn new(name: &str) -> NetNs {
        let o = run_timeout(
            {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "add", name]);
                c
            },
            None,
            HANG,
        );
        assert!(o.ok(), "ip netns add {name}: {o:?}");
        NetNs(name.into())
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[tokio::test]
async fn controller_lifecycle_with_a_netns() {
    let g = Guard::new();
    let id = unique_id("ctl");
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pid = create_and_start(&mut c, &id, &netns.path()).await?;
        let want = std::fs::metadata(netns.path()).map_err(|e| e.to_string())?;
        let got = std::fs::metadata(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
        use std::os::unix::fs::MetadataExt;
        if (want.dev(), want.ino()) != (got.dev(), got.ino()) {
            return Err(format!(
                "the pause process {pid} is not in {}",
                netns.path()
            ));
        }
        if pid == 0 {
            return Err("Start returned pid 0".into());
        }
        let s = status(&mut c, &id).await?;
        if s.state != "SANDBOX_READY" || s.pid != pid {
            return Err(format!("status after start: {s:?}"));
        }
        // Issue 14 item 9: flat `pid` and `state` keys in info, through containerd.
        let flat = (s.info.get("pid"), s.info.get("state"));
        if flat != (Some(&pid.to_string()), Some(&"SANDBOX_READY".to_string())) {
            return Err(format!("status info: {:?}", s.info));
        }
        if shim_daemons_for(&id).len() != 1 {
            return Err(format!("shims for {id}: {:?}", shim_procs()));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop(netns);
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id]);
}

/// `pgrep -f <pattern>`: the matching pids.
fn pgrep_f(pattern: &str) -> Vec<u32> {
    let mut cmd = std::process::Command::new("pgrep");
    cmd.args(["-f", pattern]);
    run_timeout(cmd, None, HANG)
        .stdout
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The pause process is not taken for a shim: `pgrep -f containerd-shim-rsandbox-v1` finds one
/// process per pod, and the pause process reads `rsandbox-pause <pod id>`, comm `pause`.
#[tokio::test]
async fn the_pause_process_is_recognisable() {
    let g = Guard::new();
    let id = unique_id("pausename");
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pid = create_and_start(&mut c, &id, &netns.path()).await?;
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|e| e.to_string())?;
        let args: Vec<&[u8]> = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        if args != [PAUSE_ARGV0.as_bytes(), id.as_bytes()] {
            return Err(format!(
                "/proc/{pid}/cmdline: {:?}",
                String::from_utf8_lossy(&raw)
            ));
        }
        let comm =
            std::fs::read_to_string(format!("/proc/{pid}/comm")).map_err(|e| e.to_string())?;
        if comm.trim() != "pause" {
            return Err(format!("comm of the pause process: {comm:?}"));
        }
        // One shim for the pod, found by its command line; the pause process is not among them.
        let shims: Vec<u32> = pgrep_f(SHIM)
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .contains(&format!(" -id {id} "))
                    })
                    .unwrap_or(false)
            })
            .collect();
        if shims.len() != 1 || shims.contains(&pid) {
            return Err(format!("pgrep -f {SHIM} for {id}: {shims:?} (pause {pid})"));
        }
        if pgrep_f(SHIM).contains(&pid) {
            return Err(format!("pgrep -f {SHIM} matches the pause process {pid}"));
        }
        let pauses = pgrep_f(&format!("^{PAUSE_ARGV0} {id}( |$)"));
        if pauses != [pid] {
            return Err(format!(
                "pgrep -f 'rsandbox-pause {id}': {pauses:?}, want [{pid}]"
            ));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop(netns);
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id]);
}

/// `ctr run --rm --sandbox <id> [extra] busybox <cid> sh -c <script>`: its stdout.
fn in_sandbox(id: &str, cid: &str, extra: &[&str], script: &str) -> Result<String, String> {
    let mut args = vec!["run", "--rm", "--sandbox", id, "--runtime", RUNTIME];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[BUSYBOX, cid, "sh", "-c", script]);
    let o = ctr("default", &args);
    if o.ok() {
        Ok(o.stdout)
    } else {
        Err(format!("{cid}: {o:?}"))
    }
}

/// Issue 14 item 9: a member container in an IPC namespace of its own keeps its own /dev/shm,
/// one in the pod's shares the pod's. (No runc counterpart: containerd's CRI never gives a
/// member an IPC namespace of its own, see `ipc_container_mode_behaves_as_with_runc` in
/// cri.rs, where both handlers are compared.)
#[tokio::test]
async fn a_member_in_its_own_ipc_namespace_keeps_its_own_shm() {
    let g = Guard::new();
    let id = unique_id("ownipc");
    let cids = [
        unique_id("ownipc-writer"),
        unique_id("ownipc-member"),
        unique_id("ownipc-own"),
    ];
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    // A process with an IPC namespace of its own (unshare execs sleep in place).
    let mut other = std::process::Command::new("unshare")
        .args(["--ipc", "sleep", "300"])
        .spawn()
        .expect("unshare --ipc sleep");
    store_record(&id).await;
    let res: Result<(), String> = async {
        create_and_start(&mut c, &id, &netns.path()).await?;
        let pod_ipc = in_sandbox(
            &id,
            &cids[0],
            &[],
            "echo pod > /dev/shm/marker; readlink /proc/self/ns/ipc",
        )?;
        let member = in_sandbox(
            &id,
            &cids[1],
            &[],
            "cat /dev/shm/marker; readlink /proc/self/ns/ipc",
        )?;
        if member != format!("pod\n{pod_ipc}") {
            return Err(format!(
                "a member in the pod's IPC namespace ({pod_ipc:?}) saw {member:?}"
            ));
        }
        let other_ns = format!("/proc/{}/ns/ipc", other.id());
        let other_ipc = std::fs::read_link(&other_ns).map_err(|e| e.to_string())?;
        let own = in_sandbox(
            &id,
            &cids[2],
            &["--with-ns", &format!("ipc:{other_ns}")],
            "ls -A /dev/shm; echo end; readlink /proc/self/ns/ipc",
        )?;
        let want = format!("end\n{}\n", other_ipc.display());
        if own != want {
            return Err(format!(
                "a member in another IPC namespace: {own:?}, want {want:?} (an empty /dev/shm of its own)"
            ));
        }
        Ok(())
    }
    .await;
    let _ = other.kill();
    let _ = other.wait();
    ctr_force_remove("default", &cids);
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop_store_record(&id).await;
    drop(netns);
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    let mut ids = vec![id];
    ids.extend(cids);
    g.assert_clean(&ids);
}

/// Issue 14 item 7: ShutdownSandbox deletes the members still there and the daemon exits right
/// after: their TaskDelete (published by the shim: it carries the `id`) still reaches
/// containerd.
#[tokio::test]
async fn the_last_events_of_a_shutdown_sandbox_reach_containerd() {
    let g = Guard::new();
    let id = unique_id("lastevents");
    let member = unique_id("lastevents-member");
    let netns = NetNs::new(&id);
    let mut c = controller().await;
    store_record(&id).await;
    let mut events = EventStream::subscribe("default").unwrap_or_else(|e| panic!("{e}"));
    let res: Result<(), String> = async {
        create_and_start(&mut c, &id, &netns.path()).await?;
        let o = ctr(
            "default",
            &[
                "run",
                "-d",
                "--sandbox",
                &id,
                "--runtime",
                RUNTIME,
                BUSYBOX,
                &member,
                "sleep",
                "300",
            ],
        );
        if !o.ok() {
            return Err(format!("ctr run -d --sandbox: {o:?}"));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    // The daemon is gone once its shim process is.
    let gone = poll(HANG, || shim_daemons_for(&id).is_empty().then_some(()));
    let from_shim = |lines: &[String], topic: &str| {
        lines.iter().any(|l| {
            l.contains(topic)
                && l.contains(&format!("\"container_id\":\"{member}\""))
                && l.contains(&format!("\"id\":\"{member}\""))
        })
    };
    // what the shim sent before it exited, as containerd passes it on (HANG: only a hang)
    let arrived = events.wait_until(
        |lines| from_shim(lines, "/tasks/exit") && from_shim(lines, "/tasks/delete"),
        HANG,
    );
    let seen = events.lines().join("\n");
    drop(events);
    ctr_force_remove("default", std::slice::from_ref(&member));
    // containerd made the member's bundle and removes it only when it deletes the task itself;
    // here the sandbox shim deleted the member (CRI removes members before the sandbox, so this
    // test is the only place that leaves it).
    let _ = std::fs::remove_dir_all(
        prefix()
            .join("run/containerd/io.containerd.runtime.v2.task/default")
            .join(&member),
    );
    drop_store_record(&id).await;
    drop(netns);
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    assert!(gone.is_some(), "the shim of {id} did not exit");
    assert!(
        arrived,
        "the shim's TaskExit/TaskDelete of {member} did not arrive:\n{seen}"
    );
    g.assert_clean(&[id, member]);
}
