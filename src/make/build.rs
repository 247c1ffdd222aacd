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

mod engine_build;
mod platform;
mod record;
mod smoke;

use engine_build::*;
pub use platform::*;
pub use record::*;
pub use smoke::*;

#[derive(Clone, Copy)]
pub struct BuildSettings<'a> {
    pub checksum_label: &'a str,
    pub cache: &'a Path,
    pub state_dir: &'a Path,
    pub force: bool,
    /// Print the build log to stderr as it streams.
    pub echo: bool,
    /// Whether code of another platform than the builder's may run emulated (`[builder]
    /// emulate`, `--no-emulate`).
    pub emulate: bool,
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
        self.builder_runs_the_platform(record).await?;
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
        self.builder_runs_the_platform(record).await?;
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
        smoke(
            engine,
            image,
            &made.id,
            &mut record.smoke,
            true,
            self.settings.emulate,
        )
        .await?;
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
