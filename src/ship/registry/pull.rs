//! The nodes' side of the registry transport: each node pulls the image (through an `ssh -R`
//! tunnel to the registry hallmark started), the tag moves to it, and a node that pulled an
//! image it cannot read all of (or a classic node that would download again what it holds)
//! gets the layers it lacks from the layer store by stream.

use super::{Registry, registry_reference, untag};
use crate::engine::{self, Engine};
use crate::error::Result;
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer;
use crate::ship::node;
use crate::ship::verify::Holding;
use crate::ship::{Action, NodeOutcome, ShipSettings, Shipment, Transfer};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One node's pull, with what every node's pull shares.
pub(super) struct Pulling<'a> {
    pub(super) source: &'a LayerSource<'a>,
    pub(super) registry: &'a Registry,
    pub(super) shipment: &'a Shipment,
    pub(super) settings: &'a ShipSettings<'a>,
    pub(super) chains: &'a [String],
    /// The image as the registry hallmark started holds it (from the layer store), if so.
    pub(super) seeded: Option<&'a StoredImage>,
}

impl Pulling<'_> {
    /// One node pulls the image and is verified; a node that pulled an image it cannot read
    /// all of is completed from the layer store. A classic node that holds some of the
    /// image's layers it did not pull from this registry gets the rest by stream instead.
    pub(super) async fn pull_and_verify(
        &self,
        node: &Engine,
        bar: &indicatif::ProgressBar,
    ) -> NodeOutcome {
        let (shipment, settings) = (self.shipment, self.settings);
        if let Some(outcome) = self.by_stream(node, bar).await {
            return outcome;
        }
        let pulled = match refuse_podman(node).await {
            Ok(()) => pull(node, self.registry, shipment, self.seeded, bar).await,
            Err(e) => Err(e),
        };
        let pulled = match pulled {
            Ok(pulled) => pulled,
            Err(e) => return NodeOutcome::failed(&node.node, e.to_string()),
        };
        let holding = node::holding(node, shipment, settings).await;
        let mut outcome = if matches!(&holding, Ok(h) if h.state == Holding::Incomplete) {
            complete(
                self.source,
                node,
                shipment,
                settings,
                self.chains,
                bar.clone(),
            )
            .await
        } else {
            let action = Action::Pulled(Transfer::default());
            node::judged(&node.node, holding, shipment, action)
        };
        if let Action::Pulled(sent) = &mut outcome.action {
            sent.layers_sent += pulled.layers;
            sent.layer_bytes += pulled.bytes;
            sent.archive_bytes += pulled.bytes;
            if let Some(image) = self.seeded {
                note_pulled(settings.cache, node, image);
            }
        }
        // Loaded means loaded, by any transport: a pull of what hallmark seeded put the layer
        // store's blobs, under their digests, into the node, as a stream load does. Noted
        // alike, a later stream update to a containerd store is thin (it sent the whole
        // image again: 20 GB a node for the cluster's images).
        if let Some(image) = self.seeded
            && outcome.verified()
        {
            let reference = &shipment.reference;
            transfer::remember_loaded(settings.cache, node, reference, image, None).await;
        }
        outcome
    }

    /// Docker's classic store skips a layer it holds only if it learned the registry's
    /// digest for it from an earlier pull or push of that blob: layers it got by stream are
    /// downloaded again (seen on Docker 20.10). So a classic node whose pull would download
    /// more of what it holds (layers it did not pull from the registry hallmark fills) than
    /// of what it lacks gets the layers it lacks as a thin archive instead: `Some` outcome;
    /// `None` when it pulls.
    async fn by_stream(&self, node: &Engine, bar: &indicatif::ProgressBar) -> Option<NodeOutcome> {
        let image = self.seeded?;
        if transfer::keeps_blobs(node).await {
            return None;
        }
        let (cache, related) = (self.settings.cache, &self.shipment.related);
        let first = transfer::held_prefix(node, cache, self.chains, related)
            .await
            .ok()?;
        let pulled = pulled_digests(cache, node);
        let again: u64 = image.layers[..first]
            .iter()
            .filter(|l| !pulled.contains(l.blob.digest.as_str()))
            .map(|l| l.blob.size)
            .sum();
        let lacking: u64 = image.layers[first..].iter().map(|l| l.blob.size).sum();
        if again <= lacking {
            return None;
        }
        let store = self.source.store;
        let settings = self.settings;
        Some(
            node::send_and_verify(
                node,
                store,
                image,
                self.shipment,
                settings,
                first,
                bar.clone(),
            )
            .await,
        )
    }
}

/// `<cache>/registry/pulled/<node>.json`: the blobs a classic node pulled from the registry
/// hallmark fills, whose digests it now knows.
fn pulled_path(cache: &Path, node: &Engine) -> PathBuf {
    cache
        .join("registry/pulled")
        .join(format!("{}.json", node.node))
}

fn pulled_digests(cache: &Path, node: &Engine) -> std::collections::BTreeSet<String> {
    fs_err::read_to_string(pulled_path(cache, node))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// After a verified pull of `image` by `node`: its blobs' digests are known to the node. A
/// note not written costs that node's next update a stream instead of a pull.
fn note_pulled(cache: &Path, node: &Engine, image: &StoredImage) {
    let mut digests = pulled_digests(cache, node);
    digests.extend(image.layers.iter().map(|l| l.blob.digest.to_string()));
    let path = pulled_path(cache, node);
    let text = serde_json::to_string(&digests).expect("serializes");
    let _ = fs_err::create_dir_all(path.parent().expect("a folder"))
        .and_then(|()| fs_err::write(&path, text));
}

/// Where a node that pulled an image it cannot read gets the layers it lacks: the layer
/// store, the image exported into it once, whichever node needs it first.
pub(super) struct LayerSource<'a> {
    pub(super) builder: &'a Engine,
    pub(super) store: &'a Arc<LayerStore>,
    pub(super) stored: tokio::sync::Mutex<Option<StoredImage>>,
}

impl LayerSource<'_> {
    /// The shipment in the layer store, exported into it once, by whoever asks first.
    pub(super) async fn image(&self, shipment: &Shipment) -> Result<StoredImage> {
        let mut stored = self.stored.lock().await;
        if stored.is_none() {
            let on_builder = shipment.on_builder();
            *stored = transfer::in_store_completed(
                self.builder,
                self.store,
                on_builder,
                &shipment.related,
            )
            .await;
        }
        if stored.is_none() {
            let (_, image) =
                transfer::stored_image(self.builder, self.store, &shipment.reference).await?;
            *stored = Some(image);
        }
        Ok(stored.clone().expect("stored"))
    }
}

/// Sends a node that pulled an image it cannot read all of the layers its store lacks, from
/// the layer store. The outcome is `pulled` and `completed` if the node then holds the whole
/// image.
async fn complete(
    source: &LayerSource<'_>,
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    chains: &[String],
    bar: indicatif::ProgressBar,
) -> NodeOutcome {
    let image = match source.image(shipment).await {
        Ok(image) => image,
        Err(e) => {
            return NodeOutcome::failed(
                &node.node,
                format!("pulled an image the node cannot read all of, and cannot complete it: {e}"),
            );
        }
    };
    let first = match transfer::held_prefix(node, settings.cache, chains, &shipment.related).await {
        Ok(first) => first,
        Err(e) => return NodeOutcome::failed(&node.node, e.to_string()),
    };
    let store = source.store;
    let mut outcome =
        node::send_and_verify(node, store, &image, shipment, settings, first, bar).await;
    if let Action::Thin(sent) | Action::Full(sent) = outcome.action {
        outcome.action = Action::Pulled(Transfer {
            completed: true,
            ..sent
        });
    }
    outcome
}

struct Pulled {
    layers: usize,
    /// Compressed bytes downloaded, as the engine reports them.
    bytes: u64,
}

/// One node pulls the image, then the tag moves to it (the previous image stays under the
/// tag until the pull is whole).
async fn pull(
    node: &Engine,
    registry: &Registry,
    shipment: &Shipment,
    seeded: Option<&StoredImage>,
    bar: &indicatif::ProgressBar,
) -> Result<Pulled> {
    let tunnel = match registry.local_port {
        Some(port) => node.forward_here(port).await?.then_some(port),
        None => None,
    };
    if registry.local_port.is_some() && tunnel.is_none() && !node.address().is_local_socket() {
        return Err(node.error(format!(
            "cannot reach the registry hallmark started at {} (only ssh:// and local unix:// engines can); name one all nodes reach in hallmark.toml: [registry] address",
            registry.address
        )));
    }
    let pulled = pull_and_tag(node, registry, shipment, seeded, bar).await;
    if let Some(port) = tunnel {
        node.cancel_forward(port).await;
    }
    pulled
}

/// The bytes pulled are what the engine's progress says; a blob small enough to arrive
/// without a `Downloading` report is counted, when the registry was filled from the layer
/// store (`seeded`), by its size there (the engine names it by its digest's first 12 hex).
async fn pull_and_tag(
    node: &Engine,
    registry: &Registry,
    shipment: &Shipment,
    seeded: Option<&StoredImage>,
    bar: &indicatif::ProgressBar,
) -> Result<Pulled> {
    let (reference, pulled) = registry_reference(node, registry, shipment)?;
    let stream = node.pull(
        pulled.name(),
        pulled.tag_or_latest(),
        registry.credentials.as_ref(),
    );
    // Per layer: (bytes downloaded, bytes to download), as the engine reports them.
    let mut layer_bytes: HashMap<String, (u64, u64)> = HashMap::new();
    let mut layers = 0;
    let mut downloaded = std::collections::HashSet::new();
    let failure = engine::follow(stream, |info| match info.status.as_deref() {
        Some("Downloading") => {
            if let Some(detail) = info.progress_detail {
                let bytes = |n: Option<i64>| n.unwrap_or(0).max(0) as u64;
                let layer = info.id.unwrap_or_default();
                layer_bytes.insert(layer, (bytes(detail.current), bytes(detail.total)));
                bar.set_length(layer_bytes.values().map(|b| b.1).sum());
                bar.set_position(layer_bytes.values().map(|b| b.0).sum());
            }
        }
        Some("Pull complete") => layers += 1,
        Some("Download complete") => {
            downloaded.insert(info.id.unwrap_or_default());
        }
        _ => {}
    })
    .await;
    if let Err(message) = failure {
        return Err(node.error(format!(
            "cannot pull {} from the registry at {}: {message}",
            shipment.reference, registry.address
        )));
    }
    let pulled = pulled.to_string();
    node.tag(&pulled, &reference).await?;
    untag(node, &pulled).await;
    let reported: u64 = layer_bytes.values().map(|b| b.1).sum();
    let known: Vec<u64> = seeded
        .map(|image| {
            let short = |l: &&crate::images::store::StoredLayer| {
                let hex = l.blob.digest.as_str().trim_start_matches("sha256:");
                downloaded.contains(&hex[..12.min(hex.len())])
            };
            image
                .layers
                .iter()
                .filter(short)
                .map(|l| l.blob.size)
                .collect()
        })
        .unwrap_or_default();
    Ok(Pulled {
        layers: layers.max(known.len()),
        bytes: reported.max(known.iter().sum()),
    })
}

/// Podman's Docker-compatible API pulls and loads, but its names differ from Docker's:
/// tagging `hello` from `127.0.0.1:PORT/hello` adds no name when the short name already
/// resolves, so untagging the registry's name then deletes the image, and it refuses plain
/// HTTP registries on loopback unless configured. A Podman node is refused on this
/// transport, by name, rather than left without its image; the stream transport serves it.
async fn refuse_podman(node: &Engine) -> Result<()> {
    match node.version.podman() {
        None => Ok(()),
        Some(engine) => Err(node.error(format!(
            "{engine} is not supported on the registry transport (its tags differ from Docker's: see docs/shipping.md); give this node `transport = \"stream\"` in hallmark.toml"
        ))),
    }
}
