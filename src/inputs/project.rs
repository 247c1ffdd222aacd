//! Where things live: the project root (the folder holding `hallmark.toml`, found by walking
//! up as Cargo finds `Cargo.toml`), its images, and the caches outside it.

use crate::error::{Error, Invalid, Result};
use crate::inputs::spec::{self, LoadedSpec};
use crate::inputs::values::Name;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
}

/// The file that marks a project's root; it is also the default cluster file, so an empty
/// one is a project whose builder and only node is the local engine.
pub const PROJECT_FILE: &str = "hallmark.toml";

impl Project {
    /// The nearest folder at or above `start` that holds `hallmark.toml`. A folder that only
    /// holds an `images/` folder (documentation, a vendored copy) is not a project: taking it
    /// for one made `check` pass on whatever it held.
    pub fn discover(start: &Path) -> Result<Project> {
        let start = start.canonicalize().map_err(|e| Error::io(start, e))?;
        match start
            .ancestors()
            .find(|dir| dir.join(PROJECT_FILE).is_file())
        {
            Some(root) => Ok(Project {
                root: root.to_path_buf(),
            }),
            None => Err(Error::NoProject {
                images_at: start
                    .ancestors()
                    .find(|dir| dir.join("images").is_dir())
                    .map(Path::to_path_buf),
                start,
                walked: true,
            }),
        }
    }

    /// The project `-C DIR` names: `dir` itself, which must hold `hallmark.toml`.
    pub fn at(dir: &Path) -> Result<Project> {
        let root = dir.canonicalize().map_err(|e| Error::Usage {
            message: format!("-C {}: {e}", dir.display()),
            hint: None,
        })?;
        if !root.join(PROJECT_FILE).is_file() {
            return Err(Error::NoProject {
                images_at: root.join("images").is_dir().then(|| root.clone()),
                start: root,
                walked: false,
            });
        }
        Ok(Project { root })
    }

    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    pub fn patches_dir(&self) -> PathBuf {
        self.root.join("patches")
    }

    /// Build logs and records: inside the project, git-ignored.
    pub fn state_dir(&self) -> PathBuf {
        self.root.join(".hallmark")
    }

    /// Every folder of `images/` that holds an `image.toml`, sorted; none (or no `images/`
    /// at all) is an empty list.
    pub fn image_names(&self) -> Result<Vec<Name>> {
        let dir = self.images_dir();
        let mut names = Vec::new();
        let entries = match fs_err::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            if !entry.path().join("image.toml").is_file() {
                continue;
            }
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let name = Name::try_from(file_name).map_err(|message| {
                Error::from(Invalid {
                    path: entry.path(),
                    location: None,
                    key: None,
                    message: message.to_string(),
                    hint: Some("the folder name is the image's name".into()),
                })
            })?;
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    /// Every image, for a command that was asked for all of them: none is an error, so a
    /// check that covers nothing never passes.
    pub fn all_images(&self) -> Result<Vec<Name>> {
        let names = self.image_names()?;
        if names.is_empty() {
            return Err(Error::NoImages {
                images_dir: self.images_dir(),
            });
        }
        Ok(names)
    }

    pub fn image_name(&self, raw: &str) -> Result<Name> {
        let unknown = || -> Result<Name> {
            Err(Error::UnknownImage {
                name: raw.to_string(),
                images_dir: self.images_dir(),
                known: self
                    .image_names()
                    .unwrap_or_default()
                    .iter()
                    .map(Name::to_string)
                    .collect(),
            })
        };
        match Name::try_from(raw.to_string()) {
            Ok(name)
                if self
                    .images_dir()
                    .join(name.as_str())
                    .join("image.toml")
                    .is_file() =>
            {
                Ok(name)
            }
            Ok(_) => unknown(),
            // Not a name an image can have: said as such, not "no image" (which sent a
            // reader looking for a folder that cannot exist).
            Err(why) => Err(Error::Usage {
                message: format!("invalid image name: {why}"),
                hint: Some("an image's name is its folder's under images/".into()),
            }),
        }
    }

    pub fn load_spec(&self, name: &Name) -> Result<LoadedSpec> {
        let dir = self.images_dir().join(name.as_str());
        stays_inside(&self.root, &dir)?;
        stays_inside(&self.root, &dir.join("image.toml"))?;
        spec::load(name, &dir)
    }
}

/// `path`, every symlink on the way followed, must stay inside the project `root`: a spec
/// folder, a patch set or a patch file that is a link to elsewhere brought files from outside
/// the project into an image (an outside test; docs/security.md promised otherwise). A
/// path that does not exist is left to whoever reads it to report.
pub fn stays_inside(root: &Path, path: &Path) -> Result<()> {
    let (Ok(root), Ok(real)) = (root.canonicalize(), path.canonicalize()) else {
        return Ok(());
    };
    if real.starts_with(&root) {
        return Ok(());
    }
    Err(Error::from(Invalid {
        path: path.to_path_buf(),
        location: None,
        key: None,
        message: format!(
            "leads to {} through a symlink, outside the project {}",
            real.display(),
            root.display()
        ),
        hint: Some(
            "keep specs and patches inside the project (copy them in, or link the other way)"
                .into(),
        ),
    }))
}

/// The user's cache (`$HALLMARK_CACHE`, else `$XDG_CACHE_HOME/hallmark`, else
/// `~/.cache/hallmark`): git sources by commit, wheels by sha256.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HALLMARK_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("hallmark");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("hallmark")
}
