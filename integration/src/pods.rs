//! A CRI pod with the `rsandbox` handler and one long-running busybox container, for tests
//! that need a live pod shim to lean on (exec probes, direct ttrpc calls).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cri::*;
use crate::{BUSYBOX, HANDLER, Runtime, address, cri_clients, cri_clients_at, shim_daemons_at};

/// The namespace options the kubelet sends for an ordinary pod (pod network and IPC); the
/// kubelet repeats them in each container's config.
pub fn namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A minimal pod config named `name`, logging under `log_dir`.
pub fn pod_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "rsandbox-it".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox container running `cmd`.
pub fn container_config(name: &str, cmd: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A running pod with one container. [`SleepingPod::remove`] (or the caller's clean-up on
/// failure) takes it down.
pub struct SleepingPod {
    pub rt: Runtime,
    /// The CRI socket of the containerd that runs it.
    socket: PathBuf,
    pub id: String,
    pub container: String,
    /// RemovePodSandbox answered: nothing left to clean up.
    removed: bool,
}

impl SleepingPod {
    /// Runs a pod named `name` with one container sleeping for an hour.
    pub async fn start(name: &str, log_dir: &Path) -> Result<SleepingPod, String> {
        Self::start_at(&address(), name, log_dir).await
    }

    /// [`SleepingPod::start`] through the containerd serving `socket`.
    pub async fn start_at(
        socket: &Path,
        name: &str,
        log_dir: &Path,
    ) -> Result<SleepingPod, String> {
        let (mut rt, _) = cri_clients_at(socket).await?;
        let cfg = pod_config(name, log_dir);
        let id = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: HANDLER.into(),
            })
            .await
            .map_err(|s| format!("RunPodSandbox: {}", s.message()))?
            .into_inner()
            .pod_sandbox_id;
        let mut pod = SleepingPod {
            rt,
            socket: socket.to_path_buf(),
            id,
            container: String::new(),
            removed: false,
        };
        let created = pod
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(container_config("sleeper", &["sleep", "3600"])),
                sandbox_config: Some(cfg),
            })
            .await;
        let started = match created {
            Ok(r) => {
                pod.container = r.into_inner().container_id;
                pod.rt
                    .start_container(StartContainerRequest {
                        container_id: pod.container.clone(),
                    })
                    .await
                    .map(|_| ())
            }
            Err(s) => Err(s),
        };
        if let Err(s) = started {
            let _ = pod.remove().await;
            return Err(format!("start the sleeper: {}", s.message()));
        }
        Ok(pod)
    }

    /// The pod's shim daemon (not its pause process).
    pub fn shim_pid(&self) -> Option<i32> {
        match shim_daemons_at(&self.socket, &self.id).as_slice() {
            [one] => Some(one.pid),
            _ => None,
        }
    }

    /// ExecSync into the container, with CRI's timeout of `timeout_s` seconds.
    pub async fn exec(
        &mut self,
        cmd: &[&str],
        timeout_s: i64,
    ) -> Result<ExecSyncResponse, tonic::Status> {
        self.rt
            .exec_sync(ExecSyncRequest {
                container_id: self.container.clone(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: timeout_s,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// StopPodSandbox, failing if it takes longer than `limit`. Returns how long it took.
    pub async fn stop_within(&mut self, limit: Duration) -> Result<Duration, String> {
        let t = Instant::now();
        let req = StopPodSandboxRequest {
            pod_sandbox_id: self.id.clone(),
        };
        match tokio::time::timeout(limit, self.rt.stop_pod_sandbox(req)).await {
            Ok(Ok(_)) => Ok(t.elapsed()),
            Ok(Err(s)) => Err(format!("StopPodSandbox: {}", s.message())),
            Err(_) => Err(format!("StopPodSandbox did not answer within {limit:?}")),
        }
    }

    /// RemovePodSandbox, failing if it takes longer than `limit`. Returns how long it took.
    pub async fn remove_within(&mut self, limit: Duration) -> Result<Duration, String> {
        let t = Instant::now();
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: self.id.clone(),
        };
        match tokio::time::timeout(limit, self.rt.remove_pod_sandbox(req)).await {
            Ok(Ok(_)) => {
                self.removed = true;
                Ok(t.elapsed())
            }
            Ok(Err(s)) => Err(format!("RemovePodSandbox: {}", s.message())),
            Err(_) => Err(format!("RemovePodSandbox did not answer within {limit:?}")),
        }
    }

    /// Stops and removes the pod unless that was done (clean-up; each call waits at most 30 s).
    pub async fn remove(&mut self) -> Result<(), String> {
        if self.removed {
            return Ok(());
        }
        let limit = Duration::from_secs(30);
        let stopped = self.stop_within(limit).await;
        let removed = self.remove_within(limit).await;
        stopped.and(removed).map(|_| ())
    }

    /// Clean-up that also works when the shim is wedged: [`SleepingPod::remove`], and if that
    /// fails, SIGKILL to the pod's shim daemon and its children (the pause process, the
    /// containers' inits: it is their subreaper), then more tries for 15 s (containerd cleans
    /// up after a dead shim). Returns the first error, if any.
    pub async fn remove_or_kill(&mut self) -> Result<(), String> {
        let shim = self.shim_pid();
        let first = self.remove().await;
        if first.is_err()
            && let Some(pid) = shim
        {
            let children = children_of(pid);
            for p in std::iter::once(pid).chain(children) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while self.remove().await.is_err() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        first
    }

    /// Every ID the pod made (for [`crate::Guard::assert_clean`]).
    pub fn ids(&self) -> Vec<String> {
        let mut v = vec![self.id.clone()];
        if !self.container.is_empty() {
            v.push(self.container.clone());
        }
        v
    }
}

/// Pids whose parent is `pid` (the 4th field of /proc/<pid>/stat).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            // "pid (comm) state ppid ...": comm may hold blanks and parentheses
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok())
                == Some(pid)
        })
        .collect()
}

/// A CRI pod on a given runtime handler with the containers a test starts in it: for the tests
/// that run one probe on the `rsandbox` handler and on containerd's own `runc` handler.
pub struct Pod {
    pub rt: Runtime,
    pub handler: String,
    pub id: String,
    pub config: PodSandboxConfig,
    pub containers: Vec<String>,
    removed: bool,
}

impl Pod {
    /// RunPodSandbox with `config` on `handler`.
    pub async fn run(handler: &str, config: PodSandboxConfig) -> Result<Pod, String> {
        let (mut rt, _) = cri_clients().await;
        let id = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .map_err(|s| format!("{handler}: RunPodSandbox: {}", s.message()))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod {
            rt,
            handler: handler.into(),
            id,
            config,
            containers: Vec::new(),
            removed: false,
        })
    }

    /// Creates and starts a container; returns its ID.
    pub async fn start(&mut self, config: ContainerConfig) -> Result<String, String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone());
        let what = format!("{}: container {name:?}", self.handler);
        let id = self
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: self.id.clone(),
                config: Some(config),
                sandbox_config: Some(self.config.clone()),
            })
            .await
            .map_err(|s| format!("{what}: CreateContainer: {}", s.message()))?
            .into_inner()
            .container_id;
        self.containers.push(id.clone());
        self.rt
            .start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .map_err(|s| format!("{what}: StartContainer: {}", s.message()))?;
        Ok(id)
    }

    /// ExecSync `sh -c script` in container `cid` (20 s timeout): (exit code, stdout, stderr).
    pub async fn sh(&mut self, cid: &str, script: &str) -> Result<(i32, String, String), String> {
        let r = self
            .rt
            .exec_sync(ExecSyncRequest {
                container_id: cid.into(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 20,
            })
            .await
            .map_err(|s| format!("{}: ExecSync {script:?}: {}", self.handler, s.message()))?
            .into_inner();
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        ))
    }

    /// The pod's CRI state (`PodSandboxState`).
    pub async fn state(&mut self) -> Result<i32, String> {
        let s = self
            .rt
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: self.id.clone(),
                verbose: false,
            })
            .await
            .map_err(|s| format!("{}: PodSandboxStatus: {}", self.handler, s.message()))?
            .into_inner();
        Ok(s.status.map(|s| s.state).unwrap_or(-1))
    }

    /// StopPodSandbox + RemovePodSandbox (30 s each at most), unless done already.
    pub async fn remove(&mut self) -> Result<(), String> {
        if self.removed {
            return Ok(());
        }
        let limit = Duration::from_secs(30);
        let id = self.id.clone();
        let stop = self.rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        });
        let stopped = match tokio::time::timeout(limit, stop).await {
            Ok(r) => r.map(drop).map_err(|s| s.message().to_string()),
            Err(_) => Err("timed out".into()),
        };
        let remove = self
            .rt
            .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id });
        let removed = match tokio::time::timeout(limit, remove).await {
            Ok(r) => r.map(drop).map_err(|s| s.message().to_string()),
            Err(_) => Err("timed out".into()),
        };
        self.removed = removed.is_ok();
        stopped
            .and(removed)
            .map_err(|e| format!("{}: remove pod {}: {e}", self.handler, self.id))
    }

    /// Every ID the pod made (for [`crate::Guard::assert_clean`]).
    pub fn ids(&self) -> Vec<String> {
        std::iter::once(self.id.clone())
            .chain(self.containers.iter().cloned())
            .collect()
    }
}

/// A test's pods on one CRI handler and their containers; [`Pods::cleanup`] stops and removes
/// every pod whatever happened (the IDs stay listed for [`crate::Guard::assert_clean`]).
pub struct Pods {
    pub rt: Runtime,
    pub handler: String,
    pub ids: Vec<String>,
    pub containers: Vec<String>,
}

/// The memory limit [`Pods::update_memory_and_cpu`] sets (bytes).
pub const UPDATED_MEMORY: u64 = 96 << 20;
/// The v2 `cpu.max` it gives (a quota of 50 ms per 100 ms).
pub const UPDATED_CPU_MAX: &str = "50000 100000";

impl Pods {
    pub async fn new(handler: &str) -> Pods {
        let (rt, _img) = cri_clients().await;
        Pods {
            rt,
            handler: handler.into(),
            ids: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// RunPodSandbox on the pods' handler.
    pub async fn run(&mut self, config: PodSandboxConfig) -> Result<String, String> {
        let handler = self.handler.clone();
        self.run_on(config, &handler).await
    }

    /// RunPodSandbox with the runtime handler `handler`.
    pub async fn run_on(
        &mut self,
        config: PodSandboxConfig,
        handler: &str,
    ) -> Result<String, String> {
        let r = self
            .rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: handler.into(),
            })
            .await
            .map_err(|s| format!("RunPodSandbox ({handler}): {}", s.message()))?;
        let id = r.into_inner().pod_sandbox_id;
        self.ids.push(id.clone());
        Ok(id)
    }

    pub async fn status(&mut self, id: &str) -> Result<PodSandboxStatus, String> {
        let r = self
            .rt
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            })
            .await
            .map_err(|s| format!("PodSandboxStatus: {}", s.message()))?;
        r.into_inner().status.ok_or("no status".into())
    }

    /// The pod's pause process (verbose status info "pid", both handlers).
    pub async fn pause_pid(&mut self, id: &str) -> Result<u32, String> {
        let r = self
            .rt
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            })
            .await
            .map_err(|s| format!("PodSandboxStatus: {}", s.message()))?
            .into_inner();
        verbose_pid(r.info.get("info"))
    }

    /// Creates and starts a container.
    pub async fn start(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> Result<String, String> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let r = self
            .rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map_err(|s| format!("CreateContainer {name}: {}", s.message()))?;
        let id = r.into_inner().container_id;
        self.containers.push(id.clone());
        self.rt
            .start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .map_err(|s| format!("StartContainer {name} ({}): {}", self.handler, s.message()))?;
        Ok(id)
    }

    /// ExecSync (20 s timeout).
    pub async fn exec(&mut self, cid: &str, cmd: &[&str]) -> Result<ExecSyncResponse, String> {
        let r = self
            .rt
            .exec_sync(ExecSyncRequest {
                container_id: cid.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 20,
            })
            .await
            .map_err(|s| format!("ExecSync {cmd:?}: {}", s.message()))?;
        Ok(r.into_inner())
    }

    /// stdout of a successful exec.
    pub async fn out(&mut self, cid: &str, cmd: &[&str]) -> Result<String, String> {
        let r = self.exec(cid, cmd).await?;
        if r.exit_code != 0 {
            return Err(format!(
                "{cmd:?}: exit {} stderr {:?}",
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&r.stdout).into_owned())
    }

    pub async fn container_status(&mut self, cid: &str) -> Result<ContainerStatus, String> {
        let r = self
            .rt
            .container_status(ContainerStatusRequest {
                container_id: cid.into(),
                verbose: false,
            })
            .await
            .map_err(|s| format!("ContainerStatus: {}", s.message()))?;
        r.into_inner().status.ok_or("no status".into())
    }

    /// The container's init (verbose status info "pid").
    pub async fn container_pid(&mut self, cid: &str) -> Result<u32, String> {
        let r = self
            .rt
            .container_status(ContainerStatusRequest {
                container_id: cid.into(),
                verbose: true,
            })
            .await
            .map_err(|s| format!("ContainerStatus: {}", s.message()))?
            .into_inner();
        verbose_pid(r.info.get("info"))
    }

    /// ContainerStats of `cid`, which must show memory in use and CPU time spent (the shim's
    /// Task.Stats, read from the container's cgroup, on either handler).
    pub async fn container_stats_in_use(&mut self, cid: &str) -> Result<ContainerStats, String> {
        let cs = self
            .rt
            .container_stats(ContainerStatsRequest {
                container_id: cid.into(),
            })
            .await
            .map_err(|s| format!("ContainerStats: {}", s.message()))?
            .into_inner()
            .stats
            .ok_or("no container stats")?;
        let ws = cs
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes.as_ref())
            .map(|v| v.value)
            .unwrap_or(0);
        if ws == 0 {
            return Err(format!("{cid}: memory working set {ws}: {cs:?}"));
        }
        let cpu = cs
            .cpu
            .as_ref()
            .and_then(|c| c.usage_core_nano_seconds.as_ref())
            .map_or(0, |v| v.value);
        if cpu == 0 {
            return Err(format!("{cid}: no cpu time: {cs:?}"));
        }
        Ok(cs)
    }

    /// UpdateContainerResources of `cid` to [`UPDATED_MEMORY`] and [`UPDATED_CPU_MAX`]; the
    /// caller checks its cgroup.
    pub async fn update_memory_and_cpu(&mut self, cid: &str) -> Result<(), String> {
        self.rt
            .update_container_resources(UpdateContainerResourcesRequest {
                container_id: cid.into(),
                linux: Some(LinuxContainerResources {
                    memory_limit_in_bytes: UPDATED_MEMORY as i64,
                    cpu_period: 100_000,
                    cpu_quota: 50_000,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("UpdateContainerResources: {}", s.message()))?;
        Ok(())
    }

    /// Waits up to `limit` until the container has exited.
    pub async fn wait_exited(
        &mut self,
        cid: &str,
        limit: Duration,
    ) -> Result<ContainerStatus, String> {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.container_status(cid).await?;
            if s.state == ContainerState::ContainerExited as i32 {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(format!("container {cid} did not exit within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(&mut self, id: &str) -> Result<(), String> {
        self.rt
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .map_err(|s| format!("StopPodSandbox: {}", s.message()))?;
        Ok(())
    }

    pub async fn remove(&mut self, id: &str) -> Result<(), String> {
        self.rt
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .map_err(|s| format!("RemovePodSandbox: {}", s.message()))?;
        Ok(())
    }

    /// Every ID these pods made (for the leftover check).
    pub fn all_ids(&self) -> Vec<String> {
        self.ids.iter().chain(&self.containers).cloned().collect()
    }

    /// Stops and removes every pod (errors collected).
    pub async fn cleanup(&mut self) -> Vec<String> {
        let mut errs = Vec::new();
        for id in self.ids.clone() {
            if let Err(e) = self.stop(&id).await {
                errs.push(format!("{id}: {e}"));
            }
            if let Err(e) = self.remove(&id).await {
                errs.push(format!("{id}: {e}"));
            }
        }
        errs
    }
}

/// The "pid" of a verbose status's "info" JSON.
fn verbose_pid(info: Option<&String>) -> Result<u32, String> {
    let info = info.cloned().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&info).map_err(|e| format!("{e}: {info}"))?;
    v["pid"]
        .as_u64()
        .map(|p| p as u32)
        .ok_or_else(|| format!("no pid in the verbose info: {info}"))
}
