//! containerd as the node will run it: its version (`containerd --version`), the files its
//! config is loaded from (the root config and its `imports`, walked as containerd's
//! `LoadConfig` walks them), and the effective config (`containerd --config <root> config
//! dump`: the files on disk, not the running daemon, so an installer that wrote a drop-in
//! learns what containerd will load when restarted). Then the hazards of rsandbox on that
//! containerd (see /work/shared/docs/containerd-contract.md §8 and issue 25):
//!
//! - hostNetwork pods with a `shim` sandboxer crash containerd before 2.3.0 (nil spec in
//!   `NewBundle`, fixed by `b32cecd31`);
//! - an `options` table on the rsandbox handler breaks StartContainer before 2.3.1
//!   (`WithTaskAPIEndpoint` wants runc options; fixed by `5282d4e09`/`e44f5f9ec`);
//! - `default_runtime_name` naming the rsandbox handler before 2.3.0: every hostNetwork pod
//!   (each DaemonSet's: kube-proxy, CNI agents) would crash containerd — blocking;
//! - a drop-in that is not imported: containerd >= 2.2's *default* config imports
//!   `/etc/containerd/conf.d/*.toml`, but a `config.toml` is read as written, and `config dump`
//!   always prints the default pattern in `imports` (the defaults' value, which containerd
//!   itself never resolves): only the walk over the files tells;
//! - a drop-in whose `version` is higher than the root config's: containerd 2.4 refuses to
//!   start, earlier ones merge it and then skip migrating the root's older plugin sections.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};
use crate::bundle::RUNTIME_ID;

/// containerd's default root config.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// The drop-in the installer writes.
pub const DEFAULT_DROP_IN: &str = "/etc/containerd/conf.d/rsandbox.toml";
/// The shim's binary name, as containerd derives it from the runtime type.
pub const SHIM_BINARY: &str = "containerd-shim-rsandbox-v1";

/// The CRI runtime plugin's section (config version 3 and later).
const CRI_RUNTIME: &str = "io.containerd.cri.v1.runtime";
/// The CRI plugin's section in version 2 configs.
const CRI_V2: &str = "io.containerd.grpc.v1.cri";
const SHIM_MANAGER: &str = "io.containerd.shim.v1.manager";

/// Where the fixes landed.
pub const HOST_NETWORK_FIXED: Version = Version::release(2, 3, 0);
pub const OPTIONS_FIXED: Version = Version::release(2, 3, 1);

/// A containerd version: `2.1.9`, `v2.2.1`, `2.4.0-beta.0`, `2.1.9~ds1`, `2.1.9+unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// A pre-release (`-beta.0`, `-rc.1`): it counts as before the release.
    pub pre: bool,
}

impl Version {
    pub const fn release(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
            pre: false,
        }
    }

    /// Parses one version word.
    pub fn parse(word: &str) -> Option<Version> {
        let w = word.strip_prefix('v').unwrap_or(word);
        let end = w
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(w.len());
        let (digits, rest) = w.split_at(end);
        let mut it = digits.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = it.next().map_or(Some(0), |p| p.parse().ok())?;
        Some(Version {
            major,
            minor,
            patch,
            pre: rest.starts_with('-'),
        })
    }

    /// The version in `containerd --version`'s line (`containerd <package> <version>
    /// [<revision>]`): the first word after the name that parses.
    pub fn from_output(out: &str) -> Option<Version> {
        let line = out.lines().find(|l| !l.trim().is_empty())?;
        line.split_whitespace().skip(1).find_map(Version::parse)
    }

    /// Whether this is at least `other` (a pre-release of `other` is not).
    pub fn at_least(&self, other: Version) -> bool {
        let a = (self.major, self.minor, self.patch);
        let b = (other.major, other.minor, other.patch);
        a > b || (a == b && !self.pre)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if self.pre {
            write!(f, " (pre-release)")?;
        }
        Ok(())
    }
}

/// What `check` is told about containerd.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// `--containerd`, else looked up.
    pub binary: Option<PathBuf>,
    pub config: PathBuf,
    pub drop_in: PathBuf,
    /// `--runtime`: a handler that must exist.
    pub runtime: Option<String>,
    pub timeout: Duration,
}

/// One file containerd loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedFile {
    pub path: PathBuf,
    /// Its `version` (0 when absent).
    pub version: i64,
}

/// The config files as containerd walks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileChain {
    pub root_exists: bool,
    /// Every file loaded, root first, in containerd's order.
    pub files: Vec<LoadedFile>,
    /// Every import pattern, resolved to an absolute path (relative ones against their file's
    /// directory).
    pub patterns: Vec<PathBuf>,
    /// Problems that stop containerd from starting (an imported file missing, a file that
    /// does not parse).
    pub errors: Vec<String>,
}

/// An rsandbox handler of the effective config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handler {
    pub name: String,
    pub sandboxer: String,
    pub has_options: bool,
    /// `options.BinaryName` (containerd >= 2.3.1 passes it to the shim).
    pub binary_name: Option<String>,
    pub runtime_path: Option<String>,
}

/// What the effective config says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    pub version: i64,
    pub default_runtime: Option<String>,
    /// Handlers with `runtime_type = io.containerd.rsandbox.v1`.
    pub handlers: Vec<Handler>,
    /// `runtime_type` of every handler, by name.
    pub runtime_types: Vec<(String, String)>,
    /// A handler of runc's type with `SystemdCgroup = true`.
    pub runc_systemd_cgroup: bool,
    /// `RSANDBOX_CONFIG=` in the shim manager's `env`.
    pub shim_config_env: Option<String>,
}

/// Everything found about containerd.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub binary: Option<PathBuf>,
    pub binary_error: Option<String>,
    pub version_line: Option<String>,
    pub version: Option<Version>,
    pub chain: FileChain,
    /// `Err`: the dump failed (its message).
    pub effective: Option<Result<Effective, String>>,
    pub drop_in_imported: bool,
    /// Where containerd finds the shim, and what its `-v` says.
    pub shim_binary: Option<PathBuf>,
    pub shim_version: Option<String>,
}

/// Looks at containerd on `node`.
pub fn gather(node: &dyn Node, inputs: &Inputs) -> Facts {
    let mut f = Facts::default();
    f.binary = inputs.binary.clone().or_else(|| {
        node.look_path("containerd").or_else(|| {
            ["/usr/bin/containerd", "/usr/local/bin/containerd"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| node.exists(p))
        })
    });
    f.chain = walk_files(node, &inputs.config);
    f.drop_in_imported = imports_path(&f.chain.patterns, &inputs.drop_in);
    let Some(bin) = f.binary.clone() else {
        f.binary_error = Some("containerd was not found in $PATH, /usr/bin, /usr/local/bin".into());
        return f;
    };
    match node.run(&bin, &["--version"], inputs.timeout) {
        Ok(out) if out.status == 0 => {
            f.version_line = out.stdout.lines().next().map(|l| l.trim().to_string());
            f.version = Version::from_output(&out.stdout);
        }
        Ok(out) => {
            f.binary_error = Some(format!(
                "{} --version exited with status {}: {}",
                bin.display(),
                out.status,
                out.stderr.trim()
            ))
        }
        Err(e) => f.binary_error = Some(e),
    }
    let config = inputs.config.to_string_lossy().into_owned();
    f.effective = Some(
        match node.run(
            &bin,
            &["--config", &config, "config", "dump"],
            inputs.timeout,
        ) {
            Ok(out) if out.status == 0 => parse_effective(&out.stdout),
            Ok(out) => Err(format!(
                "containerd --config {config} config dump exited with status {}: {}",
                out.status,
                out.stderr.trim()
            )),
            Err(e) => Err(e),
        },
    );
    // containerd looks the shim up in its $PATH, then next to its own binary
    // (`pkg/shim` `Command`); a handler's runtime_path is used for tasks only.
    f.shim_binary = node
        .look_path(SHIM_BINARY)
        .or_else(|| Some(bin.parent()?.join(SHIM_BINARY)).filter(|p| node.exists(p)));
    if let Some(shim) = &f.shim_binary {
        f.shim_version = node
            .run(shim, &["-v"], inputs.timeout)
            .ok()
            .filter(|o| o.status == 0)
            .and_then(|o| {
                o.stdout.lines().find_map(|l| {
                    l.trim()
                        .strip_prefix("Version:")
                        .map(|v| v.trim().to_string())
                })
            });
    }
    f
}

/// containerd's `LoadConfig` walk: the root file, then each file's `imports` in order
/// (relative to the file's directory; with a `*` a glob, else the path itself), each file
/// once.
pub fn walk_files(node: &dyn Node, root: &Path) -> FileChain {
    let mut chain = FileChain::default();
    let mut pending = vec![root.to_path_buf()];
    let mut loaded = BTreeSet::new();
    let mut first = true;
    while !pending.is_empty() {
        let path = pending.remove(0);
        if !loaded.insert(path.clone()) {
            continue;
        }
        let text = match node.read(&path) {
            Ok(t) => t,
            Err(e) if first && e.kind() == std::io::ErrorKind::NotFound => {
                // containerd runs with its defaults, which import nothing.
                return chain;
            }
            Err(e) => {
                chain.errors.push(format!("read {}: {e}", path.display()));
                continue;
            }
        };
        if first {
            chain.root_exists = true;
            first = false;
        }
        let table: toml::Table = match toml::from_str(&text) {
            Ok(t) => t,
            Err(e) => {
                chain
                    .errors
                    .push(format!("{} is not valid TOML: {e}", path.display()));
                continue;
            }
        };
        let version = table
            .get("version")
            .and_then(|v| v.as_integer())
            .unwrap_or(0);
        chain.files.push(LoadedFile {
            path: path.clone(),
            version,
        });
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        let imports = table.get("imports").and_then(|v| v.as_array());
        for import in imports.into_iter().flatten().filter_map(|v| v.as_str()) {
            let p = clean(&dir.join(import));
            chain.patterns.push(p.clone());
            if import.contains('*') {
                let mut matches = glob(node, &p);
                matches.sort();
                pending.extend(matches);
            } else {
                pending.push(p);
            }
        }
    }
    chain
}

/// Go's `filepath.Clean` for absolute paths: no `.`, `..` resolved lexically.
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Go's `filepath.Glob` for an absolute pattern whose wildcards are in its last component
/// (what containerd's drop-in patterns are); a wildcard in a directory component is matched
/// component by component.
fn glob(node: &dyn Node, pattern: &Path) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from("/")];
    for c in pattern.components().skip(1) {
        let part = c.as_os_str().to_string_lossy();
        let mut next = Vec::new();
        for dir in &current {
            if !part.contains(['*', '?', '[']) {
                let p = dir.join(&*part);
                if node.exists(&p) {
                    next.push(p);
                }
                continue;
            }
            for name in node.list_dir(dir).unwrap_or_default() {
                if glob_match(&part, &name) {
                    next.push(dir.join(name));
                }
            }
        }
        current = next;
    }
    current
}

/// Go's `filepath.Match` for one path component: `*`, `?`, `[...]` (with `^` negation and
/// ranges), `\` escapes.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after '['; returns (matched, length of the class including ']').
        let mut i = 0;
        let negate = p.first() == Some(&'^');
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        while i < p.len() {
            if p[i] == ']' && !first {
                return Some((matched != negate, i + 1));
            }
            first = false;
            let mut lo = p[i];
            if lo == '\\' {
                i += 1;
                lo = *p.get(i)?;
            }
            let mut hi = lo;
            if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|c| *c != ']') {
                hi = p[i + 2];
                if hi == '\\' {
                    hi = *p.get(i + 3)?;
                    i += 1;
                }
                i += 2;
            }
            if lo <= c && c <= hi {
                matched = true;
            }
            i += 1;
        }
        None
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => match (n.first(), class(&p[1..], *n.first().unwrap_or(&'\0'))) {
                (Some(_), Some((true, len))) => go(&p[1 + len..], &n[1..]),
                _ => false,
            },
            Some('\\') if p.len() > 1 => n.first() == Some(&p[1]) && go(&p[2..], &n[1..]),
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    go(&p, &n)
}

/// Whether one of the resolved import patterns names `path` (which need not exist yet).
pub fn imports_path(patterns: &[PathBuf], path: &Path) -> bool {
    let path = clean(path);
    patterns.iter().any(|pat| {
        let pc: Vec<_> = pat.components().collect();
        let fc: Vec<_> = path.components().collect();
        pc.len() == fc.len()
            && pc.iter().zip(&fc).all(|(a, b)| {
                glob_match(
                    &a.as_os_str().to_string_lossy(),
                    &b.as_os_str().to_string_lossy(),
                )
            })
    })
}

/// Reads the effective config printed by `config dump`.
pub fn parse_effective(dump: &str) -> Result<Effective, String> {
    let t: toml::Table =
        toml::from_str(dump).map_err(|e| format!("config dump is not valid TOML: {e}"))?;
    let mut eff = Effective {
        version: t.get("version").and_then(|v| v.as_integer()).unwrap_or(0),
        ..Default::default()
    };
    let plugins = t.get("plugins").and_then(|v| v.as_table());
    let plugin = |name: &str| plugins.and_then(|p| p.get(name)).and_then(|v| v.as_table());
    // The CRI runtime section: version 3+ (`io.containerd.cri.v1.runtime`), else a version 2
    // dump (`io.containerd.grpc.v1.cri`).
    let containerd = plugin(CRI_RUNTIME)
        .and_then(|c| c.get("containerd"))
        .or_else(|| plugin(CRI_V2).and_then(|c| c.get("containerd")))
        .and_then(|v| v.as_table());
    if let Some(c) = containerd {
        eff.default_runtime = c
            .get("default_runtime_name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(String::from);
        let runtimes = c.get("runtimes").and_then(|v| v.as_table());
        for (name, r) in runtimes.into_iter().flatten() {
            let Some(r) = r.as_table() else { continue };
            let get = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let runtime_type = get("runtime_type");
            let options = r.get("options").and_then(|v| v.as_table());
            if runtime_type == RUNTIME_ID {
                eff.handlers.push(Handler {
                    name: name.clone(),
                    sandboxer: get("sandboxer"),
                    has_options: options.is_some(),
                    binary_name: options
                        .and_then(|o| o.get("BinaryName"))
                        .and_then(|v| v.as_str())
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                    runtime_path: Some(get("runtime_path")).filter(|s| !s.is_empty()),
                });
            } else if runtime_type == "io.containerd.runc.v2"
                && options
                    .and_then(|o| o.get("SystemdCgroup"))
                    .and_then(|v| v.as_bool())
                    == Some(true)
            {
                eff.runc_systemd_cgroup = true;
            }
            eff.runtime_types.push((name.clone(), runtime_type));
        }
    }
    let env = plugin(SHIM_MANAGER)
        .and_then(|m| m.get("env"))
        .and_then(|v| v.as_array());
    eff.shim_config_env = env
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .find_map(|e| e.strip_prefix(&format!("{}=", crate::config::CONFIG_ENV)))
        .map(String::from);
    Ok(eff)
}

/// The facts as JSON (`facts.containerd`).
pub fn facts_json(f: &Facts, inputs: &Inputs) -> Value {
    let eff = f.effective.as_ref().and_then(|e| e.as_ref().ok());
    json!({
        "binary": f.binary,
        "version": f.version.map(|v| format!("{}.{}.{}{}", v.major, v.minor, v.patch,
            if v.pre { "-pre" } else { "" })),
        "version_line": f.version_line,
        "config": inputs.config,
        "config_exists": f.chain.root_exists,
        "config_version": f.chain.files.first().map(|l| l.version),
        "files_loaded": f.chain.files.iter().map(|l| &l.path).collect::<Vec<_>>(),
        "imports": f.chain.patterns,
        "drop_in": inputs.drop_in,
        "drop_in_imported": f.drop_in_imported,
        "rsandbox_runtimes": eff.map(|e| e.handlers.iter().map(|h| &h.name).collect::<Vec<_>>()),
        "default_runtime": eff.and_then(|e| e.default_runtime.clone()),
        "shim_binary": f.shim_binary,
        "shim_binary_version": f.shim_version,
    })
}

/// The findings about containerd.
pub fn judge(f: &Facts, inputs: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let Some(bin) = &f.binary else {
        out.push(
            Finding::new("containerd.binary", Status::Block, "containerd not found")
                .detail(f.binary_error.clone().unwrap_or_default())
                .fix("install containerd >= 2.1, or name it with --containerd PATH"),
        );
        return out;
    };
    match &f.binary_error {
        Some(e) => out.push(
            Finding::new(
                "containerd.binary",
                Status::Warn,
                format!("{} does not tell its version", bin.display()),
            )
            .detail(e.clone()),
        ),
        None => out.push(Finding::new(
            "containerd.binary",
            Status::Ok,
            format!(
                "{}: {}",
                bin.display(),
                f.version_line.as_deref().unwrap_or("")
            ),
        )),
    }
    out.push(judge_version(f.version));
    out.extend(judge_files(f, inputs));
    let eff = match &f.effective {
        Some(Ok(e)) => e,
        Some(Err(e)) => {
            out.push(
                Finding::new(
                    "containerd.config",
                    Status::Block,
                    "containerd cannot load its config",
                )
                .detail(e.clone())
                .fix(format!(
                    "fix {} (and the files it imports): containerd would not start with it",
                    inputs.config.display()
                )),
            );
            return out;
        }
        None => return out,
    };
    if f.chain.errors.is_empty() {
        out.push(Finding::new(
            "containerd.config",
            Status::Ok,
            if f.chain.root_exists {
                format!(
                    "{} loads ({} file{})",
                    inputs.config.display(),
                    f.chain.files.len(),
                    if f.chain.files.len() == 1 { "" } else { "s" }
                )
            } else {
                format!(
                    "no {}: containerd runs with its defaults (no rsandbox handler, no drop-in read)",
                    inputs.config.display()
                )
            },
        ));
    }
    out.extend(judge_handlers(f, eff, inputs));
    out.push(judge_shim_binary(f));
    out
}

fn judge_version(v: Option<Version>) -> Finding {
    const ID: &str = "containerd.version";
    let Some(v) = v else {
        return Finding::new(ID, Status::Warn, "containerd's version is unknown")
            .detail("the hazards below assume a containerd before 2.3 (the cautious answer)");
    };
    match (v.major, v.minor) {
        (0 | 1, _) => Finding::new(
            ID,
            Status::Block,
            format!("containerd {v} is not supported"),
        )
        .detail(
            "containerd 1.x's CRI has no shim sandboxer; rsandbox needs containerd 2.1 or later",
        )
        .fix("upgrade containerd to 2.1.9 or later (2.3.1 or later removes every hazard below)"),
        (2, 0) => Finding::new(ID, Status::Warn, format!("containerd {v} was never tested"))
            .detail("rsandbox supports containerd 2.1 to 2.4 (2.1.9 is what CI runs)")
            .fix("upgrade containerd to 2.1.9 or later"),
        (2, 1..=4) => Finding::new(
            ID,
            Status::Ok,
            format!("containerd {v} is in the support window (2.1 to 2.4)"),
        )
        .detail(if v.at_least(OPTIONS_FIXED) {
            "no known containerd hazard for rsandbox pods".to_string()
        } else {
            format!(
                "known containerd bugs before {HOST_NETWORK_FIXED} / {OPTIONS_FIXED} apply (below)"
            )
        }),
        _ => Finding::new(
            ID,
            Status::Warn,
            format!("containerd {v} is newer than this release knows"),
        )
        .detail(
            "rsandbox supports containerd 2.1 to 2.4; a newer one may change the shim protocol",
        ),
    }
}

fn judge_files(f: &Facts, inputs: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    if !f.chain.errors.is_empty() {
        out.push(
            Finding::new(
                "containerd.config",
                Status::Block,
                "containerd would not start with its config files",
            )
            .detail(f.chain.errors.join("\n"))
            .fix("fix or remove the file, or the `imports` entry that names it"),
        );
    }
    if let Some(root) = f.chain.files.first() {
        let higher: Vec<String> = f.chain.files[1..]
            .iter()
            .filter(|l| l.version > root.version)
            .map(|l| format!("{} (version {})", l.path.display(), l.version))
            .collect();
        if higher.is_empty() {
            out.push(Finding::new(
                "containerd.config-version",
                Status::Ok,
                format!("every file is config version {} or lower", root.version),
            ));
        } else {
            out.push(
                Finding::new(
                    "containerd.config-version",
                    Status::Block,
                    format!(
                        "an imported file has a higher config version than {} (version {})",
                        root.path.display(),
                        root.version
                    ),
                )
                .detail(format!(
                    "{}\ncontainerd 2.4 refuses to start; 2.1 to 2.3 take the highest version and then \
                     ignore the root config's version-{} plugin sections",
                    higher.join("\n"),
                    root.version
                ))
                .fix(if root.version >= 2 {
                    format!(
                        "write the drop-in with `version = {}` and that version's plugin names, or \
                         migrate the root config (`containerd config migrate`)",
                        root.version
                    )
                } else {
                    // No `version` (or 1): containerd's deprecated version-1 layout.
                    "migrate the root config to version 3 (`containerd config migrate`)".to_string()
                }),
            );
        }
    }
    let eff = f.effective.as_ref().and_then(|e| e.as_ref().ok());
    let configured = eff.is_some_and(|e| !e.handlers.is_empty());
    let drop_in = inputs.drop_in.display();
    let finding = if f.drop_in_imported {
        Finding::new(
            "containerd.drop-in",
            Status::Ok,
            format!("{drop_in} is imported by {}", inputs.config.display()),
        )
    } else {
        let why = if f.chain.root_exists {
            format!(
                "{} imports no pattern that names it (containerd >= 2.2's default config imports \
                 /etc/containerd/conf.d/*.toml, but a config.toml is read as written)",
                inputs.config.display()
            )
        } else {
            format!(
                "{} does not exist: containerd's defaults import nothing",
                inputs.config.display()
            )
        };
        Finding::new(
            "containerd.drop-in",
            if configured {
                Status::Info
            } else {
                Status::Warn
            },
            format!("{drop_in} is not read by containerd"),
        )
        .detail(why)
        .fix(format!(
            "add `imports = [\"{}\"]` at the top level of {} (the installer does)",
            inputs
                .drop_in
                .parent()
                .map(|d| d.join("*.toml").display().to_string())
                .unwrap_or_default(),
            inputs.config.display()
        ))
    };
    out.push(finding);
    out
}

fn judge_handlers(f: &Facts, eff: &Effective, inputs: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let v = f.version;
    let before = |fix: Version| !v.is_some_and(|v| v.at_least(fix));
    let version_text = v.map_or("of unknown version".to_string(), |v| v.to_string());
    let names: Vec<&str> = eff.handlers.iter().map(|h| h.name.as_str()).collect();

    // The handler.
    match &inputs.runtime {
        Some(want) if !names.contains(&want.as_str()) => {
            let detail = match eff.runtime_types.iter().find(|(n, _)| n == want) {
                Some((_, t)) => format!("handler {want:?} has runtime_type {t:?}, not {RUNTIME_ID:?}"),
                None => format!("the effective config has no CRI runtime {want:?}"),
            };
            out.push(
                Finding::new(
                    "containerd.runtime",
                    Status::Block,
                    format!("no rsandbox handler {want:?}"),
                )
                .detail(detail)
                .fix(format!(
                    "configure [plugins.'{CRI_RUNTIME}'.containerd.runtimes.{want}] with \
                     runtime_type = '{RUNTIME_ID}' and sandboxer = 'shim'"
                )),
            );
        }
        _ if names.is_empty() => out.push(
            Finding::new(
                "containerd.runtime",
                Status::Warn,
                "no CRI handler runs rsandbox",
            )
            .detail(format!("no runtime has runtime_type = '{RUNTIME_ID}'"))
            .fix("install the drop-in (deploy/ or the .deb's /usr/share/rsandbox/conf.d/rsandbox.toml)"),
        ),
        _ => {
            for h in &eff.handlers {
                if h.sandboxer == "shim" {
                    out.push(Finding::new(
                        "containerd.runtime",
                        Status::Ok,
                        format!("handler {:?}: runtime_type '{RUNTIME_ID}', sandboxer 'shim'", h.name),
                    ));
                } else {
                    out.push(
                        Finding::new(
                            "containerd.runtime",
                            Status::Warn,
                            format!(
                                "handler {:?} has sandboxer {:?}: pods get a pause container, not the shim's pod",
                                h.name,
                                if h.sandboxer.is_empty() { "podsandbox" } else { &h.sandboxer }
                            ),
                        )
                        .fix(format!("set sandboxer = 'shim' on handler {:?}", h.name)),
                    );
                }
            }
        }
    }

    // An options table.
    let with_options: Vec<&str> = eff
        .handlers
        .iter()
        .filter(|h| h.has_options)
        .map(|h| h.name.as_str())
        .collect();
    out.push(if with_options.is_empty() {
        Finding::new(
            "containerd.options-table",
            Status::Ok,
            "no options table on an rsandbox handler",
        )
    } else if before(OPTIONS_FIXED) {
        Finding::new(
            "containerd.options-table",
            Status::Block,
            format!(
                "handler {with_options:?} has an options table: StartContainer fails on containerd {version_text}"
            ),
        )
        .detail(format!(
            "before {OPTIONS_FIXED}, CRI sends a non-runc runtime's options as runtimeoptions.v1.Options and \
             then asks for runc options (WithTaskAPIEndpoint): every container start fails"
        ))
        .fix(format!("remove the [...runtimes.<name>.options] table (or upgrade containerd to {OPTIONS_FIXED} or later)"))
    } else {
        Finding::new(
            "containerd.options-table",
            Status::Ok,
            format!("handler {with_options:?} has an options table (fine on containerd {version_text})"),
        )
    });

    // The default runtime.
    let ours = eff.default_runtime.as_deref().filter(|d| names.contains(d));
    out.push(match ours {
        Some(d) if before(HOST_NETWORK_FIXED) => Finding::new(
            "containerd.default-runtime",
            Status::Block,
            format!("default_runtime_name = {d:?} (rsandbox) on containerd {version_text}"),
        )
        .detail(format!(
            "every pod without a RuntimeClass runs on rsandbox, hostNetwork ones included (every DaemonSet's: \
             kube-proxy, CNI agents); before {HOST_NETWORK_FIXED} each crashes the whole containerd daemon"
        ))
        .fix("keep default_runtime_name = 'runc' and select rsandbox with a RuntimeClass"),
        Some(d) => Finding::new(
            "containerd.default-runtime",
            Status::Info,
            format!("default_runtime_name = {d:?}: every pod without a RuntimeClass runs on rsandbox"),
        ),
        None => Finding::new(
            "containerd.default-runtime",
            Status::Ok,
            format!(
                "default_runtime_name = {:?} (not rsandbox)",
                eff.default_runtime.as_deref().unwrap_or("runc")
            ),
        ),
    });

    // hostNetwork pods.
    out.push(if names.is_empty() {
        Finding::new(
            "containerd.host-network",
            Status::Info,
            "no rsandbox handler: nothing to judge",
        )
    } else if before(HOST_NETWORK_FIXED) {
        Finding::new(
            "containerd.host-network",
            Status::Warn,
            format!("a hostNetwork pod on an rsandbox handler crashes containerd {version_text}"),
        )
        .detail(format!(
            "containerd before {HOST_NETWORK_FIXED} panics in NewBundle (nil spec) for a hostNetwork pod with a \
             shim sandboxer, before the shim is reached: the node's container runtime restarts"
        ))
        .fix(format!(
            "keep hostNetwork pods off the rsandbox RuntimeClass (deploy/'s ValidatingAdmissionPolicy refuses them), \
             or upgrade containerd to {HOST_NETWORK_FIXED} or later"
        ))
    } else {
        Finding::new(
            "containerd.host-network",
            Status::Ok,
            format!("hostNetwork pods are safe on containerd {version_text}"),
        )
    });
    out
}

fn judge_shim_binary(f: &Facts) -> Finding {
    const ID: &str = "containerd.shim-binary";
    let ours = crate::version::VERSION;
    match (&f.shim_binary, &f.shim_version) {
        (None, _) => Finding::new(ID, Status::Warn, format!("containerd finds no {SHIM_BINARY}"))
            .detail("containerd looks in its $PATH, then next to its own binary")
            .fix(format!("install {SHIM_BINARY} into /usr/bin or /usr/local/bin")),
        (Some(p), Some(v)) if v == ours => Finding::new(
            ID,
            Status::Ok,
            format!("containerd starts {} (version {v})", p.display()),
        ),
        (Some(p), v) => Finding::new(
            ID,
            Status::Warn,
            format!(
                "containerd starts {} (version {}), not this check's {ours}",
                p.display(),
                v.as_deref().unwrap_or("unknown")
            ),
        )
        .detail("new pods run the binary containerd finds; running pods keep the shim they started with"),
    }
}

#[cfg(test)]
mod tests;
