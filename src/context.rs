//! The build context as a deterministic tar stream: a fixed entry order, one mtime (the
//! spec's source date), uid/gid 0, no user names, modes normalised to 0644/0755, no xattrs.
//! The same inputs give the same bytes on any machine, at any path, under any umask.
//!
//! It is written to any `Write`: a pipe into the engine for a build, or an unpacker for
//! `render --out`. Nothing is buffered whole.

use crate::error::{Error, Result};
use crate::fetch::{self, Fetched};
use crate::plan::PlannedImage;
use crate::render;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use tar::{EntryType, Header};

struct ContextTar<W: Write> {
    builder: tar::Builder<W>,
    mtime: u64,
    dirs: BTreeSet<String>,
}

impl<W: Write> ContextTar<W> {
    fn header(&self, kind: EntryType, mode: u32, size: u64) -> Header {
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_mtime(self.mtime);
        header.set_uid(0);
        header.set_gid(0);
        header
    }

    /// Writes the folders above `path` that are not written yet, so every entry has its
    /// parents with a known mode.
    fn parents(&mut self, path: &str) -> std::io::Result<()> {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        for part in &parts[..parts.len() - 1] {
            prefix.push_str(part);
            prefix.push('/');
            self.dir(&prefix.clone())?;
        }
        Ok(())
    }

    fn dir(&mut self, path: &str) -> std::io::Result<()> {
        let path = format!("{}/", path.trim_end_matches('/'));
        if self.dirs.insert(path.clone()) {
            let mut header = self.header(EntryType::Directory, 0o755, 0);
            self.builder
                .append_data(&mut header, &path, std::io::empty())?;
        }
        Ok(())
    }

    fn file(&mut self, path: &str, mode: u32, size: u64, data: impl Read) -> std::io::Result<()> {
        self.parents(path)?;
        let mut header = self.header(EntryType::Regular, mode, size);
        self.builder.append_data(&mut header, path, data)
    }

    fn symlink(&mut self, path: &str, target: &Path) -> std::io::Result<()> {
        self.parents(path)?;
        let mut header = self.header(EntryType::Symlink, 0o777, 0);
        self.builder.append_link(&mut header, path, target)
    }

    /// Copies a tar stream (from `git archive`) below `prefix`, normalising every header.
    fn splice(&mut self, prefix: &str, stream: impl Read) -> std::io::Result<()> {
        self.dir(prefix)?;
        let mut archive = tar::Archive::new(stream);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            let path = format!("{prefix}/{}", path.trim_start_matches("./"));
            let header = entry.header();
            match header.entry_type() {
                EntryType::Directory => self.dir(&path)?,
                EntryType::Regular | EntryType::Continuous => {
                    let mode = if header.mode()? & 0o111 != 0 {
                        0o755
                    } else {
                        0o644
                    };
                    let size = header.size()?;
                    self.file(&path, mode, size, &mut entry)?;
                }
                EntryType::Symlink => {
                    let target = entry
                        .link_name()?
                        .map(|t| t.into_owned())
                        .unwrap_or_default();
                    self.symlink(&path, &target)?;
                }
                // git archive writes a pax header with the commit id; it is not content.
                EntryType::XGlobalHeader | EntryType::XHeader => {}
                other => {
                    return Err(std::io::Error::other(format!(
                        "unexpected {other:?} entry `{path}` in the source archive"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Writes the whole context of `image` to `out`: Dockerfile, files, sources, wheels.
pub fn write<W: Write>(
    image: &PlannedImage,
    dockerfile: &str,
    fetched: &Fetched,
    out: W,
) -> Result<W> {
    let mut tar = ContextTar {
        builder: tar::Builder::new(out),
        mtime: image.loaded.spec.image.source_date_epoch,
        dirs: BTreeSet::new(),
    };
    let io = |e: std::io::Error| Error::Io {
        path: image.loaded.path.clone(),
        source: std::io::Error::other(format!("writing the build context: {e}")),
    };
    tar.file(
        "Dockerfile",
        0o644,
        dockerfile.len() as u64,
        dockerfile.as_bytes(),
    )
    .map_err(io)?;
    for file in &image.files {
        let handle = fs_err::File::open(&file.src).map_err(|e| Error::io(&file.src, e))?;
        let size = handle
            .metadata()
            .map_err(|e| Error::io(&file.src, e))?
            .len();
        tar.file(&file.context_path(), file.mode(), size, handle)
            .map_err(io)?;
    }
    for source in &fetched.sources {
        let mut child = fetch::archive(&source.repo, &source.tree)?;
        let stdout = child.stdout.take().expect("piped");
        let spliced = tar.splice(&format!("sources/{}", source.name), stdout);
        let output = child
            .wait_with_output()
            .map_err(|e| Error::io(&source.repo, e))?;
        if !output.status.success() {
            return Err(Error::Command {
                command: format!("git archive {}", source.tree),
                context: Some(format!("archiving source `{}`", source.name)),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        spliced.map_err(io)?;
    }
    if !fetched.wheels.is_empty() {
        let requirements = render::wheel_requirements(image);
        tar.file(
            "wheels/requirements.txt",
            0o644,
            requirements.len() as u64,
            requirements.as_bytes(),
        )
        .map_err(io)?;
        for wheel in &fetched.wheels {
            let handle = fs_err::File::open(wheel).map_err(|e| Error::io(wheel, e))?;
            let size = handle.metadata().map_err(|e| Error::io(wheel, e))?.len();
            let name = wheel.file_name().expect("a file").to_string_lossy();
            tar.file(&format!("wheels/{name}"), 0o644, size, handle)
                .map_err(io)?;
        }
    }
    tar.builder.into_inner().map_err(io)
}

/// Writes the context into a folder (for `render --out`), streaming through a pipe.
pub fn unpack_into(
    image: &PlannedImage,
    dockerfile: &str,
    fetched: &Fetched,
    dir: &Path,
) -> Result<()> {
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let (reader, writer) = std::io::pipe().map_err(|e| Error::io(dir, e))?;
    std::thread::scope(|scope| {
        let producer = scope.spawn(move || write(image, dockerfile, fetched, writer).map(drop));
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_mtime(true);
        let unpacked = archive.unpack(dir).map_err(|e| Error::io(dir, e));
        drop(archive);
        producer.join().expect("context writer does not panic")?;
        unpacked
    })
}
