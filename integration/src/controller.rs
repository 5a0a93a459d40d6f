//! containerd's sandbox controller API (`containerd.services.sandbox.v1.Controller`) with the
//! `shim` sandboxer and our runtime, for the tests that create sandboxes without CRI.

use containerd_client::services::v1::sandbox::controller_client::ControllerClient;
pub use containerd_client::services::v1::sandbox::*;
use containerd_client::types::Sandbox;
use containerd_client::types::sandbox::Runtime as SandboxRuntime;

use crate::{RUNTIME, address};

pub const NS: &str = "default";

pub fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("containerd-namespace", NS.parse().unwrap());
    r
}

pub type Ctl = ControllerClient<tonic::transport::Channel>;

/// The sandbox record for `id`: our runtime, the `shim` sandboxer.
pub fn sandbox_info(id: &str) -> Sandbox {
    Sandbox {
        sandbox_id: id.into(),
        runtime: Some(SandboxRuntime {
            name: RUNTIME.into(),
            options: None,
        }),
        sandboxer: "shim".into(),
        ..Default::default()
    }
}

pub async fn controller() -> Ctl {
    let ch = containerd_client::connect(address()).await.unwrap();
    ControllerClient::new(ch)
}

pub async fn create_and_start(c: &mut Ctl, id: &str, netns: &str) -> Result<u32, String> {
    c.create(req(ControllerCreateRequest {
        sandbox_id: id.into(),
        netns_path: netns.into(),
        sandbox: Some(sandbox_info(id)),
        sandboxer: "shim".into(),
        ..Default::default()
    }))
    .await
    .map_err(|s| format!("Controller.Create: {}", s.message()))?;
    let r = c
        .start(req(ControllerStartRequest {
            sandbox_id: id.into(),
            sandboxer: "shim".into(),
        }))
        .await
        .map_err(|s| format!("Controller.Start: {}", s.message()))?;
    Ok(r.into_inner().pid)
}

pub async fn stop_and_shutdown(c: &mut Ctl, id: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if let Err(s) = c
        .stop(req(ControllerStopRequest {
            sandbox_id: id.into(),
            timeout_secs: 10,
            sandboxer: "shim".into(),
        }))
        .await
    {
        errs.push(format!("Controller.Stop: {}", s.message()));
    }
    if let Err(s) = c
        .shutdown(req(ControllerShutdownRequest {
            sandbox_id: id.into(),
            sandboxer: "shim".into(),
        }))
        .await
    {
        errs.push(format!("Controller.Shutdown: {}", s.message()));
    }
    errs
}

pub async fn status(c: &mut Ctl, id: &str) -> Result<ControllerStatusResponse, String> {
    c.status(req(ControllerStatusRequest {
        sandbox_id: id.into(),
        verbose: false,
        sandboxer: "shim".into(),
    }))
    .await
    .map(|r| r.into_inner())
    .map_err(|s| format!("Controller.Status: {}", s.message()))
}

/// containerd's sandbox store record of `id` (which `ctr run --sandbox` looks the sandbox up
/// in; the controller API alone does not write one).
pub async fn store_record(id: &str) {
    let ch = containerd_client::connect(address()).await.unwrap();
    let mut store = store_client::StoreClient::new(ch);
    store
        .create(req(StoreCreateRequest {
            sandbox: Some(sandbox_info(id)),
        }))
        .await
        .unwrap();
}

/// Removes the record [`store_record`] wrote (errors ignored: clean-up).
pub async fn drop_store_record(id: &str) {
    let ch = containerd_client::connect(address()).await.unwrap();
    let _ = store_client::StoreClient::new(ch)
        .delete(req(StoreDeleteRequest {
            sandbox_id: id.into(),
        }))
        .await;
}
