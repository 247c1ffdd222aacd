//! A spec's external base on the builder. A base that exists only locally (made by `docker
//! import` or `docker load`) is pinned by its config digest, the one identity every image
//! store agrees on: the classic store's image id is the config digest, the containerd store's
//! is the manifest digest, and a containerd store takes a `sha256:` name it does not hold for
//! an image on Docker Hub. Before a build, the pinned base is looked up on the builder and
//! the build is given the builder's own reference for it, so nothing a build names is ever
//! looked up on the network; a builder without it is an error that says `hallmark lock`.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::pins::{BasePin, DigestKind};
use crate::plan::PlannedImage;
use crate::ship;
use crate::store::LayerStore;
use std::path::Path;
use std::sync::Arc;

/// The builder's reference for the pinned external base of `image` (`None` when the parent
/// is another spec): the image id it checked for a local-only base, `repo@digest` for a
/// registry's. An error naming the image, the base and the node when the builder lacks it.
pub async fn on_builder(
    builder: &Engine,
    image: &PlannedImage,
    cache: &Path,
) -> Result<Option<String>> {
    let Some(pin) = &image.pins.base else {
        return Ok(None);
    };
    let found = pinned_on_builder(builder, pin, cache).await?;
    found.map(Some).ok_or_else(|| Error::Engine {
        node: builder.node.clone(),
        endpoint: builder.endpoint.clone(),
        message: format!(
            "does not hold the base of `{}`: `{}` pinned at {} ({})",
            image.name(),
            pin.reference,
            pin.digest,
            kind_name(pin.kind)
        ),
        hint: Some(match pin.kind {
            DigestKind::RepoDigest => format!(
                "pull it there (`docker pull {}`), or run `hallmark lock --update {}` to pin the image `{}` names on the builder",
                repo_digest_reference(pin),
                image.name(),
                pin.reference
            ),
            _ => format!(
                "load that image on `{}`, or run `hallmark lock --update {}` to pin the image `{}` names there",
                builder.node,
                image.name(),
                pin.reference
            ),
        }),
    })
}

/// The builder's reference for the image `pin` names (a base, or a compile stage's
/// toolchain); `None` when the builder does not hold it.
pub async fn pinned_on_builder(
    builder: &Engine,
    pin: &BasePin,
    cache: &Path,
) -> Result<Option<String>> {
    Ok(match pin.kind {
        DigestKind::RepoDigest => {
            let reference = repo_digest_reference(pin);
            builder.inspect(&reference).await?.map(|_| reference)
        }
        DigestKind::ConfigDigest | DigestKind::ImageId => local(builder, pin, cache).await?,
    })
}

/// `vllm/vllm-openai@sha256:...` from the pin's `ref` (its tag dropped) and digest.
pub fn repo_digest_reference(pin: &BasePin) -> String {
    // `host:5000/repo:tag` -> `host:5000/repo`: a colon followed by a `/` is a port.
    let repository = pin
        .reference
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .map_or(pin.reference.as_str(), |(repo, _)| repo);
    format!("{repository}@{}", pin.digest)
}

fn kind_name(kind: DigestKind) -> &'static str {
    match kind {
        DigestKind::RepoDigest => "repo digest",
        DigestKind::ConfigDigest => "config digest",
        DigestKind::ImageId => "image id",
    }
}

/// The builder's id of the local-only base `pin` names. A config digest is the classic
/// store's id, found by asking for it; on a containerd store the image `ref` names is
/// exported once into the layer store to read its config digest. An `image-id` pin (written
/// before hallmark pinned config digests) is the classic id, or the containerd id of the
/// store that locked it: either is accepted.
async fn local(builder: &Engine, pin: &BasePin, cache: &Path) -> Result<Option<String>> {
    let digest = pin.digest.to_string();
    if let Some(image) = builder.inspect(&digest).await?
        && image.id() == Some(digest.as_str())
    {
        return Ok(Some(digest));
    }
    let Some((id, config)) = config_digest(builder, &pin.reference, cache).await? else {
        return Ok(None);
    };
    Ok((config == digest || (pin.kind == DigestKind::ImageId && id == digest)).then_some(id))
}

/// The builder's id and the config digest of the image `reference` names; `None` when the
/// builder does not hold it.
pub async fn config_digest(
    builder: &Engine,
    reference: &str,
    cache: &Path,
) -> Result<Option<(String, String)>> {
    let Some(image) = builder.inspect(reference).await? else {
        return Ok(None);
    };
    let Some(id) = image.id().map(str::to_string) else {
        return Ok(None);
    };
    if builder.info().await?.image_store() == "classic" {
        return Ok(Some((id.clone(), id)));
    }
    let store = Arc::new(LayerStore::open(cache));
    let (id, stored) = ship::stored_image(builder, &store, &id).await?;
    Ok(Some((id, stored.config.digest)))
}
