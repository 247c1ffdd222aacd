//! Compile stages: `[[compile]]` turns sources (at their pins, patch series applied) into
//! wheels inside an ordinary container on the builder, and the final image gets those wheels
//! through assembly (`assemble.rs`), as it gets pinned wheels. The toolchain stays out of the
//! image; the compiler's caches live in named volumes on the builder, so a rebuild after a
//! one-line patch recompiles one file.
//!
//! A stage has its own input checksum (sources, patches, toolchain, commands, args; not the
//! image's env, labels or smoke tests), and its wheels are kept in the layer store's
//! `compiled/<checksum>/`: an image whose stages are all kept is assembled without running any
//! container. Only the Engine API's containers and volumes are used (create, put archive,
//! start, logs, wait, get archive, remove): no classic builder, no BuildKit.

pub mod caches;
mod log;
pub mod replace;
mod run;
mod toolchain;

pub use run::{check_repro, compile_all, stored_wheels};

pub use crate::inputs::spec::compile::{
    CompileStage, WHEELS_DIR, apt_toolchain_reference, parse_size, volume_name,
};
pub use crate::plan::compile::{PlannedStage, Toolchain, ToolchainSpec};

/// The label on every cache volume hallmark makes: the cache's name.
pub const CACHE_LABEL: &str = "hallmark.cache";
/// The cap written when the volume was made, in bytes (the spec's current cap wins).
pub const CAP_LABEL: &str = "hallmark.cache-cap";
/// The image the volume was first used with: `prune` trims the cache in a container of it.
pub const CACHE_IMAGE_LABEL: &str = "hallmark.cache-image";
/// Labels of a compile container: the stage's checksum, and the reference of the image it is for.
pub const STAGE_LABEL: &str = "hallmark.compile";
pub const STAGE_IMAGE_LABEL: &str = "hallmark.compile.image";

/// The label of a toolchain image hallmark made by adding a stage's `apt` packages: its key.
pub const TOOLCHAIN_LABEL: &str = "hallmark.toolchain";
