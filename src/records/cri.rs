//! Kubernetes CRI `runtime.v1` types (a subset), generated at build time from
//! `protos/k8s.io/cri-api/runtime/v1/api.proto`.
//!
//! The generated code uses the same `protobuf` 3.7 crate as `containerd-shim-protos`, so the
//! `Any` found in `CreateSandboxRequest.options` can be unpacked directly with
//! [`PodSandboxConfig::parse_from_bytes`](protobuf::Message::parse_from_bytes) on its `value`.

// The generated file carries its own inner `#![allow(...)]`s (clippy::all, missing_docs, naming).
mod generated {
    include!(concat!(env!("OUT_DIR"), "/cri/mod.rs"));
}

pub use generated::api::*;

/// The `type_url` containerd uses for a CRI `PodSandboxConfig` packed into an `Any`.
pub const POD_SANDBOX_CONFIG_TYPE_URL: &str = "runtime.v1.PodSandboxConfig";

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::{Message, well_known_types::any::Any};

    fn sample() -> PodSandboxConfig {
        let mut cfg = PodSandboxConfig::new();
        let md = cfg.metadata.mut_or_insert_default();
        md.name = "web".into();
        md.namespace = "default".into();
        md.uid = "0b7c1c6e-1d1b-4c1e-9f3c-3a4e5f6a7b8c".into();
        md.attempt = 2;
        cfg.hostname = "web".into();
        cfg.log_directory = "/var/log/pods/default_web_uid".into();
        let dns = cfg.dns_config.mut_or_insert_default();
        dns.servers = vec!["10.96.0.10".into()];
        dns.searches = vec!["default.svc.cluster.local".into()];
        dns.options = vec!["ndots:5".into()];
        let mut pm = PortMapping::new();
        pm.protocol = Protocol::UDP.into();
        pm.container_port = 53;
        pm.host_port = 5353;
        pm.host_ip = "127.0.0.1".into();
        cfg.port_mappings.push(pm);
        cfg.labels.insert("app".into(), "web".into());
        cfg.annotations.insert("a".into(), "b".into());
        let linux = cfg.linux.mut_or_insert_default();
        linux.cgroup_parent = "/kubepods/besteffort/pod123".into();
        linux
            .sysctls
            .insert("net.ipv4.ip_forward".into(), "1".into());
        let sc = linux.security_context.mut_or_insert_default();
        sc.run_as_user.mut_or_insert_default().value = 65534;
        sc.privileged = true;
        let ns = sc.namespace_options.mut_or_insert_default();
        ns.network = NamespaceMode::NODE.into();
        ns.pid = NamespaceMode::TARGET.into();
        ns.target_id = "abc".into();
        ns.userns_options.mut_or_insert_default().mode = NamespaceMode::NODE.into();
        cfg
    }

    #[test]
    fn roundtrip_through_shim_protos_any() {
        let cfg = sample();
        // Build the Any with the type from containerd-shim-protos' re-export: it must be the
        // very same `protobuf` crate our generated code uses, or this does not compile.
        let any = Any {
            type_url: POD_SANDBOX_CONFIG_TYPE_URL.into(),
            value: cfg.write_to_bytes().unwrap(),
            ..Default::default()
        };
        let wire = any.write_to_bytes().unwrap();
        let any2 = Any::parse_from_bytes(&wire).unwrap();
        assert_eq!(any2.type_url, "runtime.v1.PodSandboxConfig");
        let back = PodSandboxConfig::parse_from_bytes(&any2.value).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(back.metadata.name, "web");
        assert_eq!(
            back.linux
                .security_context
                .namespace_options
                .pid
                .enum_value(),
            Ok(NamespaceMode::TARGET)
        );
        assert_eq!(
            back.port_mappings[0].protocol.enum_value(),
            Ok(Protocol::UDP)
        );
    }

    #[test]
    fn field_numbers_match_upstream() {
        // Hand-encoded wire bytes using upstream field numbers: metadata(1){name(1)="p"},
        // hostname(2)="h", linux(8){security_context(2){namespace_options(1){ipc(3)=NODE}},
        // run_as_group(8){value(1)=7}}}, plus an unknown field 9 (windows) that must be skipped.
        let bytes: &[u8] = &[
            0x0a, 0x03, 0x0a, 0x01, b'p', // metadata { name: "p" }
            0x12, 0x01, b'h', // hostname: "h"
            0x42, 0x0a, // linux, len 10
            0x12, 0x08, // security_context, len 8
            0x0a, 0x02, 0x18, 0x02, // namespace_options { ipc: NODE }
            0x42, 0x02, 0x08, 0x07, // run_as_group { value: 7 }
            0x4a, 0x00, // windows {} (not in our subset)
        ];
        let cfg = PodSandboxConfig::parse_from_bytes(bytes).unwrap();
        assert_eq!(cfg.metadata.name, "p");
        assert_eq!(cfg.hostname, "h");
        let sc = &cfg.linux.security_context;
        assert_eq!(
            sc.namespace_options.ipc.enum_value(),
            Ok(NamespaceMode::NODE)
        );
        assert_eq!(sc.run_as_group.value, 7);
    }
}
