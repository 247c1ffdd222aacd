//! `images/<name>/image.toml`: what an image is made of.
//!
//! Parsing is strict (unknown keys are errors, listing the valid ones) because a typo in a
//! spec that is silently ignored costs a 45-minute build. Cross-field rules (one parent,
//! unique names, a nested source after the one it nests in) are checked right after parsing,
//! with the line of the offending key.

pub mod compile;
mod read;
mod smoke;
mod validate;
pub mod variant;

pub use read::*;
pub use smoke::*;
pub use validate::*;

use crate::error::{Error, Invalid, Location, Result};
use crate::inputs::values::{ImagePath, Name, RelativePath};
use crate::oci::reference::{self, Reference};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toml::Spanned;

/// A file copied from the spec's folder into the image.
#[derive(Debug, Clone)]
pub struct ContextFile {
    pub src: PathBuf,
    /// Absolute path in the image.
    pub dest: String,
    pub executable: bool,
    pub sha256: String,
}

impl ContextFile {
    pub fn mode(&self) -> u32 {
        if self.executable { 0o755 } else { 0o644 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ImageSpec {
    #[serde(default)]
    pub image: ImageSection,
    pub from: Spanned<From>,
    #[serde(default, rename = "source")]
    pub sources: Vec<Source>,
    #[serde(default, rename = "wheel")]
    pub wheels: Vec<Wheel>,
    #[serde(default, rename = "file")]
    pub files: Vec<FileCopy>,
    #[serde(default)]
    pub build: BuildSteps,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub container: Container,
    #[serde(default, rename = "smoke")]
    pub smokes: Vec<Smoke>,
    /// Compile stages (`compile.rs`); left out of the canonical spec when there are none.
    #[serde(default, rename = "compile", skip_serializing_if = "Vec::is_empty")]
    pub compiles: Vec<crate::inputs::spec::compile::CompileStage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ImageSection {
    /// Repository name of the built image; defaults to the spec's folder name.
    pub name: Option<Name>,
    #[serde(default = "default_tag")]
    pub tag: String,
    /// `os/arch`, e.g. `linux/arm64`; informational for engine builds.
    pub platform: Option<String>,
    /// Seconds since the epoch used for every mtime hallmark writes (context, labels).
    #[serde(default)]
    pub source_date_epoch: u64,
    /// Rewrite engine-built layers for bit-for-bit reproducibility (clamped mtimes, fixed
    /// config). On unless `false`; left out of the canonical spec when on, so turning the
    /// feature on changed no checksum.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub normalize: bool,
}

fn yes() -> bool {
    true
}

fn is_yes(value: &bool) -> bool {
    *value
}

impl Default for ImageSection {
    fn default() -> ImageSection {
        ImageSection {
            name: None,
            tag: default_tag(),
            platform: None,
            source_date_epoch: 0,
            normalize: true,
        }
    }
}

fn default_tag() -> String {
    "latest".into()
}

/// The parent: another spec of this project, or an external image whose digest is pinned.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct From {
    pub image: Option<Name>,
    #[serde(rename = "ref")]
    pub reference: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Source {
    pub name: Spanned<Name>,
    pub git: String,
    /// A tag, branch or commit; `hallmark lock` pins it to a commit.
    pub rev: String,
    pub dest: Spanned<ImagePath>,
    /// Patch sets from `patches/<set>/series`, applied in this order.
    #[serde(default)]
    pub patches: Vec<Spanned<Name>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Wheel {
    pub name: Spanned<Name>,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileCopy {
    /// Relative to the spec's folder; a file or a folder.
    pub src: Spanned<RelativePath>,
    pub dest: Spanned<ImagePath>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BuildSteps {
    /// Debian/Ubuntu packages installed with apt-get before the sources are copied.
    #[serde(default)]
    pub apt: Vec<String>,
    /// Build arguments, visible to RUN steps.
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    /// Shell commands, one RUN instruction each, after sources, files and wheels are in place.
    #[serde(default)]
    pub run: Vec<String>,
    /// Files that must exist once the RUN steps are done; the build fails otherwise.
    #[serde(default)]
    pub expect_files: Vec<ImagePath>,
    /// Give RUN steps the engine's default network (apt, pip from an index). Off by
    /// default: builds are offline, so what they use is what the pins name.
    #[serde(default)]
    pub network: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Container {
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub workdir: Option<ImagePath>,
    pub user: Option<String>,
}

/// The parent, once `[from]` is known to name exactly one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent<'a> {
    Image(&'a Name),
    External(&'a str),
}

impl ImageSpec {
    pub fn parent(&self) -> Parent<'_> {
        match (&self.from.get_ref().image, &self.from.get_ref().reference) {
            (Some(name), _) => Parent::Image(name),
            (None, Some(reference)) => Parent::External(reference),
            (None, None) => unreachable!("validated on load"),
        }
    }
}

/// A spec read from disk, with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    /// The folder name: how other specs and the command line refer to it.
    pub name: Name,
    pub dir: PathBuf,
    pub path: PathBuf,
    pub text: String,
    pub spec: ImageSpec,
}

impl LoadedSpec {
    /// The repository name of the built image.
    pub fn repository(&self) -> &str {
        self.spec.image.name.as_ref().unwrap_or(&self.name).as_str()
    }

    /// `repository:tag`: the reference the built image is tagged with.
    pub fn image_reference(&self) -> Reference {
        Reference::tagged(self.repository(), &self.spec.image.tag)
            .expect("a loaded spec's repository and tag are checked by `validate`")
    }

    pub fn reference(&self) -> String {
        self.image_reference().to_string()
    }

    pub fn invalid<T>(
        &self,
        span: std::ops::Range<usize>,
        key: &str,
        message: String,
    ) -> Result<T> {
        Err(Error::from(Invalid {
            path: self.path.clone(),
            location: Some(Location::of_offset(&self.text, span.start)),
            key: Some(key.to_string()),
            message,
            hint: None,
        }))
    }

    /// An error at `path` in the spec's text, for the checks made after parsing on values
    /// that carry no span of their own. Without a place if the path is not in the text (a
    /// default).
    pub(crate) fn invalid_at<T>(&self, path: &[&str], key: &str, message: String) -> Result<T> {
        Err(Error::from(Invalid {
            path: self.path.clone(),
            location: locate(&self.text, path),
            key: Some(key.to_string()),
            message,
            hint: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    /// Outside test: `jq=` and a package named twice were taken.
    #[test]
    fn apt_lists_with_an_empty_version_or_a_repeat_are_refused() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            super::apt_problems(&list(&["jq", "curl=7.88.1-10+deb12u5", "libc6:amd64"])).is_none()
        );
        let empty = list(&["jq="]);
        assert!(
            super::apt_problems(&empty)
                .unwrap()
                .1
                .contains("empty version")
        );
        let twice = list(&["jq", "jq=1.6-2.1"]);
        assert!(
            super::apt_problems(&twice)
                .unwrap()
                .1
                .contains("named twice")
        );
    }
}
