//! The OS side effects of the task manager, behind one narrow trait so that the Task service
//! can be tested without root: rootfs mounts, cgroup lookup and statistics, OOM watching and
//! signals to exec processes.

use std::path::Path;
use std::sync::Arc;

use protobuf::well_known_types::any::Any;

use crate::cgroups::{CgroupPaths, OomWatcher};
use crate::error::{Context, Result};
use crate::mount::{self, MountSpec};
use crate::reaper::Spawner;
use crate::runtime::{Runc, RuncConfig, Runtime};

/// OS operations the task manager needs besides the OCI runtime.
pub trait Host: Send + Sync {
    fn mount_rootfs(&self, mounts: &[MountSpec], rootfs: &Path) -> Result<()>;
    fn unmount_rootfs(&self, rootfs: &Path) -> Result<()>;
    /// Cgroups of a live process.
    fn cgroup_paths(&self, pid: i32) -> Result<CgroupPaths>;
    /// Statistics of those cgroups as a metrics Any.
    fn metrics(&self, paths: &CgroupPaths) -> Result<Any>;
    fn watch_oom(&self, id: &str, paths: &CgroupPaths) -> Result<()>;
    fn unwatch_oom(&self, id: &str);
    /// kill(2), for exec processes.
    fn signal(&self, pid: i32, signal: u32) -> Result<()>;
    /// The OCI runtime for a task with these settings.
    fn runtime(&self, config: &RuncConfig) -> Arc<dyn Runtime>;
}

/// The real host.
pub struct LinuxHost {
    pub spawner: Spawner,
    pub oom: OomWatcher,
    pub unified: bool,
    /// Directory for runc console sockets.
    pub socket_dir: std::path::PathBuf,
}

impl Host for LinuxHost {
    fn mount_rootfs(&self, mounts: &[MountSpec], rootfs: &Path) -> Result<()> {
        mount::mount_all(mounts, rootfs)
    }
    fn unmount_rootfs(&self, rootfs: &Path) -> Result<()> {
        mount::unmount(rootfs)
    }
    fn cgroup_paths(&self, pid: i32) -> Result<CgroupPaths> {
        CgroupPaths::of_pid(pid, self.unified)
    }
    fn metrics(&self, paths: &CgroupPaths) -> Result<Any> {
        paths.metrics()
    }
    fn watch_oom(&self, id: &str, paths: &CgroupPaths) -> Result<()> {
        self.oom.watch(id, paths)
    }
    fn unwatch_oom(&self, id: &str) {
        self.oom.unwatch(id)
    }
    fn signal(&self, pid: i32, signal: u32) -> Result<()> {
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| crate::error::Error::invalid(format!("signal {signal} is not valid")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
            .with_context(|| format!("kill pid {pid}"))
    }
    fn runtime(&self, config: &RuncConfig) -> Arc<dyn Runtime> {
        Arc::new(Runc::new(
            config.clone(),
            self.spawner.clone(),
            self.socket_dir.clone(),
        ))
    }
}
