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

/// One image a node should hold: its reference, checksum and the builder's fingerprint.
pub struct Wanted {
    pub reference: String,
    pub checksum: String,
    pub fingerprint: String,
}

/// How many images of one engine are inspected at once.
const INSPECTS_AT_ONCE: usize = 8;

/// What `engine` holds of each of `wanted`, in order: one listing of the engine's images
/// first, so that a tag naming an image with another checksum is `stale` without a request
/// of its own; the others are inspected, several at a time.
pub async fn holdings(
    engine: &Engine,
    label_key: &str,
    wanted: &[Wanted],
) -> Vec<Result<NodeHolding>> {
    use futures_util::StreamExt as _;
    let listed = match engine.listed_images().await {
        Ok(listed) => listed,
        Err(e) => {
            let message = e.to_string();
            return wanted
                .iter()
                .map(|_| Err(engine.error(message.clone())))
                .collect();
        }
    };
    let mut by_tag = std::collections::HashMap::new();
    for image in &listed {
        for tag in &image.repo_tags {
            by_tag.insert(familiar(tag), image);
        }
    }
    futures_util::stream::iter(wanted.iter().map(|want| {
        let seen = by_tag.get(familiar(&want.reference).as_str()).copied();
        async move {
            if let Some(seen) = seen
                && let found = seen.labels.get(label_key)
                && found.map(String::as_str) != Some(want.checksum.as_str())
            {
                return Ok(NodeHolding {
                    node: engine.node.clone(),
                    state: Holding::Stale,
                    checksum: found.cloned(),
                    fingerprint: None,
                    detail: None,
                });
            }
            holding(
                engine,
                &want.reference,
                label_key,
                &want.checksum,
                &want.fingerprint,
            )
            .await
        }
    }))
    .buffered(INSPECTS_AT_ONCE)
    .collect()
    .await
}

/// `hello:latest` for `docker.io/library/hello:latest` (the containerd store's spelling).
fn familiar(reference: &str) -> String {
    let short = reference
        .strip_prefix("docker.io/library/")
        .or_else(|| reference.strip_prefix("docker.io/"))
        .unwrap_or(reference);
    short.to_string()
}
