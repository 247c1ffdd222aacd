//! `hallmark distribute`: moves an image from the builder to the nodes.
//!
//! The builder's export is read once into the layer store (`store.rs`). For each node,
//! hallmark asks which layer chains it already holds and streams an archive in the layout
//! Docker 25+ `docker save` writes (OCI `index.json` and blobs, plus the docker-compatible
//! `manifest.json`) whose manifests list every layer but which carries only the layers the
//! node lacks; Docker 20.10 and the containerd image store both load it. A node that refuses
//! a thin archive gets a full one, and is remembered. `docker load` moves the tag only once
//! the image is complete, so a cut transfer leaves the node's previous image in place.

use crate::engine::{self, Engine, StreamReader};
use crate::error::{Error, Result};
use crate::store::{LayerStore, StoredImage};
use crate::verify::{self, Holding};
use bollard::query_parameters::ImportImageOptionsBuilder;
use futures_util::StreamExt;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Clone, Serialize)]
pub struct NodeOutcome {
    pub node: String,
    /// `skipped`, `thin`, `full`, `pulled` (from a registry) or `failed`.
    pub action: &'static str,
    /// Layer bytes sent (what the node lacked); `archive_bytes` adds the metadata.
    pub layer_bytes: u64,
    pub archive_bytes: u64,
    pub layers_sent: usize,
    pub seconds: f64,
    pub verified: bool,
    /// A thin archive was refused and a full one sent instead (remembered for next time).
    pub fell_back_to_full: bool,
    /// The engine took the image but not all of its content (a containerd store that had
    /// unpacked a layer without keeping its blob under the digest the manifest names), and
    /// an archive with every layer completed it in the same run.
    pub completed: bool,
    pub error: Option<String>,
}

pub struct ShipSettings<'a> {
    pub checksum_label: &'a str,
    pub full: bool,
    pub parallel: bool,
    pub state_dir: &'a Path,
    /// The user's cache, where `loaded/` notes what hallmark loaded into each engine.
    pub cache: &'a Path,
    pub progress: bool,
    /// Say on stderr how long each phase took.
    pub verbose: bool,
}

/// The image as the builder holds it: what every node must end up with.
pub struct Shipment {
    pub reference: String,
    pub checksum: String,
    pub image_id: String,
    pub fingerprint: String,
    /// The layers in order, as the builder reports them: enough to plan before exporting.
    pub diff_ids: Vec<String>,
    /// Images likely to share layers with this one (its tag, its parents), asked first.
    pub related: Vec<String>,
}

/// Finds the image on the builder; it must carry the expected checksum.
pub async fn shipment(
    builder: &Engine,
    reference: &str,
    label_key: &str,
    checksum: &str,
) -> Result<Shipment> {
    let image = builder.inspect(reference).await?.ok_or_else(|| {
        builder.error(format!(
            "does not hold {reference}; run `hallmark build` first"
        ))
    })?;
    let found = verify::label(&image, label_key);
    if found != Some(checksum) {
        return Err(builder.error(format!(
            "{reference} carries checksum {}, the spec says {checksum}; run `hallmark build` first",
            found.unwrap_or("(none)")
        )));
    }
    let image_id = image.id().unwrap_or_default().to_string();
    Ok(Shipment {
        reference: reference.to_string(),
        checksum: checksum.to_string(),
        fingerprint: verify::fingerprint(&image),
        diff_ids: image.layers().to_vec(),
        related: vec![reference.to_string()],
        image_id,
    })
}

/// The image in the layer store, if it is there already.
fn in_store(store: &LayerStore, shipment: &Shipment) -> Option<StoredImage> {
    store.image(&shipment.image_id)
}

/// The builder's `docker save` of the image, by tag (so the archive names it and a node
/// loading it directly gets the tag too).
type ExportStream =
    futures_util::stream::BoxStream<'static, Result<bytes::Bytes, bollard::errors::Error>>;

fn export_stream(builder: &Engine, shipment: &Shipment) -> ExportStream {
    builder.docker.export_image(&shipment.reference).boxed()
}

/// Reads `stream` (the builder's export) into the store. With `direct`, the same stream also
/// goes, as it comes, into that node's load (a full copy): the first node's transfer
/// overlaps the export instead of waiting for it. Bounded channels on both sides.
async fn export(
    builder: &Engine,
    store: &Arc<LayerStore>,
    shipment: &Shipment,
    mut stream: ExportStream,
    direct: Option<(&Engine, &indicatif::ProgressBar)>,
) -> (Result<StoredImage>, Option<Result<(u64, u64)>>) {
    let (ingest_sender, reader) = StreamReader::channel();
    let (node_sender, node_receiver) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let sent = Arc::new(AtomicU64::new(0));
    let forward = {
        let sent = Arc::clone(&sent);
        let mut node_sender = direct.is_some().then_some(node_sender);
        async move {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| std::io::Error::other(e.to_string()));
                if let (Ok(bytes), Some(sender)) = (&chunk, &node_sender) {
                    sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    // A node that stops reading does not stop the export into the store.
                    if sender.send(bytes.clone()).await.is_err() {
                        node_sender = None;
                    }
                }
                let failed = chunk.is_err();
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
        Some(
            load_into(node, &shipment.reference, body, &sent, bar)
                .await
                .map(|()| {
                    let bytes = sent.load(Ordering::Relaxed);
                    (bytes, bytes)
                }),
        )
    };
    let ((), stored, loaded) = tokio::join!(forward, ingest, load);
    // The export went by tag: if the tag moved since the inspect, the layers say so.
    let stored = stored.and_then(|image| {
        if image.diff_ids() != shipment.diff_ids {
            return Err(builder.error(format!(
                "{} moved during the export; run distribute again",
                shipment.reference
            )));
        }
        store.remember(&shipment.image_id, &image)?;
        Ok(image)
    });
    (stored, loaded)
}

/// The builder's image `reference` in the layer store, exported once if it is not there.
pub async fn stored_image(
    builder: &Engine,
    store: &Arc<LayerStore>,
    reference: &str,
) -> Result<(String, StoredImage)> {
    let image = builder
        .inspect(reference)
        .await?
        .ok_or_else(|| builder.error(format!("does not hold {reference}")))?;
    let shipment = Shipment {
        reference: reference.to_string(),
        checksum: String::new(),
        image_id: image.id().unwrap_or_default().to_string(),
        fingerprint: String::new(),
        diff_ids: image.layers().to_vec(),
        related: Vec::new(),
    };
    if let Some(stored) = in_store(store, &shipment) {
        return Ok((shipment.image_id, stored));
    }
    let stream = export_stream(builder, &shipment);
    let (stored, _) = export(builder, store, &shipment, stream, None).await;
    Ok((shipment.image_id, stored?))
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
pub(crate) async fn held_prefix(
    engine: &Engine,
    cache: &Path,
    chains: &[String],
    related: &[String],
) -> Result<usize> {
    let blobs = keeps_blobs(engine).await;
    let prefix_of = |image: crate::answers::ImageAnswer| {
        let layers = image.layers();
        let ours = || {
            let id = image.id().unwrap_or_default();
            loaded(cache, id).is_some_and(|s| s.diff_ids() == layers)
        };
        if blobs && !ours() {
            return 0;
        }
        let held: HashSet<String> = chain_ids(layers).into_iter().collect();
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

/// Whether the engine keeps images in containerd's content store (the containerd image
/// store); if it cannot say, it is taken to (the cost is a thin archive carrying more).
async fn keeps_blobs(engine: &Engine) -> bool {
    engine
        .info()
        .await
        .map_or(true, |info| info.image_store() == "containerd")
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

/// After a verified load of `stored` into `node`: notes the node's id for the image, so
/// that [`held_prefix`] knows which blobs that node's containerd store holds.
async fn remember_loaded(cache: &Path, node: &Engine, reference: &str, stored: &StoredImage) {
    let Ok(Some(image)) = node.inspect(reference).await else {
        return;
    };
    let Some(path) = image.id().and_then(|id| loaded_path(cache, id)) else {
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
/// ([`verify::inspect_whole`]).
async fn incomplete_id(node: &Engine, reference: &str) -> Option<String> {
    match verify::inspect_whole(node, reference, false).await {
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
            Some(parent) => format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{parent} {diff_id}").as_bytes()))
            ),
        };
        chains.push(chain);
    }
    chains
}

/// Distributes one image to `nodes` (already connected); one outcome per node, in order.
pub async fn distribute(
    builder: &Engine,
    nodes: &[Engine],
    store: &Arc<LayerStore>,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Result<Vec<NodeOutcome>> {
    let mut full_nodes = remembered_full_nodes(settings.state_dir);
    let bars = progress_bars(settings);
    // Read-only questions first, to every node at once: does it hold the image, and which
    // of its layers. Transfers come after, serially unless --parallel.
    let phases = Phases::start(settings.verbose);
    let chains = chain_ids(&shipment.diff_ids);
    let mut asking: futures_util::stream::FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let full = settings.full || full_nodes.contains_key(&node.node);
            let chains = &chains;
            async move { (i, decide(node, shipment, settings, chains, full).await) }
        })
        .collect();
    // The builder's `docker save` spends a while before its first byte (Docker 20.10 copies
    // the image aside first). So as soon as one node needs the image and the store lacks it,
    // the export is asked for, and the builder prepares it while the other nodes answer; its
    // first chunk is held (one chunk: memory stays bounded) until every node has.
    let mut stored_image = in_store(store, shipment);
    let mut pending_export = stored_image
        .is_none()
        .then(|| export_stream(builder, shipment));
    let mut first_chunk = None;
    let mut exporting = false;
    let mut decisions: Vec<Option<Decision>> = (0..nodes.len()).map(|_| None).collect();
    while decisions.iter().any(Option::is_none) {
        tokio::select! {
            Some((i, decision)) = asking.next() => {
                exporting |= matches!(decision, Decision::Send { .. });
                decisions[i] = Some(decision);
            }
            chunk = async { pending_export.as_mut().expect("exporting").next().await },
                if exporting && pending_export.is_some() && first_chunk.is_none() => {
                first_chunk = Some(chunk);
            }
        }
    }
    let decisions: Vec<Decision> = decisions.into_iter().map(|d| d.expect("decided")).collect();
    drop(asking);

    phases.say(format!("asked {} nodes what they hold", nodes.len()));
    let mut outcomes: Vec<Option<NodeOutcome>> = vec![None; nodes.len()];
    if let (true, Some(rest)) = (exporting, pending_export.take()) {
        let stream = match first_chunk {
            None => rest,
            Some(None) => futures_util::stream::empty().boxed(),
            Some(Some(chunk)) => futures_util::stream::once(async { chunk })
                .chain(rest)
                .boxed(),
        };
        // The first node that needs everything takes the export as it streams.
        let direct = decisions
            .iter()
            .position(|d| matches!(d, Decision::Send { first_missing: 0 }));
        let bar = bars.add(indicatif::ProgressBar::new(0));
        let started = Instant::now();
        let (stored, loaded) = export(
            builder,
            store,
            shipment,
            stream,
            direct.map(|i| (&nodes[i], &bar)),
        )
        .await;
        bar.finish_and_clear();
        phases.say(format!(
            "exported {} from the builder into the layer store",
            shipment.reference
        ));
        let stored = stored?;
        if let (Some(i), Some(Ok((layer_bytes, archive_bytes)))) = (direct, loaded) {
            let mut outcome = verified(&nodes[i], shipment, settings, "full").await;
            if outcome.verified {
                remember_loaded(settings.cache, &nodes[i], &shipment.reference, &stored).await;
            }
            outcome.layer_bytes = layer_bytes;
            outcome.archive_bytes = archive_bytes;
            outcome.layers_sent = shipment.diff_ids.len();
            outcome.seconds = started.elapsed().as_secs_f64();
            outcomes[i] = Some(outcome);
        }
        stored_image = Some(stored);
        // A direct load that failed is tried again below, from the store.
    }
    let transfers = nodes
        .iter()
        .zip(decisions)
        .enumerate()
        .filter(|(i, _)| outcomes[*i].is_none())
        .map(|(i, (node, decision))| {
            let bar = bars.add(indicatif::ProgressBar::new(0));
            let image = stored_image.clone();
            async move {
                let started = Instant::now();
                let mut outcome = match decision {
                    Decision::Skip => NodeOutcome::new(&node.node, "skipped", true),
                    Decision::Failed(error) => NodeOutcome::failed(&node.node, error),
                    Decision::Send { first_missing } => {
                        let image = image.expect("stored before sending");
                        send_and_verify(node, store, &image, shipment, settings, first_missing, bar)
                            .await
                    }
                };
                outcome.seconds = started.elapsed().as_secs_f64();
                (i, outcome)
            }
        });
    let said = |(i, outcome): (usize, NodeOutcome)| {
        phases.node_done(&outcome);
        (i, outcome)
    };
    let done: Vec<(usize, NodeOutcome)> = if settings.parallel {
        let done = futures_util::future::join_all(transfers).await;
        done.into_iter().map(said).collect()
    } else {
        let mut done = Vec::new();
        for transfer in transfers {
            done.push(said(transfer.await));
        }
        done
    };
    for (i, outcome) in done {
        outcomes[i] = Some(outcome);
    }
    let outcomes: Vec<NodeOutcome> = outcomes
        .into_iter()
        .map(|o| o.expect("every node has an outcome"))
        .collect();
    let _ = bars.clear();
    let mut changed = false;
    for outcome in &outcomes {
        if outcome.fell_back_to_full
            && outcome.verified
            && full_nodes
                .insert(outcome.node.clone(), "full".into())
                .is_none()
        {
            changed = true;
        }
    }
    if changed {
        remember_full_nodes(settings.state_dir, &full_nodes)?;
    }
    Ok(outcomes)
}

/// `-v`: each phase of a distribute on stderr, with the seconds since it began.
pub(crate) struct Phases {
    started: Instant,
    verbose: bool,
}

impl Phases {
    pub(crate) fn start(verbose: bool) -> Phases {
        Phases {
            started: Instant::now(),
            verbose,
        }
    }

    pub(crate) fn say(&self, what: impl AsRef<str>) {
        if self.verbose {
            let seconds = self.started.elapsed().as_secs_f64();
            eprintln!("{seconds:>7.2} s  {}", what.as_ref());
        }
    }

    pub(crate) fn node_done(&self, outcome: &NodeOutcome) {
        let (node, action, seconds) = (&outcome.node, outcome.action, outcome.seconds);
        self.say(format!("{node}: {action} ({seconds:.2} s)"));
    }
}

/// The transfers' progress bars: on stderr when it is a terminal and output is not quiet.
pub(crate) fn progress_bars(settings: &ShipSettings<'_>) -> indicatif::MultiProgress {
    indicatif::MultiProgress::with_draw_target(if settings.progress {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    })
}

/// What a node needs: nothing, the layers from some point on, or it cannot be asked.
pub(crate) async fn decide(
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    chains: &[String],
    full: bool,
) -> Decision {
    match verify::holding(
        node,
        &shipment.reference,
        settings.checksum_label,
        &shipment.checksum,
        &shipment.fingerprint,
    )
    .await
    {
        Ok(h) if h.state == Holding::Current => Decision::Skip,
        Ok(_) if full => Decision::Send { first_missing: 0 },
        Ok(_) => match held_prefix(node, settings.cache, chains, &shipment.related).await {
            Ok(first_missing) => Decision::Send { first_missing },
            Err(e) => Decision::Failed(e.to_string()),
        },
        Err(e) => Decision::Failed(e.to_string()),
    }
}

pub(crate) enum Decision {
    Skip,
    /// Send the layers from `first_missing` on (0: all of them).
    Send {
        first_missing: usize,
    },
    Failed(String),
}

impl NodeOutcome {
    pub(crate) fn new(node: &str, action: &'static str, verified: bool) -> NodeOutcome {
        NodeOutcome {
            node: node.to_string(),
            action,
            layer_bytes: 0,
            archive_bytes: 0,
            layers_sent: 0,
            seconds: 0.0,
            verified,
            fell_back_to_full: false,
            completed: false,
            error: None,
        }
    }

    pub(crate) fn failed(node: &str, error: String) -> NodeOutcome {
        NodeOutcome {
            error: Some(error),
            ..NodeOutcome::new(node, "failed", false)
        }
    }
}

/// Sends `image` from layer `first_missing` on, then verifies. A thin archive the node
/// refuses is sent again whole; one it takes but cannot read all of (`incomplete`) is
/// completed with every layer. An image the node held under the tag without its content is
/// removed once the tag has moved off it.
pub(crate) async fn send_and_verify(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    first_missing: usize,
    bar: indicatif::ProgressBar,
) -> NodeOutcome {
    let stub = incomplete_id(node, &shipment.reference).await;
    let (mut first, mut fell_back, mut completed) = (first_missing, false, false);
    let (mut layer_bytes, mut archive_bytes) = (0, 0);
    let holding = loop {
        let mut attempt = send(node, store, image, &shipment.reference, first, &bar).await;
        // The containerd store keeps blobs under the digest they arrived with; when it cannot
        // find a layer by ours, a full archive is the way in.
        if let (Err(_), true) = (&attempt, first > 0) {
            first = 0;
            fell_back = true;
            attempt = send(node, store, image, &shipment.reference, 0, &bar).await;
        }
        match attempt {
            Ok((layers, archive)) => {
                layer_bytes += layers;
                archive_bytes += archive;
            }
            Err(e) => {
                bar.finish_and_clear();
                return NodeOutcome::failed(&node.node, e.to_string());
            }
        }
        let holding = holding_after(node, shipment, settings).await;
        if first > 0 && matches!(&holding, Ok(h) if h.state == Holding::Incomplete) {
            first = 0;
            completed = true;
            continue;
        }
        break holding;
    };
    bar.finish_and_clear();
    let action = if first == 0 { "full" } else { "thin" };
    let mut outcome = judged(&node.node, holding, shipment, action);
    if outcome.verified {
        remember_loaded(settings.cache, node, &shipment.reference, image).await;
        if let Some(stub) = stub {
            node.remove_untagged(&stub).await;
        }
    }
    outcome.fell_back_to_full = fell_back;
    outcome.completed = completed;
    outcome.layer_bytes = layer_bytes;
    outcome.archive_bytes = archive_bytes;
    outcome.layers_sent = image.layers.len() - first;
    outcome
}

/// The outcome of a load: `action` if the node now holds the image, `failed` otherwise.
pub(crate) async fn verified(
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    action: &'static str,
) -> NodeOutcome {
    let holding = holding_after(node, shipment, settings).await;
    judged(&node.node, holding, shipment, action)
}

/// What the node holds under the shipment's tag, against what the builder holds.
pub(crate) async fn holding_after(
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Result<verify::NodeHolding> {
    verify::holding(
        node,
        &shipment.reference,
        settings.checksum_label,
        &shipment.checksum,
        &shipment.fingerprint,
    )
    .await
}

/// The outcome of a load, from what the node then holds.
pub(crate) fn judged(
    node: &str,
    holding: Result<verify::NodeHolding>,
    shipment: &Shipment,
    action: &'static str,
) -> NodeOutcome {
    let mut outcome = NodeOutcome::new(node, action, false);
    match holding {
        Ok(h) if h.state == Holding::Current => outcome.verified = true,
        Ok(h) => {
            outcome.error = Some(format!(
                "loaded, but the node reports {:?} for {}",
                h.state, shipment.reference
            ))
        }
        Err(e) => outcome.error = Some(format!("loaded, but cannot verify: {e}")),
    }
    if outcome.error.is_some() {
        outcome.action = "failed";
    }
    outcome
}

/// Streams an archive holding `image`'s layers from `first` on into `node`'s load.
pub async fn send(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    reference: &str,
    first: usize,
    bar: &indicatif::ProgressBar,
) -> Result<(u64, u64)> {
    let layer_bytes: u64 = image.layers[first..].iter().map(|l| l.blob.size).sum();
    bar.set_length(layer_bytes);
    let written = Arc::new(AtomicU64::new(0));
    let (store, image_owned, reference_owned) =
        (Arc::clone(store), image.clone(), reference.to_string());
    let body = engine::body_from_writer(Some(Arc::clone(&written)), move |writer| {
        write_archive(&store, &image_owned, &reference_owned, first, writer)
            .map_err(|e| Error::io(store.root.clone(), e))
    });
    load_into(node, reference, body, &written, bar).await?;
    Ok((layer_bytes, written.load(Ordering::Relaxed)))
}

/// Per node on a terminal: bytes, total, rate, time left.
fn transfer_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(
        "{prefix:>10} {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} eta {eta}",
    )
    .expect("valid template")
}

/// A progress bar for one node's transfer.
pub(crate) fn transfer_bar(node: &str) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(0)
        .with_style(transfer_style())
        .with_prefix(node.to_string())
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
    bar.set_style(transfer_style());
    bar.set_prefix(node.node.clone());
    let ticker = {
        let (bar, sent) = (bar.clone(), Arc::clone(sent));
        tokio::spawn(async move {
            loop {
                bar.set_position(sent.load(Ordering::Relaxed));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
    };
    let options = ImportImageOptionsBuilder::new().quiet(true).build();
    let load = node
        .docker
        .import_image_stream(options, body.map(Ok::<_, std::io::Error>), None);
    let failure = engine::follow(load, drop).await;
    ticker.abort();
    match failure {
        Some(message) => Err(node.error(format!("load of {reference} failed: {message}"))),
        None => Ok(()),
    }
}

/// Loads an image hallmark made (`config` and `layers`, the layers already in the store) into
/// the builder, untagged, sending only the layers from `first` on (the builder holds the
/// rest). Returns the builder's id for it: the config digest on the classic store, the
/// manifest digest on the containerd store.
pub async fn load_made(
    builder: &Engine,
    store: &Arc<LayerStore>,
    config: &serde_json::Value,
    layers: Vec<crate::store::StoredLayer>,
    first: usize,
) -> Result<String> {
    let bytes = serde_json::to_vec(config).expect("config serializes");
    let (digest, size) = store.add_blob(|out| out.write_all(&bytes))?;
    let image = StoredImage {
        config: crate::store::Blob {
            digest,
            size,
            media_type: "application/vnd.oci.image.config.v1+json".into(),
        },
        layers,
    };
    let hidden = indicatif::ProgressBar::hidden();
    send(builder, store, &image, "", first, &hidden).await?;
    let (manifest_digest, _) = oci_manifest(&image);
    for id in [image.config.digest.clone(), manifest_digest] {
        if let Some(loaded) = builder.inspect(&id).await? {
            // A containerd store that took the thin archive without the parent's blobs under
            // our digests (Docker 28 answers a stub, Docker 26 leaves it out of its list):
            // every layer completes it.
            if first > 0 && (verify::incomplete(&loaded) || !builder.lists(&id).await?) {
                send(builder, store, &image, "", 0, &hidden).await?;
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

/// The OCI manifest hallmark writes for `image`, and its digest (the image's id on a
/// containerd image store).
pub fn oci_manifest(image: &StoredImage) -> (String, String) {
    let descriptor = |blob: &crate::store::Blob| serde_json::json!({"mediaType": blob.media_type, "digest": blob.digest, "size": blob.size});
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor(&image.config),
        "layers": image.layers.iter().map(|l| descriptor(&l.blob)).collect::<Vec<_>>(),
    })
    .to_string();
    (
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(manifest.as_bytes()))
        ),
        manifest,
    )
}

/// `docker.io/library/hello:latest` from `hello:latest`, as the containerd store names images.
fn qualified(reference: &str) -> String {
    let first = reference.split('/').next().unwrap_or_default();
    let has_registry = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, reference.contains('/')) {
        (true, _) => reference.to_string(),
        (false, true) => format!("docker.io/{reference}"),
        (false, false) => format!("docker.io/library/{reference}"),
    }
}

/// The archive: OCI layout plus docker `manifest.json`, every layer listed, the layers from
/// `first` on included.
fn write_archive(
    store: &LayerStore,
    image: &StoredImage,
    reference: &str,
    first: usize,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(out);
    let add =
        |tar: &mut tar::Builder<&mut _>, path: &str, size: u64, data: &mut dyn std::io::Read| {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o444);
            header.set_size(size);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, path, data)
        };
    let blob_path = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    add(
        &mut tar,
        "oci-layout",
        layout.len() as u64,
        &mut &layout[..],
    )?;
    let mut config = fs_err::File::open(store.blob_path(&image.config.digest))?;
    add(
        &mut tar,
        &blob_path(&image.config.digest),
        image.config.size,
        &mut config,
    )?;
    for layer in &image.layers[first..] {
        let mut file = fs_err::File::open(store.blob_path(&layer.blob.digest))?;
        add(
            &mut tar,
            &blob_path(&layer.blob.digest),
            layer.blob.size,
            &mut file,
        )?;
    }
    let (manifest_digest, manifest) = oci_manifest(image);
    add(
        &mut tar,
        &blob_path(&manifest_digest),
        manifest.len() as u64,
        &mut manifest.as_bytes(),
    )?;
    // An empty reference loads the image untagged (assembly tags it after its smoke tests).
    let annotations = match reference {
        "" => serde_json::json!({}),
        _ => {
            let tag = reference.rsplit_once(':').map_or("latest", |(_, t)| t);
            serde_json::json!({"io.containerd.image.name": qualified(reference), "org.opencontainers.image.ref.name": tag})
        }
    };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": annotations,
        }],
    })
    .to_string();
    add(
        &mut tar,
        "index.json",
        index.len() as u64,
        &mut index.as_bytes(),
    )?;
    let docker_manifest = serde_json::json!([{
        "Config": blob_path(&image.config.digest),
        "RepoTags": if reference.is_empty() { vec![] } else { vec![reference] },
        "Layers": image.layers.iter().map(|l| blob_path(&l.blob.digest)).collect::<Vec<_>>(),
    }])
    .to_string();
    add(
        &mut tar,
        "manifest.json",
        docker_manifest.len() as u64,
        &mut docker_manifest.as_bytes(),
    )?;
    tar.finish()
}

fn remembered_full_nodes(state_dir: &Path) -> BTreeMap<String, String> {
    fs_err::read_to_string(state_dir.join("full-archive-nodes.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn remember_full_nodes(state_dir: &Path, nodes: &BTreeMap<String, String>) -> Result<()> {
    fs_err::create_dir_all(state_dir).map_err(|e| Error::io(state_dir, e))?;
    let path = state_dir.join("full-archive-nodes.json");
    fs_err::write(&path, serde_json::to_string_pretty(nodes).expect("json"))
        .map_err(|e| Error::io(&path, e))
}
