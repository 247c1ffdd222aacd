//! `hallmark status`: every image of the project on every node, in `verify`'s rows and words
//! (`ship::verify::rows::HoldingRow`, `ship::verify::Holding`: one table, so the two cannot drift; the
//! words are listed once, in docs/json.md, "Holdings").

use super::{connect, connect_all, runtime};
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::values::Name;
use crate::ship;
use crate::ship::verify::rows::{
    NoReference, holdings_of_nodes, image_rows, rows_until_interrupted,
    unverified_without_reference, wanted_or_why, with_unplanned,
};
use futures_util::StreamExt as _;

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let all = settings.project.image_names()?;
    // An image that cannot be planned (a spec that does not load, pins not locked) is said on
    // stderr and has its rows, `unplanned` with why; the others are shown as usual (one
    // unlocked spec hid the whole table, and then an image with an error had no row at all).
    let (plan, unplanned) = super::plan_each(settings, &all);
    let names: Vec<Name> = all
        .iter()
        .filter(|n| !unplanned.contains_key(*n))
        .cloned()
        .collect();
    let nodes = settings.config.nodes.clone();
    let label = &settings.checksum_label;
    let rows = runtime()?.block_on(rows_until_interrupted(&names, &nodes, async {
        let connected = connect_all(settings, &nodes).await;
        let builder = match connect(settings, &settings.config.builder).await {
            Ok(builder) => Some(builder),
            Err(e) => {
                settings.output.note(format!(
                    "warning: {e}; without the builder's images, a node's image whose label matches is `unverified`"
                ));
                None
            }
        };
        let store = crate::images::store::LayerStore::open(&settings.cache);
        let store = &store;
        // The builder's image is the reference, as `verify` and `distribute` find it; without
        // it, the label alone is known.
        let found = futures_util::stream::iter(names.iter().map(|name| {
            let (image, builder) = (plan.get(name), builder.as_ref());
            async move {
                let builder = builder.ok_or(NoReference::NoBuilder)?;
                let (reference, checksum) = (image.loaded.reference(), image.checksum.as_str());
                Ok(ship::shipment(builder, store, &reference, label, checksum).await?)
            }
        }))
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
        let (wanted, unchecked): (Vec<_>, Vec<_>) = names
            .iter()
            .zip(found)
            .map(|(name, found)| wanted_or_why(plan.get(name), store, found))
            .unzip();
        let mut columns = holdings_of_nodes(label, &nodes, &connected, &wanted).await;
        // Said once per image, not on each of its nodes' rows.
        // Said even with `-q`: the rows refer to it.
        for (i, (name, why)) in names.iter().zip(&unchecked).enumerate() {
            let matched = |c: &Vec<crate::ship::verify::NodeHolding>| {
                c[i].state == crate::ship::verify::Holding::Mismatch
            };
            if let Some(why) = why
                && !settings.output.json
                && columns.iter().any(matched)
            {
                crate::output::stderr(&format!("{name}: {why}"));
            }
        }
        unverified_without_reference(&mut columns, &unchecked, !settings.output.json);
        Ok::<_, Error>(image_rows(&names, columns))
    }))?;
    let rows = with_unplanned(&all, rows, &unplanned, &nodes);
    settings.output.table("holdings", &rows);
    Ok(ExitStatus::Success)
}
