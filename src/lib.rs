//! hallmark: reproducible container images from declarative specs, stamped with a checksum
//! of their inputs and shipped to the nodes of a small cluster.
//!
//! The folders are the pipeline, each layer importing only those below it (docs/architecture.md,
//! held by tests/layers.rs): `inputs` (specs, pins, project, cluster file, patches) -> `plan`
//! (graph, checksums, fetch) -> `make` (render, build, assemble, compile, normalise) ->
//! `ship` (stream, registry, verify), with the commands on top and, below, `images` (the
//! layer store and what an image is), `engine` (the Engine API), `oci` (references, digests,
//! archives, the one tar writer) and `error`/`output`.

pub mod cli;
pub mod commands;
pub mod engine;
pub mod error;
pub mod images;
pub mod inputs;
pub mod interrupt;
pub mod make;
pub mod oci;
pub mod output;
pub mod plan;
pub mod ship;

use clap::Parser;
use std::process::ExitCode;

/// Parses the command line, runs it, prints any error, and returns the exit code.
pub fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    output::tracing_from_env();
    match commands::run(cli) {
        Ok(status) => status.into(),
        Err(error) => {
            crate::output::stderr_exactly(&error.render());
            error.exit_status().into()
        }
    }
}
