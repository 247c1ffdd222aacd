//! The new layers read where the builder keeps them, instead of through its export: Docker's
//! classic image store on the overlay2 driver, on this machine. There a layer is a
//! directory, `<root>/overlay2/<cache-id>/diff`, holding what the layer changes (a deleted
//! name is a 0:0 character device, a directory that hides what is below it carries
//! `trusted.overlay.opaque=y`). The engine's own export walks those directories too (moby's
//! overlay2 `Diff`), but writes the whole image, parent included, into a temporary folder
//! before it sends a byte: two thirds of a 2 GiB image's export went there. Walking the
//! new layers' directories gives the same entries and reads only the new bytes, once; the
//! canonical layer's size is known before its content is read, so the load back into the
//! builder takes it as it is written.
//!
//! Only where the directories are the engine's own view of its layers, which hallmark checks:
//! the engine is reached over a local socket and reports the overlay2 driver with a native
//! overlay diff (with `redirect_dir` or `metacopy` a directory need not hold its layer's
//! files), no user-namespace remapping or rootless engine (the ids on disk would not be the
//! layer's), and the store's layer database, read here, names each of the image's chain
//! IDs with the image's own diff ID. The containerd store keeps its snapshots under ids only
//! its database maps, and a remote engine's disk is not here: those go through the export.
//! The file reading needs the engine's data root to be readable (root, as the engine runs).

use super::Unreadable;
use super::{Item, Kind, WHITEOUT, join, split, text};
use crate::engine::Engine;
use crate::engine::ImageStore;
use crate::images::store::{Blob, LAYER_TAR, StoredLayer};
use crate::oci::Digest;
use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The raw image as the builder's store holds it on this machine.
pub struct Found {
    /// The raw image's config, from the store's image database.
    pub config: serde_json::Value,
    /// The parent's layers as the builder's export names their blobs: uncompressed tars under
    /// their diff IDs, each the size the layer database's tar-split record gives it.
    pub parent: Vec<StoredLayer>,
    /// Each of the parent's layers' directories, bottom first (what they hold, for an opaque
    /// directory of a new layer, is read from there, not from an export).
    pub parent_dirs: Vec<PathBuf>,
    /// Each new layer's directory, bottom first.
    pub dirs: Vec<PathBuf>,
}

/// The first entry under `dir` whose modification time is exactly the epoch. moby writes
/// the epoch when it unpacks a time it cannot hold (before 1970, after 2262-04-11), so such a
/// name's true time is only in the layer's tar: where it would be clamped to a source date
/// above 0, the directory cannot say to what.
fn at_the_epoch(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .flatten()
        .find(|entry| {
            entry
                .metadata()
                .is_ok_and(|m| m.mtime() == 0 && m.mtime_nsec() == 0)
        })
        .map(|entry| entry.into_path())
}

/// The builder's root folder, when its layers are overlay2 folders on this machine that
/// hallmark can read as the engine wrote them; else why not.
async fn overlay_root(builder: &Engine) -> std::result::Result<String, Unreadable> {
    if !builder.reach().is_local() {
        return Err(Unreadable::Remote(builder.reach().to_string()));
    }
    let info = builder.info().await?;
    let store = builder.store().await?;
    if store != ImageStore::Classic {
        return Err(Unreadable::NotOverlay(store.to_string()));
    }
    if info.driver != "overlay2" {
        return Err(Unreadable::Driver(info.driver));
    }
    if info.status("Native Overlay Diff") != Some("true") {
        return Err(Unreadable::NaiveDiff);
    }
    if info.status("userxattr") == Some("true")
        || info
            .security_options
            .iter()
            .any(|o| o.contains("name=userns") || o.contains("name=rootless"))
    {
        return Err(Unreadable::Remapped);
    }
    Ok(info.docker_root_dir)
}

/// Finds the raw image `id` (layers `diff_ids`, the first `parent_layers` its parent's) in
/// the builder's store on this machine, or says why it cannot be read there. `parent` is
/// the store's record of the parent's layers, when it has one (no tar-split is read then).
/// With a `source_date` above 0, a name whose time is the epoch sends the reading to the
/// export ([`at_the_epoch`]).
pub async fn locate(
    builder: &Engine,
    id: &str,
    diff_ids: &[Digest],
    parent_layers: usize,
    parent: Option<&[StoredLayer]>,
    source_date: u64,
) -> std::result::Result<Found, Unreadable> {
    let docker_root_dir = overlay_root(builder).await?;
    let root = Path::new(&docker_root_dir);
    let image_hex = id.strip_prefix("sha256:").unwrap_or(id);
    let config_path = root
        .join("image/overlay2/imagedb/content/sha256")
        .join(image_hex);
    let config = fs_err::read(&config_path)?;
    if Digest::of(&config).hex() != image_hex {
        return Err(Unreadable::NotTheImage {
            path: config_path,
            id: id.to_string(),
        });
    }
    let config = serde_json::from_slice(&config).map_err(|source| Unreadable::Config {
        path: config_path.clone(),
        source,
    })?;
    let layerdb = root.join("image/overlay2/layerdb/sha256");
    let strings: Vec<String> = diff_ids.iter().map(Digest::to_string).collect();
    let chains = crate::images::transfer::chain_ids(&strings);
    let layer_dir = |n: usize| layerdb.join(chains[n].trim_start_matches("sha256:"));
    let read = fs_err::read_to_string::<PathBuf>;
    let mut dirs = Vec::new();
    for (n, diff_id) in diff_ids.iter().enumerate() {
        let layer = layer_dir(n);
        if *diff_id != read(layer.join("diff"))?.trim() {
            return Err(Unreadable::NotTheLayer {
                path: layer,
                diff_id: diff_id.clone(),
            });
        }
        let cache_id = read(layer.join("cache-id"))?;
        let cache_id = cache_id.trim();
        if cache_id.is_empty() || cache_id.contains(['/', '.']) {
            return Err(Unreadable::CacheId {
                path: layer,
                cache_id: cache_id.to_string(),
            });
        }
        let dir = root.join("overlay2").join(cache_id).join("diff");
        fs_err::read_dir(&dir)?;
        dirs.push(dir);
    }
    let new_dirs = dirs.split_off(parent_layers);
    if source_date > 0
        && let Some(path) = new_dirs.iter().find_map(|dir| at_the_epoch(dir))
    {
        return Err(Unreadable::Epoch(path));
    }
    let parent = match parent {
        Some(record) => record.to_vec(),
        None => (0..parent_layers)
            .map(|n| {
                let path = layer_dir(n).join("tar-split.json.gz");
                let size =
                    tar_size(&path).map_err(|source| Unreadable::TarSplit { path, source })?;
                Ok(StoredLayer {
                    diff_id: diff_ids[n].clone(),
                    blob: Blob {
                        digest: diff_ids[n].clone(),
                        size,
                        media_type: LAYER_TAR.into(),
                    },
                })
            })
            .collect::<std::result::Result<_, Unreadable>>()?,
    };
    Ok(Found {
        config,
        parent,
        parent_dirs: dirs,
        dirs: new_dirs,
    })
}

/// The size of the tar a layer's tar-split record rebuilds (the engine's export sends that
/// tar): its files' sizes and the raw header and padding segments it keeps. The record is
/// gzipped JSON lines, `{"type":1,"size":N,...}` for a file's content and
/// `{"type":2,"payload":"<base64>"}` for the bytes around it; the format is moby's
/// (vbatts/tar-split), which no crate reads.
fn tar_size(path: &Path) -> std::io::Result<u64> {
    #[derive(serde::Deserialize)]
    struct Record {
        #[serde(rename = "type")]
        kind: u8,
        #[serde(default)]
        size: u64,
        #[serde(default)]
        payload: Option<String>,
    }
    let file = fs_err::File::open(path)?;
    let lines = std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines();
    let mut size = 0u64;
    for line in lines {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record: Record = serde_json::from_str(&line)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        size += match (record.kind, record.payload) {
            (1, _) => record.size,
            (2, Some(payload)) => {
                let padding = payload.bytes().rev().take_while(|&b| b == b'=').count();
                (payload.len() / 4 * 3 - padding) as u64
            }
            _ => 0,
        };
    }
    Ok(size)
}

/// A layer directory's entries as normalisation sees them, the directories it marks opaque,
/// and where each file's content is (an [`Item`]'s `data` is its index in `files`).
pub struct Walked {
    pub items: Vec<Item>,
    pub opaque: Vec<String>,
    pub files: Files,
}

/// The files whose content a walked layer holds.
pub struct Files(Vec<PathBuf>);

impl super::Content for Files {
    fn open(&mut self, item: &Item) -> std::io::Result<impl Read + '_> {
        let path = &self.0[item.data as usize];
        // fs_err's message names the file.
        let file = fs_err::File::open(path)?;
        Ok(Exactly {
            // The tar writer copies in 8 KiB pieces: one read call each without the buffer.
            inner: std::io::BufReader::with_capacity(1 << 20, file.take(item.size)),
            left: item.size,
            path,
        })
    }
}

/// A file's content, which must be the size its walk saw (the layer is the engine's, and
/// does not change; a tar entry shorter than its header says would corrupt the layer).
struct Exactly<'a, R> {
    inner: R,
    left: u64,
    path: &'a Path,
}

impl<R: Read> Read for Exactly<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: shorter than when the layer was walked",
                    self.path.display()
                ),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Walks a layer's directory as moby's overlay2 diff does: every entry below it (sockets
/// apart, which a tar cannot hold), a 0:0 character device as the whiteout of its name, an
/// opaque directory marked, a file seen again under another name (the same inode) as a hard
/// link to where it was first seen, and only the file capability of the extended
/// attributes.
pub fn walk(dir: &Path) -> std::io::Result<Walked> {
    let mut items = Vec::new();
    let mut opaque = Vec::new();
    let mut files = Vec::new();
    let mut seen: HashMap<(u64, u64), String> = HashMap::new();
    for entry in walkdir::WalkDir::new(dir).follow_links(false).min_depth(1) {
        let entry = entry.map_err(std::io::Error::from)?;
        let full = entry.path();
        let meta = entry.metadata().map_err(std::io::Error::from)?;
        let relative = full.strip_prefix(dir).expect("below the walked directory");
        let path = text(std::os::unix::ffi::OsStrExt::as_bytes(relative.as_os_str()));
        let kind = meta.file_type();
        if kind.is_socket() {
            continue;
        }
        if kind.is_char_device() && meta.rdev() == 0 {
            let (parent, name) = split(&path);
            items.push(Item::whiteout(join(parent, &format!("{WHITEOUT}{name}"))));
            continue;
        }
        // overlay2 marks deletions with devices, never with names: this one the build made.
        if entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(WHITEOUT.as_bytes())
        {
            return Err(super::whiteout_named(&path));
        }
        let mut item = item_of(path, full, &meta)?;
        if kind.is_dir() {
            item.kind = Kind::Dir;
            if attribute(full, "trusted.overlay.opaque")?.as_deref() == Some(b"y") {
                opaque.push(item.path.clone());
            }
            items.push(item);
            continue;
        }
        if meta.nlink() > 1 {
            match seen.get(&(meta.dev(), meta.ino())) {
                Some(first) => {
                    item.kind = Kind::HardLink;
                    item.link = Some(first.clone());
                    items.push(item);
                    continue;
                }
                None => {
                    seen.insert((meta.dev(), meta.ino()), item.path.clone());
                }
            }
        }
        if kind.is_file() {
            item.size = meta.len();
            item.data = files.len() as u64;
            files.push(full.to_path_buf());
        } else {
            special(&mut item, full, &meta)?;
        }
        items.push(item);
    }
    Ok(Walked {
        items,
        opaque,
        files: Files(files),
    })
}

/// A walked entry as a regular file's item: its mode, owner, time and file capability.
fn item_of(path: String, full: &Path, meta: &std::fs::Metadata) -> std::io::Result<Item> {
    Ok(Item {
        kind: Kind::File,
        mode: meta.mode() & 0o7777,
        uid: meta.uid().into(),
        gid: meta.gid().into(),
        mtime: meta.mtime().max(0) as u64,
        size: 0,
        data: 0,
        link: None,
        device: None,
        capability: attribute(full, "security.capability")?,
        path,
    })
}

/// What a walked entry that is no file or directory is: a symlink and its target, a device
/// and its numbers, a fifo.
fn special(item: &mut Item, full: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    let kind = meta.file_type();
    let failed = |path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    if kind.is_symlink() {
        let target = fs_err::read_link(full).map_err(|e| failed(full, e))?;
        item.kind = Kind::Symlink;
        item.link = Some(text(std::os::unix::ffi::OsStrExt::as_bytes(
            target.as_os_str(),
        )));
    } else if kind.is_char_device() || kind.is_block_device() {
        item.kind = if kind.is_char_device() {
            Kind::Char
        } else {
            Kind::Block
        };
        let rdev = meta.rdev();
        item.device = Some((libc::major(rdev), libc::minor(rdev)));
    } else if kind.is_fifo() {
        item.kind = Kind::Fifo;
    }
    Ok(())
}

/// An extended attribute of `path` itself (a symlink's own), none where the file system
/// keeps none.
fn attribute(path: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    match xattr::get(path, name) {
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(None),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("{}: attribute {name}: {e}", path.display()),
        )),
        Ok(value) => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn tar_split_gives_the_size_of_the_tar_it_rebuilds() {
        // Docker 20.10's record of a fixture layer it imported (tests/fixtures/layers).
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layers");
        let tar = std::fs::metadata(fixtures.join("docker-20.10-2.tar")).unwrap();
        let record = fixtures.join("docker-20.10-2.tar-split.json.gz");
        assert_eq!(tar_size(&record).unwrap(), tar.len());
    }

    /// What overlay2 leaves in a layer's directory (whiteout devices and the opaque mark
    /// need root, as the engine has) is walked as the engine's export writes it.
    #[test]
    fn a_layer_directory_is_walked_as_the_export_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("opt/d/sub")).unwrap();
        std::fs::write(root.join("opt/x"), b"x\n").unwrap();
        std::fs::hard_link(root.join("opt/x"), root.join("opt/a-first")).unwrap();
        symlink("x", root.join("opt/sym")).unwrap();
        let fifo = std::ffi::CString::new(root.join("opt/fifo").to_str().unwrap()).unwrap();
        let whiteout = std::ffi::CString::new(root.join("opt/gone").to_str().unwrap()).unwrap();
        // SAFETY: both are NUL-terminated paths that live through the calls.
        unsafe {
            assert_eq!(libc::mkfifo(fifo.as_ptr(), 0o644), 0);
            assert_eq!(
                libc::mknod(whiteout.as_ptr(), libc::S_IFCHR | 0o600, 0),
                0,
                "needs root"
            );
        }
        xattr::set(root.join("opt/d"), "trusted.overlay.opaque", b"y").unwrap();
        // `cap_net_bind_service=ep`, as `setcap` writes it (revision 2, effective).
        let capability = [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        xattr::set(root.join("opt/x"), "security.capability", &capability).unwrap();
        let walked = walk(root).unwrap();
        let mut seen: Vec<(String, Kind, Option<String>)> = walked
            .items
            .iter()
            .map(|i| (i.path.clone(), i.kind, i.link.clone()))
            .collect();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let first = seen
            .iter()
            .find(|(p, ..)| p == "opt/a-first" || p == "opt/x")
            .unwrap();
        let (lead, other) = match first.1 {
            Kind::File => (
                first.0.clone(),
                if first.0 == "opt/x" {
                    "opt/a-first"
                } else {
                    "opt/x"
                },
            ),
            _ => panic!("{seen:?}"),
        };
        let mut expected = vec![
            ("opt".to_string(), Kind::Dir, None),
            ("opt/.wh.gone".to_string(), Kind::Whiteout, None),
            ("opt/d".to_string(), Kind::Dir, None),
            ("opt/d/sub".to_string(), Kind::Dir, None),
            ("opt/fifo".to_string(), Kind::Fifo, None),
            ("opt/sym".to_string(), Kind::Symlink, Some("x".to_string())),
            (lead.clone(), Kind::File, None),
            (other.to_string(), Kind::HardLink, Some(lead)),
        ];
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(seen, expected);
        assert_eq!(walked.opaque, vec!["opt/d".to_string()]);
        let x = walked.items.iter().find(|i| i.path == "opt/x").unwrap();
        assert_eq!(x.capability.as_deref(), Some(&capability[..]));
    }

    /// A file or directory the build named `.wh.*` would delete another name in the image
    /// (overlay2 marks deletions with devices): refused, naming it.
    #[test]
    fn a_name_the_layer_format_reads_as_a_deletion_is_refused() {
        for made in ["file", "dir"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("etc/.wh.passwd");
            std::fs::create_dir_all(dir.path().join("etc")).unwrap();
            match made {
                "file" => std::fs::write(&path, b"keep\n").unwrap(),
                _ => std::fs::create_dir(&path).unwrap(),
            }
            let error = walk(dir.path()).err().unwrap().to_string();
            assert!(
                error.contains("etc/.wh.passwd") && error.contains("rename"),
                "{error}"
            );
        }
    }

    /// moby writes the epoch for a time it cannot hold (after 2262): such a name is found.
    #[test]
    fn a_name_at_the_epoch_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("t")).unwrap();
        std::fs::write(dir.path().join("t/now"), b"x").unwrap();
        assert_eq!(at_the_epoch(dir.path()), None);
        let late = dir.path().join("t/y2300");
        std::fs::write(&late, b"x").unwrap();
        let epoch = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH);
        std::fs::File::options()
            .write(true)
            .open(&late)
            .unwrap()
            .set_times(epoch)
            .unwrap();
        assert_eq!(at_the_epoch(dir.path()), Some(late));
    }
}
