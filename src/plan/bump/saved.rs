//! Bump's writes, all or nothing: copies of the files it may change, put back on any failure
//! or signal, and the one value of a spec it rewrites (a source's `rev`).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Rewrites `rev = "..."` of the `[[source]]` named `source` in the spec at `path`, the rest
/// of the file byte for byte (toml_edit would do it too; the one value is found by its span).
pub fn rewrite_rev(path: &Path, source: &str, rev: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Revs {
        #[serde(default)]
        source: Vec<SourceRev>,
    }
    #[derive(serde::Deserialize)]
    struct SourceRev {
        name: String,
        rev: toml::Spanned<String>,
    }
    let text = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let revs: Revs = crate::inputs::spec::parse_toml(path, &text)?;
    let span = revs
        .source
        .iter()
        .find(|s| s.name == source)
        .map(|s| s.rev.span())
        .ok_or_else(|| {
            Error::usage(format!(
                "{}: no `[[source]]` named `{source}` with a `rev` to rewrite (a variant's source is written in the spec it varies)",
                path.display()
            ))
        })?;
    let literal = toml::Value::String(rev.to_string()).to_string();
    let new = format!("{}{literal}{}", &text[..span.start], &text[span.end..]);
    fs_err::write(path, new).map_err(|e| Error::io(path, e))
}

/// Copies of files and folders, put back on failure.
pub struct Saved {
    copies: Vec<(PathBuf, Option<tempfile::TempDir>)>,
}

impl Saved {
    pub fn of(paths: &[PathBuf]) -> Result<Saved> {
        let mut copies = Vec::new();
        for path in paths {
            if !path.exists() {
                copies.push((path.clone(), None));
                continue;
            }
            let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
            copy(path, &dir.path().join("copy"))?;
            copies.push((path.clone(), Some(dir)));
        }
        Ok(Saved { copies })
    }

    /// Puts every saved file back as it was: each is tried whatever happened to the one
    /// before (a file that cannot be written does not leave the others changed), and the
    /// first failure is the answer.
    pub fn put_back(&self) -> Result<()> {
        let mut first_failure = None;
        for (path, copy_dir) in &self.copies {
            let attempt = || -> Result<()> {
                match copy_dir {
                    Some(dir) => sync(&dir.path().join("copy"), path),
                    None if path.is_dir() => {
                        fs_err::remove_dir_all(path).map_err(|e| Error::io(path, e))
                    }
                    None if path.exists() => {
                        fs_err::remove_file(path).map_err(|e| Error::io(path, e))
                    }
                    None => Ok(()),
                }
            };
            if let Err(e) = attempt() {
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }
}

/// Makes `to` hold what `from` holds: files written over in place (a file whose content is
/// already right is not touched), files `from` lacks removed.
pub fn sync(from: &Path, to: &Path) -> Result<()> {
    if from.is_file() {
        let want = fs_err::read(from).map_err(|e| Error::io(from, e))?;
        if fs_err::read(to).ok().as_deref() != Some(&want[..]) {
            fs_err::write(to, &want).map_err(|e| Error::io(to, e))?;
        }
        return Ok(());
    }
    if to.is_dir() {
        for entry in walkdir::WalkDir::new(to).contents_first(true) {
            let entry = entry.map_err(|e| Error::io(to, e.into()))?;
            let relative = entry.path().strip_prefix(to).expect("under to");
            if !from.join(relative).exists() {
                match entry.file_type().is_dir() {
                    true => fs_err::remove_dir(entry.path()),
                    false => fs_err::remove_file(entry.path()),
                }
                .map_err(|e| Error::io(entry.path(), e))?;
            }
        }
    }
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else {
            sync(entry.path(), &target)?;
        }
    }
    Ok(())
}

pub fn copy(from: &Path, to: &Path) -> Result<()> {
    if from.is_file() {
        fs_err::copy(from, to).map_err(|e| Error::io(to, e))?;
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else {
            fs_err::copy(entry.path(), &target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(())
}
