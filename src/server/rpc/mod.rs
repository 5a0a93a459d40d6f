//! The ttrpc surface: our server, and the adapters between protobuf requests and the
//! task manager and sandbox.

pub mod sandbox;
pub mod server;
pub mod task;
pub mod wait;

#[cfg(test)]
mod tests;
