//! `hallmark status`: every image of the project on every node: current, stale, mismatch,
//! unverified, missing, incomplete, unreachable.

use super::verify::{holdings_of_nodes, image_rows};
use super::{connect, connect_all, runtime};
use crate::error::{Error, ExitStatus, Result};
use crate::plan::Plan;
use crate::settings::Settings;
use crate::verify::{self, Holding};
use futures_util::StreamExt as _;

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let names = settings.project.image_names()?;
    let plan = Plan::new(&settings.project, &names)?;
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
        let why_unchecked = match builder {
            Some(_) => "the builder does not hold the image",
            None => "the builder cannot be reached",
        };
        // The builder's fingerprint is the reference; without it, the label alone is known.
        let on_builder = futures_util::stream::iter(names.iter().map(|name| {
            let image = plan.get(name);
            let builder = builder.as_ref();
            async move {
                let held = builder?.inspect(&image.loaded.reference()).await.ok()??;
                (verify::label(&held, label) == Some(image.checksum.as_str()))
                    .then(|| (verify::fingerprint(&held), held.id().unwrap_or_default().to_string()))
            }
        }))
        .buffered(8)
        .collect::<Vec<Option<(String, String)>>>()
        .await;
        let store = crate::store::LayerStore::open(&settings.cache);
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
        let expected: Vec<Option<&str>> = on_builder
            .iter()
            .map(|b| b.as_ref().map(|(fingerprint, _)| fingerprint.as_str()))
            .collect();
        let mut columns = holdings_of_nodes(settings, &nodes, &connected, &wanted).await;
        for column in &mut columns {
            for (holding, expected) in column.iter_mut().zip(&expected) {
                // Without the builder's image, a matching label is all there is: the
                // content is not checked, so the node is not `current`.
                if expected.is_none() && holding.state == Holding::Mismatch {
                    holding.state = Holding::Unverified;
                    holding.detail = Some(format!(
                        "the label matches; the content is not checked: {why_unchecked}"
                    ));
                }
            }
        }
        Ok::<_, Error>(image_rows(&names, columns))
    })?;
    settings.output.table("holdings", &rows);
    Ok(ExitStatus::Success)
}
