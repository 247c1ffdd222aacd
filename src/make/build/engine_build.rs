//! The engine's build: the context streamed in, the build log followed (each step's turn, the
//! image it made), and the stamp that puts the checksum label on the made image.

use super::*;

/// Stamps an image hallmark made (its config and layers are in the store): the same layers
/// under a config whose checksum label is set. Loads no layer.
pub(super) async fn stamp_made(
    engine: &Engine,
    store: &std::sync::Arc<LayerStore>,
    made: &str,
    (key, checksum): (&str, &str),
    what: &str,
) -> Result<String> {
    let stored = store
        .record(made)
        .ok_or_else(|| engine.error(format!("the new image {made} is not in the layer store")))?;
    let mut config = store.read_config(&stored)?;
    normalize::finish_config(&mut config, key, checksum);
    let held = stored.layers.len();
    crate::images::transfer::load_made(engine, store, &config, stored.layers, held, what).await
}

/// Stamps an engine-built image hallmark does not rewrite (`normalize = false`): a build of
/// `FROM` it plus the label, which adds no layer.
pub(super) async fn stamp_by_build(
    engine: &Engine,
    made: &str,
    key: &str,
    checksum: &str,
) -> Result<String> {
    let dockerfile = format!("FROM {made}\nLABEL \"{key}\"=\"{checksum}\"\n");
    let mut context = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    context
        .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .map_err(|e| Error::io("the stamp's build context", e))?;
    let context = context
        .into_inner()
        .map_err(|e| Error::io("the stamp's build context", e))?;
    let stream = engine.build(context.into(), &engine::BuildOptions::default());
    let followed = follow_build(stream, &mut std::io::sink(), false).await;
    match (followed.failure, followed.id) {
        (None, Some(id)) => Ok(id),
        (failure, _) => Err(engine.error(format!(
            "stamping {made} with its checksum failed: {}",
            failure.unwrap_or_else(|| "the engine reported no image id".into())
        ))),
    }
}

/// Serialises builds of one image on one builder ([`crate::images::turn`]), for the whole build.
pub(super) struct BuildTurn {
    pub(super) _turn: crate::images::turn::Turn,
}

impl BuildTurn {
    pub(super) async fn take(
        settings: &BuildSettings<'_>,
        engine: &Engine,
        reference: &str,
    ) -> Result<BuildTurn> {
        let key = format!("{}\n{reference}", engine.endpoint);
        let echo = settings.echo;
        let turn = crate::images::turn::Turn::take(settings.cache, "build", &key, |path| {
            if echo {
                crate::output::stderr(&format!(
                    "waiting for another hallmark building {reference} on {} (lock {})",
                    engine.node,
                    path.display()
                ));
            }
        })
        .await?;
        Ok(BuildTurn { _turn: turn })
    }
}

/// Builds `image` with the engine's builder from its rendered Dockerfile and streamed
/// context, its checksum label set to `label_value`; returns the new (untagged) image's id.
/// Streams the log to `record.log`.
pub(super) async fn engine_build(
    engine: &Engine,
    image: &PlannedImage,
    parent_tag: Option<&str>,
    parent_id: Option<&str>,
    settings: &BuildSettings<'_>,
    label_value: &str,
    record: &mut BuildRecord,
) -> Result<String> {
    let checksum = image.checksum.to_string();
    let dockerfile = render::dockerfile(image, settings.checksum_label, label_value, parent_tag)?;
    let fetched = fetch::fetch(settings.cache, image)?;
    let log_path =
        settings
            .state_dir
            .join("logs")
            .join(format!("{}-{}.log", image.name(), &checksum[..12]));
    let mut log = open_log(&log_path)?;
    record.log = Some(log_path.clone());

    let mut args = HashMap::from([(
        "SOURCE_DATE_EPOCH".to_string(),
        image.loaded.spec.image.source_date_epoch.to_string(),
    )]);
    if let Some(id) = parent_id {
        args.insert(PARENT_ARG.to_string(), id.to_string());
    }
    for (key, value) in &image.loaded.spec.build.args {
        args.insert(key.clone(), value.clone());
    }
    let options = engine::BuildOptions {
        no_cache: settings.force,
        network: image.loaded.spec.build.network,
        args,
        platform: image.loaded.spec.image.platform.clone(),
    };

    let (context_digest, digest_receiver) = tokio::sync::oneshot::channel();
    let body = context_stream(image.clone(), dockerfile, fetched, context_digest);
    let stream = engine.build(engine::Body::stream(body), &options);
    let followed = follow_build(stream, &mut log, settings.echo).await;
    let fail = |message: String| {
        Error::from(BuildFailure {
            image: image.name().to_string(),
            node: engine.node.clone(),
            step: followed.step.clone(),
            message: crate::error::plain_text(&message),
            tail: followed
                .tail
                .iter()
                .map(|line| crate::error::plain_text(line))
                .collect(),
            log: log_path.clone(),
        })
    };
    if let Some(message) = followed.failure.clone() {
        return Err(fail(message));
    }
    let Some(id) = followed.id.clone() else {
        return Err(fail("the engine reported no image id".into()));
    };

    record.context_sha256 = digest_receiver.await.ok();
    Ok(id)
}

/// What an engine build's progress stream said: the image, or the failure with the step it
/// happened in and the output's last lines.
pub(super) struct FollowedBuild {
    pub(super) id: Option<String>,
    pub(super) failure: Option<String>,
    pub(super) step: Option<String>,
    pub(super) tail: VecDeque<String>,
}

pub(super) async fn follow_build(
    mut stream: engine::Reports<'_, engine::BuildEvent>,
    log: &mut dyn Write,
    echo: bool,
) -> FollowedBuild {
    let mut followed = FollowedBuild {
        id: None,
        failure: None,
        step: None,
        tail: VecDeque::new(),
    };
    while let Some(item) = stream.next().await {
        match item {
            Ok(engine::BuildEvent::Output(text)) => {
                let _ = log.write_all(text.as_bytes());
                if echo {
                    crate::output::stderr_exactly(&text);
                }
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    if line.starts_with("Step ") {
                        followed.step = Some(line.trim().to_string());
                        followed.tail.clear();
                    } else {
                        followed.tail.push_back(line.to_string());
                        if followed.tail.len() > 20 {
                            followed.tail.pop_front();
                        }
                    }
                }
            }
            Ok(engine::BuildEvent::Error(detail)) => {
                let _ = writeln!(log, "{detail}");
                followed.failure = Some(detail);
            }
            Ok(engine::BuildEvent::Built(id)) => followed.id = Some(id),
            Err(e) => {
                let message = e.to_string();
                let _ = writeln!(log, "{message}");
                followed.failure = Some(message);
                break;
            }
        }
    }
    followed
}

/// The context as a stream of chunks, written by a thread; its sha256 arrives on `digest`.
pub(super) fn context_stream(
    image: PlannedImage,
    dockerfile: String,
    fetched: fetch::Fetched,
    digest: tokio::sync::oneshot::Sender<String>,
) -> impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static {
    engine::body_from_writer(None, move |writer| {
        let hashing = context::write(&image, &dockerfile, &fetched, Hashing::new(writer))?;
        let (writer, (sha256, _)) = hashing.finish();
        writer
            .flush()
            .map_err(|e| Error::io(&image.loaded.path, e))?;
        let _ = digest.send(sha256.hex().to_string());
        Ok(())
    })
}
