//! Build script: generates Rust types for the CRI `runtime.v1` subset in `protos/`.
//!
//! Uses protobuf-codegen's pure-Rust parser, so no `protoc` is needed. The output goes to
//! `$OUT_DIR/cri/` and is included by `src/cri.rs`.

fn main() {
    const PROTO: &str = "protos/k8s.io/cri-api/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    protobuf_codegen::Codegen::new()
        .pure()
        .include("protos/k8s.io/cri-api")
        .input(PROTO)
        .cargo_out_dir("cri")
        .customize(protobuf_codegen::Customize::default().gen_mod_rs(true))
        .run_from_script();
}
