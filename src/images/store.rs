//! The layer store: a content-addressed copy of the layers of images hallmark ships, on the
//! machine hallmark runs on (the builder). An image is exported from the engine once, read as
//! a stream whatever the archive layout (`docker save` of Docker 20.10 writes `<id>/layer.tar`,
//! Docker 25 and later an OCI layout), and each file lands under its sha256. Thin archives for
//! the nodes are then written from here, so the export, not repeated per node, is the cost.
//!
//! Disk cost: one copy of every layer of every image shipped or normalised (a normalised
//! image's own layers are only ever here in their normalised form), until `hallmark prune`.
//! Archive paths are never used to write: only digests name files, so a hostile archive cannot
//! place a file outside the store.
//!
//! The store is shared by every project and command using the same cache. Each command holds
//! its lock (`store/lock`, flock) shared for as long as it uses the store; `prune` holds it
//! exclusively, so it never removes a blob that a running command has just written and not
//! yet recorded. Each record is marked with the projects that use it
//! (`projects/<key>/images/<id>`), and `prune` in one project keeps every image another
//! project still marks.

pub mod finished;

use crate::error::{Error, Result};
use crate::oci::archive::{self, DockerManifest};
use crate::oci::digest::hex_of;
use crate::oci::{Digest, Hashing};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use crate::oci::archive::{Blob, LAYER_TAR, StoredImage, StoredLayer};

/// The files of an archive being read: each name's digest and size.
type ArchiveFiles = HashMap<String, (Digest, u64)>;

/// What `prune` removed: blobs, the kept wheels of compile stages, and apt package files.
#[derive(Debug, Default)]
pub struct Pruned {
    pub blobs: usize,
    pub blob_bytes: u64,
    /// Of `blob_bytes`, those of blobs the registry's storage also links (freed only when
    /// its garbage collection removes them too).
    pub linked_bytes: u64,
    pub compiled: usize,
    pub compiled_bytes: u64,
    pub debs: usize,
    pub deb_bytes: u64,
}

pub struct LayerStore {
    pub root: PathBuf,
    /// The project root this process works for: the records it writes and uses are marked
    /// with it.
    project: Option<PathBuf>,
    /// `store/lock`, held shared by a command, exclusively by `prune`; released on drop.
    _lock: Option<std::fs::File>,
    exclusive: bool,
}

/// The project the command line works in, set once before any store is opened.
static PROJECT: OnceLock<PathBuf> = OnceLock::new();

/// Marks every store this process opens as used by the project at `root`.
pub fn set_project(root: &Path) {
    let _ = PROJECT.set(root.to_path_buf());
}

/// `CACHEDIR.TAG` (https://bford.info/cachedir/): backup and indexing tools skip the cache,
/// which holds nothing that cannot be fetched or exported again.
pub fn mark_cache(cache: &Path) {
    let tag = cache.join("CACHEDIR.TAG");
    if !tag.is_file() && fs_err::create_dir_all(cache).is_ok() {
        let _ = fs_err::write(
            tag,
            "Signature: 8a477f597d28d172789f06886806bc55\n\
             # This file is a cache directory tag created by hallmark (git sources, wheels,\n\
             # the layer store, the registry's storage).\n\
             # For information about cache directory tags, see https://bford.info/cachedir/\n",
        );
    }
}

fn open_lock(root: &Path) -> Result<std::fs::File> {
    fs_err::create_dir_all(root).map_err(|e| Error::io(root, e))?;
    crate::images::turn::lock_file(&root.join("lock"))
}

#[derive(Deserialize)]
struct ConfigRootFs {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<Digest>,
}

impl archive::Blobs for LayerStore {
    fn path_of(&self, digest: &Digest) -> PathBuf {
        self.blob_path(digest)
    }
}

impl LayerStore {
    /// The store under `cache`, its lock held shared (waiting, with a note, while a `prune`
    /// holds it), marked as used by the project this process works for.
    pub fn open(cache: &Path) -> LayerStore {
        LayerStore::open_for(cache, PROJECT.get().map(PathBuf::as_path))
    }

    /// [`LayerStore::open`] for the project at `project`.
    pub fn open_for(cache: &Path, project: Option<&Path>) -> LayerStore {
        mark_cache(cache);
        let root = cache.join("store");
        // Best effort: a cache where the lock file cannot be made cannot be written either,
        // and that fails with its own error.
        let lock = open_lock(&root)
            .ok()
            .filter(|file| match file.try_lock_shared() {
                Ok(()) => true,
                Err(std::fs::TryLockError::WouldBlock) => {
                    crate::output::stderr(&format!(
                        "waiting for `hallmark prune` to finish with the layer store ({})",
                        root.display()
                    ));
                    file.lock_shared().is_ok()
                }
                Err(std::fs::TryLockError::Error(_)) => false,
            });
        LayerStore {
            root,
            project: project.map(Path::to_path_buf),
            _lock: lock,
            exclusive: false,
        }
    }

    /// The store for `prune`, its lock held exclusively: no other command is using it. `None`
    /// while one is, unless `wait`.
    pub fn for_prune(cache: &Path, project: &Path, wait: bool) -> Result<Option<LayerStore>> {
        mark_cache(cache);
        let root = cache.join("store");
        let file = open_lock(&root)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) if !wait => return Ok(None),
            Err(std::fs::TryLockError::WouldBlock) => {
                file.lock().map_err(|e| Error::io(root.join("lock"), e))?
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(root.join("lock"), e)),
        }
        Ok(Some(LayerStore {
            root,
            project: Some(project.to_path_buf()),
            _lock: Some(file),
            exclusive: true,
        }))
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(hex_of(digest))
    }

    fn record_path(&self, image_id: &str) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", hex_of(image_id)))
    }

    /// The stored image the builder knows as `image_id`, if every blob is still here.
    /// (The id is the config digest on the classic store, the manifest digest on the
    /// containerd store.) Marked as used by this project.
    pub fn image(&self, image_id: &str) -> Option<StoredImage> {
        let image = self.read_record(image_id)?;
        self.mark_used(image_id);
        Some(image)
    }

    /// The record of `image_id` as written, if its config is here: a normalised image's
    /// record names its parent's layers, which the store holds only once something exported
    /// them (stamping an image needs its config alone).
    pub fn record(&self, image_id: &str) -> Option<StoredImage> {
        let image = self.parse_record(image_id)?;
        self.blob_path(&image.config.digest).is_file().then(|| {
            self.mark_used(image_id);
            image
        })
    }

    fn parse_record(&self, image_id: &str) -> Option<StoredImage> {
        let text = fs_err::read_to_string(self.record_path(image_id)).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn read_record(&self, image_id: &str) -> Option<StoredImage> {
        let image = self.parse_record(image_id)?;
        let complete = std::iter::once(&image.config)
            .chain(image.layers.iter().map(|l| &l.blob))
            .all(|b| self.blob_path(&b.digest).is_file());
        complete.then_some(image)
    }

    /// Reads a `docker save` archive as a stream into the store.
    pub fn ingest(&self, archive: impl Read) -> Result<StoredImage> {
        self.ingest_from("the image archive", archive)
    }

    /// [`ingest`](Self::ingest), naming the archive `source` (`the export of x from node y`)
    /// in its errors.
    pub fn ingest_from(&self, source: &str, archive: impl Read) -> Result<StoredImage> {
        let files = self.read_entries(source, archive)?;
        self.image_of(source, &files)
    }

    /// Stores every regular file of the archive; returns each name (links resolved to
    /// their targets, inside the archive only) with its digest and size.
    fn read_entries(&self, source: &str, archive: impl Read) -> Result<ArchiveFiles> {
        let invalid = |entry: Option<&str>, message: String| Error::Archive {
            archive: source.to_string(),
            entry: entry.map(str::to_string),
            message,
        };
        let mut files: ArchiveFiles = HashMap::new();
        let mut links: Vec<(String, String)> = Vec::new();
        let mut archive = tar::Archive::new(archive);
        for entry in archive
            .entries()
            .map_err(|e| invalid(None, e.to_string()))?
        {
            let mut entry = entry.map_err(|e| invalid(None, e.to_string()))?;
            let path = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
            let invalid = |message: String| invalid(Some(&path), message);
            // `docker save` never writes a name twice; with two, which one a reader takes
            // decides what is loaded, so neither is taken.
            if files.contains_key(&path) || links.iter().any(|(p, _)| *p == path) {
                return Err(invalid("appears twice in the archive".into()));
            }
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let declared = entry.header().size().map_err(|e| invalid(e.to_string()))?;
                    let stored = self.entry_blob(&path, &mut entry, declared, &invalid)?;
                    files.insert(path, stored);
                }
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(|e| invalid(e.to_string()))?
                        .unwrap_or_default();
                    let target = target.to_string_lossy();
                    let base = if entry.header().entry_type() == tar::EntryType::Symlink {
                        path.rsplit_once('/').map_or("", |(dir, _)| dir).to_string()
                    } else {
                        String::new()
                    };
                    links.push((path, normalize(&format!("{base}/{target}"))));
                }
                _ => {}
            }
        }
        for (path, target) in links {
            if let Some(stored) = files.get(&target).cloned() {
                files.insert(path, stored);
            }
        }
        Ok(files)
    }

    /// Stores one regular entry of `declared` bytes. An OCI layout names blobs by digest:
    /// one the store holds is only hashed on the way through (to check the name), not
    /// written again.
    fn entry_blob(
        &self,
        path: &str,
        entry: &mut impl Read,
        declared: u64,
        invalid: &dyn Fn(String) -> Error,
    ) -> Result<(Digest, u64)> {
        let known = path
            .strip_prefix("blobs/sha256/")
            .and_then(Digest::from_hex)
            .filter(|d| self.blob_path(d).is_file());
        let (digest, size) = match known {
            Some(named) => {
                let (actual, size) =
                    Digest::of_reader(entry).map_err(|e| invalid(e.to_string()))?;
                if actual != named {
                    return Err(invalid(format!("blob named {named} has digest {actual}")));
                }
                (actual, size)
            }
            // Nothing is stored from an entry cut short.
            None => self.add_blob(|out| {
                let copied = std::io::copy(entry, out)?;
                if copied != declared {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("cut short: its header says {declared} bytes, the archive has {copied}"),
                    ));
                }
                Ok(())
            })
            .map_err(|e| match e {
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                    invalid(source.to_string())
                }
                other => other,
            })?,
        };
        if size != declared {
            return Err(invalid(format!(
                "cut short: its header says {declared} bytes, the archive has {size}"
            )));
        }
        Ok((digest, size))
    }

    /// The image `manifest.json` describes, from the stored entries.
    fn image_of(&self, source: &str, files: &ArchiveFiles) -> Result<StoredImage> {
        let invalid = |entry: &str, message: String| Error::Archive {
            archive: source.to_string(),
            entry: Some(entry.to_string()),
            message,
        };
        let lookup = |path: &str| {
            files
                .get(&normalize(path))
                .cloned()
                .ok_or_else(|| invalid(path, "is named but not in the archive".into()))
        };
        let (manifest_digest, _) = lookup("manifest.json")?;
        let manifest_bytes = fs_err::read(self.blob_path(&manifest_digest))
            .map_err(|e| Error::io(self.blob_path(&manifest_digest), e))?;
        let manifests: Vec<DockerManifest> = serde_json::from_slice(&manifest_bytes)
            .map_err(|e| invalid("manifest.json", e.to_string()))?;
        let [manifest] = manifests.as_slice() else {
            return Err(invalid(
                "manifest.json",
                format!("expected one image, it lists {}", manifests.len()),
            ));
        };
        let (config_digest, config_size) = lookup(&manifest.config)?;
        let config_bytes = fs_err::read(self.blob_path(&config_digest))
            .map_err(|e| Error::io(self.blob_path(&config_digest), e))?;
        let config: ConfigRootFs = serde_json::from_slice(&config_bytes)
            .map_err(|e| invalid(&manifest.config, format!("image config: {e}")))?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(invalid(
                "manifest.json",
                format!(
                    "the config lists {} layers, manifest.json {}",
                    config.rootfs.diff_ids.len(),
                    manifest.layers.len()
                ),
            ));
        }
        let mut layers = Vec::new();
        for (diff_id, path) in config.rootfs.diff_ids.iter().zip(&manifest.layers) {
            let (digest, size) = lookup(path)?;
            let media_type = if digest == *diff_id {
                LAYER_TAR.to_string()
            } else {
                self.sniff_compression(&digest)?
            };
            // An uncompressed layer's digest is its diff ID: anything else is a layer that is
            // not the one the config names. (A compressed one is checked by the engine that
            // loads it.)
            if media_type == LAYER_TAR && digest != *diff_id {
                return Err(invalid(
                    path,
                    format!("the layer has content {digest}, but the config names {diff_id}"),
                ));
            }
            layers.push(StoredLayer {
                diff_id: diff_id.clone(),
                blob: Blob {
                    digest,
                    size,
                    media_type,
                },
            });
        }
        Ok(StoredImage {
            config: Blob {
                digest: config_digest,
                size: config_size,
                media_type: archive::CONFIG.into(),
            },
            layers,
        })
    }

    /// Adds a blob written by `write` (a layer or a config hallmark makes); returns its
    /// descriptor's digest and size.
    pub fn add_blob(
        &self,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(Digest, u64)> {
        let mut pending = self.pending_blob()?;
        write(&mut pending.out).map_err(|e| Error::io(self.root.join("tmp"), e))?;
        pending.keep(self)
    }

    /// A blob to write ([`PendingBlob::out`]), then to keep under its digest or to use as an
    /// unnamed temporary file.
    pub fn pending_blob(&self) -> Result<PendingBlob> {
        let tmp_dir = self.root.join("tmp");
        fs_err::create_dir_all(&tmp_dir).map_err(|e| Error::io(&tmp_dir, e))?;
        let tmp = tempfile::NamedTempFile::new_in(&tmp_dir).map_err(|e| Error::io(&tmp_dir, e))?;
        Ok(PendingBlob {
            // Large writes: a rewritten layer comes in tar's 8 KiB pieces, a write call each
            // with the default buffer.
            out: Hashing::new(std::io::BufWriter::with_capacity(1 << 20, tmp)),
        })
    }

    /// An image config from the store, parsed.
    pub fn read_config(&self, image: &StoredImage) -> Result<serde_json::Value> {
        let path = self.blob_path(&image.config.digest);
        let bytes = fs_err::read(&path).map_err(|e| Error::io(&path, e))?;
        let invalid = |message: String| Error::Io {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
        };
        match serde_json::from_slice(&bytes) {
            Ok(config @ serde_json::Value::Object(_)) => Ok(config),
            Ok(_) => Err(invalid("image config: not a JSON object".into())),
            Err(e) => Err(invalid(format!("image config: {e}"))),
        }
    }

    /// A layer's tar, uncompressed whatever the blob's media type (the containerd image store
    /// exports the layers it built gzip-compressed).
    pub fn open_layer(&self, layer: &StoredLayer) -> Result<Box<dyn Read>> {
        let path = self.blob_path(&layer.blob.digest);
        let file = fs_err::File::open(&path).map_err(|e| Error::io(&path, e))?;
        match layer.blob.media_type.rsplit_once('+').map(|(_, c)| c) {
            None => Ok(Box::new(std::io::BufReader::new(file))),
            Some("gzip") => Ok(Box::new(flate2::read::GzDecoder::new(
                std::io::BufReader::new(file),
            ))),
            Some(other) => Err(Error::Io {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!(
                        "layer {} is {other}-compressed, which hallmark cannot read yet",
                        layer.diff_id
                    ),
                ),
            }),
        }
    }

    /// Records `image` under the builder's id for it, for the next distribute, marked as
    /// used by this project.
    pub fn remember(&self, image_id: &str, image: &StoredImage) -> Result<()> {
        let text = serde_json::to_string_pretty(image).expect("serializes");
        write_atomically(&self.record_path(image_id), text.as_bytes())?;
        self.mark_used(image_id);
        Ok(())
    }

    /// `projects/<key>`: what the project at `root` uses. The key is a hash of the root's
    /// path; the folder's `root` file names it, to tell when the project is gone.
    fn project_dir(&self, root: &Path) -> PathBuf {
        let key = hex::encode(Sha256::digest(root.as_os_str().as_encoded_bytes()));
        self.root.join("projects").join(&key[..16])
    }

    /// Marks the record `image_id` as used by this process's project (an empty file whose
    /// mtime is the last use; creating one needs no read-modify-write, so commands running at
    /// once cannot lose each other's marks). Best effort, as a lost mark costs a re-export
    /// after another project's prune, never a wrong image.
    fn mark_used(&self, image_id: &str) {
        self.mark("images", hex_of(image_id));
    }

    /// Notes in `projects/<key>/<kind>/<name>` that this project uses `name` (best effort: a
    /// mark that cannot be written only lets another project's prune take it).
    fn mark(&self, kind: &str, name: &str) {
        let marked = || -> std::io::Result<()> {
            let Some(dir) = self.own_folder(kind)? else {
                return Ok(());
            };
            fs_err::File::create(dir.join(name)).map(drop)
        };
        let _ = marked();
    }

    /// `projects/<key>/<kind>` of this process's project, made with the project's `root`
    /// file (without it another project's prune takes the folder for a gone project's);
    /// `None` without a project.
    fn own_folder(&self, kind: &str) -> std::io::Result<Option<PathBuf>> {
        let Some(project) = &self.project else {
            return Ok(None);
        };
        let dir = self.project_dir(project);
        fs_err::create_dir_all(dir.join(kind))?;
        if !dir.join("root").is_file() {
            write_atomically(&dir.join("root"), project.as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?;
        }
        Ok(Some(dir.join(kind)))
    }

    /// Writes `projects/<key>/<kind>/<name>`: a record a stage keeps for this project (best
    /// effort, as marks are; `false` when it could not be written).
    pub fn write_project_record(&self, kind: &str, name: &str, bytes: &[u8]) -> bool {
        let written = || -> std::io::Result<bool> {
            let Some(dir) = self.own_folder(kind)? else {
                return Ok(false);
            };
            write_atomically(&dir.join(name), bytes).map_err(std::io::Error::other)?;
            Ok(true)
        };
        written().unwrap_or(false)
    }

    /// The records `projects/<key>/<kind>/*` of this process's project, with their paths.
    pub fn project_records(&self, kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let Some(project) = &self.project else {
            return Vec::new();
        };
        let dir = self.project_dir(project).join(kind);
        let mut records: Vec<_> = fs_err::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            // Not a record being written (`write_atomically`'s temporary `.tmp*`).
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|entry| Some((entry.path(), fs_err::read(entry.path()).ok()?)))
            .collect();
        records.sort();
        records
    }

    fn sniff_compression(&self, digest: &str) -> Result<String> {
        let mut magic = [0u8; 4];
        let path = self.blob_path(digest);
        let mut file = fs_err::File::open(&path).map_err(|e| Error::io(&path, e))?;
        let n = file.read(&mut magic).map_err(|e| Error::io(&path, e))?;
        Ok(layer_media_type(&magic[..n]))
    }

    /// Removes every stored image and blob that neither this project's `keep` (the builder's
    /// ids of its current images) nor any other project still using the cache needs. This
    /// project's marks become exactly `keep`; another project's marks count while its root
    /// still holds `hallmark.toml` (a project that is gone is forgotten). Leftover temporary
    /// files go too: with the lock held exclusively, no command is writing. Returns the blobs
    /// removed and their bytes.
    pub fn prune(
        &self,
        keep: &[String],
        keep_compiled: &[String],
        keep_debs: &[String],
    ) -> Result<Pruned> {
        let project = match (&self.project, self.exclusive) {
            (Some(project), true) => project.clone(),
            _ => {
                return Err(Error::usage(
                    "prune needs the layer store's lock held exclusively (LayerStore::for_prune)",
                ));
            }
        };
        let hex = |id: &str| hex_of(id).to_string();
        let mut kept: HashSet<String> = keep.iter().map(|id| hex(id)).collect();
        let own = self.project_dir(&project);
        let _ = fs_err::remove_dir_all(own.join("images"));
        let _ = fs_err::remove_dir_all(own.join("compiled"));
        let _ = fs_err::remove_dir_all(own.join("debs"));
        let mut kept_compiled: HashSet<String> = keep_compiled.iter().cloned().collect();
        for checksum in keep_compiled {
            self.mark_compiled(checksum);
        }
        let mut kept_debs: HashSet<String> = keep_debs.iter().cloned().collect();
        for sha256 in keep_debs {
            self.mark_debs(sha256);
        }
        for id in keep {
            if self.parse_record(id).is_some() {
                self.mark_used(id);
            }
        }
        self.add_other_projects_marks(&own, &mut kept, &mut kept_compiled, &mut kept_debs);
        let mut used = HashSet::new();
        let images = self.root.join("images");
        for entry in fs_err::read_dir(&images).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = name.trim_end_matches(".json");
            // A kept record keeps whatever of its blobs the store holds (a normalised image's
            // own layers, before anything exported its parent's).
            match self.parse_record(id).filter(|_| kept.contains(id)) {
                Some(image) => {
                    used.insert(image.config.digest.clone());
                    used.extend(image.layers.iter().map(|l| l.blob.digest.clone()));
                }
                None if kept.contains(id) => {}
                None => {
                    fs_err::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?
                }
            }
        }
        let (mut removed, mut bytes, mut linked) = (0, 0, 0);
        let blobs = self.root.join("blobs/sha256");
        for entry in fs_err::read_dir(&blobs).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !Digest::from_hex(&name).is_some_and(|digest| used.contains(&digest)) {
                use std::os::unix::fs::MetadataExt;
                let (size, links) = entry.metadata().map_or((0, 1), |m| (m.len(), m.nlink()));
                bytes += size;
                // Hard-linked into the registry's storage: not freed until it lets go.
                if links > 1 {
                    linked += size;
                }
                fs_err::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
                removed += 1;
            }
        }
        let _ = fs_err::remove_dir_all(self.root.join("tmp"));
        let (compiled, compiled_bytes) = self.prune_compiled(&kept_compiled)?;
        let (debs, deb_bytes) = self.prune_debs(&kept_debs)?;
        Ok(Pruned {
            blobs: removed,
            blob_bytes: bytes,
            linked_bytes: linked,
            compiled,
            compiled_bytes,
            debs,
            deb_bytes,
        })
    }

    /// Adds to `images` and `compiled` what every other live project sharing the store marked
    /// as used; forgets the projects whose root no longer holds `hallmark.toml`.
    fn add_other_projects_marks(
        &self,
        own: &Path,
        images: &mut HashSet<String>,
        compiled: &mut HashSet<String>,
        debs: &mut HashSet<String>,
    ) {
        let names_in = |dir: PathBuf| {
            fs_err::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|marker| marker.file_name().to_string_lossy().into_owned())
        };
        for entry in fs_err::read_dir(self.root.join("projects"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = entry.path();
            if dir == own {
                continue;
            }
            let alive = fs_err::read(dir.join("root")).is_ok_and(|root| {
                Path::new(&*String::from_utf8_lossy(&root))
                    .join(crate::inputs::project::PROJECT_FILE)
                    .is_file()
            });
            if !alive {
                let _ = fs_err::remove_dir_all(&dir);
                continue;
            }
            images.extend(names_in(dir.join("images")));
            compiled.extend(names_in(dir.join("compiled")));
            debs.extend(names_in(dir.join("debs")));
        }
    }

    /// Removes the kept wheels of every compile stage not in `kept` (and leftovers of
    /// interrupted compiles): a stage no current spec of any project using the store has.
    fn prune_compiled(&self, kept: &HashSet<String>) -> Result<(usize, u64)> {
        let (mut removed, mut bytes) = (0, 0);
        let compiled = self.root.join("compiled");
        for entry in fs_err::read_dir(&compiled).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if kept.contains(&name) {
                continue;
            }
            bytes += walkdir::WalkDir::new(entry.path())
                .into_iter()
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum::<u64>();
            fs_err::remove_dir_all(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
            removed += 1;
        }
        Ok((removed, bytes))
    }

    /// Removes every apt package file (`debs/<sha256>`) no current spec of any project using
    /// the store pins.
    fn prune_debs(&self, kept: &HashSet<String>) -> Result<(usize, u64)> {
        let (mut removed, mut bytes) = (0, 0);
        for entry in fs_err::read_dir(self.root.join("debs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if kept.contains(&*entry.file_name().to_string_lossy()) {
                continue;
            }
            bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            fs_err::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
            removed += 1;
        }
        Ok((removed, bytes))
    }

    /// Notes that this project uses the apt package file with this sha256, so that a `prune`
    /// in another project sharing the store keeps it.
    pub fn mark_debs(&self, sha256: &str) {
        self.mark("debs", sha256);
    }

    /// Notes that this project uses the wheels kept for compile stage `checksum`, so that a
    /// `prune` in another project sharing the store keeps them.
    pub fn mark_compiled(&self, checksum: &str) {
        self.mark("compiled", checksum);
    }
}

/// The media type of a layer blob starting with `magic` (its first four bytes).
pub fn layer_media_type(magic: &[u8]) -> String {
    match magic {
        [0x1f, 0x8b, ..] => format!("{LAYER_TAR}+gzip"),
        [0x28, 0xb5, 0x2f, 0xfd] => format!("{LAYER_TAR}+zstd"),
        _ => LAYER_TAR.to_string(),
    }
}

/// An archive entry's name without `./`, `//` or `..` steps.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place: a reader
/// never sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
    tmp.write_all(bytes).map_err(|e| Error::io(path, e))?;
    // A temporary file is made 0600; what is written here is read by others (an SBOM, an
    // envelope, a package file), so as a plain file is.
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::io(path, e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// A blob being written into the store's temporary folder (see [`LayerStore::pending_blob`]).
pub struct PendingBlob {
    pub out: Hashing<std::io::BufWriter<tempfile::NamedTempFile>>,
}

impl PendingBlob {
    /// Keeps what was written under its digest; returns the digest and size.
    pub fn keep(self, store: &LayerStore) -> Result<(Digest, u64)> {
        let tmp_dir = store.root.join("tmp");
        let (mut inner, (digest, size)) = self.out.finish();
        inner.flush().map_err(|e| Error::io(&tmp_dir, e))?;
        let tmp = inner
            .into_inner()
            .map_err(|e| Error::io(&tmp_dir, e.into_error()))?;
        let target = store.blob_path(&digest);
        if !target.is_file() {
            let dir = target.parent().expect("blobs live in a folder");
            fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            tmp.persist(&target)
                .map_err(|e| Error::io(&target, e.error))?;
        }
        Ok((digest, size))
    }

    /// What was written, as a temporary file that goes when it is closed.
    pub fn into_file(self) -> std::io::Result<std::fs::File> {
        let (inner, _) = self.out.finish();
        let tmp = inner.into_inner().map_err(|e| e.into_error())?;
        // Unlinked now: the open file stays readable, and nothing is left behind.
        let (file, path) = tmp.into_parts();
        path.close()?;
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `(path, bytes)` regular files, plus symlinks `(path, target)`.
    fn archive(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, bytes) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            // Bypass the tar crate's own path checks: hostile archives do not use them.
            header.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, *bytes).unwrap();
        }
        for (path, target) in links {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, path, target).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn sha(bytes: &[u8]) -> String {
        Digest::of(bytes).to_string()
    }

    fn image_files(layer: &[u8]) -> (String, String) {
        let config = format!(
            r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
            sha(layer)
        );
        let manifest =
            r#"[{"Config":"config.json","RepoTags":["x:1"],"Layers":["layer/layer.tar"]}]"#
                .to_string();
        (config, manifest)
    }

    /// On a containerd-store builder the image id is the manifest digest: prune removed the
    /// record of every image it was asked to keep, and the next distribute exported again.
    /// A project folder (with its `hallmark.toml`) in `dir`.
    fn project(dir: &Path, name: &str) -> PathBuf {
        let root = dir.join(name);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join(crate::inputs::project::PROJECT_FILE), "").unwrap();
        root
    }

    /// Ingests and records an image of one layer, under a containerd-store id (not the
    /// config digest: the manifest's); returns the id.
    fn stored(store: &LayerStore, layer: &[u8]) -> String {
        let (config, manifest) = image_files(layer);
        let files = [
            ("layer/layer.tar", layer),
            ("config.json", config.as_bytes()),
            ("manifest.json", manifest.as_bytes()),
        ];
        let image = store.ingest(archive(&files, &[]).as_slice()).unwrap();
        let manifest_digest = sha(format!("manifest of {}", sha(layer)).as_bytes());
        store.remember(&manifest_digest, &image).unwrap();
        manifest_digest
    }

    fn prune(cache: &Path, project: &Path, keep: &[String]) {
        for_prune(cache, project).prune(keep, &[], &[]).unwrap();
    }

    /// The store for prune, once no other holds it. A fork another test thread makes while
    /// this test's store was open holds a copy of its lock's descriptor until that child
    /// execs (the same race as a script busy for writing, ETXTBSY): the lock is tried again,
    /// a millisecond apart, for up to 30 s (a loaded machine can keep a child from its exec
    /// for more than the second this first allowed), before the test fails.
    fn for_prune(cache: &Path, project: &Path) -> LayerStore {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Some(store) = LayerStore::for_prune(cache, project, false).unwrap() {
                return store;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("another store stayed open for 30 s");
    }

    #[test]
    fn compiled_wheels_stay_while_a_live_project_uses_them() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (project(dir.path(), "a"), project(dir.path(), "b"));
        let cache = dir.path().join("cache");
        let compiled = cache.join("store/compiled");
        for stage in ["used-by-a", "used-by-b", "used-by-none"] {
            std::fs::create_dir_all(compiled.join(stage)).unwrap();
            std::fs::write(compiled.join(stage).join("x.whl"), stage).unwrap();
        }
        LayerStore::open_for(&cache, Some(&a)).mark_compiled("used-by-a");
        let prune_in = |project: &Path, keep: &[String]| {
            for_prune(&cache, project).prune(&[], keep, &[]).unwrap()
        };
        let pruned = prune_in(&b, &["used-by-b".to_string()]);
        assert_eq!((pruned.compiled, pruned.compiled_bytes), (1, 12));
        assert!(compiled.join("used-by-a").is_dir());
        assert!(compiled.join("used-by-b").is_dir());
        assert!(!compiled.join("used-by-none").exists());
        // Project a is gone: what only it used goes at the next prune.
        std::fs::remove_file(a.join(crate::inputs::project::PROJECT_FILE)).unwrap();
        prune_in(&b, &["used-by-b".to_string()]);
        assert!(!compiled.join("used-by-a").exists());
        assert!(compiled.join("used-by-b").is_dir());
    }

    #[test]
    fn prune_keeps_the_record_of_an_image_kept_by_a_manifest_digest() {
        let dir = tempfile::tempdir().unwrap();
        let root = project(dir.path(), "p");
        let cache = dir.path().join("cache");
        let store = LayerStore::open_for(&cache, Some(&root));
        let (kept_layer, gone_layer) = (b"kept layer".as_slice(), b"gone layer".as_slice());
        let ids = [stored(&store, kept_layer), stored(&store, gone_layer)];
        drop(store);
        prune(&cache, &root, &ids[..1]);
        let store = LayerStore::open_for(&cache, Some(&root));
        let kept = store
            .image(&ids[0])
            .expect("the kept image's record and blobs stay");
        assert_eq!(kept.layers[0].diff_id, sha(kept_layer));
        assert!(store.image(&ids[1]).is_none());
        assert!(!store.blob_path(&sha(gone_layer)).exists());
    }

    /// Issue 14 item 10: `prune` kept only the current project's images, so it removed the
    /// layers of another project sharing the cache. A project's prune now keeps what any other
    /// project (still on disk) marks, and forgets a project that is gone.
    #[test]
    fn prune_in_one_project_keeps_what_another_project_uses() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (project(dir.path(), "a"), project(dir.path(), "b"));
        let cache = dir.path().join("cache");
        let b_id = stored(&LayerStore::open_for(&cache, Some(&b)), b"b's layer");
        let a_id = stored(&LayerStore::open_for(&cache, Some(&a)), b"a's old layer");
        prune(&cache, &a, &[]);
        let store = LayerStore::open_for(&cache, Some(&b));
        assert!(
            store.image(&b_id).is_some(),
            "b's image went with a's prune"
        );
        assert!(store.blob_path(&sha(b"b's layer")).is_file());
        assert!(store.image(&a_id).is_none(), "a's own unused image stays");
        assert!(!store.blob_path(&sha(b"a's old layer")).exists());
        drop(store);

        std::fs::remove_dir_all(&b).unwrap();
        prune(&cache, &a, &[]);
        assert!(
            LayerStore::open_for(&cache, Some(&a))
                .image(&b_id)
                .is_none()
        );
        assert!(cache.join("CACHEDIR.TAG").is_file());
    }

    /// Issue 14 item 10: the store had no lock: `prune` could remove a blob a command running
    /// at the same time had written and not yet recorded. While any command holds the store,
    /// prune cannot take it.
    #[test]
    fn prune_waits_for_a_command_using_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let root = project(dir.path(), "p");
        let cache = dir.path().join("cache");
        let store = LayerStore::open_for(&cache, Some(&root));
        let (in_flight, _) = store
            .add_blob(|out| out.write_all(b"not recorded yet"))
            .unwrap();
        assert!(
            LayerStore::for_prune(&cache, &root, false)
                .unwrap()
                .is_none(),
            "prune took a store another command holds"
        );
        assert!(store.blob_path(&in_flight).is_file());
        drop(store);
        prune(&cache, &root, &[]);
        assert!(!LayerStore::open(&cache).blob_path(&in_flight).exists());
    }

    #[test]
    fn a_docker_archive_lands_under_digests_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let layer = b"layer bytes";
        let (config, manifest) = image_files(layer);
        let bytes = archive(
            &[
                ("../../escape.txt", b"evil"),
                ("/abs.txt", b"evil"),
                ("layer/layer.tar", layer),
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
            ],
            &[],
        );
        let image = store.ingest(bytes.as_slice()).unwrap();
        assert_eq!(image.layers[0].diff_id, sha(layer));
        assert_eq!(image.layers[0].blob.media_type, LAYER_TAR);
        assert!(store.blob_path(&sha(layer)).is_file());
        // Nothing was written by an archive path, inside or outside the store.
        assert!(
            !dir.path().join("escape.txt").exists()
                && !dir.path().parent().unwrap().join("escape.txt").exists()
        );
        for entry in walkdir::WalkDir::new(dir.path()).into_iter().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(!name.contains("escape") && !name.contains("abs"), "{name}");
        }
    }

    #[test]
    fn a_manifest_naming_a_missing_layer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let (config, manifest) = image_files(b"never sent");
        let bytes = archive(
            &[
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
            ],
            &[],
        );
        let error = format!("{:?}", store.ingest(bytes.as_slice()).unwrap_err());
        assert!(
            error.contains("layer/layer.tar") && error.contains("not in the archive"),
            "{error}"
        );
    }

    #[test]
    fn a_name_written_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let layer = b"layer bytes";
        let (config, manifest) = image_files(layer);
        let bytes = archive(
            &[
                ("layer/layer.tar", layer),
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
                ("./layer/layer.tar", b"a second layer under the same name"),
            ],
            &[],
        );
        let error = store.ingest(bytes.as_slice()).unwrap_err().to_string();
        assert!(
            error.contains("entry `layer/layer.tar`: appears twice"),
            "{error}"
        );
    }

    #[test]
    fn a_layer_that_is_not_the_one_the_config_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let (config, manifest) = image_files(b"the layer the config names");
        let bytes = archive(
            &[
                ("layer/layer.tar", b"another layer"),
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
            ],
            &[],
        );
        let error = format!("{:?}", store.ingest(bytes.as_slice()).unwrap_err());
        assert!(error.contains("but the config names"), "{error}");
    }

    #[test]
    fn an_entry_longer_than_the_stream_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let mut bytes = archive(&[("layer/layer.tar", &[7u8; 4096])], &[]);
        // The header still says 4096 bytes; the stream ends after 100 of them.
        bytes.truncate(512 + 100);
        let error = store.ingest(bytes.as_slice()).unwrap_err().to_string();
        assert!(
            error.contains("the image archive, entry `layer/layer.tar`"),
            "{error}"
        );
        // Nothing half-written is left as a blob.
        let blobs = dir.path().join("store/blobs/sha256");
        assert!(!blobs.exists() || fs_err::read_dir(&blobs).unwrap().count() == 0);
    }

    #[test]
    fn a_blob_whose_name_lies_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let honest = b"honest";
        // The store already holds the blob the name claims; the archive's bytes differ.
        store.add_blob(|out| out.write_all(honest)).unwrap();
        let name = format!("blobs/sha256/{}", sha(honest).trim_start_matches("sha256:"));
        let bytes = archive(&[(&name, b"tampered")], &[]);
        let error = format!("{:?}", store.ingest(bytes.as_slice()).unwrap_err());
        assert!(error.contains("has digest"), "{error}");
    }

    #[test]
    fn links_resolve_inside_the_archive_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let layer = b"shared layer";
        let (config, _) = image_files(layer);
        let manifest = r#"[{"Config":"config.json","RepoTags":[],"Layers":["b/layer.tar"]}]"#;
        let bytes = archive(
            &[
                ("a/layer.tar", layer),
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
            ],
            &[("b/layer.tar", "../a/layer.tar")],
        );
        assert_eq!(
            store.ingest(bytes.as_slice()).unwrap().layers[0].diff_id,
            sha(layer)
        );
        let escaping = archive(
            &[
                ("config.json", config.as_bytes()),
                ("manifest.json", manifest.as_bytes()),
            ],
            &[("b/layer.tar", "../../../etc/passwd")],
        );
        let error = format!("{:?}", store.ingest(escaping.as_slice()).unwrap_err());
        assert!(error.contains("not in the archive"), "{error}");
    }
}
