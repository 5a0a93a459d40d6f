//! The `start` handshake: what containerd sends on stdin, and the reply it reads back.
//!
//! Two protocols, told apart as the containerd-shim crate 0.12 (`bootstrap.rs`) and
//! containerd's `pkg/shim` (2.3) tell them apart:
//! - containerd 2.0 to 2.2 ("legacy"): flags and environment (`TTRPC_ADDRESS`,
//!   `GRPC_ADDRESS`) carry everything; stdin is empty or holds the runtime options as a
//!   protobuf `Any`; the reply is JSON `{"version":3,"address":"unix://...","protocol":"ttrpc"}`.
//! - containerd 2.3: stdin holds a protobuf `containerd.runtime.bootstrap.v1.BootstrapParams`
//!   whose `instance_id` and `namespace` equal `-id` and `-namespace`; the runtime options
//!   come as an extension, and the reply is a protobuf `BootstrapResult`.
//!
//! An `Any` decodes as `BootstrapParams` too (its type URL lands in `instance_id`, its value
//! in `namespace`, nothing else is set), so such "identity-only" params whose identity does
//! not match the flags are the legacy protocol; any other mismatch is an error (params meant
//! for another shim). Unparsable stdin is the legacy protocol with no options.

use std::io::{IsTerminal, Read};

use containerd_shim_protos::bootstrap_api::{BootstrapParams, BootstrapResult};
use containerd_shim_protos::shim::oci::Options as RuncOptions;
use protobuf::Message;
use protobuf::well_known_types::any::Any;

use crate::records::error::{Error, Result};
use crate::records::flags::Flags;

/// Task API version we serve (containerd.task.v3, and the sandbox API on the same socket).
pub const TASK_API_VERSION: i32 = 3;

/// Protocol of our ttrpc server.
pub const PROTOCOL: &str = "ttrpc";

/// containerd's cap on what it reads from a shim's stdin.
const MAX_INPUT: u64 = 10 << 20;

/// How containerd asked; decides the reply's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// containerd 2.0 to 2.2: JSON reply.
    Legacy,
    /// containerd 2.3+: `BootstrapParams` in, `BootstrapResult` out.
    Bootstrap,
}

/// The environment containerd sets for `start` (`pkg/shim` `Command`).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub ttrpc_address: Option<String>,
    pub grpc_address: Option<String>,
}

impl Env {
    pub fn from_process() -> Self {
        let get = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
        Env {
            ttrpc_address: get("TTRPC_ADDRESS"),
            grpc_address: get("GRPC_ADDRESS"),
        }
    }
}

/// What `start` needs, whichever protocol brought it.
#[derive(Debug, Clone, PartialEq)]
pub struct StartParams {
    pub protocol: Protocol,
    pub id: String,
    pub namespace: String,
    /// containerd's ttrpc address, where the daemon publishes events.
    pub ttrpc_address: String,
    /// containerd's gRPC address: passed on to the daemon, and part of the socket's hash.
    pub grpc_address: String,
    /// Debug logging: `-debug`, or a 2.3 log level of debug or more verbose.
    pub debug: bool,
    /// containerd 2.3's `socket_dir` (`None`: the default [`crate::records::bundle::SOCKET_DIR`]).
    pub socket_dir: Option<String>,
    /// Extensions: the runtime options, if any (as the `Any` containerd sent).
    pub extensions: Vec<Any>,
}

impl StartParams {
    /// `containerd.runc.v1.Options` among the extensions, if containerd sent them.
    pub fn runc_options(&self) -> Result<Option<RuncOptions>> {
        self.extensions
            .iter()
            .find(|a| is_runc_options(a))
            .map(|a| {
                RuncOptions::parse_from_bytes(&a.value)
                    .map_err(|e| Error::invalid(format!("runtime options: {e}")))
            })
            .transpose()
    }

    /// The runtime options to save in the bundle for the daemon (any `...Options` type).
    pub fn saved_options(&self) -> Option<&Any> {
        self.extensions
            .iter()
            .find(|a| a.type_url.ends_with("Options"))
    }
}

/// Whether `any` holds `containerd.runc.v1.Options` (containerd's typeurl writes the bare
/// name; protobuf's `Any::pack` adds a `type.googleapis.com/` prefix).
pub fn is_runc_options(any: &Any) -> bool {
    any.type_url.rsplit('/').next() == Some("containerd.runc.v1.Options")
}

/// Reads what containerd piped to `start` or `-info` (nothing when stdin is a terminal: a
/// person running the binary by hand).
pub fn read_stdin() -> std::io::Result<Vec<u8>> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(Vec::new());
    }
    let mut input = Vec::new();
    stdin.lock().take(MAX_INPUT).read_to_end(&mut input)?;
    Ok(input)
}

/// Interprets `start`'s stdin together with the flags and the environment.
pub fn parse_start(input: &[u8], flags: &Flags, env: &Env) -> Result<StartParams> {
    let params = match bootstrap_params(input, flags)? {
        Some(p) => from_bootstrap(p, flags, env),
        None => legacy(input, flags, env),
    };
    // The daemon needs it to publish events; fail here, where containerd shows the message,
    // rather than in the detached daemon.
    if params.ttrpc_address.is_empty() {
        return Err(Error::invalid(match params.protocol {
            Protocol::Bootstrap => {
                "containerd's TTRPC address is neither in the bootstrap params \
                 (containerd_ttrpc_address) nor in $TTRPC_ADDRESS"
            }
            Protocol::Legacy => "the TTRPC_ADDRESS environment variable is not set",
        }));
    }
    Ok(params)
}

/// `input` as containerd 2.3's `BootstrapParams`, or `None` for the legacy protocol.
fn bootstrap_params(input: &[u8], flags: &Flags) -> Result<Option<BootstrapParams>> {
    if input.is_empty() {
        return Ok(None);
    }
    let Ok(params) = BootstrapParams::parse_from_bytes(input) else {
        return Ok(None);
    };
    if params.instance_id == flags.id && params.namespace == flags.namespace {
        return Ok(Some(params));
    }
    let identity_only = BootstrapParams {
        instance_id: params.instance_id.clone(),
        namespace: params.namespace.clone(),
        ..Default::default()
    };
    if params == identity_only {
        return Ok(None); // a runtime-options Any
    }
    Err(Error::invalid(format!(
        "bootstrap params for {}/{} do not match the command line's {}/{}",
        params.namespace, params.instance_id, flags.namespace, flags.id
    )))
}

fn from_bootstrap(p: BootstrapParams, flags: &Flags, env: &Env) -> StartParams {
    // The Go shim library reads the event address from the environment in every protocol.
    let ttrpc_address = if p.containerd_ttrpc_address.is_empty() {
        env.ttrpc_address.clone().unwrap_or_default()
    } else {
        p.containerd_ttrpc_address
    };
    let grpc_address = if p.containerd_grpc_address.is_empty() {
        legacy_grpc_address(flags, env)
    } else {
        p.containerd_grpc_address
    };
    StartParams {
        protocol: Protocol::Bootstrap,
        id: p.instance_id,
        namespace: p.namespace,
        ttrpc_address,
        grpc_address,
        debug: flags.debug || is_debug_level(p.log_level.value()),
        socket_dir: p.socket_dir.filter(|d| !d.is_empty()),
        extensions: p
            .extensions
            .into_iter()
            .filter_map(|e| e.value.into_option())
            .collect(),
    }
}

fn legacy(input: &[u8], flags: &Flags, env: &Env) -> StartParams {
    // Runtime options, if any, are an Any with a type URL; anything else is ignored.
    let options = Any::parse_from_bytes(input)
        .ok()
        .filter(|a| !a.type_url.is_empty());
    StartParams {
        protocol: Protocol::Legacy,
        id: flags.id.clone(),
        namespace: flags.namespace.clone(),
        ttrpc_address: env.ttrpc_address.clone().unwrap_or_default(),
        grpc_address: legacy_grpc_address(flags, env),
        debug: flags.debug,
        socket_dir: None,
        extensions: options.into_iter().collect(),
    }
}

fn legacy_grpc_address(flags: &Flags, env: &Env) -> String {
    if flags.address.is_empty() {
        env.grpc_address.clone().unwrap_or_default()
    } else {
        flags.address.clone()
    }
}

/// Whether a (open-enum) log level is debug or more verbose: its nearest known level is
/// DEBUG (-4) or TRACE (-8); -2 is as near INFO (0) as DEBUG and counts as INFO.
fn is_debug_level(level: i32) -> bool {
    level <= -3
}

/// The reply to `start` in the format `protocol` expects.
pub fn encode_reply(address: &str, protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::Legacy => {
            // Field order as Go's json.Marshal of pkg/shim's BootstrapParams struct writes it.
            #[derive(serde::Serialize)]
            struct Reply<'a> {
                version: i32,
                address: &'a str,
                protocol: &'a str,
            }
            serde_json::to_vec(&Reply {
                version: TASK_API_VERSION,
                address,
                protocol: PROTOCOL,
            })
            .unwrap_or_default()
        }
        Protocol::Bootstrap => BootstrapResult {
            version: TASK_API_VERSION,
            address: address.to_string(),
            protocol: PROTOCOL.to_string(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::bootstrap_api::{Extension, LogLevel};
    use protobuf::EnumOrUnknown;

    const ID: &str = "abc";
    const NS: &str = "k8s.io";
    const TTRPC: &str = "/run/containerd/containerd.sock.ttrpc";
    const GRPC: &str = "/run/containerd/containerd.sock";

    fn flags() -> Flags {
        Flags {
            id: ID.into(),
            namespace: NS.into(),
            address: GRPC.into(),
            publish_binary: "/usr/bin/containerd".into(),
            action: "start".into(),
            ..Default::default()
        }
    }

    fn env() -> Env {
        Env {
            ttrpc_address: Some(TTRPC.into()),
            grpc_address: Some(GRPC.into()),
        }
    }

    fn runc_options() -> RuncOptions {
        RuncOptions {
            shim_cgroup: "/shims".into(),
            binary_name: "crun".into(),
            ..Default::default()
        }
    }

    /// As containerd's typeurl writes it: the bare type name.
    fn options_any(o: &RuncOptions) -> Any {
        Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        }
    }

    fn params_2_3() -> BootstrapParams {
        BootstrapParams {
            instance_id: ID.into(),
            namespace: NS.into(),
            log_level: EnumOrUnknown::new(LogLevel::LOG_LEVEL_INFO),
            containerd_version: "v2.3.4".into(),
            containerd_ttrpc_address: TTRPC.into(),
            containerd_grpc_address: GRPC.into(),
            containerd_binary: "/usr/bin/containerd".into(),
            socket_dir: Some("/run/containerd/s".into()),
            extensions: vec![Extension {
                value: Some(options_any(&runc_options())).into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// stdin bytes in, reply bytes out: the whole handshake minus the socket.
    fn handshake(input: &[u8], flags: &Flags, env: &Env) -> Result<(StartParams, Vec<u8>)> {
        let p = parse_start(input, flags, env)?;
        let reply = encode_reply("unix:///run/containerd/s/0123", p.protocol);
        Ok((p, reply))
    }

    #[test]
    fn containerd_2_1_empty_stdin_gets_the_json_reply() {
        let (p, reply) = handshake(&[], &flags(), &env()).unwrap();
        assert_eq!(p.protocol, Protocol::Legacy);
        assert_eq!(
            (
                p.id.as_str(),
                p.namespace.as_str(),
                p.ttrpc_address.as_str(),
                p.grpc_address.as_str()
            ),
            (ID, NS, TTRPC, GRPC)
        );
        assert!(p.extensions.is_empty() && p.socket_dir.is_none() && !p.debug);
        assert_eq!(
            String::from_utf8(reply).unwrap(),
            r#"{"version":3,"address":"unix:///run/containerd/s/0123","protocol":"ttrpc"}"#
        );
    }

    #[test]
    fn containerd_2_1_runtime_options_on_stdin_become_the_extension() {
        let input = options_any(&runc_options()).write_to_bytes().unwrap();
        let (p, reply) = handshake(&input, &flags(), &env()).unwrap();
        assert_eq!(p.protocol, Protocol::Legacy);
        assert_eq!(p.runc_options().unwrap(), Some(runc_options()));
        assert_eq!(p.saved_options(), Some(&options_any(&runc_options())));
        assert!(reply.starts_with(b"{\"version\":3,"));
    }

    #[test]
    fn default_runc_options_are_not_mistaken_for_bootstrap_params() {
        // Default options encode to nothing: the Any is a type URL alone and decodes as
        // BootstrapParams { instance_id: <url> }.
        let input = options_any(&RuncOptions::default())
            .write_to_bytes()
            .unwrap();
        let p = parse_start(&input, &flags(), &env()).unwrap();
        assert_eq!(p.protocol, Protocol::Legacy);
        assert_eq!(p.id, ID);
        assert_eq!(p.runc_options().unwrap(), Some(RuncOptions::default()));
    }

    #[test]
    fn cri_runtimeoptions_on_stdin_are_saved_but_are_no_runc_options() {
        let any = Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: b"\x12\x05a = 1".to_vec(),
            ..Default::default()
        };
        let p = parse_start(&any.write_to_bytes().unwrap(), &flags(), &env()).unwrap();
        assert_eq!(p.protocol, Protocol::Legacy);
        assert_eq!(p.runc_options().unwrap(), None);
        assert_eq!(p.saved_options(), Some(&any));
    }

    #[test]
    fn garbage_on_stdin_is_legacy_without_options() {
        let p = parse_start(&[0xff, 0xfe, 0x01], &flags(), &env()).unwrap();
        assert_eq!(p.protocol, Protocol::Legacy);
        assert!(p.extensions.is_empty());
    }

    #[test]
    fn legacy_needs_ttrpc_address_in_the_environment() {
        let e = parse_start(&[], &flags(), &Env::default()).unwrap_err();
        assert!(e.to_string().contains("TTRPC_ADDRESS"), "{e}");
    }

    #[test]
    fn legacy_grpc_address_falls_back_to_the_environment() {
        let mut f = flags();
        f.address.clear();
        assert_eq!(parse_start(&[], &f, &env()).unwrap().grpc_address, GRPC);
    }

    #[test]
    fn containerd_2_3_params_get_the_protobuf_reply() {
        let input = params_2_3().write_to_bytes().unwrap();
        let (p, reply) = handshake(&input, &flags(), &Env::default()).unwrap();
        assert_eq!(
            p,
            StartParams {
                protocol: Protocol::Bootstrap,
                id: ID.into(),
                namespace: NS.into(),
                ttrpc_address: TTRPC.into(),
                grpc_address: GRPC.into(),
                debug: false,
                socket_dir: Some("/run/containerd/s".into()),
                extensions: vec![options_any(&runc_options())],
            }
        );
        let r = BootstrapResult::parse_from_bytes(&reply).unwrap();
        assert_eq!(
            (r.version, r.address.as_str(), r.protocol.as_str()),
            (3, "unix:///run/containerd/s/0123", "ttrpc")
        );
        // Exactly these three fields, nothing else on the wire.
        let want = BootstrapResult {
            version: 3,
            address: "unix:///run/containerd/s/0123".into(),
            protocol: "ttrpc".into(),
            ..Default::default()
        };
        assert_eq!(reply, want.write_to_bytes().unwrap());
        assert_eq!(&reply[..2], &[0x08, 0x03]);
    }

    #[test]
    fn containerd_2_3_params_without_ttrpc_address_use_the_environment() {
        let mut params = params_2_3();
        params.containerd_ttrpc_address.clear();
        let input = params.write_to_bytes().unwrap();
        let (p, reply) = handshake(&input, &flags(), &env()).unwrap();
        assert_eq!(
            (p.protocol, p.ttrpc_address.as_str()),
            (Protocol::Bootstrap, TTRPC)
        );
        assert!(BootstrapResult::parse_from_bytes(&reply).is_ok());
        // Neither there: a message that names both places.
        let e = parse_start(&input, &flags(), &Env::default()).unwrap_err();
        assert!(
            e.to_string().contains("containerd_ttrpc_address")
                && e.to_string().contains("$TTRPC_ADDRESS"),
            "{e}"
        );
    }

    #[test]
    fn containerd_2_3_params_for_another_shim_are_rejected() {
        let mut params = params_2_3();
        params.instance_id = "someone-else".into();
        let e = parse_start(&params.write_to_bytes().unwrap(), &flags(), &env()).unwrap_err();
        assert!(e.to_string().contains("do not match"), "{e}");
    }

    #[test]
    fn containerd_2_3_log_level_and_debug_flag() {
        for (level, flag, debug) in [
            (0, false, false),
            (-2, false, false),
            (-3, false, true),
            (-4, false, true),
            (-8, false, true),
            (4, true, true),
        ] {
            let mut params = params_2_3();
            params.log_level = EnumOrUnknown::from_i32(level);
            let mut f = flags();
            f.debug = flag;
            let p = parse_start(&params.write_to_bytes().unwrap(), &f, &env()).unwrap();
            assert_eq!(p.debug, debug, "level {level} flag {flag}");
        }
    }

    #[test]
    fn containerd_2_3_empty_socket_dir_is_the_default() {
        let mut params = params_2_3();
        params.socket_dir = Some(String::new());
        let p = parse_start(&params.write_to_bytes().unwrap(), &flags(), &env()).unwrap();
        assert_eq!(p.socket_dir, None);
    }

    #[test]
    fn runc_options_type_url_may_carry_a_prefix() {
        let mut any = options_any(&runc_options());
        any.type_url = "type.googleapis.com/containerd.runc.v1.Options".into();
        assert!(is_runc_options(&any));
        any.type_url = "runtimeoptions.v1.Options".into();
        assert!(!is_runc_options(&any));
    }
}
