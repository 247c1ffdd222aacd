//! Moving images between an engine and the layer store (`store.rs`), for building and
//! shipping alike: the builder's export read once into the store (an assembly's or a
//! normalisation's parent, a shipment), archives written from the store into an engine's load
//! (a node's thin or full copy, an image hallmark made loaded into the builder), and what an
//! engine already holds of an image's layers, so that an archive carries only the rest.
//!
//! Neither side owns this: `build.rs`, `assemble.rs`, `normalize.rs` and `repro.rs` use it
//! without importing anything of shipping, and both transports of `distribute` use it.

use crate::engine::{self, Engine, StreamReader};
use crate::error::{Error, Result};
use crate::images::identity;
use crate::output::progress;
// The archive format stays in ship.rs until it has a module of its own (oci.rs).
use crate::images::store::{LayerStore, StoredImage};
use crate::oci::{self, Reference};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The builder's image as an export needs it: the tag it goes by (the export is asked by tag,
/// so the archive names it and a node loading it directly gets the tag too), the builder's
/// id for it (the store remembers the export by it) and its layers in order (a tag that moved
/// during the export shows there).
#[derive(Clone, Copy)]
pub struct OnBuilder<'a> {
    pub reference: &'a str,
    pub id: &'a str,
    pub diff_ids: &'a [String],
}

/// The image in the layer store, if it is there already.
pub fn in_store(store: &LayerStore, image: OnBuilder<'_>) -> Option<StoredImage> {
    store.image(image.id)
}

/// The image in the layer store, its record completed if need be: a normalised image's record
/// names its parents' layers, which the store holds only once something exported them (a
/// `from.ref` base is never exported by the build). Rather than export the whole image (a
/// 20 GB `docker save`, which Docker 20.10 spools whole on the builder before its first
/// byte), the smallest of `related` (the image's parents and base, by reference) that the
/// builder holds with the layers the store lacks is exported. None if no parent will do:
/// the caller exports the image.
pub async fn in_store_completed(
    builder: &Engine,
    store: &Arc<LayerStore>,
    image: OnBuilder<'_>,
    related: &[String],
) -> Option<StoredImage> {
    if let Some(stored) = in_store(store, image) {
        return Some(stored);
    }
    let record = store.record(image.id)?;
    let missing = record
        .layers
        .iter()
        .rposition(|l| !store.blob_path(&l.blob.digest).is_file())?;
    // The base comes last in `related`, the image itself first: the smallest parent first.
    for reference in related.iter().rev().filter(|r| *r != image.reference) {
        let Ok(Some(parent)) = builder.inspect(reference).await else {
            continue;
        };
        let layers = parent.layers();
        if layers.len() <= missing
            || layers.len() >= image.diff_ids.len()
            || layers != &image.diff_ids[..layers.len()]
        {
            continue;
        }
        let id = parent.id().unwrap_or_default().to_string();
        let parent = OnBuilder {
            reference,
            id: &id,
            diff_ids: layers,
        };
        let (exported, _) =
            export(builder, store, parent, export_stream(builder, parent), None).await;
        if let Err(e) = exported {
            tracing::warn!("exporting {reference} to complete {}: {e}", image.reference);
            return None;
        }
        tracing::info!(
            "{}: exported its parent {reference} into the layer store, not the whole image",
            image.reference
        );
        return in_store(store, image);
    }
    None
}

/// The builder's `docker save` of the image, by tag.
pub type ExportStream = futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>;

pub fn export_stream(builder: &Engine, image: OnBuilder<'_>) -> ExportStream {
    builder.export(image.reference)
}

/// Reads `stream` (the builder's export) into the store. With `direct`, the same stream also
/// goes, as it comes, into that node's load (a full copy): the first node's transfer
/// overlaps the export instead of waiting for it. Bounded channels on both sides.
pub async fn export(
    builder: &Engine,
    store: &Arc<LayerStore>,
    image: OnBuilder<'_>,
    mut stream: ExportStream,
    direct: Option<(&Engine, &indicatif::ProgressBar)>,
) -> (Result<StoredImage>, Option<Result<(u64, u64)>>) {
    let (ingest_sender, reader) = StreamReader::channel();
    let (node_sender, node_receiver) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let sent = Arc::new(AtomicU64::new(0));
    // Set when the node's load has ended, however: a load that failed (a node that froze
    // and passed its progress deadline) may never drop the channel's other end, and the
    // export, waiting to hand it a chunk, would wait for good (an outside test's hang).
    let (load_ended, mut ended) = tokio::sync::watch::channel(false);
    // The export's own failure (a builder that stopped, its stall deadline passed): the
    // builder's fault, said as such, not as the layer store's that read it.
    let export_failed = std::sync::Mutex::new(None::<String>);
    let forward = {
        let sent = Arc::clone(&sent);
        let export_failed = &export_failed;
        let mut node_sender = direct.is_some().then_some(node_sender);
        async move {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
                if let (Ok(bytes), Some(sender)) = (&chunk, &node_sender) {
                    sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    // A node that stops reading does not stop the export into the store.
                    let handed = tokio::select! {
                        handed = sender.send(bytes.clone()) => handed.is_ok(),
                        _ = ended.wait_for(|ended| *ended) => false,
                    };
                    if !handed {
                        node_sender = None;
                    }
                }
                let failed = chunk.is_err();
                if let Err(e) = &chunk {
                    *export_failed.lock().expect("not poisoned") = Some(e.to_string());
                }
                if ingest_sender.send(chunk).await.is_err() || failed {
                    break;
                }
            }
        }
    };
    let ingest = {
        let store = Arc::clone(store);
        async move {
            tokio::task::spawn_blocking(move || store.ingest(reader))
                .await
                .expect("ingest does not panic")
        }
    };
    let load = async {
        let (node, bar) = direct?;
        let body = futures_util::stream::unfold(node_receiver, |mut r| async move {
            r.recv().await.map(|c| (c, r))
        });
        let loaded = load_into(node, image.reference, body, &sent, bar).await;
        let _ = load_ended.send(true);
        Some(loaded.map(|()| {
            let bytes = sent.load(Ordering::Relaxed);
            (bytes, bytes)
        }))
    };
    let ((), stored, loaded) = tokio::join!(forward, ingest, load);
    let stored = match export_failed.into_inner().expect("not poisoned") {
        Some(why) if stored.is_err() => {
            Err(builder.error(format!("the export of {} failed: {why}", image.reference)))
        }
        _ => stored,
    };
    // The export went by tag: if the tag moved since the inspect, the layers say so.
    let stored = stored.and_then(|stored| {
        if stored.diff_ids() != image.diff_ids {
            return Err(builder.error(format!(
                "{} moved during the export; run distribute again",
                image.reference
            )));
        }
        store.remember(image.id, &stored)?;
        Ok(stored)
    });
    (stored, loaded)
}

/// The builder's image `reference` in the layer store, exported once if it is not there.
pub async fn stored_image(
    builder: &Engine,
    store: &Arc<LayerStore>,
    reference: &str,
) -> Result<(String, StoredImage)> {
    let inspected = builder
        .inspect(reference)
        .await?
        .ok_or_else(|| builder.error(format!("does not hold {reference}")))?;
    let id = inspected.id().unwrap_or_default().to_string();
    let image = OnBuilder {
        reference,
        id: &id,
        diff_ids: inspected.layers(),
    };
    if let Some(stored) = in_store(store, image) {
        return Ok((id, stored));
    }
    let stream = export_stream(builder, image);
    let (stored, _) = export(builder, store, image, stream, None).await;
    Ok((id, stored?))
}

/// How many of `chains` (the image's layer chains, in order) the node already holds in the
/// form its image store needs them.
///
/// The classic store keys layers by chain: any image holding a chain holds what a load
/// needs. The containerd store needs more: the blob each manifest names, under that digest,
/// in its content store; a layer it unpacked from a registry pull (kept compressed) or
/// from another archive is no help to ours, and Docker 28 takes such a thin archive and keeps
/// an image it cannot read (Docker 26 refuses it). So on a containerd store only images
/// hallmark loaded there count ([`remember_loaded`]), and only if the engine can read them.
///
/// The images most likely to share layers are asked first, by name: the image's own tag (an
/// older build) and its parents. Only if none of them is there are all the node's images
/// inspected, which on a node with hundreds of images takes seconds.
pub async fn held_prefix(
    engine: &Engine,
    cache: &Path,
    chains: &[String],
    related: &[String],
) -> Result<usize> {
    let blobs = keeps_blobs(engine).await;
    let prefix_of = |image: crate::engine::ImageAnswer| {
        let held = usable_chains(cache, blobs, &image);
        chains.iter().take_while(|c| held.contains(*c)).count()
    };
    let mut best = None;
    for reference in related {
        if let Some(image) = engine.inspect(reference).await? {
            best = best.max(Some(prefix_of(image)));
        }
    }
    if let Some(best) = best {
        return Ok(best);
    }
    let mut best = 0;
    for id in engine.all_image_ids().await? {
        if let Some(image) = engine.inspect(&id).await? {
            best = best.max(prefix_of(image));
        }
    }
    Ok(best)
}

/// The layer chains of `image` (an engine's answer) a load into that engine can build on:
/// all of them on the classic store; on a containerd store (`blobs`), only those of an image
/// hallmark loaded there ([`held_prefix`] says why).
pub fn usable_chains(
    cache: &Path,
    blobs: bool,
    image: &crate::engine::ImageAnswer,
) -> HashSet<String> {
    let layers = image.layers();
    let ours =
        || loaded(cache, image.id().unwrap_or_default()).is_some_and(|s| s.diff_ids() == layers);
    if blobs && !ours() {
        return HashSet::new();
    }
    chain_ids(layers).into_iter().collect()
}

/// Whether the engine keeps layer blobs as loaded (the containerd image store); if it cannot
/// say, it is taken to (the cost is a thin archive carrying more).
pub async fn keeps_blobs(engine: &Engine) -> bool {
    engine
        .store()
        .await
        .map_or(true, |store| store.keeps_blobs())
}

/// Where hallmark notes what it loaded into engines: `<cache>/loaded/<hex>.json`, named by
/// the engine's id for the image (on a containerd store, the digest of the manifest the load
/// wrote), holding its config and layer blobs. Apart from the layer store, so that emptying
/// or pruning the store does not make the nodes look empty; a few hundred bytes an image.
fn loaded_path(cache: &Path, id: &str) -> Option<std::path::PathBuf> {
    let hex = id.strip_prefix("sha256:")?;
    let plain = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    plain.then(|| cache.join("loaded").join(format!("{hex}.json")))
}

/// What hallmark loaded into an engine that knows it as `id`, if it noted it.
fn loaded(cache: &Path, id: &str) -> Option<StoredImage> {
    let text = fs_err::read_to_string(loaded_path(cache, id)?).ok()?;
    serde_json::from_str(&text).ok()
}

/// After a verified load of `stored` into `node`: notes the node's id for the image (`id`,
/// where the verification saw it; asked otherwise), so that [`held_prefix`] knows which
/// blobs that node's containerd store holds.
pub async fn remember_loaded(
    cache: &Path,
    node: &Engine,
    reference: &str,
    stored: &StoredImage,
    id: Option<&str>,
) {
    let id = match id {
        Some(id) => id.to_string(),
        // An inspect is no light request on a containerd store (Docker 28 sizes the image).
        None => match node.inspect(reference).await {
            Ok(Some(image)) => image.id().unwrap_or_default().to_string(),
            _ => return,
        },
    };
    let Some(path) = loaded_path(cache, &id) else {
        return;
    };
    if path.exists() {
        return;
    }
    // A note not written costs the next thin archive to this node its thinness, nothing more.
    let text = serde_json::to_string(stored).expect("serializes");
    let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
    let _ = fs_err::create_dir_all(path.parent().expect("a folder"))
        .and_then(|()| fs_err::write(&temporary, text))
        .and_then(|()| fs_err::rename(&temporary, &path));
}

/// The id of the image `reference` names on `node` if the engine lacks some of its content
/// ([`identity::inspect_whole`]).
pub async fn incomplete_id(node: &Engine, reference: &str) -> Option<String> {
    match identity::inspect_whole(node, reference, false).await {
        Ok(Some((image, false))) => image.id().map(str::to_string),
        _ => None,
    }
}

/// The OCI chain ID of each prefix: what both image stores key layers by.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chains: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let chain = match chains.last() {
            None => diff_id.clone(),
            Some(parent) => crate::oci::Digest::of(format!("{parent} {diff_id}")).to_string(),
        };
        chains.push(chain);
    }
    chains
}

/// What a load's archive put on the wire: its layers' bytes and all of its bytes. A load
/// that failed part way counts what went before it failed, its layer bytes up to the
/// layers' total (the rest of an archive is a few KiB of configs and manifests).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sent {
    pub layer_bytes: u64,
    pub archive_bytes: u64,
}

/// Streams an archive holding `image`'s layers from `first` on into `node`'s load; returns
/// what went, whether or not the load succeeded.
#[tracing::instrument(skip_all, fields(node = %node.node, image = reference, first, layers = image.layers.len() - first))]
pub async fn send(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    reference: &str,
    first: usize,
    bar: &indicatif::ProgressBar,
) -> (Result<()>, Sent) {
    send_as(node, store, image, reference, first, bar, reference).await
}

/// [`send`] of an image loaded untagged; a failed load names it as `what`.
async fn send_untagged(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    first: usize,
    bar: &indicatif::ProgressBar,
    what: &str,
) -> (Result<()>, Sent) {
    send_as(node, store, image, "", first, bar, what).await
}

/// [`send`], a failed load naming the image as `what`.
async fn send_as(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    reference: &str,
    first: usize,
    bar: &indicatif::ProgressBar,
    what: &str,
) -> (Result<()>, Sent) {
    let layer_bytes: u64 = image.layers[first..].iter().map(|l| l.blob.size).sum();
    bar.set_length(layer_bytes);
    let written = Arc::new(AtomicU64::new(0));
    // An empty reference loads the image untagged (assembly tags it after its smoke tests).
    let tagged = match reference {
        "" => None,
        reference => match Reference::parse(reference) {
            Ok(tagged) => Some(tagged),
            Err(e) => return (Err(node.error(e)), Sent::default()),
        },
    };
    let (store, image_owned) = (Arc::clone(store), image.clone());
    let body = engine::body_from_writer(Some(Arc::clone(&written)), move |writer| {
        oci::archive::write(&*store, &image_owned, tagged.as_ref(), first, writer)
            .map_err(|e| Error::io(store.root.clone(), e))
    });
    let loaded = load_into(node, what, body, &written, bar).await;
    let archive_bytes = written.load(Ordering::Relaxed);
    let sent = Sent {
        layer_bytes: layer_bytes.min(archive_bytes),
        archive_bytes,
    };
    (loaded, sent)
}

/// Streams one archive holding several images into `node`'s load (`oci::archive::write_many`:
/// each image's layers from its `first` on, a shared blob once); returns the archive bytes
/// that went, whether or not the load succeeded.
pub async fn send_many(
    node: &Engine,
    store: &Arc<LayerStore>,
    images: Vec<(StoredImage, Reference, usize)>,
    bar: &indicatif::ProgressBar,
) -> (Result<()>, u64) {
    let written = Arc::new(AtomicU64::new(0));
    let store = Arc::clone(store);
    let what = images
        .iter()
        .map(|(_, reference, _)| reference.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let body = engine::body_from_writer(Some(Arc::clone(&written)), move |writer| {
        let entries: Vec<_> = images.iter().map(|(i, r, f)| (i, Some(r), *f)).collect();
        oci::archive::write_many(&*store, &entries, writer)
            .map_err(|e| Error::io(store.root.clone(), e))
    });
    let loaded = load_into(node, &what, body, &written, bar).await;
    (loaded, written.load(Ordering::Relaxed))
}

/// `docker load` of `body` into `node`, with a progress bar fed by the `sent` counter.
async fn load_into(
    node: &Engine,
    reference: &str,
    body: impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static,
    sent: &Arc<AtomicU64>,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    bar.set_position(0);
    bar.set_style(progress::transfer_style());
    bar.set_prefix(node.node.clone());
    progress::track(bar);
    let ticker = {
        let (bar, sent) = (bar.clone(), Arc::clone(sent));
        tokio::spawn(async move {
            loop {
                bar.set_position(sent.load(Ordering::Relaxed));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
    };
    // When the last byte went, for where a load's time goes: sending, then the engine's
    // unpacking after it (`RUST_LOG=hallmark::images::transfer=info`; scripts/bench-first-copy).
    let started = std::time::Instant::now();
    let last_byte = Arc::new(std::sync::OnceLock::new());
    let body = body.chain({
        let last_byte = Arc::clone(&last_byte);
        futures_util::stream::once(async move {
            let _ = last_byte.set(std::time::Instant::now());
        })
        .filter_map(|()| async { None })
    });
    let load = node.import(body, true);
    let failure = engine::follow(load, drop).await;
    ticker.abort();
    if let Some(last) = last_byte.get() {
        tracing::info!(
            node = %node.node,
            bytes = sent.load(Ordering::Relaxed),
            "load: sending_s={:.2} after_s={:.2}",
            last.duration_since(started).as_secs_f64(),
            last.elapsed().as_secs_f64()
        );
    }
    if let Err(message) = failure {
        let link = node.link_ended().await.map(|why| format!(" ({why})"));
        return Err(node.error(format!(
            "load of {reference} failed: {message}{}",
            link.unwrap_or_default()
        )));
    }
    Ok(())
}

/// Loads an image hallmark made (`config` and `layers`, the layers already in the store) into
/// the builder, untagged, sending only the layers from `first` on (the builder holds the
/// rest). Returns the builder's id for it: the config digest on the classic store, the
/// manifest digest on the containerd store.
pub async fn load_made(
    builder: &Engine,
    store: &Arc<LayerStore>,
    config: &serde_json::Value,
    layers: Vec<crate::images::store::StoredLayer>,
    first: usize,
    what: &str,
) -> Result<String> {
    let bytes = serde_json::to_vec(config).expect("config serializes");
    let (digest, size) = store.add_blob(|out| out.write_all(&bytes))?;
    let image = StoredImage {
        config: crate::images::store::Blob {
            digest,
            size,
            media_type: oci::archive::CONFIG.into(),
        },
        layers,
    };
    let hidden = indicatif::ProgressBar::hidden();
    send_untagged(builder, store, &image, first, &hidden, what)
        .await
        .0?;
    settle(builder, store, image, first).await
}

/// What a normaliser hands the load as it makes it: each new layer, then the whole image, its
/// config in the store.
pub enum Made {
    /// A layer in the store: written from there, under its digest.
    Layer(crate::images::store::StoredLayer),
    /// A layer of this many bytes, which follow as [`Made::Chunk`]s as they are made, then
    /// [`Made::End`]: put into the load while it is written into the store (Docker's classic
    /// store only, which reads layers by the names `manifest.json` gives; the containerd
    /// store takes the OCI layout, which names blobs by a digest known only at the end).
    Begin(u64),
    Chunk(bytes::Bytes),
    /// The layer begun is not coming after all: the load's archive is cut short there (the
    /// engine drops it) and a new load begins.
    Abandon,
    End(crate::images::store::StoredLayer),
    Image(StoredImage),
}

/// [`load_made`] of an image whose new layers come one by one on `made` as they are made:
/// each goes into the load at once, the config and manifests last (engines take an archive's
/// entries in any order). If `made` ends without the image, the archive names no image, so
/// the load leaves nothing, and this fails. A layer abandoned on its way ([`Made::Abandon`])
/// cuts the load's archive short, which the engine drops, and a new load begins, with the
/// layers the first had taken sent from the store.
pub async fn load_streamed(
    builder: &Engine,
    store: &Arc<LayerStore>,
    made: std::sync::mpsc::Receiver<Made>,
    first: usize,
    what: &str,
) -> Result<String> {
    let made = Arc::new(std::sync::Mutex::new(made));
    let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
    let slot = Arc::new(std::sync::Mutex::new(None));
    loop {
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let body = {
            let (store, made, taken) = (Arc::clone(store), Arc::clone(&made), Arc::clone(&taken));
            let (slot, abandoned) = (Arc::clone(&slot), Arc::clone(&abandoned));
            engine::body_from_writer(None, move |out| {
                let mut load = Streamed {
                    store: &store,
                    made: &made.lock().expect("not poisoned"),
                    taken: &mut taken.lock().expect("not poisoned"),
                    slot: &slot,
                };
                let whole = load
                    .write(out)
                    .map_err(|e| Error::io(store.root.clone(), e))?;
                abandoned.store(!whole, Ordering::Relaxed);
                Ok(())
            })
        };
        let hidden = indicatif::ProgressBar::hidden();
        let loaded = load_into(builder, what, body, &Arc::new(AtomicU64::new(0)), &hidden).await;
        if !abandoned.load(Ordering::Relaxed) {
            loaded?;
            break;
        }
    }
    let image = slot.lock().expect("not poisoned").take();
    let image = image.ok_or_else(|| builder.error("the normalised image was not made"))?;
    settle(builder, store, image, first).await
}

/// One load's archive of a streamed image (see [`load_streamed`]).
struct Streamed<'a> {
    store: &'a LayerStore,
    made: &'a std::sync::mpsc::Receiver<Made>,
    /// Every layer a load took whole so far, in this load or one cut short before it.
    taken: &'a mut Vec<crate::images::store::StoredLayer>,
    slot: &'a std::sync::Mutex<Option<StoredImage>>,
}

impl Streamed<'_> {
    /// Writes the archive; `false` when a layer was abandoned (the archive cut short).
    fn write(&mut self, out: &mut impl std::io::Write) -> std::io::Result<bool> {
        let mut tar = oci::tar::Builder::new(out);
        oci::archive::write_layout(&mut tar)?;
        let mut written = HashSet::new();
        for layer in self.taken.iter() {
            if written.insert(layer.blob.digest.clone()) {
                oci::archive::write_blob(&mut tar, self.store, &layer.blob)?;
            }
        }
        let mut streamed: HashMap<oci::Digest, String> = HashMap::new();
        let mut made = self.made.iter();
        while let Some(message) = made.next() {
            match message {
                Made::Layer(layer) => {
                    if written.insert(layer.blob.digest.clone()) {
                        oci::archive::write_blob(&mut tar, self.store, &layer.blob)?;
                    }
                    self.taken.push(layer);
                }
                Made::Begin(size) => {
                    let path = format!("layers/{}.tar", streamed.len());
                    let mut chunks = Chunks {
                        made: &mut made,
                        current: bytes::Bytes::new(),
                        read: 0,
                        end: None,
                        abandoned: false,
                    };
                    let header = oci::tar::header(oci::tar::EntryType::Regular, 0o444, size, 0);
                    let appended = oci::tar::append(&mut tar, header, &path, &mut chunks);
                    match chunks.end {
                        Some(layer) if appended.is_ok() && chunks.read == size => {
                            streamed.insert(layer.blob.digest.clone(), path);
                            self.taken.push(layer);
                        }
                        _ if chunks.abandoned => return Ok(false),
                        _ => {
                            return appended
                                .and(Err(std::io::Error::other("a layer was cut short")));
                        }
                    }
                }
                Made::Chunk(_) | Made::End(_) | Made::Abandon => {
                    return Err(std::io::Error::other("a layer's bytes out of place"));
                }
                Made::Image(image) => {
                    oci::archive::write_blob(&mut tar, self.store, &image.config)?;
                    if streamed.is_empty() {
                        oci::archive::write_manifests(&mut tar, &image, None)?;
                    } else {
                        let path_of =
                            |blob: &crate::images::store::Blob| match streamed.get(&blob.digest) {
                                Some(path) => path.clone(),
                                None => oci::archive::blob_path(&blob.digest),
                            };
                        oci::archive::write_docker_manifest(&mut tar, &image, None, path_of)?;
                    }
                    tar.finish()?;
                    *self.slot.lock().expect("not poisoned") = Some(image);
                    return Ok(true);
                }
            }
        }
        Ok(true)
    }
}

/// A streamed layer's bytes, read from the [`Made::Chunk`]s up to its [`Made::End`]; a
/// [`Made::Abandon`] ends them in an error.
struct Chunks<'a, I: Iterator<Item = Made>> {
    made: &'a mut I,
    current: bytes::Bytes,
    read: u64,
    end: Option<crate::images::store::StoredLayer>,
    abandoned: bool,
}

impl<I: Iterator<Item = Made>> std::io::Read for Chunks<'_, I> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.end.is_some() {
                return Ok(0);
            }
            match self.made.next() {
                Some(Made::Chunk(bytes)) => self.current = bytes,
                Some(Made::End(layer)) => self.end = Some(layer),
                Some(Made::Abandon) => {
                    self.abandoned = true;
                    return Err(std::io::Error::other("the layer was abandoned"));
                }
                _ => return Err(std::io::Error::other("the normalisation stopped")),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        self.read += n as u64;
        Ok(n)
    }
}

/// After a load of `image` (its layers from `first` on sent): the builder's id for it,
/// recorded in the store.
async fn settle(
    builder: &Engine,
    store: &Arc<LayerStore>,
    image: StoredImage,
    first: usize,
) -> Result<String> {
    let hidden = indicatif::ProgressBar::hidden();
    let (manifest_digest, _) = oci::archive::manifest(&image);
    for id in [image.config.digest.to_string(), manifest_digest.to_string()] {
        if let Some(loaded) = builder.inspect(&id).await? {
            // A containerd store that took the thin archive without the parent's blobs under
            // our digests (Docker 28 answers a stub, Docker 26 leaves it out of its list):
            // every layer completes it.
            if first > 0 && (identity::incomplete(&loaded) || !builder.lists(&id).await?) {
                send(builder, store, &image, "", 0, &hidden).await.0?;
            }
            store.remember(&id, &image)?;
            return Ok(id);
        }
    }
    Err(builder.error(format!(
        "the image {} hallmark loaded cannot be found",
        image.config.digest
    )))
}
