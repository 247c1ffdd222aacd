//! What a node holds, compared with what the plan expects. Identity is the checksum label
//! (what the image was built from) plus the content fingerprint (what it is): sha256 over
//! the ordered layer diff IDs and the runtime config. Image IDs are not used: they differ
//! between the classic and the containerd image stores and across save/load.

use crate::answers::ImageAnswer;
use crate::engine::Engine;
use crate::error::Result;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

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

pub fn fingerprint(image: &ImageAnswer) -> String {
    let mut document = String::from("hallmark-fingerprint v1\n");
    for layer in image.layers() {
        document.push_str(&format!("layer {layer}\n"));
    }
    let mut kept = serde_json::Map::new();
    for field in CONFIG_FIELDS {
        match image.config.get(field) {
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

pub fn label<'a>(image: &'a ImageAnswer, key: &str) -> Option<&'a str> {
    image.label(key)
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
    /// The label matches, but the content cannot be checked: the builder, whose image is the
    /// reference, does not hold it (any more). `status` says so rather than `current`.
    Unverified,
    Missing,
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
    let image = engine.inspect(reference).await?;
    let (state, checksum_found, fingerprint_found) = match &image {
        None => (Holding::Missing, None, None),
        Some(image) => {
            let found = label(image, label_key).map(str::to_string);
            let print = fingerprint(image);
            let state = match (found.as_deref() == Some(checksum), print == expected) {
                (true, true) => Holding::Current,
                (true, false) => Holding::Mismatch,
                (false, _) => Holding::Stale,
            };
            (state, found, Some(print))
        }
    };
    Ok(NodeHolding {
        node: engine.node.clone(),
        state,
        checksum: checksum_found,
        fingerprint: fingerprint_found,
        detail: None,
    })
}
