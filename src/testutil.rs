//! Helpers shared by the unit tests of the ttrpc services.

use std::sync::Arc;

use ttrpc::{Code, TtrpcContext};

/// A request context for calling a service trait directly (no connection behind it).
pub fn ctx() -> TtrpcContext {
    TtrpcContext {
        fd: -1,
        cancel_rx: crossbeam_channel::never(),
        mh: Default::default(),
        res_tx: std::sync::mpsc::channel().0,
        metadata: Default::default(),
        timeout_nano: 0,
        conn_ctx: Arc::new(Default::default()),
    }
}

/// The status code of a failed call (panics on success).
pub fn code<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> Code {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => s.code(),
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// The status message of a failed call (panics on success).
pub fn message<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> String {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => s.message().to_string(),
        other => panic!("expected a status error, got {other:?}"),
    }
}
