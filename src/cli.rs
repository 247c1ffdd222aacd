//! The command line: names and flags are a contract (README.md, "Using it"), scripts call them.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "hallmark",
    version,
    about = "Reproducible container images from declarative specs, shipped to a cluster"
)]
pub struct Cli {
    /// The project's root folder, which holds hallmark.toml (default: found by walking up
    /// from the current folder).
    #[arg(short = 'C', long = "project", global = true, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// The cluster file (default: hallmark.toml at the project root).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Machine-readable output on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// More detail on stderr.
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    pub verbose: bool,
    /// Errors only.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Selection {
    /// Images by name (their folder under images/).
    #[arg(value_name = "IMAGE")]
    pub images: Vec<String>,
    /// Every image of the project (the default when no image is named).
    #[arg(long, conflicts_with = "images")]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resolve pins into pins/<image>.toml.
    Lock {
        #[arg(value_name = "IMAGE")]
        images: Vec<String>,
        /// Resolve again even where a pin matches the spec.
        #[arg(long)]
        update: bool,
    },
    /// Specs, pins, patch series and lints; no engine needed.
    Check(Selection),
    /// Print the Dockerfile; --out also writes the build context.
    Render {
        image: String,
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// What is inside an image and where it came from, as SPDX or CycloneDX; offline.
    Sbom {
        image: String,
        /// SPDX 2.3 JSON, or CycloneDX 1.6 JSON.
        #[arg(long, value_enum, default_value = "spdx")]
        format: crate::plan::sbom::Format,
        /// Write it to FILE instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print `<checksum>  <image>` per image; offline.
    Checksum {
        #[command(flatten)]
        selection: Selection,
        /// Print the document the checksum is the sha256 of.
        #[arg(long)]
        explain: bool,
    },
    /// Build on the builder (parents first), stamp, smoke, tag.
    Build {
        #[arg(value_name = "IMAGE", required = true)]
        images: Vec<String>,
        /// Rebuild even if the builder holds an image with the same checksum.
        #[arg(long)]
        force: bool,
        /// Build the image twice from scratch and compare; exit 1 if they differ.
        #[arg(long, conflicts_with = "force")]
        check_repro: bool,
        /// Refuse to run RUN, apt and compile steps of another platform than the builder's
        /// through an emulator (as `[builder] emulate = false`).
        #[arg(long)]
        no_emulate: bool,
    },
    /// Run an image's smoke tests on a node (default: the builder).
    Smoke {
        image: String,
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// On every node at once (the tests `on` the nodes), one row each; JUnit names the node.
        #[arg(long, conflicts_with = "node")]
        all_nodes: bool,
        /// Write the results as JUnit XML.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
    /// Ship images from the builder to the nodes: only missing layers, verified after load.
    Distribute {
        #[arg(value_name = "IMAGE", required_unless_present = "all")]
        images: Vec<String>,
        /// Every image of the project (each node gets all it lacks in one archive).
        #[arg(long, conflicts_with = "images")]
        all: bool,
        /// Only these nodes (comma-separated).
        #[arg(long, value_name = "NODE,...", value_delimiter = ',')]
        to: Vec<String>,
        /// Transfer to the nodes at once (heavy loads into engines on this machine: one per core;
        /// ssh host keys are settled first, one node at a time).
        #[arg(long)]
        parallel: bool,
        /// Send every layer, as `docker save | docker load` would.
        #[arg(long)]
        full: bool,
        /// Then run each image's smoke tests on every node it was verified on (those `on` the
        /// nodes: a served model on the GPUs), the nodes at once.
        #[arg(long)]
        smoke: bool,
    },
    /// Exit 0 only if every node holds the expected image (label and content fingerprint).
    Verify {
        #[arg(value_name = "IMAGE", required = true)]
        images: Vec<String>,
        #[arg(long, value_name = "NODE,...", value_delimiter = ',')]
        nodes: Vec<String>,
        /// Also check each image's signed provenance against the keys hallmark.toml trusts.
        #[arg(long)]
        provenance: bool,
    },
    /// Print the signed provenance (a DSSE envelope) kept for an image's current checksum.
    Provenance { image: String },
    /// Images by nodes: current, stale, mismatch, missing, unreachable.
    Status,
    /// Each node: reachable, engine version, image store, images.
    Nodes,
    /// Remove layers from the layer store that neither this project's images on the builder
    /// nor any other project sharing the cache uses; trim compile caches to their caps.
    Prune,
    /// The compile caches on the builder: volume, size, cap.
    Caches,
    /// Patch sets: import one, report how each patch applies, refresh a series for a new pin.
    #[command(subcommand)]
    Patches(PatchesCommand),
    /// Move a source's pin to the newest upstream revision where the patch series applies
    /// (upstream patches dropped, offset-only ones refreshed), by bisection.
    Bump(BumpArgs),
    /// Print a completion script for SHELL (e.g. `hallmark completions bash >
    /// /etc/bash_completion.d/hallmark`); no project needed.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff: `hallmark man > hallmark.1; man ./hallmark.1`); no project
    /// needed.
    Man,
}

#[derive(Debug, Args)]
pub struct BumpArgs {
    pub image: String,
    /// The source to move (default: the image's only source, or its only patched one).
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// The branch whose first-parent history is walked (default: the source's `rev`).
    #[arg(long, conflicts_with = "tags")]
    pub branch: Option<String>,
    /// The newest commit of the branch to consider (default: its head).
    #[arg(long, value_name = "REV", conflicts_with = "tags")]
    pub to: Option<String>,
    /// Walk the tags matching GLOB (`v*`), in version order, instead of a branch; with
    /// --base, the base's tags on the builder to consider.
    #[arg(long, value_name = "GLOB")]
    pub tags: Option<String>,
    /// Move the external base (`from.ref`) to the newest tag on the builder whose image
    /// differs from the pin (version order, else date order), pinned by digest.
    #[arg(long, conflicts_with_all = ["source", "branch", "to", "wheel", "apt"])]
    pub base: bool,
    /// With --base: leave out the tags matching GLOB (repeatable), whatever --tags says.
    #[arg(long, value_name = "GLOB", requires = "base")]
    pub exclude_tags: Vec<String>,
    /// Move this `[[wheel]]` to the newest version the package index offers for the image's
    /// Python and platform, in PEP 440 order and the pin's build flavour (its local label,
    /// `+cu126`).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["source", "branch", "to", "apt", "tags"])]
    pub wheel: Option<String>,
    /// With --wheel: the build flavours (local labels, `cu12*`; `""` for none) the wheel may
    /// move to, instead of the pin's own.
    #[arg(long, value_name = "GLOB", requires = "wheel")]
    pub wheel_local: Option<String>,
    /// With --base or --wheel: take pre-releases and dev releases too (`rc1`, `-beta`,
    /// `.dev0`).
    #[arg(long)]
    pub pre: bool,
    /// Lock the image's apt packages again, at what their archives serve now.
    #[arg(long, conflicts_with_all = ["source", "branch", "to", "tags"])]
    pub apt: bool,
    /// Say what would be pinned; write nothing.
    #[arg(long, conflicts_with = "build")]
    pub dry_run: bool,
    /// Then build and smoke-test the bumped image on the builder.
    #[arg(long)]
    pub build: bool,
    /// With --build: when the build or a smoke test fails, find the first candidate that
    /// fails and leave the newest good one pinned.
    #[arg(long, requires = "build")]
    pub bisect: bool,
}

#[derive(Debug, Subcommand)]
pub enum PatchesCommand {
    /// Per patch, in series order: applies, offset, fuzz, three-way, upstream or conflicts;
    /// exit 0 only when every patch applies as it is.
    Report {
        /// An image (default: every image that applies patch sets).
        image: Option<String>,
        /// A tag, branch or commit to examine instead of the pin (a candidate pin bump).
        #[arg(long)]
        rev: Option<String>,
        /// Only this source of the image (needed with --rev when it has several).
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
    /// Write patches/<SET>/ and its series from a folder of patches, an mbox, or REPO A..B.
    Import {
        set: String,
        /// A folder of patch files, an mbox, a patch file, or a git repository with RANGE.
        from: PathBuf,
        /// `A..B`: the commits of FROM (a repository) to import, as `git format-patch` writes.
        range: Option<String>,
        /// Replace an existing set.
        #[arg(long)]
        force: bool,
    },
    /// Rewrite the series to apply cleanly at --rev: merged patches rewritten, upstream ones
    /// dropped; nothing is rewritten while one conflicts, unless --force.
    Refresh {
        image: Option<String>,
        #[arg(long)]
        rev: String,
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
        /// Refresh the others even when some conflict (those stay as they are).
        #[arg(long)]
        force: bool,
        /// Also rewrite patches that matched only with fuzz or through a three-way merge
        /// (without it they stay as they are, and refresh says where they would land).
        #[arg(long)]
        accept_fuzz: bool,
    },
}
