//! The new layers read from the builder's containerd content store, instead of through its
//! export: Docker 25 and later on the containerd image store, on this machine. There every
//! blob of an image (its manifest, config and layers, the build's as the gzip blobs its
//! commit of each step wrote) is a file named by its digest,
//! `<containerd root>/io.containerd.content.v1.content/blobs/sha256/<hex>`. The engine's
//! export sends those same blobs, but through containerd's API and the engine, at 25-35 MB/s
//! on this machine (a 1 GiB layer: 32 s): reading the files takes what the disk takes, and
//! the parent's blobs need not be read at all.
//!
//! The files are put into an archive laid out as the engine's export (OCI blobs under their
//! digests, the new layers first, the parent's after them, `manifest.json` last), which the
//! export's reading ([`super::export::split`]) takes as it takes the engine's; so the bytes of
//! the result are the export's by construction.
//!
//! What is read is checked, not trusted: the manifest hashes to the image's id, the config's
//! diff IDs are the image's, and each new layer is taken only if it unpacks to its diff ID
//! (the reading hashes it). Where containerd keeps its root is found from the running
//! containerd processes (`--root`, or `root` in their `--config` file), the engine's own
//! (`<data root>/containerd/daemon`) and the default `/var/lib/containerd`: the first that
//! holds the manifest is the one. Anything else (a remote engine, an index for an image, a
//! blob hallmark cannot read) goes through the export.

use super::Unreadable;
use crate::engine::Engine;
use crate::engine::{ImageStore, Product};
use crate::oci::Digest;
use std::io::Read;
use std::path::{Path, PathBuf};

const BLOBS: &str = "io.containerd.content.v1.content/blobs/sha256";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The raw image's blobs as files of the builder's content store.
#[derive(Debug)]
pub struct Blobs {
    dir: PathBuf,
    /// Digest and size of the config, then of each layer, bottom first.
    config: (Digest, u64),
    layers: Vec<(Digest, u64)>,
    parent_layers: usize,
}

/// Finds the raw image `id` (layers `diff_ids`, the first `parent_layers` its parent's) in
/// the builder's content store on this machine, or says why it cannot be read there (`None`:
/// the builder is no containerd store on this machine, which the caller knows to say).
pub async fn locate(
    builder: &Engine,
    id: &str,
    diff_ids: &[Digest],
    parent_layers: usize,
) -> std::result::Result<Blobs, Option<Unreadable>> {
    if !builder.reach().is_local() {
        return Err(None);
    }
    let info = builder.info().await.map_err(|e| Some(e.into()))?;
    if builder.product() != Product::Docker || info.docker_store() != ImageStore::Containerd {
        return Err(None);
    }
    find(&info.docker_root_dir, id, diff_ids, parent_layers).map_err(Some)
}

fn find(
    docker_root: &str,
    id: &str,
    diff_ids: &[Digest],
    parent_layers: usize,
) -> std::result::Result<Blobs, Unreadable> {
    let id = Digest::try_from(id).map_err(|source| Unreadable::BadId {
        id: id.to_string(),
        source,
    })?;
    let roots = roots(Path::new(docker_root));
    let (dir, manifest) = roots
        .iter()
        .map(|root| root.join(BLOBS))
        .find_map(|dir| {
            let bytes = fs_err::read(dir.join(id.hex())).ok()?;
            (Digest::of(&bytes) == id).then_some((dir, bytes))
        })
        .ok_or_else(|| Unreadable::NoContentStore {
            id: id.clone(),
            looked: roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&manifest).map_err(|source| Unreadable::Manifest {
            id: id.clone(),
            source,
        })?;
    let media_type = manifest["mediaType"].as_str().unwrap_or(MANIFEST);
    if media_type != MANIFEST && media_type != DOCKER_MANIFEST {
        return Err(Unreadable::NotOneManifest {
            id,
            media_type: media_type.to_string(),
        });
    }
    let descriptor = |d: &serde_json::Value| {
        let digest = d["digest"].as_str().and_then(|s| Digest::try_from(s).ok());
        digest.zip(d["size"].as_u64())
    };
    let config =
        descriptor(&manifest["config"]).ok_or_else(|| Unreadable::NoConfig { id: id.clone() })?;
    let layers: Vec<(Digest, u64)> = manifest["layers"]
        .as_array()
        .map(|layers| layers.iter().filter_map(descriptor).collect())
        .unwrap_or_default();
    if layers.len() != diff_ids.len() {
        return Err(Unreadable::LayerCount {
            id,
            named: layers.len(),
            has: diff_ids.len(),
        });
    }
    let blobs = Blobs {
        dir,
        config,
        layers,
        parent_layers,
    };
    // Every file the archive will hold, there and of its size, before the reading starts.
    for (digest, size) in blobs.in_order() {
        let path = blobs.dir.join(digest.hex());
        let found = fs_err::metadata(&path)?;
        if found.len() != size {
            return Err(Unreadable::BlobSize { path, size });
        }
    }
    Ok(blobs)
}

impl Blobs {
    /// The blobs in the order the archive holds them: config, new layers, the parent's.
    fn in_order(&self) -> impl Iterator<Item = (&Digest, u64)> {
        let (new, parent) = (
            &self.layers[self.parent_layers..],
            &self.layers[..self.parent_layers],
        );
        std::iter::once(&self.config)
            .chain(new)
            .chain(parent)
            .map(|(d, s)| (d, *s))
    }

    /// The archive of the blobs, as the engine's export lays it out, read as it is made: the
    /// reading that stops once the new layers and config are in hand never opens the
    /// parent's files.
    pub fn archive(&self) -> impl Read + Send + use<> {
        let name = |digest: &Digest| format!("blobs/sha256/{}", digest.hex());
        let manifest = serde_json::json!([{
            "Config": name(&self.config.0),
            "RepoTags": null,
            "Layers": self.layers.iter().map(|(d, _)| name(d)).collect::<Vec<_>>(),
        }])
        .to_string()
        .into_bytes();
        let mut parts: Vec<Part> = self
            .in_order()
            .map(|(digest, size)| Part::File {
                name: name(digest),
                path: self.dir.join(digest.hex()),
                size,
            })
            .collect();
        parts.push(Part::Bytes {
            name: "manifest.json".into(),
            bytes: manifest,
        });
        Archive {
            parts: parts.into_iter(),
            current: Box::new(std::io::empty()),
        }
    }
}

/// One entry of the archive.
enum Part {
    File {
        name: String,
        path: PathBuf,
        size: u64,
    },
    Bytes {
        name: String,
        bytes: Vec<u8>,
    },
}

/// A tar stream made entry by entry as it is read, each file opened only when its turn
/// comes. Written here: the `tar` crate's builder writes into a writer, and this is read by
/// a reader, on the same thread.
struct Archive {
    parts: std::vec::IntoIter<Part>,
    current: Box<dyn Read + Send>,
}

impl Archive {
    fn next_part(&mut self) -> std::io::Result<bool> {
        let (name, size, content): (String, u64, Box<dyn Read + Send>) = match self.parts.next() {
            None => return Ok(false),
            Some(Part::Bytes { name, bytes }) => (
                name,
                bytes.len() as u64,
                Box::new(std::io::Cursor::new(bytes)),
            ),
            Some(Part::File { name, path, size }) => {
                // fs_err's message names the path.
                let file = fs_err::File::open(&path)?.into_parts().0;
                // Exactly the size the header gives, whatever the file became since.
                (name, size, Box::new(Exactly::new(file, size, path)))
            }
        };
        let mut header = tar::Header::new_ustar();
        header.set_path(&name)?;
        header.set_size(size);
        header.set_mode(0o444);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let padding = (512 - size % 512) % 512;
        // The archive's end (two zero blocks) after the last entry.
        let trailer = if self.parts.len() == 0 { 1024 } else { 0 };
        self.current = Box::new(
            std::io::Cursor::new(header.as_bytes().to_vec())
                .chain(content)
                .chain(std::io::repeat(0).take(padding + trailer)),
        );
        Ok(true)
    }
}

impl Read for Archive {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.current.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            if !self.next_part()? {
                return Ok(0);
            }
        }
    }
}

/// A file read as exactly `size` bytes: shorter is an error naming it (a blob cannot change;
/// if its file did, the archive must not silently go wrong).
struct Exactly {
    file: std::io::Take<std::fs::File>,
    left: u64,
    path: PathBuf,
}

impl Exactly {
    fn new(file: std::fs::File, size: u64, path: PathBuf) -> Exactly {
        Exactly {
            file: file.take(size),
            left: size,
            path,
        }
    }
}

impl Read for Exactly {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} ended {} bytes short", self.path.display(), self.left),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The roots a containerd on this machine may keep its content in: those the running
/// containerd processes name, the engine's own containerd's, the default.
fn roots(docker_root: &Path) -> Vec<PathBuf> {
    let mut roots = running_roots();
    roots.push(docker_root.join("containerd/daemon"));
    roots.push(PathBuf::from("/var/lib/containerd"));
    let mut seen = std::collections::HashSet::new();
    roots.retain(|r| seen.insert(r.clone()));
    roots
}

/// The roots the running containerd processes were given: `--root`, or `root` in the file
/// of `--config`.
fn running_roots() -> Vec<PathBuf> {
    let Ok(procs) = fs_err::read_dir("/proc") else {
        return Vec::new();
    };
    let mut roots = Vec::new();
    for proc in procs.flatten() {
        let Ok(cmdline) = fs_err::read(proc.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_containerd = args
            .first()
            .and_then(|a| Path::new(a).file_name())
            .is_some_and(|n| n == "containerd");
        if is_containerd {
            roots.extend(root_of(&args));
        }
    }
    roots
}

/// The root a containerd command line gives, if any.
fn root_of(args: &[String]) -> Option<PathBuf> {
    let value = |flags: &[&str]| {
        args.iter().enumerate().find_map(|(i, arg)| {
            flags.iter().find_map(|flag| {
                let long = format!("{flag}=");
                match arg.strip_prefix(&long) {
                    Some(v) => Some(v.to_string()),
                    None if arg == flag => args.get(i + 1).cloned(),
                    None => None,
                }
            })
        })
    };
    if let Some(root) = value(&["--root", "-root"]) {
        return Some(PathBuf::from(root));
    }
    let config = value(&["--config", "-config", "-c"])?;
    let text = fs_err::read_to_string(config).ok()?;
    let table: toml::Table = toml::from_str(&text).ok()?;
    table.get("root")?.as_str().map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_root_is_read_from_the_flag_or_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("containerd.toml");
        std::fs::write(
            &config,
            "version = 2\nroot = \"/srv/ctd\"\n[grpc]\naddress = \"x\"\n",
        )
        .unwrap();
        let with_config = format!("containerd --config {}", config.display());
        assert_eq!(root_of(&args(&with_config)), Some("/srv/ctd".into()));
        let flag = "containerd --root=/a --config /nowhere";
        assert_eq!(root_of(&args(flag)), Some("/a".into()));
        assert_eq!(root_of(&args("containerd --root /b")), Some("/b".into()));
        assert_eq!(root_of(&args("containerd")), None);
    }

    #[test]
    fn the_blobs_are_found_by_the_manifest_and_checked_before_any_is_read() {
        let docker_root = tempfile::tempdir().unwrap();
        let dir = docker_root.path().join("containerd/daemon").join(BLOBS);
        std::fs::create_dir_all(&dir).unwrap();
        let blob = |bytes: &[u8]| {
            let digest = Digest::of(bytes);
            std::fs::write(dir.join(digest.hex()), bytes).unwrap();
            (digest, bytes.len())
        };
        let config = blob(b"{}");
        let (parent, new) = (blob(b"parent layer"), blob(b"new layer"));
        let descriptor =
            |(d, s): &(Digest, usize)| serde_json::json!({"digest": d.to_string(), "size": s});
        let manifest = serde_json::json!({
            "mediaType": MANIFEST,
            "config": descriptor(&config),
            "layers": [descriptor(&parent), descriptor(&new)],
        });
        let id = blob(manifest.to_string().as_bytes()).0;
        let root = docker_root.path().to_str().unwrap();
        let diff_ids = [parent.0.clone(), new.0.clone()];
        let found = find(root, id.as_str(), &diff_ids, 1).unwrap();
        assert_eq!(found.dir, dir);
        assert_eq!(found.layers.len(), 2);

        // Not the image's layers, not there, not the image.
        let wrong = find(root, id.as_str(), &diff_ids[..1], 1).unwrap_err();
        assert!(
            wrong
                .to_string()
                .contains("names 2 layers, the image has 1"),
            "{wrong}"
        );
        let other = Digest::of(b"another image");
        let absent = find(root, other.as_str(), &diff_ids, 1).unwrap_err();
        assert!(
            absent.to_string().contains("no containerd content store"),
            "{absent}"
        );
        std::fs::write(dir.join(other.hex()), manifest.to_string()).unwrap();
        let forged = find(root, other.as_str(), &diff_ids, 1).unwrap_err();
        assert!(
            forged.to_string().contains("no containerd content store"),
            "{forged}"
        );
        std::fs::remove_file(dir.join(new.0.hex())).unwrap();
        let missing = find(root, id.as_str(), &diff_ids, 1).unwrap_err();
        assert!(missing.to_string().contains(new.0.hex()), "{missing}");
    }

    #[test]
    fn the_archive_lays_out_the_blobs_as_an_export_and_reads_files_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let blob = |bytes: &[u8]| {
            let digest = Digest::of(bytes);
            std::fs::write(dir.path().join(digest.hex()), bytes).unwrap();
            (digest, bytes.len() as u64)
        };
        let config = blob(b"{\"rootfs\":{}}");
        let parent = blob(&[1u8; 1000]);
        let new = blob(&[2u8; 513]);
        let blobs = Blobs {
            dir: dir.path().to_path_buf(),
            config: config.clone(),
            layers: vec![parent.clone(), new.clone()],
            parent_layers: 1,
        };
        let mut archive = tar::Archive::new(blobs.archive());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            seen.push((name, bytes));
        }
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        let blob_name = |d: &Digest| format!("blobs/sha256/{}", d.hex());
        assert_eq!(
            names,
            [
                blob_name(&config.0).as_str(),
                blob_name(&new.0).as_str(),
                blob_name(&parent.0).as_str(),
                "manifest.json"
            ]
        );
        assert_eq!(seen[1].1, vec![2u8; 513]);
        let manifest: serde_json::Value = serde_json::from_slice(&seen[3].1).unwrap();
        assert_eq!(manifest[0]["Layers"][1], blob_name(&new.0));

        // A blob file that shrank since it was found fails the reading, naming it.
        std::fs::write(dir.path().join(new.0.hex()), [2u8; 10]).unwrap();
        let blobs = Blobs {
            dir: dir.path().to_path_buf(),
            config,
            layers: vec![parent, new.clone()],
            parent_layers: 1,
        };
        let mut out = Vec::new();
        let failed = blobs.archive().read_to_end(&mut out).unwrap_err();
        assert!(failed.to_string().contains(new.0.hex()), "{failed}");
    }
}
