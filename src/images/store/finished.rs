//! The record of what hallmark finished: which image, on which builder, for which checksum.
//!
//! Trust comes from here and from nothing an image carries. A checksum label, a `LABEL` step
//! in the history, a tag: any Dockerfile, `docker commit`, `docker import --change` or loaded
//! tar can write them (an outside test shipped a plain `docker build` of `render --out`'s
//! context as `verified`, because its newest step set the label). So when `build` finishes an
//! image (smoke-tested, stamped, checked), it writes `finished/<checksum>/<id hex>.json`
//! beside the layer store, under the builder's id for the image and under its config digest;
//! adoption (`build`'s up-to-date), `distribute`, `verify` and `status` ask for that file.
//!
//! Image ids are content addresses (the config digest on a classic store, the manifest digest
//! on a containerd one; either fixes the config and so every layer's diff ID), so a record
//! holds wherever the same id is seen: the builder reached at another address, or through
//! ssh, is the same builder. The builder's address is kept in the record for a person.
//!
//! One file per image, written atomically, never read-modified-written: two builds (of two
//! projects, or a forced rebuild) cannot lose each other's records.
//!
//! What it costs: an image finished by another machine's hallmark, or before this cache
//! existed, is not trusted here until `hallmark build` makes it (a reproducible build gives the
//! same id and only writes the record).

use super::LayerStore;
use crate::error::Result;
use crate::oci::digest::hex_of;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What the record holds, for a person reading it; its existence is what counts.
#[derive(Serialize, Deserialize)]
struct Finished {
    builder: String,
    checksum: String,
    image_id: String,
    /// The config digest, where the layer store holds the image (on a containerd builder the
    /// id is the manifest digest).
    config: Option<String>,
    hallmark: String,
}

/// The record's path; `None` for an id or checksum that is not hex (an engine's answer names
/// no file of ours).
fn path(store: &LayerStore, checksum: &str, image_id: &str) -> Option<PathBuf> {
    let hex = |s: &'_ str| -> Option<String> {
        let s = hex_of(s);
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_string())
    };
    Some(
        store
            .root
            .join("finished")
            .join(hex(checksum)?)
            .join(format!("{}.json", hex(image_id)?)),
    )
}

/// Notes that hallmark finished `image_id` for `checksum` on `builder` (its address).
pub fn record(store: &LayerStore, builder: &str, checksum: &str, image_id: &str) -> Result<()> {
    let finished = Finished {
        builder: builder.to_string(),
        checksum: checksum.to_string(),
        image_id: image_id.to_string(),
        config: store.record(image_id).map(|i| i.config.digest.to_string()),
        hallmark: env!("CARGO_PKG_VERSION").to_string(),
    };
    let text = serde_json::to_vec_pretty(&finished).expect("serializes");
    let names = std::iter::once(image_id).chain(finished.config.as_deref());
    for name in names {
        match path(store, checksum, name) {
            Some(path) => super::write_atomically(&path, &text)?,
            None => {
                return Err(crate::error::Error::io(
                    store.root.join("finished"),
                    std::io::Error::other(format!(
                        "the builder {builder} names its new image `{name}`, which is not a digest"
                    )),
                ));
            }
        }
    }
    Ok(())
}

/// Whether hallmark finished the image an engine calls `image_id` for `checksum`.
pub fn is_finished(store: &LayerStore, checksum: &str, image_id: &str) -> bool {
    path(store, checksum, image_id).is_some_and(|path| path.is_file())
}

/// The builder's ids of the images hallmark finished for `checksum` (a record written under
/// the config digest too names the same image): newest record first.
pub fn image_ids(store: &LayerStore, checksum: &str) -> Vec<String> {
    let hex = hex_of(checksum);
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Vec::new();
    }
    let dir = store.root.join("finished").join(hex);
    let Ok(entries) = fs_err::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(std::time::SystemTime, String)> = entries
        .flatten()
        .filter_map(|entry| {
            let text = fs_err::read(entry.path()).ok()?;
            let record: Finished = serde_json::from_slice(&text).ok()?;
            let written = entry.metadata().and_then(|m| m.modified()).ok()?;
            Some((written, record.image_id))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut ids: Vec<String> = Vec::new();
    for (_, id) in found {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_image_of_a_checksum_is_finished() {
        let cache = tempfile::tempdir().unwrap();
        let store = LayerStore::open_for(cache.path(), None);
        let id = format!("sha256:{}", "a".repeat(64));
        let other = format!("sha256:{}", "b".repeat(64));
        let checksum = "c".repeat(64);
        assert!(!is_finished(&store, &checksum, &id));
        record(&store, "unix:///b.sock", &checksum, &id).unwrap();
        assert!(is_finished(&store, &checksum, &id));
        assert!(!is_finished(&store, &checksum, &other));
        assert!(!is_finished(&store, &"d".repeat(64), &id));
        assert!(!is_finished(&store, &checksum, ""));
        assert!(!is_finished(&store, &checksum, "../../x"));
        assert!(record(&store, "unix:///b.sock", &checksum, "../x").is_err());
    }
}
