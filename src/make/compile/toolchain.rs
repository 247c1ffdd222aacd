//! What a compile stage runs in: the image's parent, a pinned external image, or another spec
//! of the project, each found on the builder (nothing is pulled). With `apt` packages, an
//! image of its own is made from that toolchain once: the pinned package files (from the
//! layer store, checked by sha256: `plan::apt`) are put into a container with no network,
//! apt installs them, and the container is committed, normalised as a build's layers are
//! (so the same key gives the same image on every builder), labelled with the key of the
//! toolchain and the pinned files (`hallmark.toolchain`) and tagged
//! `hallmark-toolchain:<key16>`. The next stage with the same toolchain and packages runs in
//! it without running apt again.

use super::log::follow_output;
use super::{PlannedStage, TOOLCHAIN_LABEL, Toolchain, apt_toolchain_reference};
use crate::engine::Engine;
use crate::error::{BuildFailure, Error, Result};
use crate::images::identity;
use crate::images::store::LayerStore;
use crate::make::build::BuildSettings;
use crate::plan::PlannedImage;
use std::sync::Arc;
use std::time::Instant;

/// The builder's id (or reference) of the image `stage` runs in; `parent` is the builder's
/// reference for the image's parent.
pub async fn on_builder(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    parent: &str,
    settings: &BuildSettings<'_>,
) -> Result<String> {
    let base = base_on_builder(engine, image, stage, parent, settings).await?;
    // The stage's apt and its `run` execute as the toolchain's platform: the one question
    // every path asks before code of the image's platform runs (make/build/platform.rs).
    if let Some(toolchain) = engine.inspect(&base).await? {
        let platform = toolchain.platform();
        let what = format!("compile stage `{}`", stage.name);
        let execution =
            crate::make::build::runs_platform(engine, image, &platform, settings.emulate, &what)
                .await?;
        if execution == crate::engine::emulation::Execution::Emulated {
            crate::output::stderr(&format!(
                "{}: emulated: {what} runs as {platform} on a {} builder (`{}`)",
                image.name(),
                engine.platform(),
                engine.node
            ));
        }
    }
    match &stage.apt_key {
        None => Ok(base),
        Some(key) => with_apt(engine, image, stage, &base, key, settings).await,
    }
}

async fn base_on_builder(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    parent: &str,
    settings: &BuildSettings<'_>,
) -> Result<String> {
    let missing = |what: String, hint: String| Error::Engine {
        node: engine.node.clone(),
        endpoint: engine.endpoint.clone(),
        message: format!(
            "does not hold the toolchain of compile stage `{}` of `{}`: {what}",
            stage.name,
            image.name()
        ),
        hint: Some(hint),
    };
    match &stage.toolchain {
        Toolchain::Parent => Ok(parent.to_string()),
        Toolchain::External(pin) => {
            crate::make::base::pinned_on_builder(engine, pin, settings.cache)
                .await?
                .ok_or_else(|| {
                    missing(
                        format!("`{}` pinned at {}", pin.reference, pin.digest),
                        format!(
                            "load that image on `{}`, or run `hallmark lock --update {}`",
                            engine.node,
                            image.name()
                        ),
                    )
                })
        }
        Toolchain::Image {
            name,
            reference,
            checksum,
        } => {
            let found = engine.inspect(reference).await?;
            let current = found.as_ref().filter(|answer| {
                identity::label(answer, settings.checksum_label) == Some(checksum.as_str())
            });
            match current.and_then(|answer| answer.id()) {
                Some(id) => Ok(id.to_string()),
                None => Err(missing(
                    format!("the image `{name}` ({reference}) with checksum {checksum}"),
                    format!("build it first: hallmark build {name}"),
                )),
            }
        }
    }
}

/// The toolchain `base` with the stage's apt packages: found by its key, else made.
async fn with_apt(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    base: &str,
    key: &str,
    settings: &BuildSettings<'_>,
) -> Result<String> {
    if let Some(id) = engine
        .images_with_label(TOOLCHAIN_LABEL, key)
        .await?
        .first()
    {
        return Ok(id.clone());
    }
    let started = Instant::now();
    let store = Arc::new(LayerStore::open(settings.cache));
    let pins = image.pins.apt_for(Some(&stage.name));
    let files = crate::plan::apt::ensure_debs(&store, image.name().as_str(), &pins)?;
    let debs = debs_tar(&files)?;
    let packages: Vec<String> = pins.iter().map(|p| p.describe()).collect();
    let script = format!(
        "set -e\nDEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --no-remove -o Dpkg::Use-Pty=0 -o APT::Sandbox::User=root {DEBS_DIR}/*.deb\nrm -rf {DEBS_DIR} {APT_LEFTOVERS}",
    );
    let mut body = serde_json::json!({
        "Image": base,
        // Kept in the committed image: what finds it again.
        "Labels": {TOOLCHAIN_LABEL: key},
        "NetworkDisabled": true,
        "HostConfig": {"NetworkMode": "none"},
    });
    crate::engine::containers::run_exactly(&mut body, &["/bin/sh".into(), "-c".into(), script]);
    let log = settings.state_dir.join("logs").join(format!(
        "{}-toolchain-{}-{}.log",
        image.name(),
        stage.name,
        &key[..12]
    ));
    let id = engine.create_container(body).await?;
    let made = async {
        let body = futures_util::stream::once(async move { bytes::Bytes::from(debs) });
        let put = engine.put_archive(&id, "/", body);
        tokio::time::timeout(crate::engine::stall::stall_timeout(), put)
            .await
            .map_err(|_| engine.error(format!("container {id} took no package files in time")))??;
        engine.start_container(&id).await?;
        let followed = follow_output(engine, &id, &log, settings.echo).await?;
        let code = engine.wait_container(&id).await?;
        if code != 0 {
            return Err(Error::from(BuildFailure {
                image: image.name().to_string(),
                node: engine.node.clone(),
                step: Some(format!(
                    "compile stage `{}`, installing its pinned apt packages into its toolchain: {}",
                    stage.name,
                    packages.join(" ")
                )),
                message: format!("exit code {code}"),
                tail: followed.tail,
                log: log.clone(),
            }));
        }
        engine
            .commit_container(&id, "hallmark-toolchain-raw", &key[..16])
            .await
    }
    .await;
    engine.remove_created(&id).await;
    let raw = made?;
    let base_layers = engine.inspect(base).await?.map_or(0, |i| i.layers().len());
    let normalised = crate::make::normalize::normalize(
        engine,
        &store,
        &format!("the toolchain of compile stage `{}`", stage.name),
        &raw,
        crate::make::normalize::Parent {
            name: base,
            layers: base_layers,
        },
        image.loaded.spec.image.source_date_epoch,
        Some((TOOLCHAIN_LABEL, key)),
    )
    .await;
    engine
        .untag(&format!("hallmark-toolchain-raw:{}", &key[..16]))
        .await;
    let normalised = normalised?;
    let reference = apt_toolchain_reference(key);
    let parsed = crate::oci::Reference::parse(&reference).map_err(Error::usage)?;
    engine.tag(&normalised.id, &parsed).await?;
    if settings.echo {
        crate::output::stderr(&format!(
            "compile stage `{}`: toolchain with apt packages made in {:.1} s, kept as {}",
            stage.name,
            started.elapsed().as_secs_f64(),
            reference
        ));
    }
    Ok(normalised.id)
}

/// Where the package files are put in the toolchain container (removed before the commit).
const DEBS_DIR: &str = "/tmp/hallmark-apt";

/// What apt and dpkg leave that differs from one run to the next (logs with times, caches of
/// file times): removed so that the same packages give the same layer.
const APT_LEFTOVERS: &str = "/var/log/apt /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache /var/cache/apt/*.bin /var/lib/apt/lists/*";

/// A tar of the package files under `DEBS_DIR`, for the container before it starts.
fn debs_tar(files: &[(&crate::inputs::pins::AptPin, std::path::PathBuf)]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let io = |e| Error::io("the apt packages' tar", e);
    for (pin, path) in files {
        let mut file = fs_err::File::open(path).map_err(|e| Error::io(path, e))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        let name = crate::inputs::apt::deb_file_name(&pin.name, &pin.version, &pin.architecture);
        let path_in = format!("{}/{name}", DEBS_DIR.trim_start_matches('/'));
        tar.append_data(&mut header, path_in, &mut file)
            .map_err(io)?;
    }
    tar.into_inner().map_err(io)
}
