//! What /proc says: the process table, a pod's runtime processes (its shim and pause process,
//! never its containers), PSS and RSS.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// One process of the table.
#[derive(Debug, Clone)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Base name of /proc/<pid>/exe (" (deleted)" stripped).
    pub exe: String,
    /// Command line, arguments joined by blanks.
    pub cmdline: String,
}

/// A snapshot of every process.
pub struct ProcTable(pub BTreeMap<i32, ProcInfo>);

impl ProcTable {
    pub fn read() -> ProcTable {
        let mut m = BTreeMap::new();
        let Ok(rd) = fs::read_dir("/proc") else {
            return ProcTable(m);
        };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let d = e.path();
            let Ok(stat) = fs::read_to_string(d.join("stat")) else {
                continue;
            };
            let exe = fs::read_link(d.join("exe"))
                .map(|p| {
                    let s = p.to_string_lossy().into_owned();
                    let s = s.trim_end_matches(" (deleted)");
                    s.rsplit('/').next().unwrap_or(s).to_string()
                })
                .unwrap_or_default();
            let cmdline = fs::read(d.join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            m.insert(
                pid,
                ProcInfo {
                    pid,
                    ppid: ppid_of_stat(&stat).unwrap_or(0),
                    exe,
                    cmdline,
                },
            );
        }
        ProcTable(m)
    }

    /// Shim processes (executable `containerd-shim-*`) started with `-id <id>` for the
    /// containerd at `address`.
    pub fn shims_of(&self, id: &str, address: &str) -> Vec<&ProcInfo> {
        let want_id = format!(" -id {id} ");
        let want_addr = format!(" -address {address} ");
        self.0
            .values()
            .filter(|p| p.exe.starts_with("containerd-shim-"))
            .filter(|p| {
                let c = format!(" {} ", p.cmdline);
                c.contains(&want_id) && c.contains(&want_addr)
            })
            .collect()
    }

    /// The per-pod runtime processes of pod `id`: the shim daemon (the one whose parent is not
    /// itself a shim of the pod) and its children that are not one of `containers` (the app
    /// containers' pids): the pause process on both paths.
    pub fn pod_runtime(&self, id: &str, address: &str, containers: &BTreeSet<i32>) -> PodProcs {
        let shims = self.shims_of(id, address);
        let pids: BTreeSet<i32> = shims.iter().map(|p| p.pid).collect();
        let daemons: Vec<i32> = shims
            .iter()
            .filter(|p| !pids.contains(&p.ppid))
            .map(|p| p.pid)
            .collect();
        let mut others = Vec::new();
        for p in self.0.values() {
            if daemons.contains(&p.ppid) && !containers.contains(&p.pid) {
                others.push(p.pid);
            }
        }
        PodProcs {
            shims: daemons,
            others,
        }
    }
}

/// A pod's runtime processes.
#[derive(Debug, Clone, Default)]
pub struct PodProcs {
    /// The shim daemon(s); exactly one when all is well.
    pub shims: Vec<i32>,
    /// Its children other than the app containers: the pause process.
    pub others: Vec<i32>,
}

/// The ppid field of /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold blanks).
pub fn ppid_of_stat(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A `Key:   1234 kB` line's value in KiB.
pub fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Proportional set size of `pid` in KiB (/proc/<pid>/smaps_rollup).
pub fn pss_kib(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    kib_field(&text, "Pss")
}

/// Resident set size of `pid` in KiB (/proc/<pid>/status VmRSS).
pub fn rss_kib(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kib_field(&text, "VmRSS")
}

/// containerd's pid from the bench's pid file, if that process runs.
pub fn containerd_pid(prefix: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(prefix.join("run/containerd.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_survives_blanks_and_parens_in_comm() {
        assert_eq!(ppid_of_stat("42 (a b) c) S 7 42 42 0"), Some(7));
        assert_eq!(ppid_of_stat("42 (x) S"), None);
        assert_eq!(ppid_of_stat("garbage"), None);
    }

    #[test]
    fn kib_fields() {
        let t = "Rss:                1864 kB\nPss:                 411 kB\nPss_Anon:  100 kB\n";
        assert_eq!(kib_field(t, "Pss"), Some(411));
        assert_eq!(kib_field(t, "Rss"), Some(1864));
        assert_eq!(kib_field(t, "VmRSS"), None);
    }

    fn table(rows: &[(i32, i32, &str, &str)]) -> ProcTable {
        ProcTable(
            rows.iter()
                .map(|&(pid, ppid, exe, cmd)| {
                    (
                        pid,
                        ProcInfo {
                            pid,
                            ppid,
                            exe: exe.into(),
                            cmdline: cmd.into(),
                        },
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn pod_runtime_is_shim_and_pause_without_containers() {
        let cmd = "/b/containerd-shim-rsandbox-v1 -namespace k8s.io -id p1 -address /s.sock";
        let t = table(&[
            (10, 1, "containerd-shim-rsandbox-v1", cmd),
            (11, 10, "memfd:rsandbox-pause", "rsandbox-pause p1"), // the pause
            (12, 10, "busybox", "sleep 3600"),                     // the app container
            (
                20,
                1,
                "containerd-shim-rsandbox-v1",
                &cmd.replace("p1", "p2"),
            ),
            (
                30,
                1,
                "containerd-shim-runc-v2",
                &cmd.replace("/s.sock", "/other.sock"),
            ),
        ]);
        let p = t.pod_runtime("p1", "/s.sock", &BTreeSet::from([12]));
        assert_eq!(p.shims, vec![10]);
        assert_eq!(p.others, vec![11]);
        let runc = table(&[
            (
                40,
                1,
                "containerd-shim-runc-v2",
                "/b/containerd-shim-runc-v2 -namespace k8s.io -id p3 -address /s.sock",
            ),
            (41, 40, "pause", "/pause"),
            (42, 40, "busybox", "sleep 3600"),
        ]);
        let p = runc.pod_runtime("p3", "/s.sock", &BTreeSet::from([42]));
        assert_eq!((p.shims, p.others), (vec![40], vec![41]));
    }
}
