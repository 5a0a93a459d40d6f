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
//! - a drop-in whose `version` is higher than the root config's: what each release does with it
//!   is in [`config_version`] (2.3.0 to 2.3.4 refuse to start, a refusal reverted after 2.3.4;
//!   2.1 and 2.2 drop a version-2 root's plugin sections; a root without `version` is loaded by
//!   every release).

mod config_version;
mod effective;
mod files;
mod version;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::node::Node;
use super::report::{Finding, Status};
use crate::records::bundle::RUNTIME_ID;
use effective::CRI_RUNTIME;
pub use effective::{Effective, Handler, parse_effective};
pub use files::{FileChain, LoadedFile, glob_match, imports_path, walk_files};
pub use version::{HOST_NETWORK_FIXED, OPTIONS_FIXED, Version};

/// containerd's default root config.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// The drop-in the installer writes.
pub const DEFAULT_DROP_IN: &str = "/etc/containerd/conf.d/rsandbox.toml";
/// The shim's binary name, as containerd derives it from the runtime type.
pub const SHIM_BINARY: &str = "containerd-shim-rsandbox-v1";

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

/// An imported file of a higher config version than the root's: what this containerd does
/// with it ([`config_version`]).
fn judge_config_versions(f: &Facts, root: &LoadedFile) -> Finding {
    use config_version::Verdict;
    let higher: Vec<(&LoadedFile, Verdict)> = f.chain.files[1..]
        .iter()
        .filter(|l| l.version > root.version)
        .map(|l| {
            (
                l,
                config_version::verdict(f.version, root.version, l.version),
            )
        })
        .collect();
    if higher.is_empty() {
        return Finding::new(
            "containerd.config-version",
            Status::Ok,
            format!("every file is config version {} or lower", root.version),
        );
    }
    let breaks = higher.iter().any(|(_, v)| matches!(v, Verdict::Breaks(_)));
    let untested = higher
        .iter()
        .any(|(_, v)| matches!(v, Verdict::Untested(_)));
    let detail: Vec<String> = higher
        .iter()
        .map(|(l, v)| {
            let (Verdict::Loads(why) | Verdict::Untested(why) | Verdict::Breaks(why)) = v;
            format!("{} (version {}): {why}", l.path.display(), l.version)
        })
        .collect();
    let status = if breaks {
        Status::Block
    } else if untested {
        Status::Warn
    } else {
        Status::Ok
    };
    let summary = format!(
        "an imported file has a higher config version than {} (version {})",
        root.path.display(),
        root.version
    );
    let finding =
        Finding::new("containerd.config-version", status, summary).detail(detail.join("\n"));
    if status == Status::Ok {
        return finding;
    }
    finding.fix(if root.version >= 2 {
        format!(
            "write the drop-in with `version = {}` and that version's plugin names, or \
             migrate the root config (`containerd config migrate`)",
            root.version
        )
    } else {
        // `version = 1`: containerd's deprecated version-1 layout.
        "migrate the root config to version 3 (`containerd config migrate`)".to_string()
    })
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
        out.push(judge_config_versions(f, root));
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
    let ours = crate::records::version::VERSION;
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
