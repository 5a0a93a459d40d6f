//! A pause process the shim spawned but never recorded. StartSandbox writes the pause's pid
//! into the sandbox record right after the spawn; a shim killed in between left a pause that
//! `delete` knew nothing of, holding the pod's namespaces until the node rebooted. So before the
//! spawn the record says when it began ([`boot_ticks_now`], in the clock of `/proc/<pid>/stat`'s
//! start time), and `delete`, finding that mark without a pid, looks for the pod's pause by
//! what only it has: the command line `rsandbox-pause <pod id>` that the shim gives it, and a
//! start no earlier than the mark.

use std::path::Path;

use super::pause::PAUSE_ARGV0;
use crate::shim::util::start_ticks_of_stat;

/// The boot-time clock (`CLOCK_BOOTTIME`) in clock ticks, as `/proc/<pid>/stat` gives a
/// process's start time; 0 if it cannot be read.
pub fn boot_ticks_now() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the kernel to fill; sysconf has no memory effects.
    let (rc, hz) = unsafe {
        (
            libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t),
            libc::sysconf(libc::_SC_CLK_TCK),
        )
    };
    if rc != 0 || hz <= 0 {
        return 0;
    }
    let hz = hz as u64;
    (t.tv_sec as u64) * hz + (t.tv_nsec as u64) * hz / 1_000_000_000
}

/// The processes under `proc_root` (`/proc`) that are pod `id`'s pause, started at or after
/// `since_ticks`: their pid and start time (for a kill that never hits a recycled pid).
pub fn find(proc_root: &Path, id: &str, since_ticks: u64) -> Vec<(i32, u64)> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let want: Vec<u8> = [PAUSE_ARGV0.as_bytes(), b"\0", id.as_bytes(), b"\0"].concat();
    let mut found: Vec<(i32, u64)> = rd
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            if cmdline != want {
                return None;
            }
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let start = start_ticks_of_stat(&stat)?;
            // A tick of rounding between the mark and the kernel's start time.
            (start + 1 >= since_ticks).then_some((pid, start))
        })
        .collect();
    found.sort_unstable();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(entries: &[(i32, &[u8], u64)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, cmdline, start) in entries {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
            std::fs::write(
                d.join("stat"),
                format!("{pid} (pause) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 0"),
            )
            .unwrap();
        }
        std::fs::create_dir(dir.path().join("self")).unwrap();
        dir
    }

    #[test]
    fn only_the_pod_s_pause_started_since_the_mark_is_found() {
        let proc = fake_proc(&[
            (10, b"rsandbox-pause\0pod1\0", 500),
            // another pod's pause
            (11, b"rsandbox-pause\0pod2\0", 500),
            // an argv that only begins like it
            (12, b"rsandbox-pause\0pod1\0x\0", 500),
            (13, b"rsandbox-pause\0pod10\0", 500),
            // the same command line, older than the mark: not this start's
            (14, b"rsandbox-pause\0pod1\0", 100),
            (15, b"sleep\0pod1\0", 500),
        ]);
        assert_eq!(find(proc.path(), "pod1", 400), vec![(10, 500)]);
        assert_eq!(find(proc.path(), "pod1", 501), vec![(10, 500)]);
        assert!(find(proc.path(), "pod1", 600).is_empty());
        assert!(find(Path::new("/nonexistent"), "pod1", 0).is_empty());
    }

    #[test]
    fn the_mark_is_in_the_clock_of_proc_stat() {
        let now = boot_ticks_now();
        let me = start_ticks_of_stat(&std::fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
        assert!(
            now > 0 && me <= now + 1,
            "now {now}, this process started at {me}"
        );
    }
}
