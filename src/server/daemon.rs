//! The long-running shim: one ttrpc server carrying the Task service (v3 and v2 names) and
//! the Sandbox service, the reaper, the event forwarder, and a clean exit.

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use containerd_shim_protos::events::task::TaskOOM;
use containerd_shim_protos::sandbox_sync::create_sandbox;
use containerd_shim_protos::shim_sync::create_task;

use crate::host::cgroups::OomWatcher;
use crate::host::runtime::RuncConfig;
use crate::pod::sandbox::linux_host::LinuxPodHost;
use crate::pod::sandbox::{SandboxDeps, SandboxManager};
use crate::records::bundle::{LISTENER_FD, LOG_FIFO, OPTIONS_FILE, RUNTIME_ID, SOCKET_DIR};
use crate::records::error::{Context, Error, Result};
use crate::records::flags::Flags;
use crate::server::rpc::sandbox::SandboxService;
use crate::server::rpc::server::ServerBuilder;
use crate::server::rpc::task::{TaskService, runc_config_from_options};
use crate::server::rpc::wait::{SandboxWait, TaskWait};
use crate::shim::events::{Event, EventSink, RemotePublisher};
use crate::shim::reaper::{Reaper, Spawner};
use crate::shim::sync::{Lock, Wait};
use crate::task::{LinuxHost, TaskDeps, TaskManager};

/// After the last reply, how long the daemon waits for its peers to close their connections
/// (containerd does at once; a client that never does only delays our exit by this much).
const PEERS_HANG_UP: Duration = Duration::from_secs(1);

/// Before exiting, how long the daemon waits for containerd to take the events still queued
/// (containerd's shim library waits as long for its publisher).
const EVENTS_DRAIN: Duration = Duration::from_secs(5);

/// Set once when the shim should exit.
#[derive(Default)]
pub struct ExitSignal {
    done: Mutex<bool>,
    cond: Condvar,
}

impl ExitSignal {
    pub fn signal(&self) {
        *self.done.locked() = true;
        self.cond.notify_all();
    }
    pub fn wait(&self) {
        let mut d = self.done.locked();
        while !*d {
            d = self.cond.wait_on(d);
        }
    }
}

fn listener(flags: &Flags) -> Result<UnixListener> {
    // Handed over by `start`: fd 3 is a listening unix socket.
    let inherited = nix::sys::socket::getsockopt(
        // SAFETY: fd 3 is only borrowed for the check.
        &unsafe { std::os::fd::BorrowedFd::borrow_raw(LISTENER_FD) },
        nix::sys::socket::sockopt::AcceptConn,
    );
    if inherited == Ok(true) {
        // SAFETY: fd 3 is a listening socket that nothing else in this process owns.
        let l = unsafe { UnixListener::from_raw_fd(LISTENER_FD) };
        nix::fcntl::fcntl(
            &l,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .context("cloexec listener")?;
        return Ok(l);
    }
    // Started by hand: bind -socket ourselves.
    log::warn!(
        "no listening socket on fd {LISTENER_FD}: binding -socket {}",
        flags.socket
    );
    let path = flags.socket.trim_start_matches("unix://");
    if path.is_empty() {
        return Err(Error::invalid(
            "no listening socket on fd 3 and no -socket given",
        ));
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).with_context(|| format!("bind {path}"))
}

/// Default runc settings: the runtime options saved by `start`, else containerd's defaults.
fn default_runc(bundle: &Path, namespace: &str) -> RuncConfig {
    std::fs::read(bundle.join(OPTIONS_FILE))
        .ok()
        .and_then(|raw| protobuf::Message::parse_from_bytes(&raw).ok())
        .and_then(|any: protobuf::well_known_types::any::Any| {
            runc_config_from_options(Some(&any), &RuncConfig::defaults(namespace), namespace)
                .ok()
                .flatten()
        })
        .unwrap_or_else(|| RuncConfig::defaults(namespace))
}

/// One malloc arena for the whole daemon. glibc gives each thread that allocates its own arena
/// (up to 8 per core), each with pages of its own; a shim's threads allocate little and rarely
/// at once, so the lock contention saved is nothing and the pages are per-pod memory.
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets a malloc tunable; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Runs the daemon until Shutdown (or ShutdownSandbox) lets it exit.
pub fn serve(flags: &Flags) -> Result<()> {
    limit_malloc_arenas();
    let bundle = std::env::current_dir().context("getcwd")?;
    if let Err(e) = crate::shim::logger::init(
        &bundle.join(LOG_FIFO),
        flags.debug,
        &flags.namespace,
        &flags.id,
    ) {
        eprintln!("{RUNTIME_ID}: no log fifo: {e}");
    }
    // From here (the logger decides whether steps are timed): where the daemon's start-up goes,
    // while containerd's first request (CreateSandbox) waits for it.
    let mut steps = crate::shim::timing::Steps::new(|| format!("daemon {} start-up", flags.id));
    let listener = listener(flags)?;
    nix::sys::prctl::set_child_subreaper(true).context("become a child subreaper")?;
    steps.step("listener and subreaper");
    let reaper = Reaper::start().context("start the reaper")?;
    steps.step("reaper");
    let ttrpc_address = std::env::var("TTRPC_ADDRESS").unwrap_or_default();
    let publisher = Arc::new(
        RemotePublisher::start(ttrpc_address, flags.namespace.clone())
            .context("start the event forwarder")?,
    );
    let events: Arc<dyn EventSink> = publisher.clone();
    let oom_events = events.clone();
    let unified = crate::host::cgroups::is_unified(Path::new(crate::host::cgroups::CGROUP_ROOT));
    let host = Arc::new(LinuxHost {
        spawner: Spawner::with_reaper(reaper.clone()),
        oom: OomWatcher::new(Arc::new(move |id: &str| {
            oom_events.publish(Event::Oom(TaskOOM {
                container_id: id.to_string(),
                ..Default::default()
            }))
        })),
        unified,
        socket_dir: PathBuf::from(SOCKET_DIR),
    });
    steps.step("event forwarder and host");
    let config = crate::records::config::ShimConfig::load().unwrap_or_else(|e| {
        log::error!("{e}; using the defaults");
        Default::default()
    });
    let networker: Arc<dyn crate::host::network::NetworkProvider> =
        Arc::new(crate::host::network::Networker::new(
            config.network.clone(),
            Arc::new(crate::host::network::SpawnerExec(Spawner::with_reaper(
                reaper.clone(),
            ))),
        ));
    let exit = Arc::new(ExitSignal::default());
    let e = exit.clone();
    let on_shutdown: Arc<dyn Fn() + Send + Sync> = Arc::new(move || e.signal());
    steps.step("config and networker");
    let sm = SandboxManager::new(
        SandboxDeps {
            host: Arc::new(LinuxPodHost {
                host_etc: PathBuf::from("/etc"),
                unified,
                sysctl_defaults: crate::pod::SysctlDefaults::detect(),
                runc: default_runc(&bundle, &flags.namespace).binary,
                spawner: Spawner::with_reaper(reaper.clone()),
                selinux: crate::host::selinux::Selinux::detect(),
                scope_stop_timeout: crate::host::systemd::scope::STOP_TIMEOUT,
                mcs: crate::host::mcs::Registry::node(),
            }),
            reaper: Some(reaper.clone()),
            network: Some(networker.clone()),
            network_for_pods: config.network.sandboxes,
            on_shutdown: on_shutdown.clone(),
        },
        |pod| {
            TaskManager::new(TaskDeps {
                namespace: flags.namespace.clone(),
                default_runc: default_runc(&bundle, &flags.namespace),
                host,
                events,
                reaper: Some(reaper.clone()),
                network: Some(networker),
                network_for_tasks: config.network.standalone_tasks,
                pod,
                on_shutdown,
            })
        },
    );
    let tm = sm.tasks().clone();
    let (wtm, wsm) = (Arc::downgrade(&tm), Arc::downgrade(&sm));
    reaper.set_handler(move |exit| {
        if let Some(tm) = wtm.upgrade() {
            tm.on_exit(exit);
        }
        if let Some(sm) = wsm.upgrade() {
            sm.on_exit(exit);
        }
    });

    steps.step("managers");
    let mut server = ServerBuilder::default();
    let task = Arc::new(TaskService::new(tm.clone()));
    server.register(create_task(task.clone()));
    server.register_renamed(
        create_task(task),
        "containerd.task.v3.Task",
        "containerd.task.v2.Task",
    );
    let task_wait = Arc::new(TaskWait::new(tm));
    server.register_parked("/containerd.task.v3.Task/Wait", task_wait.clone());
    server.register_parked("/containerd.task.v2.Task/Wait", task_wait);
    server.register(create_sandbox(Arc::new(SandboxService::new(sm.clone()))));
    for (path, method) in crate::server::rpc::sandbox::inline_methods(&sm) {
        server.register_inline(path, method);
    }
    server.register_parked(
        "/containerd.runtime.sandbox.v1.Sandbox/WaitSandbox",
        Arc::new(SandboxWait::new(sm)),
    );
    let server = server.build();
    let handle = server.start(listener).context("start the ttrpc server")?;
    steps.step("server");
    drop(steps);
    log::info!(
        "shim {} serving namespace {} (pid {})",
        flags.id,
        flags.namespace,
        std::process::id()
    );

    exit.wait();
    // The socket file goes first: containerd runs `delete` as soon as its connection closes
    // and may kill us while the last replies are still being written (open connections keep
    // working without the file).
    let _ = std::fs::remove_file(flags.socket.trim_start_matches("unix://"));
    log::info!("shim {} exiting", flags.id);
    // Let the call that asked for the exit (and any other short one) send its reply, then let
    // containerd hang up first (see ServerHandle::wait_disconnected).
    handle.wait_idle(0, Duration::from_secs(2));
    // The last TaskExit/TaskDelete (ShutdownSandbox deletes the containers left) must reach
    // containerd before we go.
    publisher.drain(EVENTS_DRAIN);
    if !handle.wait_disconnected(PEERS_HANG_UP) {
        log::debug!(
            "shim {}: a peer kept its connection open; exiting",
            flags.id
        );
    }
    Ok(())
}
