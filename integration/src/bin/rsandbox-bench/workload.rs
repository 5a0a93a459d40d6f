//! The CRI workloads, run the same way for both runtime handlers: one pod's calls one by one,
//! pod + container from scratch, many pods with a bounded number in flight, and density.
//!
//! Every pod carries the label [`LABEL`], so whatever a run leaves (Ctrl-C, a failed call,
//! a killed bench) is found and removed by [`Cri::sweep`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::{
    CreateRequest as CreateLease, DeleteRequest as DeleteLease, ListRequest as ListLeases,
};
use rsandbox_integration::Runtime;
use rsandbox_integration::cri::*;
use rsandbox_integration::pods::{container_config, namespaces};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Label (key, value) of every pod the bench creates.
pub const LABEL: (&str, &str) = ("io.rsandbox.bench", "1");
/// Kubernetes namespace in the pods' metadata.
const POD_NAMESPACE: &str = "rsandbox-bench";
/// containerd namespace of CRI's objects, where [`Cri::collect_garbage`] makes its lease.
const CRI_NAMESPACE: &str = "k8s.io";

/// The per-call row of [`Cri::collect_garbage`] after a pod's removal.
pub const GC_AFTER_REMOVAL: &str = "containerd's garbage collection of the removed pod";

/// Durations of one pod's calls, in the order they ran.
pub type Timings = Vec<(&'static str, Duration)>;

/// A CRI client plus what the bench has created and not yet removed.
#[derive(Clone)]
pub struct Cri {
    rt: Runtime,
    leases: LeasesClient<tonic::transport::Channel>,
    live: Arc<Mutex<BTreeSet<String>>>,
    /// Every pod ID ever created, for the final leftover check.
    all: Arc<Mutex<Vec<String>>>,
    log_dir: PathBuf,
    seq: Arc<Mutex<u64>>,
}

/// An error message naming the handler and the failing call.
fn fail(handler: &str, call: &str) -> impl FnOnce(tonic::Status) -> String {
    let handler = handler.to_string();
    let call = call.to_string();
    move |s| format!("{call} ({handler}): {}", s.message())
}

/// Runs `f` and measures it.
async fn timed<T, F: std::future::Future<Output = T>>(f: F) -> (T, Duration) {
    let t = Instant::now();
    let v = f.await;
    (v, t.elapsed())
}

impl Cri {
    pub fn new(rt: Runtime, containerd: tonic::transport::Channel, log_dir: PathBuf) -> Cri {
        Cri {
            rt,
            leases: LeasesClient::new(containerd),
            live: Arc::default(),
            all: Arc::default(),
            log_dir,
            seq: Arc::default(),
        }
    }

    /// Every pod ID the bench created.
    pub fn all_created(&self) -> Vec<String> {
        self.all.lock().unwrap().clone()
    }

    /// A name unique to this run of the bench: `<stem>-<pid>-<n>`.
    fn unique(&self, stem: &str) -> String {
        let mut s = self.seq.lock().unwrap();
        *s += 1;
        format!("{stem}-{}-{}", std::process::id(), *s)
    }

    fn next_name(&self, handler: &str, kind: &str) -> String {
        self.unique(&format!("{kind}-{handler}"))
    }

    fn pod_config(&self, name: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: POD_NAMESPACE.into(),
                attempt: 0,
            }),
            hostname: name.chars().take(63).collect(),
            log_directory: self.log_dir.join(name).to_string_lossy().into_owned(),
            labels: [(LABEL.0.to_string(), LABEL.1.to_string())].into(),
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

    /// A busybox container sleeping for an hour, as the kubelet would ask for it.
    async fn run_pod(
        &self,
        handler: &str,
        config: &PodSandboxConfig,
    ) -> Result<(String, Duration), String> {
        let mut rt = self.rt.clone();
        let (r, d) = timed(rt.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        }))
        .await;
        let id = r
            .map_err(fail(handler, "RunPodSandbox"))?
            .into_inner()
            .pod_sandbox_id;
        self.live.lock().unwrap().insert(id.clone());
        self.all.lock().unwrap().push(id.clone());
        Ok((id, d))
    }

    /// CreateContainer + StartContainer of one sleeping container; returns its ID.
    async fn create_start(
        &self,
        handler: &str,
        pod: &str,
        config: &PodSandboxConfig,
        t: &mut Timings,
    ) -> Result<String, String> {
        let mut rt = self.rt.clone();
        let (r, d) = timed(rt.create_container(CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(container_config("sleeper", &["sleep", "3600"])),
            sandbox_config: Some(config.clone()),
        }))
        .await;
        let cid = r
            .map_err(fail(handler, "CreateContainer"))?
            .into_inner()
            .container_id;
        t.push(("CreateContainer", d));
        let (r, d) = timed(rt.start_container(StartContainerRequest {
            container_id: cid.clone(),
        }))
        .await;
        r.map_err(fail(handler, "StartContainer"))?;
        t.push(("StartContainer", d));
        Ok(cid)
    }

    /// StopPodSandbox + RemovePodSandbox (which removes the pod's containers too).
    async fn stop_remove_pod(
        &self,
        handler: &str,
        pod: &str,
        t: &mut Timings,
    ) -> Result<(), String> {
        let mut rt = self.rt.clone();
        let (r, d) = timed(rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.into(),
        }))
        .await;
        r.map_err(fail(handler, "StopPodSandbox"))?;
        t.push(("StopPodSandbox", d));
        let (r, d) = timed(rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.into(),
        }))
        .await;
        r.map_err(fail(handler, "RemovePodSandbox"))?;
        t.push(("RemovePodSandbox", d));
        self.live.lock().unwrap().remove(pod);
        Ok(())
    }

    /// containerd's garbage collection, run now and waited for: a lease made and deleted with
    /// `sync` (containerd's `ScheduleAndWait`). CRI deletes a pod's lease and its containers'
    /// snapshots without waiting; the collection that removes what they held runs later, when
    /// containerd's scheduler gets to it (at most about every 245 ms, by its pause threshold),
    /// and while it removes snapshots it holds the snapshotter's lock that every snapshot
    /// `Prepare` takes (`core/metadata/snapshot.go`, `garbageCollect`). Left to itself, one
    /// pod's collection lands in some later call of whichever handler runs next (the two
    /// handlers' pods alternate); run after each pod of the one-at-a-time workloads, it is timed
    /// with the pod whose removal left the garbage. It times what is left to collect then: the
    /// scheduler may have collected part of it during the pod's last calls.
    pub async fn collect_garbage(&self) -> Result<Duration, String> {
        let id = self.unique("rsandbox-bench-gc");
        let mut leases = self.leases.clone();
        leases
            .create(rsandbox_integration::tasks::in_ns(
                CRI_NAMESPACE,
                CreateLease {
                    id: id.clone(),
                    labels: [(LABEL.0.to_string(), LABEL.1.to_string())].into(),
                },
            ))
            .await
            .map_err(|e| format!("create lease {id}: {}", e.message()))?;
        let (r, d) = timed(leases.delete(rsandbox_integration::tasks::in_ns(
            CRI_NAMESPACE,
            DeleteLease {
                id: id.clone(),
                sync: true,
            },
        )))
        .await;
        r.map_err(|e| format!("delete lease {id} (sync): {}", e.message()))?;
        Ok(d)
    }

    /// Every call of one pod's life, one by one: RunPodSandbox, PodSandboxStatus,
    /// CreateContainer, StartContainer, ExecSync, StopContainer, RemoveContainer,
    /// StopPodSandbox, RemovePodSandbox; then containerd's garbage collection of what the pod
    /// left ([`Cri::collect_garbage`]).
    pub async fn calls_one_by_one(&self, handler: &str) -> Result<Timings, String> {
        let mut rt = self.rt.clone();
        let mut t = Timings::new();
        let config = self.pod_config(&self.next_name(handler, "calls"));
        let (pod, d) = self.run_pod(handler, &config).await?;
        t.push(("RunPodSandbox", d));
        let (r, d) = timed(rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        }))
        .await;
        let state = r
            .map_err(fail(handler, "PodSandboxStatus"))?
            .into_inner()
            .status
            .map(|s| s.state);
        if state != Some(PodSandboxState::SandboxReady as i32) {
            return Err(format!(
                "PodSandboxStatus ({handler}): pod {pod} is not ready: {state:?}"
            ));
        }
        t.push(("PodSandboxStatus", d));
        let cid = self.create_start(handler, &pod, &config, &mut t).await?;
        let (r, d) = timed(rt.exec_sync(ExecSyncRequest {
            container_id: cid.clone(),
            cmd: vec!["true".into()],
            timeout: 10,
        }))
        .await;
        let code = r.map_err(fail(handler, "ExecSync"))?.into_inner().exit_code;
        if code != 0 {
            return Err(format!("ExecSync ({handler}): `true` exited {code}"));
        }
        t.push(("ExecSync", d));
        // timeout 0: SIGKILL at once (sleep, as PID 1, ignores SIGTERM)
        let (r, d) = timed(rt.stop_container(StopContainerRequest {
            container_id: cid.clone(),
            timeout: 0,
        }))
        .await;
        r.map_err(fail(handler, "StopContainer"))?;
        t.push(("StopContainer", d));
        let (r, d) = timed(rt.remove_container(RemoveContainerRequest {
            container_id: cid.clone(),
        }))
        .await;
        r.map_err(fail(handler, "RemoveContainer"))?;
        t.push(("RemoveContainer", d));
        self.stop_remove_pod(handler, &pod, &mut t).await?;
        t.push((GC_AFTER_REMOVAL, self.collect_garbage().await?));
        Ok(t)
    }

    /// A pod and one container from nothing to Running (RunPodSandbox, CreateContainer,
    /// StartContainer) and back to nothing (StopPodSandbox, RemovePodSandbox), then
    /// containerd's garbage collection of what the pod left (not timed here: the per-call
    /// workload times it).
    pub async fn pod_from_scratch(&self, handler: &str) -> Result<(Duration, Duration), String> {
        let mut t = Timings::new();
        let config = self.pod_config(&self.next_name(handler, "scratch"));
        let up = Instant::now();
        let (pod, _) = self.run_pod(handler, &config).await?;
        self.create_start(handler, &pod, &config, &mut t).await?;
        let up = up.elapsed();
        let down = Instant::now();
        self.stop_remove_pod(handler, &pod, &mut t).await?;
        let down = down.elapsed();
        self.collect_garbage().await?;
        Ok((up, down))
    }

    /// `n` pods, each run, stopped and removed, `in_flight` at a time; the wall time.
    pub async fn many_pods(
        &self,
        handler: &str,
        n: usize,
        in_flight: usize,
    ) -> Result<Duration, String> {
        let sem = Arc::new(Semaphore::new(in_flight.max(1)));
        let mut set = JoinSet::new();
        let t = Instant::now();
        for _ in 0..n {
            let (me, sem, h) = (self.clone(), sem.clone(), handler.to_string());
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.map_err(|e| e.to_string())?;
                let config = me.pod_config(&me.next_name(&h, "many"));
                let (pod, _) = me.run_pod(&h, &config).await?;
                me.stop_remove_pod(&h, &pod, &mut Timings::new()).await
            });
        }
        join_all(set).await?;
        Ok(t.elapsed())
    }

    /// Starts `n` pods with one sleeping container each, `in_flight` at a time. Returns the
    /// wall time and (pod ID, container ID) of each.
    pub async fn start_density(
        &self,
        handler: &str,
        n: usize,
        in_flight: usize,
    ) -> Result<(Duration, Vec<(String, String)>), String> {
        let sem = Arc::new(Semaphore::new(in_flight.max(1)));
        let mut set = JoinSet::new();
        let t = Instant::now();
        for _ in 0..n {
            let (me, sem, h) = (self.clone(), sem.clone(), handler.to_string());
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.map_err(|e| e.to_string())?;
                let config = me.pod_config(&me.next_name(&h, "density"));
                let (pod, _) = me.run_pod(&h, &config).await?;
                let cid = me
                    .create_start(&h, &pod, &config, &mut Timings::new())
                    .await?;
                Ok((pod, cid))
            });
        }
        let pods = join_all(set).await?;
        Ok((t.elapsed(), pods))
    }

    /// Stops and removes `pods`, `in_flight` at a time; the wall time.
    pub async fn remove_pods(
        &self,
        handler: &str,
        pods: &[String],
        in_flight: usize,
    ) -> Result<Duration, String> {
        let sem = Arc::new(Semaphore::new(in_flight.max(1)));
        let mut set = JoinSet::new();
        let t = Instant::now();
        for pod in pods {
            let (me, sem, h, pod) = (self.clone(), sem.clone(), handler.to_string(), pod.clone());
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.map_err(|e| e.to_string())?;
                me.stop_remove_pod(&h, &pod, &mut Timings::new()).await
            });
        }
        join_all(set).await?;
        Ok(t.elapsed())
    }

    /// How many of `pods` are Ready and how many of `containers` are Running, as CRI lists
    /// them.
    pub async fn count_ready(
        &self,
        pods: &[String],
        containers: &[String],
    ) -> Result<(usize, usize), String> {
        let mut rt = self.rt.clone();
        let want: BTreeSet<&String> = pods.iter().collect();
        let listed = rt
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: label_selector(),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| format!("ListPodSandbox: {}", s.message()))?
            .into_inner()
            .items;
        let ready = listed
            .iter()
            .filter(|p| want.contains(&p.id) && p.state == PodSandboxState::SandboxReady as i32)
            .count();
        let want: BTreeSet<&String> = containers.iter().collect();
        let listed = rt
            .list_containers(ListContainersRequest::default())
            .await
            .map_err(|s| format!("ListContainers: {}", s.message()))?
            .into_inner()
            .containers;
        let running = listed
            .iter()
            .filter(|c| want.contains(&c.id) && c.state == ContainerState::ContainerRunning as i32)
            .count();
        Ok((ready, running))
    }

    /// The pid of a container's process (ContainerStatus verbose info).
    pub async fn container_pid(&self, cid: &str) -> Result<i32, String> {
        let mut rt = self.rt.clone();
        let info = rt
            .container_status(ContainerStatusRequest {
                container_id: cid.into(),
                verbose: true,
            })
            .await
            .map_err(|s| format!("ContainerStatus {cid}: {}", s.message()))?
            .into_inner()
            .info;
        info.get("info")
            .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
            .and_then(|v| v.get("pid")?.as_i64())
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("ContainerStatus {cid}: no pid in the verbose info"))
    }

    /// Removes every pod the bench created (tracked, or labelled: also those of an earlier,
    /// killed run). Returns how many were removed and the errors.
    pub async fn sweep(&self) -> (usize, Vec<String>) {
        let mut rt = self.rt.clone();
        let mut ids: BTreeSet<String> = self.live.lock().unwrap().clone();
        match rt
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: label_selector(),
                    ..Default::default()
                }),
            })
            .await
        {
            Ok(r) => ids.extend(r.into_inner().items.into_iter().map(|p| p.id)),
            Err(s) => return (0, vec![format!("ListPodSandbox: {}", s.message())]),
        }
        let mut errors = Vec::new();
        let mut removed = 0;
        for id in &ids {
            // not found counts as removed: the pod may have gone meanwhile
            let stop = rt
                .stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
            let remove = rt
                .remove_pod_sandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
            match (stop, remove) {
                (_, Ok(_)) => {
                    removed += 1;
                    self.live.lock().unwrap().remove(id);
                }
                (_, Err(s)) => errors.push(format!("RemovePodSandbox {id}: {}", s.message())),
            }
        }
        // A lease of collect_garbage that a killed bench did not delete.
        let mut leases = self.leases.clone();
        let filter = format!("labels.\"{}\"=={}", LABEL.0, LABEL.1);
        let found = leases
            .list(rsandbox_integration::tasks::in_ns(
                CRI_NAMESPACE,
                ListLeases {
                    filters: vec![filter],
                },
            ))
            .await;
        match found {
            Ok(r) => {
                for l in r.into_inner().leases {
                    let req = DeleteLease {
                        id: l.id.clone(),
                        sync: false,
                    };
                    if let Err(s) = leases
                        .delete(rsandbox_integration::tasks::in_ns(CRI_NAMESPACE, req))
                        .await
                    {
                        errors.push(format!("delete lease {}: {}", l.id, s.message()));
                    }
                }
            }
            Err(s) => errors.push(format!("list leases: {}", s.message())),
        }
        (removed, errors)
    }

    /// Pods with the bench's label that CRI still lists.
    pub async fn labelled_pods(&self) -> Result<Vec<String>, String> {
        let mut rt = self.rt.clone();
        Ok(rt
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: label_selector(),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| format!("ListPodSandbox: {}", s.message()))?
            .into_inner()
            .items
            .into_iter()
            .map(|p| p.id)
            .collect())
    }
}

fn label_selector() -> std::collections::HashMap<String, String> {
    [(LABEL.0.to_string(), LABEL.1.to_string())].into()
}

/// Waits for every task; the first error wins (the others still finish: their pods are
/// tracked and swept).
async fn join_all<T: 'static>(mut set: JoinSet<Result<T, String>>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(format!("task failed: {e}"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
