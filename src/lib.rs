//! hallmark: reproducible container images from declarative specs, stamped with a checksum
//! of their inputs and shipped to the nodes of a small cluster.
//!
//! The pipeline runs one way, one module per stage: `spec` + `pins` -> `plan` (graph and
//! checksum) -> `fetch` (sources, patches, wheels) -> `context` (deterministic tar) ->
//! `render` (Dockerfile). Image references, digests, OCI archives and the one deterministic tar
//! writer they all use are typed once in `oci`.

pub mod cli;
pub mod commands;
pub mod engine;
pub mod error;
pub mod images;
pub mod inputs;
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
    match commands::run(cli) {
        Ok(status) => status.into(),
        Err(error) => {
            crate::output::stderr_exactly(&error.render());
            error.exit_status().into()
        }
    }
}
