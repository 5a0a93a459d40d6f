//! End-to-end tests of ADD/DEL/CHECK against fake shell-script plugins run with [`StdExec`].

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::std_exec::StdExec;
use super::*;

const TEST_PATH_ENV: &str = "/usr/bin:/bin";

/// A temp world: bin dir with fake plugins, a log dir they write to, a cache dir.
struct World {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    log: PathBuf,
    cache_dir: PathBuf,
    cni: Cni,
}

impl World {
    fn new() -> Self {
        Self::with_timeout(Duration::from_secs(20))
    }

    fn with_timeout(timeout: Duration) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let log = tmp.path().join("log");
        let cache_dir = tmp.path().join("cache");
        fs::create_dir_all(&bin).unwrap();
        fs::create_dir_all(&log).unwrap();
        let settings = CniSettings {
            conf_dir: tmp.path().join("net.d"),
            bin_dirs: vec![tmp.path().join("empty-bin"), bin.clone()],
            cache_dir: cache_dir.clone(),
            ifname: "eth0".into(),
            timeout,
            path_env: TEST_PATH_ENV.into(),
        };
        World {
            cni: Cni::new(settings, Arc::new(StdExec)),
            _tmp: tmp,
            bin,
            log,
            cache_dir,
        }
    }

    /// Installs fake plugin `name`. Per command it records the call order, its exact
    /// environment and stdin; then behaves as the control files `<name>.<CMD>.{sleep,out,rc}`
    /// in the log dir say.
    fn plugin(&self, name: &str) {
        let d = self.log.display();
        let script = format!(
            r#"#!/bin/sh
d='{d}'
n='{name}'
c="$CNI_COMMAND"
echo "$n $c" >> "$d/calls"
tr '\0' '\n' < /proc/$$/environ > "$d/$n.$c.env"
cat > "$d/$n.$c.stdin"
if [ -f "$d/$n.$c.sleep" ]; then exec sleep "$(cat "$d/$n.$c.sleep")"; fi
if [ -f "$d/$n.$c.out" ]; then cat "$d/$n.$c.out"; fi
if [ -f "$d/$n.$c.err" ]; then cat "$d/$n.$c.err" >&2; fi
if [ -f "$d/$n.$c.rc" ]; then exit "$(cat "$d/$n.$c.rc")"; fi
exit 0
"#
        );
        let p = self.bin.join(name);
        let tmp = self.bin.join(format!(".{name}.tmp"));
        fs::write(&tmp, script).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, &p).unwrap();
    }

    fn set(&self, name: &str, cmd: &str, what: &str, content: &str) {
        fs::write(self.log.join(format!("{name}.{cmd}.{what}")), content).unwrap();
    }

    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.log.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn stdin(&self, name: &str, cmd: &str) -> Value {
        let data = fs::read(self.log.join(format!("{name}.{cmd}.stdin"))).unwrap();
        serde_json::from_slice(&data).unwrap()
    }

    fn env(&self, name: &str, cmd: &str) -> BTreeMap<String, String> {
        fs::read_to_string(self.log.join(format!("{name}.{cmd}.env")))
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    fn cache_file(&self, net: &str, cid: &str) -> PathBuf {
        self.cache_dir
            .join("results")
            .join(format!("{net}-{cid}-eth0"))
    }
}

fn result_json(ip: &str, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0",
           "interfaces":[{{"name":"cni0"}},{{"name":"eth0","sandbox":"/run/netns/x"}}],
           "ips":[{{"address":"{ip}","gateway":"10.22.0.1","interface":1}}],
           "routes":[{{"dst":"0.0.0.0/0"}}],
           "dns":{{}}{extra}}}"#
    )
}

fn conflist(version: &str, extra_top: &str, plugins: &str) -> NetworkConfig {
    NetworkConfig::from_conflist_bytes(
        format!(r#"{{"cniVersion":"{version}","name":"podnet"{extra_top},"plugins":[{plugins}]}}"#)
            .as_bytes(),
        "test",
    )
    .unwrap()
}

fn three_plugins() -> NetworkConfig {
    conflist(
        "1.0.0",
        "",
        r#"{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.22.0.0/16"}},
           {"type":"tuning","sysctl":{"net.core.somaxconn":"500"}},
           {"type":"portmap","capabilities":{"portMappings":true}}"#,
    )
}

fn three_plugin_world() -> World {
    let w = World::new();
    for p in ["bridge", "tuning", "portmap"] {
        w.plugin(p);
    }
    w.set("bridge", "ADD", "out", &result_json("10.22.0.5/16", ""));
    w.set(
        "tuning",
        "ADD",
        "out",
        &result_json("10.22.0.5/16", r#","tuned":true"#),
    );
    w.set(
        "portmap",
        "ADD",
        "out",
        &result_json("10.22.0.5/16", r#","tuned":true,"mapped":1"#),
    );
    w
}

#[test]
fn add_runs_in_order_and_chains_prev_result() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox1", "");
    let res = w.cni.add(&net, &rt).unwrap();

    assert_eq!(w.calls(), vec!["bridge ADD", "tuning ADD", "portmap ADD"]);
    let s1 = w.stdin("bridge", "ADD");
    assert_eq!(s1["name"], "podnet");
    assert_eq!(s1["cniVersion"], "1.0.0");
    assert_eq!(s1["bridge"], "cni0");
    assert_eq!(s1["ipam"]["subnet"], "10.22.0.0/16");
    assert!(s1.get("prevResult").is_none(), "{s1}");
    assert!(s1.get("runtimeConfig").is_none(), "{s1}");

    let s2 = w.stdin("tuning", "ADD");
    assert_eq!(s2["prevResult"]["ips"][0]["address"], "10.22.0.5/16");
    assert!(s2["prevResult"].get("tuned").is_none());
    assert_eq!(s2["sysctl"]["net.core.somaxconn"], "500");
    let s3 = w.stdin("portmap", "ADD");
    assert_eq!(s3["prevResult"]["tuned"], true);
    assert!(s3["prevResult"].get("mapped").is_none());

    // the final result is the last plugin's, typed and raw
    assert_eq!(res.raw()["mapped"], 1);
    assert_eq!(
        res.sandbox_addrs("eth0"),
        vec!["10.22.0.5".parse::<std::net::IpAddr>().unwrap()]
    );

    // cached like libcni
    let cached: Value =
        serde_json::from_slice(&fs::read(w.cache_file("podnet", "sandbox1")).unwrap()).unwrap();
    assert_eq!(cached["kind"], "cniCacheV1");
    assert_eq!(cached["result"]["mapped"], 1);
    assert_eq!(cached["networkName"], "podnet");
    let e = w
        .cni
        .cache()
        .read("podnet", "sandbox1", "eth0")
        .unwrap()
        .unwrap();
    assert_eq!(e.config, net.bytes);
    assert_eq!(w.cni.cached_result(&net, &rt).unwrap().unwrap(), res);
}

#[test]
fn only_declared_capabilities_reach_runtime_config() {
    let w = World::new();
    w.plugin("bridge");
    w.plugin("portmap");
    w.set("bridge", "ADD", "out", &result_json("10.22.0.6/16", ""));
    w.set("portmap", "ADD", "out", &result_json("10.22.0.6/16", ""));
    let net = conflist(
        "1.0.0",
        "",
        r#"{"type":"bridge"},
           {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false,"mac":true},
            "runtimeConfig":{"static":1}}"#,
    );
    let ports = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let rt = w
        .cni
        .runtime_conf("sandbox2", "")
        .with_capability("portMappings", ports.clone())
        .with_capability("bandwidth", json!({"ingressRate": 1000}))
        .with_capability("dns", json!({"servers": ["1.1.1.1"]}));
    w.cni.add(&net, &rt).unwrap();
    // bridge declares nothing → no runtimeConfig at all
    assert!(w.stdin("bridge", "ADD").get("runtimeConfig").is_none());
    // portmap: only portMappings (bandwidth is declared false, dns undeclared, mac not given)
    assert_eq!(
        w.stdin("portmap", "ADD")["runtimeConfig"],
        json!({"portMappings": ports})
    );
    // and they are cached for later
    let e = w
        .cni
        .cache()
        .read("podnet", "sandbox2", "eth0")
        .unwrap()
        .unwrap();
    assert_eq!(e.capability_args["dns"], json!({"servers": ["1.1.1.1"]}));
}

#[test]
fn env_is_exactly_cni_vars_and_path() {
    let w = three_plugin_world();
    let net = three_plugins();
    let netns = w._tmp.path().join("netns");
    fs::write(&netns, "").unwrap();
    let rt = w
        .cni
        .runtime_conf("sandbox3", netns.to_str().unwrap())
        .with_pod(&PodArgs {
            namespace: "kube-system".into(),
            name: "coredns-abc".into(),
            infra_container_id: "sandbox3".into(),
            uid: "1234-5678".into(),
        });
    w.cni.add(&net, &rt).unwrap();
    let env = w.env("tuning", "ADD");
    let expected: BTreeMap<String, String> = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "sandbox3"),
        ("CNI_NETNS", netns.to_str().unwrap()),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-abc;\
             K8S_POD_INFRA_CONTAINER_ID=sandbox3;K8S_POD_UID=1234-5678",
        ),
        (
            "CNI_PATH",
            &format!(
                "{}:{}",
                w._tmp.path().join("empty-bin").display(),
                w.bin.display()
            ),
        ),
        ("PATH", TEST_PATH_ENV),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(env, expected);
    w.cni.del(&net, &rt).unwrap();
    assert_eq!(w.env("bridge", "DEL")["CNI_COMMAND"], "DEL");
    assert_eq!(w.env("bridge", "DEL")["CNI_NETNS"], netns.to_str().unwrap());
}

#[test]
fn cni_args_formatting() {
    assert_eq!(format_cni_args(&[]).unwrap(), "");
    let rt = RuntimeConf::new("c", "", "eth0").with_pod(&PodArgs {
        namespace: "ns".into(),
        name: "p".into(),
        infra_container_id: "c".into(),
        uid: "u".into(),
    });
    assert_eq!(
        format_cni_args(&rt.args).unwrap(),
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=u"
    );
    for (k, v) in [
        ("A;B", "x"),
        ("A", "x;y"),
        ("A", "x=y"),
        ("", "x"),
        ("A=", "x"),
    ] {
        assert!(
            matches!(
                format_cni_args(&[(k.into(), v.into())]),
                Err(CniError::InvalidArg { .. })
            ),
            "{k:?}={v:?}"
        );
    }
    // an invalid arg stops the operation before any plugin runs
    let w = three_plugin_world();
    let mut rt = w.cni.runtime_conf("c1", "");
    rt.args.push(("K".into(), "a;b".into()));
    assert!(matches!(
        w.cni.add(&three_plugins(), &rt),
        Err(CniError::InvalidArg { .. })
    ));
    assert!(w.calls().is_empty());
}

#[test]
fn del_runs_in_reverse_with_cached_result_and_is_idempotent() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox4", "");
    w.cni.add(&net, &rt).unwrap();
    assert!(w.cache_file("podnet", "sandbox4").exists());

    w.cni.del(&net, &rt).unwrap();
    assert_eq!(
        w.calls()[3..],
        ["portmap DEL", "tuning DEL", "bridge DEL"].map(String::from)
    );
    for p in ["bridge", "tuning", "portmap"] {
        let s = w.stdin(p, "DEL");
        assert_eq!(s["prevResult"]["mapped"], 1, "{p}: {s}");
        assert_eq!(s["name"], "podnet");
    }
    assert!(!w.cache_file("podnet", "sandbox4").exists());

    // second DEL: no cache → runs again, without prevResult, and succeeds
    w.cni.del(&net, &rt).unwrap();
    assert_eq!(w.calls().len(), 9);
    assert!(w.stdin("bridge", "DEL").get("prevResult").is_none());
    assert!(w.cni.cached_result(&net, &rt).unwrap().is_none());
}

#[test]
fn del_with_missing_netns_passes_empty_netns() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w
        .cni
        .runtime_conf("sandbox5", "/nonexistent/netns/for/test");
    w.cni.del(&net, &rt).unwrap();
    for p in ["bridge", "tuning", "portmap"] {
        assert_eq!(w.env(p, "DEL")["CNI_NETNS"], "", "{p}");
    }
}

#[test]
fn del_with_a_corrupt_cache_entry_still_succeeds_and_removes_it() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox6", "");
    fs::create_dir_all(w.cache_dir.join("results")).unwrap();
    fs::write(w.cache_file("podnet", "sandbox6"), "{{{garbage").unwrap();
    w.cni.del(&net, &rt).unwrap();
    assert!(w.stdin("portmap", "DEL").get("prevResult").is_none());
    assert!(!w.cache_file("podnet", "sandbox6").exists());
}

#[test]
fn del_failure_keeps_the_cache_for_a_retry() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox7", "");
    w.cni.add(&net, &rt).unwrap();
    w.set(
        "tuning",
        "DEL",
        "out",
        r#"{"cniVersion":"1.0.0","code":11,"msg":"try again later"}"#,
    );
    w.set("tuning", "DEL", "rc", "1");
    let e = w.cni.del(&net, &rt).unwrap_err();
    assert!(
        matches!(
            e,
            CniError::Plugin {
                code: 11,
                command: Command::Del,
                ..
            }
        ),
        "{e}"
    );
    // stopped at the failing plugin (reverse order: portmap, tuning)
    assert_eq!(
        w.calls()[3..],
        ["portmap DEL", "tuning DEL"].map(String::from)
    );
    assert!(w.cache_file("podnet", "sandbox7").exists());
}

/// `delete`'s DEL (issue 27 item 3): a plugin that hangs is killed at its share of the time
/// left and the plugins after it still run, so the bridge's veth and IP go although the
/// plugin DELed first hangs; the cache entry goes too (nobody DELs again).
#[test]
fn del_until_gives_each_plugin_its_share_and_goes_on_past_a_hung_one() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox17", "");
    w.cni.add(&net, &rt).unwrap();
    w.set("portmap", "DEL", "sleep", "300");
    let start = Instant::now();
    let errors = w.cni.del_until(&net, &rt, start + Duration::from_secs(3));
    let took = start.elapsed();
    assert_eq!(errors.len(), 1, "{errors:?}");
    // Its share: a third of the time left when it started (the plugin timeout is 20 s).
    assert!(
        matches!(&errors[0], CniError::Exec { plugin, source: ExecError::Timeout { timeout, .. }, .. }
            if plugin == "portmap" && *timeout <= Duration::from_secs(1)),
        "{:?}",
        errors[0]
    );
    assert_eq!(
        w.calls()[3..],
        ["portmap DEL", "tuning DEL", "bridge DEL"].map(String::from)
    );
    assert!(!w.cache_file("podnet", "sandbox17").exists());
    println!("DEL with a hung plugin took {took:?} of a 3 s deadline");
    // A deadline already past runs nothing and says so for each plugin.
    let errors = w.cni.del_until(&net, &rt, Instant::now());
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors.iter().all(|e| matches!(
            e,
            CniError::NoTimeLeft {
                command: Command::Del,
                ..
            }
        )),
        "{errors:?}"
    );
    assert_eq!(w.calls().len(), 6);
}

#[test]
fn del_of_old_versions_omits_the_cached_result() {
    let w = World::new();
    w.plugin("bridge");
    w.set(
        "bridge",
        "ADD",
        "out",
        &result_json("10.22.0.9/16", "").replace("1.0.0", "0.3.1"),
    );
    let net = conflist("0.3.1", "", r#"{"type":"bridge"}"#);
    let rt = w.cni.runtime_conf("sandbox8", "");
    w.cni.add(&net, &rt).unwrap();
    w.cni.del(&net, &rt).unwrap();
    let s = w.stdin("bridge", "DEL");
    assert!(s.get("prevResult").is_none(), "{s}");
    assert_eq!(s["cniVersion"], "0.3.1");
    assert!(!w.cache_file("podnet", "sandbox8").exists());
}

#[test]
fn check_uses_cached_result_and_honours_version_and_disable_check() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox9", "");
    // no ADD yet → no cached result
    assert!(matches!(
        w.cni.check(&net, &rt),
        Err(CniError::NoCachedResult { .. })
    ));
    assert!(w.calls().is_empty());

    w.cni.add(&net, &rt).unwrap();
    w.cni.check(&net, &rt).unwrap();
    assert_eq!(
        w.calls()[3..],
        ["bridge CHECK", "tuning CHECK", "portmap CHECK"].map(String::from)
    );
    for p in ["bridge", "tuning", "portmap"] {
        assert_eq!(w.stdin(p, "CHECK")["prevResult"]["mapped"], 1, "{p}");
        assert_eq!(w.env(p, "CHECK")["CNI_COMMAND"], "CHECK");
    }

    // a failing CHECK surfaces the plugin's error
    w.set(
        "tuning",
        "CHECK",
        "out",
        r#"{"code":999,"msg":"sysctl mismatch","details":"somaxconn=128"}"#,
    );
    w.set("tuning", "CHECK", "rc", "1");
    let e = w.cni.check(&net, &rt).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("tuning") && msg.contains("CHECK") && msg.contains("999"),
        "{msg}"
    );
    assert!(
        msg.contains("sysctl mismatch") && msg.contains("somaxconn=128"),
        "{msg}"
    );

    // disableCheck → nothing runs
    let n = w.calls().len();
    let disabled = conflist("1.0.0", r#","disableCheck":true"#, r#"{"type":"bridge"}"#);
    w.cni.check(&disabled, &rt).unwrap();
    assert_eq!(w.calls().len(), n);

    // pre-0.4.0 → not supported
    let old = conflist("0.3.1", "", r#"{"type":"bridge"}"#);
    let e = w.cni.check(&old, &rt).unwrap_err();
    assert!(
        matches!(e, CniError::CheckNotSupported(ref v) if v == "0.3.1"),
        "{e}"
    );
    assert_eq!(w.calls().len(), n);
}

#[test]
fn failing_second_plugin_rolls_back_the_chain() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox10", "");
    w.set(
        "tuning",
        "ADD",
        "out",
        r#"{"cniVersion":"1.0.0","code":7,"msg":"invalid sysctl","details":"net.core.somaxconn is read-only"}"#,
    );
    w.set("tuning", "ADD", "rc", "1");
    let e = w.cni.add(&net, &rt).unwrap_err();
    match &e {
        CniError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } => {
            assert_eq!(plugin, "tuning");
            assert_eq!(*command, Command::Add);
            assert_eq!(*code, 7);
            assert_eq!(msg, "invalid sysctl");
            assert_eq!(details.as_deref(), Some("net.core.somaxconn is read-only"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "plugin type=\"tuning\" failed (ADD): CNI error code 7: invalid sysctl; net.core.somaxconn is read-only"
    );
    // third plugin never ran; the whole list was DELeted in reverse order
    assert_eq!(
        w.calls(),
        [
            "bridge ADD",
            "tuning ADD",
            "portmap DEL",
            "tuning DEL",
            "bridge DEL"
        ]
        .map(String::from)
    );
    // rollback DEL carries the last successful result
    assert_eq!(
        w.stdin("bridge", "DEL")["prevResult"]["ips"][0]["address"],
        "10.22.0.5/16"
    );
    assert!(!w.cache_file("podnet", "sandbox10").exists());
    assert!(w.cni.cached_result(&net, &rt).unwrap().is_none());
}

#[test]
fn rollback_failures_do_not_mask_the_add_error() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox11", "");
    w.set(
        "portmap",
        "ADD",
        "out",
        r#"{"code":5,"msg":"iptables missing"}"#,
    );
    w.set("portmap", "ADD", "rc", "2");
    for p in ["bridge", "tuning", "portmap"] {
        w.set(p, "DEL", "rc", "1");
    }
    let e = w.cni.add(&net, &rt).unwrap_err();
    assert!(
        matches!(e, CniError::Plugin { code: 5, ref plugin, .. } if plugin == "portmap"),
        "{e}"
    );
    assert_eq!(w.calls().len(), 6);
    assert!(!w.cache_file("podnet", "sandbox11").exists());
}

#[test]
fn non_json_and_empty_output_are_clear_errors() {
    let w = three_plugin_world();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox12", "");

    w.set("bridge", "ADD", "out", "Segmentation fault? not json");
    let e = w.cni.add(&net, &rt).unwrap_err();
    assert!(
        matches!(e, CniError::InvalidResult { ref plugin, source: ResultError::NotJson { .. }, .. } if plugin == "bridge"),
        "{e}"
    );
    assert!(e.to_string().contains("not JSON"), "{e}");
    assert_eq!(
        w.calls(),
        ["bridge ADD", "portmap DEL", "tuning DEL", "bridge DEL"].map(String::from)
    );

    w.set("bridge", "ADD", "out", "");
    let e = w.cni.add(&net, &rt).unwrap_err();
    assert!(
        matches!(
            e,
            CniError::InvalidResult {
                source: ResultError::Empty,
                ..
            }
        ),
        "{e}"
    );

    // failure with non-JSON stdout and a stderr message: exit code and both outputs reported
    w.set("bridge", "ADD", "out", "oops");
    w.set("bridge", "ADD", "err", "cannot create bridge");
    w.set("bridge", "ADD", "rc", "3");
    let e = w.cni.add(&net, &rt).unwrap_err();
    match &e {
        CniError::Exec {
            source: ExecError::Failed { code, stderr, .. },
            ..
        } => {
            assert_eq!(*code, Some(3));
            assert_eq!(stderr, b"cannot create bridge");
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("code 3") && msg.contains("cannot create bridge") && msg.contains("oops"),
        "{msg}"
    );
    assert!(!w.cache_file("podnet", "sandbox12").exists());
}

#[test]
fn a_hanging_plugin_is_killed_after_the_timeout() {
    let w = World::with_timeout(Duration::from_millis(500));
    w.plugin("bridge");
    w.set("bridge", "ADD", "sleep", "300");
    let net = conflist("1.0.0", "", r#"{"type":"bridge"}"#);
    let rt = w.cni.runtime_conf("sandbox13", "");
    let start = Instant::now();
    let e = w.cni.add(&net, &rt).unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(e, CniError::Exec { source: ExecError::Timeout { timeout, .. }, .. } if timeout == Duration::from_millis(500)),
        "{e}"
    );
    assert!(
        // Killed at the timeout, not waited for: only a hang could take a minute.
        took >= Duration::from_millis(500) && took < Duration::from_secs(60),
        "{took:?}"
    );
    assert!(e.to_string().contains("timed out"), "{e}");
    // the rollback DEL ran (and did not hang: DEL has no sleep file)
    assert_eq!(w.calls(), ["bridge ADD", "bridge DEL"].map(String::from));
}

#[test]
fn missing_plugin_binary_fails_before_running_anything() {
    let w = World::new();
    w.plugin("bridge");
    let net = conflist("1.0.0", "", r#"{"type":"bridge"},{"type":"firewall"}"#);
    let rt = w.cni.runtime_conf("sandbox14", "");
    for e in [
        w.cni.add(&net, &rt).unwrap_err(),
        w.cni.del(&net, &rt).unwrap_err(),
    ] {
        assert!(
            matches!(e, CniError::PluginNotFound { ref plugin, .. } if plugin == "firewall"),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&w.bin.display().to_string()), "{msg}");
    }
    assert!(w.calls().is_empty());
}

#[test]
fn invalid_ids_are_rejected() {
    let w = three_plugin_world();
    let net = three_plugins();
    for (cid, ifname) in [
        ("../../etc", "eth0"),
        ("a/b", "eth0"),
        ("", "eth0"),
        ("ok", "../x"),
        ("ok", ""),
    ] {
        let rt = RuntimeConf::new(cid, "", ifname);
        assert!(
            matches!(w.cni.add(&net, &rt), Err(CniError::InvalidName { .. })),
            "{cid:?} {ifname:?}"
        );
        assert!(
            matches!(w.cni.del(&net, &rt), Err(CniError::InvalidName { .. })),
            "{cid:?} {ifname:?}"
        );
    }
    assert!(w.calls().is_empty());
}

#[test]
fn load_network_and_add_end_to_end_with_040_results() {
    let w = World::new();
    w.plugin("ptp");
    w.set(
        "ptp",
        "ADD",
        "out",
        r#"{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/p"}],
            "ips":[{"version":"4","address":"10.1.1.2/24","interface":0},
                   {"version":"6","address":"fd00::2/64","interface":0}]}"#,
    );
    let conf_dir = w.cni.settings().conf_dir.clone();
    fs::create_dir_all(&conf_dir).unwrap();
    fs::write(
        conf_dir.join("10-ptp.conf"),
        r#"{"cniVersion":"0.4.0","name":"ptpnet","type":"ptp","ipMasq":true}"#,
    )
    .unwrap();
    let net = w.cni.load_network().unwrap();
    let rt = w.cni.runtime_conf("sandbox15", "");
    let res = w.cni.add(&net, &rt).unwrap();
    assert_eq!(res.cni_version, "0.4.0");
    assert_eq!(
        res.sandbox_addrs("eth0"),
        vec![
            "10.1.1.2".parse::<std::net::IpAddr>().unwrap(),
            "fd00::2".parse().unwrap()
        ]
    );
    let s = w.stdin("ptp", "ADD");
    assert_eq!(s["ipMasq"], true);
    assert_eq!(s["name"], "ptpnet");
    assert!(w.cache_file("ptpnet", "sandbox15").exists());
}

#[test]
fn std_exec_reports_exit_code_and_survives_unread_stdin() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p");
    fs::write(&p, "#!/bin/sh\necho out\necho err >&2\nexit 4\n").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    let big = vec![b'x'; 4 << 20]; // far more than a pipe buffer, never read
    let e = StdExec
        .exec(
            &p,
            &[("PATH".into(), TEST_PATH_ENV.into())],
            &big,
            Duration::from_secs(20),
        )
        .unwrap_err();
    match e {
        ExecError::Failed {
            code,
            signal,
            stdout,
            stderr,
            ..
        } => {
            assert_eq!(code, Some(4));
            assert_eq!(signal, None);
            assert_eq!(stdout, b"out\n");
            assert_eq!(stderr, b"err\n");
        }
        other => panic!("unexpected {other:?}"),
    }
    let missing = StdExec.exec(
        Path::new("/nonexistent/plugin"),
        &[],
        b"",
        Duration::from_secs(1),
    );
    assert!(matches!(missing, Err(ExecError::Spawn { .. })));
}

#[test]
fn a_plugin_still_open_for_writing_is_run_once_it_is_closed() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p");
    let mut f = fs::File::create(&p).unwrap();
    std::io::Write::write_all(&mut f, b"#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    // executing a file open for writing fails with ETXTBSY until the writer closes it
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(f);
    });
    let start = Instant::now();
    let out = StdExec
        .exec(
            &p,
            &[("PATH".into(), TEST_PATH_ENV.into())],
            b"",
            Duration::from_secs(20),
        )
        .unwrap();
    writer.join().unwrap();
    assert_eq!(out, b"ran\n");
    assert!(start.elapsed() >= Duration::from_millis(200), "no retry");
}

#[test]
fn timeout_kills_the_plugins_whole_process_group() {
    let w = World::with_timeout(Duration::from_millis(400));
    let p = w.bin.join("forker");
    let pidfile = w.log.join("grandchild.pid");
    fs::write(
        &p,
        format!(
            "#!/bin/sh\nsleep 30 &\necho $! > '{}'\nwait\n",
            pidfile.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    let net = conflist("1.0.0", "", r#"{"type":"forker"}"#);
    let rt = w.cni.runtime_conf("sandbox16", "");
    let e = w.cni.add(&net, &rt).unwrap_err();
    assert!(
        matches!(
            e,
            CniError::Exec {
                source: ExecError::Timeout { .. },
                ..
            }
        ),
        "{e}"
    );
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // the orphaned `sleep` was killed with the group (it gets reaped by init, so poll)
    let gone = (0..100).any(|_| {
        let alive = fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false);
        if alive {
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive
    });
    assert!(gone, "grandchild {pid} survived the timeout");
}

#[test]
fn a_failed_cache_write_rolls_back_the_add() {
    let w = three_plugin_world();
    // a regular file where the cache dir should be → the results dir cannot be created
    fs::write(&w.cache_dir, "not a dir").unwrap();
    let net = three_plugins();
    let rt = w.cni.runtime_conf("sandbox17", "");
    let e = w.cni.add(&net, &rt).unwrap_err();
    assert!(matches!(e, CniError::Cache { .. }), "{e}");
    assert_eq!(
        w.calls()[3..],
        ["portmap DEL", "tuning DEL", "bridge DEL"].map(String::from)
    );
    // the rollback DEL got the final result
    assert_eq!(w.stdin("bridge", "DEL")["prevResult"]["mapped"], 1);
}

#[test]
fn a_network_without_plugins_is_rejected() {
    let w = World::new();
    let mut net = conflist("1.0.0", "", r#"{"type":"bridge"}"#);
    net.plugins.clear();
    let rt = w.cni.runtime_conf("sandbox18", "");
    assert!(matches!(
        w.cni.add(&net, &rt),
        Err(CniError::InvalidConfig { .. })
    ));
}
