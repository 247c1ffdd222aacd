//! Making images on the builder: the Dockerfile and context, engine builds, assembled
//! layers and wheels, compile stages, bases, normalisation and the reproducibility check.
//!
//! Layer: above `plan`; below `ship` and the commands.

pub mod anchor;
pub mod assemble;
pub mod base;
pub mod build;
pub mod build_cache;
pub mod compile;
pub mod context;
pub mod normalize;
pub mod provenance;
pub mod render;
pub mod repro;
pub mod wheel;
