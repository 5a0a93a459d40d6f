//! The pod: its namespace holder, files, cgroup, and the Sandbox service's state.

pub mod pause;
