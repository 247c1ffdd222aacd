//! `hallmark build`: parents first; an image whose checksum label the builder already holds
//! is up to date and costs one API call. Otherwise the deterministic context is streamed to
//! the engine, the image is built untagged, its smoke tests run, and only then does the tag
//! move: a failed build or smoke leaves the previous image under the tag.

use crate::engine::{self, Engine};
use crate::error::{BuildFailure, Error, Result};
use crate::images::identity;
use crate::images::store::LayerStore;
use crate::make::assemble;
use crate::make::build_cache;
use crate::make::context;
use crate::make::normalize::{self, pending_label};
use crate::make::render::{self, PARENT_ARG};
use crate::oci::Hashing;
use crate::plan::fetch;
use crate::plan::{Plan, PlannedImage};
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
    /// `built`, `assembled`, `up-to-date` or `failed`.
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
    /// The layers normalisation rewrote, and how many of them as the export streamed in (the
    /// others from a temporary copy: see `normalize::Normalised`).
    pub normalized_layers: Option<usize>,
    pub normalized_as_streamed: Option<usize>,
    /// Where normalisation read the new layers: `export` or `layer directories`.
    pub normalized_from: Option<&'static str>,
    /// Why the export was read and not the layer directories (the engine is remote, its
    /// image store is containerd, the data root cannot be read, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalized_from_reason: Option<String>,
    /// Why the image failed (`outcome` "failed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SmokeResult {
    pub name: String,
    pub passed: bool,
    pub exit_code: i64,
    pub seconds: f64,
    pub output: String,
    /// A served test's process: its last 50 lines of output.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
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

/// Builds `plan.order` in turn; returns one record per image, parents included, and the
/// errors of those that failed. One failed image does not stop the others (`build A B C`
/// built nothing after a failed A): it has a record (`outcome` "failed"), the images on it
/// one saying they were not built ("not-built"), and the rest are built.
pub async fn build_all(
    engine: &Engine,
    plan: &Plan,
    settings: &BuildSettings<'_>,
) -> (Vec<BuildRecord>, Result<()>) {
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for name in &plan.order {
        let image = plan.get(name);
        if let Some(parent) = image
            .parent
            .as_ref()
            .filter(|p| !ids.contains_key(p.as_str()))
        {
            let mut record = BuildRecord::new(image, None);
            record.outcome = "not-built";
            record.error = Some(format!("not built: it stands on `{parent}`, which failed"));
            records.push(record);
            continue;
        }
        let parent_tag = image
            .parent
            .as_ref()
            .map(|p| plan.get(p).loaded.reference());
        let parent_id = image.parent.as_ref().map(|p| ids[p.as_str()].clone());
        let mut record = BuildRecord::new(image, parent_id.clone());
        let outcome = build_into(
            &mut record,
            engine,
            image,
            parent_tag.as_deref(),
            parent_id,
            settings,
        )
        .await;
        if let Err(error) = outcome {
            // Ctrl-C ends the run; any other failure is this image's alone.
            let interrupted = matches!(error, Error::Interrupted { .. });
            record.outcome = "failed";
            record.error = Some(crate::error::plain_text(&error.to_string()));
            records.push(record);
            errors.push(error);
            if interrupted {
                break;
            }
            continue;
        }
        ids.insert(name.to_string(), record.image_id.clone());
        records.push(record);
    }
    let outcome = match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Many(errors)),
    };
    (records, outcome)
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

impl BuildRecord {
    fn new(image: &PlannedImage, parent_image_id: Option<String>) -> BuildRecord {
        BuildRecord {
            image: image.name().to_string(),
            reference: image.loaded.reference(),
            checksum: image.checksum.to_string(),
            image_id: String::new(),
            outcome: "up-to-date",
            size: None,
            seconds: 0.0,
            parent: image.parent.as_ref().map(|p| p.to_string()),
            parent_image_id,
            pins: pins_of(image),
            smoke: Vec::new(),
            log: None,
            context_sha256: None,
            raw_image_id: None,
            reproducible: None,
            differences: Vec::new(),
            normalize_seconds: None,
            normalized_layers: None,
            normalized_as_streamed: None,
            normalized_from: None,
            normalized_from_reason: None,
            error: None,
        }
    }
}

#[tracing::instrument(skip_all, fields(image = %image.loaded.name, checksum = %image.checksum))]
pub async fn build_one(
    engine: &Engine,
    image: &PlannedImage,
    parent_tag: Option<&str>,
    parent_id: Option<String>,
    settings: &BuildSettings<'_>,
) -> Result<BuildRecord> {
    let mut record = BuildRecord::new(image, parent_id.clone());
    build_into(&mut record, engine, image, parent_tag, parent_id, settings).await?;
    Ok(record)
}

/// The image the builder already holds for `image`'s checksum, if any: the tagged one, or an
/// untagged one (the tag moved to an older build), which gets the tag back. Only an image
/// hallmark finished counts ([`identity::unfinished`]): the step images of a build on this
/// one carry its label too, and so does a `docker commit` over its tag, which is said, and
/// which the tag then leaves.
async fn up_to_date(
    engine: &Engine,
    image: &PlannedImage,
    settings: &BuildSettings<'_>,
) -> Result<Option<(String, Option<i64>)>> {
    let reference = image.loaded.reference();
    let checksum = image.checksum.as_str();
    let store = LayerStore::open(settings.cache);
    if let Some(tagged) = engine.inspect(&reference).await?
        && tagged.label(settings.checksum_label) == Some(checksum)
    {
        let id = tagged.id().unwrap_or_default();
        match identity::unfinished(&store, id, checksum) {
            None => return Ok(Some((id.to_string(), tagged.size))),
            // A warning, said even with `-q`: an image changed by hand loses its tag.
            Some(why) => crate::output::stderr(&format!(
                "warning: {reference} on the builder carries checksum {} but hallmark did not finish it ({why}); it is not used: the tag moves to the image hallmark finished for it, or to the one this build makes once it passes",
                &checksum[..12.min(checksum.len())]
            )),
        }
    }
    let found = engine
        .images_with_label(settings.checksum_label, checksum)
        .await?;
    for id in found {
        if identity::unfinished(&store, &id, checksum).is_some() {
            continue;
        }
        engine.tag(&id, &image.loaded.image_reference()).await?;
        let size = engine.inspect(&id).await?.and_then(|i| i.size);
        return Ok(Some((id, size)));
    }
    Ok(None)
}

/// Builds one image into `record`: up to date, or made, smoke-tested, stamped and tagged.
async fn build_into(
    record: &mut BuildRecord,
    engine: &Engine,
    image: &PlannedImage,
    parent_tag: Option<&str>,
    parent_id: Option<String>,
    settings: &BuildSettings<'_>,
) -> Result<()> {
    let started = Instant::now();
    let reference = image.loaded.reference();
    let checksum = image.checksum.to_string();
    // Two builds of one image on one builder take turns; the second then finds the first's.
    let _turn = BuildTurn::take(settings, engine, &reference).await?;
    if !settings.force
        && let Some((id, size)) = up_to_date(engine, image, settings).await?
    {
        record.image_id = id;
        record.size = size;
        record.seconds = started.elapsed().as_secs_f64();
        return Ok(());
    }
    // An interrupted or failed run of this checksum left unfinished images: they are no use.
    for leftover in engine
        .images_with_label(settings.checksum_label, &pending_label(&checksum))
        .await?
    {
        engine.remove_untagged(&leftover).await;
    }
    // An external base: the builder's own reference for the pinned image, checked to exist.
    let parent_id = match parent_id {
        Some(id) => Some(id),
        None => crate::make::base::on_builder(engine, image, settings.cache).await?,
    };
    let job = Job {
        engine,
        image,
        parent_tag,
        parent_id,
        settings,
        store: std::sync::Arc::new(LayerStore::open(settings.cache)),
        smoked: !image.loaded.spec.smokes.is_empty(),
        checksum,
    };
    let spec = &image.loaded.spec;
    let made = if assemble::assemblable(spec) {
        job.assembled(record).await?
    } else if spec.image.normalize {
        job.normalised(record).await?
    } else {
        job.engine_built(record).await?
    };
    job.finish(made, record).await?;
    record.seconds = started.elapsed().as_secs_f64();
    write_record(settings.state_dir, record)
}

/// One image to make, once it is known not to be up to date: what each way of making it
/// needs.
struct Job<'a> {
    engine: &'a Engine,
    image: &'a PlannedImage,
    parent_tag: Option<&'a str>,
    /// The parent's image id on the builder (an external base's included).
    parent_id: Option<String>,
    settings: &'a BuildSettings<'a>,
    store: std::sync::Arc<LayerStore>,
    checksum: String,
    /// Whether smoke tests run after the making: until they pass, the made image carries
    /// only a pending label, and the checksum is stamped after them.
    smoked: bool,
}

/// The image a strategy made, untagged.
struct Made {
    id: String,
    /// Whether hallmark wrote its config (then its layers are in the layer store, and
    /// stamping it rewrites the config and loads no layer).
    by_hallmark: bool,
}

impl Job<'_> {
    /// The checksum label's value in what a strategy makes: the checksum is stamped by the
    /// last step that makes the image (smoke tests, if any, come after the making).
    fn made_label(&self) -> String {
        if self.smoked {
            pending_label(&self.checksum)
        } else {
            self.checksum.clone()
        }
    }

    /// The parent as the builder names it: its id, else its reference.
    fn parent(&self) -> String {
        self.parent_id
            .clone()
            .unwrap_or_else(|| render::parent_reference(self.image, self.parent_tag))
    }

    /// Assembly (`assemble.rs`): hallmark writes the new layers and the config; no container
    /// runs.
    async fn assembled(&self, record: &mut BuildRecord) -> Result<Made> {
        record.outcome = "assembled";
        crate::make::compile::compile_all(
            self.engine,
            &self.store,
            self.image,
            &self.parent(),
            self.settings,
        )
        .await?;
        let id = assemble::assemble(
            self.engine,
            &self.store,
            self.settings.cache,
            self.image,
            &self.parent(),
            assemble::Stamp {
                checksum_label: self.settings.checksum_label,
                checksum_value: &self.made_label(),
                parent_tag: self.parent_tag,
            },
        )
        .await?;
        Ok(Made {
            id,
            by_hallmark: true,
        })
    }

    /// The engine's builder, its image kept as it made it (`normalize = false`).
    async fn engine_built(&self, record: &mut BuildRecord) -> Result<Made> {
        record.outcome = "built";
        let id = self.engine_build(&self.made_label(), record).await?;
        Ok(Made {
            id,
            by_hallmark: false,
        })
    }

    /// The engine's builder, then the layers its build added rewritten into their canonical
    /// form (`normalize.rs`). The engine's own image is never the finished one.
    async fn normalised(&self, record: &mut BuildRecord) -> Result<Made> {
        record.outcome = "built";
        let raw = self
            .engine_build(&pending_label(&self.checksum), record)
            .await?;
        let parent = self.parent();
        let parent_layers = self
            .engine
            .inspect(&parent)
            .await?
            .map_or(0, |i| i.layers().len());
        let started = Instant::now();
        let label = self.settings.checksum_label;
        let finish = (!self.smoked).then_some((label, self.checksum.as_str()));
        let normalised = normalize::normalize(
            self.engine,
            &self.store,
            &format!("`{}`", self.image.name()),
            &raw,
            normalize::Parent {
                name: &parent,
                layers: parent_layers,
            },
            self.image.loaded.spec.image.source_date_epoch,
            finish,
        )
        .await?;
        record.normalize_seconds = Some(started.elapsed().as_secs_f64());
        record.normalized_layers = Some(normalised.layers);
        record.normalized_as_streamed = Some(normalised.streamed);
        record.normalized_from = Some(normalised.from.as_str());
        record.normalized_from_reason = normalised.why_export;
        record.raw_image_id = Some(raw);
        Ok(Made {
            id: normalised.id,
            by_hallmark: true,
        })
    }

    /// An engine build of the image for the platform its spec names, with its checksum label
    /// set to `label_value`.
    async fn engine_build(&self, label_value: &str, record: &mut BuildRecord) -> Result<String> {
        if let Some(platform) = self.image.loaded.spec.image.platform.as_deref() {
            check_builder_platform(self.engine, self.image, platform).await?;
        }
        let raw = engine_build(
            self.engine,
            self.image,
            self.parent_tag,
            self.parent_id.as_deref(),
            self.settings,
            label_value,
            record,
        )
        .await?;
        // Its step images stay as the engine's cache until a later build supersedes them.
        build_cache::note(
            self.engine,
            &self.store,
            self.image.name().as_str(),
            &raw,
            self.parent_id.as_deref(),
        )
        .await;
        Ok(raw)
    }

    /// Checks the platform of what was made, runs the smoke tests, stamps the checksum,
    /// checks it and moves the tag; the images it supersedes are removed.
    async fn finish(&self, made: Made, record: &mut BuildRecord) -> Result<()> {
        let (engine, image, label) = (self.engine, self.image, self.settings.checksum_label);
        let checksum = self.checksum.as_str();
        let made_image = engine
            .inspect(&made.id)
            .await?
            .ok_or_else(|| engine.error(format!("the new image {} is gone", made.id)))?;
        if let Some(platform) = image.loaded.spec.image.platform.as_deref() {
            check_image_platform(engine, image, &made_image, platform)?;
        }
        smoke(engine, image, &made.id, &mut record.smoke, true).await?;
        let id = match (self.smoked, made.by_hallmark) {
            (false, _) => made.id.clone(),
            (true, true) => {
                let what = format!("the stamped image of `{}`", image.name());
                stamp_made(engine, &self.store, &made.id, (label, checksum), &what).await?
            }
            (true, false) => stamp_by_build(engine, &made.id, label, checksum).await?,
        };
        // The label the engine holds must be the one we computed: the image says what it is.
        let inspected = engine
            .inspect(&id)
            .await?
            .ok_or_else(|| engine.error(format!("the new image {id} is gone")))?;
        let stamped = inspected.label(label);
        if stamped != Some(checksum) {
            return Err(engine.error(format!(
                "the new image {id} of `{}` carries {:?} as `{label}`, not {checksum}; does the template keep the LABEL?",
                image.name(),
                stamped,
            )));
        }
        // What makes it hallmark's: its record, not its label (`store::finished`).
        crate::images::store::finished::record(
            &self.store,
            &engine.address().to_string(),
            checksum,
            &id,
        )?;
        // The image the tag names now, if hallmark made it (it carries the checksum label):
        // once the tag moves it is superseded, and left on the builder it would be a dangling
        // image for every rebuild.
        let previous = engine
            .inspect(&image.loaded.reference())
            .await?
            .filter(|old| old.label(label).is_some())
            .and_then(|old| old.id().map(str::to_string));
        engine.tag(&id, &image.loaded.image_reference()).await?;
        build_cache::finished(
            &self.store,
            record.raw_image_id.as_deref().unwrap_or(&made.id),
            &id,
        );
        // The engine's raw image (and its build cache) and the unstamped one are superseded.
        for superseded in [record.raw_image_id.as_deref(), Some(made.id.as_str())]
            .into_iter()
            .flatten()
            .filter(|s| *s != id)
        {
            engine.remove_untagged(superseded).await;
        }
        // The previous image only if no other tag names it (removing an image by id removes
        // its last tag with it).
        if let Some(previous) = previous.filter(|p| *p != id)
            && let Some(old) = engine.inspect(&previous).await?
            && old.repo_tags.is_empty()
        {
            engine.remove_untagged(&previous).await;
        }
        record.image_id = id;
        record.size = inspected.size;
        Ok(())
    }
}

/// Stamps an image hallmark made (its config and layers are in the store): the same layers
/// under a config whose checksum label is set. Loads no layer.
async fn stamp_made(
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
async fn stamp_by_build(engine: &Engine, made: &str, key: &str, checksum: &str) -> Result<String> {
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

/// Refuses an engine build for a platform the builder is not: its RUN steps would run on the
/// builder's own platform and give an image that is not what the spec names.
async fn check_builder_platform(engine: &Engine, image: &PlannedImage, wanted: &str) -> Result<()> {
    let builder = engine.platform();
    if same_platform(&builder, wanted) {
        return Ok(());
    }
    Err(Error::Engine {
        node: engine.node.clone(),
        endpoint: engine.endpoint.clone(),
        message: format!(
            "cannot build `{}` for {wanted}: the builder is {builder}, and the image's RUN steps run on the builder",
            image.name()
        ),
        hint: Some(format!(
            "build it on a {wanted} builder (`[builder]` in hallmark.toml), or drop `[image] platform`"
        )),
    })
}

/// The image made for a spec must be of the platform the spec names, whatever made it.
fn check_image_platform(
    engine: &Engine,
    image: &PlannedImage,
    made: &crate::engine::ImageAnswer,
    wanted: &str,
) -> Result<()> {
    let got = made.platform();
    if same_platform(&got, wanted) {
        return Ok(());
    }
    Err(engine.error(format!(
        "the image made for `{}` is {got}, but its spec names {wanted} (is its parent of another platform?)",
        image.name()
    )))
}

/// Whether platform `have` satisfies `want`: the same os and architecture, and the same
/// variant when `want` names one (`linux/arm64` is `linux/arm64/v8`).
pub fn same_platform(have: &str, want: &str) -> bool {
    let canonical = |p: &str| {
        let mut parts: Vec<String> = p.split('/').map(str::to_ascii_lowercase).collect();
        if parts.len() == 2 && parts[1] == "arm64" {
            parts.push("v8".into());
        }
        parts
    };
    let (have, want) = (canonical(have), canonical(want));
    have.len() >= 2
        && want.len() >= 2
        && have[..2] == want[..2]
        && (want.len() < 3 || have.get(2) == want.get(2))
}

/// Serialises builds of one image on one builder ([`crate::images::turn`]), for the whole build.
struct BuildTurn {
    _turn: crate::images::turn::Turn,
}

impl BuildTurn {
    async fn take(
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
async fn engine_build(
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
struct FollowedBuild {
    id: Option<String>,
    failure: Option<String>,
    step: Option<String>,
    tail: VecDeque<String>,
}

async fn follow_build(
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
            Err(message) => {
                let _ = writeln!(log, "{message}");
                followed.failure = Some(message);
                break;
            }
        }
    }
    followed
}

/// Runs the smoke tests of `image` in containers from `image_id`, appending each result to
/// `results`; the first failure stops and is the error. A foreign-platform image is refused
/// before any container starts: the engine could not run it, or would emulate it.
pub async fn smoke(
    engine: &Engine,
    image: &PlannedImage,
    image_id: &str,
    results: &mut Vec<SmokeResult>,
    on_builder: bool,
) -> Result<()> {
    let tests: Vec<_> = (image.loaded.spec.smokes.iter())
        .filter(|t| t.runs_on(on_builder))
        .collect();
    if tests.is_empty() {
        return Ok(());
    }
    if let Some(inspected) = engine.inspect(image_id).await? {
        let node = engine.platform();
        let made = inspected.platform();
        if !same_platform(&node, &made) {
            return Err(engine.error(format!(
                "cannot run the smoke tests of `{}`: the image is {made} and the engine is {node}",
                image.name()
            )));
        }
    }
    for test in tests {
        let started = Instant::now();
        // A program that cannot start (not in the image, not executable) is the engine's
        // refusal to start the container: said with the image, the test and its spec line
        // (a bare "400 Bad Request" named none of them).
        let line =
            crate::error::Location::of_offset(&image.loaded.text, test.name.span().start).line;
        let ran = engine
            .run_smoke(image_id, &smoke_run(test))
            .await
            .map_err(|e| {
                let words = match e {
                    Error::Engine { message, .. } => message,
                    other => other.to_string(),
                };
                engine.error(format!(
                    "smoke test `{}` of `{}` ({}:{line}) could not run `{}`: {words}",
                    test.name.get_ref(),
                    image.name(),
                    image.loaded.path.display(),
                    test.run.get_ref().join(" "),
                ))
            })?;
        let mut output = crate::error::plain_text(&ran.output);
        let expected = test.expect.as_ref().map(|e| e.get_ref());
        let matched = expected.is_none_or(|pattern| {
            regex::Regex::new(pattern).is_ok_and(|re| re.is_match(&ran.stdout))
        });
        if let Some(why) = &ran.failure {
            output = format!("{why}\n{output}");
        } else if ran.code == 0 && !matched {
            output = format!(
                "its output does not match `{}`\n{output}",
                expected.map(String::as_str).unwrap_or_default()
            );
        }
        let result = SmokeResult {
            name: test.name.get_ref().clone(),
            passed: ran.failure.is_none() && ran.code == 0 && matched,
            exit_code: ran.code,
            seconds: started.elapsed().as_secs_f64(),
            output,
            logs: ran
                .logs
                .iter()
                .map(|l| crate::error::plain_text(l))
                .collect(),
        };
        results.push(result.clone());
        if !result.passed {
            let mut output = result.output;
            if !result.logs.is_empty() {
                output.push_str(&format!(
                    "\nthe served process's last {} lines:\n{}",
                    result.logs.len(),
                    result.logs.join("\n")
                ));
            }
            return Err(Error::SmokeFailed {
                image: image.name().to_string(),
                smoke: result.name,
                node: engine.node.clone(),
                code: result.exit_code,
                output,
            });
        }
    }
    Ok(())
}

/// A `[[smoke]]` in the engine's terms.
fn smoke_run(test: &crate::inputs::spec::Smoke) -> crate::engine::smoke::SmokeRun {
    use crate::engine::smoke::{Gpus, Mount, Served, SmokeRun};
    use crate::inputs::spec::Serve;
    let served = test.served().then(|| Served {
        argv: match test.serve.as_ref().map(|s| s.get_ref()) {
            Some(Serve::Argv(argv)) => Some(argv.clone()),
            _ => None,
        },
        args: test.args.as_ref().map(|a| a.get_ref().clone()),
        ready: test.ready.as_ref().map(|r| r.get_ref().clone()),
        within: std::time::Duration::from_secs(test.timeout.as_ref().map_or(300, |t| *t.get_ref())),
    });
    SmokeRun {
        command: test.run.get_ref().clone(),
        served,
        env: test.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        mounts: (test.mounts.iter())
            .map(|m| Mount {
                source: m.get_ref().source.clone(),
                target: m.get_ref().target.clone(),
                readonly: m.get_ref().readonly,
            })
            .collect(),
        shm_size: (test.shm_size.as_ref())
            .and_then(|s| crate::inputs::spec::byte_size(s.get_ref())),
        ipc: test.ipc.as_ref().map(|i| i.get_ref().clone()),
        ulimits: test.ulimits.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        user: test.user.clone(),
        gpus: test.gpus.as_ref().map(|g| match g.get_ref() {
            crate::inputs::spec::GpuRequest::Count(n) => Gpus::Count(*n),
            crate::inputs::spec::GpuRequest::All(_) => Gpus::All,
            crate::inputs::spec::GpuRequest::Named(names) => Gpus::Named(names.clone()),
        }),
    }
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
        let hashing = context::write(&image, &dockerfile, &fetched, Hashing::new(writer))?;
        let (writer, (sha256, _)) = hashing.finish();
        writer
            .flush()
            .map_err(|e| Error::io(&image.loaded.path, e))?;
        let _ = digest.send(sha256.hex().to_string());
        Ok(())
    })
}
