//! `hallmark distribute`: ships images from the builder to the nodes, each node by its
//! transport (ship.rs streams archives, registry.rs pushes once and has the nodes pull).

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::inputs::config::{NodeConfig, Transport};
use crate::output::{Column, Row};
use crate::plan::{Plan, PlannedImage};
use crate::ship::registry;
use crate::ship::verify;
use crate::ship::{self, Action, NodeOutcome, ShipSettings};
use futures_util::StreamExt as _;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
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
    let shipped = runtime()?.block_on(async {
        // Two distributes to one node take turns (both sent everything, the second's loads
        // wasted): each node's turn, held for the run, taken in one order so that no two runs
        // wait on each other; the second then finds what the first sent.
        let mut endpoints: Vec<String> = nodes.iter().map(|n| n.engine.to_string()).collect();
        endpoints.sort();
        endpoints.dedup();
        let mut turns = Vec::new();
        for endpoint in &endpoints {
            let turn =
                crate::images::turn::Turn::take(&settings.cache, "distribute", endpoint, |path| {
                    settings.output.note(format!(
                        "waiting for another hallmark distributing to {endpoint} (lock {})",
                        path.display()
                    ));
                });
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
                    None => shipment(settings, builder, store, plan, plan.get(name)).await,
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
                reference: match unplanned.contains_key(name) {
                    true => String::new(),
                    false => plan.get(name).loaded.reference(),
                },
            },
        });
        Ok::<_, Error>(rows.collect::<Vec<_>>())
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

/// `<state>/superseded.json`: per node, the id each reference named there when a distribute
/// began, until it has removed those it superseded (best effort: a note that cannot be
/// written leaves an interrupted run's old image to `docker image prune`).
#[derive(Default, Serialize, serde::Deserialize)]
struct Superseded(BTreeMap<String, BTreeMap<String, String>>);

impl Superseded {
    const FILE: &str = "superseded.json";

    fn read(state_dir: &Path) -> Superseded {
        std::fs::read_to_string(state_dir.join(Superseded::FILE))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    fn write(&self, state_dir: &Path) {
        let path = state_dir.join(Superseded::FILE);
        if self.0.is_empty() {
            let _ = std::fs::remove_file(path);
            return;
        }
        let text = serde_json::to_string_pretty(self).expect("json");
        let _ = std::fs::create_dir_all(state_dir).and_then(|()| std::fs::write(path, text));
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
    /// (one listing of those names per node), noted in the project's state until
    /// [`Targets::remove_superseded`] is done with them. A distribute stopped between a
    /// node's load and that removal left the old image behind, and a re-run, finding the node
    /// current, never removed it (outside test): an id an earlier run noted whose tag has
    /// moved since is removed here, first, unless this run ships it (`shipping`: the ids
    /// engines give the images it ships).
    async fn named_ids(
        &self,
        settings: &Settings,
        references: &[&str],
        shipping: &std::collections::HashSet<String>,
    ) -> Vec<(HashMap<String, String>, usize)> {
        let mut journal = Superseded::read(&settings.state_dir);
        let engines: Vec<&Engine> = self.by_stream.iter().chain(&self.by_registry).collect();
        let named = engines.iter().map(|engine| {
            let earlier = journal.0.get(&engine.node).cloned().unwrap_or_default();
            async move {
                let mut names: Vec<&str> = references.to_vec();
                names.extend(earlier.keys().map(String::as_str));
                names.sort_unstable();
                names.dedup();
                // Unlisted: nothing is removed, and what was noted stays noted.
                let Ok(listed) = engine.listed_images_named(&names).await else {
                    return (HashMap::new(), earlier, 0);
                };
                let now: HashMap<String, String> = verify::by_familiar_tag(&listed)
                    .into_iter()
                    .map(|(tag, image)| (tag, image.id.clone()))
                    .collect();
                let mut removed = 0;
                for (reference, old) in &earlier {
                    // An image this run ships (a rollback to it) is not removed to be sent again.
                    let moved = now.get(reference) != Some(old) && !shipping.contains(old);
                    if moved && engine.remove_untagged(old).await {
                        removed += 1;
                    }
                }
                (now, BTreeMap::new(), removed)
            }
        });
        let answers = futures_util::future::join_all(named).await;
        let mut before = Vec::new();
        for (engine, (now, kept, removed)) in engines.iter().zip(answers) {
            let mut noted = kept;
            for reference in references {
                let familiar = verify::familiar(reference);
                if let Some(id) = now.get(&familiar) {
                    noted.insert(familiar, id.clone());
                }
            }
            journal.0.insert(engine.node.to_string(), noted);
            before.push((now, removed));
        }
        journal.write(&settings.state_dir);
        before
    }

    /// Removes from each node the images `references` named there before this distribute
    /// sent it another (an update leaves the old image behind untagged: eight updates of an
    /// image left 912 MB of them beside 310 MB current on a node in an outside test, and on
    /// the cluster each is the size of a model server's image). Only an image no tag names
    /// now is removed (a load that gave the very image back keeps it); one a container uses
    /// is refused by the engine and stays. Then this run's notes go ([`Targets::named_ids`]).
    async fn remove_superseded(
        &self,
        settings: &Settings,
        references: &[&str],
        before: Vec<(HashMap<String, String>, usize)>,
        outcomes: &[Vec<NodeOutcome>],
    ) {
        let engines = self.by_stream.iter().chain(&self.by_registry);
        let mut journal = Superseded::read(&settings.state_dir);
        // One line a node, with what the start removed (an earlier run's notes) counted in:
        // two lines of "removed 1 image" read as one said twice.
        for (engine, (before, removed_earlier)) in engines.zip(before) {
            let mut removed = removed_earlier;
            for (reference, outcomes) in references.iter().zip(outcomes) {
                let sent = outcomes.iter().any(|o| {
                    o.node == engine.node && o.verified() && !matches!(o.action, Action::Skipped)
                });
                let familiar = verify::familiar(reference);
                if let Some(noted) = journal.0.get_mut(engine.node.as_str()) {
                    noted.remove(&familiar);
                }
                let Some(old) = before.get(&familiar).filter(|_| sent) else {
                    continue;
                };
                if engine.remove_untagged(old).await {
                    removed += 1;
                }
            }
            say_removed(settings, &engine.node, removed);
        }
        journal.0.retain(|_, noted| !noted.is_empty());
        journal.write(&settings.state_dir);
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

/// The builder's image for `image`, checked against its checksum, with the names of the
/// images most likely to share its layers: its parents, up to the external base.
pub(super) async fn shipment(
    settings: &Settings,
    builder: &Engine,
    store: &LayerStore,
    plan: &Plan,
    image: &PlannedImage,
) -> Result<ship::Shipment> {
    let mut shipment = ship::shipment(
        builder,
        store,
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
