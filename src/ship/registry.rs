//! `transport = "registry"`: the builder pushes the image once to a registry and the nodes
//! pull it, several at a time. For clusters where one stream per node from the builder is
//! the bottleneck (docs/shipping.md has the arithmetic).
//!
//! Without an operator's `[registry] address`, hallmark runs Docker's own registry
//! (`docker-registry` from Debian, distribution 2.8) on 127.0.0.1 of the machine it runs on,
//! which must be the builder's, for the length of the distribute; its storage stays in the
//! cache so a second push sends nothing. ssh nodes reach it through `ssh -R` to the same
//! port on their own loopback: engines pull from 127.0.0.0/8 over plain HTTP without any
//! insecure-registry setting, and the tunnel rides the connection whose host key is checked.

mod pull;
mod seed;
mod serve;

pub use serve::{Garbage, Registry, Reserved, can_start, collect_garbage, reserve};

use crate::engine::{self, Engine};
use crate::error::Result;
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer;
use crate::inputs::config::RegistryConfig;
use crate::oci::Reference;
use crate::output::progress::{self, Phases};
use crate::ship::node;
use crate::ship::{NodeOutcome, ShipSettings, Shipment};
use pull::{LayerSource, Pulling};
use std::path::Path;
use std::sync::Arc;

/// The shipment's reference, and the same repository and tag under the registry's address.
fn registry_reference(
    engine: &Engine,
    registry: &Registry,
    shipment: &Shipment,
) -> Result<(Reference, Reference)> {
    let reference = Reference::parse(&shipment.reference).map_err(|e| engine.error(e))?;
    let at_registry = format!(
        "{}/{}:{}",
        registry.address,
        reference.name(),
        reference.tag_or_latest()
    );
    let at_registry = Reference::parse(&at_registry).map_err(|e| engine.error(e))?;
    Ok((reference, at_registry))
}

/// Distributes one image to `nodes` (already connected) through `registry`, starting it
/// only if a node needs the image. One outcome per node, in order.
///
/// A containerd store fetches only the layers it has not unpacked: one that holds some of
/// the image's layers from a stream load (kept uncompressed) pulls a manifest naming them
/// compressed, and Docker 28 keeps an image it cannot read. Such a node is completed from
/// the layer store in the same run (the layers it lacks in the form its store needs, over
/// the stream transport).
pub async fn distribute(
    builder: &Engine,
    nodes: &[Engine],
    config: &RegistryConfig,
    cache: &Path,
    store: &Arc<LayerStore>,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Vec<NodeOutcome> {
    let phases = Phases::start(settings.verbose);
    let chains = transfer::chain_ids(&shipment.diff_ids);
    let decisions = futures_util::future::join_all(
        nodes
            .iter()
            .map(|node| node::decide(node, shipment, settings, &chains, true)),
    )
    .await;
    phases.say(format!("asked {} nodes what they hold", nodes.len()));
    let mut outcomes: Vec<Option<NodeOutcome>> = decisions
        .iter()
        .zip(nodes)
        .map(|(decision, node)| decision.settled(&node.node))
        .collect();
    for outcome in outcomes.iter().flatten() {
        settings.settled.note(&shipment.reference, outcome);
    }
    if outcomes.iter().all(Option::is_some) {
        return outcomes.into_iter().flatten().collect();
    }
    let source = LayerSource {
        builder,
        store,
        stored: tokio::sync::Mutex::new(None),
    };
    let pushed = open_and_push(&source, config, cache, shipment, &phases).await;
    let (registry, seeded) = match pushed {
        Ok(pushed) => pushed,
        Err(e) => {
            let message = e.to_string();
            return outcomes
                .into_iter()
                .zip(nodes)
                .map(|(o, node)| {
                    o.unwrap_or_else(|| NodeOutcome::failed(&node.node, message.clone()))
                })
                .collect();
        }
    };
    let bars = progress::bars(settings.progress);
    let pulls = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(i, _)| {
            let (node, registry, source, chains) = (&nodes[i], &registry, &source, &chains);
            let seeded = seeded.as_ref();
            let bar = bars.add(progress::transfer_bar(&node.node));
            let work = async move {
                let pulling = Pulling {
                    source,
                    registry,
                    shipment,
                    settings,
                    chains,
                    seeded,
                };
                let outcome = pulling.pull_and_verify(node, &bar).await;
                bar.finish_and_clear();
                outcome
            };
            (i, work)
        })
        .collect::<Vec<_>>();
    let settled = (settings.settled, shipment.reference.as_str());
    for (i, outcome) in node::run(pulls, config.pulls.unwrap_or(4), &phases, settled).await {
        outcomes[i] = Some(outcome);
    }
    let _ = bars.clear();
    registry.stop().await;
    outcomes
        .into_iter()
        .map(|o| o.expect("every node has an outcome"))
        .collect()
}

/// The registry, open, holding the shipment. The registry hallmark starts is filled from the
/// layer store (`seed.rs`: the blobs as the stream sends them), and that image comes back;
/// an operator's registry gets the builder's push (its credentials are the docker CLI's).
async fn open_and_push(
    source: &LayerSource<'_>,
    config: &RegistryConfig,
    cache: &Path,
    shipment: &Shipment,
    phases: &Phases,
) -> Result<(Registry, Option<StoredImage>)> {
    let registry = Registry::open(config, cache).await?;
    phases.say(format!("registry at {}", registry.address));
    if registry.local_port.is_none() {
        let pushed = push(source.builder, &registry, shipment).await?;
        phases.say(format!(
            "pushed {}: {} layers sent, {} already there",
            shipment.reference, pushed.0, pushed.1
        ));
        return Ok((registry, None));
    }
    let image = source.image(shipment).await?;
    let (reference, at_registry) = registry_reference(source.builder, &registry, shipment)?;
    let linked = (registry.storage.as_deref()).map_or(0, |storage| {
        seed::link_stored(storage, reference.name(), source.store, &image)
    });
    let (sent, present) = seed::push_stored(
        &registry.address,
        reference.name(),
        at_registry.tag_or_latest(),
        source.store,
        &image,
    )
    .await
    .map_err(|e| {
        source.builder.error(format!(
            "cannot put {} into the registry: {e}",
            shipment.reference
        ))
    })?;
    phases.say(format!(
        "put {} into the registry from the layer store: {linked} blobs linked, {sent} blobs sent, {} already there",
        shipment.reference,
        present.saturating_sub(linked)
    ));
    // The signed provenance, if the build kept one for this image, goes beside it.
    let envelope =
        crate::make::provenance::kept_in_store(source.store, image.config.digest.as_ref());
    if let Ok(bytes) = fs_err::read(&envelope) {
        let (digest, manifest) = crate::oci::archive::manifest(&image);
        let tag = seed::push_attestation(
            &registry.address,
            reference.name(),
            (digest.as_ref(), manifest.len()),
            &bytes,
        )
        .await
        .map_err(|e| {
            source.builder.error(format!(
                "cannot put the provenance of {} into the registry: {e}",
                shipment.reference
            ))
        })?;
        phases.say(format!("put its signed provenance beside it, at {tag}"));
    }
    Ok((registry, Some(image)))
}

/// Pushes the builder's image; returns (layers sent, layers the registry had). The engine
/// sends only the layers the registry lacks.
async fn push(
    builder: &Engine,
    registry: &Registry,
    shipment: &Shipment,
) -> Result<(usize, usize)> {
    let (_, pushed) = registry_reference(builder, registry, shipment)?;
    builder.tag(&shipment.image_id, &pushed).await?;
    let stream = builder.push(
        pushed.name(),
        pushed.tag_or_latest(),
        registry.credentials.as_ref(),
    );
    let (mut sent, mut present) = (0, 0);
    let failure = engine::follow(stream, |info| match info.status.as_deref() {
        Some("Pushed") => sent += 1,
        Some("Layer already exists") => present += 1,
        _ => {}
    })
    .await;
    // The registry's name for the image is hallmark's business, not the builder's.
    untag(
        builder,
        &format!("{}:{}", pushed.name(), pushed.tag_or_latest()),
    )
    .await;
    failure.map_err(|message| {
        builder.error(format!(
            "push of {} to the registry at {} failed: {message}",
            shipment.reference, registry.address
        ))
    })?;
    Ok((sent, present))
}

/// Removes one name of an image, never the image (another tag still names it).
async fn untag(engine: &Engine, reference: &str) {
    engine.untag(reference).await;
}
