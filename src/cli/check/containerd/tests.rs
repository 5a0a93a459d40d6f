//! containerd's versions and configs, as each release prints them: the hazards judged for
//! versions CI does not run (2.2, 2.3, 2.4) from their real `--version` lines and `config
//! dump` layout (the bench's 2.1.9 dump, abridged; 2.2+ adds the default `imports`).

use std::path::Path;

use super::super::node::fake::{FakeNode, failed, ok};
use super::*;

const CONTAINERD: &str = "/usr/bin/containerd";
const CONFIG: &str = "/etc/containerd/config.toml";

/// `containerd --version` of each release: `<name> <package> <version> <revision>`
/// (cmd/containerd/command/main.go's VersionPrinter; the Makefile's `git describe` version and
/// the tag's commit, from the mirror). Debian's build prints `+unknown` and no revision (the
/// bench's binary); Docker's containerd.io names itself.
const V2_1_9_DEBIAN: &str = "containerd github.com/containerd/containerd/v2 2.1.9+unknown \n";
const V2_2_1: &str = "containerd github.com/containerd/containerd/v2 v2.2.1 dea7da592f5d1d2b7755e3a161be07f43fad8f75\n";
const V2_3_0: &str = "containerd github.com/containerd/containerd/v2 v2.3.0 2976f38ccbfcda5ef1364d63d60b0a304e4bf94a\n";
const V2_3_4: &str = "containerd github.com/containerd/containerd/v2 v2.3.4 db8809540e1a7a9da5d518876894933ff55692ab\n";
const V2_4_BETA: &str = "containerd github.com/containerd/containerd/v2 v2.4.0-beta.0 58e6cee9dee67ee87ee2f727d3570009050f9954\n";
const V1_7_DOCKER: &str =
    "containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n";

/// A `config dump` as containerd prints it, abridged to what `check` reads: `imports` (2.2+
/// prints the default pattern even when no file imports it), the CRI runtime section with
/// `default_runtime_name` and the runtimes (`extra` is appended inside `runtimes`), and the
/// shim manager's env.
fn dump(two_two_plus: bool, default_runtime: &str, extra: &str) -> String {
    let imports = if two_two_plus {
        "['/etc/containerd/conf.d/*.toml']"
    } else {
        "[]"
    };
    format!(
        "version = 3\nroot = '/var/lib/containerd'\nstate = '/run/containerd'\nimports = {imports}\n\n\
         [plugins]\n  [plugins.'io.containerd.cri.v1.runtime']\n    enable_selinux = false\n\n\
         \x20   [plugins.'io.containerd.cri.v1.runtime'.containerd]\n      default_runtime_name = '{default_runtime}'\n\n\
         \x20     [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]\n\
         \x20       [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n\
         \x20         runtime_type = 'io.containerd.runc.v2'\n          sandboxer = 'podsandbox'\n\n\
         \x20         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n\
         \x20           BinaryName = ''\n            SystemdCgroup = true\n\n{extra}\n\
         \x20 [plugins.'io.containerd.shim.v1.manager']\n    env = []\n"
    )
}

const RSANDBOX: &str = "        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n\
     \x20         runtime_type = 'io.containerd.rsandbox.v1'\n          runtime_path = ''\n          sandboxer = 'shim'\n          io_type = ''\n";

const RSANDBOX_WITH_OPTIONS: &str = "        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n\
     \x20         runtime_type = 'io.containerd.rsandbox.v1'\n          sandboxer = 'shim'\n\n\
     \x20         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox.options]\n\
     \x20           BinaryName = '/usr/local/sbin/runc'\n            SystemdCgroup = true\n";

/// A node with `version` of containerd, a root config (`root`, None: no file) and the dump.
fn node(version: &str, root: Option<&str>, dump_text: &str) -> FakeNode {
    let mut n = FakeNode::default();
    n.binary("containerd", CONTAINERD)
        .command(&format!("{CONTAINERD} --version"), ok(version))
        .command(
            &format!("{CONTAINERD} --config {CONFIG} config dump"),
            ok(dump_text),
        );
    if let Some(r) = root {
        n.file(CONFIG, r);
    }
    n
}

fn inputs(runtime: Option<&str>) -> Inputs {
    Inputs {
        binary: None,
        config: CONFIG.into(),
        drop_in: DEFAULT_DROP_IN.into(),
        runtime: runtime.map(String::from),
        timeout: Duration::from_secs(1),
    }
}

fn findings(n: &FakeNode, runtime: Option<&str>) -> Vec<Finding> {
    let i = inputs(runtime);
    judge(&gather(n, &i), &i)
}

fn status(fs: &[Finding], id: &str) -> Status {
    fs.iter()
        .filter(|f| f.id == id)
        .map(|f| f.status)
        .max()
        .unwrap_or_else(|| panic!("no finding {id}: {fs:#?}"))
}

const ROOT_IMPORTING_CONF_D: &str = "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n";
const DROP_IN: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n  runtime_type = 'io.containerd.rsandbox.v1'\n  sandboxer = 'shim'\n";

#[test]
fn versions_parse_from_every_packagers_line() {
    let v = |s: &str| Version::from_output(s).unwrap();
    assert_eq!(v(V2_1_9_DEBIAN), Version::release(2, 1, 9));
    assert_eq!(v(V2_2_1), Version::release(2, 2, 1));
    assert_eq!(v(V1_7_DOCKER), Version::release(1, 7, 27));
    let beta = v(V2_4_BETA);
    assert_eq!(
        (beta.major, beta.minor, beta.patch, beta.pre),
        (2, 4, 0, true)
    );
    assert_eq!(v("containerd 2.1.9~ds1-5\n"), Version::release(2, 1, 9));
    assert!(Version::from_output("containerd\n").is_none());
    // A pre-release of the fixing version is not the fix.
    assert!(
        !Version::parse("2.3.0-rc.1")
            .unwrap()
            .at_least(HOST_NETWORK_FIXED)
    );
    assert!(
        Version::parse("2.3.0")
            .unwrap()
            .at_least(HOST_NETWORK_FIXED)
    );
    assert!(!Version::parse("2.3.0").unwrap().at_least(OPTIONS_FIXED));
    assert!(
        Version::parse("v2.4.0-beta.0")
            .unwrap()
            .at_least(OPTIONS_FIXED)
    );
}

#[test]
fn go_glob_semantics() {
    for (p, n, want) in [
        ("*.toml", "rsandbox.toml", true),
        ("*.toml", "rsandbox.toml.bak", false),
        ("*.toml", ".hidden.toml", true), // Go's Match has no dotfile rule
        ("10-*.toml", "10-a.toml", true),
        ("?.toml", "a.toml", true),
        ("[a-c].toml", "b.toml", true),
        ("[^a-c].toml", "b.toml", false),
        ("\\*.toml", "*.toml", true),
        ("\\*.toml", "a.toml", false),
        ("rsandbox.toml", "rsandbox.toml", true),
    ] {
        assert_eq!(glob_match(p, n), want, "{p} {n}");
    }
    let pats = [PathBuf::from("/etc/containerd/conf.d/*.toml")];
    assert!(imports_path(
        &pats,
        Path::new("/etc/containerd/conf.d/rsandbox.toml")
    ));
    assert!(!imports_path(
        &pats,
        Path::new("/etc/containerd/rsandbox.toml")
    ));
    assert!(!imports_path(
        &pats,
        Path::new("/etc/containerd/conf.d/x/rsandbox.toml")
    ));
}

/// The first hazard row: 2.1.9 (the bench) with the handler from a drop-in that
/// config.toml imports: hostNetwork is a warning, nothing blocks.
#[test]
fn containerd_2_1_9_with_the_drop_in_imported() {
    let mut n = node(
        V2_1_9_DEBIAN,
        Some(ROOT_IMPORTING_CONF_D),
        &dump(false, "runc", RSANDBOX),
    );
    n.file(DEFAULT_DROP_IN, DROP_IN);
    let i = inputs(Some("rsandbox"));
    let f = gather(&n, &i);
    assert_eq!(
        f.chain
            .files
            .iter()
            .map(|l| l.path.clone())
            .collect::<Vec<_>>(),
        [PathBuf::from(CONFIG), PathBuf::from(DEFAULT_DROP_IN)]
    );
    assert!(f.drop_in_imported);
    let fs = judge(&f, &i);
    assert_eq!(status(&fs, "containerd.version"), Status::Ok);
    assert_eq!(status(&fs, "containerd.runtime"), Status::Ok);
    assert_eq!(status(&fs, "containerd.drop-in"), Status::Ok);
    assert_eq!(status(&fs, "containerd.host-network"), Status::Warn);
    assert_eq!(status(&fs, "containerd.default-runtime"), Status::Ok);
    assert_eq!(status(&fs, "containerd.options-table"), Status::Ok);
    assert_eq!(status(&fs, "containerd.config-version"), Status::Ok);
    assert!(fs.iter().all(|f| f.status != Status::Block), "{fs:#?}");
    let j = facts_json(&f, &i);
    assert_eq!(j["version"], "2.1.9");
    assert_eq!(j["drop_in_imported"], true);
    assert_eq!(j["rsandbox_runtimes"], serde_json::json!(["rsandbox"]));
}

/// `default_runtime_name = rsandbox` blocks on 2.1 and 2.2 (every hostNetwork DaemonSet pod
/// would crash containerd), not from 2.3.0 on.
#[test]
fn rsandbox_as_the_default_runtime_blocks_before_2_3() {
    for (version, two_two, want) in [
        (V2_1_9_DEBIAN, false, Status::Block),
        (V2_2_1, true, Status::Block),
        (V2_3_0, true, Status::Info),
        (V2_4_BETA, true, Status::Info),
    ] {
        let n = node(
            version,
            Some("version = 3\n"),
            &dump(two_two, "rsandbox", RSANDBOX),
        );
        let fs = findings(&n, None);
        assert_eq!(status(&fs, "containerd.default-runtime"), want, "{version}");
        let hostnet = if want == Status::Block {
            Status::Warn
        } else {
            Status::Ok
        };
        assert_eq!(status(&fs, "containerd.host-network"), hostnet, "{version}");
    }
}

/// An `options` table on the handler blocks up to 2.3.0 (StartContainer fails), not from
/// 2.3.1; its BinaryName is the runc check judges.
#[test]
fn an_options_table_blocks_before_2_3_1() {
    for (version, two_two, want) in [
        (V2_1_9_DEBIAN, false, Status::Block),
        (V2_2_1, true, Status::Block),
        (V2_3_0, true, Status::Block),
        (V2_3_4, true, Status::Ok),
        (V2_4_BETA, true, Status::Ok),
    ] {
        let n = node(
            version,
            Some("version = 3\n"),
            &dump(two_two, "runc", RSANDBOX_WITH_OPTIONS),
        );
        let fs = findings(&n, Some("rsandbox"));
        assert_eq!(status(&fs, "containerd.options-table"), want, "{version}");
    }
    let eff = parse_effective(&dump(true, "runc", RSANDBOX_WITH_OPTIONS)).unwrap();
    assert_eq!(
        eff.handlers[0].binary_name.as_deref(),
        Some("/usr/local/sbin/runc")
    );
    assert!(eff.runc_systemd_cgroup);
}

/// containerd >= 2.2 with a config.toml that imports nothing: `config dump` still prints the
/// default conf.d pattern, yet the drop-in is not read (the walk over the files tells), and no
/// handler exists. With the import added, it is.
#[test]
fn conf_d_is_judged_from_the_files_not_from_the_dump() {
    // An older config.toml (written by hand, or by `config default` before 2.2): no imports.
    let mut n = node(
        V2_2_1,
        Some("version = 3\n[grpc]\n  address = '/run/containerd/containerd.sock'\n"),
        &dump(true, "runc", ""),
    );
    n.file(DEFAULT_DROP_IN, DROP_IN);
    let fs = findings(&n, None);
    assert_eq!(status(&fs, "containerd.drop-in"), Status::Warn);
    assert_eq!(status(&fs, "containerd.runtime"), Status::Warn);
    assert_eq!(status(&fs, "containerd.host-network"), Status::Info);
    let drop_in = fs.iter().find(|f| f.id == "containerd.drop-in").unwrap();
    assert!(
        drop_in
            .fix
            .contains("imports = [\"/etc/containerd/conf.d/*.toml\"]"),
        "{drop_in:?}"
    );
    // The installer asks for its handler: blocking until the import is there.
    assert_eq!(
        status(&findings(&n, Some("rsandbox")), "containerd.runtime"),
        Status::Block
    );

    // No config.toml at all: containerd's defaults read no drop-in either.
    let n = node(V2_3_4, None, &dump(true, "runc", ""));
    let fs = findings(&n, None);
    assert_eq!(status(&fs, "containerd.drop-in"), Status::Warn);
    assert!(
        fs.iter()
            .any(|f| f.id == "containerd.config" && f.summary.contains("defaults"))
    );

    // The 2.2+ default config.toml (`containerd config default`) imports conf.d.
    let mut n = node(
        V2_3_4,
        Some(ROOT_IMPORTING_CONF_D),
        &dump(true, "runc", RSANDBOX),
    );
    n.file(DEFAULT_DROP_IN, DROP_IN);
    let fs = findings(&n, Some("rsandbox"));
    assert_eq!(status(&fs, "containerd.drop-in"), Status::Ok);
    // (No shim binary on this fake node: that one warns.)
    assert!(
        fs.iter()
            .all(|f| f.status <= Status::Info || f.id == "containerd.shim-binary"),
        "{fs:#?}"
    );

    // A handler configured in config.toml itself: the drop-in not being read is only info.
    let n = node(V2_3_4, Some("version = 3\n"), &dump(true, "runc", RSANDBOX));
    assert_eq!(
        status(&findings(&n, None), "containerd.drop-in"),
        Status::Info
    );
}

/// Imports are resolved as containerd resolves them: relative to the importing file, globs
/// sorted, each file once (cycles end), recursively.
#[test]
fn the_import_walk_follows_containerd() {
    let mut n = FakeNode::default();
    n.file(
        CONFIG,
        "version = 2\nimports = ['conf.d/*.toml', '/etc/containerd/extra.toml']\n",
    )
    .file("/etc/containerd/conf.d/b.toml", "version = 2\n")
    .file(
        "/etc/containerd/conf.d/a.toml",
        "version = 2\nimports = ['../config.toml']\n",
    )
    .file("/etc/containerd/conf.d/notes.txt", "")
    .file("/etc/containerd/extra.toml", "imports = ['more/*.toml']\n");
    let chain = walk_files(&n, Path::new(CONFIG));
    let paths: Vec<String> = chain
        .files
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            CONFIG,
            "/etc/containerd/conf.d/a.toml",
            "/etc/containerd/conf.d/b.toml",
            "/etc/containerd/extra.toml"
        ]
    );
    assert!(chain.errors.is_empty(), "{:?}", chain.errors);
    assert!(imports_path(
        &chain.patterns,
        Path::new("/etc/containerd/more/x.toml")
    ));
    // An import without a wildcard that does not exist stops containerd (config dump hides it).
    n.file(
        CONFIG,
        "version = 3\nimports = ['/etc/containerd/missing.toml']\n",
    );
    let chain = walk_files(&n, Path::new(CONFIG));
    assert_eq!(chain.errors.len(), 1, "{:?}", chain.errors);
    let mut n = node(
        V2_3_4,
        Some("version = 3\nimports = ['/etc/containerd/missing.toml']\n"),
        &dump(true, "runc", ""),
    );
    n.file("/x", "");
    assert_eq!(
        status(&findings(&n, None), "containerd.config"),
        Status::Block
    );
}

/// The false block found by review: a root config without `version` beside the installer's
/// version-3 drop-in. Every release loads it (2.1/2.2 migrate the root first; 2.3.0-2.3.4 take
/// the root's version from the first drop-in), so it must not block.
#[test]
fn a_root_config_without_a_version_beside_a_versioned_drop_in_does_not_block() {
    for line in [V2_1_9_DEBIAN, V2_2_1, V2_3_4, V2_4_BETA] {
        let mut n = node(
            line,
            Some("imports = ['/etc/containerd/conf.d/*.toml']\n"),
            &dump(true, "runc", RSANDBOX),
        );
        n.file(DEFAULT_DROP_IN, DROP_IN);
        let fs = findings(&n, Some("rsandbox"));
        assert_eq!(
            status(&fs, "containerd.config-version"),
            Status::Ok,
            "{line}"
        );
    }
}

/// A version-2 root with a version-3 drop-in: 2.3.0 to 2.3.4 and 2.4.0-beta.0 refuse to start
/// (blocks); a release after the refusal's revert is said untested (warns).
#[test]
fn a_drop_in_newer_than_a_versioned_root_blocks_where_containerd_refuses_it() {
    let after_revert = "containerd github.com/containerd/containerd/v2 v2.3.5 0000000\n";
    for (line, want) in [
        (V2_3_4, Status::Block),
        (V2_4_BETA, Status::Block),
        (after_revert, Status::Warn),
    ] {
        let mut n = node(
            line,
            Some("version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n"),
            &dump(true, "runc", RSANDBOX),
        );
        n.file(DEFAULT_DROP_IN, DROP_IN);
        let fs = findings(&n, Some("rsandbox"));
        assert_eq!(status(&fs, "containerd.config-version"), want, "{line}");
    }
}

/// A version-3 drop-in imported by a version-2 root: 2.3.0 to 2.3.4 refuse to start, 2.1 and 2.2
/// drop the root's version-2 CRI settings.
#[test]
fn a_drop_in_newer_than_the_root_config_blocks() {
    let mut n = node(
        V2_2_1,
        Some(
            "version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = 'runc'\n",
        ),
        &dump(true, "runc", RSANDBOX),
    );
    n.file(DEFAULT_DROP_IN, DROP_IN);
    let fs = findings(&n, Some("rsandbox"));
    assert_eq!(status(&fs, "containerd.config-version"), Status::Block);
    let f = fs
        .iter()
        .find(|f| f.id == "containerd.config-version")
        .unwrap();
    assert!(
        f.detail.contains(DEFAULT_DROP_IN) && f.fix.contains("version = 2"),
        "{f:?}"
    );
}

#[test]
fn version_window() {
    for (line, want) in [
        (V1_7_DOCKER, Status::Block),
        (
            "containerd github.com/containerd/containerd/v2 v2.0.7 4ac6c20c7bbf8177f29e46bbdc658fec02ffb8ad\n",
            Status::Warn,
        ),
        (V2_1_9_DEBIAN, Status::Ok),
        (V2_2_1, Status::Ok),
        (V2_3_4, Status::Ok),
        (V2_4_BETA, Status::Ok),
        // No such release yet: one newer than the window.
        (
            "containerd github.com/containerd/containerd/v2 v2.5.0 0000000\n",
            Status::Warn,
        ),
        ("containerd (devel)\n", Status::Warn),
    ] {
        let n = node(line, Some("version = 3\n"), &dump(true, "runc", RSANDBOX));
        assert_eq!(
            status(&findings(&n, None), "containerd.version"),
            want,
            "{line}"
        );
    }
}

#[test]
fn containerd_missing_or_its_config_broken_blocks() {
    let n = FakeNode::default();
    assert_eq!(
        status(&findings(&n, None), "containerd.binary"),
        Status::Block
    );

    let mut n = node(V2_1_9_DEBIAN, Some("version = 3\nimports = [\n"), "");
    n.command(
        &format!("{CONTAINERD} --config {CONFIG} config dump"),
        failed(
            1,
            "containerd: failed to unmarshal TOML at row 2 column 11: expected newline",
        ),
    );
    let fs = findings(&n, None);
    let c: Vec<&Finding> = fs.iter().filter(|f| f.id == "containerd.config").collect();
    assert!(
        c.iter()
            .any(|f| f.status == Status::Block && f.detail.contains("row 2")),
        "{fs:#?}"
    );
    // A dump that never ends is cut off by the timeout: the node's `run` errs.
    let mut n = node(V2_1_9_DEBIAN, Some("version = 3\n"), "");
    n.command(
        &format!("{CONTAINERD} --config {CONFIG} config dump"),
        Err("run /usr/bin/containerd: timed out after 1s".into()),
    );
    assert_eq!(
        status(&findings(&n, None), "containerd.config"),
        Status::Block
    );
}

#[test]
fn a_handler_of_another_type_or_sandboxer() {
    let other = "        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.rsandbox]\n\
                 \x20         runtime_type = 'io.containerd.runc.v2'\n";
    let n = node(V2_3_4, Some("version = 3\n"), &dump(true, "runc", other));
    let fs = findings(&n, Some("rsandbox"));
    assert_eq!(status(&fs, "containerd.runtime"), Status::Block);
    assert!(
        fs.iter()
            .any(|f| f.detail.contains("io.containerd.runc.v2"))
    );
    let podsandbox = RSANDBOX.replace("sandboxer = 'shim'", "sandboxer = 'podsandbox'");
    let n = node(
        V2_3_4,
        Some("version = 3\n"),
        &dump(true, "runc", &podsandbox),
    );
    assert_eq!(
        status(&findings(&n, None), "containerd.runtime"),
        Status::Warn
    );
}

/// Where containerd finds the shim, and whether it is this check's version.
#[test]
fn the_shim_binary_containerd_would_start() {
    let mut n = node(
        V2_1_9_DEBIAN,
        Some("version = 3\n"),
        &dump(false, "runc", RSANDBOX),
    );
    assert_eq!(
        status(&findings(&n, None), "containerd.shim-binary"),
        Status::Warn
    );
    // Next to containerd, of this version.
    n.file("/usr/bin/containerd-shim-rsandbox-v1", "").command(
        "/usr/bin/containerd-shim-rsandbox-v1 -v",
        ok(&crate::records::version::text(
            "containerd-shim-rsandbox-v1",
        )),
    );
    assert_eq!(
        status(&findings(&n, None), "containerd.shim-binary"),
        Status::Ok
    );
    // An older one first in $PATH.
    n.binary(SHIM_BINARY, "/usr/local/bin/containerd-shim-rsandbox-v1").command(
        "/usr/local/bin/containerd-shim-rsandbox-v1 -v",
        ok("containerd-shim-rsandbox-v1:\n  Version: 0.1.0\n  Runtime: io.containerd.rsandbox.v1\n"),
    );
    let fs = findings(&n, None);
    let f = fs
        .iter()
        .find(|f| f.id == "containerd.shim-binary")
        .unwrap();
    assert_eq!(f.status, Status::Warn);
    assert!(
        f.summary.contains("0.1.0") && f.summary.contains("/usr/local/bin"),
        "{f:?}"
    );
}

/// The bench's config as 2.1.9 dumps it (abridged: the layout of `config dump` of
/// hack/templates/containerd.toml.in): the handler, its sandboxer, the shim config env.
#[test]
fn the_bench_dump_reads_as_expected() {
    let eff = parse_effective(&dump(false, "runc", RSANDBOX).replace(
        "env = []",
        "env = ['RSANDBOX_CONFIG=/opt/rsandbox/conf/rsandbox.toml']",
    ))
    .unwrap();
    assert_eq!(eff.version, 3);
    assert_eq!(eff.default_runtime.as_deref(), Some("runc"));
    assert_eq!(
        eff.handlers,
        [Handler {
            name: "rsandbox".into(),
            sandboxer: "shim".into(),
            has_options: false,
            binary_name: None,
            runtime_path: None,
        }]
    );
    assert_eq!(
        eff.shim_config_env.as_deref(),
        Some("/opt/rsandbox/conf/rsandbox.toml")
    );
    assert!(parse_effective("version = [").is_err());
}
