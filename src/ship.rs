//! `hallmark distribute`: moves an image from the builder to the nodes.
//!
//! The builder's export is read once into the layer store (`transfer.rs`). For each node,
//! hallmark asks which layer chains it already holds and streams an archive in the layout
//! Docker 25+ `docker save` writes (OCI `index.json` and blobs, plus the docker-compatible
//! `manifest.json`) whose manifests list every layer but which carries only the layers the
//! node lacks; Docker 20.10 and the containerd image store both load it. A node that refuses
//! a thin archive gets a full one, and is remembered. `docker load` moves the tag only once
//! the image is complete, so a cut transfer leaves the node's previous image in place.
//!
//! This file is the stream transport's distribute; `registry.rs` is the registry transport's.
//! Both run each node's work through `ship/node.rs` and report `ship/outcome.rs`'s outcomes.

pub mod registry;
pub mod superseded;
pub mod verify;

pub mod batch;
pub mod choose;
pub mod junit;
pub mod node;
pub mod outcome;
pub mod slots;
pub mod targets;

pub use outcome::{Action, NodeOutcome, Settled, Shipped, Transfer};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::images::identity;
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer::{self, ExportStream, OnBuilder};
use crate::output::progress::{self, Phases};
use crate::plan::{Plan, PlannedImage};
use futures_util::StreamExt;
use node::Decision;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

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
    /// Each node's outcome as it is settled, for the report of an interrupted distribute.
    pub settled: &'a Settled,
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
    /// The image's platform (`linux/arm64/v8`): a node must be able to run it.
    pub platform: String,
}

impl Shipment {
    /// What a node should hold, as `verify` compares it (`store`: where hallmark's archive of
    /// it may be, which a containerd node knows by its manifest digest).
    pub fn wanted(&self, store: &LayerStore) -> verify::Wanted {
        verify::Wanted {
            reference: self.reference.clone(),
            checksum: self.checksum.clone(),
            fingerprint: self.fingerprint.clone(),
            ids: identity::known_ids(store, &self.image_id),
        }
    }

    /// The builder's image, as its export into the layer store names it.
    pub fn on_builder(&self) -> OnBuilder<'_> {
        OnBuilder {
            reference: &self.reference,
            id: &self.image_id,
            diff_ids: &self.diff_ids,
        }
    }
}

/// Finds the image on the builder; it must carry the expected checksum, and be one hallmark
/// finished ([`identity::unfinished`]).
pub async fn shipment(
    builder: &Engine,
    store: &LayerStore,
    reference: &str,
    label_key: &str,
    checksum: &str,
) -> Result<Shipment> {
    let image = builder.inspect(reference).await?.ok_or_else(|| {
        builder.error(format!(
            "does not hold {reference}; run `hallmark build` first"
        ))
    })?;
    let found = identity::label(&image, label_key);
    if found != Some(checksum) {
        return Err(builder.error(format!(
            "{reference} carries checksum {}, the spec says {checksum}; run `hallmark build` first",
            found.unwrap_or("(none)")
        )));
    }
    let image_id = image.id().unwrap_or_default().to_string();
    if let Some(why) = identity::unfinished(store, &image_id, checksum) {
        return Err(builder.error(format!(
            "{reference} carries checksum {checksum} but hallmark did not finish it ({why}); run `hallmark build` (it tags the image it made, or makes it again)"
        )));
    }
    Ok(Shipment {
        reference: reference.to_string(),
        checksum: checksum.to_string(),
        fingerprint: identity::fingerprint(&image),
        diff_ids: image.layers().to_vec(),
        related: vec![reference.to_string()],
        platform: image.platform(),
        image_id,
    })
}

/// Distributes one image to `nodes` (already connected); one outcome per node, in order.
///
/// Read-only questions first, to every node at once: does it hold the image, and which of
/// its layers. Then the export into the layer store, if a node needs the image and the store
/// lacks it; then the transfers, one node after another unless `--parallel`.
#[tracing::instrument(skip_all, fields(image = %shipment.reference, nodes = nodes.len()))]
pub async fn distribute(
    builder: &Engine,
    nodes: &[Engine],
    store: &Arc<LayerStore>,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Result<Vec<NodeOutcome>> {
    let full_nodes = remembered_full_nodes(settings.state_dir);
    let run = Distribute {
        builder,
        nodes,
        store,
        shipment,
        settings,
        bars: progress::bars(settings.progress),
        phases: Phases::start(settings.verbose),
    };
    let mut stored = transfer::in_store(store, shipment.on_builder());
    // A record that lacks only its parents' layers is completed once a node needs the image
    // (the base exported, not the whole image); if it cannot be, the image is exported.
    let completable = stored.is_none() && store.record(&shipment.image_id).is_some();
    let unread = (stored.is_none() && !completable)
        .then(|| transfer::export_stream(builder, shipment.on_builder()));
    let (decisions, mut export) = run.ask(&full_nodes, unread).await;
    if completable && decisions.iter().any(|d| matches!(d, Decision::Send { .. })) {
        let on_builder = shipment.on_builder();
        stored = transfer::in_store_completed(builder, store, on_builder, &shipment.related).await;
        if stored.is_none() {
            export = Some(transfer::export_stream(builder, on_builder));
        }
    }
    run.phases
        .say(format!("asked {} nodes what they hold", nodes.len()));
    let mut outcomes: Vec<Option<NodeOutcome>> = vec![None; nodes.len()];
    if let Some(export) = export {
        let (image, direct) = run.export(&decisions, export).await?;
        if let Some((i, outcome)) = direct {
            outcomes[i] = Some(outcome);
        }
        stored = Some(image);
    }
    for (i, outcome) in run.transfers(decisions, &outcomes, stored).await {
        outcomes[i] = Some(outcome);
    }
    let _ = run.bars.clear();
    let outcomes: Vec<NodeOutcome> = outcomes
        .into_iter()
        .map(|o| o.expect("every node has an outcome"))
        .collect();
    note_full_nodes(settings.state_dir, full_nodes, &outcomes)?;
    Ok(outcomes)
}

/// Remembers the nodes that refused a thin archive and took a full one (`outcomes`), so that
/// the next distribute sends them full archives at once.
fn note_full_nodes<'a>(
    state_dir: &Path,
    mut full_nodes: BTreeMap<String, String>,
    outcomes: impl IntoIterator<Item = &'a NodeOutcome>,
) -> Result<()> {
    let mut changed = false;
    for outcome in outcomes {
        if outcome.action.transfer().fell_back_to_full
            && outcome.verified()
            && full_nodes
                .insert(outcome.node.clone(), "full".into())
                .is_none()
        {
            changed = true;
        }
    }
    if changed {
        remember_full_nodes(state_dir, &full_nodes)?;
    }
    Ok(())
}

/// One image's distribute over the stream transport, phase by phase.
struct Distribute<'a> {
    builder: &'a Engine,
    nodes: &'a [Engine],
    store: &'a Arc<LayerStore>,
    shipment: &'a Shipment,
    settings: &'a ShipSettings<'a>,
    bars: indicatif::MultiProgress,
    phases: Phases,
}

impl Distribute<'_> {
    /// Asks every node at once what it needs (a node in `full_nodes` needs everything).
    ///
    /// The builder's `docker save` spends a while before its first byte (Docker 20.10 copies
    /// the image aside first). So as soon as one node needs the image, `unread` (the export,
    /// when the store lacks the image) is asked for, and the builder prepares it while the
    /// other nodes answer; its first chunk is held (one chunk: memory stays bounded) until
    /// every node has. Returns the decisions, and the export if a node needs it.
    async fn ask(
        &self,
        full_nodes: &BTreeMap<String, String>,
        mut unread: Option<ExportStream>,
    ) -> (Vec<Decision>, Option<ExportStream>) {
        let (shipment, settings) = (self.shipment, self.settings);
        let chains = transfer::chain_ids(&shipment.diff_ids);
        let mut asking: futures_util::stream::FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let full = settings.full || full_nodes.contains_key(&node.node);
                let chains = &chains;
                async move {
                    (
                        i,
                        node::decide(node, shipment, settings, chains, full).await,
                    )
                }
            })
            .collect();
        let mut first_chunk = None;
        let mut needed = false;
        let mut decisions: Vec<Option<Decision>> = self.nodes.iter().map(|_| None).collect();
        while decisions.iter().any(Option::is_none) {
            tokio::select! {
                Some((i, decision)) = asking.next() => {
                    needed |= matches!(decision, Decision::Send { .. });
                    decisions[i] = Some(decision);
                }
                chunk = async { unread.as_mut().expect("exporting").next().await },
                    if needed && unread.is_some() && first_chunk.is_none() => {
                    first_chunk = Some(chunk);
                }
            }
        }
        let decisions = decisions.into_iter().map(|d| d.expect("decided")).collect();
        let export = unread.filter(|_| needed).map(|rest| match first_chunk {
            None => rest,
            Some(None) => futures_util::stream::empty().boxed(),
            Some(Some(chunk)) => futures_util::stream::once(async { chunk })
                .chain(rest)
                .boxed(),
        });
        (decisions, export)
    }

    /// Reads `export` into the layer store. The first node that needs everything takes the
    /// export as it streams; its outcome comes back if that load worked (one that failed is
    /// tried again from the store, with the other nodes).
    async fn export(
        &self,
        decisions: &[Decision],
        export: ExportStream,
    ) -> Result<(StoredImage, Option<(usize, NodeOutcome)>)> {
        let (nodes, shipment) = (self.nodes, self.shipment);
        let direct = decisions
            .iter()
            .position(|d| matches!(d, Decision::Send { first_missing: 0 }));
        let bar = self.bars.add(indicatif::ProgressBar::new(0));
        let started = Instant::now();
        let (stored, loaded) = transfer::export(
            self.builder,
            self.store,
            shipment.on_builder(),
            export,
            direct.map(|i| (&nodes[i], &bar)),
        )
        .await;
        bar.finish_and_clear();
        self.phases.say(format!(
            "exported {} from the builder into the layer store",
            shipment.reference
        ));
        let stored = stored?;
        let (Some(i), Some(Ok((layer_bytes, archive_bytes)))) = (direct, loaded) else {
            return Ok((stored, None));
        };
        let holding = node::holding(&nodes[i], shipment, self.settings).await;
        let sent = Transfer {
            layer_bytes,
            archive_bytes,
            layers_sent: shipment.diff_ids.len(),
            ..Transfer::default()
        };
        let id = holding.as_ref().ok().and_then(|h| h.image_id.clone());
        let mut outcome = node::judged(&nodes[i].node, holding, shipment, Action::Full(sent));
        if outcome.verified() {
            let (cache, reference) = (self.settings.cache, &shipment.reference);
            transfer::remember_loaded(cache, &nodes[i], reference, &stored, id.as_deref()).await;
        }
        outcome.seconds = started.elapsed().as_secs_f64();
        self.settings.settled.note(&shipment.reference, &outcome);
        Ok((stored, Some((i, outcome))))
    }

    /// Every node without an outcome yet: skipped, failed, or sent what it lacks from
    /// `stored` (there whenever a node needs anything) and verified.
    async fn transfers(
        &self,
        decisions: Vec<Decision>,
        outcomes: &[Option<NodeOutcome>],
        stored: Option<StoredImage>,
    ) -> Vec<(usize, NodeOutcome)> {
        let (store, shipment, settings) = (self.store, self.shipment, self.settings);
        let loads: Vec<u64> = decisions
            .iter()
            .enumerate()
            .map(|(i, decision)| match (decision, &stored) {
                (Decision::Send { first_missing }, Some(image)) if outcomes[i].is_none() => {
                    let layers = &image.layers[(*first_missing).min(image.layers.len())..];
                    layers.iter().map(|l| l.blob.size).sum::<u64>().max(1)
                }
                _ => 0,
            })
            .collect();
        let work = self
            .nodes
            .iter()
            .zip(decisions)
            .enumerate()
            .filter(|(i, _)| outcomes[*i].is_none())
            .map(|(i, (node, decision))| {
                let bar = self.bars.add(indicatif::ProgressBar::new(0));
                let image = stored.clone();
                let work = async move {
                    let Decision::Send { first_missing } = decision else {
                        return decision.settled(&node.node).expect("no transfer");
                    };
                    let image = image.expect("stored before sending");
                    node::send_and_verify(
                        node,
                        store,
                        &image,
                        shipment,
                        settings,
                        first_missing,
                        bar,
                    )
                    .await
                };
                (i, work)
            })
            .collect::<Vec<_>>();
        let slots = slots::Slots::new(settings.parallel, self.nodes, &loads).await;
        let work = work.into_iter().map(|(i, work)| (i, slots.hold(i, work)));
        let settled = (settings.settled, shipment.reference.as_str());
        node::run(work, slots.at_once, &self.phases, settled).await
    }
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

/// The builder's image for `image`, checked against its checksum, with the names of the
/// images most likely to share its layers: its parents, up to the external base.
pub async fn planned_shipment(
    builder: &Engine,
    store: &LayerStore,
    plan: &Plan,
    image: &PlannedImage,
    checksum_label: &str,
) -> Result<Shipment> {
    let mut shipment = shipment(
        builder,
        store,
        &image.loaded.reference(),
        checksum_label,
        image.checksum.as_str(),
    )
    .await?;
    let mut current = image;
    while let Some(parent) = &current.parent {
        current = plan.get(parent);
        shipment.related.push(current.loaded.reference());
    }
    if let Some(base) = &current.pins.base {
        shipment.related.push(base.reference.to_string());
    }
    Ok(shipment)
}
