//! `hallmark verify`: exit 0 only if every node holds the expected image (label and
//! content fingerprint). The holdings table is `status`'s too.

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::inputs::config::NodeConfig;
use crate::inputs::values::Name;
use crate::output::{Column, Row, cell};
use crate::plan::PlannedImage;
use crate::ship;
use crate::ship::verify::{self, Holding, NodeHolding};
use futures_util::StreamExt as _;
use serde::Serialize;

pub(super) fn run(settings: &Settings, images: &[String], nodes: &[String]) -> Result<ExitStatus> {
    let asked = settings.names(images)?;
    // An image that cannot be planned has its rows, `unplanned` with why, as in `status`;
    // the others are verified (one unlocked spec gave no rows at all, exit 2).
    let (plan, unplanned) = super::plan_each(settings, &asked);
    let names: Vec<Name> = (asked.iter())
        .filter(|n| !unplanned.contains_key(*n))
        .cloned()
        .collect();
    let nodes = settings.selected_nodes(nodes)?;
    let rows = runtime()?.block_on(async {
        let builder = connect(settings, &settings.config.builder).await?;
        let connected = connect_all(settings, &nodes).await;
        let store = crate::images::store::LayerStore::open(&settings.cache);
        let shipments = futures_util::stream::iter(names.iter().map(|name| {
            let image = plan.get(name);
            ship::planned_shipment(&builder, &store, &plan, image, &settings.checksum_label)
        }))
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
        // An image the builder cannot give (not built, another checksum, changed by hand) has
        // no content to compare: its nodes are judged by the label alone, as `status` does.
        let mut judged = Vec::new();
        for (name, shipment) in names.iter().zip(shipments) {
            let found = shipment.map_err(|e| {
                // Said even with `-q`: why the image's rows cannot say `current`.
                crate::output::stderr_exactly(&e.render());
                e.to_string()
            });
            judged.push(wanted_or_why(plan.get(name), &store, found));
        }
        let (wanted, unchecked): (Vec<_>, Vec<_>) = judged.into_iter().unzip();
        let mut columns = holdings_of_nodes(settings, &nodes, &connected, &wanted).await;
        unverified_without_reference(&mut columns, &unchecked);
        Ok::<_, Error>(image_rows(&names, columns))
    })?;
    let rows = with_unplanned(&asked, rows, &unplanned, &nodes);
    settings.output.table("holdings", &rows);
    let planned_current = rows
        .iter()
        .filter(|r| r.holding.state != Holding::Unplanned)
        .all(|r| r.holding.state == Holding::Current);
    // A failed verification outranks bad input; bad input alone is exit 2.
    Ok(match (planned_current, unplanned.is_empty()) {
        (false, _) => ExitStatus::Failure,
        (true, false) => ExitStatus::BadInput,
        (true, true) => ExitStatus::Success,
    })
}

/// What one node holds of one image: a line of the `verify` and `status` tables.
#[derive(Serialize)]
pub(super) struct HoldingRow {
    pub image: String,
    #[serde(flatten)]
    pub holding: NodeHolding,
}

impl Row for HoldingRow {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 4] = [
            Column::left("", 20),
            Column::left("", 10),
            Column::left("", 12),
            Column::left("", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        let h = &self.holding;
        let detail = h.detail.as_deref().unwrap_or("");
        vec![vec![
            self.image.clone(),
            h.node.clone(),
            cell(&h.state),
            detail.to_string(),
        ]]
    }
}

/// What every node holds of `wanted`: the nodes asked at once, one column per node.
pub(super) async fn holdings_of_nodes(
    settings: &Settings,
    nodes: &[NodeConfig],
    connected: &[Result<Engine>],
    wanted: &[verify::Wanted],
) -> Vec<Vec<NodeHolding>> {
    let label = &settings.checksum_label;
    futures_util::future::join_all(
        nodes
            .iter()
            .zip(connected)
            .map(|(node, engine)| async move {
                match engine {
                    Ok(engine) => verify::holdings(engine, label, wanted)
                        .await
                        .into_iter()
                        .map(|h| h.unwrap_or_else(|e| unreachable_holding(node, e)))
                        .collect(),
                    Err(e) => wanted
                        .iter()
                        .map(|_| unreachable_holding(node, e.to_string()))
                        .collect(),
                }
            }),
    )
    .await
}

/// What the nodes' holdings of `image` are compared with: the builder's image, or, where it
/// cannot be had (`found` says why), the checksum label alone, with why.
pub(super) fn wanted_or_why(
    image: &PlannedImage,
    store: &LayerStore,
    found: std::result::Result<ship::Shipment, String>,
) -> (verify::Wanted, Option<String>) {
    match found {
        Ok(shipment) => (shipment.wanted(store), None),
        Err(why) => {
            let label_only = verify::Wanted {
                reference: image.loaded.reference(),
                checksum: image.checksum.to_string(),
                fingerprint: String::new(),
                ids: Vec::new(),
            };
            (label_only, Some(why))
        }
    }
}

/// Without the builder's image to compare with (`unchecked[i]` says why), a node whose label
/// matches is `unverified`, not `current` or `mismatch`: the content is not checked.
pub(super) fn unverified_without_reference(
    columns: &mut [Vec<NodeHolding>],
    unchecked: &[Option<String>],
) {
    for column in columns {
        for (holding, why) in column.iter_mut().zip(unchecked) {
            if let Some(why) = why
                && holding.state == Holding::Mismatch
            {
                holding.state = Holding::Unverified;
                holding.detail = Some(format!(
                    "the label matches; the content is not checked: {why}"
                ));
            }
        }
    }
}

/// Rows image by image, each image's nodes in order, from one column per node.
pub(super) fn image_rows(names: &[Name], columns: Vec<Vec<NodeHolding>>) -> Vec<HoldingRow> {
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        for column in &columns {
            rows.push(HoldingRow {
                image: name.to_string(),
                holding: column[i].clone(),
            });
        }
    }
    rows
}

fn unreachable_holding(node: &NodeConfig, error: impl ToString) -> NodeHolding {
    NodeHolding {
        node: node.name.to_string(),
        state: Holding::Unreachable,
        checksum: None,
        fingerprint: None,
        detail: Some(error.to_string()),
        image_id: None,
    }
}

/// `rows` (of the planned images) with each unplanned image's rows, `unplanned` with why, in
/// the project's order of images.
pub(super) fn with_unplanned(
    all: &[Name],
    rows: Vec<HoldingRow>,
    unplanned: &std::collections::BTreeMap<Name, String>,
    nodes: &[crate::inputs::config::NodeConfig],
) -> Vec<HoldingRow> {
    let mut planned = rows.into_iter().peekable();
    let mut out = Vec::new();
    for name in all {
        match unplanned.get(name) {
            Some(why) => out.extend(nodes.iter().map(|node| HoldingRow {
                image: name.to_string(),
                holding: crate::ship::verify::NodeHolding {
                    node: node.name.to_string(),
                    state: crate::ship::verify::Holding::Unplanned,
                    checksum: None,
                    fingerprint: None,
                    detail: Some(why.clone()),
                    image_id: None,
                },
            })),
            None => {
                while let Some(row) = planned.next_if(|r| r.image == name.as_str()) {
                    out.push(row);
                }
            }
        }
    }
    out
}
