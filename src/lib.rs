//! hallmark: reproducible container images from declarative specs, stamped with a checksum
//! of their inputs and shipped to the nodes of a small cluster.
//!
//! The pipeline runs one way, one module per stage: `spec` + `pins` -> `plan` (graph and
//! checksum) -> `fetch` (sources, patches, wheels) -> `context` (deterministic tar) ->
//! `render` (Dockerfile). Image references, digests, OCI archives and the one deterministic tar
//! writer they all use are typed once in `oci`.

pub mod anchor;
pub mod assemble;
pub mod base;
pub mod build;
pub mod build_cache;
pub mod check;
pub mod checksum;
pub mod cli;
pub mod commands;
pub mod compile;
pub mod config;
pub mod context;
pub mod credentials;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod lock;
pub mod normalize;
pub mod oci;
pub mod output;
pub mod patches;
pub mod pins;
pub mod plan;
pub mod progress;
pub mod project;
pub mod registry;
pub mod render;
pub mod repro;
pub mod settings;
pub mod ship;
pub mod spec;
pub mod store;
pub mod transfer;
pub mod turn;
pub mod values;
pub mod verify;
pub mod wheel;

use clap::Parser;
use std::process::ExitCode;

/// Parses the command line, runs it, prints any error, and returns the exit code.
pub fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(status) => status.into(),
        Err(error) => {
            eprint!("{}", error.render());
            error.exit_status().into()
        }
    }
}
