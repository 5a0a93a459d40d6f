//! The OS side effects of the task manager, behind one narrow trait so that the Task service
//! can be tested without root: rootfs mounts, cgroup lookup and statistics, OOM watching and
//! signals to exec processes.

use std::path::Path;
use std::sync::Arc;

use protobuf::well_known_types::any::Any;

use crate::host::cgroups::{CgroupPaths, OomWatcher};
use crate::host::mount::{self, MountSpec};
use crate::host::runtime::{Runc, RuncConfig, Runtime};
use crate::records::error::Result;
use crate::shim::reaper::Spawner;

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
    /// Called when container `id`'s init has exited, before its TaskExit is published:
    /// reports an OOM kill the watch has not (see [`OomWatcher::check_at_exit`]).
    fn check_oom_at_exit(&self, id: &str, status: i32);
    /// kill(2) of one process; `signal` is any number the kernel takes (real-time ones too).
    fn signal(&self, pid: i32, signal: u32) -> Result<()>;
    /// Thaws a container's cgroup after a SIGKILL (see [`CgroupPaths::thaw`]).
    fn thaw(&self, paths: &CgroupPaths) -> Result<()>;
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
    fn check_oom_at_exit(&self, id: &str, status: i32) {
        self.oom.check_at_exit(id, status)
    }
    fn signal(&self, pid: i32, signal: u32) -> Result<()> {
        // A raw number: nix's Signal enum knows no real-time signals (SIGRTMIN+3, systemd's
        // stop signal, is 37). The task manager checked the range.
        let sig = i32::try_from(signal).map_err(|_| {
            crate::records::error::Error::invalid(format!("signal {signal} is not valid"))
        })?;
        // SAFETY: kill(2) takes two integers and touches no memory of ours.
        if unsafe { libc::kill(pid, sig) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Err(crate::records::error::Error::not_found(
                    "process already finished",
                ));
            }
            return Err(crate::records::error::Error::from(e).context(format!("kill pid {pid}")));
        }
        Ok(())
    }
    fn thaw(&self, paths: &CgroupPaths) -> Result<()> {
        paths.thaw()
    }
    fn runtime(&self, config: &RuncConfig) -> Arc<dyn Runtime> {
        Arc::new(Runc::new(
            config.clone(),
            self.spawner.clone(),
            self.socket_dir.clone(),
        ))
    }
}
