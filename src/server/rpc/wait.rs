//! `Task.Wait` and `WaitSandbox` as parked calls ([`ParkedMethod`]): the request is decoded on
//! the connection's reader thread, and the reply waits in the waiter list of the process (or
//! pod) until it ends. No thread is held.

use std::sync::Arc;

use containerd_shim_protos::api::{WaitRequest, WaitResponse};
use containerd_shim_protos::sandbox_api::{WaitSandboxRequest, WaitSandboxResponse};
use protobuf::{Message, MessageField};

use crate::pod::sandbox::SandboxManager;
use crate::records::error::Error;
use crate::server::rpc::server::{ParkedMethod, Responder};
use crate::shim::util::timestamp;
use crate::shim::waiters::{ExitInfo, ExitWaiter};
use crate::task::TaskManager;

/// A parked reply: the exit, as response `M`.
struct ExitReply<M> {
    reply: Responder,
    response: fn(ExitInfo) -> M,
}

impl<M: Message> ExitWaiter for ExitReply<M> {
    fn exited(self: Box<Self>, exit: ExitInfo) {
        self.reply.send(Ok((self.response)(exit)));
    }
    fn refused(self: Box<Self>, error: Error) {
        self.reply.send::<M>(Err(error.into()));
    }
    fn is_listening(&self) -> bool {
        self.reply.is_listening()
    }
}

/// Decodes a parked call's request, or answers InvalidArgument (naming `what`).
fn decode<Req: Message, Res: Message>(
    what: &str,
    payload: &[u8],
    reply: Responder,
) -> Option<(Req, Responder)> {
    match Req::parse_from_bytes(payload) {
        Ok(r) => Some((r, reply)),
        Err(e) => {
            reply.send::<Res>(Err(
                Error::invalid(format!("{what}: bad request: {e}")).into()
            ));
            None
        }
    }
}

pub fn wait_response(e: ExitInfo) -> WaitResponse {
    WaitResponse {
        exit_status: e.status,
        exited_at: MessageField::some(timestamp(e.at)),
        ..Default::default()
    }
}

pub fn wait_sandbox_response(e: ExitInfo) -> WaitSandboxResponse {
    WaitSandboxResponse {
        exit_status: e.status,
        exited_at: MessageField::some(timestamp(e.at)),
        ..Default::default()
    }
}

/// `Task.Wait`: parked on the process.
pub struct TaskWait {
    tm: Arc<TaskManager>,
}

impl TaskWait {
    pub fn new(tm: Arc<TaskManager>) -> Self {
        TaskWait { tm }
    }
}

impl ParkedMethod for TaskWait {
    fn call(&self, payload: &[u8], reply: Responder) {
        let Some((req, reply)) = decode::<WaitRequest, WaitResponse>("wait", payload, reply) else {
            return;
        };
        let waiter = Box::new(ExitReply {
            reply,
            response: wait_response,
        });
        // An unknown process is answered at once; otherwise the reply is parked.
        match self.tm.waitable(&req.id, &req.exec_id) {
            Ok(p) => p.wait(waiter),
            Err(e) => waiter.refused(e),
        }
    }
}

/// `WaitSandbox`: parked on the pod.
pub struct SandboxWait {
    sm: Arc<SandboxManager>,
}

impl SandboxWait {
    pub fn new(sm: Arc<SandboxManager>) -> Self {
        SandboxWait { sm }
    }
}

impl ParkedMethod for SandboxWait {
    fn call(&self, payload: &[u8], reply: Responder) {
        let Some((req, reply)) =
            decode::<WaitSandboxRequest, WaitSandboxResponse>("wait sandbox", payload, reply)
        else {
            return;
        };
        // An unknown sandbox is answered with the error (ExitReply::refused).
        let _ = self.sm.wait(
            &req.sandbox_id,
            Box::new(ExitReply {
                reply,
                response: wait_sandbox_response,
            }),
        );
    }
}
