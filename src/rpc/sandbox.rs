//! The Sandbox service adapter (`containerd.runtime.sandbox.v1.Sandbox`): protobuf in,
//! [`SandboxManager`] calls, protobuf out, with containerd's exact state strings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use containerd_shim_protos::sandbox_api::*;
use containerd_shim_protos::sandbox_sync::Sandbox;
use containerd_shim_protos::types::platform::Platform;
use protobuf::MessageField;
use ttrpc::TtrpcContext;

use crate::error::{Context, Error};
use crate::pod::decode_pod_config;
use crate::pod::sandbox::{CreateSandbox, SandboxManager, State};
use crate::rpc::server::{ParkedMethod, Responder};
use crate::util::{go_arch, timestamp};
use crate::waiters::{ExitInfo, ExitWaiter};

/// containerd (and the kubelet through CRI) only understand these two strings.
pub const SANDBOX_READY: &str = "SANDBOX_READY";
pub const SANDBOX_NOTREADY: &str = "SANDBOX_NOTREADY";

/// The Sandbox service.
pub struct SandboxService {
    sm: Arc<SandboxManager>,
}

impl SandboxService {
    pub fn new(sm: Arc<SandboxManager>) -> Self {
        SandboxService { sm }
    }
}

type R<T> = ttrpc::Result<T>;

impl Sandbox for SandboxService {
    fn create_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: CreateSandboxRequest,
    ) -> R<CreateSandboxResponse> {
        log::info!(
            "create sandbox {} netns {:?}",
            req.sandbox_id,
            req.netns_path
        );
        let spec = match req.options.as_ref() {
            Some(any) => decode_pod_config(any)
                .with_context(|| format!("create sandbox {}: pod config", req.sandbox_id))?,
            None => Default::default(),
        };
        if !req.rootfs.is_empty() {
            log::info!(
                "create sandbox {}: ignoring {} rootfs mounts (the pause process needs none)",
                req.sandbox_id,
                req.rootfs.len()
            );
        }
        self.sm.create(CreateSandbox {
            id: req.sandbox_id,
            bundle: PathBuf::from(req.bundle_path),
            spec,
            netns: Some(PathBuf::from(req.netns_path)).filter(|p| !p.as_os_str().is_empty()),
        })?;
        Ok(CreateSandboxResponse::new())
    }

    fn start_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: StartSandboxRequest,
    ) -> R<StartSandboxResponse> {
        log::info!("start sandbox {}", req.sandbox_id);
        let (pid, at) = self.sm.start(&req.sandbox_id)?;
        Ok(StartSandboxResponse {
            pid,
            created_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn platform(&self, _ctx: &TtrpcContext, req: PlatformRequest) -> R<PlatformResponse> {
        self.sm
            .get(&req.sandbox_id)
            .map_err(|e| e.context("platform"))?;
        Ok(PlatformResponse {
            platform: MessageField::some(Platform {
                os: "linux".into(),
                architecture: go_arch().into(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn stop_sandbox(&self, _ctx: &TtrpcContext, req: StopSandboxRequest) -> R<StopSandboxResponse> {
        log::info!("stop sandbox {}", req.sandbox_id);
        self.sm.stop(&req.sandbox_id)?;
        Ok(StopSandboxResponse::new())
    }

    /// Served by [`SandboxWait`] on the shim's server (no thread is held); this blocking form
    /// is for callers of the trait that own a thread (tests).
    fn wait_sandbox(&self, _ctx: &TtrpcContext, req: WaitSandboxRequest) -> R<WaitSandboxResponse> {
        Ok(wait_response(self.sm.wait_blocking(&req.sandbox_id)?))
    }

    fn sandbox_status(
        &self,
        _ctx: &TtrpcContext,
        req: SandboxStatusRequest,
    ) -> R<SandboxStatusResponse> {
        let s = self
            .sm
            .get(&req.sandbox_id)
            .map_err(|e| e.context("sandbox status"))?;
        let mut info = HashMap::new();
        if req.verbose {
            info.insert("info".to_string(), self.sm.info(&s));
        }
        Ok(SandboxStatusResponse {
            sandbox_id: s.id.clone(),
            pid: s.pid as u32,
            state: if s.state == State::Ready {
                SANDBOX_READY
            } else {
                SANDBOX_NOTREADY
            }
            .into(),
            info,
            created_at: s.created_at.map(timestamp).into(),
            exited_at: s.exit.map(|(_, at)| timestamp(at)).into(),
            ..Default::default()
        })
    }

    fn ping_sandbox(&self, _ctx: &TtrpcContext, req: PingRequest) -> R<PingResponse> {
        self.sm
            .get(&req.sandbox_id)
            .map_err(|e| e.context("ping sandbox"))?;
        Ok(PingResponse::new())
    }

    fn shutdown_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: ShutdownSandboxRequest,
    ) -> R<ShutdownSandboxResponse> {
        log::info!("shutdown sandbox {}", req.sandbox_id);
        self.sm.shutdown(&req.sandbox_id)?;
        Ok(ShutdownSandboxResponse::new())
    }

    fn sandbox_metrics(
        &self,
        _ctx: &TtrpcContext,
        req: SandboxMetricsRequest,
    ) -> R<SandboxMetricsResponse> {
        let data = self.sm.metrics(&req.sandbox_id)?;
        // The Metric type is not exported by containerd-shim-protos; fill it in place.
        let mut res = SandboxMetricsResponse::new();
        let m = res.metrics.mut_or_insert_default();
        m.timestamp = MessageField::some(timestamp(SystemTime::now()));
        m.id = req.sandbox_id;
        m.data = MessageField::some(data);
        Ok(res)
    }
}

fn wait_response(e: ExitInfo) -> WaitSandboxResponse {
    WaitSandboxResponse {
        exit_status: e.status,
        exited_at: MessageField::some(timestamp(e.at)),
        ..Default::default()
    }
}

/// `WaitSandbox` as a parked call: the reply waits until the pod ends.
pub struct SandboxWait {
    sm: Arc<SandboxManager>,
}

impl SandboxWait {
    pub fn new(sm: Arc<SandboxManager>) -> Self {
        SandboxWait { sm }
    }
}

struct WaitReply(Responder);

impl ExitWaiter for WaitReply {
    fn exited(self: Box<Self>, exit: ExitInfo) {
        self.0.send(Ok(wait_response(exit)));
    }
    fn refused(self: Box<Self>, error: Error) {
        self.0.send::<WaitSandboxResponse>(Err(error.into()));
    }
    fn is_listening(&self) -> bool {
        self.0.is_listening()
    }
}

impl ParkedMethod for SandboxWait {
    fn call(&self, payload: &[u8], reply: Responder) {
        use protobuf::Message;
        let req = match WaitSandboxRequest::parse_from_bytes(payload) {
            Ok(r) => r,
            Err(e) => {
                return reply.send::<WaitSandboxResponse>(Err(Error::invalid(format!(
                    "wait sandbox: bad request: {e}"
                ))
                .into()));
            }
        };
        // An unknown sandbox is answered with the error (WaitReply::refused).
        let _ = self.sm.wait(&req.sandbox_id, Box::new(WaitReply(reply)));
    }
}
