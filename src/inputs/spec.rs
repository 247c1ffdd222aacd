//! `images/<name>/image.toml`: what an image is made of.
//!
//! Parsing is strict (unknown keys are errors, listing the valid ones) because a typo in a
//! spec that is silently ignored costs a 45-minute build. Cross-field rules (one parent,
//! unique names, a nested source after the one it nests in) are checked right after parsing,
//! with the line of the offending key.

pub mod compile;
pub mod variant;

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

/// A smoke test: a command run in a container of the built image, or, with `serve`, a
/// process kept running while probes run inside it (a served model, asked three things).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    pub name: Spanned<String>,
    /// The command; with `serve`, the probe run inside the served container once ready.
    pub run: Spanned<Vec<String>>,
    /// A process to keep running: its argv, or `true` for the image's own entrypoint and
    /// cmd (`args` replacing the cmd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<Spanned<Serve>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Spanned<Vec<String>>>,
    /// With `serve`: run inside the container until it exits 0, within `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<Spanned<Vec<String>>>,
    /// A regular expression `run`'s standard output must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Spanned<String>>,
    /// Seconds: how long a served process may take to be ready (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Spanned<u64>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Paths of the node the container sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Spanned<SmokeMount>>,
    /// `/dev/shm`'s size: `16g`, `512m`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Spanned<String>>,
    /// `host`, `private`, `shareable` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<Spanned<String>>,
    /// `{ memlock = -1, stack = 67108864 }`: soft and hard limits alike.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ulimits: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Where it runs: `everywhere` (default), `builder` (at build only) or `nodes` (not at
    /// build: the builder may have no GPU; `smoke --node`/`--all-nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Spanned<String>>,
    /// `"all"`, a count, or CDI device names (`["nvidia.com/gpu=0"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Spanned<GpuRequest>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GpuRequest {
    Count(u32),
    All(String),
    Named(Vec<String>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Serve {
    Own(bool),
    Argv(Vec<String>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmokeMount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub readonly: bool,
}

impl Smoke {
    /// Whether the test runs on the builder (`builder: true`) or on a node.
    pub fn runs_on(&self, builder: bool) -> bool {
        match self.on.as_ref().map(|o| o.get_ref().as_str()) {
            Some("builder") => builder,
            Some("nodes") => !builder,
            _ => true,
        }
    }

    /// Whether a process is served and probed (`serve` set, and not `false`).
    pub fn served(&self) -> bool {
        !matches!(
            self.serve.as_ref().map(Spanned::get_ref),
            None | Some(Serve::Own(false))
        )
    }
}

/// `16g`, `512m`, `64k` or bytes, as `docker run --shm-size` takes them.
pub fn byte_size(text: &str) -> Option<i64> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_suffix('b').unwrap_or(&text);
    let (number, unit) = match text.char_indices().last()? {
        (at, 'k') => (&text[..at], 1i64 << 10),
        (at, 'm') => (&text[..at], 1 << 20),
        (at, 'g') => (&text[..at], 1 << 30),
        _ => (text, 1),
    };
    number
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(unit))
}

/// A smoke test's keys, each refused at its line: a probe or argument without `serve`, an
/// empty argv, a regular expression that does not compile, a size, an IPC mode or a mount
/// that is not one.
fn smoke_keys_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    let served = smoke.served();
    if let Some(serve) = &smoke.serve
        && matches!(serve.get_ref(), Serve::Argv(argv) if argv.is_empty())
    {
        return loaded.invalid(
            serve.span(),
            "smoke.serve",
            "is empty: name a command, or `true` for the image's own".into(),
        );
    }
    if let Some(ready) = &smoke.ready {
        if !served {
            return loaded.invalid(
                ready.span(),
                "smoke.ready",
                "probes a served process: it needs `serve`".into(),
            );
        }
        if ready.get_ref().is_empty() {
            return loaded.invalid(
                ready.span(),
                "smoke.ready",
                "is empty: name a command".into(),
            );
        }
    }
    if let Some(args) = &smoke.args
        && !matches!(
            smoke.serve.as_ref().map(Spanned::get_ref),
            Some(Serve::Own(true))
        )
    {
        return loaded.invalid(args.span(), "smoke.args", "goes with `serve = true` (the image's own entrypoint): with an argv, write them in `serve`".into());
    }
    if let Some(timeout) = &smoke.timeout
        && *timeout.get_ref() == 0
    {
        return loaded.invalid(
            timeout.span(),
            "smoke.timeout",
            "must be at least 1 second".into(),
        );
    }
    if let Some(expect) = &smoke.expect
        && let Err(e) = regex::Regex::new(expect.get_ref())
    {
        // regex's own message draws the pattern over three lines: its last says what is wrong.
        let why = e.to_string();
        let why = why.lines().last().unwrap_or_default();
        return loaded.invalid(
            expect.span(),
            "smoke.expect",
            format!(
                "is no regular expression ({})",
                why.trim_start_matches("error: ")
            ),
        );
    }
    if let Some(size) = &smoke.shm_size
        && byte_size(size.get_ref()).is_none()
    {
        return loaded.invalid(
            size.span(),
            "smoke.shm_size",
            format!(
                "`{}` is no size: write bytes, or a number with k, m or g (`16g`)",
                size.get_ref()
            ),
        );
    }
    if let Some(gpus) = &smoke.gpus {
        let wrong = match gpus.get_ref() {
            GpuRequest::Count(0) => Some("asks for no GPU: write a count of 1 or more, \"all\", or device names".to_string()),
            GpuRequest::All(word) if word != "all" => Some(format!("`{word}`: write \"all\", a count, or CDI device names (`[\"nvidia.com/gpu=0\"]`)")),
            GpuRequest::Named(names) if names.is_empty() => Some("is empty: name a CDI device (`nvidia.com/gpu=0`)".into()),
            GpuRequest::Named(names) => names
                .iter()
                .find(|n| !n.split_once('=').is_some_and(|(kind, name)| kind.contains('/') && !name.is_empty()))
                .map(|n| format!("`{n}` is no CDI device name: write `vendor/class=name` (`nvidia.com/gpu=0`)")),
            _ => None,
        };
        if let Some(wrong) = wrong {
            return loaded.invalid(gpus.span(), "smoke.gpus", wrong);
        }
    }
    if let Some(on) = &smoke.on
        && !["everywhere", "builder", "nodes"].contains(&on.get_ref().as_str())
    {
        return loaded.invalid(
            on.span(),
            "smoke.on",
            format!(
                "`{}`: write `everywhere`, `builder` or `nodes`",
                on.get_ref()
            ),
        );
    }
    if let Some(ipc) = &smoke.ipc
        && !["host", "private", "shareable", "none"].contains(&ipc.get_ref().as_str())
    {
        return loaded.invalid(
            ipc.span(),
            "smoke.ipc",
            format!(
                "`{}`: write `host`, `private`, `shareable` or `none`",
                ipc.get_ref()
            ),
        );
    }
    for mount in &smoke.mounts {
        let m = mount.get_ref();
        if !m.source.starts_with('/') || !m.target.starts_with('/') {
            return loaded.invalid(mount.span(), "smoke.mounts", format!("`{}` on `{}`: both must be absolute paths (a path on the node, one in the container)", m.source, m.target));
        }
    }
    Ok(())
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

/// The last `source-date-epoch` engines keep as a file time: they set times in nanoseconds
/// in an i64, and a later time comes out as 1970.
pub const MAX_SOURCE_DATE: u64 = 9_223_372_036;

/// Why `value` cannot be written in a Dockerfile `ENV`, `ARG` or `LABEL` (a line break ends
/// the instruction; other control characters do not survive the engines' parsers alike).
/// A tab is kept as it is, inside the quotes.
fn unwritable(value: &str) -> Option<String> {
    value
        .chars()
        .find(|&c| c.is_control() && c != '\t')
        .map(|c| format!("{c:?} is a control character, which a Dockerfile cannot hold in a value"))
}

/// Where the value at `path` stands in a TOML text: each step of `path` a table key, or for
/// an array the item with that text (a string, or a table holding it as a value).
pub(crate) fn locate(text: &str, path: &[&str]) -> Option<Location> {
    use toml::de::{DeTable, DeValue};
    fn entry<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v)
    }
    let root = DeTable::parse(text).ok()?;
    let (first, rest) = path.split_first()?;
    let mut value = entry(root.get_ref(), first)?;
    for step in rest {
        value = match value.get_ref() {
            DeValue::Table(table) => entry(table, step)?,
            DeValue::Array(items) => items.iter().find(|item| match item.get_ref() {
                DeValue::String(s) => s == step,
                DeValue::Table(table) => table
                    .iter()
                    .any(|(_, v)| matches!(v.get_ref(), DeValue::String(s) if s == step)),
                _ => false,
            })?,
            _ => return None,
        };
    }
    Some(Location::of_offset(text, value.span().start))
}

/// Parse a TOML document strictly, turning the parser's error into one that names file,
/// line, column and key.
pub fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let location = e.span().map(|span| Location::of_offset(text, span.start));
        let key = location.as_ref().and_then(|l| key_on_line(&l.text));
        let mut message = e.message().trim().to_string();
        // The parser says "duplicate key" and no more: the key (or the table written twice)
        // is named, as the caret alone left a reader to guess.
        if message == "duplicate key"
            && let Some(key) = &key
        {
            message = format!("duplicate key `{key}`");
        }
        Error::Parse {
            path: path.to_path_buf(),
            location,
            key,
            message,
        }
    })
}

/// The key a line of TOML sets (`key = ...`), or the table it opens (`[table]`).
fn key_on_line(line: &str) -> Option<String> {
    let line = line.trim();
    if let Some(table) = line.strip_prefix('[').filter(|t| !t.starts_with('[')) {
        let table = table.split(']').next()?.trim();
        return (!table.is_empty()).then(|| table.to_string());
    }
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

pub fn load(name: &Name, dir: &Path) -> Result<LoadedSpec> {
    let path = dir.join("image.toml");
    let text = read_text(&path)?;
    if variant::is_variant(&text) {
        return variant::load(name, dir, path, text);
    }
    parse(name, dir, path, text)
}

/// The most a spec or a series file may hold: hand-written, they are kilobytes; a 42 MB spec
/// took 8 s and 1 GB to refuse (an outside test).
pub const MAX_TEXT_BYTES: u64 = 1 << 20;

/// Reads a spec or a series: at most [`MAX_TEXT_BYTES`], UTF-8.
pub fn read_text(path: &Path) -> Result<String> {
    let file = fs_err::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    // One byte past the cap says it is too big without reading the rest.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_TEXT_BYTES + 1),
        &mut bytes,
    )
    .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(Error::from(Invalid {
            path: path.to_path_buf(),
            location: None,
            key: None,
            message: format!(
                "is over {} MiB; a spec or a series is a hand-written file of kilobytes",
                MAX_TEXT_BYTES >> 20
            ),
            hint: None,
        }));
    }
    text_of(path, bytes)
}

/// The text of `bytes` read from `path`; bytes that are not UTF-8 are bad input (exit 2)
/// named by line and column, not an I/O error.
pub fn text_of(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let lossy = String::from_utf8_lossy(e.as_bytes());
        Error::from(Invalid {
            path: path.to_path_buf(),
            location: Some(Location::of_offset(&lossy, valid)),
            key: None,
            message: "not UTF-8 text".into(),
            hint: None,
        })
    })
}

/// Parses and validates the text of `dir/image.toml` (read by [`load`]; fuzzed on its own).
pub fn parse(name: &Name, dir: &Path, path: PathBuf, text: String) -> Result<LoadedSpec> {
    let spec: ImageSpec = parse_toml(&path, &text)?;
    let loaded = LoadedSpec {
        name: name.clone(),
        dir: dir.to_path_buf(),
        path,
        text,
        spec,
    };
    validate(&loaded)?;
    Ok(loaded)
}

/// The checks the TOML types cannot make, one group of keys at a time; the first problem is
/// reported at its key.
fn validate(loaded: &LoadedSpec) -> Result<()> {
    validate_image(loaded)?;
    validate_sources(loaded)?;
    validate_wheels(loaded)?;
    validate_files(loaded)?;
    validate_container_and_name(loaded)?;
    validate_labels_and_env(loaded)?;
    validate_build(loaded)
}

/// `from` and `[image]`: the parent, the tag, the source date.
fn validate_image(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let from = spec.from.get_ref();
    match (&from.image, &from.reference) {
        (Some(_), Some(_)) | (None, None) => {
            return loaded.invalid(
                spec.from.span(),
                "from",
                "name exactly one parent: `image` (another spec) or `ref` (an external image)"
                    .into(),
            );
        }
        (Some(parent), None) if *parent == loaded.name => {
            // The caret on the value, not on `[from]`.
            return loaded.invalid_at(
                &["from", "image"],
                "from.image",
                "an image cannot be its own parent".into(),
            );
        }
        (None, Some(reference)) => {
            if reference.contains('@') {
                return loaded.invalid(
                    spec.from.span(),
                    "from.ref",
                    format!("`{reference}` carries a digest; write the tag here, the digest belongs in pins/ (`hallmark lock`)"),
                );
            }
            if let Err(why) = Reference::parse(reference) {
                return loaded.invalid(spec.from.span(), "from.ref", why);
            }
        }
        _ => {}
    }
    if let Some(why) = reference::tag_error(&spec.image.tag) {
        return loaded.invalid_at(&["image", "tag"], "image.tag", why);
    }
    if spec.image.source_date_epoch > MAX_SOURCE_DATE {
        return loaded.invalid_at(
            &["image", "source-date-epoch"],
            "image.source-date-epoch",
            format!(
                "{} is past {MAX_SOURCE_DATE} (2262-04-11T23:47:16Z), the last second engines can give a file as its time",
                spec.image.source_date_epoch
            ),
        );
    }

    Ok(())
}

/// `[[source]]`: unique names, usable git revisions, destinations that do not overwrite
/// each other.
fn validate_sources(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut names = BTreeSet::new();
    for (i, source) in spec.sources.iter().enumerate() {
        if !names.insert(source.name.get_ref().clone()) {
            return loaded.invalid(
                source.name.span(),
                "source.name",
                format!("source `{}` is named twice", source.name.get_ref()),
            );
        }
        if source.git.trim().is_empty() {
            return loaded.invalid(source.name.span(), "source.git", "is empty".into());
        }
        if source.git.chars().any(char::is_control) {
            // The URL is stamped as a label, and a Dockerfile line cannot hold these.
            return loaded.invalid(
                source.name.span(),
                "source.git",
                "has control characters".into(),
            );
        }
        if source.rev.trim().is_empty() || source.rev.starts_with('-') {
            return loaded.invalid(
                source.name.span(),
                "source.rev",
                format!("`{}` is not a git revision", source.rev),
            );
        }
        if source.dest.get_ref().as_str() == "/" {
            return loaded.invalid(
                source.dest.span(),
                "source.dest",
                "a source cannot replace the image root".into(),
            );
        }
        // A nested source (cutlass inside vLLM's build tree) is copied after its container,
        // so it must come later in the spec; the reverse would be silently overwritten.
        for later in &spec.sources[i + 1..] {
            if source.dest.get_ref().is_within(later.dest.get_ref()) {
                return loaded.invalid(
                    source.dest.span(),
                    "source.dest",
                    format!(
                        "`{}` lies inside source `{}` ({}), which is listed later and would overwrite it; list the outer source first",
                        source.dest.get_ref(),
                        later.name.get_ref(),
                        later.dest.get_ref()
                    ),
                );
            }
        }
        let mut sets = BTreeSet::new();
        for set in &source.patches {
            if !sets.insert(set.get_ref().clone()) {
                return loaded.invalid(
                    set.span(),
                    "source.patches",
                    format!("patch set `{}` is listed twice", set.get_ref()),
                );
            }
        }
    }
    Ok(())
}

/// `[[wheel]]`: each once, at an exact version.
fn validate_wheels(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut wheels = BTreeSet::new();
    for wheel in &spec.wheels {
        let normalized = wheel
            .name
            .get_ref()
            .as_str()
            .to_lowercase()
            .replace(['-', '.'], "_");
        if !wheels.insert(normalized) {
            return loaded.invalid(
                wheel.name.span(),
                "wheel.name",
                format!("wheel `{}` is listed twice", wheel.name.get_ref()),
            );
        }
        let version_ok = !wheel.version.is_empty()
            && wheel.version.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'!' | b'_' | b'-')
            });
        if !version_ok {
            return loaded.invalid(
                wheel.name.span(),
                "wheel.version",
                format!(
                    "`{}` is not an exact version (write `1.3.0`, not a range)",
                    wheel.version
                ),
            );
        }
    }
    Ok(())
}

/// `[[file]]` and `[[smoke]]`: one file per destination, smoke tests named once.
fn validate_files(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut dests = BTreeSet::new();
    for file in &spec.files {
        if file.dest.get_ref().as_str().ends_with('/') {
            return loaded.invalid(
                file.dest.span(),
                "file.dest",
                format!(
                    "`{}` must name the file or folder to create, without a trailing `/`",
                    file.dest.get_ref()
                ),
            );
        }
        if !dests.insert(file.dest.get_ref().clone()) {
            return loaded.invalid(
                file.dest.span(),
                "file.dest",
                format!("`{}` is the destination of two files", file.dest.get_ref()),
            );
        }
    }
    let mut smokes = BTreeSet::new();
    for smoke in &spec.smokes {
        if !smokes.insert(smoke.name.get_ref().clone()) {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.name",
                format!("smoke test `{}` is named twice", smoke.name.get_ref()),
            );
        }
        if smoke.name.get_ref().trim().is_empty() {
            return loaded.invalid(smoke.name.span(), "smoke.name", "is blank".into());
        }
        if smoke.run.get_ref().is_empty() {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.run",
                "is empty: give the command as a list, e.g. [\"python3\", \"-c\", \"import b12x\"]"
                    .into(),
            );
        }
        if smoke.run.get_ref()[0].trim().is_empty() {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.run",
                "names a blank program: its first item is what runs".into(),
            );
        }
        smoke_keys_hold(loaded, smoke)?;
    }
    Ok(())
}

/// `[container]` and the image's repository name (`[image] name` or the folder's).
fn validate_container_and_name(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    // `[]` clears what the base set; an entrypoint whose program is blank fails only when
    // it runs (a `cmd` may start with an empty argument to an entrypoint).
    if let Some(program) = spec.container.entrypoint.as_ref().and_then(|e| e.first())
        && program.trim().is_empty()
    {
        return loaded.invalid_at(
            &["container", "entrypoint"],
            "container.entrypoint",
            "names a blank program: its first item is what runs (`[]` clears the base's)".into(),
        );
    }
    if let Some(user) = &spec.container.user {
        let ok = !user.is_empty()
            && user
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if !ok {
            return loaded.invalid_at(
                &["container", "user"],
                "container.user",
                format!("`{user}` is not a user: write `name`, `uid` or `uid:gid`"),
            );
        }
    }
    let repository = loaded.repository();
    let named = reference::repository_error(repository).or_else(|| {
        Reference::tagged(repository, &spec.image.tag)
            .err()
            .map(|why| format!("`{repository}` cannot be tagged: {why}"))
    });
    if let Some(message) = named {
        // Where `name` is set; a folder name has no place in the text.
        return Err(Error::from(Invalid {
            path: loaded.path.clone(),
            location: locate(&loaded.text, &["image", "name"]),
            key: Some("image.name".into()),
            message,
            hint: Some("rename the folder or set `name` in [image]".into()),
        }));
    }
    Ok(())
}

/// `[labels]`, `[env]`, `[build.args]`: keys and values a Dockerfile line can carry.
fn validate_labels_and_env(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    for key in spec.labels.keys() {
        if key.is_empty()
            || key
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=')
        {
            return loaded.invalid_at(
                &["labels", key],
                &format!("labels.{key}"),
                format!("`{key}` is not a label key"),
            );
        }
    }
    for (key, value) in &spec.labels {
        if let Some(why) = unwritable(value) {
            return loaded.invalid_at(&["labels", key], &format!("labels.{key}"), why);
        }
    }
    for (key, path, table) in [
        ("env", &["env"][..], &spec.env),
        ("build.args", &["build", "args"], &spec.build.args),
    ] {
        for (name, value) in table {
            let at = [path, &[name.as_str()]].concat();
            if let Some(why) = unwritable(value) {
                return loaded.invalid_at(&at, &format!("{key}.{name}"), why);
            }
        }
        for name in table.keys() {
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return loaded.invalid_at(
                    &[path, &[name.as_str()]].concat(),
                    &format!("{key}.{name}"),
                    format!("`{name}` is not a valid variable name"),
                );
            }
        }
    }
    Ok(())
}

/// An apt package name (with an optional `=version` or `:arch`) as it may be written unquoted
/// into a shell command: a safe alphabet, no leading `-` or `~`.
pub fn is_apt_package(package: &str) -> bool {
    package.starts_with(|c: char| c.is_ascii_alphanumeric())
        && package.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b':' | b'=' | b'~')
        })
}

/// The first problem of an `apt` list: a package that is not a name, an empty `=version`,
/// a package named twice.
pub fn apt_problems(packages: &[String]) -> Option<(&String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for package in packages {
        if !is_apt_package(package) {
            return Some((package, format!("`{package}` is not a package name")));
        }
        let requested = crate::inputs::apt::Requested::parse(package);
        if requested.version.as_deref() == Some("") || requested.arch.as_deref() == Some("") {
            return Some((
                package,
                format!("`{package}`: an empty version or architecture"),
            ));
        }
        if !seen.insert(requested.name.clone()) {
            return Some((package, format!("`{}` is named twice", requested.name)));
        }
    }
    None
}

/// `[build]`: steps and apt packages.
fn validate_build(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    for step in &spec.build.run {
        if step.trim().is_empty() {
            return loaded.invalid_at(
                &["build", "run", step],
                "build.run",
                "a step is blank: give it a command or remove it".into(),
            );
        }
        if step.contains('\0') {
            return loaded.invalid_at(
                &["build", "run", step],
                "build.run",
                "a step holds a NUL character, which no command line can carry".into(),
            );
        }
    }
    if let Some((package, message)) = apt_problems(&spec.build.apt) {
        return loaded.invalid_at(&["build", "apt", package], "build.apt", message);
    }
    crate::inputs::spec::compile::validate(loaded)
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
