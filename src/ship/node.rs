//! The work at one node, for both transports: what it needs ([`decide`]), an archive from
//! the layer store and its verification ([`send_and_verify`]), and [`run`], which runs every
//! node's work, one node after another or several at once, and times it.

use super::outcome::{Action, NodeOutcome, Settled, Transfer};
use super::{ShipSettings, Shipment};
use crate::engine::Engine;
use crate::error::Result;
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer;
use crate::output::progress::Phases;
use crate::ship::verify::{self, Holding};
use futures_util::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// What a node needs: nothing, the layers from some point on, or it cannot be asked.
#[derive(Debug)]
pub enum Decision {
    Skip,
    /// Send the layers from `first_missing` on (0: all of them).
    Send {
        first_missing: usize,
    },
    Failed(String),
}

impl Decision {
    /// The outcome of a node that needs no transfer: skipped or failed.
    pub fn settled(&self, node: &str) -> Option<NodeOutcome> {
        match self {
            Decision::Skip => Some(NodeOutcome::new(node, Action::Skipped)),
            Decision::Failed(error) => Some(NodeOutcome::failed(node, error.clone())),
            Decision::Send { .. } => None,
        }
    }
}

/// Asks `node` whether it holds the shipment and, unless `full`, which of its layers.
#[tracing::instrument(skip_all, fields(node = %node.node, image = %shipment.reference), ret(Debug))]
pub async fn decide(
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    chains: &[String],
    full: bool,
) -> Decision {
    if let Err(refused) = runs_the_image(node, shipment).await {
        return Decision::Failed(refused);
    }
    match holding(node, shipment, settings).await {
        Ok(h) if h.state == Holding::Current => Decision::Skip,
        Ok(_) if full => Decision::Send { first_missing: 0 },
        Ok(_) => match transfer::held_prefix(node, settings.cache, chains, &shipment.related).await
        {
            Ok(first_missing) => Decision::Send { first_missing },
            Err(e) => Decision::Failed(e.to_string()),
        },
        Err(e) => Decision::Failed(e.to_string()),
    }
}

/// Whether `node` can run the shipment's platform, asked before any byte is sent: natively,
/// or emulated (a warning: a GB10 image on an x86 node is almost always a mistake in the
/// cluster file), else the refusal, naming the image, the node and both platforms.
async fn runs_the_image(node: &Engine, shipment: &Shipment) -> Result<(), String> {
    let (platform, own) = (&shipment.platform, node.platform());
    match node.runs_platform(platform).await {
        Ok(crate::engine::emulation::Execution::Native) => Ok(()),
        Ok(crate::engine::emulation::Execution::Emulated) => {
            crate::output::stderr(&format!(
                "warning: node `{}` is {own} and would only emulate `{}` ({platform}): is it the node the cluster file means?",
                node.node, shipment.reference
            ));
            Ok(())
        }
        Err(e) => Err(format!(
            "`{}` is {platform} and node `{}` is {own}, which cannot run it: nothing was sent ({})",
            shipment.reference, node.node, e
        )),
    }
}

/// Runs each node's `work` (indexed by node) for the image `reference`, at most `at_once` at
/// a time (1: one after another, in order). Each outcome gets its work's seconds, is noted
/// in `settled`, and `-v` says it as it comes.
pub async fn run<W>(
    work: impl IntoIterator<Item = (usize, W)>,
    at_once: usize,
    phases: &Phases,
    (settled, reference): (&Settled, &str),
) -> Vec<(usize, NodeOutcome)>
where
    W: Future<Output = NodeOutcome>,
{
    let timed = work.into_iter().map(|(i, work)| async move {
        let started = Instant::now();
        let mut outcome = work.await;
        outcome.seconds = started.elapsed().as_secs_f64();
        settled.note(reference, &outcome);
        let (node, action, seconds) = (&outcome.node, &outcome.action, outcome.seconds);
        phases.say(format!("{node}: {action} ({seconds:.2} s)"));
        (i, outcome)
    });
    futures_util::stream::iter(timed)
        .buffer_unordered(at_once.max(1))
        .collect()
        .await
}

/// Sends `image` from layer `first_missing` on, then verifies. A load that fails is judged
/// by what the node then holds: the image (the engine took it all and the answer was lost on
/// the way back: a dropped ssh connection) is verified; a node that no longer answers fails
/// with the load's error; a thin archive the node refused is sent again whole. One the node
/// takes but cannot read all of (`incomplete`) is completed with every layer. An image the
/// node held under the tag without its content is removed once the tag has moved off it.
#[tracing::instrument(skip_all, fields(node = %node.node, image = %shipment.reference, first_missing))]
pub async fn send_and_verify(
    node: &Engine,
    store: &Arc<LayerStore>,
    image: &StoredImage,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    first_missing: usize,
    bar: indicatif::ProgressBar,
) -> NodeOutcome {
    let stub = transfer::incomplete_id(node, &shipment.reference).await;
    let mut first = first_missing;
    let mut sent = Transfer::default();
    let holding = loop {
        let (loaded, went) =
            transfer::send(node, store, image, &shipment.reference, first, &bar).await;
        sent.layer_bytes += went.layer_bytes;
        sent.archive_bytes += went.archive_bytes;
        sent.layers_sent = image.layers.len() - first;
        let holding = holding(node, shipment, settings).await;
        match (loaded, &holding) {
            (_, Ok(h)) if h.state == Holding::Current => break holding,
            // The containerd store keeps blobs under the digest they arrived with; when it
            // cannot find a layer by ours, it refuses the thin archive (Docker 26) or takes
            // the image without all of it (Docker 28): a full archive is the way in.
            (Err(_), Ok(_)) if first > 0 => sent.fell_back_to_full = true,
            (Ok(()), Ok(h)) if first > 0 && h.state == Holding::Incomplete => sent.completed = true,
            (Ok(()), _) => break holding,
            (Err(e), _) => {
                bar.finish_and_clear();
                let (error, transfer) = (e.to_string(), sent);
                return NodeOutcome::new(&node.node, Action::Failed { error, transfer });
            }
        }
        first = 0;
    };
    bar.finish_and_clear();
    let action = if first == 0 {
        Action::Full(sent)
    } else {
        Action::Thin(sent)
    };
    let id = holding.as_ref().ok().and_then(|h| h.image_id.clone());
    let outcome = judged(&node.node, holding, shipment, action);
    if outcome.verified() {
        let (cache, reference) = (settings.cache, &shipment.reference);
        transfer::remember_loaded(cache, node, reference, image, id.as_deref()).await;
        // A load that completed the very image (the same manifest) left it tagged, which
        // `remove_untagged` leaves alone.
        if let Some(stub) = stub {
            node.remove_untagged(&stub).await;
        }
    }
    outcome
}

/// What the node holds under the shipment's tag, against what the builder holds.
pub async fn holding(
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Result<verify::NodeHolding> {
    // The ids engines give the builder's image, from the layer store as it is now (after
    // the export, it knows the image's config and manifest digests).
    let wanted = shipment.wanted(&LayerStore::open(settings.cache));
    // A claim that fails leaves the name as it was: the judgement then says `mismatch`.
    if let Err(e) = claim_short_name(node, &wanted).await {
        tracing::warn!("{e}");
    }
    verify::holding(node, settings.checksum_label, &wanted).await
}

/// [`verify::holdings`] of `wanted` on `node`, each short name claimed first
/// ([`claim_short_name`]): distribute's view of several images at once.
pub async fn holdings(
    node: &Engine,
    label_key: &str,
    wanted: &[verify::Wanted],
) -> Vec<Result<verify::NodeHolding>> {
    for want in wanted {
        // A claim that fails leaves the name as it was: the judgement then says `mismatch`,
        // with what the name runs.
        if let Err(e) = claim_short_name(node, want).await {
            tracing::warn!("{e}");
        }
    }
    verify::holdings(node, label_key, wanted).await
}

/// On Podman, which resolves a short name its own way (`localhost/NAME:TAG` first, then any
/// local name ending so), the shipped image is also named `localhost/NAME:TAG` once the full
/// name holds it, so that a client's `run NAME:TAG` runs it. What that name named before
/// stays on the node (untagged, if it had no other name), and is said.
async fn claim_short_name(node: &Engine, wanted: &verify::Wanted) -> Result<()> {
    let reference = wanted.reference.as_str();
    let short = crate::oci::Reference::parse(reference)
        .ok()
        .filter(|r| r.is_short());
    let (Some(short), crate::engine::Product::Podman) = (short, node.product()) else {
        return Ok(());
    };
    let Some(full) = node.inspect(reference).await? else {
        return Ok(());
    };
    let full_id = full.id().unwrap_or_default();
    if !wanted.holds_id(full_id) {
        return Ok(()); // not the shipped image (yet): a transfer comes first
    }
    let run = node.run_as_typed(reference).await?;
    let hex = |id: &str| id.trim_start_matches("sha256:").to_string();
    if run
        .as_ref()
        .is_some_and(|run| hex(run.id().unwrap_or_default()) == hex(full_id))
    {
        return Ok(());
    }
    let local = short
        .on_localhost()
        .map_err(|e| node.error(format!("naming {reference} for clients: {e}")))?;
    node.tag(full_id, &local).await?;
    let before = match &run {
        Some(run) => {
            let id = hex(run.id().unwrap_or_default());
            format!(
                "it ran image {} ({}), which stays",
                &id[..id.len().min(12)],
                run.repo_tags.join(", ")
            )
        }
        None => "it ran nothing".to_string(),
    };
    crate::output::stderr_exactly(&format!(
        "{}: `run {reference}` now runs the shipped image, named {local} ({before})\n",
        node.node
    ));
    Ok(())
}

/// The outcome of a load, from what the node then holds: `action` if it holds the image,
/// failed (with what `action` sent) otherwise.
pub fn judged(
    node: &str,
    holding: Result<verify::NodeHolding>,
    shipment: &Shipment,
    action: Action,
) -> NodeOutcome {
    let error = match holding {
        Ok(h) if h.state == Holding::Current => return NodeOutcome::new(node, action),
        Ok(h) => format!(
            "node `{node}`: loaded, but the node holds {} as `{}`{}",
            shipment.reference,
            crate::output::cell(&h.state),
            h.detail.map(|d| format!(": {d}")).unwrap_or_default()
        ),
        Err(e) => format!("loaded, but cannot verify: {e}"),
    };
    let transfer = action.transfer();
    NodeOutcome::new(node, Action::Failed { error, transfer })
}
