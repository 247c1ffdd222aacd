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
pub mod replace;
mod run;
mod toolchain;

pub use run::{check_repro, compile_all, stored_wheels};

use crate::error::{Error, Result};
use crate::inputs::pins::{BasePin, CheckedPins, Pins};
use crate::inputs::spec::LoadedSpec;
use crate::inputs::values::{ImagePath, Name};
use crate::oci::Reference;
use crate::plan::SourcePatches;
use crate::plan::checksum::{Document, InputChecksum};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use toml::Spanned;

/// Where the stage's commands must leave their wheels (also `$HALLMARK_WHEELS`).
pub const WHEELS_DIR: &str = "/hallmark/wheels";
/// The label on every cache volume hallmark makes: the cache's name.
pub const CACHE_LABEL: &str = "hallmark.cache";
/// The cap written when the volume was made, in bytes (the spec's current cap wins).
pub const CAP_LABEL: &str = "hallmark.cache-cap";
/// The image the volume was first used with: `prune` trims the cache in a container of it.
pub const CACHE_IMAGE_LABEL: &str = "hallmark.cache-image";
/// Labels of a compile container: the stage's checksum, and the reference of the image it is for.
pub const STAGE_LABEL: &str = "hallmark.compile";
pub const STAGE_IMAGE_LABEL: &str = "hallmark.compile.image";

const STAGE_VERSION_LINE: &str = "hallmark-compile v2";
const TOOLCHAIN_VERSION_LINE: &str = "hallmark-toolchain v1";
/// The label of a toolchain image hallmark made by adding a stage's `apt` packages: its key.
pub const TOOLCHAIN_LABEL: &str = "hallmark.toolchain";

/// `[[compile]]` in `image.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CompileStage {
    pub name: Spanned<Name>,
    /// `[[source]]`s built here: in the container at their `dest`, not copied into the image.
    #[serde(default)]
    pub sources: Vec<Spanned<Name>>,
    /// An external image to run in, pinned in `pins/` as `[[toolchain]]`; default: the parent.
    pub toolchain: Option<Spanned<String>>,
    /// Another spec of the project to run in (built first, found on the builder by its
    /// checksum); instead of `toolchain`.
    pub toolchain_image: Option<Spanned<Name>>,
    /// Debian/Ubuntu packages added to the toolchain (with the engine's default network) in an
    /// image of their own, kept on the builder by the toolchain and the package list.
    #[serde(default)]
    pub apt: Vec<String>,
    /// Shell commands (`/bin/sh -c`), in order, in one container.
    pub run: Vec<String>,
    /// The commands' working folder (default `/`).
    pub workdir: Option<ImagePath>,
    /// Environment of the commands: MAX_JOBS, TORCH_CUDA_ARCH_LIST, CCACHE_*, CMAKE_ARGS.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    /// Named persistent caches: a volume on the builder mounted at `path`, trimmed to `cap`.
    #[serde(default)]
    pub caches: BTreeMap<String, Cache>,
    /// The distributions the stage must leave in `$HALLMARK_WHEELS`.
    pub wheels: Vec<Spanned<Name>>,
    /// Give the commands the engine's default network. Off: what they use is what is pinned.
    #[serde(default)]
    pub network: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Cache {
    pub path: ImagePath,
    /// `500M`, `5G`, `1T` (powers of 1024) or bytes; `prune` trims the cache to it.
    pub cap: Option<String>,
}

/// The bytes of a cap: `5G`, `500M`, `2GiB`, `1024`.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB") {
        "" | "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

/// The tag of the toolchain image with a stage's `apt` packages added.
pub fn apt_toolchain_reference(key: &str) -> String {
    format!("hallmark-toolchain:{}", &key[..16])
}

/// The volume holding cache `name` on the builder; shared by every stage naming it.
pub fn volume_name(cache: &str) -> String {
    format!("hallmark-cache-{cache}")
}

fn is_variable(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks made right after parsing: names, sources, caches, and that the rest of the spec
/// can be assembled (a compile spec is never an engine build).
pub fn validate(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    if spec.compiles.is_empty() {
        return Ok(());
    }
    let build = &spec.build;
    if !build.run.is_empty() || !build.apt.is_empty() || !build.expect_files.is_empty() {
        return loaded.invalid_at(
            &["build"],
            "build",
            "a spec with [[compile]] stages is assembled from their wheels: it cannot also have `run`, `apt` or `expect-files` in [build]; put the commands in the stage (packages in the stage's `apt`)".into(),
        );
    }
    let mut stages = BTreeSet::new();
    // Which stage builds each source: a source is built once.
    let mut used: BTreeMap<Name, Name> = BTreeMap::new();
    for stage in &spec.compiles {
        let name = stage.name.get_ref();
        if !stages.insert(name.clone()) {
            return loaded.invalid(
                stage.name.span(),
                "compile.name",
                format!("compile stage `{name}` is named twice"),
            );
        }
        validate_sources(loaded, stage, &mut used)?;
        validate_commands(loaded, stage)?;
        validate_toolchain(loaded, stage)?;
        validate_args_and_caches(loaded, stage)?;
    }
    for source in &spec.sources {
        if !used.contains_key(source.name.get_ref()) {
            return loaded.invalid(
                source.name.span(),
                "source",
                format!(
                    "source `{}` is built by no [[compile]] stage; a spec with compile stages is assembled, so every source must be compiled",
                    source.name.get_ref()
                ),
            );
        }
    }
    Ok(())
}

fn validate_sources(
    loaded: &LoadedSpec,
    stage: &CompileStage,
    used: &mut BTreeMap<Name, Name>,
) -> Result<()> {
    for source in &stage.sources {
        if !loaded
            .spec
            .sources
            .iter()
            .any(|s| s.name.get_ref() == source.get_ref())
        {
            return loaded.invalid(
                source.span(),
                "compile.sources",
                format!("no [[source]] named `{}`", source.get_ref()),
            );
        }
        if let Some(other) = used.insert(source.get_ref().clone(), stage.name.get_ref().clone()) {
            return loaded.invalid(
                source.span(),
                "compile.sources",
                format!(
                    "source `{}` is built by stage `{other}` already",
                    source.get_ref()
                ),
            );
        }
    }
    Ok(())
}

fn validate_commands(loaded: &LoadedSpec, stage: &CompileStage) -> Result<()> {
    let invalid = |key: &str, message: &str| loaded.invalid(stage.name.span(), key, message.into());
    if stage.run.is_empty() || stage.run.iter().any(|s| s.trim().is_empty()) {
        return invalid(
            "compile.run",
            "give the stage its commands, none blank: run = [\"pip wheel --no-deps -w $HALLMARK_WHEELS /src/x\"]",
        );
    }
    if stage.run.iter().any(|s| s.contains('\0')) {
        return invalid("compile.run", "a command holds a NUL character");
    }
    if stage.wheels.is_empty() {
        return invalid(
            "compile.wheels",
            "name the distributions the stage must produce: wheels = [\"vllm\"]",
        );
    }
    Ok(())
}

fn validate_toolchain(loaded: &LoadedSpec, stage: &CompileStage) -> Result<()> {
    if let Some(toolchain) = &stage.toolchain {
        if stage.toolchain_image.is_some() {
            return loaded.invalid(
                toolchain.span(),
                "compile.toolchain",
                "give `toolchain` (an external image) or `toolchain-image` (a spec of this project), not both".into(),
            );
        }
        let why = if toolchain.get_ref().contains('@') {
            Some("carries a digest; write the tag here, the digest belongs in pins/ (`hallmark lock`)".to_string())
        } else {
            Reference::parse(toolchain.get_ref()).err()
        };
        if let Some(why) = why {
            return loaded.invalid(
                toolchain.span(),
                "compile.toolchain",
                format!("`{}`: {why}", toolchain.get_ref()),
            );
        }
    }
    if let Some(image) = &stage.toolchain_image
        && image.get_ref() == &loaded.name
    {
        return loaded.invalid(
            image.span(),
            "compile.toolchain-image",
            format!(
                "`{}` is this spec: a stage cannot run in the image it makes",
                image.get_ref()
            ),
        );
    }
    let stage_name = stage.name.get_ref().as_str();
    for package in &stage.apt {
        if !crate::inputs::spec::is_apt_package(package) {
            return loaded.invalid_at(
                &["compile", stage_name, "apt", package],
                "compile.apt",
                format!("`{package}` is not a package name"),
            );
        }
    }
    Ok(())
}

fn validate_args_and_caches(loaded: &LoadedSpec, stage: &CompileStage) -> Result<()> {
    let name = stage.name.get_ref().as_str();
    for (key, value) in &stage.args {
        if !is_variable(key) || value.contains('\0') {
            return loaded.invalid_at(
                &["compile", name, "args", key],
                &format!("compile.args.{key}"),
                format!("`{key}` is not a variable name, or its value holds a NUL"),
            );
        }
    }
    for (cache, settings) in &stage.caches {
        let ok = !cache.is_empty()
            && cache
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return loaded.invalid(
                stage.name.span(),
                "compile.caches",
                format!("`{cache}` is not a cache name (letters, digits, `-`, `_`, `.`)"),
            );
        }
        if let Some(cap) = &settings.cap
            && parse_size(cap).is_none()
        {
            return loaded.invalid_at(
                &["compile", name, "caches", cache, "cap"],
                &format!("compile.caches.{cache}.cap"),
                format!("`{cap}` is not a size: write `500M`, `5G` or bytes"),
            );
        }
    }
    Ok(())
}

/// What a stage runs in.
#[derive(Debug, Clone)]
pub enum Toolchain {
    /// The image's own parent (its builder reference is known only when building).
    Parent,
    External(BasePin),
    /// Another spec of the project, built earlier in the same plan.
    Image {
        name: Name,
        reference: String,
        checksum: InputChecksum,
    },
}

/// A spec of the project that a stage runs in: the builder holds it under `reference` with
/// the checksum label `checksum` once built.
#[derive(Debug, Clone)]
pub struct ToolchainSpec {
    pub reference: String,
    pub checksum: InputChecksum,
}

/// A compile stage, planned: its checksum and what it takes.
#[derive(Debug, Clone)]
pub struct PlannedStage {
    pub name: Name,
    pub checksum: InputChecksum,
    /// The text the checksum is the sha256 of.
    pub document: String,
    pub toolchain: Toolchain,
    /// The stage document's toolchain line (what identifies the toolchain).
    pub toolchain_line: String,
    /// With `apt` packages: the key of the toolchain image that adds them (the sha256 of the
    /// toolchain line and the sorted packages), its label on the builder.
    pub apt_key: Option<String>,
    /// Indexes into the spec's sources (and its pins and patches).
    pub sources: Vec<usize>,
    pub spec: CompileStage,
}

/// Plans the stages of `loaded`; `parent_line` is the image's checksum line for its parent
/// (`parent <name> <checksum>` or `base <ref> <digest>`), which identifies the default
/// toolchain; `toolchain_specs` holds the planned specs stages name as `toolchain-image`.
pub fn plan(
    loaded: &LoadedSpec,
    pins: &CheckedPins,
    all_pins: &Pins,
    patches: &[SourcePatches],
    parent_line: &str,
    toolchain_specs: &BTreeMap<Name, ToolchainSpec>,
    pins_path: &std::path::Path,
) -> Result<Vec<PlannedStage>> {
    let spec = &loaded.spec;
    let mut planned = Vec::new();
    for stage in &spec.compiles {
        let mut doc = Document::new();
        doc.line(STAGE_VERSION_LINE.into());
        // The caps decide how much is cached, never what is built.
        let mut canonical = stage.clone();
        for cache in canonical.caches.values_mut() {
            cache.cap = None;
        }
        doc.spec(&canonical);
        doc.line(format!(
            "source-date-epoch {}",
            spec.image.source_date_epoch
        ));
        let (toolchain, toolchain_line) = toolchain_of(
            loaded,
            stage,
            all_pins,
            parent_line,
            toolchain_specs,
            pins_path,
        )?;
        doc.line(toolchain_line.clone());
        let apt_key = apt_key(stage, &toolchain_line);
        let mut sources = Vec::new();
        for wanted in &stage.sources {
            let index = spec
                .sources
                .iter()
                .position(|s| s.name.get_ref() == wanted.get_ref())
                .expect("validated");
            source_lines(&mut doc, loaded, pins, &patches[index], index);
            sources.push(index);
        }
        let document = doc.text();
        planned.push(PlannedStage {
            name: stage.name.get_ref().clone(),
            checksum: InputChecksum::of(&document),
            document,
            toolchain,
            toolchain_line,
            apt_key,
            sources,
            spec: stage.clone(),
        });
    }
    Ok(planned)
}

/// The key of the toolchain image with the stage's apt packages: the toolchain line and the
/// packages, sorted (their order does not change what apt installs).
fn apt_key(stage: &CompileStage, toolchain_line: &str) -> Option<String> {
    if stage.apt.is_empty() {
        return None;
    }
    let packages: BTreeSet<&str> = stage.apt.iter().map(String::as_str).collect();
    let packages: Vec<&str> = packages.into_iter().collect();
    let text = format!(
        "{TOOLCHAIN_VERSION_LINE}\n{toolchain_line}\napt {}\n",
        packages.join(" ")
    );
    Some(crate::plan::checksum::sha256_hex(text.as_bytes()))
}

/// The stage document's lines for source `index`: its pin and place, then its patches.
fn source_lines(
    doc: &mut Document,
    loaded: &LoadedSpec,
    pins: &CheckedPins,
    patches: &SourcePatches,
    index: usize,
) {
    let pin = &pins.sources[index];
    let dest = loaded.spec.sources[index].dest.get_ref().as_str();
    doc.line(format!(
        "source {} {} {}",
        pin.name,
        pin.commit,
        crate::inputs::values::without_trailing_slash(dest)
    ));
    for set in &patches.sets {
        for patch in &set.patches {
            doc.line(format!(
                "patch {} {} {} -p{} {}",
                pin.name, set.name, patch.file, patch.strip, patch.sha256
            ));
        }
    }
}

/// What `stage` runs in, and the line of the stage document that identifies it.
fn toolchain_of(
    loaded: &LoadedSpec,
    stage: &CompileStage,
    all_pins: &Pins,
    parent_line: &str,
    toolchain_specs: &BTreeMap<Name, ToolchainSpec>,
    pins_path: &std::path::Path,
) -> Result<(Toolchain, String)> {
    if let Some(name) = &stage.toolchain_image {
        let name = name.get_ref();
        let planned = toolchain_specs
            .get(name)
            .expect("the plan walks a stage's toolchain spec before the stage's image");
        let line = format!("toolchain image {name} {}", planned.checksum);
        let toolchain = Toolchain::Image {
            name: name.clone(),
            reference: planned.reference.clone(),
            checksum: planned.checksum.clone(),
        };
        return Ok((toolchain, line));
    }
    let Some(reference) = &stage.toolchain else {
        return Ok((Toolchain::Parent, format!("toolchain {parent_line}")));
    };
    let reference = reference.get_ref();
    let pin = all_pins
        .toolchains
        .iter()
        .find(|p| p.reference == reference.as_str())
        .ok_or_else(|| Error::Pin {
            image: loaded.name.to_string(),
            path: pins_path.to_path_buf(),
            what: format!(
                "no digest pinned for the toolchain `{reference}` of compile stage `{}`",
                stage.name.get_ref()
            ),
        })?;
    let line = format!("toolchain {} {}", pin.reference, pin.digest);
    Ok((Toolchain::External(pin.clone()), line))
}

/// The stages as `render` shows them: what runs where, with which caches, and what comes out.
pub fn describe(stages: &[PlannedStage], loaded: &LoadedSpec) -> String {
    stages
        .iter()
        .map(|stage| describe_stage(stage, loaded))
        .collect()
}

fn describe_stage(stage: &PlannedStage, loaded: &LoadedSpec) -> String {
    let mut text = String::new();
    let mut toolchain = match &stage.toolchain {
        Toolchain::Parent => "the parent".to_string(),
        Toolchain::External(pin) => format!("{} ({})", pin.reference, pin.digest),
        Toolchain::Image { name, checksum, .. } => {
            format!("the image `{name}` (checksum {checksum})")
        }
    };
    if let Some(key) = &stage.apt_key {
        toolchain.push_str(&format!(
            " + apt {} (kept as {})",
            stage.spec.apt.join(" "),
            apt_toolchain_reference(key)
        ));
    }
    text.push_str(&format!(
        "# compile stage `{}` (stage checksum {})\n#   toolchain: {toolchain}\n",
        stage.name, stage.checksum
    ));
    for &index in &stage.sources {
        let source = &loaded.spec.sources[index];
        text.push_str(&format!(
            "#   source `{}` at {}\n",
            source.name.get_ref(),
            source.dest.get_ref()
        ));
    }
    for (key, value) in &stage.spec.args {
        text.push_str(&format!("#   env {key}={value}\n"));
    }
    for (name, cache) in &stage.spec.caches {
        text.push_str(&format!(
            "#   cache `{name}`: volume {} at {}{}\n",
            volume_name(name),
            cache.path,
            cache
                .cap
                .as_ref()
                .map(|c| format!(", capped at {c}"))
                .unwrap_or_default()
        ));
    }
    text.push_str(&format!(
        "#   network: {}{}\n",
        if stage.spec.network { "on" } else { "off" },
        if stage.apt_key.is_some() {
            " (apt: the engine's default network)"
        } else {
            ""
        }
    ));
    for (i, step) in stage.spec.run.iter().enumerate() {
        let mut lines = step.trim().lines();
        text.push_str(&format!(
            "#   run {}: {}\n",
            i + 1,
            lines.next().unwrap_or_default()
        ));
        for line in lines {
            text.push_str(&format!("#          {line}\n"));
        }
    }
    let wheels: Vec<String> = stage
        .spec
        .wheels
        .iter()
        .map(|w| w.get_ref().to_string())
        .collect();
    text.push_str(&format!(
        "#   wheels out of {WHEELS_DIR}: {} (installed into the image as pip would)\n",
        wheels.join(", ")
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read_in_powers_of_1024() {
        assert_eq!(parse_size("5G"), Some(5 << 30));
        assert_eq!(parse_size("500M"), Some(500 << 20));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("5 X"), None);
        assert_eq!(parse_size("G"), None);
    }
}
