//! `hallmark build --check-repro`: build an image twice from scratch and compare, file by
//! file, what differs (like diffoci): content, mode, owner, mtime, presence, or the config.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::images::store::{LayerStore, StoredImage, StoredLayer};
use crate::images::transfer;
use crate::inputs::values::Name;
use crate::make::build::{self, BuildRecord, BuildSettings};
use crate::plan::Plan;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

/// What one file of a layer is.
#[derive(Debug, PartialEq)]
struct Facts {
    kind: String,
    mode: u32,
    owner: (u64, u64),
    mtime: u64,
    content: String,
}

/// Builds `plan` (parents as usual), then `name` twice more without cache; returns the two
/// records and every difference found (empty when the builds are bit-for-bit the same).
pub async fn check(
    engine: &Engine,
    plan: &Plan,
    name: &Name,
    settings: &BuildSettings<'_>,
) -> Result<(Vec<BuildRecord>, Vec<String>)> {
    let (records, outcome) = build::build_all(engine, plan, settings).await;
    outcome?;
    let image = plan.get(name);
    let parent_tag = image
        .parent
        .as_ref()
        .map(|p| plan.get(p).loaded.reference());
    let parent_id = image
        .parent
        .as_ref()
        .and_then(|p| records.iter().find(|r| r.image == p.as_str()))
        .map(|r| r.image_id.clone());
    let forced = BuildSettings {
        force: true,
        ..*settings
    };
    let first = build::build_one(
        engine,
        image,
        parent_tag.as_deref(),
        parent_id.clone(),
        &forced,
    )
    .await?;
    // The second build moves the tag and removes the first image from the builder: it is
    // read into the layer store before.
    let store = Arc::new(LayerStore::open(settings.cache));
    let (_, a) = transfer::stored_image(engine, &store, &first.image_id).await?;
    let second = build::build_one(
        engine,
        image,
        parent_tag.as_deref(),
        parent_id.clone(),
        &forced,
    )
    .await?;
    // Compile stages' wheels are kept by checksum, so the builds above reused them: each
    // stage is compiled twice more, with empty caches, and its wheels compared.
    let mut compiled = Vec::new();
    if !image.compiles.is_empty() {
        let parent = match parent_id {
            Some(id) => Some(id),
            None => crate::make::base::on_builder(engine, image, settings.cache).await?,
        };
        let parent = parent.unwrap_or_else(|| first.image_id.clone());
        compiled = crate::make::compile::check_repro(engine, image, &parent, settings).await?;
    }
    let mut differences = if first.image_id == second.image_id {
        Vec::new()
    } else {
        let (_, b) = transfer::stored_image(engine, &store, &second.image_id).await?;
        compare(&store, &a, &b)?
    };
    differences.extend(compiled);
    Ok((vec![first, second], differences))
}

fn compare(store: &LayerStore, a: &StoredImage, b: &StoredImage) -> Result<Vec<String>> {
    let mut differences = Vec::new();
    if a.layers.len() != b.layers.len() {
        differences.push(format!(
            "the builds have {} and {} layers",
            a.layers.len(),
            b.layers.len()
        ));
    }
    for (i, (la, lb)) in a.layers.iter().zip(&b.layers).enumerate() {
        if la.diff_id == lb.diff_id {
            continue;
        }
        let (fa, fb) = (files(store, la)?, files(store, lb)?);
        for path in fa.keys().chain(fb.keys().filter(|k| !fa.contains_key(*k))) {
            let what = match (fa.get(path), fb.get(path)) {
                (Some(_), None) => vec!["presence (only in the first build)".to_string()],
                (None, Some(_)) => vec!["presence (only in the second build)".to_string()],
                (Some(x), Some(y)) => {
                    let mut what = Vec::new();
                    if x.kind != y.kind || x.content != y.content {
                        what.push("content".to_string());
                    }
                    if x.mode != y.mode {
                        what.push(format!("mode {:o} / {:o}", x.mode, y.mode));
                    }
                    if x.owner != y.owner {
                        what.push(format!(
                            "owner {}:{} / {}:{}",
                            x.owner.0, x.owner.1, y.owner.0, y.owner.1
                        ));
                    }
                    if x.mtime != y.mtime {
                        what.push(format!("mtime {} / {}", x.mtime, y.mtime));
                    }
                    what
                }
                (None, None) => Vec::new(),
            };
            if !what.is_empty() {
                differences.push(format!(
                    "layer {}: /{}: {}",
                    i + 1,
                    path.trim_start_matches("./"),
                    what.join(", ")
                ));
            }
        }
    }
    if differences.is_empty() && a.config.digest != b.config.digest {
        differences.push(config_difference(store, a, b)?);
    }
    Ok(differences)
}

fn files(store: &LayerStore, layer: &StoredLayer) -> Result<BTreeMap<String, Facts>> {
    let path = store.blob_path(&layer.blob.digest);
    let io = |e: std::io::Error| Error::io(&path, e);
    let mut archive = tar::Archive::new(store.open_layer(layer)?);
    let mut facts = BTreeMap::new();
    for entry in archive.entries().map_err(io)? {
        let mut entry = entry.map_err(io)?;
        let header = entry.header();
        let kind = format!("{:?}", header.entry_type());
        let (mode, owner, mtime) = (
            header.mode().unwrap_or(0),
            (header.uid().unwrap_or(0), header.gid().unwrap_or(0)),
            header.mtime().unwrap_or(0),
        );
        let name = entry
            .path()
            .map_err(io)?
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        let content = match entry.link_name().map_err(io)? {
            Some(target) => format!("-> {}", target.display()),
            None => {
                let mut hasher = Sha256::new();
                let mut buffer = [0u8; 65536];
                loop {
                    let n = entry.read(&mut buffer).map_err(io)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buffer[..n]);
                }
                hex::encode(hasher.finalize())
            }
        };
        facts.insert(
            name,
            Facts {
                kind,
                mode,
                owner,
                mtime,
                content,
            },
        );
    }
    Ok(facts)
}

fn config_difference(store: &LayerStore, a: &StoredImage, b: &StoredImage) -> Result<String> {
    let read = |image: &StoredImage| -> Result<serde_json::Value> {
        let path = store.blob_path(&image.config.digest);
        let bytes = fs_err::read(&path).map_err(|e| Error::io(&path, e))?;
        Ok(serde_json::from_slice(&bytes).unwrap_or_default())
    };
    let (ca, cb) = (read(a)?, read(b)?);
    let keys: Vec<String> = ca
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| cb.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    Ok(format!("the config differs in: {}", keys.join(", ")))
}

/// `--check-repro` of each named image: its records (two builds each) and, in `differences`,
/// what differed, prefixed with the image's name.
pub async fn repro_all(
    engine: &crate::engine::Engine,
    plan: &Plan,
    names: &[crate::inputs::values::Name],
    build_settings: &BuildSettings<'_>,
    differences: &mut Vec<String>,
) -> (Vec<build::BuildRecord>, Result<()>) {
    let mut records = Vec::new();
    for name in names {
        let (mut pair, found) =
            match crate::make::repro::check(engine, plan, name, build_settings).await {
                Ok(done) => done,
                Err(error) => return (records, Err(error)),
            };
        for record in &mut pair {
            record.reproducible = Some(found.is_empty());
            record.differences = found.clone();
        }
        differences.extend(found.into_iter().map(|d| format!("{name}: {d}")));
        records.extend(pair);
    }
    (records, Ok(()))
}
