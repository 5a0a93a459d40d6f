//! What a panic does in the shim: it is logged where someone will read it, and it costs one
//! RPC, not the pod.
//!
//! The release profile unwinds (`panic = "unwind"`): each RPC runs under `catch_unwind` in
//! [`crate::server::rpc::server`], and the long-lived loops (reaper, event forwarder) catch per item,
//! so a bug answers INTERNAL instead of killing the supervisor of every container in the pod.
//! Unwinding costs about 0.5 MB of binary (3.24 → 3.74 MB, file-backed and shared by every
//! shim on the node) and nothing per call.
//!
//! After `start`, the daemon's stderr is /dev/null: the hook writes the message and its
//! location to the shim log (containerd copies it into its own), and to `/dev/kmsg` as well
//! when that log is gone (containerd restarting, or no fifo).
//!
//! A forked child that shares our memory (the pause process before it settles) must never
//! unwind into the parent's stack copy or run the hook's allocations: it sets
//! [`IN_FORKED_CHILD`] first thing, and the hook then `_exit`s at once.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by a forked child of the shim before it does anything else.
pub static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Exit status of a forked child that panicked.
const CHILD_PANIC_STATUS: i32 = 127;

/// Installs the hook (once, first thing in `main`).
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        if IN_FORKED_CHILD.load(Ordering::Relaxed) {
            // SAFETY: _exit is async-signal-safe and never returns; nothing in a forked child
            // may run after a panic (no unwinding, no allocation).
            unsafe { libc::_exit(CHILD_PANIC_STATUS) };
        }
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let location = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_else(|| "an unknown location".into());
        let thread = std::thread::current();
        let line = format!(
            "panic in thread {} at {location}: {msg}",
            thread.name().unwrap_or("unnamed")
        );
        log::error!("{line}");
        if !crate::shim::logger::healthy() {
            write_kmsg(&line);
        }
        eprintln!("containerd-shim-rsandbox-v1: {line}");
    }));
}

/// One line in the kernel log (`dmesg`), tagged like a syslog line from this process.
fn write_kmsg(line: &str) {
    let tagged = format!(
        "<3>containerd-shim-rsandbox-v1[{}]: {line}\n",
        std::process::id()
    );
    // std opens with O_CLOEXEC.
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        let _ = f.write_all(tagged.as_bytes());
    }
}

/// Runs `f`, turning a panic into a logged error: for loops that must survive one bad item.
pub fn survive<T>(what: &str, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            log::error!("{what}: panicked (see the line above); carrying on");
            None
        }
    }
}
