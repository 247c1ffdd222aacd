//! Many images in one go over the stream transport (`distribute A B C`, `--all`): each node
//! gets ONE archive holding every image it lacks, only the layers it lacks (a layer two of
//! them share, once), in one load; then each image is verified on its own.
//!
//! What the nodes hold is asked once per node for all the images (one listing, then the
//! images it may hold, several at a time); which layers a node holds is asked of the images
//! likely to share them (every shipment's tag and parents), once per node. A load that fails
//! as a whole (a thin archive the node refuses, an image whose blobs the store cannot read)
//! is followed by each of its images alone, the way one image goes (`node::send_and_verify`,
//! with its fallbacks), so a bad image fails alone, named with its node, and the others are
//! verified; an image the load left incomplete is completed alone with every layer.

use super::node::{self, Decision};
use super::outcome::{Action, NodeOutcome, Transfer};
use super::slots::Slots;
use super::{ShipSettings, Shipment};
use crate::engine::Engine;
use crate::engine::Product;
use crate::error::Result;
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer;
use crate::oci::Reference;
use crate::output::progress::{self, Phases};
use crate::ship::verify::{self, Holding};
use futures_util::StreamExt;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// Each shipment's image in the layer store, if a node needs it; an export that failed is
/// the image's error, shared by every node that needed it.
type Stored = Vec<Option<std::result::Result<StoredImage, Arc<crate::error::Error>>>>;

/// How many inspects of one engine are asked at once.
const INSPECTS_AT_ONCE: usize = 8;

/// What one node needs of each shipment, in order.
struct NodePlan {
    decisions: Vec<Decision>,
    /// The node holds the tag without the image's content: sent alone (its stub is removed).
    incomplete: Vec<bool>,
}

/// Distributes `shipments` to `nodes` (already connected): the outcomes image by image, each
/// node by node, in order.
pub async fn distribute_many(
    builder: &Engine,
    nodes: &[Engine],
    store: &Arc<LayerStore>,
    shipments: &[Shipment],
    settings: &ShipSettings<'_>,
) -> Result<Vec<Vec<NodeOutcome>>> {
    let phases = Phases::start(settings.verbose);
    let full_nodes = super::remembered_full_nodes(settings.state_dir);
    let plans = futures_util::future::join_all(nodes.iter().map(|node| {
        let full = settings.full || full_nodes.contains_key(&node.node);
        plan(node, store, shipments, settings, full)
    }))
    .await;
    phases.say(format!(
        "asked {} nodes what they hold of {} images",
        nodes.len(),
        shipments.len()
    ));
    let stored = stored_images(builder, store, shipments, &plans).await;
    phases.say("the images the nodes need are in the layer store");
    let loads: Vec<u64> = plans.iter().map(|plan| load_of(plan, &stored)).collect();
    let slots = Slots::new(settings.parallel, nodes, &loads).await;
    let bars = progress::bars(settings.progress);
    let work = nodes
        .iter()
        .zip(plans)
        .enumerate()
        .map(|(i, (node, plan))| {
            let bar = bars.add(indicatif::ProgressBar::new(0));
            let (stored, slots, phases) = (&stored, &slots, &phases);
            let work = async move {
                let started = Instant::now();
                let mut outcomes = serve(node, store, shipments, stored, plan, settings, bar).await;
                let seconds = started.elapsed().as_secs_f64();
                for (outcome, shipment) in outcomes.iter_mut().zip(shipments) {
                    outcome.seconds = seconds;
                    settings.settled.note(&shipment.reference, outcome);
                }
                phases.say(format!(
                    "{}: {} images ({seconds:.2} s)",
                    node.node,
                    outcomes.len()
                ));
                (i, outcomes)
            };
            slots.hold(i, work)
        });
    let mut by_node: Vec<(usize, Vec<NodeOutcome>)> = futures_util::stream::iter(work)
        .buffer_unordered(slots.at_once)
        .collect()
        .await;
    let _ = bars.clear();
    by_node.sort_by_key(|(i, _)| *i);
    let outcomes: Vec<Vec<NodeOutcome>> = (0..shipments.len())
        .map(|image| by_node.iter().map(|(_, o)| o[image].clone()).collect())
        .collect();
    super::note_full_nodes(settings.state_dir, full_nodes, outcomes.iter().flatten())?;
    Ok(outcomes)
}

/// The bytes `plan` sends its node (at least 1 if it sends anything): what `Slots` weighs.
fn load_of(plan: &NodePlan, stored: &Stored) -> u64 {
    let mut bytes = 0;
    for (decision, stored) in plan.decisions.iter().zip(stored) {
        if let (Decision::Send { first_missing }, Some(Ok(image))) = (decision, stored) {
            let layers = &image.layers[(*first_missing).min(image.layers.len())..];
            bytes += layers.iter().map(|l| l.blob.size).sum::<u64>().max(1);
        }
    }
    bytes
}

fn sends(decision: &Decision) -> bool {
    matches!(decision, Decision::Send { .. })
}

/// What `node` needs of each shipment (everything, where `full`).
async fn plan(
    node: &Engine,
    store: &LayerStore,
    shipments: &[Shipment],
    settings: &ShipSettings<'_>,
    full: bool,
) -> NodePlan {
    let wanted: Vec<verify::Wanted> = shipments.iter().map(|s| s.wanted(store)).collect();
    let holdings = node::holdings(node, settings.checksum_label, &wanted).await;
    // Tags the node was just seen not to hold: no layer to build on under them.
    let absent: HashSet<&str> = shipments
        .iter()
        .zip(&holdings)
        .filter(|(_, h)| matches!(h, Ok(h) if h.state == Holding::Missing))
        .map(|(s, _)| s.reference.as_str())
        .collect();
    let mut held: Option<Result<Vec<HashSet<String>>>> = None;
    let mut plan = NodePlan {
        decisions: Vec::new(),
        incomplete: Vec::new(),
    };
    for (shipment, holding) in shipments.iter().zip(holdings) {
        let decision = match &holding {
            Err(e) => Decision::Failed(e.to_string()),
            Ok(h) if h.state == Holding::Current => Decision::Skip,
            Ok(_) if full => Decision::Send { first_missing: 0 },
            Ok(_) => {
                if held.is_none() {
                    held = Some(held_chains(node, settings, shipments, &absent).await);
                }
                match held.as_ref().expect("asked") {
                    Ok(sets) => Decision::Send {
                        first_missing: prefix(sets, &transfer::chain_ids(&shipment.diff_ids)),
                    },
                    Err(e) => Decision::Failed(e.to_string()),
                }
            }
        };
        let incomplete = matches!(&holding, Ok(h) if h.state == Holding::Incomplete);
        plan.decisions.push(decision);
        plan.incomplete.push(incomplete);
    }
    plan
}

/// The longest run of `chains` (an image's, in order) one of the node's images holds.
fn prefix(sets: &[HashSet<String>], chains: &[String]) -> usize {
    let held = |set: &HashSet<String>| chains.iter().take_while(|c| set.contains(*c)).count();
    sets.iter().map(held).max().unwrap_or(0)
}

/// The layer chains each of the node's images a load can build on holds: the images the
/// shipments name as related (their tags, their parents), each asked once unless `absent`;
/// only if none of them is there, every image of the node (as `transfer::held_prefix` does
/// for one image).
async fn held_chains(
    node: &Engine,
    settings: &ShipSettings<'_>,
    shipments: &[Shipment],
    absent: &HashSet<&str>,
) -> Result<Vec<HashSet<String>>> {
    let blobs = transfer::keeps_blobs(node).await;
    let related: BTreeSet<&str> = shipments
        .iter()
        .flat_map(|s| s.related.iter().map(String::as_str))
        .filter(|reference| !absent.contains(reference))
        .collect();
    let mut sets = chains_of(
        node,
        settings,
        blobs,
        related.into_iter().map(str::to_string),
    )
    .await?;
    if sets.is_empty() {
        sets = chains_of(node, settings, blobs, node.all_image_ids().await?).await?;
    }
    Ok(sets)
}

/// [`transfer::usable_chains`] of each of `references` the node holds.
async fn chains_of(
    node: &Engine,
    settings: &ShipSettings<'_>,
    blobs: bool,
    references: impl IntoIterator<Item = String>,
) -> Result<Vec<HashSet<String>>> {
    let answers: Vec<Result<_>> = futures_util::stream::iter(references)
        .map(|reference| async move { node.inspect(&reference).await })
        .buffered(INSPECTS_AT_ONCE)
        .collect()
        .await;
    let mut sets = Vec::new();
    for answer in answers {
        if let Some(image) = answer? {
            sets.push(transfer::usable_chains(settings.cache, blobs, &image));
        }
    }
    Ok(sets)
}

/// Each shipment some node needs, in the layer store (exported once if it is not there); an
/// export that failed is that image's error.
async fn stored_images(
    builder: &Engine,
    store: &Arc<LayerStore>,
    shipments: &[Shipment],
    plans: &[NodePlan],
) -> Stored {
    let mut stored = Vec::new();
    for (i, shipment) in shipments.iter().enumerate() {
        if !plans.iter().any(|p| sends(&p.decisions[i])) {
            stored.push(None);
            continue;
        }
        let on_builder = shipment.on_builder();
        let completed =
            transfer::in_store_completed(builder, store, on_builder, &shipment.related).await;
        let image = match completed {
            Some(image) => Ok(image),
            None => {
                let stream = transfer::export_stream(builder, shipment.on_builder());
                let (image, _) =
                    transfer::export(builder, store, shipment.on_builder(), stream, None).await;
                image.map_err(Arc::new)
            }
        };
        stored.push(Some(image));
    }
    stored
}

/// One node's images: those it needs in one archive, then each verified; the outcomes in
/// the shipments' order.
async fn serve(
    node: &Engine,
    store: &Arc<LayerStore>,
    shipments: &[Shipment],
    stored: &Stored,
    plan: NodePlan,
    settings: &ShipSettings<'_>,
    bar: indicatif::ProgressBar,
) -> Vec<NodeOutcome> {
    let mut outcomes: Vec<Option<NodeOutcome>> = vec![None; shipments.len()];
    // (image, what it is in the store, its first missing layer)
    let mut together = Vec::new();
    let mut alone = Vec::new();
    for (i, decision) in plan.decisions.into_iter().enumerate() {
        let Decision::Send { first_missing } = decision else {
            outcomes[i] = decision.settled(&node.node);
            continue;
        };
        match stored[i].clone().expect("stored for a node that needs it") {
            Err(e) => outcomes[i] = Some(NodeOutcome::failed(&node.node, e.to_string())),
            Ok(image) if plan.incomplete[i] => alone.push((i, image, first_missing)),
            Ok(image) => together.push((i, image, first_missing)),
        }
    }
    // Podman 4 reads an archive of several images as a `docker save` (its OCI reader takes
    // one manifest) and names them `localhost/...`, not the names sent: one archive each.
    if together.len() == 1 || node.product() == Product::Podman {
        alone.append(&mut together);
    }
    let mut completing = HashSet::new();
    if !together.is_empty() {
        let sent = send_together(node, store, shipments, &together, settings, &bar).await;
        match sent {
            Ok(judged) => {
                for ((i, image, first), judged) in together.into_iter().zip(judged) {
                    match judged {
                        Judged::Done(outcome) => outcomes[i] = Some(outcome),
                        Judged::Complete => {
                            completing.insert(i);
                            alone.push((i, image, 0));
                        }
                        Judged::Alone => alone.push((i, image, first)),
                    }
                }
            }
            // The archive could not be made: each image alone says which one, and why.
            Err(_) => alone.append(&mut together),
        }
    }
    alone.sort_by_key(|(i, _, _)| *i);
    for (i, image, first) in alone {
        let shipment = &shipments[i];
        let mut outcome =
            node::send_and_verify(node, store, &image, shipment, settings, first, bar.clone())
                .await;
        if completing.contains(&i)
            && let Action::Full(sent) = &mut outcome.action
        {
            sent.completed = true;
        }
        outcomes[i] = Some(outcome);
    }
    bar.finish_and_clear();
    outcomes
        .into_iter()
        .map(|o| o.expect("every image has an outcome"))
        .collect()
}

/// What became of one image of an archive of several.
enum Judged {
    Done(NodeOutcome),
    /// The node took it without all of its content: completed alone, with every layer.
    Complete,
    /// The load failed and the node, which answers, does not hold it: sent alone, which
    /// says whether it is this image the node refuses.
    Alone,
}

/// Sends `together` in one archive and verifies each image, in order. A load that failed is
/// judged image by image by what the node then holds, as a single image's is
/// ([`node::send_and_verify`]): an image it holds is verified, the others are sent alone,
/// or fail with the load's error if the node no longer answers.
async fn send_together(
    node: &Engine,
    store: &Arc<LayerStore>,
    shipments: &[Shipment],
    together: &[(usize, StoredImage, usize)],
    settings: &ShipSettings<'_>,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Judged>> {
    let mut entries = Vec::new();
    for (i, image, first) in together {
        let reference = Reference::parse(&shipments[*i].reference).map_err(|e| node.error(e))?;
        entries.push((image.clone(), reference, *first));
    }
    let mut carried = carried(together);
    bar.set_length(carried.iter().map(|t| t.layer_bytes).sum());
    let (loaded, archive_bytes) = transfer::send_many(node, store, entries, bar).await;
    share_out(&mut carried, archive_bytes);
    let wanted: Vec<verify::Wanted> = together
        .iter()
        .map(|(i, _, _)| shipments[*i].wanted(store))
        .collect();
    let holdings = node::holdings(node, settings.checksum_label, &wanted).await;
    let (mut judged, mut loaded_images) = (Vec::new(), Vec::new());
    for (((i, image, first), holding), sent) in together.iter().zip(holdings).zip(carried) {
        let shipment = &shipments[*i];
        match (&loaded, &holding) {
            (Ok(()), Ok(h)) if *first > 0 && h.state == Holding::Incomplete => {
                judged.push(Judged::Complete);
                continue;
            }
            (Err(_), Ok(h)) if h.state != Holding::Current => {
                judged.push(Judged::Alone);
                continue;
            }
            (Err(e), Err(_)) => {
                let (error, transfer) = (e.to_string(), sent);
                let failed = NodeOutcome::new(&node.node, Action::Failed { error, transfer });
                judged.push(Judged::Done(failed));
                continue;
            }
            _ => {}
        }
        let action = if *first == 0 {
            Action::Full(sent)
        } else {
            Action::Thin(sent)
        };
        let id = holding.as_ref().ok().and_then(|h| h.image_id.clone());
        let outcome = node::judged(&node.node, holding, shipment, action);
        if outcome.verified() {
            loaded_images.push((&shipment.reference, image, id));
        }
        judged.push(Judged::Done(outcome));
    }
    // What hallmark loaded where, noted for the next thin archives (under the id the
    // verification saw: no request of its own).
    futures_util::stream::iter(loaded_images)
        .for_each_concurrent(INSPECTS_AT_ONCE, |(reference, image, id)| async move {
            transfer::remember_loaded(settings.cache, node, reference, image, id.as_deref()).await
        })
        .await;
    Ok(judged)
}

/// Shares the `archive_bytes` that went out among the images as the archive carries them, in
/// order: each its layers until the bytes run out (a load cut short), the archive's own files
/// (index, manifests, configs) counted with the first image.
fn share_out(carried: &mut [Transfer], archive_bytes: u64) {
    let layers: u64 = carried.iter().map(|t| t.layer_bytes).sum();
    let mut left = archive_bytes;
    for sent in carried.iter_mut() {
        sent.layer_bytes = sent.layer_bytes.min(left);
        sent.archive_bytes = sent.layer_bytes;
        left -= sent.layer_bytes;
    }
    if let Some(first) = carried.first_mut() {
        first.archive_bytes += archive_bytes.saturating_sub(layers);
    }
}

/// What the archive carries for each image: its layers from its first missing one on that
/// no earlier image of the archive carried already.
fn carried(together: &[(usize, StoredImage, usize)]) -> Vec<Transfer> {
    let mut seen = HashSet::new();
    together
        .iter()
        .map(|(_, image, first)| {
            let mut sent = Transfer::default();
            for layer in &image.layers[*first..] {
                if seen.insert(layer.blob.digest.clone()) {
                    sent.layer_bytes += layer.blob.size;
                    sent.layers_sent += 1;
                }
            }
            sent.archive_bytes = sent.layer_bytes;
            sent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carrying(layer_bytes: &[u64]) -> Vec<Transfer> {
        let each = |&layer_bytes| Transfer {
            layer_bytes,
            archive_bytes: layer_bytes,
            layers_sent: 1,
            ..Transfer::default()
        };
        layer_bytes.iter().map(each).collect()
    }

    fn shared(carried: &[Transfer]) -> Vec<(u64, u64)> {
        carried
            .iter()
            .map(|t| (t.layer_bytes, t.archive_bytes))
            .collect()
    }

    #[test]
    fn a_whole_archive_counts_its_own_files_with_the_first_image() {
        let mut carried = carrying(&[100, 50]);
        share_out(&mut carried, 160);
        assert_eq!(shared(&carried), [(100, 110), (50, 50)]);
    }

    #[test]
    fn an_archive_cut_short_counts_only_what_went() {
        let mut carried = carrying(&[100, 50, 30]);
        share_out(&mut carried, 120);
        assert_eq!(shared(&carried), [(100, 100), (20, 20), (0, 0)]);
        let mut carried = carrying(&[100]);
        share_out(&mut carried, 0);
        assert_eq!(shared(&carried), [(0, 0)]);
    }
}
