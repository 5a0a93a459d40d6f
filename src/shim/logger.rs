//! A `log` backend that writes logrus-style lines into the bundle's `log` fifo.
//!
//! containerd opens `<bundle>/log` before it starts the shim and copies every line into its own
//! log. Lines look like containerd's (`time=... level=info msg="..." id=...`) so they read well
//! there. The fifo is opened non-blocking and a line that does not fit is dropped: a stalled
//! log reader must never stall an RPC (the Go shim blocks here; we prefer losing a log line).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::shim::util::rfc3339;

struct FifoLogger {
    out: Mutex<File>,
    level: LevelFilter,
    fields: String,
}

impl Log for FifoLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format_line(
            SystemTime::now(),
            record.level(),
            &record.args().to_string(),
            &self.fields,
        );
        if let Ok(mut out) = self.out.lock() {
            // One write per line so lines from different threads never interleave.
            match out.write_all(line.as_bytes()) {
                Ok(()) => HEALTHY.store(true, Ordering::Relaxed),
                // A slow reader: this line is lost, the log is not.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => HEALTHY.store(false, Ordering::Relaxed),
            }
        }
    }

    fn flush(&self) {}
}

/// Whether the log fifo has a reader (the last write did not fail for want of one).
static HEALTHY: AtomicBool = AtomicBool::new(false);

/// True while lines written to the log reach containerd.
pub fn healthy() -> bool {
    HEALTHY.load(Ordering::Relaxed)
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// One logrus-format line; `msg` is quoted the way logrus quotes it.
fn format_line(t: SystemTime, level: Level, msg: &str, fields: &str) -> String {
    format!(
        "time=\"{}\" level={} msg={}{}\n",
        rfc3339(t),
        level_name(level),
        quote(msg),
        fields
    )
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Sends `log` records to the fifo (or file) at `path`; `debug` raises the level to debug.
/// Fields such as the namespace and ID are appended to every line.
pub fn init(path: &Path, debug: bool, namespace: &str, id: &str) -> std::io::Result<()> {
    let out = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let level = if debug {
        LevelFilter::Debug
    } else {
        LevelFilter::Info
    };
    let fields = format!(
        " namespace={} id={} runtime={}",
        quote(namespace),
        quote(id),
        crate::records::bundle::RUNTIME_ID
    );
    let logger = FifoLogger {
        out: Mutex::new(out),
        level,
        fields,
    };
    log::set_boxed_logger(Box::new(logger)).map_err(std::io::Error::other)?;
    log::set_max_level(level);
    HEALTHY.store(true, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn lines_are_logrus_formatted_and_quoted() {
        let t = UNIX_EPOCH + Duration::from_secs(1);
        let line = format_line(t, Level::Warn, "bad \"id\"\nnext", " id=\"x\"");
        assert_eq!(
            line,
            "time=\"1970-01-01T00:00:01.000000000Z\" level=warning msg=\"bad \\\"id\\\"\\nnext\" id=\"x\"\n"
        );
    }
}
