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
