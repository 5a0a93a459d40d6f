//! The Sandbox service adapter (`containerd.runtime.sandbox.v1.Sandbox`): protobuf in,
//! [`SandboxManager`] calls, protobuf out, with containerd's exact state strings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use containerd_shim_protos::sandbox_api::*;
use containerd_shim_protos::sandbox_sync::Sandbox;
use containerd_shim_protos::types::platform::Platform;
use protobuf::{Message, MessageField};
use ttrpc::TtrpcContext;

use crate::pod::sandbox::{CreateSandbox, SandboxManager, State, StatusView};
use crate::pod::{decode_pod_config, pod_config_bytes};
use crate::records::error::Context;
use crate::server::rpc::server::{InlineMethod, encode};
use crate::shim::util::{go_arch, timestamp};

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
        let pod_config = req
            .options
            .as_ref()
            .and_then(pod_config_bytes)
            .map(Arc::from);
        self.sm.create(CreateSandbox {
            id: req.sandbox_id,
            bundle: PathBuf::from(req.bundle_path),
            spec,
            netns: Some(PathBuf::from(req.netns_path)).filter(|p| !p.as_os_str().is_empty()),
            pod_config,
        })?;
        Ok(CreateSandboxResponse::new())
    }

    fn start_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: StartSandboxRequest,
    ) -> R<StartSandboxResponse> {
        log::info!("start sandbox {}", req.sandbox_id);
        let (pid, at, spec) = self.sm.start(&req.sandbox_id)?;
        Ok(StartSandboxResponse {
            pid,
            created_at: MessageField::some(timestamp(at)),
            // containerd >= 2.3 hands this to NRI plugins as the pod's spec.
            spec: MessageField::some(crate::pod::sandbox_spec::to_any(&spec)),
            ..Default::default()
        })
    }

    fn platform(&self, _ctx: &TtrpcContext, req: PlatformRequest) -> R<PlatformResponse> {
        self.sm
            .get(&req.sandbox_id)
            .map_err(|e| e.context("platform"))?;
        Ok(platform_response())
    }

    fn stop_sandbox(&self, _ctx: &TtrpcContext, req: StopSandboxRequest) -> R<StopSandboxResponse> {
        log::info!("stop sandbox {}", req.sandbox_id);
        self.sm.stop(&req.sandbox_id)?;
        Ok(StopSandboxResponse::new())
    }

    /// Served by [`super::wait::SandboxWait`] on the shim's server (no thread is held); this blocking form
    /// is for callers of the trait that own a thread (tests).
    fn wait_sandbox(&self, _ctx: &TtrpcContext, req: WaitSandboxRequest) -> R<WaitSandboxResponse> {
        Ok(super::wait::wait_sandbox_response(
            self.sm.wait_blocking(&req.sandbox_id)?,
        ))
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
        let mut res = status_response(&StatusView::of(&s));
        if req.verbose {
            res.info.extend(self.sm.verbose_info(&s));
        }
        Ok(res)
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

/// A non-verbose SandboxStatus: what containerd's podsandbox controller answers from memory.
fn status_response(s: &StatusView) -> SandboxStatusResponse {
    let state = if s.state == State::Ready {
        SANDBOX_READY
    } else {
        SANDBOX_NOTREADY
    };
    // Flat `pid` and `state` keys for clients that read them from the map (conformance
    // harnesses for sandbox shims do), beside the verbose document under `info`.
    let info = HashMap::from([
        ("pid".to_string(), s.pid.to_string()),
        ("state".to_string(), state.to_string()),
    ]);
    SandboxStatusResponse {
        sandbox_id: s.id.clone(),
        pid: s.pid as u32,
        state: state.into(),
        info,
        created_at: s.created_at.map(timestamp).into(),
        exited_at: s.exit.map(|(_, at)| timestamp(at)).into(),
        ..Default::default()
    }
}

fn platform_response() -> PlatformResponse {
    PlatformResponse {
        platform: MessageField::some(Platform {
            os: "linux".into(),
            architecture: go_arch().into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Sandbox calls the connection's reader answers itself ([`InlineMethod`]): CRI asks for
/// the sandbox's status (never verbose) at every container event and CreateContainer, and for
/// its platform at CreateContainer, where containerd's runc path answers in-process. Each
/// answers from [`SandboxManager::try_status`] and hands the call to the pool when the
/// sandbox's data is busy, when the status is verbose, or when the request does not decode:
/// the answers are those of the `Sandbox` impl above, which serves those cases.
pub fn inline_methods(sm: &Arc<SandboxManager>) -> Vec<(&'static str, Arc<dyn InlineMethod>)> {
    fn reply<M: protobuf::Message>(
        r: crate::records::error::Result<M>,
        step: &str,
    ) -> ttrpc::Result<Vec<u8>> {
        r.map_err(|e| ttrpc::Error::from(e.context(step)))
            .and_then(|m| encode(&m))
    }
    let (a, b, c) = (sm.clone(), sm.clone(), sm.clone());
    vec![
        (
            "/containerd.runtime.sandbox.v1.Sandbox/SandboxStatus",
            Arc::new(move |payload: &[u8]| {
                let req = SandboxStatusRequest::parse_from_bytes(payload).ok()?;
                if req.verbose {
                    return None;
                }
                let s = a.try_status(&req.sandbox_id)?;
                Some(reply(s.map(|s| status_response(&s)), "sandbox status"))
            }) as Arc<dyn InlineMethod>,
        ),
        (
            "/containerd.runtime.sandbox.v1.Sandbox/Platform",
            Arc::new(move |payload: &[u8]| {
                let req = PlatformRequest::parse_from_bytes(payload).ok()?;
                let s = b.try_status(&req.sandbox_id)?;
                Some(reply(s.map(|_| platform_response()), "platform"))
            }),
        ),
        (
            "/containerd.runtime.sandbox.v1.Sandbox/PingSandbox",
            Arc::new(move |payload: &[u8]| {
                let req = PingRequest::parse_from_bytes(payload).ok()?;
                let s = c.try_status(&req.sandbox_id)?;
                Some(reply(s.map(|_| PingResponse::new()), "ping sandbox"))
            }),
        ),
    ]
}
