//! `[[compile]]` in `image.toml`: a stage that turns sources into wheels in a container on
//! the builder (`make::compile` runs it), and the checks made right after parsing.

use crate::error::Result;
use crate::inputs::spec::LoadedSpec;
use crate::inputs::values::{ImagePath, Name};
use crate::oci::Reference;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use toml::Spanned;

/// Where the stage's commands must leave their wheels (also `$HALLMARK_WHEELS`).
pub const WHEELS_DIR: &str = "/hallmark/wheels";

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
            Reference::parse(toolchain.get_ref())
                .err()
                .map(|e| e.to_string())
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
    if let Some((package, message)) = crate::inputs::spec::apt_problems(&stage.apt) {
        return loaded.invalid_at(
            &["compile", stage_name, "apt", package],
            "compile.apt",
            message,
        );
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
