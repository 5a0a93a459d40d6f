//! Shim-owned network namespaces.
