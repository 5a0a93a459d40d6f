//! The bench's scripts touch only their own shim sockets. `/run/containerd/s` is shared by
//! every containerd on the machine (containerd's shim code hard-codes it): `hack/containerd.sh
//! stop` removes a socket there only when its name is one this bench's containerd gives (the
//! sha256 of its address, namespace and ID, containerd's `SocketAddress`) and nothing accepts
//! on it; `hack/leftovers.sh` reports the others as notes. A shim of another containerd in
//! another network namespace (where `/proc/net/unix` of ours does not list its socket) keeps
//! its socket.
//!
//! The scripts run against a scratch prefix of their own (no containerd runs there), with pod
//! subnets and bridges that no bench uses: the shared bench is never touched.

use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rsandbox_integration::*;

fn sha256_hex(s: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// The socket containerd at `address` gives the shim of `ns`/`id` (pkg/shim/util_unix.go).
fn shim_socket(address: &Path, ns: &str, id: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(sha256_hex(&format!("{}/{ns}/{id}", address.display())))
}

/// A socket file at `path` that nobody listens on (its listener closed, as a killed shim's).
fn stale_socket(path: &Path) {
    let _ = std::fs::remove_file(path);
    drop(UnixListener::bind(path).expect("bind"));
    assert!(path.exists());
}

/// A listener on `path` in a network namespace of its own (`unshare -n`), as the shim of a
/// containerd in another netns: its socket is not in this netns's /proc/net/unix.
fn listener_in_another_netns(path: &Path) -> Child {
    let _ = std::fs::remove_file(path);
    let mut child = Command::new("unshare")
        .args(["-n", "perl", "-MSocket", "-e"])
        .arg(
            r#"socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
               bind($s, pack_sockaddr_un($ARGV[0])) or die "bind: $!";
               listen($s, 16) or die "listen: $!";
               $| = 1; print "ready\n";
               while (accept(my $c, $s)) { close $c }"#,
        )
        .arg(path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare -n perl");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line, "ready\n",
        "the listener in another netns did not start"
    );
    child
}

fn netns_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap()
}

fn listed_in_our_proc_net_unix(path: &Path) -> bool {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .any(|l| l.ends_with(&format!(" {}", path.display())))
}

/// Runs a hack/ script on the scratch prefix; returns its stdout and stderr.
fn hack(prefix: &Path, args: &[&str]) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .args(args)
        .current_dir(&repo)
        .env("RSANDBOX_PREFIX", prefix)
        // no bench's guard rule, bridge or lease is ever these
        .env("RSANDBOX_SUBNET", "10.251.0.0/16")
        .env("RSANDBOX_SHIM_SUBNET", "10.252.0.0/16")
        .env("RSANDBOX_BRIDGE", "rsbsock0")
        .env("RSANDBOX_SHIM_BRIDGE", "rsbsock1")
        .output()
        .expect("run a hack script");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_bench_removes_only_its_own_stale_shim_sockets() {
    std::fs::create_dir_all(SOCKET_DIR).unwrap();
    let scratch = std::env::temp_dir().join(format!("sockets-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let our_address = scratch.join("run/containerd.sock");
    let other_address = Path::new("/run/another-containerd/containerd.sock");
    let id = unique_id("sock");

    // Another containerd's: a live shim in another netns, and a dead one.
    let foreign_live = shim_socket(other_address, "k8s.io", &format!("{id}-live"));
    let mut listener = listener_in_another_netns(&foreign_live);
    let foreign_stale = shim_socket(other_address, "k8s.io", &format!("{id}-dead"));
    stale_socket(&foreign_stale);
    // Ours, dead: one named by a bundle left in our state dir (a crash), one by our log.
    let bundle_id = format!("{id}-bundle");
    let bundle = scratch.join(format!(
        "run/containerd/io.containerd.runtime.v2.task/default/{bundle_id}"
    ));
    std::fs::create_dir_all(&bundle).unwrap();
    let ours_by_bundle = shim_socket(&our_address, "default", &bundle_id);
    stale_socket(&ours_by_bundle);
    let ours_by_log = shim_socket(&our_address, "k8s.io", &format!("{id}-log"));
    stale_socket(&ours_by_log);
    std::fs::create_dir_all(scratch.join("log")).unwrap();
    std::fs::write(
        scratch.join("log/containerd.log"),
        format!(
            "time=\"2026-01-01T00:00:00Z\" level=info msg=\"connecting to shim {id}-log\" \
             address=\"unix://{}\" namespace=k8s.io protocol=ttrpc version=3\n",
            ours_by_log.display()
        ),
    )
    .unwrap();

    // The premise: the live listener is in another netns, so ours does not list it.
    assert_ne!(netns_of(listener.id()), netns_of(std::process::id()));
    assert!(!listed_in_our_proc_net_unix(&foreign_live));

    let before = hack(&scratch, &["hack/leftovers.sh"]);
    let line_of = |out: &str, p: &Path| {
        out.lines()
            .find(|l| l.contains(&p.display().to_string()))
            .unwrap_or_default()
            .to_string()
    };
    let res = (|| -> Result<(), String> {
        for ours in [&ours_by_bundle, &ours_by_log] {
            let l = line_of(&before, ours);
            ensure!(l.starts_with("LEFTOVER [socket]"), "ours: {l:?}\n{before}");
        }
        for theirs in [&foreign_live, &foreign_stale] {
            let l = line_of(&before, theirs);
            ensure!(
                l.starts_with("note     [socket]"),
                "another's: {l:?}\n{before}"
            );
        }
        ensure!(
            line_of(&before, &foreign_live).contains("another network namespace"),
            "{before}"
        );

        let stop = hack(&scratch, &["hack/containerd.sh", "stop"]);
        ensure!(!ours_by_bundle.exists(), "our stale socket stays:\n{stop}");
        ensure!(
            !ours_by_log.exists(),
            "our stale socket (by log) stays:\n{stop}"
        );
        ensure!(
            foreign_live.exists(),
            "the live shim's socket was removed:\n{stop}"
        );
        ensure!(
            foreign_stale.exists(),
            "another containerd's socket was removed:\n{stop}"
        );
        ensure!(
            UnixStream::connect(&foreign_live).is_ok(),
            "the live shim no longer accepts"
        );

        let after = hack(&scratch, &["hack/leftovers.sh"]);
        ensure!(
            line_of(&after, &foreign_live).starts_with("note"),
            "after stop: {after}"
        );
        ensure!(
            !after.contains(&ours_by_bundle.display().to_string()),
            "after stop: {after}"
        );
        Ok(())
    })();
    let _ = listener.kill();
    let _ = listener.wait();
    for p in [&foreign_live, &foreign_stale, &ours_by_bundle, &ours_by_log] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(e) = res {
        panic!("{e}");
    }
}
