//! The real pod host: [`super::PodHost`] on the node.

use std::path::{Path, PathBuf};

use protobuf::well_known_types::any::Any;

use crate::host::systemd::scope::PodScope;
use crate::pod::cgroup::PodCgroup;
use crate::pod::pause::{PauseConfig, PauseProcess};
use crate::pod::spec::{PodSpec, SysctlDefaults};
use crate::records::error::{Context, Error, Result};

use super::PodHost;

/// The real pod host.
pub struct LinuxPodHost {
    pub host_etc: PathBuf,
    pub unified: bool,
    /// [`SysctlDefaults::detect`], once when the daemon starts.
    pub sysctl_defaults: SysctlDefaults,
    /// The pod's runc (`BinaryName` of the runtime options, else `runc` from PATH).
    pub runc: String,
    /// Runs `runc --version` (through the daemon's reaper).
    pub spawner: crate::shim::reaper::Spawner,
    /// The node's SELinux ([`crate::host::selinux::Selinux::detect`], once when the daemon starts).
    pub selinux: crate::host::selinux::Selinux,
    /// How long stopping the pod's systemd scope may take: StopSandbox's bound, or the
    /// shorter one of `delete` ([`crate::host::systemd::scope::DELETE_STOP_TIMEOUT`]).
    pub scope_stop_timeout: std::time::Duration,
    /// The node's MCS reservations ([`crate::host::mcs::Registry::node`]).
    pub mcs: crate::host::mcs::Registry,
}

impl LinuxPodHost {
    /// Labels the pod files in `dir` with `label` (SELinux on only).
    fn label_files(&self, dir: &Path, label: &crate::host::selinux::Label) -> Result<()> {
        let files = [
            crate::pod::files::HOSTS,
            crate::pod::files::RESOLV_CONF,
            crate::pod::files::HOSTNAME,
        ]
        .map(|f| dir.join(f));
        self.selinux
            .relabel(&crate::host::selinux::RealXattrs, &files, label)
            .with_context(|| format!("SELinux: label the pod files {label}"))
    }
}

impl PodHost for LinuxPodHost {
    fn write_files(&self, dir: &Path, spec: &PodSpec, level: Option<&str>) -> Result<()> {
        crate::pod::files::PodFiles::write(dir, spec, &self.host_etc).map_err(Error::from)?;
        match self.selinux.pod_file_label(spec.selinux.as_ref(), level) {
            Some(label) => self.label_files(dir, &label),
            None => Ok(()),
        }
    }
    fn label_pod_files(
        &self,
        dir: &Path,
        mount_label: &str,
        pod_level: Option<&str>,
    ) -> Result<()> {
        match self.selinux.pod_files_label_of(mount_label, pod_level) {
            Some(label) => self.label_files(dir, &label),
            None => Ok(()),
        }
    }
    fn move_volume_labels(&self, volumes: &[PathBuf], from: &str, to: &str) -> Result<()> {
        for v in volumes {
            let moved =
                crate::host::relabel::move_tree(&crate::host::selinux::RealXattrs, v, from, to)
                    .with_context(|| format!("relabel {}", v.display()))?;
            if moved.files > 0 {
                log::info!(
                    "{}: {} files moved from {from} to {to}",
                    v.display(),
                    moved.files
                );
            }
        }
        Ok(())
    }
    fn remove_files(&self, dir: &Path) -> Result<()> {
        crate::pod::files::PodFiles::remove(dir)?;
        let _ = std::fs::remove_dir(dir);
        Ok(())
    }
    fn mount_shm(&self, path: &Path, spec: &PodSpec, level: Option<&str>) -> Result<()> {
        let context = self
            .selinux
            .pod_file_label(spec.selinux.as_ref(), level)
            .map(|l| crate::host::selinux::mount_option(&l));
        crate::pod::files::mount_shm(
            path,
            crate::pod::files::DEFAULT_SHM_SIZE,
            context.as_deref(),
        )
        .map_err(Error::from)
        // EINVAL here is most often a label the policy does not accept: say which.
        .with_context(|| match &context {
            Some(c) => format!("SELinux {c}"),
            None => "no SELinux label".into(),
        })
    }
    fn unmount_shm(&self, path: &Path) -> Result<()> {
        crate::pod::files::unmount_shm(path).map_err(Error::from)
    }
    fn check_netns(&self, path: &Path) -> Result<()> {
        crate::host::client_paths::open_netns(path).map(drop)
    }
    fn spawn_pause(&self, cfg: &PauseConfig) -> Result<PauseProcess> {
        if !self.selinux.labels_pause() {
            return crate::pod::pause::spawn(cfg);
        }
        // Fails closed: a pause that should be labelled and has no level is not started.
        let level = cfg.mcs_level.as_deref().ok_or_else(|| {
            Error::internal("pause: SELinux: no MCS level was reserved for the pod")
        })?;
        match self
            .selinux
            .pause_labels(cfg.selinux_options.as_ref(), level)
        {
            None => crate::pod::pause::spawn(cfg),
            Some((process, program)) => {
                let cfg = PauseConfig {
                    labels: Some(crate::pod::pause::PauseLabels {
                        process: process.to_string(),
                        program: program.to_string(),
                    }),
                    ..cfg.clone()
                };
                crate::pod::pause::spawn(&cfg)
            }
        }
    }
    fn join_cgroup(&self, cgroup: &Path, pid: i32) -> Result<PodCgroup> {
        if self.unified {
            // One hierarchy, at the place `unified` was detected: no mount table to read (it
            // is long on a node with many pods, and this is on RunPodSandbox's path).
            let roots = [PathBuf::from(crate::host::cgroups::CGROUP_ROOT)];
            return crate::pod::cgroup::join(&roots, true, cgroup, pid);
        }
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
        let roots = crate::pod::cgroup::hierarchies(&mountinfo, self.unified);
        crate::pod::cgroup::join(&roots, self.unified, cgroup, pid)
    }
    fn remove_cgroup(&self, id: &str, cg: &PodCgroup) {
        for e in crate::pod::cgroup::remove(cg, id) {
            log::warn!("{e}");
        }
    }
    fn join_scope(
        &self,
        scope: &PodScope,
        id: &str,
        pid: i32,
    ) -> std::result::Result<PodCgroup, crate::pod::scope::JoinFailed> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
        crate::pod::scope::join(
            &crate::host::systemd::manager::Endpoints::of_node(),
            &crate::pod::cgroup::hierarchies(&mountinfo, self.unified),
            self.unified,
            scope,
            id,
            pid,
        )
    }
    fn stop_scope(&self, cg: &PodCgroup) -> Result<()> {
        crate::pod::scope::stop(
            &crate::host::systemd::manager::Endpoints::of_node(),
            cg,
            self.scope_stop_timeout,
        )
    }
    fn kill(&self, pause: &PauseProcess) {
        if let Err(e) = pause.kill()
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            log::warn!("kill the pause process {}: {e}", pause.pid());
        }
    }
    fn metrics(&self, pod: &Path) -> Result<Any> {
        crate::host::cgroups::CgroupPaths::of_cgroup(pod, self.unified)?.metrics()
    }
    fn cgroup_path(&self, pid: i32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        crate::pod::sandbox_spec::cgroups_path_from_proc(&text, self.unified)
    }
    fn sysctl_defaults(&self) -> SysctlDefaults {
        self.sysctl_defaults
    }
    fn check_userns_runtime(&self) -> Result<()> {
        crate::host::runtime::check_userns_runc(&self.runc, &self.spawner)
    }
    fn reserve_mcs(
        &self,
        id: &str,
        options: Option<&crate::host::selinux::SelinuxOptions>,
    ) -> Result<Option<crate::host::mcs::Reservation>> {
        if !self.selinux.labels_pause() {
            return Ok(None);
        }
        let r = match options.map(|o| o.level.as_str()).filter(|l| !l.is_empty()) {
            Some(level) => self.mcs.reserve_given(id, level),
            None => self
                .mcs
                .reserve_random(id, crate::host::selinux::draw_categories),
        };
        r.map(Some).map_err(|e| Error::internal(e.to_string()))
    }
    fn release_mcs(&self, r: &crate::host::mcs::Reservation) {
        self.mcs.release(r);
    }
    fn own_for_userns(
        &self,
        bundle: &Path,
        files_dir: &Path,
        shm: Option<&Path>,
        (uid, gid): (u32, u32),
    ) -> Result<()> {
        crate::pod::files::own_for_userns(bundle, files_dir, shm, uid, gid).map_err(Error::from)
    }
}
