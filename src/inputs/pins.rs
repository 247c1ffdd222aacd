//! `pins/<name>.toml`: every moving reference of a spec, resolved by `hallmark lock` and
//! reviewed in git. A pin is stale when the spec no longer asks for what it resolved; then
//! nothing is built or checksummed from it.

use crate::error::{Error, Invalid, Result};
use crate::inputs::apt::Requested;
use crate::inputs::python;
use crate::inputs::spec::{LoadedSpec, Parent, parse_toml};
use crate::inputs::values::{Digest, GitCommit, Name, Sha256Hex};
use crate::oci::Reference;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Pins {
    pub base: Option<BasePin>,
    #[serde(default, rename = "source", skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourcePin>,
    /// The Python the wheels were chosen for (`hallmark lock` asks the parent image, or it is
    /// written by hand); not in the checksum: the wheel pins are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<python::Interpreter>,
    #[serde(default, rename = "wheel", skip_serializing_if = "Vec::is_empty")]
    pub wheels: Vec<WheelPin>,
    /// The toolchain images of compile stages, pinned as bases are.
    #[serde(default, rename = "toolchain", skip_serializing_if = "Vec::is_empty")]
    pub toolchains: Vec<BasePin>,
    /// System packages: each the spec's `apt` asks for and everything they need that the
    /// image they go into lacks, by archive file and sha256 (`hallmark lock`; docs/spec.md).
    #[serde(default, rename = "apt", skip_serializing_if = "Vec::is_empty")]
    pub apt: Vec<AptPin>,
    /// What the apt pins were resolved against, by where they go (`build`, or
    /// `compile.<stage>`): the checksum line that names that image (`parent <name>
    /// <checksum>`, `base <ref> <digest>`, `toolchain ...`). Another image there is another
    /// set of installed packages: the pins are stale until `lock` resolves them again.
    #[serde(
        default,
        rename = "apt-against",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub apt_against: std::collections::BTreeMap<String, String>,
}

/// The key of `apt-against` for `stage` (`None`: `[build]`).
pub fn apt_target(stage: Option<&Name>) -> String {
    match stage {
        None => "build".to_string(),
        Some(stage) => format!("compile.{stage}"),
    }
}

/// The pins of `stage` (`None`: `[build]`) are stale unless they were resolved against
/// `line`, the image they go into now.
pub fn apt_against_is(
    pins: &Pins,
    path: &Path,
    image: &Name,
    stage: Option<&Name>,
    line: &str,
) -> Result<()> {
    if !pins.apt.iter().any(|p| p.stage.as_ref() == stage) {
        return Ok(());
    }
    let target = apt_target(stage);
    let what = match stage {
        None => "[build]".to_string(),
        Some(stage) => format!("compile stage `{stage}`"),
    };
    match pins.apt_against.get(&target) {
        Some(against) if against == line => Ok(()),
        found => Err(Error::Pin {
            image: image.to_string(),
            path: path.to_path_buf(),
            what: format!(
                "stale: the apt packages of {what} were resolved against {}; they go into `{line}` now (other installed packages)",
                found.map_or("an image not recorded".to_string(), |a| format!("`{a}`"))
            ),
        }),
    }
}

/// One Debian package file, as the archive's signed index named it when it was locked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AptPin {
    /// The compile stage whose toolchain it goes into; `None`: the image's `[build]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<Name>,
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// Whether the spec names it (the others are there because these need them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wanted: bool,
    /// The archive (an apt source's URI) and the file's path in it.
    pub archive: String,
    pub path: String,
    pub size: u64,
    pub sha256: Sha256Hex,
    /// Where this version can still be found once the archive moved on: Debian's snapshot
    /// archive at the time of the index it was locked from (Debian's archives only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl AptPin {
    /// `name=version`, as apt writes a package.
    pub fn describe(&self) -> String {
        format!("{}={}", self.name, self.version)
    }

    /// The line of the checksum document that stands for it.
    pub fn checksum_line(&self) -> String {
        format!(
            "apt {} {} {} {}",
            self.name, self.version, self.architecture, self.sha256
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BasePin {
    /// A bad reference fails parsing here, at its line.
    #[serde(rename = "ref")]
    pub reference: Reference,
    pub digest: Digest,
    /// `repo-digest` when the registry's manifest digest is known, `config-digest` for an
    /// image that only exists locally (made with `docker import` or `docker load`).
    #[serde(default)]
    pub kind: DigestKind,
    /// The base's baked ENTRYPOINT and CMD, as seen by `hallmark lock` (or written by hand),
    /// so `check` can catch a spec that repeats them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DigestKind {
    #[default]
    RepoDigest,
    /// The digest of the image's config: the same on every image store (`base.rs`).
    ConfigDigest,
    /// Written by hallmark before it pinned config digests: the image id on the store that
    /// locked it (the config digest on the classic store, the manifest digest on the
    /// containerd store). Still read; `hallmark lock --update` rewrites it.
    ImageId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SourcePin {
    pub name: Name,
    pub git: String,
    pub rev: String,
    pub commit: GitCommit,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WheelPin {
    pub name: Name,
    pub version: String,
    pub file: String,
    pub sha256: Sha256Hex,
}

pub fn path_for(root: &Path, image: &Name) -> PathBuf {
    root.join("pins").join(format!("{image}.toml"))
}

/// Reads the pins of an image; an absent file is an empty set of pins.
pub fn read(root: &Path, image: &Name) -> Result<Pins> {
    let path = path_for(root, image);
    crate::inputs::project::stays_inside(root, &path)?;
    match fs_err::read(&path) {
        Ok(bytes) => {
            let text = crate::inputs::spec::text_of(&path, bytes)?;
            parse(path, &text)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Pins::default()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Parses the text of a pins file (read by [`read`]; fuzzed on its own).
pub fn parse(path: PathBuf, text: &str) -> Result<Pins> {
    let pins: Pins = parse_toml(&path, text)?;
    if let Some(Err(message)) = pins.python.as_ref().map(python::Interpreter::check) {
        return Err(Error::from(Invalid {
            location: crate::inputs::spec::locate(text, &["python"]),
            path,
            key: Some("python".into()),
            message: message.to_string(),
            hint: None,
        }));
    }
    for pin in &pins.apt {
        if let Some(message) = apt_pin_problem(pin) {
            return Err(Error::from(Invalid {
                location: crate::inputs::spec::locate(text, &["apt", pin.name.as_str()]),
                path,
                key: Some("apt".into()),
                message: format!("package `{}`: {message}", pin.name.escape_debug()),
                hint: Some("`hallmark lock --update` writes these pins; a hand edit must keep to what an archive's index gives".into()),
            }));
        }
    }
    for wheel in &pins.wheels {
        let distribution = wheel.file.split('-').next().unwrap_or_default();
        if !wheel.file.ends_with(".whl")
            || wheel_stem(distribution) != wheel_stem(wheel.name.as_str())
            || wheel.file.contains(['/', '\\'])
            || wheel
                .file
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(Error::from(Invalid {
                path,
                location: crate::inputs::spec::locate(text, &["wheel", &wheel.file, "file"]),
                key: Some("wheel.file".into()),
                message: format!(
                    "`{}` is not a wheel file name for `{}`",
                    wheel.file, wheel.name
                ),
                hint: None,
            }));
        }
    }
    Ok(pins)
}

/// Why an `[[apt]]` pin cannot be what an archive's index gave (it is written into a build
/// context, a shell command and a URL): `None` if it can.
fn apt_pin_problem(pin: &AptPin) -> Option<String> {
    let alphabet = |text: &str, extra: &[char]| {
        !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    let name_ok = alphabet(&pin.name, &['+', '-', '.'])
        && pin.name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !name_ok {
        return Some(
            "`name` is not a Debian package name (a-z 0-9 + - ., a letter or digit first)".into(),
        );
    }
    if !alphabet(&pin.version, &['+', '-', '.', '~', ':']) {
        return Some(format!(
            "`version` `{}` is not a Debian version",
            pin.version.escape_debug()
        ));
    }
    if !alphabet(&pin.architecture, &['-']) {
        return Some(format!(
            "`architecture` `{}` is not a Debian architecture",
            pin.architecture.escape_debug()
        ));
    }
    let path_ok = alphabet(&pin.path, &['+', '-', '.', '~', '_', '/', '%', ':'])
        && !pin.path.starts_with('/')
        && pin
            .path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && pin.path.ends_with(".deb");
    if !path_ok {
        return Some(format!(
            "`path` `{}` is not a package file inside its archive (relative, no `..`, ending in .deb)",
            pin.path.escape_debug()
        ));
    }
    let archive_ok = (pin.archive.starts_with("http://") || pin.archive.starts_with("https://"))
        && !pin
            .archive
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        && !pin
            .archive
            .split("://")
            .nth(1)
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("")
            .contains('@');
    if !archive_ok {
        return Some(format!(
            "`archive` `{}` is not an http(s) address without credentials",
            pin.archive.escape_debug()
        ));
    }
    if pin.size == 0 {
        return Some("`size` is 0".into());
    }
    None
}

/// PEP 427 normalisation of a distribution name as it appears in wheel file names.
pub fn wheel_stem(name: &str) -> String {
    name.to_lowercase().replace(['-', '.'], "_")
}

pub fn write(root: &Path, image: &Name, pins: &Pins) -> Result<()> {
    let path = path_for(root, image);
    let body = toml::to_string_pretty(pins).expect("pins serialize");
    let text = format!("# Written by `hallmark lock {image}`; review changes in git.\n\n{body}");
    if let Some(dir) = path.parent() {
        fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // A signal ends hallmark after the write, never in its middle.
    let _writing = crate::interrupt::writing();
    fs_err::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// The pins of one spec, each checked against what the spec asks for.
#[derive(Debug, Clone)]
pub struct CheckedPins {
    pub base: Option<BasePin>,
    /// In the spec's source order.
    pub sources: Vec<SourcePin>,
    /// In the spec's wheel order.
    pub wheels: Vec<WheelPin>,
    /// Sorted by stage (`[build]`'s first) and name.
    pub apt: Vec<AptPin>,
}

impl CheckedPins {
    /// The packages that go into `stage`'s toolchain (`None`: into the image at `[build]`).
    pub fn apt_for(&self, stage: Option<&Name>) -> Vec<&AptPin> {
        self.apt
            .iter()
            .filter(|p| p.stage.as_ref() == stage)
            .collect()
    }
}

/// Matches pins to the spec: every source, wheel and external base has a current pin, and
/// no pin is left for something the spec dropped.
pub fn check(loaded: &LoadedSpec, root: &Path, pins: &Pins) -> Result<CheckedPins> {
    let checking = Checking {
        loaded,
        pins,
        path: path_for(root, &loaded.name),
    };
    let checked = CheckedPins {
        base: checking.base()?,
        sources: checking.sources()?,
        wheels: checking.wheels()?,
        apt: checking.apt()?,
    };
    checking.nothing_left_over()?;
    Ok(checked)
}

/// A spec's pins being matched to it; each error names the image and its pins file.
struct Checking<'a> {
    loaded: &'a LoadedSpec,
    pins: &'a Pins,
    path: PathBuf,
}

impl Checking<'_> {
    fn error(&self, what: String) -> Error {
        // No pins file at all: that is the news, not the first pin it lacks.
        let what = match self.path.exists() {
            true => what,
            false => format!("does not exist ({what})"),
        };
        Error::Pin {
            image: self.loaded.name.to_string(),
            path: self.path.clone(),
            what,
        }
    }

    fn base(&self) -> Result<Option<BasePin>> {
        match (self.loaded.spec.parent(), &self.pins.base) {
            (Parent::Image(_), None) => Ok(None),
            (Parent::Image(_), Some(base)) => Err(self.error(format!(
                "pins a base `{}`, but the spec's parent is another spec",
                base.reference
            ))),
            (Parent::External(reference), None) => {
                Err(self.error(format!("no digest pinned for the base `{reference}`")))
            }
            (Parent::External(reference), Some(base)) if base.reference != reference => Err(self
                .error(format!(
                    "stale: the base pin is for `{}`, the spec asks for `{reference}`",
                    base.reference
                ))),
            (Parent::External(_), Some(base)) => Ok(Some(base.clone())),
        }
    }

    fn sources(&self) -> Result<Vec<SourcePin>> {
        let mut sources = Vec::new();
        for source in &self.loaded.spec.sources {
            let name = source.name.get_ref();
            let pin = self
                .pins
                .sources
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| self.error(format!("no commit pinned for source `{name}`")))?;
            if pin.git != source.git || pin.rev != source.rev {
                return Err(self.error(format!(
                    "stale: source `{name}` is pinned for {} at `{}`, the spec asks for {} at `{}`",
                    crate::inputs::values::redact_url(&pin.git),
                    pin.rev,
                    crate::inputs::values::redact_url(&source.git),
                    source.rev
                )));
            }
            // A rev that is a full commit is that commit: a pin naming another (a hand edit)
            // would build what the spec does not say.
            let rev = source.rev.to_ascii_lowercase();
            if rev.len() == 40
                && rev.bytes().all(|b| b.is_ascii_hexdigit())
                && rev != pin.commit.to_string()
            {
                return Err(self.error(format!(
                    "source `{name}`: the spec's rev is the commit {rev}, the pin says {}; run `hallmark lock --update {}`",
                    pin.commit,
                    self.loaded.name
                )));
            }
            sources.push(pin.clone());
        }
        Ok(sources)
    }

    fn wheels(&self) -> Result<Vec<WheelPin>> {
        let mut wheels = Vec::new();
        for wheel in &self.loaded.spec.wheels {
            let name = wheel.name.get_ref();
            let pin = self
                .pins
                .wheels
                .iter()
                .find(|p| wheel_stem(p.name.as_str()) == wheel_stem(name.as_str()))
                .ok_or_else(|| self.error(format!("no sha256 pinned for wheel `{name}`")))?;
            if pin.version != wheel.version {
                return Err(self.error(format!(
                    "stale: wheel `{name}` is pinned at {}, the spec asks for {}",
                    pin.version, wheel.version
                )));
            }
            wheels.push(pin.clone());
        }
        Ok(wheels)
    }

    /// Every apt package the spec names (in `[build]` and in each compile stage) has a pin
    /// marked wanted, at the version the spec asks for, and no wanted pin is for a package
    /// or stage the spec no longer names.
    fn apt(&self) -> Result<Vec<AptPin>> {
        let spec = &self.loaded.spec;
        let mut targets: Vec<(Option<&Name>, &[String])> = vec![(None, &spec.build.apt)];
        for stage in &spec.compiles {
            targets.push((Some(stage.name.get_ref()), &stage.apt));
        }
        let where_ = |stage: Option<&Name>| match stage {
            None => "[build]".to_string(),
            Some(stage) => format!("compile stage `{stage}`"),
        };
        for (stage, packages) in &targets {
            for package in packages.iter() {
                let wanted = Requested::parse(package);
                let pin = self
                    .pins
                    .apt
                    .iter()
                    .find(|p| p.wanted && p.stage.as_ref() == *stage && p.name == wanted.name)
                    .ok_or_else(|| {
                        let at: Vec<&str> = match stage {
                            None => vec!["build", "apt", package],
                            Some(stage) => vec!["compile", stage.as_str(), "apt", package],
                        };
                        Error::from(Invalid {
                            path: self.loaded.path.clone(),
                            location: crate::inputs::spec::locate(&self.loaded.text, &at),
                            key: Some(if stage.is_some() { "compile.apt" } else { "build.apt" }.into()),
                            message: format!(
                                "apt package `{package}` has no pin in {}: apt would take whatever the archive serves the day it builds",
                                self.path.display()
                            ),
                            hint: Some(format!("run `hallmark lock {}`", self.loaded.name)),
                        })
                    })?;
                if let Some(version) = wanted.version.as_ref().filter(|v| **v != pin.version) {
                    return Err(self.error(format!(
                        "stale: apt package `{}` of {} is pinned at {}, the spec asks for {version}",
                        wanted.name,
                        where_(*stage),
                        pin.version
                    )));
                }
            }
        }
        for pin in &self.pins.apt {
            let named = targets.iter().any(|(stage, packages)| {
                *stage == pin.stage.as_ref()
                    && packages
                        .iter()
                        .any(|p| Requested::parse(p).name == pin.name)
            });
            let stage_known = targets
                .iter()
                .any(|(stage, packages)| *stage == pin.stage.as_ref() && !packages.is_empty());
            if (pin.wanted && !named) || !stage_known {
                return Err(self.error(format!(
                    "stale: pins apt package `{}` for {}, which the spec no longer asks for",
                    pin.name,
                    where_(pin.stage.as_ref())
                )));
            }
        }
        let mut apt = self.pins.apt.clone();
        apt.sort();
        Ok(apt)
    }

    /// No source or wheel is pinned that the spec no longer has.
    fn nothing_left_over(&self) -> Result<()> {
        let spec = &self.loaded.spec;
        for pin in &self.pins.sources {
            if !spec.sources.iter().any(|s| s.name.get_ref() == &pin.name) {
                return Err(self.error(format!(
                    "stale: pins source `{}`, which the spec no longer has",
                    pin.name
                )));
            }
        }
        for pin in &self.pins.wheels {
            let stem = wheel_stem(pin.name.as_str());
            if !spec
                .wheels
                .iter()
                .any(|w| wheel_stem(w.name.get_ref().as_str()) == stem)
            {
                return Err(self.error(format!(
                    "stale: pins wheel `{}`, which the spec no longer has",
                    pin.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apt_pins(field: &str, value: &str) -> String {
        let mut pin = toml::map::Map::new();
        for (key, default) in [
            ("name", "jq"),
            ("version", "1.6-2.1+deb12u2"),
            ("architecture", "amd64"),
            ("archive", "http://deb.debian.org/debian"),
            ("path", "pool/main/j/jq/jq_1.6-2.1+deb12u2_amd64.deb"),
            ("sha256", &"a".repeat(64)),
        ] {
            let value = if key == field { value } else { default };
            pin.insert(key.into(), toml::Value::String(value.into()));
        }
        pin.insert("size".into(), toml::Value::Integer(10));
        let mut root = toml::map::Map::new();
        root.insert(
            "apt".into(),
            toml::Value::Array(vec![toml::Value::Table(pin)]),
        );
        toml::to_string(&toml::Value::Table(root)).unwrap()
    }

    /// Outside test: a newline in a pin's name panicked (the checksum line), `..` in a path
    /// was fetched, credentials in an archive were kept.
    #[test]
    fn hand_edited_apt_pins_are_refused_naming_the_field() {
        let path = PathBuf::from("pins/x.toml");
        assert!(parse(path.clone(), &apt_pins("name", "jq")).is_ok());
        for (field, value, words) in [
            ("name", "jq\nRUN echo injected", "`name`"),
            ("name", "../../evil", "`name`"),
            ("version", "1.0 2", "`version`"),
            ("architecture", "amd64/../x", "`architecture`"),
            ("path", "../../../etc/passwd.deb", "`path`"),
            ("path", "/pool/x.deb", "`path`"),
            ("path", "pool/x.tar", "`path`"),
            (
                "archive",
                "http://user:token@deb.debian.org/debian",
                "`archive`",
            ),
            ("archive", "file:///repo", "`archive`"),
        ] {
            let error = parse(path.clone(), &apt_pins(field, value))
                .expect_err(value)
                .to_string();
            assert!(
                error.contains(words) && error.contains("pins/x.toml"),
                "{value}: {error}"
            );
        }
    }
}
