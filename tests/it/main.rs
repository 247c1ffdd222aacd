//! The integration tests: one crate (one link), a module per suite, `support` shared.
//! A suite alone: `cargo test --locked --test it engine::` (offline::, malformed::, ship::...).

// An integration test is a scenario read top to bottom against real engines (set up, act,
// check what was printed and held); the 80-line limit is for the library's functions.
#![allow(clippy::too_many_lines)]

mod apt;
mod assemble;
mod bump;
mod bump_pins;
mod compile;
mod emulation;
mod engine;
mod faults;
mod gpus;
mod hostile;
mod kinds;
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
