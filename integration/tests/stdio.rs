//! Process stdio through containerd's Tasks API with the test's own fifos, as containerd's Go
//! client (`cio`) drives it (issue 7 items 3 and 4): the exec request decides the terminal,
//! and stdin lives until CloseIO, for init and exec processes, with and without a tty.

use std::path::Path;
use std::time::{Duration, Instant};

use containerd_client::types::v1::Status;
use rsandbox_integration::tasks::{
    self, Fifos, OutputReader, StdioPaths, TaskApi, write_and_detach,
};
use rsandbox_integration::*;

const NS: &str = "default";

type R = Result<(), String>;

/// Runs `body` with a fresh ID and scratch directory, then removes the container (whatever
/// happened) and checks that nothing is left.
async fn with_container<F>(name: &str, body: F)
where
    F: AsyncFnOnce(&mut TaskApi, &str, &Path) -> R,
{
    let g = Guard::new();
    let id = unique_id(name);
    let dir = scratch_dir(&id);
    let mut api = TaskApi::connect(NS).await;
    let res = {
        let _cleanup = CtrObjects {
            ns: NS,
            ids: vec![id.clone()],
        };
        body(&mut api, &id, &dir).await
    };
    expect_ok(&id, res);
    g.assert_clean(&[id]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A detached `sleep 300` task to exec into.
fn run_sleeper(id: &str) -> R {
    let o = ctr(
        NS,
        &[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            BUSYBOX,
            id,
            "sleep",
            "300",
        ],
    );
    ensure!(o.ok(), "ctr run -d sleep: {o:?}");
    Ok(())
}

/// The container's process spec with other `args` and `terminal`: what containerd's Go client
/// sends for `task.Exec(ctx, id, spec.Process, ...)` after editing the args.
async fn exec_spec(
    api: &mut TaskApi,
    id: &str,
    args: &[&str],
    terminal: bool,
) -> Result<serde_json::Value, String> {
    let spec = api.spec(id).await?;
    let mut process = spec["process"].clone();
    ensure!(process.is_object(), "spec of {id} has no process: {spec}");
    process["args"] = serde_json::json!(args);
    process["terminal"] = serde_json::json!(terminal);
    Ok(process)
}

/// Tasks.Wait, at most `limit`.
async fn wait_within(
    api: &mut TaskApi,
    id: &str,
    exec_id: &str,
    limit: Duration,
) -> Result<u32, String> {
    tokio::time::timeout(limit, api.wait(id, exec_id))
        .await
        .map_err(|_| format!("{id} {exec_id:?} did not exit within {limit:?}"))?
}

/// Issue 7 item 3: the request asks for a terminal, the process spec says `terminal: false`
/// (the Go client's `task.Exec(..., cio.WithTerminal)` reusing the container's process). The
/// request wins: the exec gets a pty, and all of 1 MiB of output comes through it.
#[tokio::test]
async fn exec_request_terminal_wins_over_the_spec() {
    with_container(
        "exec-tty-1m",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            run_sleeper(id)?;
            const SIZE: usize = 1 << 20;
            let script = format!("head -c {SIZE} /dev/zero | tr '\\0' x; exit 7");
            let process = exec_spec(api, id, &["sh", "-c", &script], false).await?;
            let fifos = Fifos::new(dir, "big");
            let reader =
                OutputReader::open(&fifos.stdout).map_err(|e| format!("open stdout: {e}"))?;
            let io = StdioPaths {
                stdout: fifos.paths(true).stdout,
                ..Default::default()
            };
            api.exec(id, "big", &process, &io, true).await?;
            let t = Instant::now();
            api.start(id, "big").await?;
            let status = wait_within(api, id, "big", Duration::from_secs(60)).await?;
            let (out, eof) = reader.finish(HANG);
            eprintln!(
                "1 MiB through the exec's pty: {:?}, {} bytes, exit {status}",
                t.elapsed(),
                out.len()
            );
            api.delete_exec(id, "big").await?;
            ensure!(status == 7, "exit status {status}, want 7");
            ensure!(
                out.len() == SIZE,
                "{} bytes of output, want {SIZE}",
                out.len()
            );
            ensure!(
                out.iter().all(|&b| b == b'x'),
                "output holds bytes other than 'x': {:?}",
                String::from_utf8_lossy(&out[..out.len().min(200)])
            );
            ensure!(eof, "no EOF on the stdout fifo after the exit");
            Ok(())
        },
    )
    .await;
}

/// How a detach/reattach test ends: what the process printed and its exit status.
struct Ended {
    out: String,
    status: u32,
}

/// Issue 7 item 4, the client's side: write a line into stdin and detach; 500 ms later the
/// process must still run; attach again, write a second line, detach, CloseIO; the process
/// (`cat`) ends.
async fn detach_reattach_close(
    api: &mut TaskApi,
    id: &str,
    exec_id: &str,
    fifos: &Fifos,
    reader: OutputReader,
) -> Result<Ended, String> {
    write_and_detach(&fifos.stdin, b"one\n").map_err(|e| format!("first write: {e}"))?;
    ensure!(
        reader.wait_for("one", 1, HANG),
        "the first line never came back: {:?}",
        String::from_utf8_lossy(&reader.so_far())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = api.get(id, exec_id).await?;
    ensure!(
        p.status == Status::Running as i32,
        "500 ms after the client detached the process is {:?} (exit {}): its stdin ended",
        Status::try_from(p.status),
        p.exit_status
    );
    write_and_detach(&fifos.stdin, b"two\n")
        .map_err(|e| format!("second write (reattach): {e}"))?;
    api.close_stdin(id, exec_id).await?;
    let status = wait_within(api, id, exec_id, HANG).await?;
    let (out, eof) = reader.finish(HANG);
    ensure!(eof, "no EOF on the stdout fifo after the exit");
    Ok(Ended {
        out: String::from_utf8_lossy(&out).into_owned(),
        status,
    })
}

/// The init of a container made with `ctr container create [-t] ... cat`, created through
/// Tasks.Create with the test's fifos and the snapshot's rootfs mounts, then started.
async fn create_cat_init(api: &mut TaskApi, id: &str, fifos: &Fifos, tty: bool) -> R {
    let mut args = vec!["container", "create", "--runtime", RUNTIME];
    if tty {
        args.push("-t");
    }
    args.extend([BUSYBOX, id, "cat"]);
    let o = ctr(NS, &args);
    ensure!(o.ok(), "ctr container create: {o:?}");
    let spec = api.spec(id).await?;
    ensure!(
        spec["process"]["terminal"].as_bool().unwrap_or(false) == tty,
        "spec terminal {:?}, want {tty}",
        spec["process"]["terminal"]
    );
    api.create(id, &fifos.paths(tty), tty).await?;
    api.start(id, "").await?;
    Ok(())
}

/// Checks a plain (no tty) `cat`: exactly both lines, exit 0.
fn plain_cat_ok(e: &Ended) -> R {
    ensure!(e.out == "one\ntwo\n", "cat printed {:?}", e.out);
    ensure!(e.status == 0, "cat exited {}", e.status);
    Ok(())
}

/// Checks a `cat` on a tty: each line is echoed by the terminal and printed by `cat`
/// (`\r\n` line ends), and the terminal's EOF (sent on CloseIO) ended it with 0.
fn tty_cat_ok(e: &Ended) -> R {
    for line in ["one\r\n", "two\r\n"] {
        ensure!(
            e.out.matches(line).count() == 2,
            "want {line:?} twice (echo and cat), got {:?}",
            e.out
        );
    }
    ensure!(
        e.status == 0,
        "cat exited {} (output {:?})",
        e.status,
        e.out
    );
    Ok(())
}

#[tokio::test]
async fn init_stdin_lives_until_close_io() {
    with_container(
        "init-stdin",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            let fifos = Fifos::new(dir, "init");
            let reader = OutputReader::open(&fifos.stdout).map_err(|e| e.to_string())?;
            create_cat_init(api, id, &fifos, false).await?;
            let ended = detach_reattach_close(api, id, "", &fifos, reader).await?;
            api.delete(id).await?;
            plain_cat_ok(&ended)
        },
    )
    .await;
}

#[tokio::test]
async fn init_tty_stdin_lives_until_close_io() {
    with_container(
        "init-tty-stdin",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            let fifos = Fifos::new(dir, "init");
            let reader = OutputReader::open(&fifos.stdout).map_err(|e| e.to_string())?;
            create_cat_init(api, id, &fifos, true).await?;
            let ended = detach_reattach_close(api, id, "", &fifos, reader).await?;
            api.delete(id).await?;
            tty_cat_ok(&ended)
        },
    )
    .await;
}

/// Registers and starts a `cat` exec with the test's fifos.
async fn start_cat_exec(api: &mut TaskApi, id: &str, exec_id: &str, fifos: &Fifos, tty: bool) -> R {
    // The spec's terminal follows the request here; the mismatch has its own test.
    let process = exec_spec(api, id, &["cat"], tty).await?;
    api.exec(id, exec_id, &process, &fifos.paths(tty), tty)
        .await?;
    api.start(id, exec_id).await?;
    Ok(())
}

#[tokio::test]
async fn exec_stdin_lives_until_close_io() {
    with_container(
        "exec-stdin",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            run_sleeper(id)?;
            let fifos = Fifos::new(dir, "cat");
            let reader = OutputReader::open(&fifos.stdout).map_err(|e| e.to_string())?;
            start_cat_exec(api, id, "cat", &fifos, false).await?;
            let ended = detach_reattach_close(api, id, "cat", &fifos, reader).await?;
            api.delete_exec(id, "cat").await?;
            plain_cat_ok(&ended)
        },
    )
    .await;
}

#[tokio::test]
async fn exec_tty_stdin_lives_until_close_io() {
    with_container(
        "exec-tty-stdin",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            run_sleeper(id)?;
            let fifos = Fifos::new(dir, "cat");
            let reader = OutputReader::open(&fifos.stdout).map_err(|e| e.to_string())?;
            start_cat_exec(api, id, "cat", &fifos, true).await?;
            let ended = detach_reattach_close(api, id, "cat", &fifos, reader).await?;
            api.delete_exec(id, "cat").await?;
            tty_cat_ok(&ended)
        },
    )
    .await;
}

/// The process label CRI would give a container (issue 37).
const LABEL: &str = "system_u:system_r:container_t:s0:c4,c811";
const MOUNT_LABEL: &str = "system_u:object_r:container_file_t:s0:c4,c811";
const RUNC_V2: &str = "io.containerd.runc.v2";

/// The runc that containerd's shims run on this bench.
fn real_runc() -> std::path::PathBuf {
    let ours = prefix().join("usr/bin/runc");
    if ours.exists() {
        ours
    } else {
        "/usr/sbin/runc".into()
    }
}

/// A runc in `dir` that blanks `process.selinuxLabel` and `linux.mountLabel` in the bundle's
/// config.json (runc create) and the process file (runc exec), logs its arguments to
/// `dir/runc.log`, then runs the real runc: the bench has no SELinux and runc would refuse the
/// labels, while the shim still sees them and takes the labelled path.
fn label_dropping_runc(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("runc");
    let script = format!(
        r#"#!/bin/sh
bundle= process= prev=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; --process|-p) process=$a ;; esac
  prev=$a
done
strip() {{ sed -i -e 's/"selinuxLabel": *"[^"]*"/"selinuxLabel":""/g' -e 's/"mountLabel": *"[^"]*"/"mountLabel":""/g' "$1"; }}
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then strip "$bundle/config.json"; fi
if [ -n "$process" ] && [ -f "$process" ]; then strip "$process"; fi
echo "$*" >> {log}
exec {real} "$@"
"#,
        log = dir.join("runc.log").display(),
        real = real_runc().display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Where `pid`'s fd `fd` points.
fn fd_target(pid: u32, fd: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_else(|e| format!("({e})"))
}

/// One probe of a container's stdio: the init prints, reads a line from stdin, prints it back
/// (stdout and stderr) and exits 7; while it waits for its line an exec does the same and exits
/// 5. Output, exit codes and stdin's EOF after CloseIO must arrive, for init and exec. With
/// `labelled`, the spec carries SELinux labels and runc is [`label_dropping_runc`].
async fn stdio_probe(api: &mut TaskApi, id: &str, dir: &Path, runtime: &str, labelled: bool) -> R {
    let o = ctr(
        NS,
        &[
            "container",
            "create",
            "--runtime",
            runtime,
            BUSYBOX,
            id,
            "sh",
            "-c",
            r#"echo started; read l; echo "in:$l"; echo err >&2; exit 7"#,
        ],
    );
    ensure!(o.ok(), "ctr container create: {o:?}");
    let mut options = None;
    if labelled {
        let mut spec = api.spec(id).await?;
        spec["process"]["selinuxLabel"] = serde_json::json!(LABEL);
        spec["linux"]["mountLabel"] = serde_json::json!(MOUNT_LABEL);
        api.set_spec(id, &spec).await?;
        options = Some(tasks::runc_binary_options(&label_dropping_runc(dir)));
    }
    let init = Fifos::new(dir, "init");
    let init_out = OutputReader::open(&init.stdout).map_err(|e| e.to_string())?;
    let init_err = OutputReader::open(&init.stderr).map_err(|e| e.to_string())?;
    let pid = api
        .create_with_options(id, &init.paths(false), false, options)
        .await?;
    api.start(id, "").await?;
    ensure!(
        init_out.wait_for("started", 1, HANG),
        "the init's first line never came: {:?}",
        String::from_utf8_lossy(&init_out.so_far())
    );
    // The runc handler and rsandbox's labelled path give the process a pipe, rsandbox's
    // unlabelled path the client's fifo itself (zero copy).
    let fd1 = fd_target(pid, 1);
    if runtime == RUNTIME && !labelled {
        ensure!(
            Path::new(&fd1) == init.stdout,
            "the unlabelled init's stdout is {fd1}"
        );
    } else {
        ensure!(fd1.starts_with("pipe:["), "the init's stdout is {fd1}");
    }

    let exec = Fifos::new(dir, "exec");
    let exec_out = OutputReader::open(&exec.stdout).map_err(|e| e.to_string())?;
    let exec_err = OutputReader::open(&exec.stderr).map_err(|e| e.to_string())?;
    let process = exec_spec(
        api,
        id,
        &[
            "sh",
            "-c",
            r#"read l; echo "exec:$l"; echo eerr >&2; exit 5"#,
        ],
        false,
    )
    .await?;
    ensure!(
        !labelled || process["selinuxLabel"] == LABEL,
        "the exec's spec has no label: {process}"
    );
    api.exec(id, "e1", &process, &exec.paths(false), false)
        .await?;
    api.start(id, "e1").await?;
    write_and_detach(&exec.stdin, b"x\n").map_err(|e| format!("exec stdin: {e}"))?;
    api.close_stdin(id, "e1").await?;
    let status = wait_within(api, id, "e1", HANG).await?;
    let (out, out_eof) = exec_out.finish(HANG);
    let (err, err_eof) = exec_err.finish(HANG);
    ensure!(
        (status, out.as_slice(), err.as_slice(), out_eof, err_eof)
            == (5, b"exec:x\n".as_slice(), b"eerr\n".as_slice(), true, true),
        "exec: status {status}, stdout {:?} (EOF {out_eof}), stderr {:?} (EOF {err_eof})",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
    api.delete_exec(id, "e1").await?;

    write_and_detach(&init.stdin, b"hi\n").map_err(|e| format!("init stdin: {e}"))?;
    api.close_stdin(id, "").await?;
    let status = wait_within(api, id, "", HANG).await?;
    let (out, out_eof) = init_out.finish(HANG);
    let (err, err_eof) = init_err.finish(HANG);
    ensure!(
        (status, out.as_slice(), err.as_slice(), out_eof, err_eof)
            == (
                7,
                b"started\nin:hi\n".as_slice(),
                b"err\n".as_slice(),
                true,
                true
            ),
        "init: status {status}, stdout {:?} (EOF {out_eof}), stderr {:?} (EOF {err_eof})",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
    api.delete(id).await?;
    if labelled {
        let log = std::fs::read_to_string(dir.join("runc.log")).unwrap_or_default();
        ensure!(
            log.lines()
                .any(|l| l.contains(" create ") || l.starts_with("create"))
                && log
                    .lines()
                    .any(|l| l.contains(" exec ") || l.starts_with("exec")),
            "the label-dropping runc did not run create and exec: {log}"
        );
    }
    Ok(())
}

/// Issue 37: a labelled container and exec on rsandbox get their stdio through the shim's pipes
/// (the spec's labels reach the shim; runc, on this bench without SELinux, gets them blanked):
/// output, exit codes and stdin's EOF arrive as on the runc handler, probed the same way, and
/// as on rsandbox's unlabelled (zero-copy) path.
#[tokio::test]
async fn a_labelled_container_and_exec_get_their_stdio_through_the_shims_pipes() {
    with_container(
        "stdio-runc",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            stdio_probe(api, id, dir, RUNC_V2, false).await
        },
    )
    .await;
    with_container(
        "stdio-label",
        async |api: &mut TaskApi, id: &str, dir: &Path| {
            stdio_probe(api, id, dir, RUNTIME, true).await
        },
    )
    .await;
}
