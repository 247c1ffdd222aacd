//! Compile stages, planned: each stage's own input checksum (sources, patches, toolchain,
//! commands, args; not the image's env, labels or smoke tests) and what it runs in, and how
//! `render` describes them.

use crate::error::{Error, Result};
use crate::inputs::patches::SourcePatches;
use crate::inputs::pins::{AptPin, BasePin, CheckedPins, Pins};
use crate::inputs::spec::LoadedSpec;
use crate::inputs::spec::compile::{
    CompileStage, WHEELS_DIR, apt_toolchain_reference, volume_name,
};
use crate::inputs::values::Name;
use crate::plan::checksum::{self, InputChecksum};
use std::collections::BTreeMap;

const TOOLCHAIN_VERSION_LINE: &str = "hallmark-toolchain v2";

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
    /// The pinned apt packages, `name=version`.
    pub apt: Vec<String>,
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
        let (toolchain, toolchain_line) = toolchain_of(
            loaded,
            stage,
            all_pins,
            parent_line,
            toolchain_specs,
            pins_path,
        )?;
        crate::inputs::pins::apt_against_is(
            all_pins,
            pins_path,
            &loaded.name,
            Some(stage.name.get_ref()),
            &toolchain_line,
        )?;
        let apt = pins.apt_for(Some(stage.name.get_ref()));
        let apt_key = apt_key(&apt, &toolchain_line);
        let mut sources = Vec::new();
        for wanted in &stage.sources {
            let index = spec
                .sources
                .iter()
                .position(|s| s.name.get_ref() == wanted.get_ref())
                .expect("validated");
            sources.push(index);
        }
        let stage_sources: Vec<_> = sources
            .iter()
            .map(|&index| {
                let dest = spec.sources[index].dest.get_ref().as_str();
                (&pins.sources[index], dest, &patches[index])
            })
            .collect();
        let document = checksum::stage_document(
            stage,
            spec.image.source_date_epoch,
            &toolchain_line,
            &apt,
            &stage_sources,
        );
        planned.push(PlannedStage {
            name: stage.name.get_ref().clone(),
            checksum: InputChecksum::of(&document),
            document,
            toolchain,
            toolchain_line,
            apt_key,
            apt: apt.iter().map(|p| p.describe()).collect(),
            sources,
            spec: stage.clone(),
        });
    }
    Ok(planned)
}

/// The key of the toolchain image with the stage's apt packages: the toolchain line and the
/// pinned package files (sorted: their order does not change what apt installs).
fn apt_key(apt: &[&AptPin], toolchain_line: &str) -> Option<String> {
    if apt.is_empty() {
        return None;
    }
    let packages: Vec<String> = apt.iter().map(|p| p.checksum_line()).collect();
    let text = format!(
        "{TOOLCHAIN_VERSION_LINE}\n{toolchain_line}\n{}\n",
        packages.join("\n")
    );
    Some(crate::plan::checksum::sha256_hex(text.as_bytes()))
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
            stage.apt.join(" "),
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
            " (apt: the pinned files, no network)"
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
