//! `unit` against the fake systemd (src/host/systemd/fake.rs): the calls it makes, with the
//! member names and signatures of org.freedesktop.systemd1(5), and what it prints.

use std::time::{Duration, Instant};

use super::*;
use crate::host::systemd::conn::Conn;
use crate::host::systemd::fake::*;
use crate::host::systemd::wire::{Message, Value};

const JOB: &str = "/org/freedesktop/systemd1/job/7";
const UNIT_PATH: &str = "/org/freedesktop/systemd1/unit/containerd_2eservice";

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn manager(fake: &FakeSystemd) -> Manager {
    Manager::from_direct_conn(Conn::connect(&fake.path, soon()).unwrap(), None)
}

/// (member, signature, the body's strings) of each call, for comparing.
fn summary(calls: &[Message]) -> Vec<(String, String, Vec<String>)> {
    calls
        .iter()
        .map(|c| {
            let strs = c
                .body()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            (c.member.clone().unwrap(), c.signature.clone(), strs)
        })
        .collect()
}

/// A systemd with containerd.service loaded: `props` answers Properties.Get.
fn loaded(props: fn(&str) -> Value) -> Script {
    Box::new(move |call| match call.member.as_deref() {
        Some("GetUnit") => vec![reply(call, &[Value::ObjectPath(UNIT_PATH.into())])],
        Some("Get") => vec![reply(
            call,
            &[Value::Variant(Box::new(props(&arg(call, 1))))],
        )],
        Some("RestartUnit") => vec![
            reply(call, &[Value::ObjectPath(JOB.into())]),
            noise(),
            job_removed(7, JOB, &arg(call, 0), "done"),
        ],
        _ => vec![reply(call, &[])],
    })
}

#[test]
fn the_systemctl_forms_the_installer_uses_parse() {
    let inv = |s: &str| Invocation::parse(&args(s)).map(|i| i.command);
    assert_eq!(
        inv("show --property MainPID --value containerd.service"),
        Ok(Command::MainPid("containerd.service".into()))
    );
    assert_eq!(
        inv("show -p MainPID --value x.service"),
        Ok(Command::MainPid("x.service".into()))
    );
    assert_eq!(
        inv("show --property LoadState --value nodeadm-config.service"),
        Ok(Command::LoadState("nodeadm-config.service".into()))
    );
    assert_eq!(
        inv("is-active --quiet c.service"),
        Ok(Command::IsActive {
            unit: "c.service".into(),
            quiet: true
        })
    );
    assert_eq!(
        inv("restart --no-block c.service"),
        Ok(Command::Restart {
            unit: "c.service".into(),
            wait: false
        })
    );
    assert_eq!(
        inv("reset-failed c.service"),
        Ok(Command::ResetFailed("c.service".into()))
    );
    assert_eq!(
        inv(
            "run -host-root /host -output-dir /var/lib/x -- /usr/bin/containerd --config /c config dump"
        ),
        Ok(Command::Run {
            host_root: "/host".into(),
            output_dir: "/var/lib/x".into(),
            argv: args("/usr/bin/containerd --config /c config dump"),
        })
    );
    let i = Invocation::parse(&args("-socket /p -timeout 5 reset-failed u")).unwrap();
    assert_eq!(
        (i.socket, i.timeout),
        (Some("/p".into()), Duration::from_secs(5))
    );
    for bad in [
        "",
        "stop c.service",
        "show --property ActiveState --value c",
        "show --property MainPID c",
        "show --property LoadState c",
        "show --property LoadState --value",
        "restart",
        "restart a b",
        "restart --now c",
        "run -output-dir rel -- x",
        "run -output-dir /d x",
        "run -output-dir /d --",
        "run -- x",
        "-timeout 0 restart c",
        "-bogus restart c",
    ] {
        assert!(
            Invocation::parse(&args(bad)).is_err(),
            "{bad:?} was accepted"
        );
    }
}

#[test]
fn main_pid_and_is_active_read_the_units_properties() {
    let fake = FakeSystemd::serve(
        1,
        loaded(|p| match p {
            "MainPID" => Value::U32(4242),
            _ => Value::Str("activating".into()),
        }),
    );
    let mut m = manager(&fake);
    let out = execute(
        &mut m,
        &Command::MainPid("containerd.service".into()),
        soon(),
    )
    .unwrap();
    assert_eq!((out.stdout, out.code), (b"4242\n".to_vec(), 0));
    let is_active = Command::IsActive {
        unit: "containerd.service".into(),
        quiet: false,
    };
    let out = execute(&mut m, &is_active, soon()).unwrap();
    assert_eq!(
        (out.stdout, out.code),
        (b"activating\n".to_vec(), EXIT_NOT_ACTIVE)
    );
    drop(m);
    let calls = summary(&fake.finish());
    let want = |member: &str, sig: &str, s: &[&str]| {
        (
            member.to_string(),
            sig.to_string(),
            s.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        calls,
        vec![
            want("GetUnit", "s", &["containerd.service"]),
            want(
                "Get",
                "ss",
                &["org.freedesktop.systemd1.Service", "MainPID"]
            ),
            want("GetUnit", "s", &["containerd.service"]),
            want(
                "Get",
                "ss",
                &["org.freedesktop.systemd1.Unit", "ActiveState"]
            ),
        ]
    );
}

#[test]
fn a_unit_systemd_has_not_loaded_is_inactive_with_no_main_pid() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| {
            vec![error(
                call,
                "org.freedesktop.systemd1.NoSuchUnit",
                "Unit x not loaded.",
            )]
        }),
    );
    let mut m = manager(&fake);
    let out = execute(&mut m, &Command::MainPid("x.service".into()), soon()).unwrap();
    assert_eq!(out.stdout, b"0\n");
    let out = execute(
        &mut m,
        &Command::IsActive {
            unit: "x.service".into(),
            quiet: true,
        },
        soon(),
    )
    .unwrap();
    assert_eq!((out.stdout, out.code), (Vec::new(), EXIT_NOT_ACTIVE));
}

#[test]
fn restart_waits_for_its_job_unless_no_block() {
    let fake = FakeSystemd::serve(1, loaded(|_| Value::Str("active".into())));
    let mut m = manager(&fake);
    let restart = |wait| Command::Restart {
        unit: "containerd.service".into(),
        wait,
    };
    assert_eq!(execute(&mut m, &restart(true), soon()).unwrap().code, 0);
    assert_eq!(execute(&mut m, &restart(false), soon()).unwrap().code, 0);
    drop(m);
    let calls = summary(&fake.finish());
    assert_eq!(calls.len(), 2);
    for c in calls {
        assert_eq!(
            c,
            (
                "RestartUnit".into(),
                "ss".into(),
                args("containerd.service replace")
            )
        );
    }
}

#[test]
fn a_failed_restart_job_is_an_error() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| {
            vec![
                reply(call, &[Value::ObjectPath(JOB.into())]),
                job_removed(7, JOB, &arg(call, 0), "failed"),
            ]
        }),
    );
    let mut m = manager(&fake);
    let e = execute(
        &mut m,
        &Command::Restart {
            unit: "c.service".into(),
            wait: true,
        },
        soon(),
    )
    .unwrap_err();
    assert!(
        matches!(e, SystemdError::JobFailed { ref result, .. } if result == "failed"),
        "{e}"
    );
}

/// systemd running a oneshot service: the start job's result by the command's exit status
/// (`failed` when it is not 0), the unit kept (RemainAfterExit) with ExecMainCode/Status, the
/// command's output written into StandardOutputFile/StandardErrorFile (here: by the fake).
fn runs_command(code: i32, status: i32) -> Script {
    Box::new(move |call| match call.member.as_deref() {
        Some("StartTransientUnit") => {
            let body = call.body().unwrap();
            let Value::Array(_, props) = &body[2] else {
                panic!("properties")
            };
            let prop = |name: &str| {
                props.iter().find_map(|p| match p {
                    Value::Struct(f) if f[0].as_str() == Some(name) => Some(f[1].clone()),
                    _ => None,
                })
            };
            for (file, text) in [
                ("StandardOutputFile", "out text\n"),
                ("StandardErrorFile", "err text\n"),
            ] {
                let Some(Value::Variant(v)) = prop(file) else {
                    panic!("no {file}")
                };
                std::fs::write(v.as_str().unwrap(), text).unwrap();
            }
            let result = if code == 1 && status == 0 {
                "done"
            } else {
                "failed"
            };
            vec![
                reply(call, &[Value::ObjectPath(JOB.into())]),
                job_removed(7, JOB, &arg(call, 0), result),
            ]
        }
        Some("GetUnit") => vec![reply(call, &[Value::ObjectPath(UNIT_PATH.into())])],
        Some("Get") => {
            let v = if arg(call, 1) == "ExecMainCode" {
                code
            } else {
                status
            };
            vec![reply(call, &[Value::Variant(Box::new(Value::I32(v)))])]
        }
        Some("StopUnit") => vec![
            reply(call, &[Value::ObjectPath(JOB.into())]),
            job_removed(7, JOB, &arg(call, 0), "done"),
        ],
        _ => vec![reply(call, &[])],
    })
}

fn run_in(dir: &std::path::Path, code: i32, status: i32) -> (Outcome, Vec<Message>) {
    let fake = FakeSystemd::serve(1, runs_command(code, status));
    let mut m = manager(&fake);
    let cmd = Command::Run {
        host_root: "/".into(),
        output_dir: dir.join("run").to_str().unwrap().into(),
        argv: args("/usr/bin/containerd --config /etc/containerd/config.toml config dump"),
    };
    let out = execute(&mut m, &cmd, soon()).unwrap();
    drop(m);
    (out, fake.finish())
}

#[test]
fn run_passes_the_commands_output_and_exit_status_through() {
    let dir = tempfile::tempdir().unwrap();
    for (code, status, want) in [(1, 0, 0), (1, 2, 2), (2, 9, 137)] {
        let (out, calls) = run_in(dir.path(), code, status);
        assert_eq!(
            (out.stdout, out.stderr, out.code),
            (b"out text\n".to_vec(), b"err text\n".to_vec(), want),
            "ExecMainCode {code}, ExecMainStatus {status}"
        );
        let members: Vec<_> = calls.iter().map(|c| c.member.clone().unwrap()).collect();
        assert_eq!(
            members,
            [
                "StartTransientUnit",
                "GetUnit",
                "Get",
                "GetUnit",
                "Get",
                "StopUnit",
                "ResetFailedUnit"
            ]
        );
        let start = &calls[0];
        assert_eq!(start.signature, "ssa(sv)a(sa(sv))");
        let body = start.body().unwrap();
        let name = body[0].as_str().unwrap();
        assert!(
            name.starts_with("rsandbox-node-run-") && name.ends_with(".service"),
            "{name}"
        );
        let Value::Array(_, props) = &body[2] else {
            panic!()
        };
        let names: Vec<_> = props
            .iter()
            .map(|p| match p {
                Value::Struct(f) => (
                    f[0].as_str().unwrap().to_string(),
                    match &f[1] {
                        Value::Variant(v) => v.signature(),
                        _ => panic!(),
                    },
                ),
                _ => panic!(),
            })
            .collect();
        let want: Vec<(String, String)> = [
            ("Description", "s"),
            ("Type", "s"),
            ("RemainAfterExit", "b"),
            ("StandardOutputFile", "s"),
            ("StandardErrorFile", "s"),
            ("ExecStart", "a(sasb)"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(names, want);
        // the files are gone once read
        assert_eq!(
            std::fs::read_dir(dir.path().join("run")).unwrap().count(),
            0
        );
        // the stop and the reset are of the same transient unit
        assert_eq!(calls[5].body().unwrap()[0].as_str(), Some(name));
        assert_eq!(calls[6].body().unwrap()[0].as_str(), Some(name));
    }
}

/// `show --property LoadState --value`, as deploy/node/lib/distro.sh's unit_known asks it of
/// nodeadm's units: the unit is loaded first (LoadUnit), as systemctl does, so a oneshot that
/// ran at boot and was unloaded is still found `loaded`; a unit with no file is `not-found`.
#[test]
fn load_state_loads_the_unit_first() {
    let fake = FakeSystemd::serve(
        1,
        Box::new(|call| match call.member.as_deref() {
            Some("LoadUnit") => vec![reply(
                call,
                &[Value::ObjectPath(format!(
                    "/org/freedesktop/systemd1/unit/{}",
                    arg(call, 0).replace(['-', '.'], "_")
                ))],
            )],
            Some("Get") => vec![reply(
                call,
                &[Value::Variant(Box::new(Value::Str(
                    if call.path.as_deref().unwrap_or_default().contains("nodeadm") {
                        "loaded"
                    } else {
                        "not-found"
                    }
                    .into(),
                )))],
            )],
            _ => vec![error(
                call,
                "org.freedesktop.systemd1.NoSuchUnit",
                "GetUnit is not how a load state is read",
            )],
        }),
    );
    let mut m = manager(&fake);
    let state = |m: &mut Manager, u: &str| {
        execute(m, &Command::LoadState(u.into()), soon())
            .unwrap()
            .stdout
    };
    assert_eq!(state(&mut m, "nodeadm-config.service"), b"loaded\n");
    assert_eq!(state(&mut m, "crio.service"), b"not-found\n");
    drop(m);
    let calls = summary(&fake.finish());
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["LoadUnit", "Get", "LoadUnit", "Get"]
    );
    assert_eq!(calls[1].2, ["org.freedesktop.systemd1.Unit", "LoadState"]);
}
