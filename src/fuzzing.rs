//! Entry points for the fuzzers: every decoder that reads client input, each taking raw
//! bytes. The property is that none of them panics (or hangs) on any input. `fuzz/` wraps each
//! in a libFuzzer target (`hack/fuzz.sh`), and `tests/fuzz_corpus.rs` replays the committed
//! corpus through them on stable Rust, so CI checks every seed on every run.

use std::io::Cursor;
use std::path::Path;

use containerd_shim_protos::api::{
    CreateTaskRequest, ExecProcessRequest, KillRequest, StateRequest, WaitRequest,
};
use containerd_shim_protos::sandbox_api::{CreateSandboxRequest, WaitSandboxRequest};
use protobuf::Message;
use protobuf::well_known_types::any::Any;

/// A fuzz target: raw bytes in, no panic out.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `fuzz/fuzz_targets/*.rs` and `fuzz/corpus/*`).
pub const TARGETS: &[(&str, Target)] = &[
    ("pod_config", pod_config),
    ("oci_spec", oci_spec),
    ("runtime_options", runtime_options),
    ("cni_result", cni_result),
    ("shim_config", shim_config),
    ("ttrpc_frames", ttrpc_frames),
];

/// CreateSandboxRequest.options: a CRI `PodSandboxConfig`, decoded and validated.
pub fn pod_config(data: &[u8]) {
    let any = Any {
        type_url: "runtime.v1.PodSandboxConfig".into(),
        value: data.to_vec(),
        ..Default::default()
    };
    if let Ok(spec) = crate::pod::decode_pod_config(&any) {
        let _ = spec.effective_sysctls(Default::default());
        // The bandwidth annotations (resource quantities) are decoded here.
        let _ = spec.network_conf();
    }
}

/// A container's `config.json` and an exec's process spec, through every edit we make.
pub fn oci_spec(data: &[u8]) {
    let _ = crate::records::oci::exec_process_spec(data, true);
    let _ = crate::records::oci::exec_process_spec(data, false);
    let Ok(mut spec) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = crate::records::oci::check_container_spec(&spec, false);
    let _ = crate::records::oci::wants_new_netns(&spec);
    let _ = crate::records::oci::shares_pid_namespace(&spec);
    crate::records::oci::set_netns_path(&mut spec, Path::new("/run/netns/fuzz"));
}

/// The runtime options Any that `start` saves and `Task.Create` carries.
pub fn runtime_options(data: &[u8]) {
    for type_url in [
        "containerd.runc.v1.Options",
        "containerd.linux.runc.CreateOptions",
        "runtimeoptions.v1.Options",
    ] {
        let any = Any {
            type_url: type_url.into(),
            value: data.to_vec(),
            ..Default::default()
        };
        let _ = crate::server::rpc::task::runc_config_from_options(
            Some(&any),
            &crate::host::runtime::RuncConfig::defaults("fuzz"),
            "fuzz",
        );
    }
    // The file `start` writes into the bundle holds the whole Any.
    if let Ok(any) = Any::parse_from_bytes(data) {
        let _ = crate::server::rpc::task::runc_config_from_options(
            Some(&any),
            &crate::host::runtime::RuncConfig::defaults("fuzz"),
            "fuzz",
        );
    }
}

/// What a CNI plugin prints on stdout: a result (any spec version), and the config files.
pub fn cni_result(data: &[u8]) {
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        if let Ok(r) = crate::cni::CniResult::parse(data, version) {
            let _ = r.sandbox_addrs("eth0");
        }
    }
    let _ = crate::cni::NetworkConfig::from_conflist_bytes(data, "fuzz.conflist");
    let _ = crate::cni::NetworkConfig::from_conf_bytes(data, "fuzz.conf");
}

/// The shim's own config file.
pub fn shim_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::records::config::ShimConfig::parse(text);
    }
}

/// Bytes on the shim's socket: frames, the ttrpc request envelope, and the requests whose
/// fields we read before validating them.
pub fn ttrpc_frames(data: &[u8]) {
    let mut r = Cursor::new(data);
    while let Ok((_, payload)) = crate::shim::wire::read_frame(&mut r) {
        let Ok(req) = <ttrpc::Request as ttrpc::proto::Codec>::decode(&payload) else {
            continue;
        };
        let p = &req.payload;
        let _ = CreateTaskRequest::parse_from_bytes(p);
        let _ = ExecProcessRequest::parse_from_bytes(p);
        let _ = StateRequest::parse_from_bytes(p);
        let _ = KillRequest::parse_from_bytes(p);
        let _ = WaitRequest::parse_from_bytes(p);
        let _ = WaitSandboxRequest::parse_from_bytes(p);
        if let Ok(c) = CreateSandboxRequest::parse_from_bytes(p)
            && let Some(any) = c.options.as_ref()
        {
            let _ = crate::pod::decode_pod_config(any);
        }
    }
}
