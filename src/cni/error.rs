//! Errors of the CNI module.

use std::io;
use std::path::PathBuf;

use super::exec::ExecError;
use super::result::ResultError;

/// A CNI command name, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `ADD`
    Add,
    /// `DEL`
    Del,
    /// `CHECK`
    Check,
}

impl Command {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn details_suffix(d: &Option<String>) -> String {
    match d {
        Some(d) if !d.is_empty() => format!("; {d}"),
        _ => String::new(),
    }
}

/// Everything that can go wrong in this module.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// The config dir has no `*.conf`/`*.conflist`/`*.json` file (or does not exist).
    #[error("no CNI network config found in {}", dir.display())]
    NoConfig {
        /// The config dir.
        dir: PathBuf,
    },
    /// The config dir exists but could not be listed.
    #[error("cannot read CNI config dir {}: {source}", dir.display())]
    ReadConfDir {
        /// The config dir.
        dir: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Config files exist but none is valid.
    #[error("no valid CNI network config in {}: {}", dir.display(), errors.join("; "))]
    NoValidConfig {
        /// The config dir.
        dir: PathBuf,
        /// Why each file was rejected, in file order.
        errors: Vec<String>,
    },
    /// A config file or document is invalid.
    #[error("invalid CNI config {source_name}: {reason}")]
    InvalidConfig {
        /// File path or other label of the document.
        source_name: String,
        /// What is wrong.
        reason: String,
    },
    /// A plugin `type` that is empty or contains `/`, `..` or NUL.
    #[error("invalid plugin type {0:?}")]
    InvalidPluginType(String),
    /// The plugin binary is in none of the bin dirs.
    #[error("failed to find plugin {plugin:?} in path {dirs:?}")]
    PluginNotFound {
        /// Plugin type.
        plugin: String,
        /// The dirs searched.
        dirs: Vec<PathBuf>,
    },
    /// A container ID, network name or interface name is not acceptable.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What kind of name.
        what: &'static str,
        /// The offending value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A `CNI_ARGS` key or value that would break the `K=V;K=V` encoding.
    #[error(
        "invalid CNI_ARGS entry {key:?}={value:?}: keys/values must be non-empty (keys) and contain no ';' or '='"
    )]
    InvalidArg {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// The plugin failed and reported a CNI error object.
    #[error(
        "plugin type={plugin:?} failed ({command}): CNI error code {code}: {msg}{}",
        details_suffix(details)
    )]
    Plugin {
        /// Plugin type.
        plugin: String,
        /// The command.
        command: Command,
        /// The CNI error code (1-99 spec-defined, 100+ plugin specific).
        code: u64,
        /// `msg`.
        msg: String,
        /// `details`, if given.
        details: Option<String>,
    },
    /// The plugin could not be run, timed out, or failed without a parsable error object.
    #[error("plugin type={plugin:?} failed ({command}): {source}")]
    Exec {
        /// Plugin type.
        plugin: String,
        /// The command.
        command: Command,
        /// What happened.
        source: ExecError,
    },
    /// The plugin was not run: the caller's deadline left it no time ([`super::Cni::del_until`]).
    #[error("plugin type={plugin:?} not run ({command}): no time left before the deadline")]
    NoTimeLeft {
        /// Plugin type.
        plugin: String,
        /// The command.
        command: Command,
    },
    /// ADD succeeded by exit code but the output is not a valid result.
    #[error("plugin type={plugin:?} returned an invalid result ({command}): {source}")]
    InvalidResult {
        /// Plugin type.
        plugin: String,
        /// The command.
        command: Command,
        /// What is wrong with it.
        source: ResultError,
    },
    /// CHECK on a config older than 0.4.0.
    #[error("configuration version {0:?} does not support the CHECK command")]
    CheckNotSupported(String),
    /// CHECK needs the result cached by ADD, and there is none.
    #[error(
        "no cached result for network {network:?}, container {container_id:?}, interface {ifname:?}"
    )]
    NoCachedResult {
        /// Network name.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface name.
        ifname: String,
    },
    /// The result cache could not be read or written.
    #[error("CNI result cache {}: {reason}", path.display())]
    Cache {
        /// The cache file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}
