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

/// The kind of an OS error: what the request named is missing (ENOENT: NotFound) or already
/// there (EEXIST: AlreadyExists); anything else is the shim's or the node's problem (Internal).
/// Module errors that wrap an OS error (pod files, netns) use the same rule.
pub fn os_error_kind(errno: Option<i32>) -> Kind {
    match errno {
        Some(libc::ENOENT) => Kind::NotFound,
        Some(libc::EEXIST) => Kind::AlreadyExists,
        _ => Kind::Internal,
    }
}

/// The text keeps the errno (`... (os error 2)`).
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(os_error_kind(e.raw_os_error()), e.to_string())
    }
}

/// The text keeps the errno's name (`ENOENT: No such file or directory`).
impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::new(os_error_kind(Some(e as i32)), e.to_string())
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
    fn os_errors_keep_their_errno_and_map_by_it() {
        let table = [
            (libc::ENOENT, Kind::NotFound),
            (libc::EEXIST, Kind::AlreadyExists),
            (libc::EPERM, Kind::Internal),
            (libc::EACCES, Kind::Internal),
            (libc::EINVAL, Kind::Internal),
            (libc::ENOSPC, Kind::Internal),
        ];
        for (errno, kind) in table {
            let io: Error = std::io::Error::from_raw_os_error(errno).into();
            assert_eq!(io.kind(), kind, "io errno {errno}");
            assert!(
                io.message().contains(&format!("(os error {errno})")),
                "{}",
                io.message()
            );
            let n: Error = nix::Error::from_raw(errno).into();
            assert_eq!(n.kind(), kind, "nix errno {errno}");
        }
        assert_eq!(os_error_kind(None), Kind::Internal);
        let r: std::result::Result<(), std::io::Error> =
            Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        let e = r.with_context(|| "open /x").unwrap_err();
        assert!(e.message().starts_with("open /x: "), "{}", e.message());
        let n: std::result::Result<(), nix::Error> = Err(nix::Error::EPERM);
        assert_eq!(
            n.context("mount").unwrap_err().message(),
            "mount: EPERM: Operation not permitted"
        );
    }
}

// --- CNI errors -------------------------------------------------------------------------------

/// A CNI failure keeps its kind to the wire, and its text (errno, plugin message) in the message.
impl From<crate::cni::CniError> for Error {
    fn from(e: crate::cni::CniError) -> Self {
        Error::new(cni_kind(&e), e.to_string())
    }
}

/// The kind of a CNI failure:
/// - the node's CNI setup is unusable (no or bad config, a plugin missing or not executable, a
///   plugin rejecting its config: CNI codes 1, 2, 7, and 50/51 "plugin not available"):
///   FailedPrecondition, as retrying cannot help until the node is fixed;
/// - a value of the request (the container ID, pod metadata in `CNI_ARGS`) that CNI cannot
///   carry: InvalidArgument;
/// - anything else (a plugin's own failure, a crash, output that is not a result, cache I/O, a
///   timeout, no time left to run it): Internal.
///
/// Never NotFound or Unavailable: containerd treats NotFound from ShutdownSandbox, and NotFound
/// or Unavailable from StopSandbox, as "already gone", and the netns and IP lease would leak. No
/// DeadlineExceeded for a timeout either: containerd turns that code into its own
/// `context.DeadlineExceeded`, as if its request had timed out; the message says "timed out".
fn cni_kind(e: &crate::cni::CniError) -> Kind {
    use crate::cni::{CniError, ExecError};
    match e {
        CniError::NoConfig { .. }
        | CniError::ReadConfDir { .. }
        | CniError::NoValidConfig { .. }
        | CniError::InvalidConfig { .. }
        | CniError::InvalidPluginType(_)
        | CniError::PluginNotFound { .. }
        | CniError::CheckNotSupported(_)
        | CniError::NoCachedResult { .. } => Kind::FailedPrecondition,
        CniError::InvalidName { what, .. } if *what == "container ID" => Kind::InvalidArgument,
        // the network name and the interface name come from the node's config
        CniError::InvalidName { .. } => Kind::FailedPrecondition,
        CniError::InvalidArg { .. } => Kind::InvalidArgument,
        CniError::Plugin { code, .. } => match code {
            1 | 2 | 7 | 50 | 51 => Kind::FailedPrecondition,
            _ => Kind::Internal,
        },
        CniError::Exec {
            source: ExecError::Spawn { source, .. },
            ..
        } if matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC)
        ) =>
        {
            Kind::FailedPrecondition
        }
        CniError::Exec { .. }
        | CniError::InvalidResult { .. }
        | CniError::Cache { .. }
        | CniError::NoTimeLeft { .. } => Kind::Internal,
    }
}

#[cfg(test)]
mod cni_tests {
    use std::io;
    use std::time::Duration;

    use super::*;
    use crate::cni::{CniError, Command, ExecError, ResultError};

    fn plugin(code: u64) -> CniError {
        CniError::Plugin {
            plugin: "bridge".into(),
            command: Command::Add,
            code,
            msg: "failed to set bridge addr".into(),
            details: Some("could not add IP address to \"cni0\": permission denied".into()),
        }
    }

    fn exec(source: ExecError) -> CniError {
        CniError::Exec {
            plugin: "bridge".into(),
            command: Command::Add,
            source,
        }
    }

    fn spawn(errno: i32) -> CniError {
        exec(ExecError::Spawn {
            path: "/opt/cni/bin/bridge".into(),
            source: io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn cni_errors_map_to_their_kinds() {
        use Kind::{FailedPrecondition as Pre, Internal, InvalidArgument as Inv};
        let cases: Vec<(CniError, Kind)> = vec![
            (
                CniError::NoConfig {
                    dir: "/etc/cni/net.d".into(),
                },
                Pre,
            ),
            (
                CniError::ReadConfDir {
                    dir: "/etc/cni/net.d".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                },
                Pre,
            ),
            (
                CniError::NoValidConfig {
                    dir: "/etc/cni/net.d".into(),
                    errors: vec!["10-a.conflist: no cniVersion".into()],
                },
                Pre,
            ),
            (
                CniError::InvalidConfig {
                    source_name: "10-a.conflist".into(),
                    reason: "plugin list is empty".into(),
                },
                Pre,
            ),
            (CniError::InvalidPluginType("../x".into()), Pre),
            (
                CniError::PluginNotFound {
                    plugin: "bridge".into(),
                    dirs: vec!["/opt/cni/bin".into()],
                },
                Pre,
            ),
            (CniError::CheckNotSupported("0.3.1".into()), Pre),
            (
                CniError::NoCachedResult {
                    network: "n".into(),
                    container_id: "c".into(),
                    ifname: "eth0".into(),
                },
                Pre,
            ),
            (
                crate::cni::validate_name("container ID", "a/b").unwrap_err(),
                Inv,
            ),
            (
                crate::cni::validate_name("network name", "a/b").unwrap_err(),
                Pre,
            ),
            (crate::cni::validate_ifname("a/b").unwrap_err(), Pre),
            (
                crate::cni::format_cni_args(&[("K8S_POD_NAME".into(), "a;b".into())]).unwrap_err(),
                Inv,
            ),
            (plugin(1), Pre),
            (plugin(2), Pre),
            (plugin(7), Pre),
            (plugin(50), Pre),
            (plugin(51), Pre),
            (plugin(3), Internal),
            (plugin(5), Internal),
            (plugin(11), Internal),
            (plugin(999), Internal),
            (spawn(libc::ENOENT), Pre),
            (spawn(libc::EACCES), Pre),
            (spawn(libc::ENOEXEC), Pre),
            (spawn(libc::ENOMEM), Internal),
            (
                exec(ExecError::Io {
                    path: "/opt/cni/bin/bridge".into(),
                    source: io::Error::from_raw_os_error(libc::EPIPE),
                }),
                Internal,
            ),
            (
                exec(ExecError::Failed {
                    path: "/opt/cni/bin/bridge".into(),
                    code: Some(1),
                    signal: None,
                    stdout: Vec::new(),
                    stderr: b"panic: runtime error".to_vec(),
                }),
                Internal,
            ),
            (
                exec(ExecError::Timeout {
                    path: "/opt/cni/bin/bridge".into(),
                    timeout: Duration::from_secs(60),
                }),
                Internal,
            ),
            (
                CniError::InvalidResult {
                    plugin: "bridge".into(),
                    command: Command::Add,
                    source: ResultError::Empty,
                },
                Internal,
            ),
            (
                CniError::Cache {
                    path: "/var/lib/cni/results/x".into(),
                    reason: "No space left on device (os error 28)".into(),
                },
                Internal,
            ),
        ];
        for (cni, kind) in cases {
            let text = cni.to_string();
            let e = Error::from(cni);
            assert_eq!(e.kind(), kind, "{text}");
            assert_eq!(e.message(), text, "the CNI text is kept whole");
        }
    }

    #[test]
    fn the_errno_and_the_plugin_message_survive() {
        let e = Error::from(spawn(libc::EACCES)).context("CNI ADD");
        assert!(e.message().starts_with("CNI ADD: "), "{e}");
        assert!(e.message().contains("Permission denied"), "{e}");
        let e = Error::from(plugin(7));
        assert!(e.message().contains("CNI error code 7"), "{e}");
        assert!(e.message().contains("failed to set bridge addr"), "{e}");
        assert!(e.message().contains("permission denied"), "{e}");
    }
}
