//! Shim-owned networking against the real containerd and the Debian CNI plugins (bridge +
//! host-local + portmap, the bench's `rsandbox-shim` network on its own bridge and subnet):
//! - a sandbox created through containerd's sandbox controller API without a netns gets a netns
//!   and an IP from the shim; a container created in it (`ctr run --sandbox`) has eth0 with that
//!   IP and reaches the bridge; after teardown the netns, veth, lease and cache entry are gone;
//! - two `ctr run` containers with shim networking turned on reach each other;
//! - a broken conflist fails the create with the plugin's message and leaks nothing;
//! - the rest of the README's decision table: no CNI network config gives a loopback-only
//!   netns (or an error with `require_cni`), and `sandboxes = false` without a pod config gives
//!   the host network; member containers run in each.
//!
//! Tests that need another shim configuration rewrite the bench's config file
//! (`$RSANDBOX_CONFIG` in containerd's shim environment) and restore it on drop: a shim reads it
//! once when it starts, containerd cannot give one test a config of its own, and the tests run
//! one at a time (`--test-threads=1`, the bench lock), so no other shim starts meanwhile.

use std::path::PathBuf;

use rsandbox_integration::controller::*;
use rsandbox_integration::*;

/// The shim's config file written by hack/lib.sh (RSANDBOX_CONFIG in containerd's config).
fn shim_config() -> PathBuf {
    prefix().join("conf/rsandbox.toml")
}

/// The CNI config dir of shim-owned networks (hack/lib.sh).
fn shim_cni_dir() -> PathBuf {
    prefix().join("conf/cni/rsandbox.d")
}

/// Restores a file's content on drop (tests that change the shim's configuration).
struct Restore(PathBuf, Option<Vec<u8>>);

impl Restore {
    fn new(p: PathBuf) -> Restore {
        let old = std::fs::read(&p).ok();
        Restore(p, old)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        match &self.1 {
            Some(data) => std::fs::write(&self.0, data).unwrap(),
            None => {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }
}

/// The IPv4 address of eth0 in the netns of `pid` (via nsenter, from the host).
fn eth0_of(pid: u32) -> Option<String> {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.args([
        "-t",
        &pid.to_string(),
        "-n",
        "ip",
        "-4",
        "-o",
        "addr",
        "show",
        "eth0",
    ]);
    inet_of(&run_timeout(cmd, None, HANG).stdout)
}

/// The first IPv4 address in `ip -4 -o addr` output, without its prefix length.
fn inet_of(text: &str) -> Option<String> {
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .map(|a| a.split('/').next().unwrap_or(a).to_string())
}

#[tokio::test]
async fn sandbox_without_netns_gets_a_shim_owned_network() {
    let g = Guard::new();
    let id = unique_id("netpod");
    let cid = unique_id("netctr");
    let _objs = CtrObjects {
        ns: NS,
        ids: vec![cid.clone()],
    };
    store_record(&id).await;
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pid = create_and_start(&mut c, &id, "").await?;
        let host = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
        let pod = std::fs::read_link(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
        if pod == host {
            return Err(format!("the pause process {pid} is in the host's netns"));
        }
        let ip = eth0_of(pid).ok_or("the pod netns has no IPv4 address on eth0")?;
        if !ip.starts_with("10.90.") {
            return Err(format!(
                "pod IP {ip} is not on the shim-owned network 10.90.0.0/16"
            ));
        }
        // The IP is reported where a user looks: the verbose status.
        let s = c
            .status(req(ControllerStatusRequest {
                sandbox_id: id.clone(),
                verbose: true,
                sandboxer: "shim".into(),
            }))
            .await
            .map_err(|e| e.message().to_string())?
            .into_inner();
        let info = s.info.get("rsandbox").cloned().unwrap_or_default();
        if !info.contains(&format!("{ip}/16")) {
            return Err(format!("status info does not report {ip}: {info}"));
        }
        // And in containerd's SandboxInfo shape (what inspectp shows on containerd 2.3): the
        // CNI result as go-cni's, the pod's address on the pod's interface.
        let doc: serde_json::Value =
            serde_json::from_str(s.info.get("info").map_or("null", String::as_str))
                .map_err(|e| format!("verbose info: {e}"))?;
        let eth0 = &doc["cniResult"]["Interfaces"]["eth0"];
        if eth0["IPConfigs"][0]["IP"] != ip.as_str()
            || eth0["Sandbox"].as_str().is_none_or(str::is_empty)
        {
            return Err(format!("cniResult does not give eth0 {ip}: {doc}"));
        }
        // What the plugins returned (the shim's libcni-style cache), for the log.
        for f in
            std::fs::read_dir(prefix().join("var/lib/cni/results")).map_err(|e| e.to_string())?
        {
            let f = f.map_err(|e| e.to_string())?.path();
            if f.display().to_string().contains(&id) {
                eprintln!(
                    "CNI cache {}: {}",
                    f.display(),
                    std::fs::read_to_string(&f).unwrap_or_default()
                );
            }
        }
        // A container in the sandbox lives in the pod's network.
        let out = ctr(
            NS,
            &[
                "run",
                "--rm",
                "--sandbox",
                &id,
                "--runtime",
                RUNTIME,
                BUSYBOX,
                &cid,
                "sh",
                "-c",
                "ip -4 -o addr show eth0; ping -c1 -W2 10.90.0.1",
            ],
        );
        if !out.ok()
            || !out.stdout.contains(&format!("inet {ip}/"))
            || !out.stdout.contains("1 packets received")
        {
            return Err(format!("container in the pod: {out:?}"));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop_store_record(&id).await;
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    // netns, veth, lease, cache entry: all gone.
    g.assert_clean(&[id, cid]);
}

#[tokio::test]
async fn a_broken_conflist_fails_the_create_and_leaks_nothing() {
    let g = Guard::new();
    let id = unique_id("netbad");
    // Sorts before the bench's 10-rsandbox-shim.conflist, so it is the one loaded.
    let broken = shim_cni_dir().join("05-broken.conflist");
    let _restore = Restore::new(broken.clone());
    std::fs::write(
        &broken,
        r#"{"cniVersion":"1.0.0","name":"broken","plugins":[{"type":"bridge","bridge":"rsandbox9","ipam":{"type":"host-local","ranges":[[{"subnet":"10.99.0.0/16"}]]}},{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    let mut c = controller().await;
    let r = create_and_start(&mut c, &id, "").await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    let err = r.expect_err("create with a broken conflist succeeded");
    assert!(
        err.contains("set up the pod network") && err.contains("no-such-plugin"),
        "error does not name the cause: {err}"
    );
    // A NotFound after a failed create is expected; nothing else.
    assert!(errs.iter().all(|e| e.contains("not found")), "{errs:?}");
    g.assert_clean(&[id]);
    // The plugin chain never ran (lookup failed first): no bridge was made either.
    assert!(!bridge_ports().iter().any(|p| p.contains("rsandbox9")));
}

#[test]
fn standalone_tasks_with_shim_networking_reach_each_other() {
    let g = Guard::new();
    let (a, b) = (unique_id("neta"), unique_id("netb"));
    let _objs = CtrObjects {
        ns: NS,
        ids: vec![a.clone(), b.clone()],
    };
    let _restore = Restore::new(shim_config());
    let cfg = std::fs::read_to_string(shim_config()).unwrap();
    assert!(
        cfg.contains("standalone_tasks = false"),
        "unexpected bench config: {cfg}"
    );
    std::fs::write(
        shim_config(),
        cfg.replace("standalone_tasks = false", "standalone_tasks = true"),
    )
    .unwrap();

    ctr(
        NS,
        &[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            BUSYBOX,
            &a,
            "sh",
            "-c",
            "while true; do nc -l -p 9000 -e echo pong; done",
        ],
    )
    .expect_ok("ctr run a");
    ctr(
        NS,
        &[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            BUSYBOX,
            &b,
            "sleep",
            "600",
        ],
    )
    .expect_ok("ctr run b");
    let ip_out = ctr(
        NS,
        &[
            "task",
            "exec",
            "--exec-id",
            "ip",
            &a,
            "ip",
            "-4",
            "-o",
            "addr",
            "show",
            "eth0",
        ],
    );
    let ip =
        inet_of(&ip_out.stdout).unwrap_or_else(|| panic!("no eth0 address in {a}: {ip_out:?}"));
    assert!(ip.starts_with("10.90."), "{ip}");
    let reply = poll(HANG, || {
        let o = ctr(
            NS,
            &[
                "task",
                "exec",
                "--exec-id",
                "nc",
                &b,
                "sh",
                "-c",
                &format!("echo ping | nc -w 2 {ip} 9000"),
            ],
        );
        o.stdout.contains("pong").then_some(o)
    });
    assert!(reply.is_some(), "{b} could not reach {a} at {ip}:9000");
    for id in [&a, &b] {
        ctr(NS, &["task", "kill", "-s", "SIGKILL", id]);
    }
    for id in [&a, &b] {
        poll(HANG, || ctr(NS, &["task", "rm", id]).ok().then_some(()));
        ctr(NS, &["container", "rm", id]);
    }
    g.assert_clean(&[a, b]);
}

/// Rewrites the `[network]` keys of the shim's config file for the life of the value (the old
/// file comes back on drop); `keys` replace the lines of the same keys or are appended.
struct ShimConfig {
    _restore: Restore,
}

impl ShimConfig {
    fn with(keys: &[(&str, &str)]) -> ShimConfig {
        let restore = Restore::new(shim_config());
        let old = std::fs::read_to_string(shim_config()).unwrap();
        assert!(old.contains("[network]"), "unexpected bench config: {old}");
        let mut lines: Vec<String> = old
            .lines()
            .filter(|l| {
                let key = l.split('=').next().unwrap_or("").trim();
                !keys.iter().any(|(k, _)| *k == key)
            })
            .map(str::to_string)
            .collect();
        for (k, v) in keys {
            lines.push(format!("{k} = {v}"));
        }
        std::fs::write(shim_config(), lines.join("\n") + "\n").unwrap();
        ShimConfig { _restore: restore }
    }
}

/// An empty directory to point `cni_conf_dir` at, removed on drop.
struct EmptyDir(PathBuf);

impl EmptyDir {
    fn new(id: &str) -> EmptyDir {
        let d = std::env::temp_dir().join(format!("rsandbox-{id}-no-cni"));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        EmptyDir(d)
    }
    fn toml(&self) -> String {
        format!("'{}'", self.0.display())
    }
}

impl Drop for EmptyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The interfaces (names) in the netns of `pid`.
fn links_of(pid: u32) -> Vec<String> {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.args(["-t", &pid.to_string(), "-n", "ip", "-o", "link", "show"]);
    run_timeout(cmd, None, HANG)
        .stdout
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

fn netns_link(pid: &str) -> Result<PathBuf, String> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())
}

/// `ctr run --rm --sandbox <id>` printing the container's netns and interfaces.
fn member_container(id: &str, cid: &str) -> Result<String, String> {
    let out = ctr(
        NS,
        &[
            "run",
            "--rm",
            "--sandbox",
            id,
            "--runtime",
            RUNTIME,
            BUSYBOX,
            cid,
            "sh",
            "-c",
            "readlink /proc/self/ns/net; ip -o link show",
        ],
    );
    if out.ok() {
        Ok(out.stdout)
    } else {
        Err(format!("container in the pod: {out:?}"))
    }
}

async fn verbose_info(c: &mut Ctl, id: &str) -> Result<String, String> {
    let s = c
        .status(req(ControllerStatusRequest {
            sandbox_id: id.into(),
            verbose: true,
            sandboxer: "shim".into(),
        }))
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    Ok(s.info.get("rsandbox").cloned().unwrap_or_default())
}

#[tokio::test]
async fn no_cni_config_gives_a_loopback_only_sandbox() {
    let g = Guard::new();
    let id = unique_id("netlo");
    let cid = unique_id("netloctr");
    let _objs = CtrObjects {
        ns: NS,
        ids: vec![cid.clone()],
    };
    let empty = EmptyDir::new(&id);
    let _cfg = ShimConfig::with(&[("cni_conf_dir", &empty.toml())]);
    store_record(&id).await;
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pid = create_and_start(&mut c, &id, "").await?;
        let pod = netns_link(&pid.to_string())?;
        if pod == netns_link("self")? {
            return Err(format!("the pause process {pid} is in the host's netns"));
        }
        let links = links_of(pid);
        if links != ["lo"] {
            return Err(format!("interfaces in the pod netns: {links:?}, want [lo]"));
        }
        let info = verbose_info(&mut c, &id).await?;
        if !info.contains("\"ips\":[]") || !info.contains("loopback only") {
            return Err(format!("status info: {info}"));
        }
        let out = member_container(&id, &cid)?;
        if !out.contains(&pod.display().to_string()) || out.contains("eth0") {
            return Err(format!("container in the pod (pod netns {pod:?}): {out}"));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop_store_record(&id).await;
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id, cid]);
}

#[tokio::test]
async fn require_cni_refuses_a_sandbox_without_cni_config() {
    let g = Guard::new();
    let id = unique_id("netreq");
    let empty = EmptyDir::new(&id);
    let _cfg = ShimConfig::with(&[("cni_conf_dir", &empty.toml()), ("require_cni", "true")]);
    let mut c = controller().await;
    let r = create_and_start(&mut c, &id, "").await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    let err = r.expect_err("create without CNI config succeeded with require_cni = true");
    assert!(
        err.contains("set up the pod network") && err.contains("no CNI network config found"),
        "error does not name the cause: {err}"
    );
    assert!(errs.iter().all(|e| e.contains("not found")), "{errs:?}");
    g.assert_clean(&[id]);
}

#[tokio::test]
async fn without_shim_networking_a_sandbox_without_pod_config_uses_the_host_network() {
    let g = Guard::new();
    let id = unique_id("nethost");
    let cid = unique_id("nethostctr");
    let _objs = CtrObjects {
        ns: NS,
        ids: vec![cid.clone()],
    };
    let _cfg = ShimConfig::with(&[("sandboxes", "false")]);
    store_record(&id).await;
    let mut c = controller().await;
    let res: Result<(), String> = async {
        let pid = create_and_start(&mut c, &id, "").await?;
        let host = netns_link("self")?;
        if netns_link(&pid.to_string())? != host {
            return Err(format!(
                "the pause process {pid} is not in the host's netns"
            ));
        }
        let info = verbose_info(&mut c, &id).await?;
        if !info.contains("\"networkOwner\":\"host\"") {
            return Err(format!("status info: {info}"));
        }
        let out = member_container(&id, &cid)?;
        if !out.contains(&host.display().to_string()) {
            return Err(format!("container not in the host netns {host:?}: {out}"));
        }
        Ok(())
    }
    .await;
    let errs = stop_and_shutdown(&mut c, &id).await;
    drop_store_record(&id).await;
    expect_ok(&id, res);
    assert!(errs.is_empty(), "{errs:?}");
    g.assert_clean(&[id, cid]);
}
