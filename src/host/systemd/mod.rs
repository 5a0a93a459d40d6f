//! The systemd cgroup driver's side in the shim: the pod's pause process in a transient
//! scope of the pod's slice, through systemd's D-Bus API.
//!
//! A minimal synchronous D-Bus client of our own (see docs/cgroups.md for why not a
//! library): [`wire`] marshals messages, [`conn`] is one authenticated connection with
//! deadlines, [`manager`] speaks to systemd's manager (start, stop, reset a unit, wait for
//! its job), [`scope`] is the pod's scope, [`devices`] its device rules, [`names`] the
//! cgroup names systemd uses, [`address`] the system bus's address
//! (`DBUS_SYSTEM_BUS_ADDRESS`); [`unit`] one unit's restart and state, and a command run as a
//! transient service, for the node installer (`containerd-shim-rsandbox-v1 unit`).

pub mod address;
pub mod conn;
pub mod devices;
pub mod manager;
pub mod names;
pub mod scope;
pub mod unit;
pub mod wire;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
