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

mod content;
mod export;
mod in_order;
mod overlay;

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
        true => Err("HALLMARK_NORMALIZE_FROM=export".to_string()),
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
        true => (None, Some(why_not_dirs)),
        false => {
            let layers = plan.parent_layers;
            match content::locate(builder, raw_image, &plan.diff_ids, layers).await {
                Ok(blobs) => (Some(blobs), None),
                Err(why) => (None, Some(why.unwrap_or(why_not_dirs))),
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

/// Where rewritten layers go besides the store: the load's channel, each layer sent as it is
/// written (`streamed`) or once it is in the store.
struct Into<'a> {
    made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    streamed: bool,
}

/// Rewrites the new layers (positions `first..` of `diff_ids`) in order as they arrive on
/// `spooled`, each into the store and the load, those not rewritten as they streamed in;
/// returns them in order, and how many were.
fn rewrite_all(
    store: &LayerStore,
    diff_ids: &[Digest],
    first: usize,
    spooled: std::sync::mpsc::Receiver<export::New>,
    parent: impl FnOnce() -> std::io::Result<Vec<StoredLayer>>,
    into: Into<'_>,
    source_date: u64,
) -> Result<(Vec<StoredLayer>, usize)> {
    let mut streamed = 0;
    let mut arrived: HashMap<Digest, export::Taken> = HashMap::new();
    let mut below = Below::new(parent);
    let mut done: Vec<StoredLayer> = Vec::new();
    for diff_id in &diff_ids[first..] {
        while !arrived.contains_key(diff_id) {
            let Ok(layer) = spooled.recv() else {
                // The reading stopped; its error is the one reported.
                return Err(Error::io(
                    "the builder's export",
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            };
            arrived.insert(layer.diff_id, layer.taken);
        }
        let file = match &arrived[diff_id] {
            export::Taken::Spooled(file) => file,
            export::Taken::Rewritten { layer, loaded } => {
                if !loaded {
                    // A send fails only once the load has stopped, which reports its own error.
                    let _ = into.made.send(transfer::Made::Layer(layer.clone()));
                }
                done.push(layer.clone());
                streamed += 1;
                continue;
            }
        };
        let failed = |e: std::io::Error| Error::Io {
            path: store.root.join("tmp"),
            source: std::io::Error::other(format!("normalising layer {diff_id}: {e}")),
        };
        let mut input = file.try_clone().map_err(failed)?;
        input.seek(SeekFrom::Start(0)).map_err(failed)?;
        let lower = || below.tree(store, &done);
        let mut canonical = Canonical::read(input, lower).map_err(failed)?;
        let layer =
            rewrite_one(store, &mut canonical, &into, source_date).map_err(|e| match e {
                Error::Io { source, .. } => failed(source),
                other => other,
            })?;
        done.push(layer);
    }
    Ok((done, streamed))
}

/// What the layers below a new one hold, for its opaque directories: the parent's (asked for
/// once, see [`parent_below`]) and the new ones rewritten before it.
struct Below<F> {
    parent: Option<F>,
    parent_layers: Option<Vec<StoredLayer>>,
}

impl<F: FnOnce() -> std::io::Result<Vec<StoredLayer>>> Below<F> {
    fn new(parent: F) -> Below<F> {
        Below {
            parent: Some(parent),
            parent_layers: None,
        }
    }

    fn tree(&mut self, store: &LayerStore, done: &[StoredLayer]) -> std::io::Result<LowerTree> {
        if self.parent_layers.is_none() {
            let parent = self.parent.take().expect("asked once");
            self.parent_layers = Some(parent()?);
        }
        let mut below = self.parent_layers.clone().unwrap_or_default();
        below.extend(done.iter().cloned());
        LowerTree::of(store, &below)
    }
}

/// Writes one canonical layer into the store and hands it to the load.
fn rewrite_one<C: Content>(
    store: &LayerStore,
    canonical: &mut Canonical<C>,
    into: &Into<'_>,
    source_date: u64,
) -> Result<StoredLayer> {
    let stored = |(digest, size): (Digest, u64)| StoredLayer {
        diff_id: digest.clone(),
        blob: Blob {
            digest,
            size,
            media_type: LAYER_TAR.into(),
        },
    };
    // A send fails only once the load has stopped, which reports its own error.
    if !into.streamed {
        let layer = stored(store.add_blob(|out| canonical.write(out, source_date))?);
        let _ = into.made.send(transfer::Made::Layer(layer.clone()));
        return Ok(layer);
    }
    let size = canonical
        .size(source_date)
        .map_err(|e| Error::io(&store.root, e))?;
    let _ = into.made.send(transfer::Made::Begin(size));
    let mut pending = store.pending_blob()?;
    // The store's copy is hashed and written on a thread of its own, from the same chunks
    // the load gets: the load, which the engine unpacks only once it has all of it, is not
    // held up by the store's writes.
    let written = std::thread::scope(|scope| {
        let (to_store, chunks) = std::sync::mpsc::sync_channel::<bytes::Bytes>(16);
        let out = &mut pending.out;
        let writer = scope.spawn(move || {
            for chunk in chunks {
                out.write_all(&chunk)?;
            }
            out.flush()
        });
        let mut fanout = Fanout {
            made: into.made,
            store: to_store,
            buffer: bytes::BytesMut::with_capacity(CHUNK),
        };
        let wrote = canonical
            .write(&mut fanout, source_date)
            .and_then(|()| fanout.flush());
        drop(fanout);
        let stored = writer.join().expect("the store's writer does not panic");
        // The store's own failure (a full disk) says more than the send it cut short.
        stored.and(wrote)
    });
    written.map_err(|e| Error::io(store.root.join("tmp"), e))?;
    let layer = stored(pending.keep(store)?);
    let _ = into.made.send(transfer::Made::End(layer.clone()));
    Ok(layer)
}

/// The pieces a streamed layer is handed on in.
const CHUNK: usize = 1 << 20;

/// Hands what is written to it, in [`CHUNK`]s, to the load and to the store's writer alike
/// (the same bytes, not copied).
struct Fanout<'a> {
    made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    store: std::sync::mpsc::SyncSender<bytes::Bytes>,
    buffer: bytes::BytesMut,
}

impl Write for Fanout<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        if self.buffer.len() >= CHUNK {
            self.flush()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = self.buffer.split().freeze();
        self.buffer.reserve(CHUNK);
        // A load that stopped reports its own error; the store's copy goes on.
        let _ = self.made.send(transfer::Made::Chunk(chunk.clone()));
        self.store
            .send(chunk)
            .map_err(|_| std::io::Error::other("the layer store's writer stopped"))
    }
}

/// Rewrites a new layer as it streams in ([`in_order`]) into the store and, given `load`, into
/// the builder's load at once, announced there with the export's size for it (`size`: the
/// canonical layer has the raw one's size unless a name or a record changes length); a
/// layer of another size is abandoned in the load (which begins again without it) and sent
/// from the store, a refused one once the sorting rewrite has made it from what was written.
fn rewrite_streaming(
    store: &LayerStore,
    layer: &mut dyn Read,
    size: u64,
    load: Option<&std::sync::mpsc::SyncSender<transfer::Made>>,
    source_date: u64,
) -> std::io::Result<export::Taken> {
    let failed = |e: Error| std::io::Error::other(e.to_string());
    let mut pending = store.pending_blob().map_err(failed)?;
    let mut capped = load.map(|made| {
        // A send fails only once the load has stopped, which reports its own error.
        let _ = made.send(transfer::Made::Begin(size));
        Capped {
            made,
            left: size,
            over: false,
        }
    });
    let refused = {
        let mut load = capped
            .as_mut()
            .map(|capped| std::io::BufWriter::with_capacity(1 << 20, capped));
        let load = load.as_mut().map(|l| l as &mut dyn Write);
        in_order::rewrite(layer, &mut pending.out, load, source_date)?
    };
    if refused.is_some() {
        if let Some(capped) = capped {
            let _ = capped.made.send(transfer::Made::Abandon);
        }
        return Ok(export::Taken::Spooled(pending.into_file()?));
    }
    let (digest, size) = pending.keep(store).map_err(failed)?;
    let layer = StoredLayer {
        diff_id: digest.clone(),
        blob: Blob {
            digest,
            size,
            media_type: LAYER_TAR.into(),
        },
    };
    let loaded = match capped {
        Some(capped) if capped.left == 0 && !capped.over => {
            let _ = capped.made.send(transfer::Made::End(layer.clone()));
            true
        }
        Some(capped) => {
            let _ = capped.made.send(transfer::Made::Abandon);
            false
        }
        None => false,
    };
    Ok(export::Taken::Rewritten { layer, loaded })
}

/// Sends what is written to it to the load while it fits the size announced there; past that,
/// nothing (the layer is then abandoned in the load).
struct Capped<'a> {
    made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    left: u64,
    over: bool,
}

impl Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.over || buf.len() as u64 > self.left {
            self.over = true;
        } else {
            self.left -= buf.len() as u64;
            // A load that stopped reports its own error; the store's copy goes on.
            let _ = self
                .made
                .send(transfer::Made::Chunk(bytes::Bytes::copy_from_slice(buf)));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The value of the checksum label while an image is unfinished (built, but not yet
/// normalised, smoke-tested and stamped). It never equals a checksum, so no lookup by label
/// finds such an image: a re-run after a failure or an interrupt builds again.
pub fn pending_label(checksum: &str) -> String {
    format!("pending-{checksum}")
}

/// Stamps a finished image's config: the checksum label takes the checksum's value, and the
/// build's LABEL step in the history says what the image now carries.
pub fn finish_config(config: &mut Value, key: &str, checksum: &str) {
    let pending = pending_label(checksum);
    if let Some(runtime) = config.get_mut("config").and_then(Value::as_object_mut) {
        let labels = runtime.entry("Labels").or_insert_with(|| json!({}));
        if !labels.is_object() {
            *labels = json!({});
        }
        labels[key] = json!(checksum);
    }
    if let Some(history) = config.get_mut("history").and_then(Value::as_array_mut) {
        for entry in history.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(Value::String(step)) = entry.get_mut("created_by") {
                *step = step.replace(&pending, checksum);
            }
        }
    }
}

/// Removes what only says when and where the build ran (public for the fuzzer).
pub fn normalize_config(config: &mut Value, layers: &[StoredLayer], source_date: u64) {
    let Some(object) = config.as_object_mut() else {
        return;
    };
    let date = rfc3339(source_date);
    object.insert("created".into(), json!(date));
    for volatile in ["container", "container_config", "docker_version"] {
        object.remove(volatile);
    }
    if let Some(runtime) = object.get_mut("config").and_then(Value::as_object_mut) {
        runtime.remove("Hostname");
        runtime.remove("Image");
        // Docker 20.10 writes every field, the containerd store leaves the empty ones out.
        runtime.retain(|_, value| !is_empty(value));
    }
    if let Some(history) = object.get_mut("history").and_then(Value::as_array_mut) {
        for entry in history.iter_mut().filter_map(Value::as_object_mut) {
            // RFC 3339 in UTC with a Z sorts as text: clamp, never move a date forward.
            let later = entry
                .get("created")
                .and_then(Value::as_str)
                .is_some_and(|c| c > date.as_str());
            if later {
                entry.insert("created".into(), json!(date));
            }
        }
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    object.insert(
        "rootfs".into(),
        json!({"type": "layers", "diff_ids": diff_ids}),
    );
}

/// `null`, `false`, `0`, `""`, `[]` or `{}`: what a runtime config field holds when unset.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Rewrites one layer into its canonical form (see the module doc): what the layer changes,
/// written the same way whatever engine wrote it. `input` is the layer's tar; `lower` gives
/// what the layers below it hold, asked for only when the layer has an opaque directory.
pub fn rewrite_layer<R: Read + Seek>(
    input: R,
    lower: impl FnOnce() -> std::io::Result<LowerTree>,
    out: &mut dyn Write,
    source_date: u64,
) -> std::io::Result<()> {
    Canonical::read(input, lower)?.write(out, source_date)
}

/// Where a canonical layer's file content is read from.
pub trait Content {
    /// The content of the file `item` (no more than its size).
    fn open(&mut self, item: &Item) -> std::io::Result<impl Read + '_>;
}

/// A layer's tar: an item's content lies at its `data` offset.
pub struct InTar<R>(std::io::BufReader<R>);

impl<R: Read + Seek> Content for InTar<R> {
    fn open(&mut self, item: &Item) -> std::io::Result<impl Read + '_> {
        self.0.seek(SeekFrom::Start(item.data))?;
        Ok((&mut self.0).take(item.size))
    }
}

/// A layer's entries put in canonical order, ready to be written with their content.
pub struct Canonical<C> {
    items: Vec<Item>,
    content: C,
}

impl<R: Read + Seek> Canonical<InTar<R>> {
    /// Reads the layer's entries (not their content); `lower` as for [`rewrite_layer`].
    pub fn read(
        input: R,
        lower: impl FnOnce() -> std::io::Result<LowerTree>,
    ) -> std::io::Result<Canonical<InTar<R>>> {
        let (items, opaque, input) =
            read_items(std::io::BufReader::with_capacity(256 * 1024, input))?;
        Canonical::of(items, &opaque, lower, InTar(input))
    }
}

impl<C: Content> Canonical<C> {
    /// The layer of `items` (opaque markers apart) whose directories `opaque` are marked
    /// opaque; `lower` is asked only if there are any.
    fn of(
        mut items: Vec<Item>,
        opaque: &[String],
        lower: impl FnOnce() -> std::io::Result<LowerTree>,
        content: C,
    ) -> std::io::Result<Canonical<C>> {
        if !opaque.is_empty() {
            let lower = lower()?;
            items.extend(explicit_whiteouts(&items, opaque, &lower));
        }
        items.sort_by_cached_key(|item| components(&item.key()));
        let items = lead_hard_links(items);
        Ok(Canonical { items, content })
    }

    /// How many bytes [`Canonical::write`] writes (files' content is not read): an archive
    /// entry's size comes before its content.
    pub fn size(&mut self, source_date: u64) -> std::io::Result<u64> {
        let mut counted = Counted(0);
        self.write_to(&mut counted, source_date, false)?;
        Ok(counted.0)
    }

    /// Writes the canonical layer.
    pub fn write(&mut self, out: &mut dyn Write, source_date: u64) -> std::io::Result<()> {
        self.write_to(out, source_date, true)
    }

    /// With `content` false, files hold zeros of their size.
    fn write_to(
        &mut self,
        out: &mut dyn Write,
        source_date: u64,
        content: bool,
    ) -> std::io::Result<()> {
        let mut tar = tar::Builder::new(out);
        for item in &self.items {
            if content && item.kind == Kind::File {
                append_entry(&mut tar, item, source_date, self.content.open(item)?)?;
            } else {
                let zeros = std::io::repeat(0).take(item.size);
                append_entry(&mut tar, item, source_date, zeros)?;
            }
        }
        tar.finish()
    }
}

/// Counts what is written to it.
struct Counted(u64);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The canonical header of `item` (see the module doc).
fn header_of(item: &Item, source_date: u64) -> std::io::Result<tar::Header> {
    let size = if item.kind == Kind::File {
        item.size
    } else {
        0
    };
    let mut header = crate::oci::tar::owned(
        item.kind.entry_type(),
        item.mode & 0o7777,
        size,
        item.mtime.min(source_date),
        item.uid,
        item.gid,
    );
    if let Some((major, minor)) = item.device {
        header.set_device_major(major)?;
        header.set_device_minor(minor)?;
    }
    Ok(header)
}

/// Appends `item` in its canonical form, a file's content read from `data` (which holds no
/// more than the file's size; nothing is read for other kinds).
fn append_entry<W: Write>(
    tar: &mut tar::Builder<W>,
    item: &Item,
    source_date: u64,
    data: impl Read,
) -> std::io::Result<()> {
    let mut header = header_of(item, source_date)?;
    if let Some(capability) = &item.capability {
        tar.append_pax_extensions([(CAPABILITY, capability.as_slice())])?;
    }
    // `./` first: a layer whose first name starts with `BZh` fails to load
    // (`oci::tar::append`).
    let name = match item.kind {
        Kind::Dir => format!("./{}/", item.path),
        _ => format!("./{}", item.path),
    };
    match (&item.kind, &item.link) {
        (Kind::Symlink | Kind::HardLink, Some(target))
            if header.set_link_name(raw(target)).is_err() =>
        {
            tar.append_link(&mut header, raw(&name), raw(target))
        }
        (Kind::File, _) => crate::oci::tar::append_bytes(tar, header, &bytes(&name), data),
        _ => crate::oci::tar::append_bytes(tar, header, &bytes(&name), std::io::empty()),
    }
}

/// The one extended attribute kept: file capabilities (`setcap`), which both image stores
/// carry. The containerd store writes every other attribute too, the classic store none.
const CAPABILITY: &str = "SCHILY.xattr.security.capability";
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Char,
    Block,
    Fifo,
    /// `dir/.wh.name`: `dir/name` of the layers below is deleted.
    Whiteout,
}

impl Kind {
    /// Whether a group of hard links can have this kind: anything but a directory (a
    /// symlink, a fifo and a device can be linked as a file can: `cp -al` of a tree does).
    fn leads_hard_links(self) -> bool {
        !matches!(self, Kind::Dir | Kind::HardLink | Kind::Whiteout)
    }

    /// The kind of a tar entry at `path` that is not a whiteout.
    fn of(entry_type: tar::EntryType, path: &str) -> std::io::Result<Kind> {
        Ok(match entry_type {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::HardLink,
            tar::EntryType::Char => Kind::Char,
            tar::EntryType::Block => Kind::Block,
            tar::EntryType::Fifo => Kind::Fifo,
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{path}: a tar entry of type {other:?}"),
                ));
            }
        })
    }

    fn entry_type(self) -> tar::EntryType {
        match self {
            Kind::File | Kind::Whiteout => tar::EntryType::Regular,
            Kind::Dir => tar::EntryType::Directory,
            Kind::Symlink => tar::EntryType::Symlink,
            Kind::HardLink => tar::EntryType::Link,
            Kind::Char => tar::EntryType::Char,
            Kind::Block => tar::EntryType::Block,
            Kind::Fifo => tar::EntryType::Fifo,
        }
    }
}

/// One entry of a layer, with where its content starts in the layer's tar.
#[derive(Debug, Clone)]
pub struct Item {
    /// No leading `./` or `/`, no trailing `/`; a whiteout's is `dir/.wh.name`.
    path: String,
    kind: Kind,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
    size: u64,
    data: u64,
    /// A symlink's target as written; a hard link's target path.
    link: Option<String>,
    device: Option<(u32, u32)>,
    capability: Option<Vec<u8>>,
}

impl Item {
    fn whiteout(path: String) -> Item {
        Item {
            path,
            kind: Kind::Whiteout,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime: 0,
            size: 0,
            data: 0,
            link: None,
            device: None,
            capability: None,
        }
    }

    /// The path the entry is about: a whiteout sorts where the name it deletes would.
    fn key(&self) -> String {
        match self.kind {
            Kind::Whiteout => {
                let (dir, name) = split(&self.path);
                join(dir, &name[WHITEOUT.len()..])
            }
            _ => self.path.clone(),
        }
    }
}

/// A name from a tar header as text, one char per byte (U+0000 to U+00FF): names need not be
/// UTF-8, and this keeps every byte and sorts as the bytes do. [`raw`] turns it back.
fn text(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// The bytes [`text`] made a name of, as a path.
fn raw(name: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(bytes(name)).into()
}

/// The bytes [`text`] made a name of.
fn bytes(name: &str) -> Vec<u8> {
    name.chars().map(|c| c as u8).collect()
}

/// `a/b/c` -> (`a/b`, `c`); `c` -> (``, `c`).
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Sorts as a directory walk visits: `a`, `a/x`, `a-b` (component by component).
fn components(path: &str) -> Vec<String> {
    path.split('/').map(str::to_string).collect()
}

/// `./usr/bin/` -> `usr/bin`.
fn canonical(path: &str) -> String {
    let mut path = path;
    loop {
        let trimmed = path.trim_start_matches('/');
        match trimmed.strip_prefix("./") {
            Some(rest) => path = rest,
            None => {
                path = trimmed;
                break;
            }
        }
    }
    let path = path.trim_end_matches('/');
    if path == "." { "" } else { path }.to_string()
}

/// Every entry of the layer (opaque markers apart), the directories marked opaque, and the
/// reader back for the content.
fn read_items<R: Read + Seek>(input: R) -> std::io::Result<(Vec<Item>, Vec<String>, R)> {
    let mut archive = tar::Archive::new(input);
    let mut items = Vec::new();
    let mut opaque = Vec::new();
    for entry in archive.entries_with_seek()? {
        match parse(&mut entry?)? {
            Parsed::Opaque(dir) => opaque.push(dir),
            Parsed::Item(item) => items.push(item),
        }
    }
    Ok((items, opaque, archive.into_inner()))
}

/// A file the build made under a name that the layer format reads as a whiteout: kept, it
/// would delete another name in the image (`.wh.passwd` deletes `passwd`), or fail the load.
fn whiteout_named(path: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{path}: a name beginning with `{WHITEOUT}` marks a deletion in an image layer; the build made one, which no image can hold (rename it)"
        ),
    )
}

/// A layer's entry as normalisation sees it.
enum Parsed {
    /// `dir/.wh..wh..opq`: `dir` hides what the layers below hold in it.
    Opaque(String),
    Item(Item),
}

fn parse<R: Read>(entry: &mut tar::Entry<'_, R>) -> std::io::Result<Parsed> {
    let path = canonical(&text(&entry.path_bytes()));
    let (dir, name) = split(&path);
    if name == OPAQUE {
        return Ok(Parsed::Opaque(dir.to_string()));
    }
    let (capability, pax_mtime) = pax_fields(entry)?;
    let is_dir = entry.header().entry_type() == tar::EntryType::Directory;
    if (name.starts_with(WHITEOUT) && is_dir) || dir.split('/').any(|c| c.starts_with(WHITEOUT)) {
        return Err(whiteout_named(&path));
    }
    if name.starts_with(WHITEOUT) {
        return Ok(Parsed::Item(Item::whiteout(path)));
    }
    let header = entry.header();
    let kind = Kind::of(header.entry_type(), &path)?;
    let link = match kind {
        Kind::Symlink => entry.link_name_bytes().map(|l| text(&l)),
        Kind::HardLink => entry.link_name_bytes().map(|l| canonical(&text(&l))),
        _ => None,
    };
    let device = match kind {
        Kind::Char | Kind::Block => Some((
            header.device_major()?.unwrap_or(0),
            header.device_minor()?.unwrap_or(0),
        )),
        _ => None,
    };
    Ok(Parsed::Item(Item {
        mode: header.mode()?,
        uid: header.uid()?,
        gid: header.gid()?,
        mtime: match pax_mtime {
            Some(mtime) => mtime,
            None => header.mtime()?,
        },
        size: if kind == Kind::File { entry.size() } else { 0 },
        data: entry.raw_file_position(),
        path,
        kind,
        link,
        device,
        capability,
    }))
}

/// The PAX records normalisation keeps: the file capability, and the mtime (past 8^11
/// seconds, 2242, an engine writes the time as a PAX record and 0 in the header; whole
/// seconds are kept).
fn pax_fields<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> std::io::Result<(Option<Vec<u8>>, Option<u64>)> {
    let records: Vec<(String, Vec<u8>)> = match entry.pax_extensions()? {
        Some(extensions) => extensions
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.key().ok()?.to_string(), e.value_bytes().to_vec())))
            .collect(),
        None => Vec::new(),
    };
    let capability = records
        .iter()
        .find(|(key, _)| key == CAPABILITY)
        .map(|(_, value)| value.clone());
    let mtime = records
        .iter()
        .find(|(key, _)| key == "mtime")
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
        .and_then(|value| value.split('.').next()?.parse::<u64>().ok());
    Ok((capability, mtime))
}

/// An opaque directory (`dir/.wh..wh..opq`, written by Docker 20.10's overlay2 driver) hides
/// everything below it in the layers underneath; the containerd store writes a whiteout for
/// each name it deletes instead. The canonical form is the latter: a whiteout for every name
/// the layers below hold in an opaque directory that this layer does not write itself, and,
/// in a directory both hold, for the names below it likewise.
fn explicit_whiteouts(items: &[Item], opaque: &[String], lower: &LowerTree) -> Vec<Item> {
    let written: HashMap<&str, Kind> = items.iter().map(|i| (i.path.as_str(), i.kind)).collect();
    let mut whiteouts = Vec::new();
    let mut pending: Vec<String> = opaque.to_vec();
    while let Some(dir) = pending.pop() {
        for (name, lower_is_dir) in lower.children(&dir) {
            let path = join(&dir, &name);
            match written.get(path.as_str()) {
                None => {
                    let whiteout = join(&dir, &format!("{WHITEOUT}{name}"));
                    if !written.contains_key(whiteout.as_str()) {
                        whiteouts.push(Item::whiteout(whiteout));
                    }
                }
                Some(Kind::Dir) if lower_is_dir => pending.push(path),
                Some(_) => {}
            }
        }
    }
    whiteouts
}

/// In canonical order, the first of a group of hard links holds the content and the others
/// link to it, whichever one the engine wrote first. `items` are sorted.
fn lead_hard_links(mut items: Vec<Item>) -> Vec<Item> {
    let index: HashMap<&str, usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| item.kind != Kind::Whiteout)
        .map(|(i, item)| (item.path.as_str(), i))
        .collect();
    // Each hard link under the file its chain of targets ends at.
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in (0..items.len()).filter(|&i| items[i].kind == Kind::HardLink) {
        let mut root = i;
        for _ in 0..items.len() {
            match items[root].link.as_deref().and_then(|l| index.get(l)) {
                Some(&target) if items[root].kind == Kind::HardLink => root = target,
                _ => break,
            }
        }
        if items[root].kind.leads_hard_links() {
            groups.entry(root).or_default().push(i);
        }
    }
    for (root, mut members) in groups {
        members.push(root);
        members.sort_unstable();
        let content = items[root].clone();
        let first = items[members[0]].path.clone();
        for (n, &m) in members.iter().enumerate() {
            let path = std::mem::take(&mut items[m].path);
            items[m] = if n == 0 {
                // A symlink's target stays its own.
                Item {
                    path,
                    ..content.clone()
                }
            } else {
                Item {
                    path,
                    kind: Kind::HardLink,
                    link: Some(first.clone()),
                    size: 0,
                    ..content.clone()
                }
            };
        }
    }
    items
}

/// What the layers below one hold: each path, and whether it is a directory.
#[derive(Debug, Default, Clone)]
pub struct LowerTree {
    paths: BTreeMap<String, bool>,
}

impl LowerTree {
    /// What `layers`, bottom first, hold together.
    pub fn of(store: &LayerStore, layers: &[StoredLayer]) -> std::io::Result<LowerTree> {
        let mut tree = LowerTree::default();
        tree.apply_stored(store, layers)?;
        Ok(tree)
    }

    /// Applies `layers` from the store, bottom first.
    fn apply_stored(&mut self, store: &LayerStore, layers: &[StoredLayer]) -> std::io::Result<()> {
        for layer in layers {
            let reader = store
                .open_layer(layer)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            self.apply(reader)?;
        }
        Ok(())
    }

    /// Applies a layer walked from its directory ([`overlay::walk`]): what it deletes first
    /// (its opaque directories' content below, its whiteouts' names), then what it writes;
    /// in its tar the same comes in walk order, each deletion before the names it covers.
    fn apply_walked(&mut self, items: &[Item], opaque: &[String]) {
        for dir in opaque {
            self.remove_below(dir);
        }
        for item in items.iter().filter(|i| i.kind == Kind::Whiteout) {
            let deleted = item.key();
            self.remove_below(&deleted);
            self.paths.remove(&deleted);
        }
        for item in items.iter().filter(|i| i.kind != Kind::Whiteout) {
            let is_dir = item.kind == Kind::Dir;
            if !is_dir {
                self.remove_below(&item.path);
            }
            self.paths.insert(item.path.clone(), is_dir);
        }
    }

    /// Applies a layer on top: its whiteouts and opaque directories delete, its entries add.
    pub fn apply(&mut self, layer: impl Read) -> std::io::Result<()> {
        let mut archive = tar::Archive::new(layer);
        for entry in archive.entries()? {
            let entry = entry?;
            let path = canonical(&text(&entry.path_bytes()));
            let (dir, name) = split(&path);
            if name == OPAQUE {
                self.remove_below(dir);
            } else if let Some(deleted) = name.strip_prefix(WHITEOUT) {
                let deleted = join(dir, deleted);
                self.remove_below(&deleted);
                self.paths.remove(&deleted);
            } else {
                let is_dir = entry.header().entry_type() == tar::EntryType::Directory;
                if !is_dir {
                    self.remove_below(&path);
                }
                self.paths.insert(path, is_dir);
            }
        }
        Ok(())
    }

    fn prefix(dir: &str) -> String {
        if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        }
    }

    fn remove_below(&mut self, dir: &str) {
        let prefix = LowerTree::prefix(dir);
        let below: Vec<String> = self
            .paths
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .map(|(p, _)| p.clone())
            .filter(|p| !p.is_empty())
            .collect();
        for path in below {
            self.paths.remove(&path);
        }
    }

    /// The names directly in `dir`, each with whether it is a directory.
    fn children(&self, dir: &str) -> Vec<(String, bool)> {
        let prefix = LowerTree::prefix(dir);
        let mut children: BTreeMap<String, bool> = BTreeMap::new();
        for (path, is_dir) in self
            .paths
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
        {
            let rest = &path[prefix.len()..];
            if rest.is_empty() {
                continue;
            }
            match rest.split_once('/') {
                Some((name, _)) => {
                    children.insert(name.to_string(), true);
                }
                None => {
                    children.entry(rest.to_string()).or_insert(*is_dir);
                }
            }
        }
        children.into_iter().collect()
    }
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
