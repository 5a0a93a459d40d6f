//! The uninstall never leaves containerd unable to start (issue 34 item 2). containerd
//! refuses to start while a file it loads imports a missing file, so the drop-in may go only
//! once no such entry is left, however it is spelled by then: each case installs, rewrites
//! config.toml's imports entry the way a TOML tool or a person would, uninstalls, and then
//! restarts the real containerd once more (a `Type=notify` unit: `systemctl restart` fails
//! when containerd does not come up) and waits for CRI to serve without the handler.
//! Each rewrite is first loaded by containerd with the drop-in in place (it must still serve
//! the handler): a rewrite containerd would not read as an import of the drop-in would prove
//! nothing.

use super::*;

/// How config.toml's entry for the drop-in looks by the time of the uninstall.
#[derive(Clone, Copy, Debug)]
enum Rewrite {
    /// A TOML tool wrote the installer's '...' as "...".
    BasicQuotes,
    /// Another path appended to the installer's line.
    Appended,
    /// The array over several lines, with comments and a trailing comma.
    MultiLine,
    /// The installer's state (/var/lib/rsandbox-node) lost, the entry relative to
    /// config.toml's directory.
    LostStateRelative,
}

/// Another drop-in a person added beside the installer's entry (it must stay imported).
fn extra_file(n: &Node) -> PathBuf {
    n.config.parent().unwrap().join("installer-test-extra.toml")
}

/// config.toml's text, which must hold the installer's own line (a NoImports node).
fn installer_entry(n: &Node) -> R<(String, String)> {
    let text = fs::read_to_string(&n.config).map_err(|e| e.to_string())?;
    let entry = format!("imports = ['{}']", n.dropin().display());
    ensure!(
        text.contains(&entry),
        "config.toml has no installer's entry {entry:?}:\n{text}"
    );
    Ok((text, entry))
}

/// containerd restarted once more starts, and serves CRI without the handler (the default
/// runc handler is there: CRI answers).
fn starts_without_handler(n: &Node, when: &str) -> R {
    n.reset_start_limit();
    let out = n.systemctl(&["restart", UNIT]);
    ensure!(
        out.ok(),
        "{when}: containerd does not start: {out:?}\n{}",
        journal_tail()
    );
    let hs = n.wait_handlers(|h| {
        h.iter().any(|x| x == RUNC_HANDLER) && !h.iter().any(|x| x == HANDLER)
    })?;
    eprintln!("{when}: containerd restarted, handlers {hs:?}");
    Ok(())
}

fn journal_tail() -> String {
    let mut c = Command::new("journalctl");
    c.args(["-u", UNIT, "-n", "15", "--no-pager"]);
    run_timeout(c, None, HANG).stdout
}

fn rewritten_then_uninstalled(n: &Node, rw: Rewrite) -> R {
    prepare(n, Flavour::NoImports)?;
    install_new(n)?;
    let (text, entry) = installer_entry(n)?;
    let dropin = n.dropin().display().to_string();
    let extra = extra_file(n);
    fs::write(&extra, "version = 3\n").map_err(|e| e.to_string())?;
    let extra = extra.display().to_string();
    let line = match rw {
        Rewrite::BasicQuotes => format!("imports = [\"{dropin}\"]"),
        Rewrite::Appended => format!("imports = ['{dropin}', \"{extra}\"]"),
        Rewrite::MultiLine => format!(
            "imports = [\n  # the rsandbox runtime\n  \"{dropin}\", # the installer's\n  '{extra}',\n]"
        ),
        Rewrite::LostStateRelative => {
            fs::remove_dir_all(&n.state_dir).map_err(|e| e.to_string())?;
            "imports = ['conf.d/rsandbox.toml']".into()
        }
    };
    fs::write(&n.config, text.replace(&entry, &line)).map_err(|e| e.to_string())?;
    n.restart_containerd()?;
    n.wait_handlers(|h| h.iter().any(|x| x == HANDLER))
        .map_err(|e| format!("{rw:?}: containerd does not read the rewritten entry: {e}"))?;

    let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
    ensure!(r.code == Some(0), "{rw:?}: uninstall failed:\n{}", r.log);
    ensure!(!n.dropin().exists(), "{rw:?}: the drop-in is still there");
    let after = fs::read_to_string(&n.config).map_err(|e| e.to_string())?;
    ensure!(
        !after.contains(&dropin) && !after.contains("conf.d/rsandbox.toml"),
        "{rw:?}: config.toml still names the drop-in:\n{after}"
    );
    if matches!(rw, Rewrite::Appended | Rewrite::MultiLine) {
        ensure!(
            after.contains(&extra),
            "{rw:?}: the other import went too:\n{after}"
        );
    }
    starts_without_handler(n, &format!("{rw:?}"))?;
    ensure!(
        !n.state_dir.join("import-mode").exists(),
        "{rw:?}: the installer's state of the entry is left"
    );
    Ok(())
}

/// Puts back what these tests leave beside the node's config (then `restore`).
fn clean_up(n: &Node) {
    let _ = fs::remove_file(extra_file(n));
    let _ = fs::remove_file(n.config.parent().unwrap().join("installer-test-real.toml"));
    if fs::symlink_metadata(&n.config).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = fs::remove_file(&n.config);
    }
    let _ = fs::remove_file(n.dropin());
    let _ = fs::remove_dir_all(&n.state_dir);
    restore(n);
}

#[test]
fn uninstall_finds_the_entry_however_rewritten() {
    let n = node_or_skip!();
    let r = [
        Rewrite::BasicQuotes,
        Rewrite::Appended,
        Rewrite::MultiLine,
        Rewrite::LostStateRelative,
    ]
    .into_iter()
    .try_for_each(|rw| rewritten_then_uninstalled(&n, rw));
    clean_up(&n);
    r.unwrap();
}

/// An entry the installer will not take out (config.toml is a link: it rewrites no link)
/// leaves an inert drop-in, the state and a failed uninstall that names the file; containerd
/// starts. A retry fails the same way (it does not say "no config of the installer left");
/// once the entry is taken out by hand, the uninstall deletes the drop-in.
#[test]
fn an_entry_left_in_place_keeps_an_inert_drop_in() {
    let n = node_or_skip!();
    let r = (|| -> R {
        let before = prepare(&n, Flavour::NoImports)?;
        install_new(&n)?;
        installer_entry(&n)?;
        let real = n.config.parent().unwrap().join("installer-test-real.toml");
        fs::rename(&n.config, &real).map_err(|e| e.to_string())?;
        std::os::unix::fs::symlink(&real, &n.config).map_err(|e| e.to_string())?;

        for attempt in ["the uninstall", "its retry"] {
            let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
            ensure!(
                r.code == Some(1),
                "{attempt} exited {:?} with the entry in place:\n{}",
                r.code,
                r.log
            );
            ensure!(
                r.log.contains(&n.config.display().to_string())
                    && !r.log.contains("no config of the installer left"),
                "{attempt} does not name the file to edit:\n{}",
                r.log
            );
            let dropin = fs::read_to_string(n.dropin())
                .map_err(|e| format!("{attempt}: the drop-in is gone: {e}"))?;
            ensure!(
                dropin.starts_with("# rsandbox-node:") && !dropin.contains("[plugins"),
                "{attempt}: the drop-in is not inert:\n{dropin}"
            );
            ensure!(
                n.state_dir.join("import-mode").exists(),
                "{attempt}: the state went while the entry is still there"
            );
            starts_without_handler(&n, attempt)?;
        }

        // taken out by hand: the next uninstall deletes the drop-in
        fs::remove_file(&n.config).map_err(|e| e.to_string())?;
        fs::write(&n.config, &before).map_err(|e| e.to_string())?;
        fs::remove_file(&real).map_err(|e| e.to_string())?;
        let r = n.installer(&["uninstall", "--wait-for-pods=0"]);
        ensure!(
            r.code == Some(0),
            "the uninstall after the fix failed:\n{}",
            r.log
        );
        ensure!(!n.dropin().exists(), "the inert drop-in is still there");
        ensure!(
            !n.state_dir.join("import-mode").exists(),
            "the state is left"
        );
        starts_without_handler(&n, "after the fix")
    })();
    clean_up(&n);
    r.unwrap();
}
