//! `hallmark prune`: removes the builder's step images of superseded engine builds
//! (`build_cache.rs`), then from the layer store what neither this project's images on the
//! builder nor any other project sharing the cache uses, then the registry's garbage.

use super::{connect, runtime};
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::make::build_cache;
use crate::plan::Plan;
use crate::ship::registry;

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let names = settings.project.image_names()?;
    let plan = Plan::new(&settings.project, &names)?;
    // Alone with the store: no command using it may lose a blob it has not recorded yet, and
    // no build stands on a step image of the builder's cache.
    let cache = &settings.cache;
    let root = &settings.project.root;
    let store = match LayerStore::for_prune(cache, root, false)? {
        Some(store) => store,
        None => {
            settings
                .output
                .note("waiting for other hallmark commands to finish with the layer store");
            LayerStore::for_prune(cache, root, true)?.expect("waited for the lock")
        }
    };
    let (keep, removed) = runtime()?.block_on(async {
        let builder = connect(settings, &settings.config.builder).await?;
        let mut keep = Vec::new();
        for name in &names {
            if let Some(image) = builder.inspect(&plan.get(name).loaded.reference()).await? {
                keep.extend(image.id().map(str::to_string));
            }
        }
        let removed = build_cache::prune(&builder, &store, &keep).await;
        Ok::<_, Error>((keep, removed))
    })?;
    settings.output.note(format!(
        "removed {} step images of superseded engine builds, {} bytes, from the builder's build cache{}",
        removed.images,
        removed.bytes,
        match removed.kept {
            0 => String::new(),
            n => format!(" ({n} kept: another image stands on them or a container uses them)"),
        }
    ));
    let stages: Vec<String> = plan
        .images
        .values()
        .flat_map(|image| &image.compiles)
        .map(|stage| stage.checksum.to_string())
        .collect();
    let debs: Vec<String> = plan
        .images
        .values()
        .flat_map(|image| &image.pins.apt)
        .map(|pin| pin.sha256.to_string())
        .collect();
    let pruned = store.prune(&keep, &stages, &debs)?;
    drop(store);
    settings.output.note(format!(
        "removed {} blobs, {} bytes{}, the wheels of {} compile stages no spec has, {} bytes, and {} apt package files no pin names, {} bytes, from the layer store (kept what other projects use)",
        pruned.blobs,
        pruned.blob_bytes,
        match pruned.linked_bytes {
            0 => String::new(),
            n => format!(" ({n} of them also in the registry's storage: freed with it)"),
        },
        pruned.compiled,
        pruned.compiled_bytes,
        pruned.debs,
        pruned.deb_bytes
    ));
    // An image the layer store no longer holds (its config blob gone) loses its registry tag.
    let store = LayerStore::open(cache);
    let kept = |config: &str| store.blob_path(config).is_file();
    let collected = match registry::collect_garbage(cache, false, &kept)? {
        registry::Garbage::Busy => {
            settings
                .output
                .note("waiting for the distribute using the registry to finish");
            registry::collect_garbage(cache, true, &kept)?
        }
        done => done,
    };
    if let registry::Garbage::Collected(collected) = collected {
        settings.output.note(collected);
    }
    super::caches::trim(settings, &plan)?;
    Ok(ExitStatus::Success)
}
