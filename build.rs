//! Build script:
//! 1. generates Rust types for the CRI `runtime.v1` subset in `protos/` (protobuf-codegen's
//!    pure-Rust parser, no `protoc`), into `$OUT_DIR/cri/`, included by `src/cri.rs`;
//! 2. builds the pause program (`pause/pause.rs`: `no_std`, no libc, static) with the
//!    toolchain's own `rustc` into `$OUT_DIR/rsandbox-pause`, embedded in the shim by
//!    `src/pod/pause_image.rs`. It is our own code, a few kilobytes: the pause process runs it
//!    from a sealed memfd instead of a copy of the shim.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    cri_types();
    pause_program();
}

fn cri_types() {
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

fn pause_program() {
    const SRC: &str = "pause/pause.rs";
    println!("cargo:rerun-if-changed={SRC}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let dest = out.join("rsandbox-pause");
    // Flags of the pause program only; the shim's RUSTFLAGS (sanitizers, coverage, ...) are
    // not meant for it. No start files, no libc, static and not position independent: the
    // kernel maps it and jumps to `_start`, nothing else runs.
    let status = Command::new(rustc)
        .args(["--edition", "2024", "--crate-type", "bin"])
        .args(["--crate-name", "rsandbox_pause", "--target", &target])
        .args([
            "-C",
            "panic=abort",
            "-C",
            "opt-level=s",
            "-C",
            "debuginfo=0",
        ])
        .args(["-C", "strip=symbols", "-C", "relocation-model=static"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args([
            "-C",
            "link-arg=-static",
            "-C",
            "link-arg=-Wl,--build-id=none",
        ])
        .arg("-o")
        .arg(&dest)
        .arg(SRC)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("run rustc for the pause program");
    assert!(status.success(), "building {SRC} failed: {status}");
}
