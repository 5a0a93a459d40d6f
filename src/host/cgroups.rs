//! Container cgroups: where they are, their statistics (cgroup v1 and v2), and OOM events.
//!
//! Paths come from `/proc/<pid>/cgroup` of the container's init (so any cgroupsPath form
//! works) joined with the hierarchy mount points of `/proc/self/mountinfo`. Statistics are read
//! straight from cgroupfs into containerd's `io.containerd.cgroups.v1.Metrics` or `...v2.Metrics`.
//! One lazily started thread watches for OOM kills: a `memory.oom_control` eventfd per
//! container on v1, inotify on `memory.events` on v2.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use protobuf::MessageField;

use crate::records::error::{Context, Error, Result};
use crate::shim::sync::Lock;

/// Where the cgroup hierarchies are mounted (the unified one itself on a v2-only host).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Whether the host runs the unified (v2 only) hierarchy at /sys/fs/cgroup.
pub fn is_unified(root: &Path) -> bool {
    nix::sys::statfs::statfs(root)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// A cgroup hierarchy mounted on this host, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// cgroup2 (the unified hierarchy) rather than a v1 hierarchy.
    pub unified: bool,
    /// v1 controllers of the hierarchy (`name=` prefixes stripped); empty for cgroup2.
    pub controllers: Vec<String>,
    pub mountpoint: PathBuf,
}

/// The cgroup and cgroup2 mounts listed in a mountinfo document, in order.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // id parent maj:min root mountpoint opts [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let rfields: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || rfields.len() < 3 {
            continue;
        }
        let unified = match rfields[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let controllers = if unified {
            Vec::new()
        } else {
            rfields[2]
                .split(',')
                .map(|s| s.strip_prefix("name=").unwrap_or(s).to_string())
                .collect()
        };
        out.push(CgroupMount {
            unified,
            controllers,
            mountpoint: PathBuf::from(fields[4]),
        });
    }
    out
}

/// Whether cgroup directory `dir` is named as the own cgroup of pod `id`'s pause: the second
/// test, after the record's `created`, of a pause cgroup teardown removes (a container's are
/// decided at create: [`crate::host::cgroup_ownership`]; a name alone proves nothing: a task may be
/// named `system.slice`). Its last component is the ID (cgroupfs:
/// ctr's default `/<namespace>/<id>`, CRI's `<cgroup_parent>/<id>`, the pause's
/// `<cgroup_parent>/<pod id>`) or `<prefix>-<id>.scope` (systemd: CRI's
/// `<slice>:cri-containerd:<id>`, which runc makes `cri-containerd-<id>.scope`). Anything else
/// is shared with others: a cgroup a spec named (`/system.slice`), a pod cgroup, a parent made
/// for want of one. A path through `..` never passes.
pub fn is_own_cgroup(dir: &Path, id: &str) -> bool {
    use std::path::Component;
    if id.is_empty()
        || !dir
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return false;
    }
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name == id
        || name
            .strip_suffix(".scope")
            .and_then(|unit| unit.strip_suffix(id))
            .is_some_and(|prefix| prefix.ends_with('-'))
}

/// The cgroup directories of one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// v1: controller name → directory.
    pub v1: BTreeMap<String, PathBuf>,
    /// v2 (unified) directory, when the host is v2-only.
    pub v2: Option<PathBuf>,
}

impl CgroupPaths {
    /// Reads where `pid` lives. `unified` says which layout to use for statistics.
    pub fn of_pid(pid: i32, unified: bool) -> Result<CgroupPaths> {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("read /proc/{pid}/cgroup"))?;
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
        Ok(Self::parse(&cgroup, &mountinfo, unified))
    }

    /// The directories of cgroup `cgroup` (absolute in the cgroup tree, `/kubepods/pod1`) in
    /// every hierarchy mounted here, as if a process lived there.
    pub fn of_cgroup(cgroup: &Path, unified: bool) -> Result<CgroupPaths> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
        Ok(Self::of_cgroup_in(cgroup, &mountinfo, unified))
    }

    /// Pure part of [`of_cgroup`]: one `/proc/<pid>/cgroup` line per mounted hierarchy.
    pub fn of_cgroup_in(cgroup: &Path, mountinfo: &str, unified: bool) -> CgroupPaths {
        let rel = cgroup.strip_prefix("/").unwrap_or(cgroup).display();
        let lines: Vec<String> = cgroup_mounts(mountinfo)
            .iter()
            .map(|m| format!("1:{}:/{rel}", m.controllers.join(",")))
            .collect();
        Self::parse(&lines.join("\n"), mountinfo, unified)
    }

    /// Pure part of [`of_pid`]: joins `/proc/<pid>/cgroup` lines with cgroup mount points.
    pub fn parse(cgroup: &str, mountinfo: &str, unified: bool) -> CgroupPaths {
        let mounts = cgroup_mounts(mountinfo);
        let v2_mount = mounts
            .iter()
            .find(|m| m.unified)
            .map(|m| m.mountpoint.clone());
        let v1_mounts: Vec<(Vec<String>, PathBuf)> = mounts
            .into_iter()
            .filter(|m| !m.unified)
            .map(|m| (m.controllers, m.mountpoint))
            .collect();
        let mut paths = CgroupPaths::default();
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(rel)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = rel.trim_start_matches('/');
            if ctrls.is_empty() {
                if unified {
                    paths.v2 = v2_mount.as_ref().map(|m| m.join(rel));
                }
                continue;
            }
            for ctrl in ctrls.split(',') {
                let ctrl = ctrl.strip_prefix("name=").unwrap_or(ctrl);
                if let Some((_, mp)) = v1_mounts.iter().find(|(c, _)| c.iter().any(|x| x == ctrl)) {
                    paths.v1.insert(ctrl.to_string(), mp.join(rel));
                }
            }
        }
        paths
    }

    /// Statistics in the format containerd expects for this host.
    pub fn metrics(&self) -> Result<protobuf::well_known_types::any::Any> {
        let any = match &self.v2 {
            Some(dir) => protobuf::well_known_types::any::Any {
                type_url: "io.containerd.cgroups.v2.Metrics".into(),
                value: protobuf::Message::write_to_bytes(&v2_metrics(dir))
                    .context("encode metrics")?,
                ..Default::default()
            },
            None => protobuf::well_known_types::any::Any {
                type_url: "io.containerd.cgroups.v1.Metrics".into(),
                value: protobuf::Message::write_to_bytes(&self.v1_metrics())
                    .context("encode metrics")?,
                ..Default::default()
            },
        };
        Ok(any)
    }

    /// Thaws the cgroup: v1 `freezer.state = THAWED`, v2 `cgroup.freeze = 0`. After a
    /// SIGKILL to a paused container, as `runc kill` does: a v1 freezer holds the signal until
    /// the cgroup thaws (v2 delivers SIGKILL to frozen tasks; thawing is harmless there).
    /// A cgroup already gone (the container is gone with it) is not an error.
    pub fn thaw(&self) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let (file, value) = match (&self.v2, self.v1.get("freezer")) {
            (Some(dir), _) => (dir.join("cgroup.freeze"), "0"),
            (None, Some(dir)) => (dir.join("freezer.state"), "THAWED"),
            (None, None) => return Ok(()),
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&file)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(value.as_bytes())
                    .with_context(|| format!("write {value} to {}", file.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from(e).context(format!("open {}", file.display()))),
        }
    }

    fn v1_metrics(&self) -> v1::Metrics {
        let mut m = v1::Metrics::new();
        if let Some(dir) = self.v1.get("pids") {
            m.pids = MessageField::some(v1::PidsStat {
                current: read_u64(&dir.join("pids.current")).unwrap_or(0),
                limit: read_u64(&dir.join("pids.max")).unwrap_or(0),
                ..Default::default()
            });
        }
        if let Some(dir) = self.v1.get("cpuacct") {
            let stat = read_kv(&dir.join("cpuacct.stat"));
            // cpuacct.stat is in USER_HZ ticks; containerd reports nanoseconds.
            let tick_ns = 1_000_000_000 / clock_ticks();
            let usage = v1::CPUUsage {
                total: read_u64(&dir.join("cpuacct.usage")).unwrap_or(0),
                user: stat.get("user").copied().unwrap_or(0) * tick_ns,
                kernel: stat.get("system").copied().unwrap_or(0) * tick_ns,
                per_cpu: std::fs::read_to_string(dir.join("cpuacct.usage_percpu"))
                    .map(|s| {
                        s.split_whitespace()
                            .filter_map(|x| x.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default(),
                ..Default::default()
            };
            let mut cpu = v1::CPUStat {
                usage: MessageField::some(usage),
                ..Default::default()
            };
            if let Some(cdir) = self.v1.get("cpu") {
                let t = read_kv(&cdir.join("cpu.stat"));
                cpu.throttling = MessageField::some(v1::Throttle {
                    periods: t.get("nr_periods").copied().unwrap_or(0),
                    throttled_periods: t.get("nr_throttled").copied().unwrap_or(0),
                    throttled_time: t.get("throttled_time").copied().unwrap_or(0),
                    ..Default::default()
                });
            }
            m.cpu = MessageField::some(cpu);
        }
        if let Some(dir) = self.v1.get("memory") {
            let s = read_kv(&dir.join("memory.stat"));
            let g = |k: &str| s.get(k).copied().unwrap_or(0);
            let entry = |prefix: &str| v1::MemoryEntry {
                usage: read_u64(&dir.join(format!("{prefix}usage_in_bytes"))).unwrap_or(0),
                max: read_u64(&dir.join(format!("{prefix}max_usage_in_bytes"))).unwrap_or(0),
                limit: read_u64(&dir.join(format!("{prefix}limit_in_bytes"))).unwrap_or(0),
                failcnt: read_u64(&dir.join(format!("{prefix}failcnt"))).unwrap_or(0),
                ..Default::default()
            };
            m.memory = MessageField::some(v1::MemoryStat {
                cache: g("cache"),
                rss: g("rss"),
                rss_huge: g("rss_huge"),
                mapped_file: g("mapped_file"),
                dirty: g("dirty"),
                writeback: g("writeback"),
                pg_pg_in: g("pgpgin"),
                pg_pg_out: g("pgpgout"),
                pg_fault: g("pgfault"),
                pg_maj_fault: g("pgmajfault"),
                inactive_anon: g("inactive_anon"),
                active_anon: g("active_anon"),
                inactive_file: g("inactive_file"),
                active_file: g("active_file"),
                unevictable: g("unevictable"),
                hierarchical_memory_limit: g("hierarchical_memory_limit"),
                hierarchical_swap_limit: g("hierarchical_memsw_limit"),
                total_cache: g("total_cache"),
                total_rss: g("total_rss"),
                total_rss_huge: g("total_rss_huge"),
                total_mapped_file: g("total_mapped_file"),
                total_dirty: g("total_dirty"),
                total_writeback: g("total_writeback"),
                total_pg_pg_in: g("total_pgpgin"),
                total_pg_pg_out: g("total_pgpgout"),
                total_pg_fault: g("total_pgfault"),
                total_pg_maj_fault: g("total_pgmajfault"),
                total_inactive_anon: g("total_inactive_anon"),
                total_active_anon: g("total_active_anon"),
                total_inactive_file: g("total_inactive_file"),
                total_active_file: g("total_active_file"),
                total_unevictable: g("total_unevictable"),
                usage: MessageField::some(entry("memory.")),
                swap: MessageField::some(entry("memory.memsw.")),
                kernel: MessageField::some(entry("memory.kmem.")),
                kernel_tcp: MessageField::some(entry("memory.kmem.tcp.")),
                ..Default::default()
            });
            let oom = read_kv(&dir.join("memory.oom_control"));
            m.memory_oom_control = MessageField::some(v1::MemoryOomControl {
                oom_kill_disable: oom.get("oom_kill_disable").copied().unwrap_or(0),
                under_oom: oom.get("under_oom").copied().unwrap_or(0),
                oom_kill: oom.get("oom_kill").copied().unwrap_or(0),
                ..Default::default()
            });
        }
        m
    }
}

fn v2_metrics(dir: &Path) -> v2::Metrics {
    let mut m = v2::Metrics::new();
    m.pids = MessageField::some(v2::PidsStat {
        current: read_u64(&dir.join("pids.current")).unwrap_or(0),
        limit: read_u64(&dir.join("pids.max")).unwrap_or(0),
        ..Default::default()
    });
    let c = read_kv(&dir.join("cpu.stat"));
    let g = |k: &str| c.get(k).copied().unwrap_or(0);
    m.cpu = MessageField::some(v2::CPUStat {
        usage_usec: g("usage_usec"),
        user_usec: g("user_usec"),
        system_usec: g("system_usec"),
        nr_periods: g("nr_periods"),
        nr_throttled: g("nr_throttled"),
        throttled_usec: g("throttled_usec"),
        ..Default::default()
    });
    let s = read_kv(&dir.join("memory.stat"));
    let g = |k: &str| s.get(k).copied().unwrap_or(0);
    m.memory = MessageField::some(v2::MemoryStat {
        anon: g("anon"),
        file: g("file"),
        kernel_stack: g("kernel_stack"),
        slab: g("slab"),
        sock: g("sock"),
        shmem: g("shmem"),
        file_mapped: g("file_mapped"),
        file_dirty: g("file_dirty"),
        file_writeback: g("file_writeback"),
        inactive_anon: g("inactive_anon"),
        active_anon: g("active_anon"),
        inactive_file: g("inactive_file"),
        active_file: g("active_file"),
        unevictable: g("unevictable"),
        pgfault: g("pgfault"),
        pgmajfault: g("pgmajfault"),
        usage: read_u64(&dir.join("memory.current")).unwrap_or(0),
        usage_limit: read_u64(&dir.join("memory.max")).unwrap_or(0),
        swap_usage: read_u64(&dir.join("memory.swap.current")).unwrap_or(0),
        swap_limit: read_u64(&dir.join("memory.swap.max")).unwrap_or(0),
        max_usage: read_u64(&dir.join("memory.peak")).unwrap_or(0),
        ..Default::default()
    });
    let e = read_kv(&dir.join("memory.events"));
    let g = |k: &str| e.get(k).copied().unwrap_or(0);
    m.memory_events = MessageField::some(v2::MemoryEvents {
        low: g("low"),
        high: g("high"),
        max: g("max"),
        oom: g("oom"),
        oom_kill: g("oom_kill"),
        ..Default::default()
    });
    m
}

/// A number file; "max" reads as 0 (no limit), as containerd's cgroups library does.
fn read_u64(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    if s == "max" { Some(0) } else { s.parse().ok() }
}

/// A "key value" per line file (memory.stat, cpu.stat, ...).
fn read_kv(path: &Path) -> HashMap<String, u64> {
    std::fs::read_to_string(path)
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Called with the container ID when the kernel OOM-killed something in its cgroup.
pub type OomCallback = Arc<dyn Fn(&str) + Send + Sync>;

struct Watch {
    id: String,
    fd: OwnedFd,
    /// v2: the memory.events file whose oom_kill count is compared.
    events_file: Option<PathBuf>,
    /// v1: the cgroup dir, to tell an OOM from the cgroup's removal.
    dir: PathBuf,
    last_oom_kill: u64,
    /// v2: the parent's memory.events (its oom_kill counts the whole subtree), for a cgroup
    /// removed before its own count could be read at its init's exit (see [`Ledger`]).
    parent_events: Option<PathBuf>,
}

/// The OOM kills below one parent cgroup (the pod's slice or cgroup), for the one judgement
/// that cannot read a container's own count: its scope removed (systemd stops the scope of an
/// exited process and removes its cgroup, often before its init's exit is checked) when its
/// init has exited. The parent's count is hierarchical: its rise since `base` holds the kills
/// already taken for one of its containers (`taken`), the kills a sibling's own count still
/// shows unreported, and, only after both are subtracted, kills of cgroups that are gone.
#[derive(Debug, Default, Clone, Copy)]
struct Ledger {
    /// The parent's count when its first container was watched.
    base: u64,
    /// Kills below it taken for one of its containers since (own counts, or this judgement).
    taken: u64,
}

/// Watches containers' memory cgroups for OOM kills (one thread for all).
pub struct OomWatcher {
    inner: Mutex<Option<Arc<WatcherThread>>>,
    callback: OomCallback,
}

struct WatcherThread {
    watches: Mutex<Vec<Watch>>,
    /// Per parent cgroup's memory.events (locked after `watches`).
    ledgers: Mutex<HashMap<PathBuf, Ledger>>,
    wake: OwnedFd,
    /// Held from the judgement to the TaskOOM's publication, by the watcher and by the exit
    /// check alike: when the watcher has taken a kill, the reaper's check waits until its
    /// TaskOOM is out, so the TaskExit published after the check always comes after it.
    report: Mutex<()>,
}

impl OomWatcher {
    pub fn new(callback: OomCallback) -> Self {
        OomWatcher {
            inner: Mutex::new(None),
            callback,
        }
    }

    fn thread(&self) -> Result<Arc<WatcherThread>> {
        let mut inner = self.inner.locked();
        if let Some(t) = inner.as_ref() {
            return Ok(t.clone());
        }
        let (rx, tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .context("oom watcher pipe")?;
        let t = Arc::new(WatcherThread {
            watches: Mutex::new(Vec::new()),
            ledgers: Mutex::default(),
            wake: tx,
            report: Mutex::new(()),
        });
        let t2 = t.clone();
        let cb = self.callback.clone();
        std::thread::Builder::new()
            .name("oom".into())
            .stack_size(128 * 1024)
            .spawn(move || t2.run(rx, cb))
            .context("start oom watcher")?;
        *inner = Some(t.clone());
        Ok(t)
    }

    /// Starts watching container `id`, whose cgroups are `paths`.
    pub fn watch(&self, id: &str, paths: &CgroupPaths) -> Result<()> {
        let watch = if let Some(dir) = &paths.v2 {
            let events = dir.join("memory.events");
            let ino = nix::sys::inotify::Inotify::init(
                nix::sys::inotify::InitFlags::IN_CLOEXEC
                    | nix::sys::inotify::InitFlags::IN_NONBLOCK,
            )
            .context("inotify_init")?;
            ino.add_watch(&events, nix::sys::inotify::AddWatchFlags::IN_MODIFY)
                .with_context(|| format!("watch {}", events.display()))?;
            let last = read_kv(&events).get("oom_kill").copied().unwrap_or(0);
            let parent_events = dir.parent().map(|p| p.join("memory.events"));
            Watch {
                id: id.into(),
                fd: OwnedFd::from(ino),
                events_file: Some(events),
                dir: dir.clone(),
                last_oom_kill: last,
                parent_events,
            }
        } else if let Some(dir) = paths.v1.get("memory") {
            let efd = nix::sys::eventfd::EventFd::from_value_and_flags(
                0,
                nix::sys::eventfd::EfdFlags::EFD_CLOEXEC
                    | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
            )
            .context("eventfd")?;
            let oom_control = File::open(dir.join("memory.oom_control"))
                .with_context(|| format!("open {}/memory.oom_control", dir.display()))?;
            let line = format!("{} {}", efd.as_fd().as_raw_fd(), oom_control.as_raw_fd());
            std::fs::write(dir.join("cgroup.event_control"), line)
                .with_context(|| format!("register oom event for {}", dir.display()))?;
            Watch {
                id: id.into(),
                fd: OwnedFd::from(efd),
                events_file: None,
                dir: dir.clone(),
                last_oom_kill: 0,
                parent_events: None,
            }
        } else {
            return Ok(()); // no memory controller: nothing to watch
        };
        let t = self.thread()?;
        t.add(watch);
        let _ = nix::unistd::write(&t.wake, b"w");
        Ok(())
    }

    /// Looks once more for an OOM kill of container `id` when its init has exited with
    /// `status` (128 + a signal when killed), and reports one not yet reported (before the
    /// caller publishes the exit). Events alone miss kills: systemd stops an emptied scope and
    /// removes its cgroup at once, and the kernel drops the file's pending (rate-limited)
    /// notification with it; the count itself is raised before the victim gets its SIGKILL
    /// (mm/oom_kill.c: "task reaper must see this"), so at the exit it is there to read in
    /// the container's own cgroup. Once that is gone (an open descriptor of it answers ENODEV
    /// too, v1 and v2: kernfs), the parent's count decides, only for an init the kernel's
    /// SIGKILL ended, and only for a kill no sibling's own count accounts for (see [`Ledger`]):
    /// a sibling's kill still in flight is never this container's. v2 only: v1's eventfd
    /// fires before the kill.
    pub fn check_at_exit(&self, id: &str, status: i32) {
        let Some(t) = self.inner.locked().clone() else {
            return; // nothing watched
        };
        let _report = t.report.locked();
        if t.check_at_exit(id, status) {
            (self.callback)(id);
            log::info!("container {id}: OOM kill (seen at its exit)");
        }
    }

    /// Stops watching container `id`.
    pub fn unwatch(&self, id: &str) {
        if let Some(t) = self.inner.locked().as_ref() {
            t.watches.locked().retain(|w| w.id != id);
            let _ = nix::unistd::write(&t.wake, b"w");
        }
    }
}

impl WatcherThread {
    fn run(&self, wake: OwnedFd, callback: OomCallback) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        loop {
            // Duplicate the fds so the list lock is not held while polling.
            let (ids, fds): (Vec<String>, Vec<OwnedFd>) = {
                let w = self.watches.locked();
                w.iter()
                    .filter_map(|w| Some((w.id.clone(), w.fd.try_clone().ok()?)))
                    .unzip()
            };
            let mut pfds: Vec<PollFd> = vec![PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
            pfds.extend(
                fds.iter()
                    .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN)),
            );
            if poll(&mut pfds, PollTimeout::NONE).is_err() {
                continue;
            }
            let ready: Vec<bool> = pfds
                .iter()
                .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(pfds);
            if ready[0] {
                let mut b = [0u8; 64];
                let _ = nix::unistd::read(&wake, &mut b);
            }
            for (i, id) in ids.iter().enumerate() {
                if !ready[i + 1] {
                    continue;
                }
                let mut drain = [0u8; 4096];
                let n = nix::unistd::read(&fds[i], &mut drain).unwrap_or(0);
                let _report = self.report.locked();
                if self.is_oom(id, modified(&drain[..n]), None) {
                    callback(id);
                    log::info!("container {id}: OOM kill");
                }
            }
        }
    }

    /// Adds a watch; the first below its parent opens the parent's [`Ledger`].
    fn add(&self, watch: Watch) {
        let mut watches = self.watches.locked();
        if let Some(p) = &watch.parent_events {
            self.ledgers
                .locked()
                .entry(p.clone())
                .or_insert_with(|| Ledger {
                    base: read_kv(p).get("oom_kill").copied().unwrap_or(0),
                    taken: 0,
                });
        }
        watches.push(watch);
    }

    /// [`OomWatcher::check_at_exit`]: a v2 watch's own count rose unseen, or (its cgroup
    /// gone) its init was SIGKILLed and the parent holds a kill nobody else accounts for.
    fn check_at_exit(&self, id: &str, status: i32) -> bool {
        let v2 = self
            .watches
            .locked()
            .iter()
            .any(|w| w.id == id && w.events_file.is_some());
        v2 && self.is_oom(id, false, Some(status))
    }

    /// Whether the event on `id`'s fd was an OOM kill (not a cgroup removal or other change).
    /// `modified`: v2, the events read included IN_MODIFY of memory.events. `exit`: the init's
    /// exit status when called at its exit; the watcher (no exit known) leaves a cgroup that
    /// is gone to that later judgement.
    fn is_oom(&self, id: &str, modified: bool, exit: Option<i32>) -> bool {
        let mut watches = self.watches.locked();
        let Some(pos) = watches.iter().position(|w| w.id == id) else {
            return false;
        };
        let w = &mut watches[pos];
        let Some(f) = w.events_file.clone() else {
            if w.dir.join("memory.oom_control").exists() {
                return true;
            }
            watches.remove(pos); // the cgroup is gone: that was the removal notice
            return false;
        };
        let parent = w.parent_events.clone();
        let mut ledgers = self.ledgers.locked();
        if let Some(now) = read_kv(&f).get("oom_kill").copied() {
            // The container's own count: containerd's reading (pkg/oom/v2).
            let own_rise = now.saturating_sub(w.last_oom_kill);
            w.last_oom_kill = now;
            if let Some(l) = parent.as_ref().and_then(|p| ledgers.get_mut(p)) {
                l.taken += own_rise;
            }
            return own_rise > 0;
        }
        // The cgroup is gone (the kernel dropped a pending notification with it: `modified`
        // may be false for the last kill).
        let _ = modified;
        let Some(status) = exit else {
            return false; // judged at the init's exit, with its status
        };
        // The OOM killer ends its victim with SIGKILL: an init that exited otherwise was not
        // killed, whatever a sibling's kill did to the parent's count meanwhile.
        if status != 128 + libc::SIGKILL {
            return false;
        }
        let (Some(p), Some(parent_now)) = (
            parent.as_ref(),
            parent
                .as_deref()
                .and_then(|p| read_kv(p).get("oom_kill").copied()),
        ) else {
            return false;
        };
        // Kills below the parent that siblings' own counts still hold unreported are theirs.
        let siblings: u64 = watches
            .iter()
            .filter(|o| o.id != id && o.parent_events.as_deref() == Some(p.as_path()))
            .filter_map(|o| {
                let now = read_kv(o.events_file.as_deref()?)
                    .get("oom_kill")
                    .copied()?;
                Some(now.saturating_sub(o.last_oom_kill))
            })
            .sum();
        let Some(l) = ledgers.get_mut(p) else {
            return false;
        };
        let unaccounted = parent_now
            .saturating_sub(l.base)
            .saturating_sub(l.taken)
            .saturating_sub(siblings);
        // All of them: one OOM kill raises the count once per process it ends (an
        // oom.group kill, kubelet's default on cgroup v2, ends every process of the
        // container, `__oom_kill_process` counting each), and a kill left behind here would
        // be taken later for a sibling whose init is SIGKILLed for another reason (a stop).
        if unaccounted > 0 {
            l.taken += unaccounted;
            return true;
        }
        false
    }
}

/// Whether the inotify events in `buf` include IN_MODIFY (`struct inotify_event`: wd, mask,
/// cookie, len, then `len` bytes of name).
fn modified(buf: &[u8]) -> bool {
    let mut rest = buf;
    while rest.len() >= 16 {
        let mask = u32::from_ne_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let len = u32::from_ne_bytes([rest[12], rest[13], rest[14], rest[15]]) as usize;
        if mask & libc::IN_MODIFY != 0 {
            return true;
        }
        rest = rest.get(16 + len..).unwrap_or(&[]);
    }
    false
}

/// Error for callers that need a cgroup and found none.
pub fn no_cgroup(id: &str) -> Error {
    Error::precondition(format!(
        "task {id} has no cgroup to read (not started or already gone)"
    ))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod oom_fallback_tests {
    use super::*;

    fn thread_with(w: Watch) -> WatcherThread {
        let wake = nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
        )
        .unwrap();
        let t = WatcherThread {
            watches: Mutex::new(Vec::new()),
            ledgers: Mutex::default(),
            wake: OwnedFd::from(wake),
            report: Mutex::new(()),
        };
        t.add(w);
        t
    }

    fn watch_of(id: &str, dir: &Path) -> Watch {
        Watch {
            id: id.into(),
            fd: OwnedFd::from(std::fs::File::open(dir).unwrap()),
            events_file: Some(dir.join("memory.events")),
            dir: dir.to_path_buf(),
            last_oom_kill: 0,
            parent_events: Some(dir.parent().unwrap().join("memory.events")),
        }
    }

    /// A pod cgroup with one child cgroup per name, every `memory.events` at no kill; and a
    /// watcher thread watching those named `c1` and `c2` (v2).
    fn pod_with(children: &[&str]) -> (tempfile::TempDir, Vec<PathBuf>, WatcherThread) {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = children.iter().map(|c| tmp.path().join(c)).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        }
        std::fs::write(tmp.path().join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        let t = thread_with(watch_of("c1", &dirs[0]));
        t.add(watch_of("c2", &dirs[1]));
        (tmp, dirs, t)
    }

    const KILLED: i32 = 128 + libc::SIGKILL;

    /// A scope systemd removes right after its process was OOM-killed: the container's own
    /// memory.events is gone (the kernel dropped its pending notification too: the removal
    /// may be the only event). The watcher leaves it to the init's exit, where the parent's
    /// hierarchical count tells. A sibling's kill, once taken, is not taken for another
    /// container's when that one's cgroup goes.
    #[test]
    fn a_cgroup_removed_before_its_count_is_read_is_judged_by_its_parent() {
        let (tmp, dirs, t) = pod_with(&["c1.scope", "c2.scope"]);
        let (pod, c1, c2) = (tmp.path(), dirs[0].clone(), dirs[1].clone());
        // A change of its own file that is no kill.
        std::fs::write(c1.join("memory.events"), "oom 0\nmax 3\noom_kill 0\n").unwrap();
        assert!(!t.is_oom("c1", true, None));
        // Its own count rises: a kill, read directly.
        std::fs::write(c1.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        std::fs::write(pod.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        assert!(t.is_oom("c1", true, None));
        // A second kill, and the cgroup gone before the read: only the removal is seen, and
        // the init's exit (SIGKILL) decides.
        std::fs::remove_dir_all(&c1).unwrap();
        std::fs::write(pod.join("memory.events"), "oom 2\noom_kill 2\n").unwrap();
        assert!(!t.is_oom("c1", false, None));
        assert!(t.check_at_exit("c1", KILLED));
        // c2 exits later and its cgroup goes: c1's kills were seen, not c2's.
        std::fs::remove_dir_all(&c2).unwrap();
        assert!(!t.is_oom("c2", false, None));
        assert!(!t.check_at_exit("c2", KILLED));
    }

    /// The exit check reports a kill the events missed, once: the scope still there with its
    /// count raised, or gone with only the parent's count to tell; a normal exit is no kill.
    #[test]
    fn the_exit_check_finds_a_kill_no_event_reported() {
        let (tmp, dirs, t) = pod_with(&["c1.scope", "c2.scope", "c3"]);
        let (pod, c1, c2, c3) = (
            tmp.path(),
            dirs[0].clone(),
            dirs[1].clone(),
            dirs[2].clone(),
        );
        let mut v1 = watch_of("c3", &c3);
        v1.events_file = None;
        t.add(v1);
        // c1 killed, its scope still there at the exit: reported, and not again.
        std::fs::write(c1.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        std::fs::write(pod.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        assert!(t.check_at_exit("c1", KILLED));
        assert!(!t.check_at_exit("c1", KILLED));
        // c2 killed and its scope already removed: the parent's count tells.
        std::fs::remove_dir_all(&c2).unwrap();
        std::fs::write(pod.join("memory.events"), "oom 2\noom_kill 2\n").unwrap();
        assert!(t.check_at_exit("c2", KILLED));
        // A v1 watch and an unknown ID are never judged here.
        assert!(!t.check_at_exit("c3", KILLED));
        assert!(!t.check_at_exit("nope", KILLED));
        // c1's scope removed after its kill was reported: the removal is no second kill.
        std::fs::remove_dir_all(&c1).unwrap();
        assert!(!t.is_oom("c1", false, None));
    }

    /// A kill read in the container's own count before it reached the parent's (the kernel
    /// raises the cgroup's, then its ancestors'): once the parent has it and the cgroup is
    /// gone, it is not reported again, for the container or a sibling.
    #[test]
    fn a_kill_read_before_it_reached_the_parent_is_reported_once() {
        let (tmp, dirs, t) = pod_with(&["c1.scope", "c2.scope"]);
        let (pod, c1, c2) = (tmp.path(), dirs[0].clone(), dirs[1].clone());
        std::fs::write(c1.join("memory.events"), "oom_kill 1\n").unwrap();
        assert!(t.check_at_exit("c1", KILLED));
        std::fs::write(pod.join("memory.events"), "oom_kill 1\n").unwrap();
        std::fs::remove_dir_all(&c1).unwrap();
        assert!(!t.is_oom("c1", false, None));
        std::fs::remove_dir_all(&c2).unwrap();
        assert!(!t.check_at_exit("c2", KILLED));
    }

    /// Issue 27 item 5: c2 is OOM-killed (its own count and the pod's raised, no event read
    /// yet) while c1 exits normally and systemd removes c1's scope. c1 is no OOM kill: its init
    /// exited by itself, and even an init SIGKILLed at that moment (a stop) does not take the
    /// kill c2's own count still shows. c2's own check reports it. Before, the parent's rise
    /// alone decided: c1 was reported OOM-killed (its TaskOOM, its reason OOMKilled).
    #[test]
    fn a_normal_exit_beside_a_sibling_s_kill_in_flight_is_no_oom() {
        let (tmp, dirs, t) = pod_with(&["c1.scope", "c2.scope"]);
        let (pod, c1, c2) = (tmp.path(), dirs[0].clone(), dirs[1].clone());
        std::fs::write(c2.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        std::fs::write(pod.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        std::fs::remove_dir_all(&c1).unwrap();
        assert!(!t.is_oom("c1", false, None), "the removal event");
        assert!(!t.check_at_exit("c1", 0), "a normal exit");
        assert!(!t.check_at_exit("c1", KILLED), "a SIGKILL beside c2's kill");
        assert!(t.check_at_exit("c2", KILLED));
    }

    /// One OOM kill that ends several processes of a container (memory.oom.group, which the
    /// kubelet sets on cgroup v2: the kernel counts each process it kills) whose scope is gone
    /// at its init's exit: reported once, and all its kills are taken. Before, one was taken
    /// and the rest stayed in the ledger, so a sibling later stopped with SIGKILL (its scope
    /// gone too) was reported OOM-killed.
    #[test]
    fn a_kill_of_several_processes_is_taken_whole() {
        let (tmp, dirs, t) = pod_with(&["c1.scope", "c2.scope"]);
        let (pod, c1, c2) = (tmp.path(), dirs[0].clone(), dirs[1].clone());
        std::fs::write(c1.join("memory.events"), "oom 1\noom_kill 3\n").unwrap();
        std::fs::write(pod.join("memory.events"), "oom 1\noom_kill 3\n").unwrap();
        std::fs::remove_dir_all(&c1).unwrap();
        assert!(t.check_at_exit("c1", KILLED));
        std::fs::remove_dir_all(&c2).unwrap();
        assert!(
            !t.check_at_exit("c2", KILLED),
            "a stop taken for an OOM kill"
        );
    }

    /// The same through the watch of the real thread: files given to `OomWatcher::watch`
    /// (inotify on stand-in memory.events files), the callback counting TaskOOMs.
    #[test]
    fn the_watcher_reports_the_killed_sibling_only() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path();
        std::fs::write(pod.join("memory.events"), "oom_kill 0\n").unwrap();
        let dirs: Vec<PathBuf> = ["c1.scope", "c2.scope"]
            .iter()
            .map(|c| pod.join(c))
            .collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("memory.events"), "oom_kill 0\n").unwrap();
        }
        let reported = Arc::new(Mutex::new(Vec::<String>::new()));
        let r = reported.clone();
        let w = OomWatcher::new(Arc::new(move |id: &str| r.locked().push(id.into())));
        for (id, d) in [("c1", &dirs[0]), ("c2", &dirs[1])] {
            let paths = CgroupPaths {
                v2: Some(d.clone()),
                ..Default::default()
            };
            w.watch(id, &paths).unwrap();
        }
        std::fs::write(dirs[1].join("memory.events"), "oom_kill 1\n").unwrap();
        std::fs::write(pod.join("memory.events"), "oom_kill 1\n").unwrap();
        std::fs::remove_dir_all(&dirs[0]).unwrap();
        w.check_at_exit("c1", 0);
        w.check_at_exit("c2", KILLED);
        // The watcher thread may have taken c2's from its event first: once either way.
        assert_eq!(*reported.locked(), ["c2"]);
    }

    #[test]
    fn inotify_events_are_parsed_for_in_modify() {
        let event = |mask: u32, name: &[u8]| {
            let mut b = Vec::new();
            b.extend_from_slice(&1i32.to_ne_bytes());
            b.extend_from_slice(&mask.to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            b.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            b.extend_from_slice(name);
            b
        };
        assert!(!modified(&event(libc::IN_IGNORED, b"")));
        let mut two = event(libc::IN_IGNORED, b"abcd\0\0\0\0");
        two.extend(event(libc::IN_MODIFY, b""));
        assert!(modified(&two));
        assert!(!modified(&[]));
        assert!(!modified(&two[..10]));
    }
}
