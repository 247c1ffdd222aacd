//! What the operator writes and hallmark reads: names and values, image specs and their
//! variants, the project folder, the pins, the cluster file and patch series.
//!
//! Layer: above `engine` and `oci`; below `images`, `plan`, `make`, `ship` and the commands.

pub mod apt;
pub mod config;
pub mod git;
pub mod patches;
pub mod pins;
pub mod project;
pub mod python;
pub mod spec;
pub mod values;
