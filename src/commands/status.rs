//! `hallmark status`: every image of the project on every node: current, stale, mismatch,
//! unverified, missing, incomplete, unreachable.

use super::verify::{holdings_of_nodes, image_rows, unverified_without_reference};
use super::{connect, connect_all, runtime};
use crate::error::{Error, ExitStatus, Result};
use crate::plan::{Failure, Plan};
use crate::settings::Settings;
use crate::values::Name;
use crate::verify;
use futures_util::StreamExt as _;

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let all = settings.project.image_names()?;
    // An image that cannot be planned (a spec that does not load, pins not locked) is said on
    // stderr and left out; the others are shown (one unlocked spec hid the whole table).
    let (plan, failed) = Plan::each(&settings.project, &all);
    for failure in failed.values() {
        if let Failure::Own(error) = failure {
            eprint!("{}", error.render());
        }
    }
    for (name, failure) in &failed {
        if let Failure::Parent(cause) = failure {
            settings.output.note(format!(
                "warning: image `{name}` is left out: its parent chain holds `{cause}`, whose problem is said above"
            ));
        }
    }
    let names: Vec<Name> = all
        .into_iter()
        .filter(|n| !failed.contains_key(n))
        .collect();
    let nodes = settings.config.nodes.clone();
    let label = &settings.checksum_label;
    let rows = runtime()?.block_on(async {
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
        let store = crate::store::LayerStore::open(&settings.cache);
        let store = &store;
        let unreachable = "the builder cannot be reached".to_string();
        // The builder's fingerprint is the reference; without it, the label alone is known.
        let on_builder = futures_util::stream::iter(names.iter().map(|name| {
            let image = plan.get(name);
            let (builder, unreachable) = (builder.as_ref(), unreachable.clone());
            async move {
                let builder = builder.ok_or(unreachable)?;
                let checksum = image.checksum.as_str();
                let not_held = || "the builder does not hold the image".to_string();
                let held = builder.inspect(&image.loaded.reference()).await;
                let held = held.ok().flatten().ok_or_else(not_held)?;
                if verify::label(&held, label) != Some(checksum) {
                    return Err(not_held());
                }
                let id = held.id().unwrap_or_default().to_string();
                if let Ok(Some(newest)) = verify::unfinished(builder, store, &id, checksum).await {
                    return Err(format!(
                        "the builder's image under the tag is not one hallmark finished (its newest step is {newest})"
                    ));
                }
                Ok((verify::fingerprint(&held), id))
            }
        }))
        .buffered(8)
        .collect::<Vec<std::result::Result<(String, String), String>>>()
        .await;
        let wanted: Vec<verify::Wanted> = names
            .iter()
            .zip(&on_builder)
            .map(|(name, on_builder)| {
                let image = plan.get(name);
                let (fingerprint, id) = on_builder.clone().unwrap_or_default();
                verify::Wanted {
                    reference: image.loaded.reference(),
                    checksum: image.checksum.to_string(),
                    fingerprint,
                    ids: verify::known_ids(&store, &id),
                }
            })
            .collect();
        let mut columns = holdings_of_nodes(settings, &nodes, &connected, &wanted).await;
        let unchecked: Vec<Option<String>> = on_builder.into_iter().map(|b| b.err()).collect();
        unverified_without_reference(&mut columns, &unchecked);
        Ok::<_, Error>(image_rows(&names, columns))
    })?;
    settings.output.table("holdings", &rows);
    Ok(ExitStatus::Success)
}
