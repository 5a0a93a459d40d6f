//! The shim's one error type and the one place that maps it to ttrpc status codes.
//!
//! Every fallible operation returns [`Error`]: a [`Kind`] that decides the wire code, and a
//! message built from the steps that failed ("create task t1: mount rootfs: ..."), outermost
//! first. [`Kind::code`] is the only error-to-code map in the shim; it is exhaustive and
//! unit-tested, so a new kind cannot silently fall through to a wrong code.

use std::fmt;

use ttrpc::Code;

/// What kind of failure happened; decides the ttrpc status code containerd sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request itself is malformed (bad ID, bad path, bad spec).
    InvalidArgument,
    /// The named task, exec, or sandbox does not exist.
    NotFound,
    /// The task, exec, or sandbox already exists.
    AlreadyExists,
    /// The object is in the wrong state for the request (e.g. Start before Create).
    FailedPrecondition,
    /// The shim does not implement this operation (containerd downgrades on this code).
    Unimplemented,
    /// Anything else: OS errors, runc failures, bugs.
    Internal,
}

impl Kind {
    /// The ttrpc (gRPC) status code for this kind. The one map from our errors to codes.
    pub fn code(self) -> Code {
        match self {
            Kind::InvalidArgument => Code::INVALID_ARGUMENT,
            Kind::NotFound => Code::NOT_FOUND,
            Kind::AlreadyExists => Code::ALREADY_EXISTS,
            Kind::FailedPrecondition => Code::FAILED_PRECONDITION,
            Kind::Unimplemented => Code::UNIMPLEMENTED,
            Kind::Internal => Code::INTERNAL,
        }
    }
}

/// An error with its kind and a message that names the failing step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: Kind,
    message: String,
}

/// The shim's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Kind::NotFound, message)
    }
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(Kind::AlreadyExists, message)
    }
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(Kind::FailedPrecondition, message)
    }
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Kind::Unimplemented, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Kind::Internal, message)
    }

    /// The kind, which decides the wire code.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The full message, outermost step first.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with the step that was being done; the kind is kept.
    pub fn context(self, step: impl fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{step}: {}", self.message),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::internal(e.to_string())
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::internal(e.desc().to_string())
    }
}

impl From<protobuf::Error> for Error {
    fn from(e: protobuf::Error) -> Self {
        Error::internal(e.to_string())
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.kind.code(), e.message))
    }
}

/// Adds the failing step to any error that converts into [`Error`].
pub trait Context<T> {
    /// On error, prefix the message with `step` (evaluated only on error).
    fn with_context<D: fmt::Display>(self, step: impl FnOnce() -> D) -> Result<T>;
    /// On error, prefix the message with a fixed `step`.
    fn context(self, step: &str) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn with_context<D: fmt::Display>(self, step: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(step()))
    }
    fn context(self, step: &str) -> Result<T> {
        self.map_err(|e| e.into().context(step))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_code() {
        let cases = [
            (Kind::InvalidArgument, Code::INVALID_ARGUMENT),
            (Kind::NotFound, Code::NOT_FOUND),
            (Kind::AlreadyExists, Code::ALREADY_EXISTS),
            (Kind::FailedPrecondition, Code::FAILED_PRECONDITION),
            (Kind::Unimplemented, Code::UNIMPLEMENTED),
            (Kind::Internal, Code::INTERNAL),
        ];
        for (kind, code) in cases {
            assert_eq!(kind.code(), code, "{kind:?}");
        }
    }

    #[test]
    fn ttrpc_status_carries_code_and_message() {
        let err = Error::not_found("task t1").context("delete");
        match ttrpc::Error::from(err) {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), Code::NOT_FOUND);
                assert_eq!(s.message(), "delete: task t1");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn context_keeps_the_kind_and_prefixes_steps() {
        let r: Result<()> = Err(Error::invalid("bad id \"a/b\""));
        let e = r.context("create task").unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidArgument);
        assert_eq!(e.message(), "create task: bad id \"a/b\"");
    }

    #[test]
    fn os_errors_are_internal_with_their_text() {
        let r: std::result::Result<(), std::io::Error> =
            Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        let e = r.with_context(|| "open /x").unwrap_err();
        assert_eq!(e.kind(), Kind::Internal);
        assert!(e.message().starts_with("open /x: "), "{}", e.message());
        let n: std::result::Result<(), nix::Error> = Err(nix::Error::EPERM);
        assert_eq!(
            n.context("mount").unwrap_err().message(),
            "mount: Operation not permitted"
        );
    }
}
