//! What this binary is: its version, the git revision it was built from and the compiler that
//! built it (recorded by `build.rs`), as `-v` prints them and `-info` and `check` report them.

/// The crate's version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (`.m` appended when tracked files differed from
/// it, as containerd marks a modified tree), the packager's `RSANDBOX_REVISION`, or
/// [`UNKNOWN_REVISION`] for a build outside a git checkout.
pub const REVISION: &str = env!("RSANDBOX_REVISION");

/// [`REVISION`] of a build with neither git metadata nor `RSANDBOX_REVISION`.
pub const UNKNOWN_REVISION: &str = "unknown";

/// `rustc --version` of the compiler that built the binary.
pub const RUSTC: &str = env!("RSANDBOX_RUSTC");

/// The `-v` text, in the layout of containerd's shims (`pkg/shim/shim.go` in v2.1.9:
/// the binary's name, `Version:`, `Revision:`, the toolchain, then an empty line), with the
/// Rust compiler in place of Go's version.
pub fn text(binary: &str) -> String {
    let revision = if REVISION == UNKNOWN_REVISION {
        "unknown (built without git metadata: set RSANDBOX_REVISION when building from a tarball)"
    } else {
        REVISION
    };
    format!("{binary}:\n  Version:  {VERSION}\n  Revision: {revision}\n  Rust version: {RUSTC}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// containerd's layout, line for line (`fmt.Println("  Version: ", v)` prints two spaces).
    #[test]
    fn text_has_containerd_shims_layout() {
        let t = text("containerd-shim-rsandbox-v1");
        let lines: Vec<&str> = t.split('\n').collect();
        assert_eq!(lines[0], "containerd-shim-rsandbox-v1:");
        assert_eq!(lines[1], format!("  Version:  {VERSION}"));
        assert!(lines[2].starts_with("  Revision: "), "{t}");
        assert!(lines[3].starts_with("  Rust version: rustc "), "{t}");
        assert_eq!(&lines[4..], ["", ""]);
    }

    /// The revision is a commit (40 hex digits, `.m` when modified) in a checkout, else says
    /// it is unknown.
    #[test]
    fn revision_is_a_commit_or_unknown() {
        let commit = REVISION.strip_suffix(".m").unwrap_or(REVISION);
        assert!(
            REVISION == UNKNOWN_REVISION
                || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()))
                || std::env::var_os("RSANDBOX_REVISION").is_some(),
            "{REVISION}"
        );
    }
}
