//! The names every part of the shim agrees on: the files of a bundle, the shim socket
//! directory, the listener fd, the runtime's name.
//!
//! A leaf module: `start` (cli), the daemon and `delete` (cleanup) all meet here instead of
//! importing each other. Names that containerd owns are marked so; the others are ours.

/// containerd's name for this runtime (`runtime_type`).
pub const RUNTIME_ID: &str = "io.containerd.rsandbox.v1";

/// The fd on which `start` hands the listening socket to the daemon.
pub const LISTENER_FD: i32 = 3;

/// Default directory of shim sockets (containerd's `<state dir>/s`, hard-coded in its shim
/// library up to 2.2; 2.3 may pass another one as `BootstrapParams.socket_dir`). The daemon
/// also puts its short-lived runc console sockets here.
pub const SOCKET_DIR: &str = "/run/containerd/s";

/// containerd: the OCI spec of a task bundle (absent from CRI sandbox bundles).
pub const CONFIG_FILE: &str = "config.json";

/// containerd: the fifo the shim writes its log lines into.
pub const LOG_FIFO: &str = "log";

/// containerd: the mount target of a task's root filesystem.
pub const ROOTFS_DIR: &str = "rootfs";

/// Scratch mount point of the idmapped lower layers of a user-namespaced container's rootfs
/// (`crate::host::idmap`), beside `rootfs`; unmounted by `delete` after a crash.
pub const IDMAPPED_SCRATCH: &str = ".rootfs-idmapped";

/// containerd: the bootstrap reply it saved after `start` (JSON with `address`).
pub const BOOTSTRAP_FILE: &str = "bootstrap.json";

/// The shim's socket address (`unix://...`), written by `start`. The name is the one the Go
/// shim library used for the same purpose (containerd 1.x read it; 2.x still migrates it).
pub const ADDRESS_FILE: &str = "address";

/// A symlink to the socket directory containerd 2.3 asked for, written by `start` when it is
/// not [`SOCKET_DIR`] (the Go shim library's name and form), so `delete` knows where our
/// sockets may live.
pub const SOCKET_DIR_LINK: &str = "socket-dir";

/// The daemon's pid, written by `start`.
pub const SHIM_PID_FILE: &str = "shim.pid";

/// The runtime options containerd passed to `start` (a protobuf Any).
pub const OPTIONS_FILE: &str = "rsandbox-options.pb";

/// A task bundle's record that tells `delete` how to clean up without the daemon.
pub const TASK_STATE_FILE: &str = "rsandbox-task.json";

/// The sandbox bundle's record that tells `delete` what to clean up.
pub const SANDBOX_STATE_FILE: &str = "rsandbox-sandbox.json";
