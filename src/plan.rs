//! The plan: which specs take part (the requested ones and their parents), in build order,
//! each with its checked pins, its patch sets, its files, its template and its checksum.
//! Everything here is offline: no engine, no network.

use crate::checksum::{Document, InputChecksum, sha256_hex};
use crate::error::{Error, Result};
use crate::patches::{self, PatchSet};
use crate::pins::{self, CheckedPins};
use crate::project::Project;
use crate::spec::{LoadedSpec, Parent};
use crate::values::Name;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

pub const DEFAULT_TEMPLATE: &str = include_str!("../templates/Dockerfile.hbs");

#[derive(Debug, Clone)]
pub struct Template {
    /// `embedded` or the path of the spec's `Dockerfile.hbs`.
    pub origin: String,
    pub text: String,
}

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

#[derive(Debug, Clone)]
pub struct SourcePatches {
    pub source: Name,
    pub sets: Vec<PatchSet>,
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
}

impl Plan {
    /// Plans `requested` and every parent they need.
    pub fn new(project: &Project, requested: &[Name]) -> Result<Plan> {
        let mut specs = BTreeMap::new();
        let mut order = Vec::new();
        for name in requested {
            visit(project, name, &mut Vec::new(), &mut specs, &mut order)?;
        }
        let mut images: BTreeMap<Name, PlannedImage> = BTreeMap::new();
        for name in &order {
            let loaded = specs.remove(name).expect("visited");
            let parent_checksum = match loaded.spec.parent() {
                Parent::Image(parent) => Some((parent.clone(), images[parent].checksum.clone())),
                Parent::External(_) => None,
            };
            let planned = plan_one(project, loaded, parent_checksum)?;
            images.insert(name.clone(), planned);
        }
        Ok(Plan { images, order })
    }

    pub fn get(&self, name: &Name) -> &PlannedImage {
        &self.images[name]
    }
}

/// Depth-first walk to the parents; `stack` holds the chain being walked, to name a cycle.
fn visit(
    project: &Project,
    name: &Name,
    stack: &mut Vec<Name>,
    specs: &mut BTreeMap<Name, LoadedSpec>,
    order: &mut Vec<Name>,
) -> Result<()> {
    if order.contains(name) {
        return Ok(());
    }
    if let Some(start) = stack.iter().position(|n| n == name) {
        let mut chain: Vec<String> = stack[start..].iter().map(Name::to_string).collect();
        chain.push(name.to_string());
        return Err(Error::Cycle {
            chain,
            path: project.images_dir().join(name.as_str()).join("image.toml"),
        });
    }
    let loaded = project.load_spec(name)?;
    if let Parent::Image(parent) = loaded.spec.parent() {
        let parent = parent.clone();
        if !project
            .images_dir()
            .join(parent.as_str())
            .join("image.toml")
            .is_file()
        {
            return loaded.invalid(
                loaded.spec.from.span(),
                "from.image",
                format!("no image `{parent}` in {}", project.images_dir().display()),
            );
        }
        stack.push(name.clone());
        visit(project, &parent, stack, specs, order)?;
        stack.pop();
    }
    specs.insert(name.clone(), loaded);
    order.push(name.clone());
    Ok(())
}

fn plan_one(
    project: &Project,
    loaded: LoadedSpec,
    parent: Option<(Name, InputChecksum)>,
) -> Result<PlannedImage> {
    let all_pins = pins::read(&project.root, &loaded.name)?;
    let pins = pins::check(&loaded, &project.root, &all_pins)?;
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
    let files = collect_files(&loaded)?;
    let template = template_for(&loaded)?;

    let mut doc = Document::new();
    let mut canonical = loaded.spec.clone();
    canonical.image.name = Some(
        loaded
            .spec
            .image
            .name
            .clone()
            .unwrap_or_else(|| loaded.name.clone()),
    );
    doc.spec(&canonical);
    doc.line(format!("template {}", sha256_hex(template.text.as_bytes())));
    match (&parent, &pins.base) {
        (Some((name, checksum)), _) => doc.line(format!("parent {name} {checksum}")),
        (None, Some(base)) => doc.line(format!("base {} {}", base.reference, base.digest)),
        (None, None) => unreachable!("pins::check requires a base pin for an external parent"),
    }
    for (pin, source_patches) in pins.sources.iter().zip(&patches) {
        doc.line(format!("source {} {}", pin.name, pin.commit));
        for set in &source_patches.sets {
            for patch in &set.patches {
                doc.line(format!(
                    "patch {} {} {} -p{} {}",
                    pin.name, set.name, patch.file, patch.strip, patch.sha256
                ));
            }
        }
    }
    for wheel in &pins.wheels {
        doc.line(format!(
            "wheel {} {} {}",
            wheel.name, wheel.file, wheel.sha256
        ));
    }
    for file in &files {
        doc.line(format!(
            "file {} {:04o} {}",
            file.dest,
            file.mode(),
            file.sha256
        ));
    }
    let document = doc.text();
    Ok(PlannedImage {
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

/// `[[file]]` entries, folders expanded to their files in sorted order.
fn collect_files(loaded: &LoadedSpec) -> Result<Vec<ContextFile>> {
    let mut files = Vec::new();
    for copy in &loaded.spec.files {
        let src = loaded.dir.join(copy.src.get_ref().as_str());
        let dest = copy
            .dest
            .get_ref()
            .as_str()
            .trim_end_matches('/')
            .to_string();
        let metadata = match std::fs::symlink_metadata(&src) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return loaded.invalid(
                    copy.src.span(),
                    "file.src",
                    format!("{} does not exist", src.display()),
                );
            }
            // A symlink loop or a file on the way: the spec names a path that cannot be.
            Err(e) => {
                return loaded.invalid(
                    copy.src.span(),
                    "file.src",
                    format!("{} cannot be resolved: {e}", src.display()),
                );
            }
        };
        // `src` has no `..` (checked when parsed), but a symlink on the way could still lead
        // out of the spec folder: resolve it and compare.
        let real = match std::fs::canonicalize(&src) {
            Ok(real) => real,
            Err(e) => {
                return loaded.invalid(
                    copy.src.span(),
                    "file.src",
                    format!("{} leads nowhere through a symlink: {e}", src.display()),
                );
            }
        };
        let home = fs_err::canonicalize(&loaded.dir).map_err(|e| Error::io(&loaded.dir, e))?;
        if metadata.is_symlink() || !real.starts_with(&home) {
            return loaded.invalid(
                copy.src.span(),
                "file.src",
                format!(
                    "{} leads to {} through a symlink; copy regular files from the spec folder only",
                    src.display(),
                    real.display()
                ),
            );
        }
        let walk = walkdir::WalkDir::new(&src)
            .sort_by_file_name()
            .follow_links(false)
            .follow_root_links(false);
        for entry in walk {
            let entry = entry.map_err(|e| Error::io(&src, e.into()))?;
            let kind = entry.file_type();
            if kind.is_dir() {
                continue;
            }
            if !kind.is_file() {
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
                .strip_prefix(&src)
                .expect("walk stays below its root");
            let relative = relative.to_str().ok_or_else(|| Error::Invalid {
                path: entry.path().to_path_buf(),
                location: None,
                key: Some("file.src".into()),
                message: "file names must be UTF-8".into(),
                hint: None,
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
            let bytes = fs_err::read(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
            let mode = entry
                .metadata()
                .map_err(|e| Error::io(entry.path(), e.into()))?
                .permissions()
                .mode();
            files.push(ContextFile {
                src: entry.path().to_path_buf(),
                dest: if metadata.is_dir() {
                    format!("{dest}/{relative}")
                } else {
                    dest.clone()
                },
                executable: mode & 0o111 != 0,
                sha256: sha256_hex(&bytes),
            });
        }
    }
    files.sort_by(|a, b| a.dest.cmp(&b.dest));
    check_dests(loaded, &files)?;
    Ok(files)
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
    Err(Error::Invalid {
        path: loaded.path.clone(),
        location: entry.and_then(|d| crate::spec::locate(&loaded.text, &["file", d, "dest"])),
        key: Some("file.dest".into()),
        message,
        hint: None,
    })
}

fn template_for(loaded: &LoadedSpec) -> Result<Template> {
    let path = loaded.dir.join("Dockerfile.hbs");
    match fs_err::read(&path) {
        Ok(bytes) => Ok(Template {
            text: crate::spec::text_of(&path, bytes)?,
            origin: path.display().to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Template {
            origin: "embedded".into(),
            text: DEFAULT_TEMPLATE.to_string(),
        }),
        Err(e) => Err(Error::io(&path, e)),
    }
}
