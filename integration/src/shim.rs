//! Direct ttrpc calls to a live shim, bypassing containerd: for inputs containerd refuses
//! itself before they reach a shim (IDs it would not accept), which a shim must still survive.

use containerd_shim_protos::sandbox_sync::SandboxClient;
use containerd_shim_protos::shim_sync::TaskClient;
use ttrpc::Code;

pub use containerd_shim_protos::api as task_api;
pub use containerd_shim_protos::sandbox_api;

/// How long one direct call may take before the test calls it a hang.
const CALL_TIMEOUT_NS: i64 = 5_000_000_000;

/// The Task and Sandbox services of one shim, on one connection.
pub struct ShimClient {
    pub task: TaskClient,
    pub sandbox: SandboxClient,
}

/// What a call answered: the status code, or why there was no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Status(Code, String),
    /// No answer: the connection broke (the shim died) or the call timed out.
    Transport(String),
}

impl Answer {
    pub fn of<T>(r: ttrpc::Result<T>) -> Answer {
        match r {
            Ok(_) => Answer::Ok,
            Err(ttrpc::Error::RpcStatus(s)) => Answer::Status(s.code(), s.message),
            Err(e) => Answer::Transport(format!("{e:?}")),
        }
    }

    pub fn code(&self) -> Option<Code> {
        match self {
            Answer::Status(c, _) => Some(*c),
            _ => None,
        }
    }
}

impl ShimClient {
    /// Connects to `address` (`unix:///run/containerd/s/...`).
    pub fn connect(address: &str) -> Result<ShimClient, String> {
        let c = ttrpc::Client::connect(address).map_err(|e| format!("connect {address}: {e:?}"))?;
        Ok(ShimClient {
            task: TaskClient::new(c.clone()),
            sandbox: SandboxClient::new(c),
        })
    }

    /// A context with the per-call timeout.
    pub fn ctx() -> ttrpc::context::Context {
        ttrpc::context::with_timeout(CALL_TIMEOUT_NS)
    }

    /// Task.Connect for `id`: the shim's pid, or what went wrong.
    pub fn connect_task(&self, id: &str) -> Result<u32, Answer> {
        let req = task_api::ConnectRequest {
            id: id.into(),
            ..Default::default()
        };
        self.task
            .connect(Self::ctx(), &req)
            .map(|r| r.shim_pid)
            .map_err(|e| Answer::of::<()>(Err(e)))
    }
}
