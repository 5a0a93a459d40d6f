//! The README's main job: a real two-container pod through containerd's CRI on rsandbox.
//!
//! Run by `hack/demo.sh` against the bench's containerd (CONTAINERD_ADDRESS). It creates a pod
//! with the `rsandbox` runtime handler, starts a server and a client container in it, shows what
//! a user wants to see (pod IP, the shared hostname, DNS config and /dev/shm, the client reaching
//! the server over the pod's loopback, the pause process), then removes the pod.

use std::time::Instant;

use rsandbox_integration::cri::*;
use rsandbox_integration::{cri_clients, shim_daemons_for, shim_procs};

const IMAGE: &str = "localhost/busybox:latest";

fn exec_out(r: &ExecSyncResponse) -> String {
    let mut s = String::from_utf8_lossy(&r.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&r.stderr));
    s.trim_end().to_string()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut rt, _) = cri_clients().await;
    let suffix = std::process::id();
    let logs = std::env::temp_dir().join(format!("rsandbox-demo-{suffix}"));
    std::fs::create_dir_all(&logs)?;
    let pod = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "demo".into(),
            uid: format!("demo-{suffix}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "demo-pod".into(),
        log_directory: logs.display().to_string(),
        dns_config: Some(DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        linux: Some(LinuxPodSandboxConfig {
            sysctls: [("kernel.shm_rmid_forced".to_string(), "1".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    };

    println!("== RunPodSandbox (runtime handler \"rsandbox\")");
    let t = Instant::now();
    let id = rt
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: "rsandbox".into(),
        })
        .await?
        .into_inner()
        .pod_sandbox_id;
    println!("   pod {id} ready in {:?}", t.elapsed());
    let st = rt
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .unwrap_or_default();
    println!(
        "   state {:?}, pod IP {}",
        PodSandboxState::try_from(st.state).unwrap_or(PodSandboxState::SandboxNotready),
        st.network.map(|n| n.ip).unwrap_or_default()
    );
    let procs = shim_procs()
        .into_iter()
        .filter(|p| p.cmdline.contains(&id))
        .count();
    println!(
        "   shim daemons for this pod: {}, plus its pause process (the shim's own pause program, no pause image): {} processes in all",
        shim_daemons_for(&id).len(),
        procs
    );

    let mut ids = Vec::new();
    for (name, script) in [
        (
            "server",
            "echo 'hello from the server container' > /dev/shm/greeting; \
             while true; do nc -l -p 8080 -e cat /dev/shm/greeting; done",
        ),
        ("client", "sleep 3600"),
    ] {
        let cid = rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: id.clone(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    image: Some(ImageSpec {
                        image: IMAGE.into(),
                        ..Default::default()
                    }),
                    command: vec!["sh".into(), "-c".into(), script.into()],
                    log_path: format!("{name}.log"),
                    ..Default::default()
                }),
                sandbox_config: Some(pod.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        let t = Instant::now();
        rt.start_container(StartContainerRequest {
            container_id: cid.clone(),
        })
        .await?;
        println!("== container {name}: {cid} started in {:?}", t.elapsed());
        ids.push(cid);
    }
    let client = ids[1].clone();
    let exec = |cmd: &str| ExecSyncRequest {
        container_id: client.clone(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };
    for (what, cmd) in [
        ("hostname (shared UTS namespace)", "hostname"),
        (
            "eth0 in the pod's network namespace",
            "ip -4 addr show eth0 | grep inet",
        ),
        (
            "/etc/resolv.conf from the pod's dns_config",
            "cat /etc/resolv.conf",
        ),
        (
            "a pod sysctl (kernel.shm_rmid_forced)",
            "cat /proc/sys/kernel/shm_rmid_forced",
        ),
        ("/dev/shm shared with the server", "cat /dev/shm/greeting"),
        (
            "the server, over the pod's 127.0.0.1:8080",
            "sleep 0.5; nc 127.0.0.1 8080 </dev/null",
        ),
    ] {
        let mut out = exec_out(&rt.exec_sync(exec(cmd)).await?.into_inner());
        if out.is_empty() {
            out = "(nothing)".into();
        }
        println!(
            "-- client: {what}:\n{}",
            out.lines()
                .map(|l| format!("   {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    println!("== StopPodSandbox + RemovePodSandbox");
    let t = Instant::now();
    rt.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await?;
    rt.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await?;
    println!("   removed in {:?}", t.elapsed());
    for _ in 0..100 {
        if !shim_procs().iter().any(|p| p.cmdline.contains(&id)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let left = shim_procs()
        .iter()
        .filter(|p| p.cmdline.contains(&id))
        .count();
    println!("   shim processes left for this pod: {left}");
    let _ = std::fs::remove_dir_all(&logs);
    if left != 0 {
        return Err("the pod's shim did not exit".into());
    }
    Ok(())
}
