//! Variants: `images/<name>/image.toml` holding only `[variant]` says the image is another
//! spec plus patch sets and env (vLLM, and vLLM with the DCP2 patches under `PROFILE=dcp2`),
//! without copying that spec. The variant is planned, checksummed, rendered and built as the
//! spec it resolves to: the other spec with the sets appended to its sources and the env
//! merged, named after the variant's folder. It rebuilds from the same sources; a child
//! (`from.image`) builds on the parent's image instead.

use super::{LoadedSpec, validate};
use crate::error::{Error, Invalid, Location, Result};
use crate::inputs::values::Name;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct VariantFile {
    variant: Variant,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Variant {
    /// The spec this one varies: an image of the project that is not itself a variant.
    of: Spanned<Name>,
    /// The built image's repository (default: the variant's folder name).
    name: Option<Name>,
    /// The built image's tag (default: the other spec's).
    tag: Option<String>,
    /// Source name to the patch sets applied after that source's own.
    #[serde(default)]
    patches: BTreeMap<String, Spanned<Vec<Spanned<Name>>>>,
    /// Set on top of the other spec's env (a key here wins).
    #[serde(default)]
    env: BTreeMap<String, String>,
}

/// Whether a spec's text is a variant: a top-level `[variant]` table. A text that does not
/// parse is not one; the ordinary parse then says why.
pub fn is_variant(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("variant"))
}

/// Resolves the variant at `path` into the spec it stands for.
pub fn load(name: &Name, dir: &Path, path: PathBuf, text: String) -> Result<LoadedSpec> {
    let file: VariantFile = super::parse_toml(&path, &text)?;
    let variant = file.variant;
    let invalid = |span: std::ops::Range<usize>, key: &str, message: String| {
        Error::from(Invalid {
            path: path.clone(),
            location: Some(Location::of_offset(&text, span.start)),
            key: Some(key.to_string()),
            message,
            hint: None,
        })
    };
    let of = variant.of.get_ref();
    let other_dir = dir.parent().unwrap_or(dir).join(of.as_str());
    let other_path = other_dir.join("image.toml");
    let problem = if of == name {
        Some("a variant cannot vary itself".to_string())
    } else if !other_path.is_file() {
        Some(format!(
            "no image `{of}` ({} is missing)",
            other_path.display()
        ))
    } else if is_variant(&super::read_text(&other_path)?) {
        Some(format!(
            "`{of}` is a variant itself: name the spec it varies"
        ))
    } else {
        None
    };
    if let Some(message) = problem {
        return Err(invalid(variant.of.span(), "variant.of", message));
    }
    let other = super::load(of, &other_dir)?;
    let mut resolved = LoadedSpec {
        name: name.clone(),
        dir: dir.to_path_buf(),
        path: path.clone(),
        text: text.clone(),
        spec: other.spec.clone(),
    };
    for (source, sets) in &variant.patches {
        let Some(found) =
            (resolved.spec.sources.iter_mut()).find(|s| s.name.get_ref().as_str() == source)
        else {
            let message = format!("`{of}` has no source `{source}`");
            return Err(invalid(sets.span(), "variant.patches", message));
        };
        // Checked here, where the set's span is in the text being reported on.
        let patches_dir = dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(dir)
            .join("patches");
        for set in sets.get_ref() {
            let series = patches_dir.join(set.get_ref().as_str()).join("series");
            if !series.is_file() {
                let message = format!(
                    "patch set `{}` has no series file ({} is missing)",
                    set.get_ref(),
                    series.display()
                );
                return Err(invalid(set.span(), "variant.patches", message));
            }
        }
        found.patches.extend(sets.get_ref().iter().cloned());
    }
    let spec = &mut resolved.spec;
    spec.env.extend(variant.env.clone());
    spec.image.name = variant.name.clone();
    if let Some(tag) = &variant.tag {
        spec.image.tag = tag.clone();
    }
    validate(&resolved)?;
    // From here on, values and their spans are the other spec's: errors found later (a pin,
    // a file) point into its text, and its files and template are found in its folder.
    resolved.dir = other.dir;
    resolved.path = other.path;
    resolved.text = other.text;
    Ok(resolved)
}
