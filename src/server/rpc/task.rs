//! The Task service adapter: protobuf requests in, [`TaskManager`] calls, protobuf out.
//! Served as both `containerd.task.v3.Task` and `containerd.task.v2.Task`.

use std::path::PathBuf;
use std::sync::Arc;

use containerd_shim_protos::api::*;
use containerd_shim_protos::shim::oci::{Options as RuncOptions, ProcessDetails};
use containerd_shim_protos::shim_sync::Task;
use containerd_shim_protos::types::task::{ProcessInfo, Status as ProtoStatus};
use protobuf::well_known_types::any::Any;
use protobuf::well_known_types::empty::Empty;
use protobuf::{EnumOrUnknown, Message, MessageField};
use ttrpc::TtrpcContext;

use crate::host::mount::MountSpec;
use crate::host::runtime::RuncConfig;
use crate::records::error::{Error, Result};
use crate::shim::util::timestamp;
use crate::task::stdio::StdioRequest;
use crate::task::{CreateRequest, Status, TaskManager};

/// The Task service.
pub struct TaskService {
    tm: Arc<TaskManager>,
}

impl TaskService {
    pub fn new(tm: Arc<TaskManager>) -> Self {
        TaskService { tm }
    }
}

/// Whether an Any holds message `name` (with or without a `type.googleapis.com/` prefix).
pub fn any_is(any: &Any, name: &str) -> bool {
    any.type_url == name || any.type_url.rsplit('/').next() == Some(name)
}

/// runc settings from `containerd.runc.v1.Options`, relative to containerd's defaults. Other
/// option types (CRI's endpoint-only runc options, `runtimeoptions.v1.Options`) leave the
/// defaults in place.
///
/// `containerd.linux.runc.CreateOptions` carries only runc create's flags: they go on top of
/// `base` (the shim's own settings: its start options' binary, root and cgroup driver).
pub fn runc_config_from_options(
    any: Option<&Any>,
    base: &RuncConfig,
    namespace: &str,
) -> Result<Option<RuncConfig>> {
    let Some(any) = any else { return Ok(None) };
    if any_is(any, LINUX_CREATE_OPTIONS) {
        return linux_create_options(&any.value, base.clone()).map(Some);
    }
    if !any_is(any, "containerd.runc.v1.Options") {
        return Ok(None);
    }
    let o = RuncOptions::parse_from_bytes(&any.value)
        .map_err(|e| Error::invalid(format!("runtime options: {e}")))?;
    let mut cfg = RuncConfig::defaults(namespace);
    if !o.binary_name.is_empty() {
        cfg.binary = o.binary_name;
    }
    if !o.root.is_empty() {
        let root = PathBuf::from(&o.root);
        if !root.is_absolute() {
            return Err(Error::invalid(format!(
                "runtime options: Root {:?} must be absolute",
                o.root
            )));
        }
        cfg.root = root.join(namespace);
    }
    cfg.systemd_cgroup = o.systemd_cgroup;
    cfg.no_pivot_root = o.no_pivot_root;
    cfg.no_new_keyring = o.no_new_keyring;
    Ok(Some(cfg))
}

/// What containerd's client sends for a runtime that is not `io.containerd.runc.*` (its
/// `WithNoPivotRoot`, `ctr run --no-pivot`): the v1 Linux runtime's create options.
const LINUX_CREATE_OPTIONS: &str = "containerd.linux.runc.CreateOptions";

/// runc settings from `containerd.linux.runc.CreateOptions` (containerd's
/// `api/types/runctypes`): `no_pivot_root = 1` and `no_new_keyring = 8` are the fields that
/// mean something here; the rest (CRIU's, the v1 shim's) are skipped. Decoded by hand: the
/// protos crate does not carry the message.
fn linux_create_options(bytes: &[u8], mut cfg: RuncConfig) -> Result<RuncConfig> {
    let bad = |e: protobuf::Error| Error::invalid(format!("runtime options (CreateOptions): {e}"));
    let mut input = protobuf::CodedInputStream::from_bytes(bytes);
    while let Some(tag) = input.read_raw_tag_or_eof().map_err(bad)? {
        let (field, wire_type) = (tag >> 3, tag & 7);
        match (field, wire_type) {
            (1, 0) => cfg.no_pivot_root = input.read_bool().map_err(bad)?,
            (8, 0) => cfg.no_new_keyring = input.read_bool().map_err(bad)?,
            _ => {
                let wire_type = protobuf::rt::WireType::new(wire_type).ok_or_else(|| {
                    Error::invalid(format!(
                        "runtime options (CreateOptions): wire type {wire_type} of field {field}"
                    ))
                })?;
                input.skip_field(wire_type).map_err(bad)?;
            }
        }
    }
    Ok(cfg)
}

fn status(s: Status) -> EnumOrUnknown<ProtoStatus> {
    EnumOrUnknown::new(match s {
        Status::Created => ProtoStatus::CREATED,
        Status::Running => ProtoStatus::RUNNING,
        Status::Paused => ProtoStatus::PAUSED,
        Status::Stopped => ProtoStatus::STOPPED,
    })
}

type R<T> = ttrpc::Result<T>;

impl Task for TaskService {
    fn create(&self, _ctx: &TtrpcContext, req: CreateTaskRequest) -> R<CreateTaskResponse> {
        log::info!("create task {}", req.id);
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(Error::unimplemented(format!(
                "create task {}: restore from a checkpoint is not supported",
                req.id
            ))
            .into());
        }
        let runc = runc_config_from_options(
            req.options.as_ref(),
            self.tm.default_runc(),
            self.tm.namespace(),
        )
        .map_err(|e| e.context(format!("create task {}", req.id)))?;
        let pid = self.tm.create(CreateRequest {
            id: req.id,
            bundle: PathBuf::from(req.bundle),
            rootfs: req
                .rootfs
                .into_iter()
                .map(|m| MountSpec {
                    kind: m.type_,
                    source: m.source,
                    target: m.target,
                    options: m.options,
                })
                .collect(),
            stdio: StdioRequest {
                stdin: req.stdin,
                stdout: req.stdout,
                stderr: req.stderr,
                terminal: req.terminal,
            },
            runc,
        })?;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> R<StartResponse> {
        log::info!("start {} {}", req.id, req.exec_id);
        let pid = self.tm.start(&req.id, &req.exec_id)?;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> R<DeleteResponse> {
        log::info!("delete {} {}", req.id, req.exec_id);
        let (pid, exit) = self.tm.delete(&req.id, &req.exec_id)?;
        Ok(DeleteResponse {
            pid,
            exit_status: exit.status,
            exited_at: MessageField::some(timestamp(exit.at)),
            ..Default::default()
        })
    }

    fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> R<StateResponse> {
        let st = self.tm.state(&req.id, &req.exec_id)?;
        let mut res = StateResponse {
            id: req.id.clone(),
            bundle: st.bundle.display().to_string(),
            pid: st.pid,
            status: status(st.status),
            stdin: st.stdio.stdin,
            stdout: st.stdio.stdout,
            stderr: st.stdio.stderr,
            terminal: st.stdio.terminal,
            exec_id: req.exec_id.clone(),
            ..Default::default()
        };
        if let Some(e) = st.exit {
            res.exit_status = e.status;
            res.exited_at = MessageField::some(timestamp(e.at));
        }
        Ok(res)
    }

    fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> R<PidsResponse> {
        let pids = self.tm.pids(&req.id)?;
        let processes = pids
            .into_iter()
            .map(|(pid, exec)| ProcessInfo {
                pid,
                info: match exec {
                    Some(exec_id) => MessageField::some(Any {
                        type_url: "containerd.runc.v1.ProcessDetails".into(),
                        value: ProcessDetails {
                            exec_id,
                            ..Default::default()
                        }
                        .write_to_bytes()
                        .unwrap_or_default(),
                        ..Default::default()
                    }),
                    None => MessageField::none(),
                },
                ..Default::default()
            })
            .collect();
        Ok(PidsResponse {
            processes,
            ..Default::default()
        })
    }

    fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> R<Empty> {
        log::info!("pause {}", req.id);
        self.tm.pause(&req.id)?;
        Ok(Empty::new())
    }

    fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> R<Empty> {
        log::info!("resume {}", req.id);
        self.tm.resume(&req.id)?;
        Ok(Empty::new())
    }

    fn checkpoint(&self, _ctx: &TtrpcContext, req: CheckpointTaskRequest) -> R<Empty> {
        Err(Error::unimplemented(format!(
            "checkpoint task {}: checkpointing (CRIU) is not supported by rsandbox",
            req.id
        ))
        .into())
    }

    fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> R<Empty> {
        log::info!(
            "kill {} {} signal {} all={}",
            req.id,
            req.exec_id,
            req.signal,
            req.all
        );
        self.tm.kill(&req.id, &req.exec_id, req.signal, req.all)?;
        Ok(Empty::new())
    }

    fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> R<Empty> {
        log::info!("exec {} in {}", req.exec_id, req.id);
        let spec = req
            .spec
            .as_ref()
            .map(|s| s.value.clone())
            .unwrap_or_default();
        let stdio = StdioRequest {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
        };
        self.tm.exec(&req.id, &req.exec_id, stdio, spec)?;
        Ok(Empty::new())
    }

    fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> R<Empty> {
        self.tm
            .resize_pty(&req.id, &req.exec_id, req.width, req.height)?;
        Ok(Empty::new())
    }

    fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> R<Empty> {
        self.tm.close_io(&req.id, &req.exec_id, req.stdin)?;
        Ok(Empty::new())
    }

    fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> R<Empty> {
        log::info!("update {}", req.id);
        let resources = req
            .resources
            .as_ref()
            .map(|r| r.value.clone())
            .unwrap_or_default();
        self.tm.update(&req.id, &resources)?;
        Ok(Empty::new())
    }

    /// Served by [`super::wait::TaskWait`] on the shim's server (no thread is held); this blocking form is
    /// for callers of the trait that own a thread (tests).
    fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> R<WaitResponse> {
        let e = self.tm.wait_blocking(&req.id, &req.exec_id)?;
        Ok(super::wait::wait_response(e))
    }

    fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> R<StatsResponse> {
        let stats = self.tm.stats(&req.id)?;
        Ok(StatsResponse {
            stats: MessageField::some(stats),
            ..Default::default()
        })
    }

    fn connect(&self, _ctx: &TtrpcContext, req: ConnectRequest) -> R<ConnectResponse> {
        let task_pid = self
            .tm
            .task_pid(&req.id)
            .map_err(|e| e.context("connect"))?;
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: crate::records::version::VERSION.into(),
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, req: ShutdownRequest) -> R<Empty> {
        log::info!("shutdown {}", req.id);
        self.tm.shutdown();
        Ok(Empty::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runc settings of runc options `o` sent as containerd sends them.
    fn config_of(o: &RuncOptions) -> RuncConfig {
        let any = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        };
        runc_config_from_options(Some(&any), &RuncConfig::defaults("k8s.io"), "k8s.io")
            .unwrap()
            .unwrap()
    }

    #[test]
    fn runc_options_set_binary_root_and_cgroup_driver() {
        let o = RuncOptions {
            binary_name: "/usr/sbin/runc".into(),
            root: "/run/r".into(),
            systemd_cgroup: true,
            ..Default::default()
        };
        let cfg = config_of(&o);
        assert_eq!(cfg.binary, "/usr/sbin/runc");
        assert_eq!(cfg.root, PathBuf::from("/run/r/k8s.io"));
        assert!(cfg.systemd_cgroup);
    }

    #[test]
    fn cri_endpoint_only_options_keep_defaults_and_other_types_are_ignored() {
        let o = RuncOptions {
            task_api_address: "ttrpc+unix:///x".into(),
            task_api_version: 3,
            ..Default::default()
        };
        let any = Any {
            type_url: "type.googleapis.com/containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        };
        assert_eq!(
            runc_config_from_options(Some(&any), &RuncConfig::defaults("k8s.io"), "k8s.io")
                .unwrap(),
            Some(RuncConfig::defaults("k8s.io"))
        );
        let other = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            ..Default::default()
        };
        assert_eq!(
            runc_config_from_options(Some(&other), &RuncConfig::defaults("k8s.io"), "k8s.io")
                .unwrap(),
            None
        );
        let bad = RuncOptions {
            root: "relative".into(),
            ..Default::default()
        };
        let any = Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: bad.write_to_bytes().unwrap(),
            ..Default::default()
        };
        assert!(runc_config_from_options(Some(&any), &RuncConfig::defaults("ns"), "ns").is_err());
    }

    #[test]
    fn no_pivot_root_and_no_new_keyring_come_from_either_options_type() {
        let o = RuncOptions {
            no_pivot_root: true,
            no_new_keyring: true,
            ..Default::default()
        };
        let cfg = config_of(&o);
        assert!(cfg.no_pivot_root && cfg.no_new_keyring);
        // CreateOptions as ctr --no-pivot sends it for a non-runc runtime: field 1 true, with
        // a string field (criu_work_path = 12) and field 8 false around it.
        let mut raw = vec![0x08, 0x01];
        raw.extend([0x62, 0x03, b'/', b'x', b'y']);
        raw.extend([0x40, 0x00]);
        let any = Any {
            type_url: "type.googleapis.com/containerd.linux.runc.CreateOptions".into(),
            value: raw,
            ..Default::default()
        };
        // on top of the shim's own settings (its start options'), which it does not carry
        let base = RuncConfig {
            binary: "/opt/runc".into(),
            systemd_cgroup: true,
            ..RuncConfig::defaults("default")
        };
        let cfg = runc_config_from_options(Some(&any), &base, "default")
            .unwrap()
            .unwrap();
        assert_eq!(
            cfg,
            RuncConfig {
                no_pivot_root: true,
                ..base
            }
        );
        // Truncated and malformed input is an error, not a panic.
        for bad in [vec![0x08], vec![0x62, 0x05, b'x'], vec![0x0f, 0x01]] {
            let any = Any {
                type_url: LINUX_CREATE_OPTIONS.into(),
                value: bad,
                ..Default::default()
            };
            assert!(
                runc_config_from_options(Some(&any), &RuncConfig::defaults("ns"), "ns").is_err()
            );
        }
    }
}
