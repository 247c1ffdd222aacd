//! What a compile stage runs in: the image's parent, a pinned external image, or another spec
//! of the project, each found on the builder (nothing is pulled). With `apt` packages, an
//! image of its own is made from that toolchain once: a container installs them (with the
//! engine's default network, as apt needs it) and is committed, labelled with the key of the
//! toolchain and the sorted packages (`hallmark.toolchain`) and tagged
//! `hallmark-toolchain:<key16>`. The next stage with the same toolchain and packages runs in
//! it without running apt again. apt takes versions from the mirror of the day: the image is
//! made once per key on a builder and kept, so builds from it agree; a builder making it anew
//! may get newer packages (say so in the stage's docs when versions matter: pin them as
//! `name=version`).

use super::log::follow_output;
use super::{PlannedStage, TOOLCHAIN_LABEL, Toolchain, apt_toolchain_reference};
use crate::engine::Engine;
use crate::error::{BuildFailure, Error, Result};
use crate::images::identity;
use crate::make::build::BuildSettings;
use crate::plan::PlannedImage;
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
    let script = format!(
        "set -e\napt-get update\nDEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}\napt-get clean\nrm -rf /var/lib/apt/lists/*",
        stage.spec.apt.join(" ")
    );
    let body = serde_json::json!({
        "Image": base,
        "Entrypoint": [],
        "Cmd": ["/bin/sh", "-c", script],
        // Kept in the committed image: what finds it again.
        "Labels": {TOOLCHAIN_LABEL: key},
        "HostConfig": {"NetworkMode": "default"},
    });
    let log = settings.state_dir.join("logs").join(format!(
        "{}-toolchain-{}-{}.log",
        image.name(),
        stage.name,
        &key[..12]
    ));
    let id = engine.create_container(body).await?;
    let made = async {
        engine.start_container(&id).await?;
        let followed = follow_output(engine, &id, &log, settings.echo).await?;
        let code = engine.wait_container(&id).await?;
        if code != 0 {
            return Err(Error::from(BuildFailure {
                image: image.name().to_string(),
                node: engine.node.clone(),
                step: Some(format!(
                    "compile stage `{}`, adding apt packages to its toolchain: {}",
                    stage.name,
                    stage.spec.apt.join(" ")
                )),
                message: format!("exit code {code}"),
                tail: followed.tail,
                log: log.clone(),
            }));
        }
        let reference = apt_toolchain_reference(key);
        let (repository, tag) = reference.split_once(':').expect("a tagged reference");
        engine.commit_container(&id, repository, tag).await
    }
    .await;
    engine.remove_created(&id).await;
    let made = made?;
    if settings.echo {
        crate::output::stderr(&format!(
            "compile stage `{}`: toolchain with apt packages made in {:.1} s, kept as {}",
            stage.name,
            started.elapsed().as_secs_f64(),
            apt_toolchain_reference(key)
        ));
    }
    Ok(made)
}
