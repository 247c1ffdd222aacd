//! The plan: which specs take part (the requested ones and their parents), in build order,
//! each with its checked pins, its patch sets, its files, its template and its checksum.
//! Everything here is offline: no engine, no network.

pub mod apt;
pub mod bump;
pub mod check;
pub mod checksum;
pub mod compile;
pub mod fetch;
pub mod lock;
pub mod patched;
pub mod pin_moves;
pub mod sbom;

use crate::error::{Error, Invalid, Result};
use crate::inputs::patches::{self, SourcePatches};
use crate::inputs::pins::{self, CheckedPins};
use crate::inputs::project::Project;
use crate::inputs::spec::{ContextFile, LoadedSpec, Parent};
use crate::inputs::values::Name;
use crate::plan::checksum::{FileHashes, HashStats, InputChecksum};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const DEFAULT_TEMPLATE: &str = include_str!("../templates/Dockerfile.hbs");

#[derive(Debug, Clone)]
pub struct Template {
    /// `embedded` or the path of the spec's `Dockerfile.hbs`.
    pub origin: String,
    pub text: String,
}

#[derive(Debug, Clone)]
pub struct PlannedImage {
    pub loaded: LoadedSpec,
    pub pins: CheckedPins,
    pub parent: Option<Name>,
    /// One entry per source, in the spec's order.
    pub patches: Vec<SourcePatches>,
    pub files: Vec<ContextFile>,
    pub template: Template,
    /// Compile stages, in the spec's order, each with its own checksum.
    pub compiles: Vec<crate::plan::compile::PlannedStage>,
    pub checksum: InputChecksum,
    /// The text the checksum is the sha256 of.
    pub document: String,
}

impl PlannedImage {
    pub fn name(&self) -> &Name {
        &self.loaded.name
    }
}

#[derive(Debug)]
pub struct Plan {
    pub images: BTreeMap<Name, PlannedImage>,
    /// Parents before children.
    pub order: Vec<Name>,
    /// What was read to hash the files, and what was remembered.
    pub hashing: HashStats,
}

/// Why an image has no plan: its own problem, or one up its parent chain (the image named
/// is the one whose own problem it is).
#[derive(Debug)]
pub enum Failure {
    Own(Error),
    Parent(Name),
}

impl Plan {
    /// Plans `requested` and every parent they need; the first problem is the error.
    pub fn new(project: &Project, requested: &[Name]) -> Result<Plan> {
        let (plan, mut failed) = Plan::each(project, requested);
        for name in requested {
            let cause = match failed.get(name) {
                None => continue,
                Some(Failure::Parent(cause)) => cause.clone(),
                Some(Failure::Own(_)) => name.clone(),
            };
            if let Some(Failure::Own(error)) = failed.remove(&cause) {
                return Err(error);
            }
        }
        Ok(plan)
    }

    /// Plans `requested` and their parents, each image once, whatever fails: the plan of every
    /// image that could be planned, and for each other image why not. An image whose parent
    /// fails is not planned and points at the image with the problem, so `check` reports that
    /// problem once however many images stand on it.
    pub fn each(project: &Project, requested: &[Name]) -> (Plan, BTreeMap<Name, Failure>) {
        let mut specs = BTreeMap::new();
        let mut order = Vec::new();
        let mut failed = BTreeMap::new();
        for name in requested {
            walk(project, name, &mut specs, &mut order, &mut failed);
        }
        for (name, error) in shared_references(project, &specs) {
            specs.remove(&name);
            order.retain(|n| *n != name);
            failed.insert(name, Failure::Own(error));
        }
        let mut hashes = FileHashes::load(&project.root, &project.state_dir());
        let mut images: BTreeMap<Name, PlannedImage> = BTreeMap::new();
        let mut planned_order = Vec::new();
        for name in order {
            let loaded = specs.remove(&name).expect("walked");
            // What the image stands on must be planned; else it points at the cause.
            let unplanned = dependencies(&loaded)
                .find(|d| !images.contains_key(*d))
                .cloned();
            if let Some(dependency) = unplanned {
                let cause = match failed.get(&dependency) {
                    Some(Failure::Parent(cause)) => cause.clone(),
                    _ => dependency,
                };
                failed.insert(name, Failure::Parent(cause));
                continue;
            }
            let parent_checksum = match loaded.spec.parent() {
                Parent::Image(parent) => Some((parent.clone(), images[parent].checksum.clone())),
                Parent::External(_) => None,
            };
            let toolchains = loaded
                .spec
                .compiles
                .iter()
                .filter_map(|stage| stage.toolchain_image.as_ref().map(|t| t.get_ref()))
                .map(|t| {
                    let planned = &images[t];
                    let spec = crate::plan::compile::ToolchainSpec {
                        reference: planned.loaded.reference(),
                        checksum: planned.checksum.clone(),
                    };
                    (t.clone(), spec)
                })
                .collect();
            match plan_one(project, loaded, parent_checksum, &toolchains, &mut hashes) {
                Ok(image) => {
                    images.insert(name.clone(), image);
                    planned_order.push(name);
                }
                Err(e) => {
                    failed.insert(name, Failure::Own(e));
                }
            }
        }
        hashes.save();
        let plan = Plan {
            images,
            order: planned_order,
            hashing: hashes.stats,
        };
        (plan, failed)
    }

    pub fn get(&self, name: &Name) -> &PlannedImage {
        &self.images[name]
    }
}

/// The specs `loaded` stands on: its parent and its compile stages' toolchain specs.
fn dependencies(loaded: &LoadedSpec) -> impl Iterator<Item = &Name> {
    let parent = match loaded.spec.parent() {
        Parent::Image(parent) => Some(parent),
        Parent::External(_) => None,
    };
    parent.into_iter().chain(
        loaded
            .spec
            .compiles
            .iter()
            .filter_map(|stage| stage.toolchain_image.as_ref().map(|t| t.get_ref())),
    )
}

/// Walks `start` and what it stands on (its parent, and the specs its compile stages run in),
/// depth first with a stack of its own (a chain of parents can be thousands deep), and adds
/// each spec to `order` after everything it stands on. A spec that does not load, names a
/// missing spec, or closes a cycle fails on its own; the images above it are left for planning
/// to mark.
/// The walked specs whose image (name and tag) another spec of the project names too, each
/// with its error: building one would move the other's tag, and neither could be verified
/// (an outside test built both, each build taking the tag from the other). Specs that do not
/// load are left to their own error.
fn shared_references(project: &Project, walked: &BTreeMap<Name, LoadedSpec>) -> Vec<(Name, Error)> {
    if walked.is_empty() {
        return Vec::new();
    }
    let mut by_reference: BTreeMap<String, Vec<(Name, std::path::PathBuf)>> = BTreeMap::new();
    for name in project.image_names().unwrap_or_default() {
        let found = match walked.get(&name) {
            Some(loaded) => Some((loaded.reference(), loaded.path.clone())),
            None => project
                .load_spec(&name)
                .ok()
                .map(|loaded| (loaded.reference(), loaded.path)),
        };
        if let Some((reference, path)) = found {
            by_reference
                .entry(reference)
                .or_default()
                .push((name, path));
        }
    }
    let mut errors = Vec::new();
    for (reference, specs) in by_reference.into_iter().filter(|(_, s)| s.len() > 1) {
        for (name, path) in specs.iter().filter(|(n, _)| walked.contains_key(n)) {
            let others: Vec<String> = specs
                .iter()
                .filter(|(other, _)| other != name)
                .map(|(_, p)| p.display().to_string())
                .collect();
            let error = Error::from(Invalid {
                path: path.clone(),
                location: None,
                key: Some("image.name".into()),
                message: format!(
                    "the image is `{reference}`, as is {}: building one would move the other's tag",
                    others.join(" and ")
                ),
                hint: Some("give each image a name or a tag of its own ([image] name, tag)".into()),
            });
            errors.push((name.clone(), error));
        }
    }
    errors
}

fn walk(
    project: &Project,
    start: &Name,
    specs: &mut BTreeMap<Name, LoadedSpec>,
    order: &mut Vec<Name>,
    failed: &mut BTreeMap<Name, Failure>,
) {
    // The specs being walked, each with what it stands on that is still to walk.
    let mut path: Vec<(Name, Vec<Name>)> = Vec::new();
    let mut next = Some(start.clone());
    loop {
        if let Some(name) = next.take() {
            if let Some(first) = path.iter().position(|(n, _)| *n == name) {
                let mut names: Vec<String> =
                    path[first..].iter().map(|(n, _)| n.to_string()).collect();
                names.push(name.to_string());
                let cycle = Error::Cycle {
                    chain: names,
                    path: project.images_dir().join(name.as_str()).join("image.toml"),
                };
                // The image closing the cycle carries it; the rest of the cycle stands on it.
                specs.remove(&name);
                path.remove(first);
                failed.insert(name, Failure::Own(cycle));
            } else if !specs.contains_key(&name) && !failed.contains_key(&name) {
                match load_with_dependencies(project, &name) {
                    Ok((loaded, mut below)) => {
                        // Popped from the end: the parent is walked first.
                        below.reverse();
                        specs.insert(name.clone(), loaded);
                        path.push((name, below));
                    }
                    Err(e) => {
                        failed.insert(name, Failure::Own(e));
                    }
                }
            }
        }
        let Some((_, below)) = path.last_mut() else {
            break;
        };
        match below.pop() {
            Some(dependency) => next = Some(dependency),
            None => order.push(path.pop().expect("a spec on the path").0),
        }
    }
}

/// Loads spec `name` and names the specs it stands on (its parent first, then its compile
/// stages' toolchain specs), each checked to exist.
fn load_with_dependencies(project: &Project, name: &Name) -> Result<(LoadedSpec, Vec<Name>)> {
    let loaded = project.load_spec(name)?;
    let exists = |other: &Name| {
        project
            .images_dir()
            .join(other.as_str())
            .join("image.toml")
            .is_file()
    };
    let missing =
        |other: &Name| format!("no image `{other}` in {}", project.images_dir().display());
    let mut below = Vec::new();
    if let Parent::Image(parent) = loaded.spec.parent() {
        if !exists(parent) {
            return loaded.invalid(loaded.spec.from.span(), "from.image", missing(parent));
        }
        below.push(parent.clone());
    }
    for stage in &loaded.spec.compiles {
        if let Some(toolchain) = &stage.toolchain_image {
            if !exists(toolchain.get_ref()) {
                return loaded.invalid(
                    toolchain.span(),
                    "compile.toolchain-image",
                    missing(toolchain.get_ref()),
                );
            }
            below.push(toolchain.get_ref().clone());
        }
    }
    Ok((loaded, below))
}

fn plan_one(
    project: &Project,
    loaded: LoadedSpec,
    parent: Option<(Name, InputChecksum)>,
    toolchains: &BTreeMap<Name, crate::plan::compile::ToolchainSpec>,
    hashes: &mut FileHashes,
) -> Result<PlannedImage> {
    let all_pins = pins::read(&project.root, &loaded.name)?;
    let pins = pins::check(&loaded, &project.root, &all_pins)?;
    let patches = patch_sets(project, &loaded)?;
    let files = collect_files(&loaded, hashes)?;
    let template = template_for(&loaded)?;

    let mut canonical = loaded.spec.clone();
    canonical.image.name = Some(
        loaded
            .spec
            .image
            .name
            .clone()
            .unwrap_or_else(|| loaded.name.clone()),
    );
    let parent_line = match (&parent, &pins.base) {
        (Some((name, checksum)), _) => format!("parent {name} {checksum}"),
        (None, Some(base)) => format!("base {} {}", base.reference, base.digest),
        (None, None) => unreachable!("pins::check requires a base pin for an external parent"),
    };
    pins::apt_against_is(
        &all_pins,
        &pins::path_for(&project.root, &loaded.name),
        &loaded.name,
        None,
        &parent_line,
    )?;
    let compiles = crate::plan::compile::plan(
        &loaded,
        &pins,
        &all_pins,
        &patches,
        &parent_line,
        toolchains,
        &pins::path_for(&project.root, &loaded.name),
    )?;
    let stages: Vec<(&Name, &InputChecksum)> =
        compiles.iter().map(|s| (&s.name, &s.checksum)).collect();
    let document = checksum::image_document(&checksum::ImageInputs {
        spec: &by_meaning(&canonical),
        template: &template.text,
        parent_line: &parent_line,
        sources: &pins.sources,
        patches: &patches,
        wheels: &pins.wheels,
        apt: &pins.apt_for(None),
        files: &files,
        compiles: &stages,
    });
    Ok(PlannedImage {
        compiles,
        checksum: InputChecksum::of(&document),
        document,
        parent: parent.map(|(name, _)| name),
        loaded,
        pins,
        patches,
        files,
        template,
    })
}

/// Each source's patch sets, read from the project's `patches/`; a set without a series
/// file is refused at its line.
fn patch_sets(project: &Project, loaded: &LoadedSpec) -> Result<Vec<SourcePatches>> {
    let mut patches = Vec::new();
    for source in &loaded.spec.sources {
        let mut sets = Vec::new();
        for set in &source.patches {
            let set_dir = project.patches_dir().join(set.get_ref().as_str());
            if !set_dir.join("series").is_file() {
                return loaded.invalid(
                    set.span(),
                    "source.patches",
                    format!(
                        "patch set `{}` has no series file ({} is missing)",
                        set.get_ref(),
                        set_dir.join("series").display()
                    ),
                );
            }
            sets.push(patches::read_set(&project.patches_dir(), set.get_ref())?);
        }
        patches.push(SourcePatches {
            source: source.name.get_ref().clone(),
            sets,
        });
    }
    Ok(patches)
}

/// `[[file]]` entries, folders expanded to their files in sorted order.
fn collect_files(loaded: &LoadedSpec, hashes: &mut FileHashes) -> Result<Vec<ContextFile>> {
    let mut files = Vec::new();
    for copy in &loaded.spec.files {
        let (src, is_dir) = resolved_src(loaded, copy)?;
        let dest = copy.dest.get_ref().as_str().trim_end_matches('/');
        let walk = walkdir::WalkDir::new(&src)
            .sort_by_file_name()
            .follow_links(false)
            .follow_root_links(false);
        for entry in walk {
            let entry = entry.map_err(|e| Error::io(&src, e.into()))?;
            if entry.file_type().is_dir() {
                continue;
            }
            let relative = checked_name(loaded, copy, &src, &entry)?;
            let sha256 = hashes
                .sha256(entry.path())
                .map_err(|e| Error::io(entry.path(), e))?;
            let mode = entry
                .metadata()
                .map_err(|e| Error::io(entry.path(), e.into()))?
                .permissions()
                .mode();
            files.push(ContextFile {
                src: entry.path().to_path_buf(),
                dest: if is_dir {
                    format!("{dest}/{relative}")
                } else {
                    dest.to_string()
                },
                executable: mode & 0o111 != 0,
                sha256,
            });
        }
    }
    files.sort_by(|a, b| a.dest.cmp(&b.dest));
    check_dests(loaded, &files)?;
    Ok(files)
}

/// The spec as the checksum counts it (v2): by meaning, not spelling. A source's `rev` is
/// left out (its locked commit, on the `source` line, is what is built: a tag and the same
/// commit in hex are one input); a destination's trailing `/` is dropped (`/opt/app/` and
/// `/opt/app` are one place); `[[file]]` tables are left out (each copied file is counted by
/// its destination, mode and content on a `file` line: a source renamed with the same bytes
/// and destination is the same input).
fn by_meaning(spec: &crate::inputs::spec::ImageSpec) -> serde_json::Value {
    let mut value = serde_json::to_value(spec).expect("spec serializes");
    if let Some(object) = value.as_object_mut() {
        object.remove("file");
        for source in object
            .get_mut("source")
            .and_then(serde_json::Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_object_mut)
        {
            source.remove("rev");
            if let Some(serde_json::Value::String(dest)) = source.get_mut("dest") {
                *dest = crate::inputs::values::without_trailing_slash(dest).to_string();
            }
        }
    }
    value
}

/// A `[[file]]`'s `src` in the spec folder, and whether it is a folder. `src` has no `..`
/// (checked when parsed), but a symlink on the way could still lead out of the spec folder:
/// it is resolved and compared.
fn resolved_src(
    loaded: &LoadedSpec,
    copy: &crate::inputs::spec::FileCopy,
) -> Result<(PathBuf, bool)> {
    let src = loaded.dir.join(copy.src.get_ref().as_str());
    let refuse = |message: String| loaded.invalid(copy.src.span(), "file.src", message);
    let metadata = match fs_err::symlink_metadata(&src) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return refuse(format!("{} does not exist", src.display()));
        }
        // A symlink loop or a file on the way: the spec names a path that cannot be.
        Err(e) => {
            let words = crate::error::os_words(&e);
            return refuse(format!("{} cannot be resolved: {words}", src.display()));
        }
    };
    let real = match fs_err::canonicalize(&src) {
        Ok(real) => real,
        Err(e) => {
            return refuse(format!(
                "{} leads nowhere through a symlink: {}",
                src.display(),
                crate::error::os_words(&e)
            ));
        }
    };
    let home = fs_err::canonicalize(&loaded.dir).map_err(|e| Error::io(&loaded.dir, e))?;
    if metadata.is_symlink() || !real.starts_with(&home) {
        return refuse(format!(
            "{} leads to {} through a symlink; copy regular files from the spec folder only",
            src.display(),
            real.display()
        ));
    }
    Ok((src, metadata.is_dir()))
}

/// A walked file's name below `src`: a regular file, named in UTF-8 without control
/// characters.
fn checked_name<'e>(
    loaded: &LoadedSpec,
    copy: &crate::inputs::spec::FileCopy,
    src: &Path,
    entry: &'e walkdir::DirEntry,
) -> Result<&'e str> {
    if !entry.file_type().is_file() {
        return loaded.invalid(
            copy.src.span(),
            "file.src",
            format!(
                "{} is a symlink or special file; copy regular files only",
                entry.path().display()
            ),
        );
    }
    let relative = entry
        .path()
        .strip_prefix(src)
        .expect("walk stays below its root");
    let relative = relative.to_str().ok_or_else(|| {
        Error::from(Invalid {
            path: entry.path().to_path_buf(),
            location: None,
            key: Some("file.src".into()),
            message: "file names must be UTF-8".into(),
            hint: None,
        })
    })?;
    // Any name reaches the image as it is (the files travel as a tar, never through a
    // Dockerfile line); a control character would break the checksum document's lines.
    if relative.chars().any(char::is_control) {
        return loaded.invalid(
            copy.src.span(),
            "file.src",
            format!(
                "{:?} has a control character in its name",
                entry.path().display()
            ),
        );
    }
    Ok(relative)
}

/// Refuses two files at one path, and a file below another file (no build can make both).
/// The error points at the `[[file]]` entry the later file comes from.
fn check_dests(loaded: &LoadedSpec, files: &[ContextFile]) -> Result<()> {
    let dests: std::collections::BTreeSet<&str> = files.iter().map(|f| f.dest.as_str()).collect();
    let conflict = files.windows(2).find(|w| w[0].dest == w[1].dest).map(|w| {
        (
            w[1].dest.as_str(),
            format!("two files land at `{}`", w[1].dest),
        )
    });
    // An image layer reads a name starting with `.wh.` as the deletion of its rest.
    let conflict = conflict.or_else(|| {
        files.iter().find_map(|f| {
            f.dest
                .split('/')
                .find(|name| name.starts_with(".wh."))
                .map(|name| {
                    (
                        f.dest.as_str(),
                        format!(
                            "`{}`: a name starting with `.wh.` cannot be in an image (`{name}` would delete `{}`)",
                            f.dest,
                            &name[4..]
                        ),
                    )
                })
        })
    });
    let conflict = conflict.or_else(|| {
        files.iter().find_map(|f| {
            let mut above = f.dest.as_str();
            while let Some((parent, _)) = above.rsplit_once('/') {
                above = parent;
                if dests.contains(parent) {
                    return Some((
                        f.dest.as_str(),
                        format!("`{}` would lie inside `{parent}`, which is a file", f.dest),
                    ));
                }
            }
            None
        })
    });
    let Some((dest, message)) = conflict else {
        return Ok(());
    };
    // The entry that copies `dest`: the one whose dest is it or the folder above it.
    let entry = loaded
        .spec
        .files
        .iter()
        .map(|f| f.dest.get_ref().as_str())
        .filter(|d| dest == *d || dest.starts_with(&format!("{d}/")))
        .max_by_key(|d| d.len());
    Err(Error::from(Invalid {
        path: loaded.path.clone(),
        location: entry
            .and_then(|d| crate::inputs::spec::locate(&loaded.text, &["file", d, "dest"])),
        key: Some("file.dest".into()),
        message,
        hint: None,
    }))
}

fn template_for(loaded: &LoadedSpec) -> Result<Template> {
    let path = loaded.dir.join("Dockerfile.hbs");
    match fs_err::read(&path) {
        Ok(bytes) => Ok(Template {
            text: crate::inputs::spec::text_of(&path, bytes)?,
            origin: path.display().to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Template {
            origin: "embedded".into(),
            text: DEFAULT_TEMPLATE.to_string(),
        }),
        Err(e) => Err(Error::io(&path, e)),
    }
}
