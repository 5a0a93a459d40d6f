//! CreateSandbox: the pod's spec decoded and checked, its SELinux level, its files and
//! /dev/shm, its network where the shim owns it, and the record `delete` reads; undone step by
//! step on a failure.

use crate::pod::spec::{IpcMode, NetworkMode, NetworkPlan};
use crate::records::error::{Context, Error, Result};
use crate::records::validate;
use crate::shim::timing::Steps;

use super::{
    CreateSandbox, Sandbox, SandboxManager, SandboxRecord, State, check_abs_dir, check_abs_path,
    save_record,
};

impl SandboxManager {
    pub fn create(&self, req: CreateSandbox) -> Result<()> {
        let id = req.id.clone();
        self.create_inner(req)
            .with_context(|| format!("create sandbox {id}"))
    }

    fn create_inner(&self, req: CreateSandbox) -> Result<()> {
        validate::id("sandbox id", &req.id)?;
        check_abs_dir("bundle", &req.bundle)?;
        if let Some(ns) = &req.netns {
            check_abs_path("netns_path", ns)?;
            // Opened without blocking and checked: a fifo or a regular file given as
            // netns_path is refused here, not waited on (or failed on late in StartSandbox).
            self.host.check_netns(ns).map_err(|e| {
                if e.kind() == crate::records::error::Kind::NotFound {
                    Error::invalid(format!("netns_path {} does not exist", ns.display()))
                } else {
                    Error::invalid(format!("netns_path: {}", e.message()))
                }
            })?;
        }
        let provider = self.network.clone().filter(|_| self.network_for_pods);
        let mut req = req;
        let plan = req
            .spec
            .network_plan(req.netns.is_some(), provider.is_some())
            .map_err(Error::invalid)?;
        match plan {
            // The pod is then on the host network for everything that follows: the pause
            // process, containerd's default net.* sysctls (never written into the host's
            // netns), and the member containers.
            NetworkPlan::Host => {
                req.spec.network = NetworkMode::Host;
                req.netns = None;
            }
            NetworkPlan::Given | NetworkPlan::ShimOwned => {}
        }
        let _op = crate::shim::blocking::lock(&self.op);
        if let Some(s) = self.lock().as_ref() {
            return Err(if s.id == req.id {
                Error::already_exists(format!("sandbox {} already exists", req.id))
            } else {
                Error::precondition(format!("this shim already runs sandbox {}", s.id))
            });
        }
        if req.spec.userns.is_some() {
            // Before anything is made: with a runc that cannot run them, the pod's containers
            // would fail one by one (or run without their volumes' idmapping).
            self.host.check_userns_runtime()?;
        }
        let files_dir = req.bundle.join("etc");
        let shm = (req.spec.ipc == IpcMode::Pod).then(|| req.bundle.join("shm"));
        let mut record = SandboxRecord {
            id: req.id.clone(),
            files_dir: files_dir.clone(),
            ..Default::default()
        };
        let mut netns = req.netns.clone();
        let mut steps = Steps::new(|| format!("create sandbox {}", req.id));
        // Each step records what it made, so `undo` takes down exactly that on failure.
        let r = (|| -> Result<()> {
            // The pod's SELinux level, reserved across the node's shims before anything is
            // labelled with it: the pod files and /dev/shm get it here (its `context=` is fixed
            // at the mount), the pause at StartSandbox, as containerd's podsandbox gives its
            // sandbox labels to all three.
            record.mcs = self
                .host
                .reserve_mcs(&req.id, req.spec.selinux.as_ref())
                .context("reserve the pod's SELinux categories")?;
            // The level and /dev/shm are in the record before the mount, for `delete` after a
            // shim killed meanwhile (a /dev/shm not mounted yet is nothing to unmount).
            record.shm = shm.clone();
            save_record(&req.bundle, &record)?;
            steps.step("reserve and record");
            let level = record.mcs.as_ref().map(|r| r.level.as_str());
            // /dev/shm first: the kernel checks its `context=` at the mount, so a level the
            // policy refuses fails here before any file is given it.
            if let Some(shm) = &shm {
                std::fs::create_dir_all(shm)
                    .with_context(|| format!("create {}", shm.display()))
                    .and_then(|_| self.host.mount_shm(shm, &req.spec, level))
                    .context("mount the pod's /dev/shm")?;
                steps.step("mount /dev/shm");
            }
            self.host
                .write_files(&files_dir, &req.spec, level)
                .context("write pod files")?;
            steps.step("pod files");
            if let Some(u) = &req.spec.userns {
                self.host
                    .own_for_userns(&req.bundle, &files_dir, shm.as_deref(), u.host_root())
                    .context("give the pod's files to the root of its user namespace")?;
                steps.step("userns ownership");
            }
            if plan == NetworkPlan::ShimOwned
                && let Some(provider) = &provider
            {
                // Without a CRI pod config there is no pod identity to pass (no K8S_POD_*).
                let conf = req
                    .spec
                    .cri_config
                    .then(|| req.spec.network_conf())
                    .transpose()
                    .context("set up the pod network")?;
                let net = provider
                    .setup(self.tm.namespace(), &req.id, conf.as_ref())
                    .context("set up the pod network")?;
                netns = Some(net.netns.clone());
                record.network = Some(net);
                steps.step("netns and CNI");
            }
            save_record(&req.bundle, &record)?;
            steps.step("save record");
            Ok(())
        })();
        if let Err(e) = r {
            self.undo(&record);
            return Err(e);
        }
        *self.lock() = Some(Sandbox {
            id: req.id,
            bundle: req.bundle,
            spec: req.spec,
            netns,
            state: State::Created,
            pid: 0,
            pause: None,
            created_at: None,
            exit: None,
            record,
            scope_stopped: false,
            scope_unconfirmed: false,
            pod_config: req.pod_config,
            started_spec: None,
            shm_unmounted: false,
            pause_lingers: false,
        });
        Ok(())
    }

    /// Takes down what `record` says was made: the network, /dev/shm, the pod files, the
    /// pod's MCS reservation.
    pub(super) fn undo(&self, record: &SandboxRecord) {
        self.teardown_network(record);
        self.undo_files(record);
        if let Some(r) = &record.mcs {
            self.host.release_mcs(r);
        }
    }

    /// CNI DEL and netns removal of a shim-owned network; idempotent.
    pub(super) fn teardown_network(&self, record: &SandboxRecord) {
        let Some(net) = &record.network else { return };
        if let Err(e) = crate::host::network::teardown(self.network.as_ref(), net) {
            log::warn!("sandbox {}: {e}", record.id);
        }
    }

    fn undo_files(&self, record: &SandboxRecord) {
        if let Some(shm) = &record.shm {
            let _ = self.host.unmount_shm(shm);
            let _ = std::fs::remove_dir(shm);
        }
        let _ = self.host.remove_files(&record.files_dir);
    }
}
