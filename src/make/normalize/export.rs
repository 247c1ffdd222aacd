//! The builder's export of a raw image, read once as it arrives: the parent's layers are
//! recognised and passed over (read from the stream, written nowhere), the config kept in
//! memory, and each layer the build added rewritten as it streams in when its name shows it
//! is new (what the streaming rewrite refuses, and a layer not known new by its name, goes
//! into an unnamed temporary file, which the sorting rewrite takes).
//!
//! How a parent's layer is recognised before its bytes are read: an OCI-layout export
//! (Docker 25 and later, both image stores) names each blob by its digest, which for an
//! uncompressed layer is its diff ID, and the store's record of the parent names its blobs
//! (compressed ones included). Docker 20.10 names layers `<v1 id>/layer.tar`; for every layer
//! but the image's last that id is a digest of the layer's chain ID and the id below it alone
//! ([`legacy_ids`]), so the parent's layers are known by name too, and a layer under another
//! name is new once a layer's `json` (which comes before its `layer.tar`) shows the engine
//! names layers so. Until then, a layer whose size is that of one of the parent's layers (the
//! parent's record knows them) is hashed as it passes, written nowhere; should it be a new
//! layer after all
//! (the same size, other bytes), the export is read again with that layer spooled
//! ([`Failure::Collision`]). Without a record of the parent, its layers are spooled and hashed
//! like new ones, then dropped.

use crate::error::Error;
use crate::images::store::{self, Blob, LAYER_TAR, LayerStore, StoredImage, StoredLayer};
use crate::oci::archive::DockerManifest;
use crate::oci::{Digest, Hashing};
use std::collections::{HashMap, HashSet};
use std::io::Read;

/// Entries up to this size are kept in memory whole (configs, manifests, tiny layers).
const SMALL: u64 = 1 << 20;

/// The zero `container_config` Docker 20.10 writes into each legacy layer's v1 JSON, as Go's
/// encoder writes it (field order, `null`s): part of what its layer ids are a digest of.
const ZERO_CONTAINER_CONFIG: &str = concat!(
    r#"{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"#,
    r#""AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,"#,
    r#""Cmd":null,"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,"#,
    r#""OnBuild":null,"Labels":null}"#
);

/// The v1 ids Docker 20.10's `docker save` gives the layers of an image with `diff_ids` (it
/// writes each as `<id hex>/layer.tar`), for every layer but the last (whose id digests the
/// image's config too).
/// moby's `v1.CreateID`: the sha256 of the JSON object, keys sorted, of the zero container
/// config, the epoch as `created`, the chain ID as `layer_id` and the id below as `parent`.
/// Written by hand: no crate computes these legacy ids.
pub fn legacy_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut ids = Vec::new();
    let mut chain: Option<Digest> = None;
    let mut parent: Option<Digest> = None;
    for diff_id in diff_ids.iter().take(diff_ids.len().saturating_sub(1)) {
        let layer_id = match &chain {
            None => diff_id.clone(),
            Some(below) => Digest::of(format!("{below} {diff_id}")),
        };
        let parent_field = parent
            .as_ref()
            .map_or(String::new(), |p| format!(r#","parent":"{p}""#));
        let v1 = format!(
            r#"{{"container_config":{ZERO_CONTAINER_CONFIG},"created":"1970-01-01T00:00:00Z","layer_id":"{layer_id}"{parent_field}}}"#
        );
        let id = Digest::of(v1);
        ids.push(id.clone());
        chain = Some(layer_id);
        parent = Some(id);
    }
    ids
}

/// What the reading knows beforehand.
pub struct Plan {
    /// The raw image's layers, from the builder's inspect.
    pub diff_ids: Vec<Digest>,
    pub parent_layers: usize,
    /// The store's record of the parent, if it has one.
    pub parent: Option<StoredImage>,
    /// Archive entries to spool whatever their size (a size matched a parent's layer, the
    /// content did not).
    pub spool: HashSet<String>,
}

impl Plan {
    /// Digests whose blob is one of the parent's layers and none of the new ones.
    fn passed_over(&self) -> HashSet<Digest> {
        let new: HashSet<&Digest> = self.diff_ids[self.parent_layers..].iter().collect();
        let mut parent: HashSet<Digest> = self.diff_ids[..self.parent_layers]
            .iter()
            .cloned()
            .collect();
        if let Some(record) = self.parent_record() {
            parent.extend(record.iter().map(|l| l.blob.digest.clone()));
        }
        parent.retain(|d| !new.contains(d));
        parent
    }

    /// The parent record's layers, if they are the raw image's first layers.
    pub fn parent_record(&self) -> Option<&[StoredLayer]> {
        let record = self.parent.as_ref()?;
        let same = record.layers.len() == self.parent_layers
            && record
                .layers
                .iter()
                .zip(&self.diff_ids)
                .all(|(l, d)| l.diff_id == *d);
        same.then_some(record.layers.as_slice())
    }

    fn parent_sizes(&self) -> HashSet<u64> {
        let record = self.parent_record().unwrap_or_default();
        record
            .iter()
            .filter(|l| l.blob.media_type == LAYER_TAR)
            .map(|l| l.blob.size)
            .collect()
    }
}

/// A new layer as the export gave it, by its diff ID.
pub struct New {
    pub diff_id: Digest,
    pub taken: Taken,
}

/// How a new layer was taken from the export.
pub enum Taken {
    /// Rewritten as it streamed in, into the store; `loaded` when it went into the builder's
    /// load as it was written.
    Rewritten { layer: StoredLayer, loaded: bool },
    /// In a temporary file, for the sorting rewrite: the layer as it came, or, when the
    /// streaming rewrite refused it, its entries in canonical form out of order.
    Spooled(std::fs::File),
}

/// Rewrites a new layer as its unpacked bytes stream in (normalisation's in-order rewrite),
/// given those bytes, the export's size for the layer and whether it may go into the load as
/// it is written (no other layer is on its way there).
pub type Rewrite<'a> =
    &'a mut (dyn FnMut(&mut dyn Read, u64, bool) -> std::io::Result<Taken> + Send);

/// What the export held besides the new layers.
pub struct Split {
    pub config: serde_json::Value,
    /// Every layer as the builder names its blob (the parent's are not in the store), or
    /// only the parent's, from the store's record of it, when the reading stopped early.
    pub layers: Vec<StoredLayer>,
}

pub enum Failure {
    /// The entry had the size of a parent's layer and other content: read again, spooling it.
    Collision(String),
    Error(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Error(e)
    }
}

/// One regular entry of the export: its blob's digest, size and media type, and its bytes if
/// small.
struct Entry {
    blob: Blob,
    small: Option<Vec<u8>>,
}

struct Reading<'a> {
    plan: &'a Plan,
    store: &'a LayerStore,
    passed_over: HashSet<Digest>,
    /// The parent's layers by the names Docker 20.10 gives them ([`legacy_ids`]).
    legacy_parent: HashMap<String, Digest>,
    /// Every layer's Docker 20.10 id but the last's (hex), and whether an entry of this
    /// export showed one: then a layer under another name is no parent's.
    legacy_ids: HashSet<String>,
    legacy_names_hold: bool,
    parent_sizes: HashSet<u64>,
    new: &'a std::sync::mpsc::Sender<New>,
    rewrite: Rewrite<'a>,
    /// Whether a layer may go into the load as it streams: nothing handed on so far is to be
    /// sent there by the rewrite's thread (the two would interleave their bytes).
    load_free: bool,
    sent: HashSet<Digest>,
    /// The new layers to hand on, and small entries already handed on.
    wanted: HashSet<Digest>,
    handed_small: HashSet<String>,
    /// The image's config, once an entry was it (its diff IDs are the image's).
    config: Option<serde_json::Value>,
}

impl<'a> Reading<'a> {
    /// A reading of the export of `plan`'s image: the parent's layers named as the legacy
    /// layout names them, the new ones wanted.
    fn new(
        plan: &'a Plan,
        store: &'a LayerStore,
        new: &'a std::sync::mpsc::Sender<New>,
        rewrite: Rewrite<'a>,
    ) -> Reading<'a> {
        let passed_over = plan.passed_over();
        let legacy = legacy_ids(&plan.diff_ids);
        Reading {
            plan,
            store,
            legacy_parent: legacy
                .iter()
                .zip(&plan.diff_ids[..plan.parent_layers])
                .map(|(id, diff_id)| (format!("{}/layer.tar", id.hex()), diff_id.clone()))
                .collect(),
            legacy_ids: legacy.iter().map(|id| id.hex().to_string()).collect(),
            legacy_names_hold: false,
            parent_sizes: plan.parent_sizes(),
            new,
            rewrite,
            load_free: true,
            sent: HashSet::new(),
            wanted: plan.diff_ids[plan.parent_layers..]
                .iter()
                .filter(|d| !passed_over.contains(*d))
                .cloned()
                .collect(),
            handed_small: HashSet::new(),
            config: None,
            passed_over,
        }
    }
}

/// Reads the export `archive`, sending each new layer on `new` as soon as it is read: one
/// known new by its name is rewritten as it streams (`rewrite`), the others spooled.
pub fn split<'a>(
    plan: &'a Plan,
    store: &'a LayerStore,
    archive: impl Read,
    new: &'a std::sync::mpsc::Sender<New>,
    rewrite: Rewrite<'a>,
) -> std::result::Result<Split, Failure> {
    let mut reading = Reading::new(plan, store, new, rewrite);
    let invalid = |entry: Option<&str>, message: String| Error::Archive {
        archive: "the builder's export of the built image".into(),
        entry: entry.map(str::to_string),
        message,
    };
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut links: Vec<(String, String)> = Vec::new();
    let mut archive = tar::Archive::new(archive);
    for entry in archive
        .entries()
        .map_err(|e| invalid(None, e.to_string()))?
    {
        let mut entry = entry.map_err(|e| invalid(None, e.to_string()))?;
        let path = store::normalize(&String::from_utf8_lossy(&entry.path_bytes()));
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link) {
            let target = entry.link_name().ok().flatten().unwrap_or_default();
            let base = match kind {
                tar::EntryType::Symlink => path.rsplit_once('/').map_or("", |(d, _)| d),
                _ => "",
            };
            let target = store::normalize(&format!("{base}/{}", target.display()));
            links.push((path, target));
            continue;
        }
        if !matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
            continue;
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| invalid(Some(&path), e.to_string()))?;
        let read = reading
            .entry(&path, size, &mut entry)
            .map_err(|e| match e {
                Failure::Error(Error::Io { source, .. }) => {
                    Failure::Error(invalid(Some(&path), source.to_string()))
                }
                other => other,
            })?;
        entries.insert(path, read);
        if let Some(early) = reading.all_in_hand() {
            return Ok(early);
        }
    }
    for (path, target) in links {
        if let Some(entry) = entries.get(&target) {
            let copy = Entry {
                blob: entry.blob.clone(),
                small: entry.small.clone(),
            };
            entries.insert(path, copy);
        }
    }
    reading.finish(&entries)
}

impl Reading<'_> {
    /// Reads one regular entry of `size` bytes.
    fn entry(
        &mut self,
        path: &str,
        size: u64,
        data: &mut impl Read,
    ) -> std::result::Result<Entry, Failure> {
        let io = |e: std::io::Error| Error::io(path, e);
        if size <= SMALL {
            let mut bytes = Vec::with_capacity(size as usize);
            data.read_to_end(&mut bytes).map_err(io)?;
            if path.ends_with("/json") && !self.legacy_names_hold {
                self.legacy_names_hold = self.names_a_known_layer(&bytes);
            }
            self.small_entry(path, &bytes).map_err(io)?;
            let blob = blob(Digest::of(&bytes), size, &bytes);
            return Ok(Entry {
                blob,
                small: Some(bytes),
            });
        }
        if let Some(digest) = self.parents_by_name(path) {
            // A parent's layer: only its first bytes are looked at (for its media type).
            let mut magic = [0u8; 4];
            data.read_exact(&mut magic).map_err(io)?;
            std::io::copy(data, &mut std::io::sink()).map_err(io)?;
            return Ok(Entry {
                blob: blob(digest, size, &magic),
                small: None,
            });
        }
        let legacy_layer = path.ends_with("/layer.tar") && !self.plan.spool.contains(path);
        if legacy_layer && !self.legacy_names_hold && self.parent_sizes.contains(&size) {
            let (digest, _) = Digest::of_reader(data).map_err(io)?;
            if !self.passed_over.contains(&digest) {
                return Err(Failure::Collision(path.to_string()));
            }
            let blob = blob(digest, size, b"");
            return Ok(Entry { blob, small: None });
        }
        let rewrite = self.known_new(path);
        let (blob, new) = self.spool(data, rewrite.then_some(size)).map_err(io)?;
        self.hand_on(new);
        Ok(Entry { blob, small: None })
    }

    /// The parent's layer `path` names, if its name says so: an OCI blob name, or a Docker
    /// 20.10 name [`legacy_ids`] computed.
    fn parents_by_name(&self, path: &str) -> Option<Digest> {
        path.strip_prefix("blobs/sha256/")
            .and_then(Digest::from_hex)
            .filter(|d| self.passed_over.contains(d))
            .or_else(|| self.legacy_parent.get(path).cloned())
    }

    /// The split, if every new layer is handed on and the config is in hand, and the parent's
    /// layers are known from the store's record, uncompressed: the rest of the export is the parent's
    /// layers and the archive's indexes, which this normalisation needs none of. Dropping
    /// the export there saves reading it (a 16 MiB layer on a 2 GiB parent need not wait for
    /// parent bytes that come after it).
    fn all_in_hand(&mut self) -> Option<Split> {
        if self.sent.len() < self.wanted.len() {
            return None;
        }
        // Only uncompressed blobs (the digest the diff ID): an engine names those alike,
        // while a compressed blob's digest in the record may not be the builder's.
        let parent = self.plan.parent_record()?;
        if !parent.iter().all(|l| l.blob.digest == l.diff_id) {
            return None;
        }
        let parent = parent.to_vec();
        let config = self.config.take()?;
        Some(Split {
            config,
            layers: parent,
        })
    }

    /// A small entry: the config, if its diff IDs are the image's; a new layer (a legacy
    /// `layer.tar` or a blob that is no JSON), handed on now.
    fn small_entry(&mut self, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.first() == Some(&b'{') {
            if self.config.is_none()
                && let Ok(config) = serde_json::from_slice::<serde_json::Value>(bytes)
                && self.is_the_config(&config)
            {
                self.config = Some(config);
            }
            return Ok(());
        }
        let layer = path.ends_with("/layer.tar") || path.starts_with("blobs/sha256/");
        if layer && self.parents_by_name(path).is_none() && self.sent.len() < self.wanted.len() {
            let rewrite = self.known_new(path).then_some(bytes.len() as u64);
            let (_, spooled) = self.spool(&mut &bytes[..], rewrite)?;
            if self.wanted.contains(&spooled.diff_id) {
                self.handed_small.insert(path.to_string());
                self.hand_on(spooled);
            }
        }
        Ok(())
    }

    /// Whether `config` is an image config with the image's diff IDs.
    fn is_the_config(&self, config: &serde_json::Value) -> bool {
        let Some(ids) = config["rootfs"]["diff_ids"].as_array() else {
            return false;
        };
        ids.len() == self.plan.diff_ids.len()
            && ids
                .iter()
                .zip(&self.plan.diff_ids)
                .all(|(id, d)| id.as_str() == Some(d.as_str()))
    }

    /// Whether a legacy layer's v1 JSON names, as its own id or its parent's, an id
    /// [`legacy_ids`] computed: the engine names layers as Docker 20.10 does.
    fn names_a_known_layer(&self, json: &[u8]) -> bool {
        let Ok(v1) = serde_json::from_slice::<serde_json::Value>(json) else {
            return false;
        };
        ["id", "parent"]
            .iter()
            .filter_map(|key| v1[key].as_str())
            .any(|id| self.legacy_ids.contains(id))
    }

    /// Whether the layer at `path`, which is no parent's by its name, is known to be new
    /// before its bytes are read (else it may be a parent's, told only by its digest, and is
    /// not rewritten as it streams: that would write a parent's layer into the store).
    fn known_new(&self, path: &str) -> bool {
        if self.sent.len() >= self.wanted.len() {
            return false;
        }
        if path.ends_with("/layer.tar") {
            return self.legacy_names_hold || self.plan.parent_layers == 0;
        }
        // An OCI layout names blobs by digest: the parent's are known when the record holds
        // them uncompressed (as every engine names them), or there is no parent.
        path.starts_with("blobs/sha256/")
            && (self.plan.parent_layers == 0
                || self
                    .plan
                    .parent_record()
                    .is_some_and(|record| record.iter().all(|l| l.blob.digest == l.diff_id)))
    }

    /// Unpacks a layer blob into a temporary file, hashing it as it is and as unpacked; with
    /// `rewrite` (the export's size for it), it is rewritten as it streams instead.
    fn spool(
        &mut self,
        data: &mut impl Read,
        rewrite: Option<u64>,
    ) -> std::io::Result<(Blob, New)> {
        let mut magic = [0u8; 4];
        data.read_exact(&mut magic)?;
        let media_type = store::layer_media_type(&magic);
        let mut raw = Hashing::new(std::io::Read::chain(&magic[..], data));
        let (unpacked_id, taken) = match media_type.rsplit_once('+') {
            // Uncompressed, the blob is the layer: hashed once, as it is read.
            None => (None, self.take(&mut raw, rewrite)?),
            Some((_, "gzip")) => {
                let gz = flate2::read::GzDecoder::new(std::io::BufReader::new(&mut raw));
                let mut unpacked = Hashing::new(gz);
                let taken = self.take(&mut unpacked, rewrite)?;
                let (gz, (diff_id, _)) = unpacked.finish();
                // The rest of the entry (gzip padding, if any) is part of the blob.
                std::io::copy(&mut gz.into_inner(), &mut std::io::sink())?;
                (Some(diff_id), taken)
            }
            Some((_, compression)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("an {compression}-compressed layer, which hallmark cannot read yet"),
                ));
            }
        };
        let (_, (digest, size)) = raw.finish();
        let diff_id = unpacked_id.unwrap_or_else(|| digest.clone());
        let blob = Blob {
            digest,
            size,
            media_type,
        };
        Ok((blob, New { diff_id, taken }))
    }

    /// Reads the unpacked layer `layer` to its end: rewritten as it passes when asked
    /// (`rewrite`: the export's size for it), else copied into a temporary file.
    fn take(&mut self, layer: &mut dyn Read, rewrite: Option<u64>) -> std::io::Result<Taken> {
        let taken = match rewrite {
            Some(size) => (self.rewrite)(layer, size, self.load_free)?,
            None => {
                let tmp_dir = self.store.root.join("tmp");
                fs_err::create_dir_all(&tmp_dir)?;
                let file = tempfile::tempfile_in(&tmp_dir)?;
                let mut spool = std::io::BufWriter::with_capacity(256 * 1024, file);
                std::io::copy(layer, &mut spool)?;
                Taken::Spooled(spool.into_inner().map_err(|e| e.into_error())?)
            }
        };
        // What the rewrite did not read: the archive's trailing blocks.
        std::io::copy(layer, &mut std::io::sink())?;
        Ok(taken)
    }

    /// Hands a new layer to the rewrite, unless it is one of the parent's.
    fn hand_on(&mut self, new: New) {
        let wanted = !self.passed_over.contains(&new.diff_id)
            && self.plan.diff_ids[self.plan.parent_layers..].contains(&new.diff_id);
        if wanted && self.sent.insert(new.diff_id.clone()) {
            // What the rewrite's thread sends to the load from now on comes between any
            // layer streamed from here.
            if !matches!(new.taken, Taken::Rewritten { loaded: true, .. }) {
                self.load_free = false;
            }
            // The rewrite having stopped (it failed), its error is the one reported.
            let _ = self.new.send(new);
        }
    }

    /// The config and the layers `manifest.json` names; new layers small enough to have been
    /// kept in memory are handed on now.
    fn finish(mut self, entries: &HashMap<String, Entry>) -> std::result::Result<Split, Failure> {
        let invalid = |entry: &str, message: String| Error::Archive {
            archive: "the builder's export of the built image".into(),
            entry: Some(entry.to_string()),
            message,
        };
        let small = |path: &str| {
            entries
                .get(path)
                .and_then(|e| e.small.as_deref())
                .ok_or_else(|| invalid(path, "is named but not in the archive".into()))
        };
        let manifests: Vec<DockerManifest> = serde_json::from_slice(small("manifest.json")?)
            .map_err(|e| invalid("manifest.json", e.to_string()))?;
        let [manifest] = manifests.as_slice() else {
            return Err(invalid("manifest.json", "expected one image".into()).into());
        };
        let config_path = store::normalize(&manifest.config);
        let config: serde_json::Value = serde_json::from_slice(small(&config_path)?)
            .map_err(|e| invalid(&config_path, format!("image config: {e}")))?;
        let diff_ids = config["rootfs"]["diff_ids"].as_array().map(|ids| {
            ids.iter()
                .filter_map(|d| d.as_str().and_then(|d| Digest::try_from(d).ok()))
                .collect::<Vec<_>>()
        });
        if diff_ids.as_ref() != Some(&self.plan.diff_ids)
            || manifest.layers.len() != self.plan.diff_ids.len()
        {
            return Err(invalid(
                &config_path,
                "not the image inspected: it moved during the export".into(),
            )
            .into());
        }
        let mut layers = Vec::new();
        for (i, (diff_id, path)) in self.plan.diff_ids.iter().zip(&manifest.layers).enumerate() {
            let path = store::normalize(path);
            let entry = entries
                .get(&path)
                .ok_or_else(|| invalid(&path, "is named but not in the archive".into()))?;
            if let Some(bytes) = entry
                .small
                .as_ref()
                .filter(|_| i >= self.plan.parent_layers && !self.handed_small.contains(&path))
            {
                let (_, spooled) = self
                    .spool(&mut bytes.as_slice(), None)
                    .map_err(|e| invalid(&path, e.to_string()))?;
                self.hand_on(spooled);
            }
            let mut blob = entry.blob.clone();
            if blob.digest == *diff_id {
                blob.media_type = LAYER_TAR.into();
            }
            layers.push(StoredLayer {
                diff_id: diff_id.clone(),
                blob,
            });
        }
        Ok(Split { config, layers })
    }
}

/// A blob's descriptor from its digest, size and first bytes.
fn blob(digest: Digest, size: u64, magic: &[u8]) -> Blob {
    Blob {
        digest,
        size,
        media_type: store::layer_media_type(&magic[..magic.len().min(4)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer tar over the small-entry bound: one file of `fill` bytes.
    fn layer(fill: u8) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(3 << 19);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, "big", &vec![fill; 3 << 19][..])
            .unwrap();
        tar.into_inner().unwrap()
    }

    /// An export holding `files` in that order, `manifest.json` last.
    fn export(files: &[(&str, &[u8])], config: &str, layers: &[&str]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let manifest = serde_json::json!([{"Config": config, "RepoTags": null, "Layers": layers}]);
        let manifest = manifest.to_string();
        for (name, bytes) in files
            .iter()
            .copied()
            .chain([("manifest.json", manifest.as_bytes())])
        {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, bytes).unwrap();
        }
        tar.into_inner().unwrap()
    }

    fn config(diff_ids: &[&Digest]) -> Vec<u8> {
        serde_json::json!({"rootfs": {"type": "layers", "diff_ids": diff_ids}})
            .to_string()
            .into_bytes()
    }

    /// A rewrite that refuses every layer, kept as it came.
    fn spool_only(layer: &mut dyn Read, _: u64, _: bool) -> std::io::Result<Taken> {
        let mut file = tempfile::tempfile()?;
        std::io::copy(layer, &mut file)?;
        Ok(Taken::Spooled(file))
    }

    /// The diff ids `split` handed on as new.
    fn handed_on(plan: &Plan, archive: &[u8]) -> std::result::Result<Vec<Digest>, String> {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open_for(dir.path(), None);
        let (sender, receiver) = std::sync::mpsc::channel();
        match split(plan, &store, archive, &sender, &mut spool_only) {
            // Every layer, or the parent's when the reading stopped early.
            Ok(split) => assert!(
                [plan.diff_ids.len(), plan.parent_layers].contains(&split.layers.len()),
                "{}",
                split.layers.len()
            ),
            Err(Failure::Collision(path)) => return Err(path),
            Err(Failure::Error(e)) => panic!("{}", e.render()),
        }
        drop(sender);
        Ok(receiver.into_iter().map(|s| s.diff_id).collect())
    }

    fn plan(parent: &[u8], new: &[u8], record: bool) -> Plan {
        let (p, n) = (Digest::of(parent), Digest::of(new));
        let layer = StoredLayer {
            diff_id: p.clone(),
            blob: Blob {
                digest: p.clone(),
                size: parent.len() as u64,
                media_type: LAYER_TAR.into(),
            },
        };
        Plan {
            diff_ids: vec![p, n],
            parent_layers: 1,
            parent: record.then(|| StoredImage {
                config: layer.blob.clone(),
                layers: vec![layer],
            }),
            spool: HashSet::new(),
        }
    }

    /// An OCI-layout export names blobs by digest: the parent's layer is passed over, only the
    /// new one is unpacked and handed on.
    #[test]
    fn an_oci_layout_export_hands_on_only_the_new_layer() {
        let (parent, new) = (layer(1), layer(2));
        let plan = plan(&parent, &new, false);
        let config = config(&[&plan.diff_ids[0], &plan.diff_ids[1]]);
        let name = |d: &Digest| format!("blobs/sha256/{}", d.hex());
        let (p, n, c) = (
            name(&plan.diff_ids[0]),
            name(&plan.diff_ids[1]),
            name(&Digest::of(&config)),
        );
        let archive = export(&[(&n, &new), (&c, &config), (&p, &parent)], &c, &[&p, &n]);
        assert_eq!(
            handed_on(&plan, &archive),
            Ok(vec![plan.diff_ids[1].clone()])
        );
    }

    /// The names of a three-layer image's layers in a `docker save` by Docker 20.10.24 (the
    /// testbed's builder): the first two computed, the last (its id digests the config) not.
    #[test]
    fn docker_20_10_layer_names_are_computed_from_the_diff_ids() {
        let diff_ids: Vec<Digest> = [
            "e5e2c34635aae1307de6c24114942d8c1e6bcb2af645619c6ea28e15b8a08438",
            "f37d2024c98ca83f922910daafc76e5bc08f2e7c055ec1818405a8805544fe2c",
            "66e096efc55c4314aa55c0e4b91b2e21ed70a46c8136f2cc18a659ba19496d4d",
        ]
        .iter()
        .map(|hex| Digest::from_hex(hex).unwrap())
        .collect();
        let ids: Vec<String> = legacy_ids(&diff_ids)
            .iter()
            .map(|id| id.hex().to_string())
            .collect();
        assert_eq!(
            ids,
            [
                "bc7f7a69bf704fa221cd491fb240f0f358aa01f4086fc633393dfb206ee20212",
                "619a64a3ea2b6231a60abf0b44e8ed1cf31061676ab22ed41908ae35a3e294b2",
            ]
        );
    }

    /// A parent's layer under its Docker 20.10 name is passed over unhashed; a new layer of
    /// its size, whose `json` names the parent's id as its parent, is no collision.
    #[test]
    fn a_docker_20_10_parent_layer_is_known_by_its_name() {
        let (parent, new) = (layer(1), layer(2));
        let plan = plan(&parent, &new, true);
        let config = config(&[&plan.diff_ids[0], &plan.diff_ids[1]]);
        let below = legacy_ids(&plan.diff_ids).remove(0);
        let named = format!("{}/layer.tar", below.hex());
        let json = format!(r#"{{"id":"0a","parent":"{}"}}"#, below.hex());
        let archive = export(
            &[
                ("0a/json", json.as_bytes()),
                ("0a/layer.tar", &new),
                (&named, &parent),
                ("c.json", &config),
            ],
            "c.json",
            &[&named, "0a/layer.tar"],
        );
        assert_eq!(
            handed_on(&plan, &archive),
            Ok(vec![plan.diff_ids[1].clone()])
        );
    }

    /// With the new layer and the config in hand and the parent known from the store's
    /// record, the reading stops: an export cut short inside the parent's layer after them
    /// still splits. Without the record it reads on, and the cut is an error.
    #[test]
    fn the_reading_stops_once_the_new_layers_and_the_config_are_in_hand() {
        let (parent, new) = (layer(1), layer(2));
        let with_record = plan(&parent, &new, true);
        let config = config(&[&with_record.diff_ids[0], &with_record.diff_ids[1]]);
        let name = |d: &Digest| format!("blobs/sha256/{}", d.hex());
        let (p, n, c) = (
            name(&with_record.diff_ids[0]),
            name(&with_record.diff_ids[1]),
            name(&Digest::of(&config)),
        );
        let archive = export(&[(&c, &config), (&n, &new), (&p, &parent)], &c, &[&p, &n]);
        let cut = &archive[..archive.len() - parent.len() / 2];
        assert_eq!(
            handed_on(&with_record, cut),
            Ok(vec![with_record.diff_ids[1].clone()])
        );
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open_for(dir.path(), None);
        let (sender, _handed) = std::sync::mpsc::channel();
        let without = plan(&parent, &new, false);
        assert!(matches!(
            split(&without, &store, cut, &sender, &mut spool_only),
            Err(Failure::Error(_))
        ));
    }

    /// Docker 20.10 names layers `<v1 id>/layer.tar`: one of a parent's layer's size is hashed
    /// as it passes; a new layer of that very size is a collision, read again spooled.
    #[test]
    fn a_docker_20_10_layer_the_size_of_a_parents_is_told_apart_by_its_digest() {
        let (parent, new) = (layer(1), layer(2));
        assert_eq!(parent.len(), new.len());
        let mut plan = plan(&parent, &new, true);
        let config = config(&[&plan.diff_ids[0], &plan.diff_ids[1]]);
        let archive = export(
            &[
                ("a/layer.tar", &new),
                ("b/layer.tar", &parent),
                ("c.json", &config),
            ],
            "c.json",
            &["b/layer.tar", "a/layer.tar"],
        );
        assert_eq!(handed_on(&plan, &archive), Err("a/layer.tar".to_string()));
        plan.spool.insert("a/layer.tar".into());
        assert_eq!(
            handed_on(&plan, &archive),
            Ok(vec![plan.diff_ids[1].clone()])
        );
    }
}
