//! Create: the container's spec, pod edits, network, rootfs, stdio and `runc create`.
//!
//! Every step that makes something registers how to take it down on an [`Undo`] guard; an
//! early return (any `?`) runs those in reverse, so a failed Create leaves nothing behind: no
//! mount, network, runc container or reserved ID.

use std::sync::Arc;

use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use protobuf::MessageField;

use super::{Container, CreateRequest, Slot, TASK_STATE_FILE, TaskManager, TaskRecord};
use crate::host::reclaim::Member;
use crate::host::runtime::{ProcessIo, Runtime};
use crate::records::error::{Context, Error, Result};
use crate::records::oci;
use crate::records::validate;
use crate::shim::events::Event;
use crate::shim::reaper::Subscription;
use crate::shim::sync::Lock;
use crate::shim::timing::Steps;
use crate::shim::util::write_file_atomic;
use crate::task::process::Process;
use crate::task::stdio;

/// One undo step: what it takes down, and how.
type UndoStep<'a> = (&'static str, Box<dyn FnOnce() + 'a>);

/// Undo steps of a half-done operation, run in reverse on drop unless [`Undo::commit`]ed.
pub(super) struct Undo<'a> {
    steps: Vec<UndoStep<'a>>,
}

impl<'a> Undo<'a> {
    pub(super) fn new() -> Self {
        Undo { steps: Vec::new() }
    }
    /// Registers how to take down what the step just made.
    pub(super) fn push(&mut self, what: &'static str, f: impl FnOnce() + 'a) {
        self.steps.push((what, Box::new(f)));
    }
    /// The operation succeeded: keep everything.
    pub(super) fn commit(mut self) {
        self.steps.clear();
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        while let Some((what, f)) = self.steps.pop() {
            log::debug!("undo: {what}");
            f();
        }
    }
}

/// What `runc create` left us to keep: the pid, and the subscription that holds an exit the
/// reaper may report before the pid is registered.
struct Spawned {
    pid: i32,
    subscription: Option<Subscription>,
}

impl TaskManager {
    /// Create: mount the rootfs, open stdio, `runc create`. Returns the init pid.
    pub fn create(&self, req: CreateRequest) -> Result<u32> {
        let id = req.id.clone();
        self.create_inner(req)
            .with_context(|| format!("create task {id}"))
    }

    fn create_inner(&self, mut req: CreateRequest) -> Result<u32> {
        validate::id("task id", &req.id)?;
        super::validate_bundle(&req.bundle)?;
        req.stdio.validate()?;
        crate::host::mount::validate(&req.rootfs)?;
        let reservation = self.reserve(&req.id)?;
        let mut undo = Undo::new();
        let mut steps = Steps::new(|| format!("create task {}", req.id));

        let config_path = req.bundle.join("config.json");
        let raw = std::fs::read(&config_path)
            .with_context(|| format!("read {}", config_path.display()))?;
        let mut spec: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::invalid(format!("parse {}: {e}", config_path.display())))?;
        oci::check_container_spec(&spec, req.stdio.terminal)?;
        steps.step("read spec");
        let mut spec_changed = false;
        let pod = self.pod().filter(|p| p.has_sandbox());
        if let Some(pod) = &pod {
            let mount_label = oci::mount_label(&spec);
            spec_changed |= pod
                .prepare_spec(&req.id, &mut spec)
                .context("add pod mounts")?;
            // The pod moved the container to its SELinux level: the rootfs's `context=`
            // option, which containerd's client derived from the old mount label, follows.
            if let (Some(old), Some(new)) = (mount_label, oci::mount_label(&spec))
                && old != new
                && !crate::host::selinux::move_context_option(&mut req.rootfs, &old, &new)
                && req
                    .rootfs
                    .iter()
                    .flat_map(|m| &m.options)
                    .any(|o| o.starts_with("context="))
            {
                // Not the form containerd's client writes: the process would run at the new
                // level over a rootfs at another one.
                log::warn!(
                    "task {}: the rootfs's context= option does not name the mount label {old}: left as sent, the container may not read its own files",
                    req.id
                );
            }
        }
        let mut network = None;
        if pod.is_none()
            && self.network_for_tasks
            && let Some(provider) = &self.network
            && oci::wants_new_netns(&spec)
        {
            let net = provider
                .setup(&self.namespace, &req.id, None)
                .context("set up the task network")?;
            oci::set_netns_path(&mut spec, &net.netns);
            spec_changed = true;
            let (provider, record) = (provider.clone(), net.clone());
            undo.push("tear down the task network", move || {
                if let Err(e) = crate::host::network::teardown(Some(&provider), &record) {
                    log::warn!("task {}: {e}", record.netns.display());
                }
            });
            network = Some(net);
        }
        steps.step("pod edits and network");
        let shares_pid_ns = oci::shares_pid_namespace(&spec);
        let runc = req
            .runc
            .clone()
            .unwrap_or_else(|| self.default_runc.clone())
            .for_container(&spec);
        if spec_changed {
            let data = serde_json::to_vec(&spec).map_err(|e| Error::internal(e.to_string()))?;
            write_file_atomic(&config_path, &data, 0o600).context("write config.json")?;
        }
        // Before `runc create`, and recorded before it runs: whether the container's cgroups
        // will be runc's own or a cgroup that exists already (shared: `/system.slice`).
        let cgroups_path = oci::cgroups_path(&spec);
        let cgroups_at_create = crate::host::cgroup_ownership::survey(
            cgroups_path.as_deref(),
            &crate::host::cgroup_ownership::all_hierarchies(),
        );
        if !cgroups_at_create.made_by_runc() {
            log::info!(
                "task {}: {}: delete will not kill in or remove it",
                req.id,
                cgroups_at_create.why_not_own()
            );
        }
        let record = TaskRecord {
            id: req.id.clone(),
            runc: runc.clone(),
            rootfs_mounted: !req.rootfs.is_empty(),
            network: network.clone(),
            cgroups_at_create: Some(cgroups_at_create.clone()),
        };
        let record_path = req.bundle.join(TASK_STATE_FILE);
        let data =
            crate::records::state_file::encode(&crate::records::state_file::TASK_RECORD, &record)?;
        write_file_atomic(&record_path, &data, 0o600).context("write task record")?;
        undo.push("remove the task record", move || {
            let _ = std::fs::remove_file(&record_path);
        });
        if let Some(pod) = &pod {
            pod.add_member(Member {
                id: req.id.clone(),
                bundle: Some(req.bundle.clone()),
                runc: runc.clone(),
                cgroups_path,
                cgroups_at_create: Some(cgroups_at_create),
            })
            .context("record the pod's container")?;
            let (pod, id) = (pod.clone(), req.id.clone());
            undo.push("drop the pod's container record", move || {
                pod.remove_member(&id)
            });
        }
        steps.step("write spec and record");
        let rootfs = req.bundle.join("rootfs");
        if !req.rootfs.is_empty() {
            self.host.mount_rootfs(&req.rootfs, &rootfs)?;
            let rootfs = rootfs.clone();
            undo.push("unmount the rootfs", move || {
                let _ = self.host.unmount_rootfs(&rootfs);
            });
        }

        steps.step("mount rootfs");
        let runtime = self.host.runtime(&runc);
        // A labelled init's stdio goes through the shim's pipes (the label as runc gets it).
        let labelled = spec.get("process").is_some_and(stdio::has_process_label);
        let init =
            Arc::new(Process::new(&req.id, None, req.stdio.clone(), None).copying_stdio(labelled));
        let spawned = self.spawn_init(&req, &runtime, &init)?;
        steps.step("runc create");
        {
            let (runtime, id) = (runtime.clone(), req.id.clone());
            undo.push("delete the runc container", move || {
                let _ = runtime.delete(&id, true);
            });
        }
        // Before the container's own code can run: an init outside its cgroups (systemd on
        // cgroup v1 may have moved it, see `placement`) is deleted with the container.
        runtime
            .check_placement(&req.id, spawned.pid)
            .context("check the container's cgroups after runc create")?;
        steps.step("check cgroups");
        let cgroup = match self.host.cgroup_paths(spawned.pid) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("task {}: no cgroup paths: {e}", req.id);
                None
            }
        };
        if let Some(paths) = &cgroup
            && let Err(e) = self.host.watch_oom(&req.id, paths)
        {
            log::warn!("task {}: OOM events unavailable: {e}", req.id);
        }
        steps.step("cgroup and OOM watch");
        let container = Arc::new(Container {
            id: req.id.clone(),
            bundle: req.bundle.clone(),
            runtime,
            rootfs_mounted: !req.rootfs.is_empty(),
            init: init.clone(),
            execs: Default::default(),
            cgroup,
            shares_pid_ns,
            network,
            op: Default::default(),
            exec_starts_done: Default::default(),
            sigkilled: Default::default(),
            process_labelled: labelled,
        });
        {
            let mut table = self.containers.locked();
            if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                // ShutdownSandbox began while we ran: it will not delete what it cannot see,
                // so take it down ourselves (the guard runs once the table is unlocked).
                return Err(super::shutting_down());
            }
            undo.commit();
            table.insert(req.id.clone(), Slot::Live(container));
        }
        drop(reservation);
        self.events.publish(Event::Create(TaskCreate {
            container_id: req.id.clone(),
            bundle: req.bundle.display().to_string(),
            rootfs: req
                .rootfs
                .iter()
                .map(|m| containerd_shim_protos::types::mount::Mount {
                    type_: m.kind.clone(),
                    source: m.source.clone(),
                    target: m.target.clone(),
                    options: m.options.clone(),
                    ..Default::default()
                })
                .collect(),
            io: MessageField::some(TaskIO {
                stdin: req.stdio.stdin.clone(),
                stdout: req.stdio.stdout.clone(),
                stderr: req.stdio.stderr.clone(),
                terminal: req.stdio.terminal,
                ..Default::default()
            }),
            pid: spawned.pid as u32,
            ..Default::default()
        }));
        // Only now, after TaskCreate, may the init's exit be published: register the pid, then
        // hand over an exit the reaper reported meanwhile (the init was killed right away).
        self.register_pid(spawned.pid, &init, spawned.subscription);
        Ok(spawned.pid as u32)
    }

    /// `runc create` with stdio or a terminal. On error nothing is left running.
    fn spawn_init(
        &self,
        req: &CreateRequest,
        runtime: &Arc<dyn Runtime>,
        init: &Arc<Process>,
    ) -> Result<Spawned> {
        let subscription = self.reaper.as_ref().map(|r| r.subscribe());
        let (io, keepalive, pipes) = if req.stdio.terminal {
            (ProcessIo::default(), Default::default(), None)
        } else {
            let o = stdio::open(&req.stdio, init.copies_stdio())?;
            (o.process, o.keepalive, o.pipes)
        };
        let spawned = runtime.create(&req.id, &req.bundle, req.stdio.terminal, io)?;
        if let Err(e) = self.attach_io(init, spawned.console, keepalive, pipes) {
            // The container exists but cannot be served: take it down again.
            let _ = runtime.delete(&req.id, true);
            return Err(e);
        }
        init.state().set_pid(spawned.pid);
        Ok(Spawned {
            pid: spawned.pid,
            subscription,
        })
    }

    /// Keeps the stdio descriptors of a freshly spawned process and starts its terminal or
    /// pipe copier.
    pub(super) fn attach_io(
        &self,
        p: &Arc<Process>,
        console: Option<std::fs::File>,
        keepalive: stdio::Keepalive,
        pipes: Option<stdio::copy::Pipes>,
    ) -> Result<()> {
        let tty = match console {
            Some(master) => Some(self.start_tty(master, p)?),
            None if p.stdio().terminal => {
                return Err(Error::internal(
                    "runc did not send a console for the terminal",
                ));
            }
            None => None,
        };
        let pipes = match pipes {
            Some(pipes) => Some(self.start_pipes(pipes, p)?),
            None => None,
        };
        p.io().attach(keepalive, tty, pipes);
        Ok(())
    }

    fn start_pipes(
        &self,
        pipes: stdio::copy::Pipes,
        process: &Arc<Process>,
    ) -> Result<stdio::PipeCopier> {
        let me = self.me.clone();
        // Weak: a process dropped without an exit (a failed Create) drops its copier, which
        // then ends (see `PipeCopier`).
        let p = Arc::downgrade(process);
        stdio::PipeCopier::start(
            pipes,
            format!(
                "task {} process {}",
                process.container_id(),
                process.event_id()
            ),
            Box::new(move || {
                if let (Some(tm), Some(p)) = (me.upgrade(), p.upgrade()) {
                    tm.output_drained(&p);
                }
            }),
        )
    }

    fn start_tty(&self, master: std::fs::File, process: &Arc<Process>) -> Result<stdio::TtyCopier> {
        let me = self.me.clone();
        let p = process.clone();
        stdio::TtyCopier::start(
            master,
            process.stdio(),
            format!(
                "task {} process {}",
                process.container_id(),
                process.event_id()
            ),
            Box::new(move || {
                if let Some(tm) = me.upgrade() {
                    tm.output_drained(&p);
                }
            }),
        )
    }
}
