//! The shim's command line, parsed exactly as Go's `flag` package parses it for containerd's
//! shim library (`pkg/shim/shim.go` `parseFlags`), so an invocation means the same to us as to
//! `containerd-shim-runc-v2`.
//!
//! containerd runs `<shim> -namespace NS -address GRPC -publish-binary BIN -id ID [-bundle B]
//! [-debug] start|delete`, `<shim> -info` and `<shim> -v`; `start` runs the daemon as
//! `<shim> -namespace NS -id ID -address GRPC -socket unix://... [-debug]`.
//!
//! Go's rules: `-name` and `--name` are the same; a value is `-name value` or `-name=value`;
//! a boolean takes no separate value (`-debug`, `-debug=false`); parsing stops at the first
//! argument that is not a flag (the action word) or after `--`; an unknown flag is an error.

use std::ffi::OsString;

/// What the command line says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    /// `-debug`: debug-level logging.
    pub debug: bool,
    /// `-v` / `-version`: print the version and exit.
    pub version: bool,
    /// `-info`: print `RuntimeInfo` (protobuf) for the runtime options on stdin and exit.
    pub info: bool,
    /// `-namespace`: containerd namespace that owns the shim.
    pub namespace: String,
    /// `-id`: the task or sandbox ID.
    pub id: String,
    /// `-socket`: the daemon's socket address (`unix://...`).
    pub socket: String,
    /// `-debug-socket`: accepted for compatibility (the Go shim library's debug server).
    pub debug_socket: String,
    /// `-bundle`: the bundle when it is not the working directory (`delete`).
    pub bundle: String,
    /// `-address`: containerd's gRPC address.
    pub address: String,
    /// `-publish-binary`: containerd's binary (the Go shim library ignores it too).
    pub publish_binary: String,
    /// The first argument after the flags: `start`, `delete`, `check`, `unit`, or empty for
    /// the daemon.
    pub action: String,
    /// The arguments after the action (`check`'s and `unit`'s own); containerd passes none.
    pub args: Vec<String>,
}

/// Why a command line was rejected; the messages are Go's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("flag provided but not defined: -{0}")]
    Undefined(String),
    #[error("flag needs an argument: -{0}")]
    NeedsArgument(String),
    #[error("bad flag syntax: {0}")]
    BadSyntax(String),
    #[error("invalid boolean value {value:?} for -{name}")]
    BadBool { name: String, value: String },
    #[error("argument {0:?} is not UTF-8")]
    NotUtf8(OsString),
    /// `-h` or `-help`: Go prints the usage and exits 0.
    #[error("usage requested")]
    Help,
}

/// The flags' usage text (for `-h`).
pub const USAGE: &str = "\
Usage: containerd-shim-rsandbox-v1 [flags] [start|delete]
       containerd-shim-rsandbox-v1 check [-json] [check flags] (a node's preflight: check -h)
       containerd-shim-rsandbox-v1 unit COMMAND (systemd over D-Bus, for the installer: unit -h)
  -address string         grpc address back to main containerd
  -bundle string          path to the bundle if not workdir
  -debug                  enable debug output in logs
  -debug-socket string    accepted, unused
  -id string              id of the task
  -info                   get the option protobuf from stdin, print the shim info protobuf to stdout, and exit
  -namespace string       namespace that owns the shim
  -publish-binary string  accepted, unused (events go to $TTRPC_ADDRESS)
  -socket string          socket path to serve
  -v, -version            show the shim version and exit
";

/// Where a flag's value goes.
pub enum Slot<'a> {
    Bool(&'a mut bool),
    Text(&'a mut String),
}

/// A set of flags parsed with Go's rules ([`parse_into`]): the shim's own ([`Flags`]), or a
/// subcommand's (`check`).
pub trait FlagSet {
    /// The slot of flag `name` (without dashes), `None` if the set has no such flag.
    fn slot(&mut self, name: &str) -> Option<Slot<'_>>;
}

impl FlagSet for Flags {
    fn slot(&mut self, name: &str) -> Option<Slot<'_>> {
        Some(match name {
            "debug" => Slot::Bool(&mut self.debug),
            "v" | "version" => Slot::Bool(&mut self.version),
            "info" => Slot::Bool(&mut self.info),
            "namespace" => Slot::Text(&mut self.namespace),
            "id" => Slot::Text(&mut self.id),
            "socket" => Slot::Text(&mut self.socket),
            "debug-socket" => Slot::Text(&mut self.debug_socket),
            "bundle" => Slot::Text(&mut self.bundle),
            "address" => Slot::Text(&mut self.address),
            "publish-binary" => Slot::Text(&mut self.publish_binary),
            _ => return None,
        })
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: &[OsString]) -> Result<Flags, FlagError> {
    let args = args
        .iter()
        .map(|a| a.to_str().ok_or_else(|| FlagError::NotUtf8(a.clone())))
        .collect::<Result<Vec<&str>, _>>()?;
    let mut flags = Flags::default();
    let mut rest = parse_into(&args, &mut flags)?.into_iter();
    flags.action = rest.next().unwrap_or_default();
    flags.args = rest.collect();
    Ok(flags)
}

/// Parses `args` into `set` with Go's rules; returns the arguments after the flags (from the
/// first one that is no flag, or after `--`).
pub fn parse_into(args: &[&str], set: &mut dyn FlagSet) -> Result<Vec<String>, FlagError> {
    let mut args = args.iter().copied();
    let mut rest = Vec::new();
    while let Some(arg) = args.next() {
        // Not a flag ("start", "-"): the flags end here.
        let Some(dashed) = arg.strip_prefix('-').filter(|d| !d.is_empty()) else {
            rest.push(arg);
            break;
        };
        let name = match dashed.strip_prefix('-') {
            Some("") => break, // "--" ends the flags
            Some(n) => n,
            None => dashed,
        };
        if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
            return Err(FlagError::BadSyntax(arg.to_string()));
        }
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (name, None),
        };
        match set.slot(name) {
            Some(Slot::Bool(b)) => {
                *b = match value {
                    None => true,
                    Some(v) => parse_bool(v).ok_or_else(|| FlagError::BadBool {
                        name: name.to_string(),
                        value: v.to_string(),
                    })?,
                };
            }
            Some(Slot::Text(t)) => {
                // The value may be the next argument, whatever it looks like.
                let v = match value {
                    Some(v) => v,
                    None => args
                        .next()
                        .ok_or_else(|| FlagError::NeedsArgument(name.to_string()))?,
                };
                *t = v.to_string();
            }
            None if name == "h" || name == "help" => return Err(FlagError::Help),
            None => return Err(FlagError::Undefined(name.to_string())),
        }
    }
    rest.extend(args);
    Ok(rest.into_iter().map(String::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Flags, FlagError> {
        let v: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse(&v)
    }

    #[test]
    fn containerd_start_and_delete_command_lines() {
        // core/runtime/v2/binary.go via pkg/shim Command (2.1.9 and 2.3.4)
        let f = p(&[
            "-namespace",
            "k8s.io",
            "-address",
            "/run/containerd/containerd.sock",
            "-publish-binary",
            "/usr/bin/containerd",
            "-id",
            "abc",
            "-debug",
            "start",
        ])
        .unwrap();
        assert_eq!(
            f,
            Flags {
                debug: true,
                namespace: "k8s.io".into(),
                address: "/run/containerd/containerd.sock".into(),
                publish_binary: "/usr/bin/containerd".into(),
                id: "abc".into(),
                action: "start".into(),
                ..Default::default()
            }
        );
        let f = p(&[
            "-namespace",
            "default",
            "-address",
            "/a.sock",
            "-publish-binary",
            "/c",
            "-id",
            "t1",
            "-bundle",
            "/run/b/t1",
            "delete",
        ])
        .unwrap();
        assert_eq!(
            (f.bundle.as_str(), f.action.as_str()),
            ("/run/b/t1", "delete")
        );
        assert!(!f.debug);
    }

    #[test]
    fn daemon_and_query_command_lines() {
        let f = p(&[
            "-namespace",
            "n",
            "-id",
            "i",
            "-address",
            "/a",
            "-socket",
            "unix:///s/x",
        ])
        .unwrap();
        assert_eq!((f.socket.as_str(), f.action.as_str()), ("unix:///s/x", ""));
        assert!(p(&["-v"]).unwrap().version);
        assert!(p(&["-version"]).unwrap().version);
        assert!(p(&["--version"]).unwrap().version);
        assert!(p(&["-info"]).unwrap().info);
        assert_eq!(p(&[]).unwrap(), Flags::default());
    }

    #[test]
    fn go_value_forms() {
        let f = p(&["--id=a=b", "-namespace=", "-debug=false", "-info=1"]).unwrap();
        assert_eq!((f.id.as_str(), f.namespace.as_str()), ("a=b", ""));
        assert!(!f.debug && f.info);
        // A text flag takes the next argument even when it looks like a flag.
        let f = p(&["-id", "-debug", "start"]).unwrap();
        assert_eq!(
            (f.id.as_str(), f.debug, f.action.as_str()),
            ("-debug", false, "start")
        );
        // A boolean never takes the next argument: "false" is the action here.
        let f = p(&["-debug", "false"]).unwrap();
        assert_eq!((f.debug, f.action.as_str()), (true, "false"));
    }

    #[test]
    fn parsing_stops_at_the_action_or_double_dash() {
        let f = p(&["-id", "x", "delete", "-debug", "extra"]).unwrap();
        assert_eq!((f.action.as_str(), f.debug), ("delete", false));
        assert_eq!(f.args, ["-debug", "extra"]);
        let f = p(&["-id", "x", "--", "-debug"]).unwrap();
        assert_eq!((f.action.as_str(), f.debug), ("-debug", false));
        // A lone "-" is an argument, not a flag.
        assert_eq!(p(&["-", "start"]).unwrap().action, "-");
    }

    #[test]
    fn bad_command_lines_fail_with_gos_messages() {
        let cases: &[(&[&str], &str)] = &[
            (&["-nope"], "flag provided but not defined: -nope"),
            (&["-id"], "flag needs an argument: -id"),
            (&["---id", "x"], "bad flag syntax: ---id"),
            (&["-=x"], "bad flag syntax: -=x"),
            (&["-debug=yes"], "invalid boolean value \"yes\" for -debug"),
        ];
        for (args, msg) in cases {
            assert_eq!(p(args).unwrap_err().to_string(), *msg, "{args:?}");
        }
        assert_eq!(p(&["-h"]), Err(FlagError::Help));
        assert_eq!(p(&["--help"]), Err(FlagError::Help));
    }

    #[test]
    fn non_utf8_arguments_are_rejected() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'-', b'i', b'd', 0xff]);
        assert!(matches!(parse(&[bad]), Err(FlagError::NotUtf8(_))));
    }
}
