//! `containerd-shim-rsandbox-v1 check`: the node preflight a person and an installer run.
//!
//! Named as kata's `kata-runtime check` and gVisor's `runsc` host checks are, a verb of the
//! runtime's own binary: the binary that will run the pods judges the node it is on, with the
//! code it will run (the shim config parser, the systemd client, the SELinux detection,
//! `-info`'s runc features), so the verdict cannot drift from what the shim does.
//!
//! It reports and judges ([`report::Finding`], stable ids): the shim config, runc, the kernel
//! facilities the shim uses, cgroups and their driver, systemd where the driver needs it,
//! SELinux, and containerd: its version, its config files and effective config, and the
//! hazards of rsandbox on it ([`containerd`]), and the node's shape: which distribution runs
//! containerd, and whether the drop-in is where it reads ([`distro`]); then what a containerd restart does to running
//! rsandbox pods, by the node's kubelet's version ([`kubelet`], [`restart`]); and static pods on the
//! rsandbox class, which no admission policy sees ([`static_pods`]). Exit status 0 without a
//! blocking finding, 1 with one, 2 on a usage error; `-json` prints the `rsandbox-check/v1` document.
//!
//! Every probe goes through [`node::Node`] (tests fake a node); every command is bounded;
//! nothing touches the network or changes the node.

pub mod cgroup;
pub mod containerd;
pub mod distro;
pub mod kernel;
pub mod kubelet;
pub mod node;
pub mod report;
pub mod restart;
pub mod runc;
pub mod selinux;
pub mod shim_config;
pub mod static_pods;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::records::flags::{FlagError, FlagSet, Slot};
use node::Node;
use report::{EXIT_OK, EXIT_USAGE, Report};

/// `check`'s usage (`check -h`).
pub const USAGE: &str = "\
Usage: containerd-shim-rsandbox-v1 check [flags]
Judges this node for rsandbox pods; exit 0: nothing blocking, 1: a blocking problem, 2: usage.
  -json                     print the rsandbox-check/v1 JSON document instead of the report
  -containerd PATH          containerd binary (default: containerd in $PATH, /usr/bin, /usr/local/bin)
  -containerd-config PATH   containerd's root config (default /etc/containerd/config.toml)
  -runtime NAME             the CRI handler that must exist (missing: blocking)
  -drop-in PATH             the drop-in whose import is judged (default /etc/containerd/conf.d/rsandbox.toml)
  -runc PATH                runc (default: the handler's BinaryName, else runc in $PATH)
  -shim-config PATH         the shim's config (default: RSANDBOX_CONFIG in containerd's shim env,
                            else $RSANDBOX_CONFIG, else /etc/containerd/rsandbox.toml)
  -kubelet-config PATH      read for cgroupDriver and staticPodPath; also says this node has a kubelet
                            (default /var/lib/kubelet/config.yaml)
  -timeout SECONDS          bound of each command it runs (default 10)
";

/// `check`'s flags, as given (empty: the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub json: bool,
    pub containerd: String,
    pub containerd_config: String,
    pub runtime: String,
    pub drop_in: String,
    pub runc: String,
    pub shim_config: String,
    pub kubelet_config: String,
    pub timeout: String,
}

impl FlagSet for Options {
    fn slot(&mut self, name: &str) -> Option<Slot<'_>> {
        Some(match name {
            "json" => Slot::Bool(&mut self.json),
            "containerd" => Slot::Text(&mut self.containerd),
            "containerd-config" => Slot::Text(&mut self.containerd_config),
            "runtime" => Slot::Text(&mut self.runtime),
            "drop-in" => Slot::Text(&mut self.drop_in),
            "runc" => Slot::Text(&mut self.runc),
            "shim-config" => Slot::Text(&mut self.shim_config),
            "kubelet-config" => Slot::Text(&mut self.kubelet_config),
            "timeout" => Slot::Text(&mut self.timeout),
            _ => return None,
        })
    }
}

/// Why `check`'s command line was refused.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error("unexpected argument {0:?}")]
    Extra(String),
    #[error("-timeout {0:?}: want a number of seconds from 1 to 600")]
    Timeout(String),
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, UsageError> {
        let mut o = Options::default();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let rest = crate::records::flags::parse_into(&args, &mut o)?;
        if let Some(extra) = rest.into_iter().next() {
            return Err(UsageError::Extra(extra));
        }
        o.timeout()?;
        Ok(o)
    }

    fn timeout(&self) -> Result<Duration, UsageError> {
        if self.timeout.is_empty() {
            return Ok(Duration::from_secs(10));
        }
        match self.timeout.parse::<u64>() {
            Ok(s @ 1..=600) => Ok(Duration::from_secs(s)),
            _ => Err(UsageError::Timeout(self.timeout.clone())),
        }
    }

    fn path_or(&self, value: &str, default: &str) -> PathBuf {
        PathBuf::from(if value.is_empty() { default } else { value })
    }

    fn given(value: &str) -> Option<&str> {
        (!value.is_empty()).then_some(value)
    }
}

/// Runs `check` with its arguments on this node; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let options = match Options::parse(args) {
        Ok(o) => o,
        Err(UsageError::Flag(FlagError::Help)) => {
            print!("{USAGE}");
            return EXIT_OK;
        }
        Err(e) => {
            eprintln!("containerd-shim-rsandbox-v1 check: {e}");
            eprint!("{USAGE}");
            return EXIT_USAGE;
        }
    };
    let report = run(&node::System, &options);
    if options.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        print!("{}", report.to_text());
    }
    report.exit_status()
}

/// Gathers and judges everything on `node`.
pub fn run(node: &dyn Node, o: &Options) -> Report {
    let timeout = o.timeout().unwrap_or(Duration::from_secs(10));
    let mut report = Report::default();

    let ctd_inputs = containerd::Inputs {
        binary: Options::given(&o.containerd).map(PathBuf::from),
        config: o.path_or(&o.containerd_config, containerd::DEFAULT_CONFIG),
        drop_in: o.path_or(&o.drop_in, containerd::DEFAULT_DROP_IN),
        runtime: Options::given(&o.runtime).map(String::from),
        timeout,
    };
    let ctd = containerd::gather(node, &ctd_inputs);
    let effective = ctd.effective.as_ref().and_then(|e| e.as_ref().ok());

    let shim = shim_config::gather(
        node,
        Options::given(&o.shim_config).map(Path::new),
        effective.and_then(|e| e.shim_config_env.as_deref()),
    );
    report.add([shim_config::judge(&shim)]);
    report.fact("shim_config", shim_config::facts_json(&shim));

    report.add(containerd::judge(&ctd, &ctd_inputs));
    report.fact("containerd", containerd::facts_json(&ctd, &ctd_inputs));

    // where this distribution's containerd reads, and whether the drop-in is there
    let shape = distro::gather(node, &ctd_inputs.config, &ctd_inputs.drop_in);
    report.add([distro::judge(&shape)]);
    report.fact("node_shape", distro::facts_json(&shape));

    // The runc the rsandbox handler names (containerd >= 2.3.1 passes BinaryName), else
    // `runc` as the shim looks it up.
    let handler_runc = effective.and_then(|e| {
        let wanted = Options::given(&o.runtime);
        e.handlers
            .iter()
            .find(|h| wanted.is_none_or(|w| h.name == w))
            .and_then(|h| h.binary_name.clone())
    });
    let runc_name = Options::given(&o.runc).map(String::from).or(handler_runc);
    let runc = runc::gather(node, runc_name.as_deref(), timeout);
    report.add(runc::judge(&runc));
    report.fact("runc", runc::facts_json(&runc));

    let kubelet_config = o.path_or(&o.kubelet_config, cgroup::DEFAULT_KUBELET_CONFIG);
    let cgroups = cgroup::gather(
        node,
        effective.is_some_and(|e| e.runc_systemd_cgroup),
        &kubelet_config,
    );
    let kernel = kernel::gather(node, cgroups.unified_only());
    report.add(kernel::judge(&kernel));
    report.fact("kernel", kernel::facts_json(&kernel));
    report.add(cgroup::judge(&cgroups));
    let (cg, sd) = cgroup::facts_json(&cgroups);
    report.fact("cgroup", cg);
    report.fact("systemd", sd);

    let se = selinux::gather(node);
    report.add([selinux::judge(&se)]);
    report.fact("selinux", selinux::facts_json(&se));

    let kubelet = kubelet::gather(node, &kubelet_config, timeout);
    report.add(restart::judge(&kubelet));
    report.fact("kubelet", kubelet::facts_json(&kubelet));

    let handlers: Vec<String> = effective
        .map(|e| e.handlers.iter().map(|h| h.name.clone()).collect())
        .unwrap_or_default();
    let statics = static_pods::gather(node, &kubelet_config, &handlers);
    report.add([static_pods::judge(&statics, ctd.version)]);
    report.fact("static_pods", static_pods::facts_json(&statics));
    report
}

#[cfg(test)]
mod tests;
