//! Normalisation: after the engine's builder made an image, hallmark rewrites the layers that
//! build added (never the parent's) into one canonical form, so that the same build gives the
//! same layers on every engine and image store, and it fixes the config's volatile fields
//! (`created` and history times clamped, the build container's id and hostname removed). The
//! result replaces the raw image under the tag with the same checksum label. Layering is kept,
//! so shipping still sends only the layers a node lacks.
//!
//! The canonical layer: entries in the order a directory walk visits them (component by
//! component), paths without `./`; modes without the file-type bits Docker 20.10 writes
//! (`0o100755` where the containerd store writes `0o755`); no user or group names; mtimes
//! clamped to the spec's source date; file capabilities the only extended attribute (the
//! containerd store writes all of them, the classic store only that one); device numbers on
//! devices only; whiteouts as `dir/.wh.name` files with mode, owner and mtime 0; a directory
//! Docker 20.10 marks opaque (`.wh..wh..opq`) written as the whiteouts the containerd store
//! writes instead (one per name the layers below hold there); and a group of hard links led
//! by its first member in that order.
//!
//! Cost, on a classic-store overlay2 builder on this machine: a walk of the new layers'
//! directories where the engine keeps them, each written once into the store and the
//! builder's load (`normalize/overlay.rs`); the export is not asked for.
//!
//! Elsewhere: one export of the built image, read as it arrives (the parent's layers pass by,
//! written nowhere, and the reading stops once the new layers and the config are in hand;
//! see `normalize/export.rs`). A new layer known new by its name is rewritten as it streams
//! in (`normalize/in_order.rs`), into the layer store and, on a classic-store builder, into
//! the builder's load at once. One whose entries are out of canonical order (the engines
//! write a layer in that order: a walk of its directory), or with an opaque directory, is
//! written entry by entry in canonical form into a temporary file, which the sorting rewrite
//! then puts in order (it reads each file's content where it lies); a layer not known new by
//! its name is unpacked into a temporary file as it came. A read of the headers of the
//! layers below only when a layer has an opaque directory (Docker 20.10), which exports the
//! parent into the store if it is not there. The store keeps no raw layer.

use crate::engine::{Engine, StreamReader};
use crate::error::{Error, Result};
use crate::images::store::{Blob, LAYER_TAR, LayerStore, StoredImage, StoredLayer};
use crate::images::transfer;
use crate::make::render::rfc3339;
use crate::oci::Digest;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;

mod canonical;
mod config;
mod content;
mod entries;
mod export;
mod in_order;
mod overlay;
mod write;

pub use canonical::*;
pub use config::*;
pub use entries::LowerTree;
use entries::*;
use write::*;

/// Why the builder's raw image is not read where the builder keeps it (its overlay2
/// folders, or its containerd content store), so that the export is read instead.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("HALLMARK_NORMALIZE_FROM=export")]
    ExportAsked,
    #[error(transparent)]
    Engine(#[from] Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the builder is reached by {0}")]
    Remote(String),
    #[error("the builder's image store is {0} (its layers are not overlay2 folders)")]
    NotOverlay(String),
    #[error("the builder's storage driver is {0}")]
    Driver(String),
    #[error("the builder's overlay2 diffs naively")]
    NaiveDiff,
    #[error("the builder remaps user ids")]
    Remapped,
    #[error("{} is not the image {id}", path.display())]
    NotTheImage {
        path: std::path::PathBuf,
        id: String,
    },
    #[error("{} is not the layer {diff_id}", path.display())]
    NotTheLayer {
        path: std::path::PathBuf,
        diff_id: Digest,
    },
    #[error("{}: cache-id {cache_id:?}", path.display())]
    CacheId {
        path: std::path::PathBuf,
        cache_id: String,
    },
    #[error("{} has the epoch as its time, as the engine writes for any time before 1970 or after 2262: the export has the true one", .0.display())]
    Epoch(std::path::PathBuf),
    #[error("{}: {source}", path.display())]
    Config {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {source}", path.display())]
    TarSplit {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the built image's id {id}: {source}")]
    BadId {
        id: String,
        source: crate::oci::digest::BadDigest,
    },
    /// The folders looked in, joined with `, `.
    #[error(
        "no containerd content store on this machine holds the image {id} (looked in {looked})"
    )]
    NoContentStore { id: Digest, looked: String },
    #[error("the manifest {id}: {source}")]
    Manifest {
        id: Digest,
        source: serde_json::Error,
    },
    #[error("the built image {id} is a {media_type}, not one manifest")]
    NotOneManifest { id: Digest, media_type: String },
    #[error("the manifest {id} names no config")]
    NoConfig { id: Digest },
    #[error("the manifest {id} names {named} layers, the image has {has}")]
    LayerCount {
        id: Digest,
        named: usize,
        has: usize,
    },
    #[error("{} is not {size} bytes", path.display())]
    BlobSize { path: std::path::PathBuf, size: u64 },
}

/// The parent of an image being normalised, as the builder knows it.
pub struct Parent<'a> {
    /// Its id (the store's record of it is looked up by it) or reference.
    pub name: &'a str,
    pub layers: usize,
}

/// What a normalisation made.
pub struct Normalised {
    /// The builder's id for the normalised image.
    pub id: String,
    /// How many new layers there were, and how many of them were rewritten as the export
    /// streamed in (the others from a temporary copy: their entries were out of canonical
    /// order, they mark a directory opaque, or they could not be told new by their name).
    pub layers: usize,
    pub streamed: usize,
    pub from: ReadFrom,
    /// Why the layer directories were not read, when the export was.
    pub why_export: Option<String>,
}

/// Where normalisation read the new layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The builder's export of the image.
    Export,
    /// The builder's layer directories on this machine ([`overlay`]).
    Directories,
    /// The blobs of the builder's containerd content store on this machine ([`content`]).
    ContentStore,
}

impl ReadFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadFrom::Export => "export",
            ReadFrom::Directories => "layer directories",
            ReadFrom::ContentStore => "content store",
        }
    }
}

/// Normalises the builder's image `raw_id`, whose first `parent.layers` layers are its
/// parent's; loads the result untagged and returns the builder's id for it. With `finish`
/// (label key and checksum), the result carries its checksum: nothing follows normalisation.
///
/// One pass: the export is read as it comes ([`export::split`]), each new layer rewritten as
/// soon as it and the new layers below it are there, and put into the load as soon as it is
/// rewritten; the store keeps only the rewritten layers and the config.
pub async fn normalize(
    builder: &Engine,
    store: &Arc<LayerStore>,
    image: &str,
    raw_id: &str,
    parent: Parent<'_>,
    source_date: u64,
    finish: Option<(&str, &str)>,
) -> Result<Normalised> {
    let inspected = builder
        .inspect(raw_id)
        .await?
        .ok_or_else(|| builder.error(format!("the built image {raw_id} is gone")))?;
    let diff_ids: Vec<Digest> = inspected
        .layers()
        .iter()
        .map(|d| Digest::try_from(d.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| builder.error(format!("{raw_id}: a layer {e}")))?;
    let parent_record = match builder.inspect(parent.name).await? {
        Some(found) => found.id().and_then(|id| store.record(id)),
        None => None,
    };
    let mut plan = export::Plan {
        parent_layers: parent.layers.min(diff_ids.len()),
        diff_ids,
        parent: parent_record,
        spool: HashSet::new(),
    };
    // `HALLMARK_NORMALIZE_FROM=export` reads the export even where the directories could be
    // read (docs/reproducibility.md): a way around a reading of them that goes wrong.
    let export_only = std::env::var("HALLMARK_NORMALIZE_FROM").as_deref() == Ok("export");
    let raw_image = inspected.id().unwrap_or(raw_id);
    let found = match export_only {
        true => Err(Unreadable::ExportAsked),
        false => {
            let (ids, layers) = (&plan.diff_ids, plan.parent_layers);
            let parent = plan.parent_record();
            overlay::locate(builder, raw_image, ids, layers, parent, source_date).await
        }
    };
    let why_not_dirs = match found {
        Ok(found) => {
            let finish = finish.map(|(k, c)| (k.to_string(), c.to_string()));
            let layers = plan.parent_layers;
            let from = (image, found);
            return normalize_from_dirs(builder, store, from, layers, source_date, finish).await;
        }
        Err(why) => why,
    };
    // A containerd store on this machine: its blobs are read where it keeps them.
    let (blobs, why_export) = match export_only {
        true => (None, Some(why_not_dirs.to_string())),
        false => {
            let layers = plan.parent_layers;
            match content::locate(builder, raw_image, &plan.diff_ids, layers).await {
                Ok(blobs) => (Some(blobs), None),
                Err(why) => (None, Some(why.unwrap_or(why_not_dirs).to_string())),
            }
        }
    };
    loop {
        let from = Source {
            image,
            raw_id,
            blobs: blobs.as_ref(),
        };
        match normalize_once(
            builder,
            store,
            from,
            &plan,
            parent.name,
            source_date,
            finish,
        )
        .await
        {
            Err(export::Failure::Collision(path)) => {
                plan.spool.insert(path);
            }
            Err(export::Failure::Error(e)) => return Err(e),
            Ok(normalised) => {
                return Ok(Normalised {
                    why_export,
                    ..normalised
                });
            }
        }
    }
}

/// What normalisation reads as the raw image's export: the engine's, or the archive of the
/// content store's blobs.
#[derive(Clone, Copy)]
struct Source<'a> {
    /// What the image is, for errors (`the normalised image of \`app\``).
    image: &'a str,
    raw_id: &'a str,
    blobs: Option<&'a content::Blobs>,
}

/// One reading of the export, rewrite and load (see [`normalize`]).
async fn normalize_once(
    builder: &Engine,
    store: &Arc<LayerStore>,
    from: Source<'_>,
    plan: &export::Plan,
    parent: &str,
    source_date: u64,
    finish: Option<(&str, &str)>,
) -> std::result::Result<Normalised, export::Failure> {
    let (spool_sender, spooled) = std::sync::mpsc::channel();
    // Bounded: a layer streamed into the load waits for the load, not for memory.
    let (made_sender, made) = std::sync::mpsc::sync_channel(16);
    let streamed = !transfer::keeps_blobs(builder).await;
    let (export_sender, reader) = StreamReader::channel();
    let archive: Box<dyn Read + Send> = match from.blobs {
        Some(blobs) => Box::new(blobs.archive()),
        None => Box::new(reader),
    };
    let forward = async move {
        if from.blobs.is_some() {
            return;
        }
        let mut stream = builder.export(from.raw_id);
        while let Some(chunk) = stream.next().await {
            let failed = chunk.is_err();
            if export_sender.send(chunk).await.is_err() || failed {
                break;
            }
        }
    };
    let split = {
        let (store, plan) = (Arc::clone(store), plan_copy(plan));
        let made = made_sender.clone();
        tokio::task::spawn_blocking(move || {
            let mut rewrite = |layer: &mut dyn Read, size: u64, into_load: bool| {
                let load = (streamed && into_load).then_some(&made);
                rewrite_streaming(&store, layer, size, load, source_date)
            };
            export::split(&plan, &store, archive, &spool_sender, &mut rewrite)
        })
    };
    let (below, serve_parent) = parent_below(builder, store, parent);
    let rewrite = {
        let (store, sender) = (Arc::clone(store), made_sender.clone());
        let (diff_ids, first) = (plan.diff_ids.clone(), plan.parent_layers);
        tokio::task::spawn_blocking(move || {
            let into = Into {
                made: &sender,
                streamed,
            };
            rewrite_all(&store, &diff_ids, first, spooled, below, into, source_date)
        })
    };
    // `made_sender` moves in and is dropped however this ends, which ends the load's input:
    // held past a failure (a layer the size of a parent's, read again), the load waited for
    // the image for good, and the build with it.
    let made_image = async move {
        let (split, rewritten, ()) = tokio::join!(split, rewrite, serve_parent);
        let split = split.expect("the export's reading does not panic");
        let rewritten = rewritten.expect("the rewrite does not panic");
        let split = split?;
        let (new, streamed) = rewritten?;
        let counts = (new.len(), streamed);
        let mut layers = split.layers[..plan.parent_layers].to_vec();
        layers.extend(new);
        let image = image_of(store, split.config, layers, source_date, finish)?;
        let _ = made_sender.send(transfer::Made::Image(image));
        Ok::<_, export::Failure>(counts)
    };
    let what = format!("the normalised image of {}", from.image);
    let load = transfer::load_streamed(builder, store, made, plan.parent_layers, &what);
    let ((), made_image, loaded) = tokio::join!(forward, made_image, load);
    // The normalisation's own failure says more than the load it cut short.
    let (layers, streamed) = made_image?;
    Ok(Normalised {
        id: loaded?,
        layers,
        streamed,
        from: match from.blobs {
            Some(_) => ReadFrom::ContentStore,
            None => ReadFrom::Export,
        },
        why_export: None,
    })
}

/// The normalised image of `layers` and the raw `config` made canonical (with `finish`, the
/// checksum label), its config written into the store.
fn image_of(
    store: &LayerStore,
    mut config: Value,
    layers: Vec<StoredLayer>,
    source_date: u64,
    finish: Option<(&str, &str)>,
) -> Result<StoredImage> {
    normalize_config(&mut config, &layers, source_date);
    if let Some((key, checksum)) = finish {
        finish_config(&mut config, key, checksum);
    }
    let bytes = serde_json::to_vec(&config).expect("config serializes");
    let (digest, size) = store.add_blob(|out| out.write_all(&bytes))?;
    let config = Blob {
        digest,
        size,
        media_type: crate::oci::archive::CONFIG.into(),
    };
    Ok(StoredImage { config, layers })
}

/// Normalisation from the builder's layer directories ([`overlay`]): each new layer walked,
/// rewritten into the store and into the builder's load at once (its size is known before
/// its content is read), then the image.
async fn normalize_from_dirs(
    builder: &Engine,
    store: &Arc<LayerStore>,
    (image, found): (&str, overlay::Found),
    parent_layers: usize,
    source_date: u64,
    finish: Option<(String, String)>,
) -> Result<Normalised> {
    let (made_sender, made) = std::sync::mpsc::sync_channel(16);
    let made_image = {
        let store = Arc::clone(store);
        // `made_sender` moves in and is dropped however this ends, which ends the load.
        tokio::task::spawn_blocking(move || {
            let into = Into {
                made: &made_sender,
                streamed: true,
            };
            let mut done: Vec<StoredLayer> = Vec::new();
            // What the parent's directories hold, walked once if a new layer asks.
            let mut parent_tree: Option<LowerTree> = None;
            for dir in &found.dirs {
                let failed = |e: std::io::Error| Error::Io {
                    path: dir.clone(),
                    source: std::io::Error::other(format!("normalising the layer: {e}")),
                };
                let walked = overlay::walk(dir).map_err(failed)?;
                let lower = || {
                    if parent_tree.is_none() {
                        let mut tree = LowerTree::default();
                        for below in &found.parent_dirs {
                            let walked = overlay::walk(below)?;
                            tree.apply_walked(&walked.items, &walked.opaque);
                        }
                        parent_tree = Some(tree);
                    }
                    let mut tree = parent_tree.clone().unwrap_or_default();
                    tree.apply_stored(&store, &done)?;
                    Ok(tree)
                };
                let mut canonical =
                    Canonical::of(walked.items, &walked.opaque, lower, walked.files)
                        .map_err(failed)?;
                done.push(rewrite_one(&store, &mut canonical, &into, source_date)?);
            }
            let count = done.len();
            let mut layers = found.parent;
            layers.extend(done);
            let finish = finish.as_ref().map(|(k, c)| (k.as_str(), c.as_str()));
            let image = image_of(&store, found.config, layers, source_date, finish)?;
            let _ = made_sender.send(transfer::Made::Image(image));
            Ok::<_, Error>(count)
        })
    };
    let what = format!("the normalised image of {image}");
    let load = transfer::load_streamed(builder, store, made, parent_layers, &what);
    let (made_image, loaded) = tokio::join!(made_image, load);
    // The normalisation's own failure says more than the load it cut short.
    let layers = made_image.expect("the rewrite does not panic")?;
    Ok(Normalised {
        id: loaded?,
        layers,
        streamed: 0,
        from: ReadFrom::Directories,
        why_export: None,
    })
}

fn plan_copy(plan: &export::Plan) -> export::Plan {
    export::Plan {
        diff_ids: plan.diff_ids.clone(),
        parent_layers: plan.parent_layers,
        parent: plan.parent.clone(),
        spool: plan.spool.clone(),
    }
}

/// The parent's layers with their content in the store, asked for only when a new layer
/// has an opaque directory (Docker 20.10): the parent is exported into the store then, once.
/// The closure (for the rewrite's thread) asks; the future answers.
fn parent_below<'a>(
    builder: &'a Engine,
    store: &'a Arc<LayerStore>,
    parent: &'a str,
) -> (
    impl FnOnce() -> std::io::Result<Vec<StoredLayer>> + Send + 'static,
    impl std::future::Future<Output = ()> + 'a,
) {
    let (ask, mut asked) = tokio::sync::mpsc::channel::<std::sync::mpsc::Sender<_>>(1);
    let closure = move || {
        let (reply, answer) = std::sync::mpsc::channel();
        ask.blocking_send(reply)
            .map_err(|_| std::io::Error::other("the normalisation stopped"))?;
        answer
            .recv()
            .map_err(|_| std::io::Error::other("the normalisation stopped"))?
    };
    let serve = async move {
        if let Some(reply) = asked.recv().await {
            let stored = transfer::stored_image(builder, store, parent).await;
            let _ = reply.send(
                stored
                    .map(|(_, image)| image.layers)
                    .map_err(|e| std::io::Error::other(e.to_string())),
            );
        }
    };
    (closure, serve)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn layer(mtime: u64) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_mtime(mtime);
        dir.set_username("builder").unwrap();
        dir.set_uid(0);
        dir.set_gid(0);
        tar.append_data(&mut dir, "etc/", std::io::empty()).unwrap();
        let mut file = tar::Header::new_gnu();
        file.set_mode(0o600);
        file.set_uid(1000);
        file.set_gid(0);
        file.set_size(5);
        file.set_mtime(mtime);
        tar.append_data(&mut file, "etc/stamp", &b"hello"[..])
            .unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_mtime(mtime);
        link.set_mode(0o777);
        link.set_uid(0);
        link.set_gid(0);
        tar.append_link(&mut link, "etc/link", "stamp").unwrap();
        tar.into_inner().unwrap()
    }

    /// `layer` normalised at source date 1000, on top of `lower`.
    pub(super) fn normalised(layer: &[u8], lower: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let lower = || {
            let mut tree = LowerTree::default();
            for below in lower {
                tree.apply(*below)?;
            }
            Ok(tree)
        };
        rewrite_layer(Cursor::new(layer), lower, &mut out, 1_000).unwrap();
        out
    }

    /// Path, mode, uid and mtime of each entry, and a link's target.
    fn listing(tar: &[u8]) -> Vec<(String, u32, u64, u64, String)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    // Written as `./path` (oci::tar::append): listed as the path.
                    e.path()
                        .unwrap()
                        .display()
                        .to_string()
                        .trim_start_matches("./")
                        .to_string(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.display().to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }

    pub(super) fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/layers/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn two_builds_an_hour_apart_normalise_to_the_same_bytes() {
        assert_ne!(layer(1_700_000_000), layer(1_700_003_600));
        let bytes = normalised(&layer(1_700_000_000), &[]);
        assert_eq!(bytes, normalised(&layer(1_700_003_600), &[]));
        assert_eq!(
            listing(&bytes),
            vec![
                ("etc/".into(), 0o755, 0, 1_000, String::new()),
                ("etc/link".into(), 0o777, 0, 1_000, "stamp".into()),
                ("etc/stamp".into(), 0o600, 1000, 1_000, String::new()),
            ]
        );
    }

    /// Times past 2242 and sizes past 8 GiB come as PAX records, with 0 in the header.
    #[test]
    fn pax_times_and_sizes_are_kept() {
        let mut tar = tar::Builder::new(Vec::new());
        tar.append_pax_extensions([("mtime", &b"9223372036.5"[..]), ("size", b"5")])
            .unwrap();
        let mut file = tar::Header::new_ustar();
        file.set_mode(0o644);
        file.set_uid(0);
        file.set_gid(0);
        file.set_mtime(0);
        file.set_size(0);
        file.set_path("big").unwrap();
        file.set_cksum();
        tar.append(&file, &b"hello"[..]).unwrap();
        let layer = tar.into_inner().unwrap();
        let mut out = Vec::new();
        let lower = || Ok(LowerTree::default());
        rewrite_layer(Cursor::new(layer), lower, &mut out, 9_223_372_036).unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.header().mtime().unwrap(), 9_223_372_036);
        let mut content = String::new();
        entry.read_to_string(&mut content).unwrap();
        assert_eq!(content, "hello");
        assert!(entries.next().is_none());
    }

    /// A layer's first name must not start with `BZh`, which engines take for bzip2.
    #[test]
    fn names_start_with_dot_slash() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut file = header(tar::EntryType::Regular, 0o644, 1);
        tar.append_data(&mut file, "BZh91AY", &b"x"[..]).unwrap();
        let out = normalised(&tar.into_inner().unwrap(), &[]);
        assert_eq!(&out[..9], b"./BZh91AY");
    }

    #[test]
    fn an_older_mtime_is_kept() {
        let bytes = normalised(&layer(500), &[]);
        assert!(listing(&bytes).iter().all(|e| e.3 == 500));
    }

    /// Issue 15: the same two RUN steps built on Docker 20.10 (classic store) and Docker 26
    /// (containerd store) give layers that differ in modes, names, whiteouts and the form of a
    /// replaced directory; normalised, they are the same bytes.
    #[test]
    fn docker_20_10_and_the_containerd_store_normalise_to_the_same_layers() {
        let (classic, containerd) = (
            [fixture("docker-20.10-1.tar"), fixture("docker-20.10-2.tar")],
            [
                fixture("docker-26-containerd-1.tar"),
                fixture("docker-26-containerd-2.tar"),
            ],
        );
        assert_ne!(classic[0], containerd[0]);
        assert_ne!(classic[1], containerd[1]);
        let same = |a: Vec<u8>, b: Vec<u8>| {
            assert_eq!(listing(&a), listing(&b));
            assert!(a == b, "the same entries, other bytes");
            a
        };
        same(
            normalised(&classic[0], &[]),
            normalised(&containerd[0], &[]),
        );
        let second = same(
            normalised(&classic[1], &[&classic[0]]),
            normalised(&containerd[1], &[&containerd[0]]),
        );

        let entries = listing(&second);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            paths,
            [
                "opt/",
                "opt/a-first",
                "opt/d/",
                "opt/d/.wh.one",
                "opt/d/sub/",
                "opt/d/sub/.wh.s",
                "opt/d/two",
                "opt/fifo",
                "opt/x",
                "tmp/",
                "tmp/t/"
            ]
        );
        let mode = |path: &str| entries.iter().find(|e| e.0 == path).unwrap().1;
        assert_eq!(mode("opt/a-first"), 0o4755);
        assert_eq!(mode("opt/d/"), 0o755);
        assert_eq!(mode("tmp/t/"), 0o1777);
        assert_eq!(mode("opt/d/.wh.one"), 0);
    }

    /// A header with every numeric field set, as engines write them.
    pub(super) fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header
    }

    /// Issue 15: Docker 20.10 writes every runtime config field, the containerd store only
    /// those that are set.
    #[test]
    fn empty_runtime_config_fields_are_left_out() {
        let config = |runtime: Value| {
            let mut config = json!({"config": runtime, "history": []});
            normalize_config(&mut config, &[], 0);
            config
        };
        let classic = config(json!({
            "AttachStderr": false, "Cmd": ["hello"], "Domainname": "", "Entrypoint": null,
            "Env": ["PATH=/bin"], "Hostname": "abc", "Image": "sha256:1", "Labels": {"k": "v"},
            "OnBuild": null, "Volumes": null, "WorkingDir": "", "User": "", "Tty": false,
        }));
        let containerd =
            config(json!({"Cmd": ["hello"], "Env": ["PATH=/bin"], "Labels": {"k": "v"}}));
        assert_eq!(classic, containerd);
        assert_eq!(
            config(json!({"User": "1000", "Tty": true, "ExposedPorts": {"80/tcp": {}}}))["config"],
            json!({"User": "1000", "Tty": true, "ExposedPorts": {"80/tcp": {}}})
        );
    }

    #[test]
    fn hard_links_are_led_by_the_first_in_walk_order() {
        let linked = |file: &str, link: &str| {
            let mut tar = tar::Builder::new(Vec::new());
            let mut regular = header(tar::EntryType::Regular, 0o644, 3);
            tar.append_data(&mut regular, file, &b"abc"[..]).unwrap();
            let mut hard = header(tar::EntryType::Link, 0o644, 0);
            tar.append_link(&mut hard, link, file).unwrap();
            tar.into_inner().unwrap()
        };
        let bytes = normalised(&linked("z", "a"), &[]);
        assert_eq!(bytes, normalised(&linked("a", "z"), &[]));
        let entries = listing(&bytes);
        assert_eq!((entries[0].0.as_str(), entries[0].4.as_str()), ("a", ""));
        assert_eq!((entries[1].0.as_str(), entries[1].4.as_str()), ("z", "a"));
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut first = archive.entries().unwrap().next().unwrap().unwrap();
        let mut content = String::new();
        first.read_to_string(&mut content).unwrap();
        assert_eq!(content, "abc");
    }

    /// A symlink, a fifo or a device can be hard-linked too (`cp -al` of a tree holding a
    /// symlink): the first of its group in canonical order holds it, whichever the engine
    /// wrote first, or the load refuses a link to a name it has not seen yet.
    #[test]
    fn hard_links_to_a_symlink_a_fifo_or_a_device_are_led_by_the_first_name() {
        let kinds = [
            (tar::EntryType::Symlink, "../etc/passwd"),
            (tar::EntryType::Fifo, ""),
            (tar::EntryType::Char, ""),
        ];
        for (kind, target) in kinds {
            // The engine's walk met `snap/pw` first; canonical order puts `snap/a` first.
            let linked = |first: &str, then: &str| {
                let mut tar = tar::Builder::new(Vec::new());
                let mut leader = header(kind, 0o644, 0);
                leader.set_device_major(1).unwrap();
                leader.set_device_minor(3).unwrap();
                match kind {
                    tar::EntryType::Symlink => tar.append_link(&mut leader, first, target),
                    _ => tar.append_data(&mut leader, first, std::io::empty()),
                }
                .unwrap();
                let mut hard = header(tar::EntryType::Link, 0o644, 0);
                tar.append_link(&mut hard, then, first).unwrap();
                tar.into_inner().unwrap()
            };
            let engine_order = linked("snap/pw", "snap/a");
            let bytes = normalised(&engine_order, &[]);
            assert_eq!(
                bytes,
                normalised(&linked("snap/a", "snap/pw"), &[]),
                "{kind:?}"
            );
            let entries = listing(&bytes);
            assert_eq!(
                (entries[0].0.as_str(), entries[0].4.as_str()),
                ("snap/a", target),
                "{kind:?}"
            );
            assert_eq!(
                (entries[1].0.as_str(), entries[1].4.as_str()),
                ("snap/pw", "snap/a"),
                "{kind:?}"
            );
            let mut archive = tar::Archive::new(bytes.as_slice());
            let types: Vec<_> = archive
                .entries()
                .unwrap()
                .map(|e| e.unwrap().header().entry_type())
                .collect();
            assert_eq!(types, [kind, tar::EntryType::Link]);
        }
    }

    /// A directory named `.wh.*` in an export is no deletion: refused, naming it.
    #[test]
    fn a_directory_named_as_a_deletion_is_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut dir = header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut dir, "w/.wh.dir/", std::io::empty())
            .unwrap();
        let mut file = header(tar::EntryType::Regular, 0o644, 1);
        tar.append_data(&mut file, "w/.wh.dir/in", &b"x"[..])
            .unwrap();
        let layer = tar.into_inner().unwrap();
        let lower = || Ok(LowerTree::default());
        let error = rewrite_layer(Cursor::new(layer), lower, &mut Vec::new(), 1_000)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("w/.wh.dir"), "{error}");
    }

    #[test]
    fn names_that_are_not_utf8_keep_their_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::OsStr::from_bytes(b"opt/caf\xe9");
        let mut tar = tar::Builder::new(Vec::new());
        let mut file = header(tar::EntryType::Regular, 0o644, 1);
        tar.append_data(&mut file, name, &b"x"[..]).unwrap();
        let mut link = header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut link, "opt/link", name).unwrap();
        let bytes = normalised(&tar.into_inner().unwrap(), &[]);
        let mut archive = tar::Archive::new(bytes.as_slice());
        let names: Vec<(Vec<u8>, Option<Vec<u8>>)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path_bytes().into_owned(),
                    e.link_name_bytes().map(|l| l.into_owned()),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                (b"./opt/caf\xe9".to_vec(), None),
                (b"./opt/link".to_vec(), Some(b"opt/caf\xe9".to_vec()))
            ]
        );
    }

    #[test]
    fn file_capabilities_are_the_only_extended_attribute_kept() {
        let mut tar = tar::Builder::new(Vec::new());
        tar.append_pax_extensions([
            ("SCHILY.xattr.user.origin", &b"builder"[..]),
            (CAPABILITY, &b"\x01\x00\x00\x02"[..]),
        ])
        .unwrap();
        let mut ping = header(tar::EntryType::Regular, 0o755, 0);
        tar.append_data(&mut ping, "bin/ping", std::io::empty())
            .unwrap();
        let bytes = normalised(&tar.into_inner().unwrap(), &[]);
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        let keys: Vec<String> = entry
            .pax_extensions()
            .unwrap()
            .unwrap()
            .map(|e| e.unwrap().key().unwrap().to_string())
            .collect();
        assert_eq!(keys, [CAPABILITY]);
    }
}
