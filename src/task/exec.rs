//! Exec: registering an exec process, and spawning it (`runc exec`) when it is started.

use std::sync::Arc;

use containerd_shim_protos::events::task::TaskExecAdded;

use super::{Container, TaskManager};
use crate::host::runtime::ProcessIo;
use crate::records::error::{Context, Error, Result};
use crate::records::oci;
use crate::records::validate;
use crate::shim::events::Event;
use crate::shim::sync::Lock;
use crate::task::process::Process;
use crate::task::stdio::{self, StdioRequest};

impl TaskManager {
    /// Registers an exec process (started later by Start with the exec ID).
    pub fn exec(
        &self,
        id: &str,
        exec_id: &str,
        stdio: StdioRequest,
        spec_json: Vec<u8>,
    ) -> Result<()> {
        self.exec_inner(id, exec_id, stdio, spec_json)
            .with_context(|| format!("exec {exec_id} in task {id}"))
    }

    fn exec_inner(
        &self,
        id: &str,
        exec_id: &str,
        stdio: StdioRequest,
        spec_json: Vec<u8>,
    ) -> Result<()> {
        validate::id("exec id", exec_id)?;
        stdio.validate()?;
        let c = self.container(id)?;
        let mut spec = oci::exec_process_spec(&spec_json, stdio.terminal)?;
        let mut process: serde_json::Value = serde_json::from_slice(&spec)
            .map_err(|e| Error::invalid(format!("process spec is not JSON: {e}")))?;
        if let Some(pod) = self.pod().filter(|p| p.has_sandbox())
            && pod.prepare_exec(id, &mut process)?
        {
            spec = serde_json::to_vec(&process)
                .map_err(|e| Error::internal(format!("encode process spec: {e}")))?;
        }
        // A labelled exec's stdio goes through the shim's pipes (the label as runc gets it;
        // without one of its own, runc gives it the container's).
        let labelled = stdio::has_process_label(&process) || c.process_labelled;
        {
            let ist = c.init.state();
            if ist.has_ended()
                || !matches!(ist.status(), super::Status::Running | super::Status::Paused)
            {
                return Err(Error::precondition(format!("task {id} is not running")));
            }
        }
        self.add_exec(
            &c,
            Process::new(id, Some(exec_id.into()), stdio, Some(spec)).copying_stdio(labelled),
        )
    }

    /// Registers `p` in `c`'s exec table and publishes TaskExecAdded, unless a Delete of `c`
    /// came first (NotFound then: the caller looked `c` up before the Delete removed it).
    pub(crate) fn add_exec(&self, c: &Container, p: Process) -> Result<()> {
        let (id, exec_id) = (c.id.as_str(), p.exec_id().unwrap_or_default().to_string());
        let mut execs = c.execs.locked();
        if execs.closed {
            // Delete removed the container after we looked it up.
            return Err(Error::not_found(format!("task {id} not found")));
        }
        if execs.by_id.contains_key(&exec_id) {
            return Err(Error::already_exists(format!(
                "exec {exec_id} already exists"
            )));
        }
        execs.by_id.insert(exec_id.clone(), Arc::new(p));
        // Published under the exec table's lock: a Delete closing the table publishes its
        // TaskDelete after taking that lock, so TaskExecAdded always comes first.
        self.events.publish(Event::ExecAdded(TaskExecAdded {
            container_id: id.into(),
            exec_id,
            ..Default::default()
        }));
        drop(execs);
        Ok(())
    }

    /// `runc exec` of a registered exec; registers its pid. On error nothing runs.
    pub(super) fn spawn_exec(&self, c: &Arc<Container>, p: &Arc<Process>) -> Result<i32> {
        let exec_id = p.exec_id().unwrap_or_default();
        let subscription = self.reaper.as_ref().map(|r| r.subscribe());
        let (io, keepalive, pipes) = if p.stdio().terminal {
            (ProcessIo::default(), Default::default(), None)
        } else {
            let o = stdio::open(p.stdio(), p.copies_stdio())?;
            (o.process, o.keepalive, o.pipes)
        };
        let spawned =
            c.runtime
                .exec(&c.id, &c.bundle, exec_id, p.spec(), p.stdio().terminal, io)?;
        if let Err(e) = self.attach_io(p, spawned.console, keepalive, pipes) {
            // The process runs but cannot be served: kill it (the reaper collects it).
            self.kill_unregistered(spawned.pid, subscription.as_ref());
            return Err(e);
        }
        // runc exec joins the cgroups its state names; a process found elsewhere must not run.
        if let Err(e) = c.runtime.check_placement(&c.id, spawned.pid) {
            self.kill_unregistered(spawned.pid, subscription.as_ref());
            return Err(e.context("check the exec's cgroups after runc exec"));
        }
        p.state().set_pid(spawned.pid);
        self.register_pid(spawned.pid, p, subscription);
        Ok(spawned.pid)
    }
}
