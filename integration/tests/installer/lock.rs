//! The installer's lock (issue 34 item 4): in /run/rsandbox-node, a directory of root's with
//! mode 0700 (no one else can plant a link or a blocking file there), held only while an
//! install or uninstall works. The DaemonSet's container (`rsandbox-node.sh run install`)
//! stays after its install; a hand-run uninstall on its node must get the lock (with the lock
//! held for the pod's life it waited `--wait` seconds and failed).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use super::*;

const LOCK_DIR: &str = "/run/rsandbox-node";

/// Stops the staying installer: its process group (bash and its `sleep`).
fn stop_group(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

#[test]
fn a_staying_installer_leaves_the_lock_to_a_hand_run() {
    let n = node_or_skip!();
    let r = (|| -> R {
        prepare(&n, Flavour::NoImports)?;
        let ready = n.scratch.join("staying-installer-ready");
        let log = n.scratch.join("staying-installer.log");
        let _ = fs::remove_file(&ready);
        n.reset_start_limit();
        let out = fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut c = Command::new("bash");
        c.arg(&n.script)
            .args(["run", "install", "--binary"])
            .arg(&n.new_bin)
            .args(if has_check(&n.new_bin) {
                &[][..]
            } else {
                &["--no-check"][..]
            })
            .env("READY_FILE", &ready)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let mut pod = c.spawn().map_err(|e| e.to_string())?;
        let stayed = (|| -> R {
            // its install is done when it touches the readiness file (a deadline only for a hang)
            let done = poll(Duration::from_secs(300), || {
                if ready.exists() {
                    return Some(true);
                }
                matches!(pod.try_wait(), Ok(Some(_))).then_some(false)
            });
            ensure!(
                done == Some(true),
                "the staying installer did not finish its install:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            let m = fs::symlink_metadata(LOCK_DIR).map_err(|e| format!("{LOCK_DIR}: {e}"))?;
            ensure!(
                m.is_dir() && m.uid() == 0 && m.mode() & 0o7777 == 0o700,
                "{LOCK_DIR} is not root's 0700 directory: uid {} mode {:o}",
                m.uid(),
                m.mode()
            );
            let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
            ensure!(
                r.code == Some(0),
                "a hand-run uninstall beside the staying installer failed:\n{}",
                r.log
            );
            ensure!(!n.dropin().exists(), "the uninstall left the drop-in");
            Ok(())
        })();
        stop_group(&mut pod);
        stayed?;

        // a lock directory others may write to is refused before anything is done
        fs::set_permissions(LOCK_DIR, fs::Permissions::from_mode(0o777))
            .map_err(|e| e.to_string())?;
        let r = n.install(&n.new_bin, &["--no-check"]);
        fs::set_permissions(LOCK_DIR, fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        ensure!(
            r.code == Some(1) && r.log.contains("0700"),
            "an install with a world-writable {LOCK_DIR} exited {:?}:\n{}",
            r.code,
            r.log
        );
        ensure!(!n.dropin().exists(), "the refused install wrote a drop-in");
        Ok(())
    })();
    restore(&n);
    r.unwrap();
}
