//! CloseIO, and a Delete whose exit is held.

use super::*;

/// A fifo `name` in the fixture's directory.
fn fifo(f: &Fixture, name: &str) -> std::path::PathBuf {
    let fifo = f.dir.path().join(name);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    fifo
}

/// Registers exec `exec_id` of `id`, a `cat` whose stdin is `stdin`.
fn exec_reading(f: &Fixture, id: &str, exec_id: &str, stdin: &Path) -> ttrpc::Result<Empty> {
    f.svc.exec(
        &ctx(),
        ExecProcessRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            stdin: stdin.display().to_string(),
            spec: process_spec(br#"{"args":["cat"],"cwd":"/"}"#),
            ..Default::default()
        },
    )
}

#[test]
fn close_io_before_start_closes_stdin_as_soon_as_it_exists() {
    let f = fixture();
    running(&f, "t1");
    let fifo = fifo(&f, "stdin");
    let exec = |exec_id: &str| exec_reading(&f, "t1", exec_id, &fifo);
    let close_io = |exec_id: &str| {
        f.svc.close_io(
            &ctx(),
            CloseIORequest {
                id: "t1".into(),
                exec_id: exec_id.into(),
                stdin: true,
                ..Default::default()
            },
        )
    };
    // `echo x | ctr task exec`: the client's stdin ends (CloseIO) before Start ran.
    exec("early").unwrap();
    close_io("early").unwrap();
    f.start("t1", "early").unwrap();
    let (_, p) = f.tm.process("t1", "early").unwrap();
    assert!(
        !p.holds_stdin(),
        "an earlier CloseIO must close stdin at once"
    );

    // The usual order: the shim holds stdin until CloseIO.
    exec("late").unwrap();
    f.start("t1", "late").unwrap();
    let (_, p) = f.tm.process("t1", "late").unwrap();
    assert!(p.holds_stdin());
    close_io("late").unwrap();
    assert!(!p.holds_stdin());
}

#[test]
fn close_io_during_an_exec_start_still_ends_its_stdin() {
    // `ctr task exec` calls CloseIO as soon as its stdin reaches EOF, which can be while Start
    // still runs `runc exec`: the shim's stdin writer must not outlive that CloseIO.
    let f = fixture();
    running(&f, "t1");
    let fifo = fifo(&f, "e1-stdin");
    exec_reading(&f, "t1", "e1", &fifo).unwrap();
    let tm = f.tm.clone();
    *f.host.runtime.on_exec.lock().unwrap() = Some(Box::new(move || {
        tm.close_io("t1", "e1", true).unwrap();
    }));
    f.start("t1", "e1").unwrap();
    let io = f.host.runtime.exec_io.lock().unwrap().pop().unwrap();
    let stdin = std::fs::File::from(io.stdin.expect("the exec got a stdin"));
    let flags = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
    let mut buf = [0u8; 8];
    let r = std::io::Read::read(&mut &stdin, &mut buf);
    assert_eq!(
        r.map_err(|e| e.kind()),
        Ok(0),
        "the process must read EOF: no client holds the fifo and CloseIO came"
    );
}

#[test]
fn deleting_a_container_whose_exit_is_held_publishes_it_first() {
    let f = fixture();
    let init = running(&f, "t1");
    f.exec("t1", "e1").unwrap();
    f.start("t1", "e1").unwrap();
    // The init ended, but its exit waits for its exec's (which never came: a pod torn down
    // right now). Delete must not be refused, and TaskExit still precedes TaskDelete.
    f.exit(init, 137);
    assert_eq!(
        f.tm.state("t1", "").unwrap().status,
        crate::task::Status::Running
    );
    f.delete("t1", "").unwrap();
    let topics = f.events.topics();
    assert_eq!(
        &topics[topics.len() - 2..],
        ["/tasks/exit", "/tasks/delete"]
    );
    assert!(f.tm.is_empty());
}

/// A process label as CRI sets it (after the pod's relabel, see `pod::mcs_level`).
const LABEL: &str = "system_u:system_r:container_t:s0:c4,c811";

/// The client's fifo `path` opened for reading, non-blocking, as containerd's cio does.
fn client_reader(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
}

/// What the process was given as `fd`: a pipe of the shim's, or the client's fifo at `fifo`.
#[derive(Debug, PartialEq)]
enum Given {
    ShimPipe,
    ClientFifo,
}

fn given(fd: &std::os::fd::OwnedFd, fifo: &Path) -> Given {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let ino = nix::sys::stat::fstat(fd).unwrap().st_ino;
    if ino == std::fs::metadata(fifo).unwrap().ino() {
        return Given::ClientFifo;
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().starts_with("pipe:["), "{link:?}");
    Given::ShimPipe
}

/// (id, status) of every TaskExit published so far.
fn exits(f: &Fixture) -> Vec<(String, u32)> {
    f.events
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            crate::shim::events::Event::Exit(x) => Some((x.id.clone(), x.exit_status)),
            _ => None,
        })
        .collect()
}

/// Issue 37: under SELinux a labelled process (`container_t`) may not write containerd's fifos.
/// A container or exec with `process.selinuxLabel` gets the shim's pipes, the runtime never
/// sees the client's fifos, and the output still reaches them; an unlabelled exec keeps the
/// fifos (zero copy).
#[test]
fn a_labelled_process_gets_the_shims_pipes_and_its_exit_waits_for_its_output() {
    let f = fixture();
    let spec = SPEC.replace(
        r#""terminal":false"#,
        &format!(r#""terminal":false,"selinuxLabel":"{LABEL}""#),
    );
    let bundle = f.bundle("t1", &spec);
    let (stdin, stdout) = (fifo(&f, "t1-in"), fifo(&f, "t1-out"));
    let reader = client_reader(&stdout);
    let pid = f
        .svc
        .create(
            &ctx(),
            CreateTaskRequest {
                stdin: stdin.display().to_string(),
                stdout: stdout.display().to_string(),
                ..create_req("t1", &bundle)
            },
        )
        .unwrap()
        .pid;
    let io = f.host.runtime.create_io.lock().unwrap().pop().unwrap();
    assert_eq!(given(io.stdin.as_ref().unwrap(), &stdin), Given::ShimPipe);
    let out = io.stdout.unwrap();
    assert_eq!(given(&out, &stdout), Given::ShimPipe);
    f.start("t1", "").unwrap();

    // A labelled exec, and one naming no label: runc runs that one under the container's
    // label (libcontainer's newInitConfig), so it gets the shim's pipes too.
    for (exec_id, label, want) in [
        (
            "labelled",
            format!(r#","selinuxLabel":"{LABEL}""#),
            Given::ShimPipe,
        ),
        ("plain", String::new(), Given::ShimPipe),
    ] {
        let out = fifo(&f, &format!("{exec_id}-out"));
        let _reader = client_reader(&out);
        let spec = format!(r#"{{"args":["true"],"cwd":"/"{label}}}"#);
        f.svc
            .exec(
                &ctx(),
                ExecProcessRequest {
                    id: "t1".into(),
                    exec_id: exec_id.into(),
                    stdout: out.display().to_string(),
                    spec: process_spec(spec.as_bytes()),
                    ..Default::default()
                },
            )
            .unwrap();
        f.start("t1", exec_id).unwrap();
        let io = f.host.runtime.exec_io.lock().unwrap().pop().unwrap();
        assert_eq!(given(io.stdout.as_ref().unwrap(), &out), want, "{exec_id}");
    }

    // The init writes, exits, and a child of it keeps writing to its stdout: TaskExit waits
    // for the copier, which delivers the output and gives up on the child at DRAIN_LIMIT (1 s:
    // a margin no scheduling delay of this thread comes near).
    let child = std::fs::File::from(out.try_clone().unwrap());
    std::io::Write::write_all(&mut std::fs::File::from(out), b"hello\n").unwrap();
    let child = std::thread::spawn(move || {
        // Until the copier closes the pipe (EPIPE).
        while std::io::Write::write_all(&mut &child, b".").is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    });
    for exec_id in ["labelled", "plain"] {
        let (_, p) = f.tm.process("t1", exec_id).unwrap();
        let pid = p.state().pid();
        f.exit(pid as u32, 0);
    }
    let told = std::time::Instant::now();
    f.exit(pid, 3);
    assert!(
        exits(&f).iter().all(|(id, _)| id != "t1"),
        "the init's TaskExit went out before its output was delivered"
    );
    let end = told + std::time::Duration::from_secs(3);
    while !exits(&f).contains(&("t1".to_string(), 3)) {
        assert!(
            std::time::Instant::now() < end,
            "the init's TaskExit never came"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(told.elapsed() >= crate::task::stdio::DRAIN_LIMIT / 2);
    assert_eq!(exits(&f).len(), 3);
    child.join().unwrap();
    // Everything the copier took is in the fifo, and then EOF (the copier's end is closed).
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(&mut &reader, &mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no EOF once the copier is done: {e}"),
        }
    }
    assert!(
        got.starts_with(b"hello\n."),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        f.tm.state("t1", "").unwrap().status,
        crate::task::Status::Stopped
    );
}

/// Where SELinux gives no label (a privileged container, a node without SELinux), a container
/// and its execs keep the client's fifos: no copy.
#[test]
fn an_unlabelled_container_and_its_execs_keep_the_client_fifos() {
    let f = fixture();
    let bundle = f.bundle("t2", SPEC);
    let stdout = fifo(&f, "t2-out");
    let _reader = client_reader(&stdout);
    f.svc
        .create(
            &ctx(),
            CreateTaskRequest {
                stdout: stdout.display().to_string(),
                ..create_req("t2", &bundle)
            },
        )
        .unwrap();
    let io = f.host.runtime.create_io.lock().unwrap().pop().unwrap();
    assert_eq!(
        given(io.stdout.as_ref().unwrap(), &stdout),
        Given::ClientFifo
    );
    f.start("t2", "").unwrap();
    let out = fifo(&f, "e-out");
    let _exec_reader = client_reader(&out);
    f.svc
        .exec(
            &ctx(),
            ExecProcessRequest {
                id: "t2".into(),
                exec_id: "e".into(),
                stdout: out.display().to_string(),
                spec: process_spec(br#"{"args":["true"],"cwd":"/"}"#),
                ..Default::default()
            },
        )
        .unwrap();
    f.start("t2", "e").unwrap();
    let io = f.host.runtime.exec_io.lock().unwrap().pop().unwrap();
    assert_eq!(given(io.stdout.as_ref().unwrap(), &out), Given::ClientFifo);
}
