//! `hallmark verify`: exit 0 only if every node holds the expected image (label and
//! content fingerprint). The holdings table is `status`'s too.

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::values::Name;
use crate::ship;
use crate::ship::verify::Holding;
use crate::ship::verify::provenance::{Unverified, judge_provenance, signed, trusted_keys};
use crate::ship::verify::rows::{
    NoReference, holdings_of_nodes, image_rows, rows_until_interrupted,
    unverified_without_reference, wanted_or_why, with_unplanned,
};
use futures_util::StreamExt as _;

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    nodes: &[String],
    provenance: bool,
) -> Result<ExitStatus> {
    let trusted = match provenance {
        true => Some(trusted_keys(&settings.config, &settings.project.root)?),
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
                NoReference::from(e)
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
        let mut columns =
            holdings_of_nodes(&settings.checksum_label, &nodes, &connected, &wanted).await;
        unverified_without_reference(&mut columns, &unchecked, !settings.output.json);
        if let Some(trusted) = &trusted {
            let verdicts: Vec<std::result::Result<String, Unverified>> = names
                .iter()
                .zip(&subjects)
                .map(|(name, subject)| {
                    signed(
                        &settings.state_dir,
                        plan.get(name),
                        subject.as_deref(),
                        trusted,
                    )
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
            let trusted = trusted_keys(&settings.config, &settings.project.root)?;
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
