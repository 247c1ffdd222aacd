//! A spec's external base on the builder. A base that exists only locally (made by `docker
//! import` or `docker load`) is pinned by its config digest, the one identity every image
//! store agrees on: the classic store's image id is the config digest, the containerd store's
//! is the manifest digest, and a containerd store takes a `sha256:` name it does not hold for
//! an image on Docker Hub. Before a build, the pinned base is looked up on the builder and
//! the build is given the builder's own reference for it, so nothing a build names is ever
//! looked up on the network; a builder without it is an error that says `hallmark lock`.

use crate::engine::Engine;
use crate::engine::ImageStore;
use crate::error::{Error, Result};
use crate::images::store::LayerStore;
use crate::images::transfer;
use crate::inputs::pins::{BasePin, DigestKind};
use crate::inputs::python;
use crate::oci::Reference;
use crate::plan::PlannedImage;
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
            let reference = repo_digest_reference(pin).to_string();
            builder.inspect(&reference).await?.map(|_| reference)
        }
        DigestKind::ConfigDigest | DigestKind::ImageId => local(builder, pin, cache).await?,
    })
}

/// `vllm/vllm-openai@sha256:...` from the pin's `ref` (its tag dropped) and digest.
pub fn repo_digest_reference(pin: &BasePin) -> Reference {
    pin.reference.with_digest(&pin.digest)
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
    let Some((id, config)) = config_digest(builder, &pin.reference.to_string(), cache).await?
    else {
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
    if builder.store().await?.ids_are_config_digests() {
        return Ok(Some((id.clone(), id)));
    }
    let store = Arc::new(LayerStore::open(cache));
    let (id, stored) = transfer::stored_image(builder, &store, &id).await?;
    Ok(Some((id, stored.config.digest.to_string())))
}

/// What `lock` asks the builder: an external base's digest and its Python, when the builder
/// is reachable and holds the image (`Ok(None)` otherwise: `lock` says what it kept).
pub struct BuilderResolver<'a> {
    pub builder: &'a crate::inputs::config::NodeConfig,
    pub ssh_config: Option<&'a Path>,
    pub cache: &'a Path,
    pub runtime: &'a tokio::runtime::Runtime,
}

impl BuilderResolver<'_> {
    async fn connect(&self) -> Result<Engine> {
        self.builder.connect(self.ssh_config, self.cache).await
    }

    async fn engine(&self) -> Option<Engine> {
        self.connect().await.ok()
    }

    /// `work` on the builder's engine (`Ok(None)` when it cannot be reached), which makes
    /// containers: Ctrl-C or SIGTERM ends it with them removed (an interrupted `lock` could
    /// leave a created container behind).
    fn with_containers<T>(
        &self,
        reference: &str,
        work: impl AsyncFnOnce(&Engine) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let _listening = crate::interrupt::listening();
        let what = format!("reading {reference} on the builder (its containers removed)");
        let done = self.runtime.block_on(async {
            let Some(engine) = self.engine().await else {
                return Ok(None);
            };
            tokio::select! {
                done = work(&engine) => done,
                () = crate::interrupt::arrived() => {
                    engine.remove_live_containers().await;
                    Err(Error::Interrupted { what: what.clone() })
                }
            }
        })?;
        // A signal that came as the work ended is this listener's too: said while it listens.
        crate::interrupt::check(&what)?;
        Ok(done)
    }
}

impl crate::plan::lock::BaseResolver for BuilderResolver<'_> {
    fn reached(&self) -> Result<()> {
        self.runtime
            .block_on(async { self.connect().await.map(drop) })
    }

    fn lacks(&self, reference: &str) -> bool {
        self.runtime.block_on(async {
            let Some(engine) = self.engine().await else {
                return false;
            };
            matches!(engine.inspect(reference).await, Ok(None))
        })
    }

    fn resolve(&self, reference: &str) -> Result<Option<BasePin>> {
        self.runtime.block_on(async {
            let Some(engine) = self.engine().await else {
                return Ok(None);
            };
            let Some(image) = engine.inspect(reference).await? else {
                return Ok(None);
            };
            let parsed = Reference::parse(reference).map_err(Error::usage)?;
            let repository = parsed.name();
            // Only the classic store's repo digests are a registry's: the containerd store
            // names every image by a manifest digest, one it made at `docker load` too.
            let classic = engine.store().await? == ImageStore::Classic;
            let repo_digest = image.repo_digests.iter().filter(|_| classic).find_map(|d| {
                d.split_once('@')
                    .filter(|(r, _)| *r == repository || r.ends_with(&format!("/{repository}")))
                    .map(|(_, digest)| digest.to_string())
            });
            let (digest, kind) = match repo_digest {
                Some(digest) => (digest, DigestKind::RepoDigest),
                None => match config_digest(&engine, reference, self.cache).await? {
                    Some((_, config)) => (config, DigestKind::ConfigDigest),
                    None => return Ok(None),
                },
            };
            let digest = crate::inputs::values::Digest::try_from(digest)
                .map_err(|e| engine.error(format!("{reference}: {e}")))?;
            Ok(Some(BasePin {
                reference: parsed.clone(),
                digest,
                kind,
                entrypoint: image.strings("Entrypoint"),
                cmd: image.strings("Cmd"),
            }))
        })
    }

    fn files(
        &self,
        reference: &str,
        paths: &[&str],
    ) -> Result<Option<crate::plan::lock::ImageFiles>> {
        self.with_containers(reference, async |engine| {
            let Some(image) = engine.inspect(reference).await? else {
                return Ok(None);
            };
            // Never started: a container only to read files from.
            let mut body = serde_json::json!({
                "Image": reference,
                "NetworkDisabled": true,
                "HostConfig": {"NetworkMode": "none"},
            });
            crate::engine::containers::run_exactly(&mut body, &["/nonexistent".into()]);
            let id = engine.create_container(body).await?;
            let read = read_files(engine, &id, paths).await;
            engine.remove_created(&id).await;
            Ok(Some(crate::plan::lock::ImageFiles {
                platform: image.platform(),
                files: read?,
            }))
        })
    }

    fn interpreter(&self, reference: &str) -> Result<Option<python::Interpreter>> {
        self.with_containers(reference, async |engine| {
            if engine.inspect(reference).await?.is_none() {
                return Ok(None);
            }
            // Fails on an image for another machine or without python3: not an answer.
            Ok(
                match engine.run_once(reference, &python::probe_command()).await {
                    Ok((0, output)) => python::parse_probe_answer(&output)
                        .ok()
                        .map(|target| target.interpreter),
                    _ => None,
                },
            )
        })
    }
}

/// The regular files at `paths` in the container `id` (a path it lacks is left out), by
/// absolute path. Each read has the answer deadline: these are a few megabytes.
async fn read_files(
    engine: &Engine,
    id: &str,
    paths: &[&str],
) -> Result<std::collections::BTreeMap<String, Vec<u8>>> {
    use futures_util::StreamExt;
    use std::io::Read;
    let mut files = std::collections::BTreeMap::new();
    for path in paths {
        let mut tar = Vec::new();
        let mut chunks = engine.get_archive(id, path);
        let read = async {
            while let Some(chunk) = chunks.next().await {
                tar.extend_from_slice(&chunk?);
            }
            Ok::<_, crate::engine::StreamError>(())
        };
        match tokio::time::timeout(crate::engine::answer_timeout(), read).await {
            Err(_) => {
                return Err(
                    engine.error(format!("reading {path} of a container: no answer in time"))
                );
            }
            // No such file in the image: not an error here, the caller says what is missing.
            Ok(Err(e)) if e.is_not_found() => continue,
            Ok(Err(e)) => {
                return Err(engine.error(format!("reading {path} of a container: {e}")));
            }
            Ok(Ok(())) => {}
        }
        let parent = Path::new(path).parent().unwrap_or(Path::new("/"));
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries = archive
            .entries()
            .map_err(|e| engine.error(format!("reading {path} of a container: {e}")))?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| engine.error(format!("reading {path} of a container: {e}")))?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = entry
                .path()
                .map_err(|e| engine.error(format!("reading {path} of a container: {e}")))?
                .into_owned();
            // The engine names entries below the path's folder; nothing may climb out.
            if name
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                continue;
            }
            let mut bytes = Vec::new();
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| engine.error(format!("reading {path} of a container: {e}")))?;
            files.insert(parent.join(name).to_string_lossy().into_owned(), bytes);
        }
    }
    Ok(files)
}
