//! What an image is, as hallmark judges it wherever it meets one (the builder, a node, the
//! layer store): the checksum label says what it was built from, the content fingerprint
//! (sha256 over the ordered layer diff IDs and the runtime config) what it is, and only
//! hallmark's own record says whether hallmark finished it. Image IDs are not used for
//! identity: they differ between the classic and the containerd image stores and across
//! save/load.

use crate::engine::ImageAnswer;
use crate::engine::ImageView;
use crate::error::Result;
use crate::images::store::LayerStore;
use sha2::{Digest as _, Sha256};

/// The config fields that define how a container runs: the image config's runtime part
/// (the OCI image spec's `config`, and Docker's additions to it) as every engine reports it.
/// Engines differ in the container-only fields they report beside them (`Hostname`, `Image`,
/// `AttachStdin` and the like, filled with defaults), so only these count, empty ones
/// omitted. An outside test saw `HEALTHCHECK`, `SHELL` or `ONBUILD` added on a node (no
/// layer) called `current` when v1 counted the first nine alone. `StopTimeout` is not
/// counted: the containerd store leaves it out of its inspect (Docker 26 and 28), so an
/// honest image whose base set it was a `mismatch` there (a second outside test).
const CONFIG_FIELDS: [&str; 12] = [
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
    "Healthcheck",
    "Shell",
    "OnBuild",
];

pub fn fingerprint(image: &ImageAnswer) -> String {
    let mut document = String::from("hallmark-fingerprint v2\n");
    // What it runs on: os and architecture (a variant some engines leave out is not).
    document.push_str(&format!("platform {}\n", image.os_architecture()));
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

/// The engine knows the name but cannot read the image: Docker 28's containerd store answers
/// an inspect of an image whose content it lacks with a stub, no OS and no layers.
pub fn incomplete(image: &ImageAnswer) -> bool {
    image.is_stub()
}

/// The image `reference` names on `engine`, and whether the engine holds all of its content.
/// An image whose content the containerd store lacks (a layer or the config it has not got
/// under the digest the manifest names) cannot be saved or pushed; Docker 28 answers its
/// inspect with a stub ([`incomplete`]), while Docker 26 answers as if all were well but
/// leaves it out of its image list, so both are asked (the list only when `listed` does not
/// already say that the engine lists it).
pub async fn inspect_whole(
    engine: &impl ImageView,
    reference: &str,
    listed: bool,
) -> Result<Option<(ImageAnswer, bool)>> {
    let Some(image) = engine.inspect(reference).await? else {
        return Ok(None);
    };
    if incomplete(&image) {
        return Ok(Some((image, false)));
    }
    // An image id is not a reference the list filters by; asked by id, the inspect decides.
    if listed || reference.starts_with("sha256:") {
        return Ok(Some((image, true)));
    }
    let named = engine.ids_named(reference).await?;
    let whole = named.iter().any(|id| image.id() == Some(id.as_str()));
    Ok(Some((image, whole)))
}

pub fn label<'a>(image: &'a ImageAnswer, key: &str) -> Option<&'a str> {
    image.label(key)
}

/// The ids engines give the builder's image `builder_id`: that id (the config digest on a
/// classic store, which a classic node computes alike; the manifest digest on a containerd
/// builder, which a containerd node keeps) and, if the layer store holds the image, the
/// digest of the manifest hallmark's archives carry (what a containerd node it loaded calls it)
/// and the config digest (what a classic node calls an image from a containerd builder).
pub fn known_ids(store: &LayerStore, builder_id: &str) -> Vec<String> {
    let mut ids = vec![builder_id.to_string()];
    if let Some(stored) = store.image(builder_id) {
        for id in [
            crate::oci::archive::manifest(&stored).0,
            stored.config.digest,
        ] {
            let id = id.to_string();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// The config digest of the builder's image `builder_id`: from the layer store's record of
/// it, else the id itself on a store whose ids are config digests (`classic`); `None` when
/// neither tells.
pub fn config_digest(
    store: &LayerStore,
    builder_id: &str,
    ids_are_config_digests: bool,
) -> Option<String> {
    match store.image(builder_id) {
        Some(stored) => Some(stored.config.digest.to_string()),
        None => ids_are_config_digests.then(|| builder_id.to_string()),
    }
}

/// Whether the builder's image `id`, which carries `checksum` as its label, is one hallmark
/// finished for that checksum on this builder: `None` if so, else why it is not trusted.
/// Only hallmark's own record says ([`crate::images::store::finished`]): a label and a history step
/// that sets it are written as easily by a plain `docker build` of a rendered context, a
/// `docker commit` over the tag, a `docker import --change` or a loaded tar, and the step
/// images of a build `FROM` the image carry its label too.
pub fn unfinished(store: &LayerStore, id: &str, checksum: &str) -> Option<String> {
    (!crate::images::store::finished::is_finished(store, checksum, id)).then(|| {
        let short = id.trim_start_matches("sha256:");
        format!(
            "hallmark has no record of finishing {}: a `docker build`, `docker commit`, `docker import` or load can write the label, and the step images of a build on it carry it too; or hallmark built it with another cache (another machine, user or HALLMARK_CACHE), whose record is not here",
            &short[..12.min(short.len())]
        )
    })
}
