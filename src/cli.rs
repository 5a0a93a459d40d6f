//! Entry point: parse containerd's shim flags and dispatch.

/// Runs the shim binary.
pub fn main() {}
