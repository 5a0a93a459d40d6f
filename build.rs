//! Build script:
//! 1. generates Rust types for the CRI `runtime.v1` subset in `protos/` (protobuf-codegen's
//!    pure-Rust parser, no `protoc`), into `$OUT_DIR/cri/`, included by `src/records/cri.rs`;
//! 2. builds the pause program (`pause/pause.rs`: `no_std`, no libc, static) with the
//!    toolchain's own `rustc` into `$OUT_DIR/rsandbox-pause`, embedded in the shim by
//!    `src/pod/pause_image.rs`. It is our own code, a few kilobytes: the pause process runs it
//!    from a sealed memfd instead of a copy of the shim;
//! 3. records what `-v` prints besides the version (`src/records/version.rs`): the git revision the
//!    binary is built from and the Rust compiler that builds it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    cri_types();
    pause_program();
    build_info();
}

/// `RSANDBOX_REVISION`: the commit (`git rev-parse HEAD`), with containerd's `.m` suffix when
/// tracked files differ from it (containerd's Makefile: `git diff --no-ext-diff --quiet`); a
/// non-empty `RSANDBOX_REVISION` in the build's environment wins (a packager building from a
/// tarball that knows its commit; `hack/release.sh` builds from a `git archive` export);
/// `unknown` without either (a tarball: no `.git`). `RSANDBOX_RUSTC`: `$RUSTC --version`.
fn build_info() {
    const ENV: &str = "RSANDBOX_REVISION";
    println!("cargo:rerun-if-env-changed={ENV}");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let revision = match std::env::var(ENV) {
        Ok(r) if !r.trim().is_empty() => r.trim().to_string(),
        _ => git_revision(&dir).unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env={ENV}={revision}");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RSANDBOX_RUSTC={version}");
}

/// The commit of the checkout at `dir` (only when `dir` is its top: a tarball unpacked inside
/// another repository is no checkout of ours), `.m` appended when tracked files changed.
/// Watches what changes the answer: HEAD, the branch it names, the index and the crate's
/// inputs (for the `.m`).
fn git_revision(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .arg("--no-optional-locks")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim_end().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let head = git(&["rev-parse", "--verify", "HEAD"])?;
    let mut watched = vec!["HEAD".to_string(), "index".into(), "packed-refs".into()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // A path that does not exist would rerun the script on every build.
        if let Some(p) = git(&["rev-parse", "--git-path", &name]).map(|p| dir.join(p))
            && p.exists()
        {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    for input in ["src", "pause", "protos", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={input}");
    }
    let changes = git(&["status", "--porcelain", "--untracked-files=no"])?;
    Some(if changes.is_empty() {
        head
    } else {
        format!("{head}.m")
    })
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
    let mut cmd = Command::new(rustc);
    // The target's linker when one is configured (`CARGO_TARGET_<TRIPLE>_LINKER`, cargo hands
    // it over as RUSTC_LINKER): a cross build (aarch64 on x86_64) links the pause with it;
    // rustc's default, the host's `cc`, cannot link another architecture's objects.
    if let Some(linker) = std::env::var_os("RUSTC_LINKER") {
        cmd.arg("-C").arg({
            let mut arg = std::ffi::OsString::from("linker=");
            arg.push(linker);
            arg
        });
    }
    let status = cmd
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
