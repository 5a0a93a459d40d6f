//! The ttrpc surface: our server, and the adapters between protobuf requests and the
//! task manager and sandbox.

pub mod sandbox;
pub mod server;
pub mod task;

#[cfg(test)]
mod tests;
