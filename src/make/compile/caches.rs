//! The compile caches on the builder: named volumes labelled `hallmark.cache`, listed with
//! their sizes (`hallmark caches`) and trimmed to their caps (`hallmark prune`): the files
//! used longest ago go first, in a container of the image the cache was made for, with no
//! network.

use super::{CACHE_IMAGE_LABEL, CACHE_LABEL, CAP_LABEL};
use crate::engine::Engine;
use crate::error::Result;
use serde::Serialize;
use std::collections::BTreeMap;

/// One cache volume, as `hallmark caches` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CacheRow {
    pub cache: String,
    pub volume: String,
    /// Bytes; `None` when the engine did not measure it.
    pub size: Option<u64>,
    /// Bytes; the spec's cap, else the one written when the volume was made.
    pub cap: Option<u64>,
}

/// Where the trimming container mounts the cache.
const MOUNT: &str = "/hallmark-cache";

/// Removes the files used longest ago (access time, then modification time as find gives
/// it) until the cache holds at most `$1` KiB. GNU find, as Debian's and Ubuntu's images have.
const TRIM: &str = r###"cap=$1
cd /hallmark-cache || exit 1
used=$(du -sk . | cut -f1)
[ "$used" -le "$cap" ] && exit 0
find . -type f -printf '%A@ %k %p\n' | sort -n | while read -r when kib path; do
  [ "$used" -le "$cap" ] && break
  rm -f -- "$path"
  used=$((used - kib))
done
exit 0"###;

/// Every cache volume on `engine`, with `caps` (by cache name, from the project's specs)
/// taking the place of the caps written on the volumes.
pub async fn list(engine: &Engine, caps: &BTreeMap<String, u64>) -> Result<Vec<CacheRow>> {
    let mut rows: Vec<CacheRow> = engine
        .volumes_labelled(CACHE_LABEL)
        .await?
        .into_iter()
        .map(|volume| {
            let labels = volume.labels.unwrap_or_default();
            let cache = labels.get(CACHE_LABEL).cloned().unwrap_or_default();
            let cap = caps
                .get(&cache)
                .copied()
                .or_else(|| labels.get(CAP_LABEL).and_then(|c| c.parse().ok()));
            CacheRow {
                cache,
                volume: volume.name,
                size: volume.usage.and_then(|u| u64::try_from(u.size).ok()),
                cap,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.volume.cmp(&b.volume));
    Ok(rows)
}

/// Trims every cache over its cap; returns the caches after trimming.
pub async fn trim(engine: &Engine, caps: &BTreeMap<String, u64>) -> Result<Vec<CacheRow>> {
    let volumes = engine.volumes_labelled(CACHE_LABEL).await?;
    for row in list(engine, caps).await? {
        let Some(cap) = row.cap else { continue };
        if row.size.is_some_and(|size| size <= cap) {
            continue;
        }
        let image = volumes
            .iter()
            .find(|v| v.name == row.volume)
            .and_then(|v| v.labels.as_ref())
            .and_then(|l| l.get(CACHE_IMAGE_LABEL))
            .cloned();
        let Some(image) = image else { continue };
        let mut body = serde_json::json!({
            "Image": image,
            "NetworkDisabled": true,
            "HostConfig": {
                "NetworkMode": "none",
                "Mounts": [{"Type": "volume", "Source": row.volume, "Target": MOUNT}],
            },
        });
        let trim = ["/bin/sh", "-c", TRIM, "hallmark-trim"].map(String::from);
        let argv = [&trim[..], &[(cap / 1024).to_string()]].concat();
        crate::engine::containers::run_exactly(&mut body, &argv);
        let id = engine.create_container(body).await?;
        let outcome = async {
            engine.start_container(&id).await?;
            engine.wait_container(&id).await
        }
        .await;
        engine.remove_created(&id).await;
        let code = outcome?;
        if code != 0 {
            return Err(engine.error(format!(
                "trimming cache `{}` (volume {}) in a container of {image} failed with exit code {code}",
                row.cache, row.volume
            )));
        }
    }
    list(engine, caps).await
}

/// The caps the specs give, by cache name (the smallest where two stages disagree).
pub fn caps_of<'a>(
    specs: impl IntoIterator<Item = &'a crate::inputs::spec::ImageSpec>,
) -> BTreeMap<String, u64> {
    let mut caps: BTreeMap<String, u64> = BTreeMap::new();
    for spec in specs {
        for stage in &spec.compiles {
            for (name, cache) in &stage.caches {
                if let Some(cap) = cache.cap.as_deref().and_then(super::parse_size) {
                    let entry = caps.entry(name.clone()).or_insert(cap);
                    *entry = (*entry).min(cap);
                }
            }
        }
    }
    caps
}
