//! The rows of `verify` and `status`: what every node holds of each image, one row per image
//! and node, with the states no engine answers (`unreachable`, `interrupted`, `unplanned`,
//! `unverified` without the builder's image to compare with).

use super::{Holding, NodeHolding, Wanted};
use crate::engine::Engine;
use crate::error::Result;
use crate::images::store::LayerStore;
use crate::inputs::config::NodeConfig;
use crate::inputs::values::Name;
use crate::output::{Column, Row, cell};
use crate::plan::PlannedImage;
use crate::ship;
use serde::Serialize;

/// What one node holds of one image: a line of the `verify` and `status` tables.
#[derive(Serialize)]
pub struct HoldingRow {
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
pub async fn holdings_of_nodes(
    label: &str,
    nodes: &[NodeConfig],
    connected: &[Result<Engine>],
    wanted: &[Wanted],
) -> Vec<Vec<NodeHolding>> {
    futures_util::future::join_all(
        nodes
            .iter()
            .zip(connected)
            .map(|(node, engine)| async move {
                match engine {
                    // A node that answered before a signal keeps its rows.
                    Ok(engine) => tokio::select! {
                        biased;
                        holdings = super::holdings(engine, label, wanted) => holdings
                            .into_iter()
                            .map(|h| h.unwrap_or_else(|e| unreachable_holding(node, e)))
                            .collect(),
                        () = crate::interrupt::arrived() => interrupted_column(node, wanted.len()),
                    },
                    Err(e) => wanted
                        .iter()
                        .map(|_| unreachable_holding(node, e.to_string()))
                        .collect(),
                }
            }),
    )
    .await
}

/// Why the builder's image of an image cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum NoReference {
    #[error("the builder cannot be reached")]
    NoBuilder,
    #[error(transparent)]
    Shipment(#[from] crate::error::Error),
}

/// What the nodes' holdings of `image` are compared with: the builder's image, or, where it
/// cannot be had (`found` says why), the checksum label alone, with why.
pub fn wanted_or_why(
    image: &PlannedImage,
    store: &LayerStore,
    found: std::result::Result<ship::Shipment, NoReference>,
) -> (Wanted, Option<String>) {
    match found {
        Ok(shipment) => (shipment.wanted(store), None),
        Err(why) => {
            let label_only = Wanted {
                reference: image.loaded.reference(),
                checksum: image.checksum.to_string(),
                fingerprint: String::new(),
                ids: Vec::new(),
            };
            (label_only, Some(why.to_string()))
        }
    }
}

/// Without the builder's image to compare with (`unchecked[i]` says why), a node whose label
/// matches is `unverified`, not `current` or `mismatch`: the content is not checked. In a
/// table (`brief`) the why is said once, above it, by the caller, and each row refers to it
/// (a paragraph on every node's row buried the table); a JSON row carries it whole.
pub fn unverified_without_reference(
    columns: &mut [Vec<NodeHolding>],
    unchecked: &[Option<String>],
    brief: bool,
) {
    for column in columns {
        for (holding, why) in column.iter_mut().zip(unchecked) {
            if let Some(why) = why
                && holding.state == Holding::Mismatch
            {
                holding.state = Holding::Unverified;
                holding.detail = Some(match brief {
                    true => "the label matches; the content is not checked (why: above the table)"
                        .to_string(),
                    false => format!("the label matches; the content is not checked: {why}"),
                });
            }
        }
    }
}

/// Rows image by image, each image's nodes in order, from one column per node.
pub fn image_rows(names: &[Name], columns: Vec<Vec<NodeHolding>>) -> Vec<HoldingRow> {
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

/// `rows` rows of `node` that say `interrupted`.
pub fn interrupted_column(node: &NodeConfig, rows: usize) -> Vec<NodeHolding> {
    let holding = NodeHolding {
        node: node.name.to_string(),
        state: Holding::Interrupted,
        checksum: None,
        fingerprint: None,
        detail: None,
        image_id: None,
    };
    vec![holding; rows]
}

/// The rows of `run`, or on SIGINT or SIGTERM before it ended, every row `interrupted`
/// (the nodes' own rows keep what they answered: [`holdings_of_nodes`]).
pub async fn rows_until_interrupted(
    names: &[Name],
    nodes: &[NodeConfig],
    run: impl std::future::Future<Output = Result<Vec<HoldingRow>>>,
) -> Result<Vec<HoldingRow>> {
    tokio::select! {
        biased;
        rows = run => rows,
        () = crate::interrupt::arrived() => Ok(image_rows(
            names,
            (nodes.iter())
                .map(|node| interrupted_column(node, names.len()))
                .collect(),
        )),
    }
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
pub fn with_unplanned(
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
