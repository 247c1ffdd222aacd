//! What a node holds, compared with what the plan expects. Identity is the checksum label
//! (what the image was built from) plus the content fingerprint (what it is): sha256 over
//! the ordered layer diff IDs and the runtime config. Image IDs are not used: they differ
//! between the classic and the containerd image stores and across save/load.

use crate::engine::Engine;
use crate::error::Result;
use bollard::models::ImageInspect;
use bollard::query_parameters::ListImagesOptionsBuilder;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;

/// The config fields that define how a container runs; engines differ in the rest
/// (`Hostname`, `Image`, defaults they fill in), so only these count, empty ones omitted.
const CONFIG_FIELDS: [&str; 9] = [
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
];

pub fn fingerprint(image: &ImageInspect) -> String {
    let mut document = String::from("hallmark-fingerprint v1\n");
    for layer in image
        .root_fs
        .as_ref()
        .and_then(|r| r.layers.as_ref())
        .into_iter()
        .flatten()
    {
        document.push_str(&format!("layer {layer}\n"));
    }
    let config = serde_json::to_value(&image.config).unwrap_or_default();
    let mut kept = serde_json::Map::new();
    for field in CONFIG_FIELDS {
        match config.get(field) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(a)) if a.is_empty() => {}
            Some(serde_json::Value::Object(o)) if o.is_empty() => {}
            Some(serde_json::Value::String(s)) if s.is_empty() => {}
            Some(value) => {
                kept.insert(field.to_string(), value.clone());
            }
        }
    }
    document.push_str(&format!("config {}\n", serde_json::Value::Object(kept)));
    hex::encode(Sha256::digest(document.as_bytes()))
}

/// The engine knows the name but cannot read the image: Docker 28's containerd store answers
/// an inspect of an image whose content it lacks with a stub, no OS and no layers (every real
/// image has both an OS and a `RootFS` type, even one without layers).
pub fn incomplete(image: &ImageInspect) -> bool {
    let no_os = image.os.as_deref().unwrap_or_default().is_empty();
    let no_rootfs = image.root_fs.as_ref().is_none_or(|r| r.typ.is_empty());
    no_os && no_rootfs
}

/// The image `reference` names on `engine`, and whether the engine holds all of its content.
/// An image whose content the containerd store lacks (a layer or the config it has not got
/// under the digest the manifest names) cannot be saved or pushed; Docker 28 answers its
/// inspect with a stub ([`incomplete`]), while Docker 26 answers as if all were well but
/// leaves it out of its image list, so both are asked.
pub async fn inspect_whole(
    engine: &Engine,
    reference: &str,
) -> Result<Option<(ImageInspect, bool)>> {
    let Some(image) = engine.inspect(reference).await? else {
        return Ok(None);
    };
    if incomplete(&image) {
        return Ok(Some((image, false)));
    }
    // An image id is not a reference the list filters by; asked by id, the inspect decides.
    if reference.starts_with("sha256:") {
        return Ok(Some((image, true)));
    }
    let filters = HashMap::from([("reference", vec![reference.to_string()])]);
    let options = ListImagesOptionsBuilder::new().filters(&filters).build();
    let listed = engine
        .docker
        .list_images(Some(options))
        .await
        .map_err(|e| engine.error(format!("listing images named {reference}: {e}")))?;
    let whole = listed.iter().any(|i| image.id.as_ref() == Some(&i.id));
    Ok(Some((image, whole)))
}

pub fn label<'a>(image: &'a ImageInspect, key: &str) -> Option<&'a String> {
    image.config.as_ref()?.labels.as_ref()?.get(key)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Holding {
    /// The tag names an image with the expected checksum and fingerprint.
    Current,
    /// The tag names an image built from other inputs.
    Stale,
    /// The label matches but the content does not: something other than hallmark made it.
    Mismatch,
    Missing,
    /// The engine holds the name but not the image's content (a manifest whose layers or
    /// config it lacks): it cannot be saved or pushed. `distribute` completes it.
    Incomplete,
    Unreachable,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeHolding {
    pub node: String,
    pub state: Holding,
    pub checksum: Option<String>,
    pub fingerprint: Option<String>,
    pub detail: Option<String>,
}

/// What `engine` holds under `reference`, against the expected checksum and fingerprint.
pub async fn holding(
    engine: &Engine,
    reference: &str,
    label_key: &str,
    checksum: &str,
    expected: &str,
) -> Result<NodeHolding> {
    let image = inspect_whole(engine, reference).await?;
    let (state, checksum_found, fingerprint_found) = match &image {
        None => (Holding::Missing, None, None),
        Some((_, false)) => (Holding::Incomplete, None, None),
        Some((image, true)) => {
            let found = label(image, label_key).cloned();
            let print = fingerprint(image);
            let state = match (found.as_deref() == Some(checksum), print == expected) {
                (true, true) => Holding::Current,
                (true, false) => Holding::Mismatch,
                (false, _) => Holding::Stale,
            };
            (state, found, Some(print))
        }
    };
    let detail = (state == Holding::Incomplete).then(|| {
        format!("the engine holds {reference} without its content (it cannot be saved or pushed); `hallmark distribute` completes it")
    });
    Ok(NodeHolding {
        node: engine.node.clone(),
        state,
        checksum: checksum_found,
        fingerprint: fingerprint_found,
        detail,
    })
}
