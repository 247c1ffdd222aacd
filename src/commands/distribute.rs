//! `hallmark distribute`: ships images from the builder to the nodes, each node by its
//! transport (ship.rs streams archives, registry.rs pushes once and has the nodes pull).

use super::{connect, connect_all, runtime};
use crate::config::{NodeConfig, Transport};
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::output::{Column, Row};
use crate::plan::{Plan, PlannedImage};
use crate::registry;
use crate::settings::Settings;
use crate::ship::{self, Action, NodeOutcome, ShipSettings};
use crate::store::LayerStore;
use crate::values::Name;
use crate::verify;
use futures_util::StreamExt as _;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    to: &[String],
    parallel: bool,
    full: bool,
) -> Result<ExitStatus> {
    let names = match images {
        [] => settings.project.image_names()?,
        named => settings.names(named)?,
    };
    let plan = Plan::new(&settings.project, &names)?;
    let nodes = settings.selected_nodes(to)?;
    let ship_settings = ShipSettings {
        checksum_label: &settings.checksum_label,
        full,
        parallel,
        state_dir: &settings.state_dir,
        cache: &settings.cache,
        verbose: settings.output.verbose,
        progress: settings.output.progress(),
    };
    let store = Arc::new(LayerStore::open(&settings.cache));
    let shipped = runtime()?.block_on(async {
        let builder = connect(settings, &settings.config.builder).await?;
        let targets = Targets::connect(settings, &nodes).await;
        let found = futures_util::stream::iter(
            names
                .iter()
                .map(|name| shipment(settings, &builder, &plan, plan.get(name))),
        )
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
        // An image the builder cannot give (not built, another checksum, changed by hand)
        // fails on every node, with why; the others are shipped.
        let (mut shipments, mut refused) = (Vec::new(), HashMap::new());
        for (name, found) in names.iter().zip(found) {
            match found {
                Ok(shipment) => shipments.push((name, shipment)),
                Err(e) => {
                    refused.insert(name, e.to_string());
                }
            }
        }
        let (shipped_names, shipments): (Vec<_>, Vec<_>) = shipments.into_iter().unzip();
        let references: Vec<&str> = shipments.iter().map(|s| s.reference.as_str()).collect();
        let before = targets.named_ids(&references).await;
        let outcomes = targets
            .ship(settings, &builder, &store, &shipments, &ship_settings)
            .await?;
        targets
            .remove_superseded(settings, &references, before, &outcomes)
            .await;
        let mut shipped: HashMap<_, _> = shipped_names
            .into_iter()
            .zip(shipments.into_iter().zip(outcomes))
            .collect();
        let row = |name: &Name| match shipped.remove(name) {
            Some((shipment, nodes)) => Shipped {
                image: name.to_string(),
                nodes,
                reference: shipment.reference,
            },
            None => Shipped {
                image: name.to_string(),
                nodes: (nodes.iter())
                    .map(|node| NodeOutcome::failed(node.name.as_str(), refused[name].clone()))
                    .collect(),
                reference: plan.get(name).loaded.reference(),
            },
        };
        Ok::<_, Error>(names.iter().map(row).collect::<Vec<_>>())
    })?;
    // The table says what was done; with `-q` the exit code alone says whether it worked.
    if settings.output.json || !settings.output.quiet {
        settings.output.table("images", &shipped);
    }
    let failed = shipped.iter().flat_map(|s| &s.nodes).any(|o| !o.verified());
    Ok(ExitStatus::from_success(!failed))
}

/// One image's outcome on every node, in the cluster file's order.
#[derive(Serialize)]
struct Shipped {
    image: String,
    nodes: Vec<NodeOutcome>,
    reference: String,
}

impl Row for Shipped {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 7] = [
            Column::left("image", 12),
            Column::left("node", 10),
            Column::left("action", 8),
            Column::right("bytes sent", 12),
            Column::right("seconds", 8),
            Column::right("verified", 9),
            Column::left("error", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        self.nodes
            .iter()
            .map(|o| {
                vec![
                    self.image.clone(),
                    o.node.clone(),
                    o.action.name().to_string(),
                    o.archive_bytes().to_string(),
                    format!("{:.2}", o.seconds),
                    if o.verified() { "yes" } else { "no" }.to_string(),
                    o.error().unwrap_or("").to_string(),
                ]
            })
            .collect()
    }
}

/// The selected nodes, connected and grouped by transport; each image goes to both groups.
struct Targets<'a> {
    nodes: &'a [NodeConfig],
    by_stream: Vec<Engine>,
    by_registry: Vec<Engine>,
    /// Nodes that could not be reached, with why: a failed outcome for every image.
    unreachable: Vec<(String, String)>,
}

impl<'a> Targets<'a> {
    async fn connect(settings: &Settings, nodes: &'a [NodeConfig]) -> Targets<'a> {
        let mut targets = Targets {
            nodes,
            by_stream: Vec::new(),
            by_registry: Vec::new(),
            unreachable: Vec::new(),
        };
        for (node, engine) in nodes.iter().zip(connect_all(settings, nodes).await) {
            match engine {
                Err(e) => targets
                    .unreachable
                    .push((node.name.to_string(), e.to_string())),
                Ok(engine) => match settings.config.transport_of(node) {
                    Transport::Registry => targets.by_registry.push(engine),
                    Transport::Stream => targets.by_stream.push(engine),
                },
            }
        }
        targets
    }

    /// Every reachable node's images under `references`: the id each reference names there
    /// (one listing of those names per node).
    async fn named_ids(&self, references: &[&str]) -> Vec<HashMap<String, String>> {
        let engines = self.by_stream.iter().chain(&self.by_registry);
        futures_util::future::join_all(engines.map(|engine| async move {
            let listed = engine.listed_images_named(references).await;
            let listed = listed.unwrap_or_default();
            let by_tag = verify::by_familiar_tag(&listed);
            by_tag
                .into_iter()
                .map(|(tag, image)| (tag, image.id.clone()))
                .collect()
        }))
        .await
    }

    /// Removes from each node the images `references` named there before this distribute
    /// sent it another (an update leaves the old image behind untagged: eight updates of an
    /// image left 912 MB of them beside 310 MB current on a node in an outside test, and on
    /// the cluster each is the size of a model server's image). Only an image no tag names
    /// now is removed (a load that gave the very image back keeps it); one a container uses
    /// is refused by the engine and stays.
    async fn remove_superseded(
        &self,
        settings: &Settings,
        references: &[&str],
        before: Vec<HashMap<String, String>>,
        outcomes: &[Vec<NodeOutcome>],
    ) {
        let engines = self.by_stream.iter().chain(&self.by_registry);
        for (engine, before) in engines.zip(before) {
            let mut removed = 0;
            for (reference, outcomes) in references.iter().zip(outcomes) {
                let sent = outcomes.iter().any(|o| {
                    o.node == engine.node && o.verified() && !matches!(o.action, Action::Skipped)
                });
                let Some(old) = before.get(&verify::familiar(reference)).filter(|_| sent) else {
                    continue;
                };
                if engine.remove_untagged(old).await {
                    removed += 1;
                }
            }
            if removed > 0 {
                settings.output.note(format!(
                    "{}: removed {removed} image{} the tags named before (superseded, untagged)",
                    engine.node,
                    if removed == 1 { "" } else { "s" }
                ));
            }
        }
    }

    /// Ships `shipments` to every node: per image, the outcomes in the cluster file's order.
    /// The stream nodes get all the images in one archive each (one image: the export goes
    /// straight into the first node that needs all of it); the registry's, image by image.
    async fn ship(
        &self,
        settings: &Settings,
        builder: &Engine,
        store: &Arc<LayerStore>,
        shipments: &[ship::Shipment],
        ship_settings: &ShipSettings<'_>,
    ) -> Result<Vec<Vec<NodeOutcome>>> {
        let mut outcomes: Vec<Vec<NodeOutcome>> = match (&self.by_stream[..], shipments) {
            ([], _) => shipments.iter().map(|_| Vec::new()).collect(),
            (nodes, [one]) => {
                vec![ship::distribute(builder, nodes, store, one, ship_settings).await?]
            }
            (nodes, _) => {
                ship::batch::distribute_many(builder, nodes, store, shipments, ship_settings)
                    .await?
            }
        };
        for (shipment, outcomes) in shipments.iter().zip(&mut outcomes) {
            if !self.by_registry.is_empty() {
                outcomes.extend(
                    registry::distribute(
                        builder,
                        &self.by_registry,
                        &settings.config.registry,
                        &settings.cache,
                        store,
                        shipment,
                        ship_settings,
                    )
                    .await,
                );
            }
            for (node, error) in &self.unreachable {
                outcomes.push(NodeOutcome::failed(node, error.clone()));
            }
            outcomes.sort_by_key(|o| self.nodes.iter().position(|n| n.name.as_str() == o.node));
        }
        Ok(outcomes)
    }
}

/// The builder's image for `image`, checked against its checksum, with the names of the
/// images most likely to share its layers: its parents, up to the external base.
pub(super) async fn shipment(
    settings: &Settings,
    builder: &Engine,
    plan: &Plan,
    image: &PlannedImage,
) -> Result<ship::Shipment> {
    let mut shipment = ship::shipment(
        builder,
        &image.loaded.reference(),
        &settings.checksum_label,
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
