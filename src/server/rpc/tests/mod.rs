//! The Task and Sandbox services tested through their ttrpc traits, with fakes behind the
//! narrow traits of `task` (runtime, host) and `pod` (pod host, network): the tests live with
//! the RPC layer they drive, so `task` and `pod` never depend on `rpc`.

mod sandbox;
mod task;
