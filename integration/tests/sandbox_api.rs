//! containerd's sandbox controller API (`containerd.services.sandbox.v1.Controller`) with the
//! `shim` sandboxer and our runtime, without CRI, with a netns made by the test (`ip netns
//! add`). Without a netns the shim owns the pod's network: see `network.rs`.

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
    if let Err(e) = res {
        panic!("{e}\n--- containerd log ---\n{}", log_lines(&id, 20));
    }
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id]);
}
