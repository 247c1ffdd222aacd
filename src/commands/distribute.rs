//! `hallmark distribute`: ships images from the builder to the nodes, each node by its
//! transport (ship.rs streams archives, registry.rs pushes once and has the nodes pull).

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::inputs::config::NodeConfig;

use crate::ship::targets::{Targets, shipped_rows, split_found};
use crate::ship::{self, NodeOutcome, Settled, ShipSettings, Shipped};
use futures_util::StreamExt as _;

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
        settled: &Settled::default(),
    };
    let store = Arc::new(LayerStore::open(&settings.cache));
    let reference = |name: &crate::inputs::values::Name| match unplanned.contains_key(name) {
        true => String::new(),
        false => plan.get(name).loaded.reference(),
    };
    let shipped = runtime()?.block_on(async {
        let work = async {
            let _turns = take_turns(settings, &nodes).await?;
            let builder = connect(settings, &settings.config.builder).await?;
            let mut targets = Targets::group(
                &settings.config,
                &nodes,
                connect_all(settings, &nodes).await,
            );
            let found =
                find_shipments(settings, &builder, &store, &plan, (&names, &unplanned)).await;
            // An image the builder cannot give (not built, another checksum, changed by hand)
            // fails on every node, with why; the others are shipped.
            let (shipments, found) = split_found(found);
            let outcomes = ship_and_prune(
                settings,
                &mut targets,
                &builder,
                &store,
                &shipments,
                &ship_settings,
            )
            .await?;
            let rows = shipped_rows(&names, found, outcomes, &nodes, &reference);
            Ok::<_, Error>(rows)
        };
        // Ctrl-C or SIGTERM drops the transfers (an engine ends a load whose stream closed,
        // tagging nothing) and removes nothing superseded: the rows of the nodes not yet
        // settled say `interrupted`.
        tokio::select! {
            biased;
            shipped = work => shipped,
            () = super::interrupted() => {
                Ok(interrupted_rows(&names, &nodes, &reference, ship_settings.settled))
            }
        }
    })?;
    // The table says what was done; with `-q` the exit code alone says whether it worked.
    // With --json and --smoke, one document holds both, after the tests.
    let smoke = smoke && !crate::interrupt::requested();
    if !settings.output.json && !settings.output.quiet {
        settings.output.table("images", &shipped);
    }
    let failed = shipped
        .iter()
        .filter(|s| !unplanned.keys().any(|n| n.as_str() == s.image))
        .flat_map(|s| &s.nodes)
        .any(|o| !o.verified());
    // `--smoke`: each image on each node it was verified on, after every load (a broken
    // image found here, before the serving nodes boot it).
    let (smoked, smoke_outcome) = match smoke {
        true => smoke_verified(settings, &shipped, (&names, &nodes), &plan, &unplanned),
        false => (Vec::new(), Ok(())),
    };
    if settings.output.json {
        json_report(settings, &shipped, smoke.then_some(&smoked));
    }
    smoke_outcome?;
    // A failed piece of work outranks bad input; bad input alone is exit 2.
    Ok(match (failed, unplanned.is_empty()) {
        (true, _) => ExitStatus::Failure,
        (false, false) => ExitStatus::BadInput,
        (false, true) => ExitStatus::Success,
    })
}

/// The report of a distribute stopped by a signal: each node's outcome if it was settled
/// before the signal (a re-run has only the others left to do), else `interrupted`.
fn interrupted_rows(
    names: &[crate::inputs::values::Name],
    nodes: &[NodeConfig],
    reference: &dyn Fn(&crate::inputs::values::Name) -> String,
    settled: &Settled,
) -> Vec<Shipped> {
    let row = |name| {
        let reference = reference(name);
        let nodes = (nodes.iter().map(|node| node.name.as_str()))
            .map(|node| {
                (settled.of(&reference, node))
                    .unwrap_or_else(|| NodeOutcome::new(node, ship::Action::Interrupted))
            })
            .collect();
        Shipped {
            image: name.to_string(),
            nodes,
            reference,
        }
    };
    names.iter().map(row).collect()
}

/// Two distributes to one node take turns (both sent everything, the second's loads
/// wasted): each node's turn, held for the run, taken in one order so that no two runs wait
/// on each other; the second then finds what the first sent.
async fn take_turns(
    settings: &Settings,
    nodes: &[NodeConfig],
) -> Result<Vec<crate::images::turn::Turn>> {
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
    Ok(turns)
}

/// `--json`: the shipment, and with `--smoke` its results, in one document.
fn json_report(
    settings: &Settings,
    shipped: &[Shipped],
    smoked: Option<&Vec<super::smoke::ImageResult>>,
) {
    let images = serde_json::to_value(shipped).expect("json");
    match smoked {
        Some(smoked) => settings.output.document(&[
            ("images", images),
            ("smoke", serde_json::to_value(smoked).expect("json")),
        ]),
        None => settings.output.json("images", shipped),
    }
}

/// The smoke tests of each image shipped, on each node it was verified on.
fn smoke_verified(
    settings: &Settings,
    shipped: &[Shipped],
    (names, nodes): (&[crate::inputs::values::Name], &[NodeConfig]),
    plan: &crate::plan::Plan,
    unplanned: &std::collections::BTreeMap<crate::inputs::values::Name, String>,
) -> (Vec<super::smoke::ImageResult>, Result<()>) {
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

/// Each image's shipment from the builder, or why it cannot be shipped (not planned, or
/// not what hallmark finished there).
async fn find_shipments(
    settings: &Settings,
    builder: &Engine,
    store: &Arc<LayerStore>,
    plan: &crate::plan::Plan,
    (names, unplanned): (
        &[crate::inputs::values::Name],
        &std::collections::BTreeMap<crate::inputs::values::Name, String>,
    ),
) -> Vec<Result<ship::Shipment>> {
    futures_util::stream::iter(names.iter().map(|name| {
        let why = unplanned.get(name).cloned();
        async move {
            match why {
                Some(why) => Err(Error::Usage {
                    message: why,
                    hint: None,
                }),
                None => {
                    let image = plan.get(name);
                    ship::planned_shipment(builder, store, plan, image, &settings.checksum_label)
                        .await
                }
            }
        }
    }))
    .buffered(8)
    .collect::<Vec<_>>()
    .await
}

/// Ships `shipments` to the targets (each `auto` node by the way chosen for it), then
/// removes what they superseded there: per image, the outcomes in the cluster file's order.
async fn ship_and_prune(
    settings: &Settings,
    targets: &mut Targets<'_>,
    builder: &Engine,
    store: &Arc<LayerStore>,
    shipments: &[ship::Shipment],
    ship_settings: &ShipSettings<'_>,
) -> Result<Vec<Vec<NodeOutcome>>> {
    let output = &settings.output;
    (targets.choose(&settings.config, store, &settings.cache, shipments, output)).await;
    let references: Vec<&str> = shipments.iter().map(|s| s.reference.as_str()).collect();
    // What each node may call an image this run ships.
    let shipping = shipments.iter().flat_map(|s| s.wanted(store).ids).collect();
    let before = targets
        .named_ids(&settings.state_dir, &references, &shipping)
        .await;
    let outcomes = targets
        .ship(&settings.config, builder, store, shipments, ship_settings)
        .await?;
    targets
        .remove_superseded(
            &settings.state_dir,
            &settings.output,
            &references,
            before,
            &outcomes,
        )
        .await;
    Ok(outcomes)
}
