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

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    nodes: &[String],
    provenance: bool,
) -> Result<ExitStatus> {
    let trusted = match provenance {
        true => Some(trusted_keys(settings)?),
        false => None,
    };
    let asked = settings.names(images)?;
    // An image that cannot be planned has its rows, `unplanned` with why, as in `status`;
    // the others are verified (one unlocked spec gave no rows at all, exit 2).
    let (plan, unplanned) = super::plan_each(settings, &asked);
    let names: Vec<Name> = (asked.iter())
        .filter(|n| !unplanned.contains_key(*n))
        .cloned()
        .collect();
    let nodes = settings.selected_nodes(nodes)?;
    let rows = runtime()?.block_on(rows_until_interrupted(&names, &nodes, async {
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
        let ids_are_config_digests = builder.store().await?.ids_are_config_digests();
        let subjects: Vec<Option<String>> = judged
            .iter()
            .map(|(wanted, why)| match why {
                Some(_) => None,
                None => wanted.ids.first().and_then(|id| {
                    crate::images::identity::config_digest(&store, id, ids_are_config_digests)
                }),
            })
            .collect();
        let (wanted, unchecked): (Vec<_>, Vec<_>) = judged.into_iter().unzip();
        let mut columns = holdings_of_nodes(settings, &nodes, &connected, &wanted).await;
        unverified_without_reference(&mut columns, &unchecked, !settings.output.json);
        if let Some(trusted) = &trusted {
            let verdicts: Vec<std::result::Result<String, String>> = names
                .iter()
                .zip(&subjects)
                .map(|(name, subject)| {
                    signed(settings, plan.get(name), subject.as_deref(), trusted)
                })
                .collect();
            judge_provenance(&mut columns, &verdicts);
        }
        Ok::<_, Error>(image_rows(&names, columns))
    }))?;
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

/// The public keys `[provenance] trusted` names; none is a usage error that says so.
fn trusted_keys(settings: &Settings) -> Result<Vec<crate::images::attest::Trusted>> {
    let paths: Vec<std::path::PathBuf> = settings
        .config
        .provenance
        .iter()
        .flat_map(|p| &p.trusted)
        .map(|p| settings.project.root.join(p))
        .collect();
    if paths.is_empty() {
        return Err(Error::Usage {
            message: "verify --provenance: hallmark.toml trusts no key ([provenance] trusted), so no provenance can be checked; without [provenance] nothing is signed either".into(),
            hint: Some("[provenance]\nkey = \"keys/hallmark\"\ntrusted = [\"keys/hallmark.pub\"]   (docs/supply-chain.md)".into()),
        });
    }
    crate::images::attest::trusted(&paths).map_err(|message| Error::Usage {
        message: format!("[provenance] trusted: {message}"),
        hint: None,
    })
}

/// Whether the provenance kept for `image` verifies: signed by a trusted key, for its
/// checksum, with `subject` (the config digest of the builder's finished image) as its
/// subject. `Ok` names the key; `Err` says why not.
fn signed(
    settings: &Settings,
    image: &PlannedImage,
    subject: Option<&str>,
    trusted: &[crate::images::attest::Trusted],
) -> std::result::Result<String, String> {
    let envelope = crate::make::provenance::kept(&settings.state_dir, image.name().as_str())
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no provenance kept for `{}`: build it with [provenance] key set",
                image.name()
            )
        })?;
    let (key, statement) = crate::images::attest::verify(&envelope, trusted)?;
    let checksum = &statement["predicate"]["buildDefinition"]["externalParameters"]["checksum"];
    if checksum != image.checksum.as_str() {
        return Err(format!(
            "the provenance kept is for checksum {checksum}, the image's is {}",
            image.checksum
        ));
    }
    let subjects = crate::images::attest::subjects(&statement);
    match subject {
        None => Err("the builder's image to compare the signed subject with is not at hand".into()),
        Some(subject) if subjects.iter().any(|s| s == subject) => Ok(format!(
            "provenance signed by {} ({})",
            key.keyid,
            key.path.display()
        )),
        Some(subject) => Err(format!(
            "the signed subject is {}, the builder's image is {subject}",
            subjects.join(", ")
        )),
    }
}

/// Each node's row of each image, with its provenance: a node that holds the image (current)
/// is `unsigned` unless the provenance verifies; one that holds another says it does not
/// hold the signed subject.
fn judge_provenance(
    columns: &mut [Vec<NodeHolding>],
    verdicts: &[std::result::Result<String, String>],
) {
    for column in columns {
        for (holding, verdict) in column.iter_mut().zip(verdicts) {
            let note = match (&holding.state, verdict) {
                (Holding::Current, Ok(signed)) => signed.clone(),
                (Holding::Current, Err(why)) => {
                    holding.state = Holding::Unsigned;
                    format!("provenance: {why}")
                }
                (
                    Holding::Stale | Holding::Mismatch | Holding::Missing | Holding::Incomplete,
                    _,
                ) => "provenance: the node does not hold the signed subject".to_string(),
                // Unreachable, unverified, unplanned: what it holds is not known.
                _ => continue,
            };
            holding.detail = Some(match holding.detail.take() {
                Some(detail) => format!("{detail}; {note}"),
                None => note,
            });
        }
    }
}

/// `hallmark provenance IMAGE`: the envelope kept for the image at its current checksum.
pub(super) fn provenance(settings: &Settings, image: &str) -> Result<ExitStatus> {
    let name = settings.project.image_name(image)?;
    let plan = crate::plan::Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let path = crate::make::provenance::kept_in_project(&settings.state_dir, name.as_str());
    let envelope = crate::make::provenance::kept(&settings.state_dir, name.as_str())?;
    let current = envelope.as_ref().is_some_and(|e| {
        crate::make::provenance::payload(e).is_some_and(|s| {
            s["predicate"]["buildDefinition"]["externalParameters"]["checksum"]
                == planned.checksum.as_str()
        })
    });
    // With trusted keys configured, an envelope that does not verify is not printed as if
    // it did.
    if let (Some(envelope), true) = (&envelope, current) {
        let configured = settings
            .config
            .provenance
            .as_ref()
            .is_some_and(|p| !p.trusted.is_empty());
        if configured {
            let trusted = trusted_keys(settings)?;
            if let Err(why) = crate::images::attest::verify(envelope, &trusted) {
                return Err(Error::Usage {
                    message: format!(
                        "the provenance kept for `{name}` ({}) does not verify: {why}",
                        path.display()
                    ),
                    hint: Some(format!(
                        "build it again to sign it anew: hallmark build {name}"
                    )),
                });
            }
        }
    }
    match (envelope, current) {
        (Some(envelope), true) => {
            let mut text = serde_json::to_string_pretty(&envelope).expect("an envelope serializes");
            text.push('\n');
            crate::output::stdout_exactly(&text);
            Ok(ExitStatus::Success)
        }
        (found, _) => Err(Error::Usage {
            message: format!(
                "no provenance of `{name}` at checksum {} ({})",
                planned.checksum,
                match found {
                    Some(_) => format!("{} is for another checksum", path.display()),
                    None => format!("{} does not exist", path.display()),
                }
            ),
            hint: Some(format!(
                "build it with [provenance] key set in hallmark.toml: hallmark build {name}"
            )),
        }),
    }
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
                    // A node that answered before a signal keeps its rows.
                    Ok(engine) => tokio::select! {
                        biased;
                        holdings = verify::holdings(engine, label, wanted) => holdings
                            .into_iter()
                            .map(|h| h.unwrap_or_else(|e| unreachable_holding(node, e)))
                            .collect(),
                        () = super::interrupted() => interrupted_column(node, wanted.len()),
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
/// matches is `unverified`, not `current` or `mismatch`: the content is not checked. In a
/// table (`brief`) the why is said once, above it, by the caller, and each row refers to it
/// (a paragraph on every node's row buried the table); a JSON row carries it whole.
pub(super) fn unverified_without_reference(
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

/// `rows` rows of `node` that say `interrupted`.
pub(super) fn interrupted_column(node: &NodeConfig, rows: usize) -> Vec<NodeHolding> {
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
pub(super) async fn rows_until_interrupted(
    names: &[Name],
    nodes: &[NodeConfig],
    run: impl std::future::Future<Output = Result<Vec<HoldingRow>>>,
) -> Result<Vec<HoldingRow>> {
    tokio::select! {
        biased;
        rows = run => rows,
        () = super::interrupted() => Ok(image_rows(
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
