//! The build context as a deterministic tar stream: a fixed entry order, one mtime (the
//! spec's source date), uid/gid 0, no user names, modes normalised to 0644/0755, no xattrs.
//! The same inputs give the same bytes on any machine, at any path, under any umask.
//!
//! It is written to any `Write`: a pipe into the engine for a build, or an unpacker for
//! `render --out`. Nothing is buffered whole.

use crate::error::{Error, Result};
use crate::inputs::spec::ContextFile;
use crate::make::render;
use crate::oci::Hashing;
use crate::oci::tar::{self, EntryType, Header, append};
use crate::plan::PlannedImage;
use crate::plan::fetch::{self, Fetched};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;

struct ContextTar<W: Write> {
    builder: tar::Builder<W>,
    mtime: u64,
    dirs: BTreeSet<String>,
}

impl<W: Write> ContextTar<W> {
    fn header(&self, kind: EntryType, mode: u32, size: u64) -> Header {
        tar::owned(kind, mode, size, self.mtime, 0, 0)
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

/// The context's one archive of every `[[file]]`, which the Dockerfile ADDs at `/`: the
/// engine unpacks it as it unpacks a layer, so file names reach the image byte for byte (no
/// Dockerfile line names them: no globbing, no `$`, no quoting), every file arrives in one
/// layer, and folders the parent has keep their mode and owner (the archive has no folder
/// entries; a missing folder is made 0755, root's).
pub const FILES_ARCHIVE: &str = "files.tar";

/// The files of a spec as a tar: sorted by destination, regular files only, one mtime,
/// uid/gid 0, mode 0644 or 0755. Sizes are taken once, so the archive's length is known
/// before it is written (it is an entry of the context tar).
pub struct FilesArchive<'a> {
    files: &'a [ContextFile],
    sizes: Vec<u64>,
    mtime: u64,
}

impl<'a> FilesArchive<'a> {
    pub fn new(files: &'a [ContextFile], mtime: u64) -> Result<FilesArchive<'a>> {
        let sizes = files
            .iter()
            .map(|f| {
                fs_err::metadata(&f.src)
                    .map(|m| m.len())
                    .map_err(|e| Error::io(&f.src, e))
            })
            .collect::<Result<_>>()?;
        Ok(FilesArchive {
            files,
            sizes,
            mtime,
        })
    }

    /// `./` before every name (see [`append`]).
    fn name(file: &ContextFile) -> String {
        format!(".{}", file.dest)
    }

    pub fn header(&self, file: &ContextFile, size: u64) -> Header {
        tar::owned(EntryType::Regular, file.mode(), size, self.mtime, 0, 0)
    }

    /// The archive's length in bytes: each entry's header blocks (a long name takes more),
    /// its data padded to 512, and the two closing blocks.
    pub fn size(&self) -> std::io::Result<u64> {
        let mut headers = tar::Builder::new(Counter(0));
        for file in self.files {
            append(
                &mut headers,
                self.header(file, 0),
                &Self::name(file),
                std::io::empty(),
            )?;
        }
        let data: u64 = self.sizes.iter().map(|size| size.div_ceil(512) * 512).sum();
        Ok(headers.into_inner()?.0 + data)
    }

    pub fn write(&self, out: impl Write) -> std::io::Result<()> {
        self.write_placed(out, |file, _| Ok(Self::name(file)))
    }

    /// Writes the files, each at the name `place` gives it (which may write entries first).
    pub fn write_placed<W: Write>(
        &self,
        out: W,
        mut place: impl FnMut(&ContextFile, &mut tar::Builder<W>) -> std::io::Result<String>,
    ) -> std::io::Result<()> {
        let mut tar = tar::Builder::new(out);
        for (file, size) in self.files.iter().zip(&self.sizes) {
            let name = place(file, &mut tar)?;
            let data = open_checked(file, *size)?;
            append(&mut tar, self.header(file, *size), &name, data)?;
        }
        tar.into_inner()?.flush()
    }
}

/// Opens a planned file for copying: its bytes must be the `size` and sha256 they had when
/// the checksum was computed, or the copy fails (an image never holds other bytes than its
/// checksum says).
pub fn open_checked(file: &ContextFile, size: u64) -> std::io::Result<impl Read> {
    Ok(CheckedFile {
        inner: Hashing::new(
            // fs_err's message names the file.
            fs_err::File::open(&file.src)?.take(size + 1),
        ),
        file,
        size,
    })
}

struct CheckedFile<'a, R> {
    inner: Hashing<R>,
    file: &'a ContextFile,
    size: u64,
}

impl<R: Read> Read for CheckedFile<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let changed = self.inner.size() > self.size
            || (n == 0 && self.inner.digest().hex() != self.file.sha256);
        if changed {
            return Err(std::io::Error::other(format!(
                "{} changed since its checksum was computed; run the command again",
                self.file.src.display()
            )));
        }
        Ok(n)
    }
}

/// Reads exactly `left` bytes, or fails: a short archive must not pass as a whole one.
struct ExactReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let limit = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..limit])?;
        if n == 0 && self.left > 0 {
            return Err(std::io::Error::other("the files archive ended early"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
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
    if !image.files.is_empty() {
        let archive = FilesArchive::new(&image.files, tar.mtime)?;
        let size = archive.size().map_err(io)?;
        let (reader, writer) = std::io::pipe().map_err(io)?;
        std::thread::scope(|scope| {
            let archive = &archive;
            let producer = scope.spawn(move || archive.write(writer));
            let mut exact = ExactReader {
                inner: reader,
                left: size,
            };
            let copied = tar.file(FILES_ARCHIVE, 0o644, size, &mut exact);
            drop(exact);
            let produced = producer
                .join()
                .expect("the files archive writer does not panic");
            produced.and(copied).map_err(io)
        })?;
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
    for (name, path) in &fetched.debs {
        let handle = fs_err::File::open(path).map_err(|e| Error::io(path, e))?;
        let size = handle.metadata().map_err(|e| Error::io(path, e))?.len();
        tar.file(&format!("apt/{name}"), 0o644, size, handle)
            .map_err(io)?;
    }
    tar.builder.into_inner().map_err(io)
}

/// Writes the patched trees of `sources` (each below its path, relative to `/`) as one
/// normalised tar: what a compile stage's container gets at `/` before it starts.
pub fn write_sources<W: Write>(
    sources: &[(String, fetch::FetchedSource)],
    mtime: u64,
    out: W,
) -> Result<W> {
    let mut tar = ContextTar {
        builder: tar::Builder::new(out),
        mtime,
        dirs: BTreeSet::new(),
    };
    for (prefix, source) in sources {
        let io = |e: std::io::Error| Error::io(&source.repo, e);
        tar.parents(&format!("{prefix}/")).map_err(io)?;
        let mut child = fetch::archive(&source.repo, &source.tree)?;
        let stdout = child.stdout.take().expect("piped");
        let spliced = tar.splice(prefix, stdout);
        let output = child.wait_with_output().map_err(io)?;
        if !output.status.success() {
            return Err(Error::Command {
                command: format!("git archive {}", source.tree),
                context: Some(format!("archiving source `{}`", source.name)),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        spliced.map_err(io)?;
    }
    tar.builder
        .into_inner()
        .map_err(|e| Error::io("the sources' tar", e))
}

/// The file in a `render --out` folder that lists what the render wrote there, one path a
/// line (folders end in `/`): the next render removes those first, and nothing else.
pub const RENDERED_LIST: &str = ".hallmark-rendered";

/// Writes the context into a folder (for `render --out`), streaming through a pipe. What an
/// earlier render wrote there (its [`RENDERED_LIST`]) is removed first, so a file the
/// context no longer has does not go into a plain `docker build` of the folder; files the
/// list does not name (the user's) are left alone.
pub fn unpack_into(
    image: &PlannedImage,
    dockerfile: &str,
    fetched: &Fetched,
    dir: &Path,
) -> Result<()> {
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    remove_rendered(dir)?;
    let (reader, writer) = std::io::pipe().map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    std::thread::scope(|scope| {
        let producer = scope.spawn(move || write(image, dockerfile, fetched, writer).map(drop));
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_mtime(true);
        let unpacked = unpack_listed(&mut archive, dir, &mut written);
        drop(archive);
        producer.join().expect("context writer does not panic")?;
        unpacked
    })?;
    let list = dir.join(RENDERED_LIST);
    let mut text = written.join("\n");
    text.push('\n');
    fs_err::write(&list, text).map_err(|e| Error::io(&list, e))
}

/// Unpacks `archive` into `dir` entry by entry (each kept inside `dir`, as `unpack` does),
/// noting each path written.
fn unpack_listed(
    archive: &mut tar::Archive<impl std::io::Read>,
    dir: &Path,
    written: &mut Vec<String>,
) -> Result<()> {
    for entry in archive.entries().map_err(|e| Error::io(dir, e))? {
        let mut entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path().map_err(|e| Error::io(dir, e))?.into_owned();
        let mut name = path
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        if entry.header().entry_type().is_dir() {
            name.push('/');
        }
        if entry.unpack_in(dir).map_err(|e| Error::io(dir, e))? && name != "/" {
            written.push(name);
        }
    }
    Ok(())
}

/// Removes what the [`RENDERED_LIST`] in `dir` names: its files, then its folders that are
/// left empty (deepest first). A path that would leave `dir` is ignored.
fn remove_rendered(dir: &Path) -> Result<()> {
    let list = dir.join(RENDERED_LIST);
    let text = match fs_err::read_to_string(&list) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&list, e)),
    };
    let inside = |line: &str| {
        let path = Path::new(line.trim_end_matches('/'));
        !line.is_empty()
            && path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    let mut folders = Vec::new();
    for line in text.lines().filter(|l| inside(l)) {
        let path = dir.join(line.trim_end_matches('/'));
        if line.ends_with('/') {
            folders.push(path);
            continue;
        }
        match fs_err::symlink_metadata(&path) {
            Ok(meta) if !meta.is_dir() => {
                fs_err::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            }
            _ => {}
        }
    }
    folders.sort_by_key(|f| std::cmp::Reverse(f.components().count()));
    for folder in folders {
        // Not empty: it holds what the user put there.
        let _ = fs_err::remove_dir(&folder);
    }
    fs_err::remove_file(&list).map_err(|e| Error::io(&list, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_archive_is_as_long_as_announced_and_starts_with_dot_slash() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("/opt/{}/f", "d".repeat(120));
        let files: Vec<ContextFile> = [
            ("/BZh-first", &b"x"[..]),
            ("/usr/bin/[ab]*?$x 'q\" \\ é", &[7u8; 600][..]),
            (long.as_str(), &b""[..]),
        ]
        .iter()
        .enumerate()
        .map(|(i, (dest, bytes))| {
            let src = dir.path().join(i.to_string());
            std::fs::write(&src, bytes).unwrap();
            ContextFile {
                src,
                dest: dest.to_string(),
                executable: i == 1,
                sha256: crate::plan::checksum::sha256_hex(bytes),
            }
        })
        .collect();
        let archive = FilesArchive::new(&files, 7).unwrap();
        let mut bytes = Vec::new();
        archive.write(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, archive.size().unwrap());
        assert!(bytes.starts_with(b"./BZh-first\0"));
        let names: Vec<(Vec<u8>, u32)> = tar::Archive::new(bytes.as_slice())
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path_bytes().into_owned(), e.header().mode().unwrap())
            })
            .collect();
        assert_eq!(names[0], (b"./BZh-first".to_vec(), 0o644));
        assert_eq!(names[1].0, ".{}".replace("{}", &files[1].dest).into_bytes());
        assert_eq!(names[1].1, 0o755);
        assert!(names[2].0.ends_with(b"/f"));

        std::fs::write(&files[0].src, b"y").unwrap();
        let err = archive.write(std::io::sink()).unwrap_err();
        assert!(err.to_string().contains("changed since"), "{err}");
    }
}
