//! `hallmark build`: parents first; an image whose checksum label the builder already holds
//! is up to date and costs one API call. Otherwise the deterministic context is streamed to
//! the engine, the image is built untagged, its smoke tests run, and only then does the tag
//! move: a failed build or smoke leaves the previous image under the tag.

use crate::assemble;
use crate::context;
use crate::engine::{self, Engine};
use crate::error::{Error, Result};
use crate::fetch;
use crate::normalize;
use crate::plan::{Plan, PlannedImage};
use crate::render::{self, PARENT_ARG};
use crate::store::LayerStore;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What one build did; written to `.hallmark/records/` and printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct BuildRecord {
    pub image: String,
    pub reference: String,
    pub checksum: String,
    pub image_id: String,
    /// `built` or `up-to-date`.
    pub outcome: &'static str,
    pub size: Option<i64>,
    pub seconds: f64,
    pub parent: Option<String>,
    pub parent_image_id: Option<String>,
    pub pins: BTreeMap<String, String>,
    pub smoke: Vec<SmokeResult>,
    pub log: Option<PathBuf>,
    /// With `--check-repro`: whether two builds from scratch gave the same image.
    pub reproducible: Option<bool>,
    pub differences: Vec<String>,
    /// sha256 of the context tar as streamed to the engine (absent when up to date).
    pub context_sha256: Option<String>,
    /// The engine's own image, before normalisation rewrote it (removed once tagged).
    pub raw_image_id: Option<String>,
    pub normalize_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SmokeResult {
    pub name: String,
    pub passed: bool,
    pub exit_code: i64,
    pub seconds: f64,
    pub output: String,
}

#[derive(Clone, Copy)]
pub struct BuildSettings<'a> {
    pub checksum_label: &'a str,
    pub cache: &'a Path,
    pub state_dir: &'a Path,
    pub force: bool,
    /// Print the build log to stderr as it streams.
    pub echo: bool,
}

/// Builds `plan.order` in turn; returns one record per image, parents included.
pub async fn build_all(
    engine: &Engine,
    plan: &Plan,
    settings: &BuildSettings<'_>,
) -> Result<Vec<BuildRecord>> {
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut records = Vec::new();
    for name in &plan.order {
        let image = plan.get(name);
        let parent_tag = image
            .parent
            .as_ref()
            .map(|p| plan.get(p).loaded.reference());
        let parent_id = image.parent.as_ref().map(|p| ids[p.as_str()].clone());
        let record = build_one(engine, image, parent_tag.as_deref(), parent_id, settings).await?;
        ids.insert(name.to_string(), record.image_id.clone());
        records.push(record);
    }
    Ok(records)
}

fn pins_of(image: &PlannedImage) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    if let Some(base) = &image.pins.base {
        pins.insert(format!("base {}", base.reference), base.digest.to_string());
    }
    for source in &image.pins.sources {
        pins.insert(format!("source {}", source.name), source.commit.to_string());
    }
    for wheel in &image.pins.wheels {
        pins.insert(
            format!("wheel {}=={}", wheel.name, wheel.version),
            wheel.sha256.to_string(),
        );
    }
    pins
}

pub async fn build_one(
    engine: &Engine,
    image: &PlannedImage,
    parent_tag: Option<&str>,
    parent_id: Option<String>,
    settings: &BuildSettings<'_>,
) -> Result<BuildRecord> {
    let started = Instant::now();
    let reference = image.loaded.reference();
    let checksum = image.checksum.to_string();
    let mut record = BuildRecord {
        image: image.name().to_string(),
        reference: reference.clone(),
        checksum: checksum.clone(),
        image_id: String::new(),
        outcome: "up-to-date",
        size: None,
        seconds: 0.0,
        parent: image.parent.as_ref().map(|p| p.to_string()),
        parent_image_id: parent_id.clone(),
        pins: pins_of(image),
        smoke: Vec::new(),
        log: None,
        context_sha256: None,
        raw_image_id: None,
        reproducible: None,
        differences: Vec::new(),
        normalize_seconds: None,
    };

    if !settings.force {
        // The common case costs one call: the tag already names an image with this checksum.
        let tagged = engine.inspect(&reference).await?;
        let label = tagged
            .as_ref()
            .and_then(|i| i.label(settings.checksum_label));
        let up_to_date = match (label, &tagged) {
            (Some(label), Some(image)) if label == checksum => {
                Some((image.id().unwrap_or_default().to_string(), image.size))
            }
            _ => match engine
                .images_with_label(settings.checksum_label, &checksum)
                .await?
                .first()
            {
                // Built before, but the tag moved (to an older build): point it back.
                Some(id) => {
                    engine.tag(id, &reference).await?;
                    Some((id.clone(), engine.inspect(id).await?.and_then(|i| i.size)))
                }
                None => None,
            },
        };
        if let Some((id, size)) = up_to_date {
            record.image_id = id;
            record.size = size;
            record.seconds = started.elapsed().as_secs_f64();
            return Ok(record);
        }
    }

    // An external base: the builder's own reference for the pinned image, checked to exist.
    let parent_id = match parent_id {
        Some(id) => Some(id),
        None => crate::base::on_builder(engine, image, settings.cache).await?,
    };
    let id = if assemble::assemblable(&image.loaded.spec) {
        record.outcome = "assembled";
        let parent = parent_id
            .clone()
            .unwrap_or_else(|| render::parent_reference(image, parent_tag));
        let store = std::sync::Arc::new(LayerStore::open(settings.cache));
        assemble::assemble(
            engine,
            &store,
            settings.cache,
            image,
            &parent,
            settings.checksum_label,
            parent_tag,
        )
        .await?
    } else {
        record.outcome = "built";
        let raw = engine_build(
            engine,
            image,
            parent_tag,
            parent_id.as_deref(),
            settings,
            &mut record,
        )
        .await?;
        if image.loaded.spec.image.normalize {
            let parent = parent_id
                .clone()
                .unwrap_or_else(|| render::parent_reference(image, parent_tag));
            let parent_layers = engine
                .inspect(&parent)
                .await?
                .map_or(0, |i| i.layers().len());
            let store = std::sync::Arc::new(LayerStore::open(settings.cache));
            let started = Instant::now();
            let id = normalize::normalize(
                engine,
                &store,
                &raw,
                parent_layers,
                image.loaded.spec.image.source_date_epoch,
            )
            .await?;
            record.normalize_seconds = Some(started.elapsed().as_secs_f64());
            record.raw_image_id = Some(raw);
            id
        } else {
            raw
        }
    };

    // The label the engine holds must be the one we computed: the image says what it is.
    let inspected = engine
        .inspect(&id)
        .await?
        .ok_or_else(|| engine.error(format!("the new image {id} is gone")))?;
    let stamped = inspected.label(settings.checksum_label);
    if stamped != Some(checksum.as_str()) {
        return Err(engine.error(format!(
            "the new image {id} of `{}` carries {:?} as `{}`, not {checksum}; does the template keep the LABEL?",
            image.name(),
            stamped,
            settings.checksum_label
        )));
    }

    record.smoke = smoke(engine, image, &id).await?;
    engine.tag(&id, &reference).await?;
    if let Some(raw) = record.raw_image_id.as_ref().filter(|raw| **raw != id) {
        // The engine's raw image (and its build cache) is replaced by the normalised one.
        engine.remove_untagged(raw).await;
    }
    record.image_id = id;
    record.size = inspected.size;
    record.seconds = started.elapsed().as_secs_f64();
    write_record(settings.state_dir, &record)?;
    Ok(record)
}

/// Builds `image` with the engine's builder from its rendered Dockerfile and streamed
/// context; returns the new (untagged) image's id. Streams the log to `record.log`.
async fn engine_build(
    engine: &Engine,
    image: &PlannedImage,
    parent_tag: Option<&str>,
    parent_id: Option<&str>,
    settings: &BuildSettings<'_>,
    record: &mut BuildRecord,
) -> Result<String> {
    let checksum = image.checksum.to_string();
    let dockerfile = render::dockerfile(image, settings.checksum_label, parent_tag)?;
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
    let network = if image.loaded.spec.build.network {
        "default"
    } else {
        "none"
    };
    let options = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .rm(true)
        .forcerm(true)
        .nocache(settings.force)
        .networkmode(network)
        .buildargs(&args)
        .build();

    let (context_digest, digest_receiver) = tokio::sync::oneshot::channel();
    let body = context_stream(image.clone(), dockerfile, fetched, context_digest);
    let mut stream = engine
        .docker
        .build_image(options, None, Some(bollard::body_stream(body)));
    let mut step: Option<String> = None;
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut built_id: Option<String> = None;
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(text) = &info.stream {
                    let _ = log.write_all(text.as_bytes());
                    if settings.echo {
                        eprint!("{text}");
                    }
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        if line.starts_with("Step ") {
                            step = Some(line.trim().to_string());
                            tail.clear();
                        } else {
                            tail.push_back(line.to_string());
                            if tail.len() > 20 {
                                tail.pop_front();
                            }
                        }
                    }
                }
                if let Some(detail) = info.error_detail.as_ref().and_then(|d| d.message.clone()) {
                    let _ = writeln!(log, "{detail}");
                    failure = Some(detail);
                }
                if let Some(id) = info.aux.as_ref().and_then(|aux| aux.id.clone()) {
                    built_id = Some(id);
                }
            }
            Err(e) => {
                let message = e.to_string();
                let _ = writeln!(log, "{message}");
                failure = Some(message);
                break;
            }
        }
    }
    let fail = |message: String, step: Option<String>, tail: VecDeque<String>| Error::BuildFailed {
        image: image.name().to_string(),
        step,
        message,
        tail: tail.into_iter().collect(),
        log: log_path.clone(),
    };
    if let Some(message) = failure {
        return Err(fail(message, step, tail));
    }
    let Some(id) = built_id else {
        return Err(fail("the engine reported no image id".into(), step, tail));
    };

    record.context_sha256 = digest_receiver.await.ok();
    Ok(id)
}

/// Runs every smoke test of `image` in a container from `image_id`; the first failure stops.
pub async fn smoke(
    engine: &Engine,
    image: &PlannedImage,
    image_id: &str,
) -> Result<Vec<SmokeResult>> {
    let mut results = Vec::new();
    for test in &image.loaded.spec.smokes {
        let started = Instant::now();
        let (code, output) = engine.run_once(image_id, &test.run).await?;
        let result = SmokeResult {
            name: test.name.get_ref().clone(),
            passed: code == 0,
            exit_code: code,
            seconds: started.elapsed().as_secs_f64(),
            output,
        };
        if !result.passed {
            return Err(Error::SmokeFailed {
                image: image.name().to_string(),
                smoke: result.name,
                node: engine.node.clone(),
                code,
                output: result.output,
            });
        }
        results.push(result);
    }
    Ok(results)
}

fn open_log(path: &Path) -> Result<fs_err::File> {
    let dir = path.parent().expect("logs live in a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    fs_err::File::create(path).map_err(|e| Error::io(path, e))
}

fn write_record(state_dir: &Path, record: &BuildRecord) -> Result<()> {
    let dir = state_dir.join("records");
    fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let path = dir.join(format!("{}-{}.json", record.image, &record.checksum[..12]));
    let text = serde_json::to_string_pretty(record).expect("record serializes");
    fs_err::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// The context as a stream of chunks, written by a thread; its sha256 arrives on `digest`.
fn context_stream(
    image: PlannedImage,
    dockerfile: String,
    fetched: fetch::Fetched,
    digest: tokio::sync::oneshot::Sender<String>,
) -> impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static {
    engine::body_from_writer(None, move |writer| {
        let writer = context::write(&image, &dockerfile, &fetched, writer)?;
        writer
            .flush()
            .map_err(|e| Error::io(&image.loaded.path, e))?;
        let _ = digest.send(writer.get_ref().sha256());
        Ok(())
    })
}
