//! `hallmark distribute`: ships images from the builder to the nodes, each node by its
//! transport (ship.rs streams archives, registry.rs pushes once and has the nodes pull).

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::inputs::config::{NodeConfig, Transport};
use crate::output::{Column, Row};

use crate::ship::registry;
use crate::ship::superseded;
use crate::ship::{self, NodeOutcome, ShipSettings};
use futures_util::StreamExt as _;
use serde::Serialize;
use std::collections::HashMap;

use std::sync::Arc;

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    to: &[String],
    (parallel, full): (bool, bool),
    smoke: bool,
) -> Result<ExitStatus> {
    // A line every few seconds where stderr is no terminal (CI logs, ssh): the bars are not drawn there.
    let _heartbeat = settings.output.heartbeat("distribute");
    let names = match images {
        [] => settings.project.image_names()?,
        named => settings.names(named)?,
    };
    // One image that cannot be planned (a bad spec, pins not locked) fails alone on every
    // node, with why; the others are shipped (one bad spec made `--all` ship nothing).
    let (plan, unplanned) = super::plan_each(settings, &names);
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
    let reference = |name: &crate::inputs::values::Name| match unplanned.contains_key(name) {
        true => String::new(),
        false => plan.get(name).loaded.reference(),
    };
    let shipped = runtime()?.block_on(async {
        let work = async {
            // Two distributes to one node take turns (both sent everything, the second's loads
            // wasted): each node's turn, held for the run, taken in one order so that no two runs
            // wait on each other; the second then finds what the first sent.
            let mut endpoints: Vec<String> = nodes.iter().map(|n| n.engine.to_string()).collect();
            endpoints.sort();
            endpoints.dedup();
            let mut turns = Vec::new();
            for endpoint in &endpoints {
                let turn = crate::images::turn::Turn::take(
                    &settings.cache,
                    "distribute",
                    endpoint,
                    |path| {
                        settings.output.note(format!(
                            "waiting for another hallmark distributing to {endpoint} (lock {})",
                            path.display()
                        ));
                    },
                );
                turns.push(turn.await?);
            }
            let builder = connect(settings, &settings.config.builder).await?;
            let targets = Targets::connect(settings, &nodes).await;
            let found = futures_util::stream::iter(names.iter().map(|name| {
                let (builder, store, plan) = (&builder, &store, &plan);
                let why = unplanned.get(name).cloned();
                async move {
                    match why {
                        Some(why) => Err(Error::Usage {
                            message: why,
                            hint: None,
                        }),
                        None => {
                            let image = plan.get(name);
                            ship::planned_shipment(
                                builder,
                                store,
                                plan,
                                image,
                                &settings.checksum_label,
                            )
                            .await
                        }
                    }
                }
            }))
            .buffered(8)
            .collect::<Vec<_>>()
            .await;
            // An image the builder cannot give (not built, another checksum, changed by hand)
            // fails on every node, with why; the others are shipped.
            let mut shipments = Vec::new();
            let found: Vec<std::result::Result<String, String>> = found
                .into_iter()
                .map(|found| {
                    let shipment = found.map_err(|e| e.to_string())?;
                    let reference = shipment.reference.clone();
                    shipments.push(shipment);
                    Ok(reference)
                })
                .collect();
            let references: Vec<&str> = shipments.iter().map(|s| s.reference.as_str()).collect();
            // What each node may call an image this run ships.
            let shipping = shipments
                .iter()
                .flat_map(|s| s.wanted(&store).ids)
                .collect();
            let before = targets.named_ids(settings, &references, &shipping).await;
            let outcomes = targets
                .ship(settings, &builder, &store, &shipments, &ship_settings)
                .await?;
            targets
                .remove_superseded(settings, &references, before, &outcomes)
                .await;
            let mut outcomes = outcomes.into_iter();
            let rows = names.iter().zip(found).map(|(name, found)| match found {
                Ok(reference) => Shipped {
                    image: name.to_string(),
                    nodes: outcomes.next().expect("an outcome per image shipped"),
                    reference,
                },
                Err(error) => Shipped {
                    image: name.to_string(),
                    nodes: (nodes.iter())
                        .map(|node| NodeOutcome::failed(node.name.as_str(), error.clone()))
                        .collect(),
                    reference: reference(name),
                },
            });
            Ok::<_, Error>(rows.collect::<Vec<_>>())
        };
        // Ctrl-C or SIGTERM drops the transfers (an engine ends a load whose stream closed,
        // tagging nothing) and removes nothing superseded: every row says `interrupted`.
        tokio::select! {
            biased;
            shipped = work => shipped,
            () = super::interrupted() => Ok(names.iter().map(|name| Shipped {
                image: name.to_string(),
                nodes: (nodes.iter())
                    .map(|node| NodeOutcome::new(node.name.as_str(), ship::Action::Interrupted))
                    .collect(),
                reference: reference(name),
            }).collect()),
        }
    })?;
    // The table says what was done; with `-q` the exit code alone says whether it worked.
    if settings.output.json || !settings.output.quiet {
        settings.output.table("images", &shipped);
    }
    let failed = shipped
        .iter()
        .filter(|s| !unplanned.keys().any(|n| n.as_str() == s.image))
        .flat_map(|s| &s.nodes)
        .any(|o| !o.verified());
    // `--smoke`: each image on each node it was verified on, after every load (a broken
    // image found here, before the serving nodes boot it).
    let smoked = match smoke && !crate::interrupt::requested() {
        false => Ok(()),
        true => {
            let verified: Vec<_> = (shipped.iter())
                .filter(|s| !unplanned.keys().any(|n| n.as_str() == s.image))
                .flat_map(|s| s.nodes.iter().filter(|o| o.verified()).map(move |o| (s, o)))
                .filter_map(|(s, o)| {
                    let name = names.iter().find(|n| n.as_str() == s.image)?;
                    let node = nodes.iter().find(|n| n.name.as_str() == o.node)?;
                    Some((plan.get(name), node))
                })
                .collect();
            super::smoke::on_nodes(settings, &verified)
        }
    };
    smoked?;
    // A failed piece of work outranks bad input; bad input alone is exit 2.
    Ok(match (failed, unplanned.is_empty()) {
        (true, _) => ExitStatus::Failure,
        (false, false) => ExitStatus::BadInput,
        (false, true) => ExitStatus::Success,
    })
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

fn say_removed(settings: &Settings, node: &str, removed: usize) {
    if removed > 0 {
        settings.output.note(format!(
            "{node}: removed {removed} image{} the tags named before (superseded, untagged)",
            if removed == 1 { "" } else { "s" }
        ));
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

    /// Every reachable node's images under `references`, noted until
    /// [`Targets::remove_superseded`] ([`superseded::named_ids`]).
    async fn named_ids(
        &self,
        settings: &Settings,
        references: &[&str],
        shipping: &std::collections::HashSet<String>,
    ) -> Vec<(HashMap<String, String>, usize)> {
        let engines: Vec<&Engine> = self.by_stream.iter().chain(&self.by_registry).collect();
        superseded::named_ids(&settings.state_dir, &engines, references, shipping).await
    }

    /// Removes what this distribute superseded ([`superseded::remove`]) and says so, one
    /// line a node.
    async fn remove_superseded(
        &self,
        settings: &Settings,
        references: &[&str],
        before: Vec<(HashMap<String, String>, usize)>,
        outcomes: &[Vec<NodeOutcome>],
    ) {
        let engines: Vec<&Engine> = self.by_stream.iter().chain(&self.by_registry).collect();
        let removed =
            superseded::remove(&settings.state_dir, &engines, references, before, outcomes).await;
        for (node, removed) in removed {
            say_removed(settings, &node, removed);
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
        // A failure of the whole transfer (the builder's export stalled) is every stream
        // node's row, so the table and the JSON still print (they printed nothing).
        let failed_all = |nodes: &[Engine], error: &Error| -> Vec<NodeOutcome> {
            (nodes.iter())
                .map(|node| NodeOutcome::failed(&node.node, error.to_string()))
                .collect()
        };
        let mut outcomes: Vec<Vec<NodeOutcome>> = match (&self.by_stream[..], shipments) {
            ([], _) => shipments.iter().map(|_| Vec::new()).collect(),
            (nodes, [one]) => vec![
                ship::distribute(builder, nodes, store, one, ship_settings)
                    .await
                    .unwrap_or_else(|e| failed_all(nodes, &e)),
            ],
            (nodes, _) => {
                ship::batch::distribute_many(builder, nodes, store, shipments, ship_settings)
                    .await
                    .unwrap_or_else(|e| shipments.iter().map(|_| failed_all(nodes, &e)).collect())
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
