//! The files a pin's move writes: one value of the spec rewritten in place, the spec and pins
//! file as they were before bump (put back on failure), and the scratch copy of the project
//! where candidates are locked.

use crate::error::{Error, Result};
use crate::inputs::pins::wheel_stem;
use crate::inputs::project::Project;
use std::path::{Path, PathBuf};

/// Which value of the spec a candidate rewrites.
pub(super) enum Key<'a> {
    FromRef,
    /// The `version` of the `[[wheel]]` of this name (PEP 427 normalised).
    WheelVersion(&'a str),
}

/// Rewrites one string value of the spec at `path`, the rest of the file byte for byte (the
/// value is found by its span, as the source bump rewrites a `rev`).
pub(super) fn rewrite(path: &Path, key: &Key<'_>, value: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Values {
        from: Option<FromRef>,
        #[serde(default)]
        wheel: Vec<WheelVersion>,
    }
    #[derive(serde::Deserialize)]
    struct FromRef {
        #[serde(rename = "ref")]
        reference: Option<toml::Spanned<String>>,
    }
    #[derive(serde::Deserialize)]
    struct WheelVersion {
        name: String,
        version: toml::Spanned<String>,
    }
    let text = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let values: Values = crate::inputs::spec::parse_toml(path, &text)?;
    let span = match key {
        Key::FromRef => values
            .from
            .and_then(|f| f.reference)
            .map(|r| r.span())
            .ok_or_else(|| Error::usage(format!("{}: no `from.ref` to rewrite", path.display())))?,
        Key::WheelVersion(wheel) => values
            .wheel
            .iter()
            .find(|w| wheel_stem(&w.name) == wheel_stem(wheel))
            .map(|w| w.version.span())
            .ok_or_else(|| {
                Error::usage(format!(
                    "{}: no `[[wheel]]` named `{wheel}` to rewrite",
                    path.display()
                ))
            })?,
    };
    let literal = toml::Value::String(value.to_string()).to_string();
    let new = format!("{}{literal}{}", &text[..span.start], &text[span.end..]);
    fs_err::write(path, new).map_err(|e| Error::io(path, e))
}

pub(super) fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if fs_err::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    fs_err::write(path, text).map_err(|e| Error::io(path, e))
}

/// The spec and pins file as they were before bump, by content (`None`: no file), put back
/// on failure. Only these two files move here (the source bump also rewrites patch sets).
pub struct Originals {
    pub(super) files: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl Originals {
    pub(super) fn of(paths: &[PathBuf]) -> Result<Originals> {
        let mut files = Vec::new();
        for path in paths {
            let bytes = match fs_err::read(path) {
                Ok(bytes) => Some(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io(path, e)),
            };
            files.push((path.clone(), bytes));
        }
        Ok(Originals { files })
    }

    /// Every file as it was: each tried whatever happened to the one before; the first
    /// failure is the answer. A file already right is not touched.
    pub fn put_back(&self) -> Result<()> {
        let mut first_failure = None;
        for (path, bytes) in &self.files {
            let attempt = match bytes {
                Some(bytes) if fs_err::read(path).ok().as_ref() == Some(bytes) => Ok(()),
                Some(bytes) => fs_err::write(path, bytes).map_err(|e| Error::io(path, e)),
                None if path.exists() => fs_err::remove_file(path).map_err(|e| Error::io(path, e)),
                None => Ok(()),
            };
            if let Err(e) = attempt {
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// The originals written at `paths` instead (the scratch project's spec and pins, in the
    /// order given to [`Originals::of`]).
    pub(super) fn restore_into(&self, paths: &[&Path]) -> Result<()> {
        for ((_, bytes), path) in self.files.iter().zip(paths) {
            match bytes {
                Some(bytes) => fs_err::write(path, bytes).map_err(|e| Error::io(path, e))?,
                None if path.exists() => {
                    fs_err::remove_file(path).map_err(|e| Error::io(path, e))?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// A copy of the project's inputs (hallmark.toml, images/, pins/, patches/) where candidates
/// are locked: `lock` writes the pins file it resolves, and nothing of the project may move
/// before bump has a whole answer (or at all, with `--dry-run`).
pub(super) struct Scratch {
    pub(super) project: Project,
    pub(super) _dir: tempfile::TempDir,
}

impl Scratch {
    pub(super) fn of(project: &Project) -> Result<Scratch> {
        let dir = tempfile::Builder::new()
            .prefix("hallmark-bump")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let root = dir.path().to_path_buf();
        let file = crate::inputs::project::PROJECT_FILE;
        fs_err::copy(project.root.join(file), root.join(file))
            .map_err(|e| Error::io(root.join(file), e))?;
        for folder in ["images", "pins", "patches"] {
            let from = project.root.join(folder);
            if from.is_dir() {
                copy_tree(&from, &root.join(folder))?;
            }
        }
        fs_err::create_dir_all(root.join("pins")).map_err(|e| Error::io(root.join("pins"), e))?;
        Ok(Scratch {
            project: Project { root },
            _dir: dir,
        })
    }
}

/// Folders and regular files below `from` (symlinks as what they point at), modes kept: a
/// spec's files are part of its checksum, exec bit included.
pub(super) fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in walkdir::WalkDir::new(from).follow_links(true) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else if entry.file_type().is_file() {
            fs_err::copy(entry.path(), &target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(())
}
