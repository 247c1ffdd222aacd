//! Assembly: an image that only adds files, env and metadata to a parent is made by hallmark
//! itself, as ko, jib and apko do: the new layer is a deterministic tar written into the layer
//! store, the config is the parent's own config blob with the changes applied, and the result
//! is loaded into the builder as a thin archive. No container runs, the same inputs give the
//! same image config digest on any engine, and the new layer is already in the store for
//! shipping, so distributing it exports nothing.
//!
//! Wheels are installed as pip would (`wheel.rs`) into their own layer, with the Python paths
//! of the parent, asked once (one `python3 -c` in a container from the parent, the only
//! container an assembly may run) and kept in the layer store by the parent's image id.
//! Specs with sources, RUN steps, apt packages or expected files go through the engine's
//! builder.

use crate::engine::Engine;
use crate::error::{Error, Invalid, Result};
use crate::images::store::{Blob, LAYER_TAR, LayerStore, StoredLayer};
use crate::images::transfer;
use crate::inputs::python;
use crate::inputs::python::PythonTarget;
use crate::inputs::spec::ImageSpec;
use crate::make::anchor::{Anchor, Tree};
use crate::make::context::FilesArchive;
use crate::make::render::{self, rfc3339};
use crate::make::wheel;
use crate::oci::Digest;
use crate::oci::digest::hex_of;
use crate::plan::PlannedImage;
use crate::plan::fetch;
use serde_json::{Value, json};
use std::sync::Arc;

/// The comment of every history step an assembly writes, and the newest step's words (what a
/// person reading `docker history` sees; trust comes from `store::finished`, not from them).
pub const ASSEMBLED: &str = "assembled by hallmark";
pub const CONFIG_STEP: &str = "hallmark: config (env, labels, entrypoint, cmd)";

/// True when nothing in the spec needs a container to run, but for its compile stages
/// (`compile.rs`), whose wheels are assembled like pinned ones.
pub fn assemblable(spec: &ImageSpec) -> bool {
    (spec.sources.is_empty() || !spec.compiles.is_empty())
        && spec.build.apt.is_empty()
        && spec.build.run.is_empty()
        && spec.build.expect_files.is_empty()
}

/// The labels an assembled image is stamped with ([`render::stamped_labels`]).
pub struct Stamp<'a> {
    /// The checksum label's key and the value it is given (`building-...` until finished).
    pub checksum_label: &'a str,
    pub checksum_value: &'a str,
    pub parent_tag: Option<&'a str>,
}

/// Assembles `image` on top of the builder's `parent` (an exact image id or digest
/// reference) and loads it, untagged, into the builder. Returns the builder's id for it.
pub async fn assemble(
    builder: &Engine,
    store: &Arc<LayerStore>,
    cache: &std::path::Path,
    image: &PlannedImage,
    parent: &str,
    stamp: Stamp<'_>,
) -> Result<String> {
    let (parent_id, parent_image) = transfer::stored_image(builder, store, parent).await?;
    let mut config = store.read_config(&parent_image)?;

    let spec = &image.loaded.spec;
    let mtime = spec.image.source_date_epoch;
    let created = rfc3339(mtime);
    let mut layers = parent_image.layers.clone();
    let mut history = Vec::new();
    // New layers are placed in the parent's tree as the engine's ADD would place them.
    // Wheels the image's compile stages made (compile.rs), kept under each stage's checksum.
    let compiled = crate::make::compile::stored_wheels(store, image)?;
    let no_wheels = image.pins.wheels.is_empty() && compiled.is_empty();
    let mut anchor = if image.files.is_empty() && no_wheels {
        None
    } else {
        Some(Anchor::new(Tree::of(store, &parent_image)?, mtime))
    };
    let step = |created_by: String| json!({"created": created, "created_by": created_by, "comment": ASSEMBLED});
    if let (false, Some(anchor)) = (image.files.is_empty(), anchor.as_mut()) {
        layers.push(files_layer(store, image, anchor, parent)?);
        let count = image.files.len();
        history.push(step(format!("hallmark: ADD files.tar / ({count} files)")));
    }
    if let (false, Some(anchor)) = (no_wheels, anchor.as_mut()) {
        let target = python_target(builder, store, &parent_id, parent).await?;
        let mut wheels = pinned_wheels(cache, image, &target)?;
        wheels.extend(compiled_wheels(builder, image, &target, &compiled)?);
        // Distributions the parent has: uninstalled by whiteouts first, as pip would.
        let replaced =
            crate::make::compile::replace::installed(store, &parent_image, &target, &wheels)?;
        layers.push(wheels_layer(
            store, image, &target, anchor, &wheels, &replaced,
        )?);
        let mut installed: Vec<String> = image
            .pins
            .wheels
            .iter()
            .map(|w| format!("{}=={}", w.name, w.version))
            .collect();
        installed.extend(compiled.iter().map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        }));
        history.push(step(format!(
            "hallmark: pip install {}",
            installed.join(" ")
        )));
    }
    history.push(json!({"created": created, "created_by": CONFIG_STEP, "comment": ASSEMBLED, "empty_layer": true}));

    let labels = render::stamped_labels(
        image,
        stamp.checksum_label,
        stamp.checksum_value,
        stamp.parent_tag,
    );
    apply(&mut config, spec, &labels, &created, &layers, history);
    let parent_layers = parent_image.layers.len();
    let what = format!("the assembled image of `{}`", image.name());
    transfer::load_made(builder, store, &config, layers, parent_layers, &what).await
}

/// The layer of the spec's files, each placed in the parent's tree as the engine's ADD would
/// place it.
fn files_layer(
    store: &LayerStore,
    image: &PlannedImage,
    anchor: &mut Anchor,
    parent: &str,
) -> Result<StoredLayer> {
    let archive = FilesArchive::new(&image.files, image.loaded.spec.image.source_date_epoch)?;
    let mut misplaced = None;
    let written = store.add_blob(|out| {
        archive.write_placed(out, |file, tar| {
            anchor.place(&file.dest, tar).inspect_err(|e| {
                misplaced = Some(format!("`{}`: {e}", file.dest));
            })
        })
    });
    if let Some(message) = misplaced {
        return Err(Error::from(Invalid {
            path: image.loaded.path.clone(),
            location: None,
            key: Some("file.dest".into()),
            message: format!("{message} (parent {parent})"),
            hint: None,
        }));
    }
    let (digest, size) = written?;
    Ok(uncompressed_layer(digest, size))
}

/// The pinned wheels' files (fetched into the cache), each checked against the parent's Python.
fn pinned_wheels(
    cache: &std::path::Path,
    image: &PlannedImage,
    target: &PythonTarget,
) -> Result<Vec<std::path::PathBuf>> {
    let mut wheels = Vec::new();
    for pin in &image.pins.wheels {
        let wheel_error = |message: python::PythonError| {
            Error::Wheel {
            image: image.name().to_string(),
            name: pin.name.to_string(),
            version: pin.version.clone(),
            message: message.to_string(),
            hint: Some("to install it in a build instead, add a `[build] run` step such as `pip install ...`: a spec with RUN steps goes through the engine's builder".into()),
        }
        };
        let name = python::parse_name(&pin.file).map_err(wheel_error)?;
        python::check_compatible(&name, target).map_err(wheel_error)?;
        wheels.push(fetch::ensure_wheel(cache, image.name().as_str(), pin)?);
    }
    Ok(wheels)
}

/// The compile stages' wheels, each checked against the parent's Python.
fn compiled_wheels(
    builder: &Engine,
    image: &PlannedImage,
    target: &PythonTarget,
    compiled: &[std::path::PathBuf],
) -> Result<Vec<std::path::PathBuf>> {
    for path in compiled {
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        let name = python::parse_name(&file).and_then(|name| {
            python::check_compatible(&name, target)?;
            Ok(name)
        });
        if let Err(message) = name {
            return Err(builder.error(format!(
                "the wheel {file} compiled for `{}` does not fit its parent: {message}",
                image.name()
            )));
        }
    }
    Ok(compiled.to_vec())
}

/// The layer of `wheels`, installed as pip would for the parent's Python (`target`) and
/// placed in the parent's tree; the distributions in `replaced` (the parent's) whited out.
fn wheels_layer(
    store: &LayerStore,
    image: &PlannedImage,
    target: &PythonTarget,
    anchor: &mut Anchor,
    wheels: &[std::path::PathBuf],
    replaced: &[crate::make::compile::replace::Installed],
) -> Result<StoredLayer> {
    let mtime = image.loaded.spec.image.source_date_epoch;
    anchor.next_layer();
    let (digest, size) = store.add_blob(|out| {
        let (reader, writer) = std::io::pipe()?;
        std::thread::scope(|scope| {
            let installer = scope.spawn(|| {
                if replaced.is_empty() {
                    let mut tar = tar::Builder::new(writer);
                    for wheel in wheels {
                        wheel::install(wheel, target, mtime, &mut tar)?;
                    }
                    return tar.into_inner().map(drop);
                }
                // The new files first, in a temporary file: the whiteouts must leave out
                // what the new distributions write again.
                let mut tar = tar::Builder::new(tempfile::tempfile()?);
                for wheel in wheels {
                    wheel::install(wheel, target, mtime, &mut tar)?;
                }
                let installed = tar.into_inner()?;
                let mut tar = tar::Builder::new(writer);
                crate::make::compile::replace::write_replacing(
                    replaced, target, installed, mtime, &mut tar,
                )?;
                tar.into_inner().map(drop)
            });
            let mut tar = tar::Builder::new(out);
            let anchored = anchor.rewrite(reader, &mut tar).and_then(|()| tar.finish());
            drop(tar);
            let installed = installer
                .join()
                .expect("the wheel installer does not panic");
            installed.and(anchored)
        })
    })?;
    Ok(uncompressed_layer(digest, size))
}

/// A layer hallmark wrote: an uncompressed tar, so its digest is its diff ID.
fn uncompressed_layer(digest: Digest, size: u64) -> StoredLayer {
    StoredLayer {
        diff_id: digest.clone(),
        blob: Blob {
            digest,
            size,
            media_type: LAYER_TAR.into(),
        },
    }
}

/// The parent's Python paths: from the store, or asked once of a container from the parent.
async fn python_target(
    builder: &Engine,
    store: &LayerStore,
    parent_id: &str,
    parent: &str,
) -> Result<PythonTarget> {
    let cached = store
        .root
        .join("python")
        .join(format!("{}.json", hex_of(parent_id)));
    if let Some(target) = fs_err::read_to_string(&cached)
        .ok()
        .and_then(|t| python::parse_probe_answer(&t).ok())
    {
        return Ok(target);
    }
    let (code, output) = builder.run_once(parent, &python::probe_command()).await?;
    let target = match python::parse_probe_answer(&output) {
        Ok(target) if code == 0 => target,
        Ok(_) => {
            return Err(builder.error(format!(
                "cannot ask {parent} for its Python paths (exit {code}): {}",
                output.trim()
            )));
        }
        Err(why) => {
            return Err(builder.error(format!(
                "cannot ask {parent} for its Python paths (exit {code}): {why}"
            )));
        }
    };
    let dir = cached.parent().expect("a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    fs_err::write(
        &cached,
        serde_json::to_string_pretty(&target).expect("json"),
    )
    .map_err(|e| Error::io(&cached, e))?;
    Ok(target)
}

/// The parent's config with the spec's changes, as a Dockerfile would make them.
fn apply(
    config: &mut Value,
    spec: &ImageSpec,
    labels: &std::collections::BTreeMap<String, String>,
    created: &str,
    layers: &[StoredLayer],
    history: Vec<Value>,
) {
    let object = config
        .as_object_mut()
        .expect("an image config is an object");
    object.insert("created".into(), json!(created));
    // The parent's build container says nothing about this image.
    object.remove("container");
    object.remove("container_config");
    let runtime = object.entry("config").or_insert_with(|| json!({}));
    if !runtime.is_object() {
        *runtime = json!({});
    }
    let runtime = runtime.as_object_mut().expect("made an object");
    let mut env: Vec<String> = runtime
        .get("Env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    for (key, value) in &spec.env {
        let entry = format!("{key}={value}");
        match env
            .iter_mut()
            .find(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
        {
            Some(existing) => *existing = entry,
            None => env.push(entry),
        }
    }
    runtime.insert("Env".into(), json!(env));
    let container = &spec.container;
    if let Some(entrypoint) = &container.entrypoint {
        runtime.insert("Entrypoint".into(), json!(entrypoint));
        // As in a Dockerfile, a new ENTRYPOINT drops the inherited CMD.
        runtime.insert("Cmd".into(), json!(container.cmd));
    } else if let Some(cmd) = &container.cmd {
        runtime.insert("Cmd".into(), json!(cmd));
    }
    if let Some(workdir) = &container.workdir {
        runtime.insert(
            "WorkingDir".into(),
            json!(render::workdir(workdir.as_str())),
        );
    }
    if let Some(user) = &container.user {
        runtime.insert("User".into(), json!(user));
    }
    let mut all_labels: std::collections::BTreeMap<String, Value> = runtime
        .get("Labels")
        .and_then(Value::as_object)
        .map(|m| m.clone().into_iter().collect())
        .unwrap_or_default();
    for (key, value) in labels {
        all_labels.insert(key.clone(), json!(value));
    }
    runtime.insert("Labels".into(), json!(all_labels));
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    object.insert(
        "rootfs".into(),
        json!({"type": "layers", "diff_ids": diff_ids}),
    );
    let mut all_history: Vec<Value> = object
        .get("history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    all_history.extend(history);
    object.insert("history".into(), json!(all_history));
}
