//! The installer's ServiceAccount token never appears on a process's argv (issue 34 item 3):
//! /proc/<pid>/cmdline is readable by every local user and every hostPID pod. Two scans run
//! while an install with labels and an uninstall talk to the API stub:
//! - the stub's own (`hack/installer/kube-stub.py --token`): while it holds each request, the
//!   requesting curl is alive, so that scan sees its argv for certain; each request's log line
//!   says how many processes had the token (must be 0) and how many were its curl (at least 1:
//!   otherwise the scan proved nothing);
//! - this test's, reading every /proc/*/cmdline over and over until the installer is done: it
//!   may also catch another process (a helper the token passes through).
//!
//! The stub refuses a request without the token, so the installs here also prove it reaches
//! the API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// Every argv holding `needle` ("<pid>: <argv>"), and how many scans ran, until `stop`.
fn scan_cmdlines(needle: &[u8], stop: &AtomicBool) -> (Vec<String>, u64) {
    let mut found = Vec::new();
    let mut scans = 0;
    while !stop.load(Ordering::Relaxed) {
        scans += 1;
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(argv) = fs::read(e.path().join("cmdline")) else {
                continue;
            };
            if argv.windows(needle.len()).any(|w| w == needle) {
                found.push(format!(
                    "{}: {}",
                    e.file_name().to_string_lossy(),
                    String::from_utf8_lossy(&argv).replace('\0', " ")
                ));
            }
        }
    }
    (found, scans)
}

#[test]
fn the_token_never_appears_on_a_command_line() {
    let n = node_or_skip!();
    let (Ok(sa), Ok(state)) = (
        std::env::var("SA_DIR"),
        std::env::var("RSANDBOX_INSTALLER_KUBE_STATE"),
    ) else {
        eprintln!(
            "SKIPPED: no SA_DIR or API stub (hack/installer/in-node.sh makes both): nothing to scan for"
        );
        return;
    };
    let stub_log = PathBuf::from(format!("{state}.log"));
    let r = (|| -> R {
        let token = fs::read_to_string(Path::new(&sa).join("token")).map_err(|e| e.to_string())?;
        let token = token.trim().as_bytes().to_vec();
        ensure!(
            token.len() >= 16,
            "the test's token is too short to search for"
        );
        prepare(&n, Flavour::NoImports)?;
        let logged_before = fs::read_to_string(&stub_log)
            .unwrap_or_default()
            .lines()
            .count();

        let stop = Arc::new(AtomicBool::new(false));
        let scanner = {
            let stop = stop.clone();
            std::thread::spawn(move || scan_cmdlines(&token, &stop))
        };
        let installed = install_new(&n);
        let uninstalled = n.installer(&["uninstall", "--wait-for-pods=0"]);
        stop.store(true, Ordering::Relaxed);
        let (found, scans) = scanner.join().map_err(|_| "the scanner panicked")?;
        installed?;
        ensure!(
            uninstalled.code == Some(0),
            "uninstall failed:\n{}",
            uninstalled.log
        );
        eprintln!("the scanner read every /proc/*/cmdline {scans} times");
        ensure!(
            found.is_empty(),
            "the token was on a command line:\n{}",
            found.join("\n")
        );

        let log = fs::read_to_string(&stub_log).map_err(|e| e.to_string())?;
        let requests: Vec<&str> = log.lines().skip(logged_before).collect();
        ensure!(
            requests.iter().any(|l| l.starts_with("PATCH ")),
            "the installer did not label the Node through the stub: {requests:?}"
        );
        for l in &requests {
            let count = |what: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(what))
                    .and_then(|v| v.parse::<u32>().ok())
            };
            ensure!(
                count("token-seen=") == Some(0),
                "the stub saw the token on an argv while serving: {l}"
            );
            ensure!(
                count("curl-seen=").is_some_and(|c| c >= 1),
                "the stub's scan did not see the requesting curl (it proves nothing): {l}"
            );
        }
        check_labels(&n, None, "after the uninstall")?;
        Ok(())
    })();
    restore(&n);
    r.unwrap();
}
