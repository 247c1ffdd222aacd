//! The integration tests: one crate (one link), a module per suite, `support` shared.
//! A suite alone: `cargo test --locked --test it engine::` (offline::, malformed::, ship::...).

mod apt;
mod assemble;
mod bump;
mod bump_pins;
mod compile;
mod engine;
mod faults;
mod gpus;
mod hostile;
mod malformed;
mod offline;
mod patches;
mod podman;
mod provenance;
mod registry;
mod sbom;
mod schema;
mod secrets;
mod ship;
mod signals;
mod ssh;
mod support;
