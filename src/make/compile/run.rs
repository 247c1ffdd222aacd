//! Running a compile stage on the builder: one container from the toolchain, the patched
//! sources streamed in as a tar, cache volumes mounted, the commands run in order by a small
//! driver that marks each one in the output (so a failure names its command), the output
//! streamed into a log, and `$HALLMARK_WHEELS` streamed out. The container is removed
//! whatever happens; on Ctrl-C the engine's live list removes it.

use super::log::{Followed, follow_output};
use super::{
    CACHE_IMAGE_LABEL, CACHE_LABEL, CAP_LABEL, PlannedStage, STAGE_IMAGE_LABEL, STAGE_LABEL,
    WHEELS_DIR, parse_size, volume_name,
};
use crate::engine::{self, Engine};
use crate::error::{BuildFailure, Error, Result};
use crate::images::store::LayerStore;
use crate::inputs::python;
use crate::make::build::BuildSettings;
use crate::plan::PlannedImage;
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs the commands given as arguments in order, each with `/bin/sh -c` as a Dockerfile's
/// RUN does; stops at the first that fails, with its exit code.
const DRIVER: &str = r###"mkdir -p "$HALLMARK_WHEELS" || exit 1
n=0
for step in "$@"; do
  n=$((n + 1))
  echo "##hallmark-step $n"
  /bin/sh -c "$step" || exit $?
done"###;

/// The folder of the layer store that keeps a stage's wheels.
fn kept_dir(store: &LayerStore, stage: &PlannedStage) -> PathBuf {
    store.root.join("compiled").join(stage.checksum.as_str())
}

/// The wheels of every stage of `image`, kept in the store (sorted by file name): what
/// assembly installs. An error if a stage has not been compiled.
pub fn stored_wheels(store: &LayerStore, image: &PlannedImage) -> Result<Vec<PathBuf>> {
    let mut wheels = Vec::new();
    for stage in &image.compiles {
        let dir = kept_dir(store, stage);
        wheels.extend(wheels_in(&dir).map_err(|e| {
            Error::io(
                &dir,
                std::io::Error::other(format!(
                    "the wheels of compile stage `{}` are not kept: {e}",
                    stage.name
                )),
            )
        })?);
    }
    Ok(wheels)
}

fn wheels_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut wheels: Vec<PathBuf> = fs_err::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    wheels.sort();
    Ok(wheels)
}

/// Compiles every stage of `image` whose wheels are not kept yet, in a container from its
/// toolchain (`parent`: the builder's reference for the image's parent). Returns, per stage,
/// whether a container ran.
pub async fn compile_all(
    engine: &Engine,
    store: &LayerStore,
    image: &PlannedImage,
    parent: &str,
    settings: &BuildSettings<'_>,
) -> Result<Vec<(String, bool)>> {
    let mut ran = Vec::new();
    for stage in &image.compiles {
        let kept = kept_dir(store, stage);
        let short = &stage.checksum.as_str()[..12];
        // Marked before use, under the store's shared lock: another project's prune keeps it.
        store.mark_compiled(stage.checksum.as_str());
        // `build --force` compiles again (it kept the old wheels for good: nothing short of
        // emptying the store recompiled a stage, an outside test found).
        if kept.is_dir() && !settings.force {
            if settings.echo {
                crate::output::stderr(&format!(
                    "compile stage `{}`: wheels kept for stage checksum {short}, no container",
                    stage.name
                ));
            }
            ran.push((stage.name.to_string(), false));
            continue;
        }
        let started = Instant::now();
        compile_into(engine, image, stage, parent, &kept, settings).await?;
        if settings.echo {
            crate::output::stderr(&format!(
                "compile stage `{}`: compiled in {:.1} s, wheels kept for stage checksum {short}",
                stage.name,
                started.elapsed().as_secs_f64()
            ));
        }
        ran.push((stage.name.to_string(), true));
    }
    Ok(ran)
}

/// Compiles `stage` with its cache volumes and keeps its wheels (and its checksum document) in
/// `kept`, which appears whole or not at all.
async fn compile_into(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    parent: &str,
    kept: &Path,
    settings: &BuildSettings<'_>,
) -> Result<()> {
    let toolchain = super::toolchain::on_builder(engine, image, stage, parent, settings).await?;
    let caches = cache_volumes(engine, stage, &toolchain).await?;
    let parent_dir = kept.parent().expect("a folder");
    fs_err::create_dir_all(parent_dir).map_err(|e| Error::io(parent_dir, e))?;
    let scratch = tempfile::Builder::new()
        .prefix(".compiling-")
        .tempdir_in(parent_dir)
        .map_err(|e| Error::io(parent_dir, e))?;
    let log = settings.state_dir.join("logs").join(format!(
        "{}-compile-{}-{}.log",
        image.name(),
        stage.name,
        &stage.checksum.as_str()[..12]
    ));
    let out = scratch.path();
    run_stage(
        engine, image, stage, &toolchain, &caches, out, &log, settings,
    )
    .await?;
    let document = out.join("stage.txt");
    fs_err::write(&document, &stage.document).map_err(|e| Error::io(&document, e))?;
    let scratch = scratch.keep();
    // A forced compile replaces the kept wheels: the old ones are moved aside first (a
    // rename cannot replace a folder that has files), then removed.
    if settings.force && kept.is_dir() {
        let aside = parent_dir.join(format!(".replaced-{}", std::process::id()));
        if fs_err::rename(kept, &aside).is_ok() {
            let _ = fs_err::remove_dir_all(&aside);
        }
    }
    if let Err(e) = fs_err::rename(&scratch, kept) {
        // Another build kept the same stage meanwhile: the same inputs, so either will do.
        let _ = fs_err::remove_dir_all(&scratch);
        if !kept.is_dir() {
            return Err(Error::io(kept, e));
        }
    }
    Ok(())
}

/// The stage's cache volumes (volume, path in the container), created where missing with the
/// labels `prune` and `caches` read.
async fn cache_volumes(
    engine: &Engine,
    stage: &PlannedStage,
    toolchain: &str,
) -> Result<Vec<(String, String)>> {
    let mut volumes = Vec::new();
    for (name, cache) in &stage.spec.caches {
        let mut labels = BTreeMap::from([
            (CACHE_LABEL.to_string(), name.clone()),
            (CACHE_IMAGE_LABEL.to_string(), toolchain.to_string()),
        ]);
        if let Some(cap) = cache.cap.as_deref().and_then(parse_size) {
            labels.insert(CAP_LABEL.to_string(), cap.to_string());
        }
        engine.ensure_volume(&volume_name(name), &labels).await?;
        volumes.push((volume_name(name), cache.path.to_string()));
    }
    Ok(volumes)
}

/// Runs `stage` once in a new container from `toolchain` with `caches` (volume, path)
/// mounted; its wheels land in `out`, its output in `log`.
#[allow(clippy::too_many_arguments)]
async fn run_stage(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    toolchain: &str,
    caches: &[(String, String)],
    out: &Path,
    log: &Path,
    settings: &BuildSettings<'_>,
) -> Result<()> {
    let spec = &image.loaded.spec;
    let mtime = spec.image.source_date_epoch;
    let sources = stage
        .sources
        .iter()
        .map(|&i| {
            let fetched = crate::plan::fetch::fetch_source(
                settings.cache,
                image,
                &image.pins.sources[i],
                &image.patches[i],
            )?;
            let dest = spec.sources[i].dest.get_ref().as_str();
            Ok((dest.trim_matches('/').to_string(), fetched))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut env: Vec<String> = stage
        .spec
        .args
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("HALLMARK_WHEELS={WHEELS_DIR}"));
    env.push(format!("SOURCE_DATE_EPOCH={mtime}"));
    let mut command = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        DRIVER.into(),
        "hallmark-compile".into(),
    ];
    command.extend(stage.spec.run.iter().cloned());
    let mounts: Vec<serde_json::Value> = caches
        .iter()
        .map(|(volume, path)| serde_json::json!({"Type": "volume", "Source": volume, "Target": path}))
        .collect();
    let network = if stage.spec.network {
        "default"
    } else {
        "none"
    };
    let mut body = serde_json::json!({
        "Image": toolchain,
        "Env": env,
        "WorkingDir": stage.spec.workdir.as_ref().map_or("/", |w| w.as_str()),
        "Labels": {
            STAGE_LABEL: stage.checksum.as_str(),
            STAGE_IMAGE_LABEL: image.loaded.reference(),
        },
        "NetworkDisabled": !stage.spec.network,
        "HostConfig": {"NetworkMode": network, "Mounts": mounts},
    });
    crate::engine::containers::run_exactly(&mut body, &command);
    let id = engine.create_container(body).await?;
    let outcome = run_created(
        engine, image, stage, &id, sources, mtime, out, log, settings,
    )
    .await;
    engine.remove_created(&id).await;
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn run_created(
    engine: &Engine,
    image: &PlannedImage,
    stage: &PlannedStage,
    id: &str,
    sources: Vec<(String, crate::plan::fetch::FetchedSource)>,
    mtime: u64,
    out: &Path,
    log_path: &Path,
    settings: &BuildSettings<'_>,
) -> Result<()> {
    let tar = engine::body_from_writer(None, move |writer| {
        crate::make::context::write_sources(&sources, mtime, writer).map(drop)
    });
    engine.put_archive(id, "/", tar).await?;
    engine.start_container(id).await?;
    let Followed { step, tail } = follow_output(engine, id, log_path, settings.echo).await?;
    let code = engine.wait_container(id).await?;
    let fail = |message: String, tail: Vec<String>, step: usize| {
        Error::from(BuildFailure {
            image: image.name().to_string(),
            node: engine.node.clone(),
            step: Some(match stage.spec.run.get(step.wrapping_sub(1)) {
                Some(command) => format!(
                    "compile stage `{}`, command {step} of {}: `{}`",
                    stage.name,
                    stage.spec.run.len(),
                    command.trim().lines().next().unwrap_or_default()
                ),
                None => format!("compile stage `{}`", stage.name),
            }),
            message,
            tail: tail.iter().map(|l| crate::error::plain_text(l)).collect(),
            log: log_path.to_path_buf(),
        })
    };
    if code != 0 {
        return Err(fail(format!("exit code {code}"), tail, step));
    }
    fetch_wheels(engine, id, out).await?;
    let made = wheels_in(out).map_err(|e| Error::io(out, e))?;
    let names: Vec<String> = made
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for wanted in &stage.spec.wheels {
        let stem = crate::inputs::pins::wheel_stem(wanted.get_ref().as_str());
        let found = names.iter().any(|file| {
            python::parse_name(file)
                .is_ok_and(|w| crate::inputs::pins::wheel_stem(&w.distribution) == stem)
        });
        if !found {
            return Err(fail(
                format!(
                    "left no wheel of `{}` in {WHEELS_DIR} (it left: {})",
                    wanted.get_ref(),
                    if names.is_empty() {
                        "nothing".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
                Vec::new(),
                0,
            ));
        }
    }
    Ok(())
}

/// Streams the container's wheels folder out and keeps its `.whl` files in `out`.
async fn fetch_wheels(engine: &Engine, id: &str, out: &Path) -> Result<()> {
    let tar_path = out.join(".wheels.tar");
    let mut file = fs_err::File::create(&tar_path).map_err(|e| Error::io(&tar_path, e))?;
    let mut stream = engine.get_archive(id, WHEELS_DIR);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            engine.error(format!("streaming {WHEELS_DIR} out of container {id}: {e}"))
        })?;
        file.write_all(&chunk)
            .map_err(|e| Error::io(&tar_path, e))?;
    }
    drop(file);
    let unpack = || -> std::io::Result<()> {
        let mut archive = tar::Archive::new(fs_err::File::open(&tar_path)?);
        for entry in archive.entries()? {
            let mut entry = entry?;
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let path = entry.path()?.into_owned();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // Only wheels directly in the folder; a name is never a path here.
            if !name.ends_with(".whl") || path.components().count() != 2 {
                continue;
            }
            let mut target = fs_err::File::create(out.join(name))?;
            std::io::copy(&mut entry, &mut target)?;
        }
        Ok(())
    };
    unpack().map_err(|e| Error::io(&tar_path, e))?;
    fs_err::remove_file(&tar_path).map_err(|e| Error::io(&tar_path, e))
}

/// `--check-repro` for compile stages: each stage compiled twice, each time with empty caches
/// (volumes of their own, removed afterwards), and the wheels compared file by file. The
/// differences name the stage, the wheel and the file inside it.
pub async fn check_repro(
    engine: &Engine,
    image: &PlannedImage,
    parent: &str,
    settings: &BuildSettings<'_>,
) -> Result<Vec<String>> {
    let mut differences = Vec::new();
    for stage in &image.compiles {
        let toolchain =
            super::toolchain::on_builder(engine, image, stage, parent, settings).await?;
        let scratch = tempfile::tempdir().map_err(|e| Error::io("a scratch folder", e))?;
        let mut outs = Vec::new();
        for round in 1..=2 {
            let caches: Vec<(String, String)> = stage
                .spec
                .caches
                .iter()
                .map(|(name, cache)| {
                    (
                        format!(
                            "hallmark-repro-{}-{round}-{}-{name}",
                            &stage.checksum.as_str()[..12],
                            std::process::id()
                        ),
                        cache.path.to_string(),
                    )
                })
                .collect();
            let out = scratch.path().join(format!("round{round}"));
            fs_err::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
            let log = settings.state_dir.join("logs").join(format!(
                "{}-compile-{}-{}-repro{round}.log",
                image.name(),
                stage.name,
                &stage.checksum.as_str()[..12]
            ));
            let ran = run_stage(
                engine, image, stage, &toolchain, &caches, &out, &log, settings,
            )
            .await;
            for (volume, _) in &caches {
                let _ = engine.remove_volume(volume).await;
            }
            ran?;
            outs.push(out);
        }
        for difference in compare_wheels(&outs[0], &outs[1])? {
            differences.push(format!("compile stage `{}`: {difference}", stage.name));
        }
    }
    Ok(differences)
}

/// The members of each wheel by sha256 (RECORD excluded: it lists the others' hashes).
fn wheel_members(path: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let mut archive = zip::ZipArchive::new(fs_err::File::open(path)?)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut members = BTreeMap::new();
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let name = entry
            .name()
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .into_owned();
        if name.ends_with(".dist-info/RECORD") || entry.is_dir() {
            continue;
        }
        let (sha256, _) = crate::plan::checksum::sha256_reader(&mut entry)?;
        members.insert(name, sha256);
    }
    Ok(members)
}

/// What differs between two compiles' wheels: missing wheels, and files inside a wheel.
fn compare_wheels(first: &Path, second: &Path) -> Result<Vec<String>> {
    let list = |dir: &Path| -> Result<BTreeMap<String, PathBuf>> {
        Ok(wheels_in(dir)
            .map_err(|e| Error::io(dir, e))?
            .into_iter()
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
            .collect())
    };
    let (a, b) = (list(first)?, list(second)?);
    let mut differences = Vec::new();
    for name in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (Some(x), Some(y)) = (a.get(name), b.get(name)) else {
            differences.push(format!("wheel {name} was made by one compile only"));
            continue;
        };
        let x = wheel_members(x).map_err(|e| Error::io(x, e))?;
        let y = wheel_members(y).map_err(|e| Error::io(y, e))?;
        for member in x
            .keys()
            .chain(y.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            if x.get(member) != y.get(member) {
                differences.push(format!("{name}: {member} differs"));
            }
        }
    }
    Ok(differences)
}
