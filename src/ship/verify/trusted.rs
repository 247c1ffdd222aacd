//! The image a smoke test may run on a node: the one a user of the tag runs there, and only
//! if hallmark finished it on the builder (`distribute`'s and `verify`'s rule, by the same
//! functions).

use super::Holding;
use crate::engine::Engine;
use crate::error::Result;
use crate::images::store::LayerStore;
use crate::plan::PlannedImage;
use crate::ship;

/// The id of the image `smoke` may test on `engine`: the one a user of the tag runs, and only
/// if hallmark finished it. The rule is `distribute`'s and `verify`'s, by the same functions:
/// the builder's image under the tag must be one hallmark recorded finishing for the spec's
/// checksum ([`ship::shipment`]), and a node (`builder` is then the builder's engine) must
/// hold that very image ([`super::holding`] says `current`). A label alone proves nothing: a
/// plain `docker build` can copy it.
pub async fn trusted_image(
    builder: Option<&Engine>,
    engine: &Engine,
    store: &LayerStore,
    planned: &PlannedImage,
    label: &str,
) -> Result<String> {
    let reference = planned.loaded.reference();
    let on_builder = builder.unwrap_or(engine);
    let shipment = ship::shipment(
        on_builder,
        store,
        &reference,
        label,
        planned.checksum.as_str(),
    );
    if builder.is_none() {
        return Ok(shipment.await?.image_id);
    }
    // The node is asked whatever the builder answers: what it holds is what the user runs.
    let (shipment, held) = futures_util::future::join(shipment, async {
        let unknown = super::Wanted {
            reference: reference.clone(),
            checksum: planned.checksum.to_string(),
            fingerprint: String::new(),
            ids: Vec::new(),
        };
        super::holding(engine, label, &unknown).await
    })
    .await;
    if held.as_ref().is_ok_and(|h| h.state == Holding::Missing) {
        return Err(engine.error(format!(
            "holds no image tagged {reference} for `{}`",
            planned.name()
        )));
    }
    let shipment = shipment.map_err(|e| {
        engine.error(format!(
            "cannot tell whether it holds the current build of `{}`: the builder cannot vouch for it: {e}",
            planned.name()
        ))
    })?;
    let held = super::holding(engine, label, &shipment.wanted(store)).await?;
    match (&held.state, held.image_id) {
        (Holding::Current, Some(id)) => Ok(id),
        (state, _) => Err(engine.error(format!(
            "{reference} is not the current build of `{}` that hallmark finished on the builder: {}{}",
            planned.name(),
            crate::output::cell(state),
            held.detail.map(|d| format!(" ({d})")).unwrap_or_default()
        ))),
    }
}
