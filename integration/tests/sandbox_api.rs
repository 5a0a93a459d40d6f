//! containerd's sandbox controller API (`containerd.services.sandbox.v1.Controller`) with the
//! `shim` sandboxer and our runtime, without CRI, with a netns made by the test (`ip netns
//! add`): the lifecycle, and the pause process's name. Without a netns the shim owns the pod's
//! network: see `network.rs`.

use std::time::Duration;

use rsandbox_integration::controller::*;
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
            Duration::from_secs(10),
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
    run_timeout(cmd, None, Duration::from_secs(10))
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
