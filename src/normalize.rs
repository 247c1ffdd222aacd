//! Normalisation: after the engine's builder made an image, hallmark rewrites the layers that
//! build added (never the parent's) so that every mtime is clamped to the spec's source date,
//! user and group names are dropped and entries keep their order, and it fixes the config's
//! volatile fields (`created` and history times clamped, the build container's id and
//! hostname removed). The result replaces the raw image under the tag with the same checksum
//! label. Layering is kept, so shipping still sends only the layers a node lacks.
//!
//! Cost: one export of the built image into the layer store (which shipping needs anyway)
//! and one pass over the layers the build added.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::render::rfc3339;
use crate::ship;
use crate::store::{Blob, LAYER_TAR, LayerStore, StoredLayer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

/// Normalises the builder's image `raw_id`, whose first `parent_layers` layers are its
/// parent's; loads the result untagged and returns the builder's id for it.
pub async fn normalize(
    builder: &Engine,
    store: &Arc<LayerStore>,
    raw_id: &str,
    parent_layers: usize,
    source_date: u64,
) -> Result<String> {
    let (_, raw) = ship::stored_image(builder, store, raw_id).await?;
    let mut layers: Vec<StoredLayer> = raw.layers[..parent_layers.min(raw.layers.len())].to_vec();
    let mut rewritten = BTreeMap::new();
    for layer in &raw.layers[layers.len()..] {
        let mut source = store.open_layer(layer)?;
        let (digest, size) = store
            .add_blob(|out| rewrite_layer(&mut source, out, source_date))
            .map_err(|e| match e {
                Error::Io { path, source } => Error::Io {
                    path,
                    source: std::io::Error::other(format!(
                        "normalising layer {}: {source}",
                        layer.diff_id
                    )),
                },
                other => other,
            })?;
        rewritten.insert(layer.diff_id.clone(), digest.clone());
        layers.push(StoredLayer {
            diff_id: digest.clone(),
            blob: Blob {
                digest,
                size,
                media_type: LAYER_TAR.into(),
            },
        });
    }
    let mut config = store.read_config(&raw)?;
    normalize_config(&mut config, &layers, source_date);
    ship::load_made(builder, store, &config, layers, parent_layers).await
}

/// Removes what only says when and where the build ran (public for the fuzzer).
pub fn normalize_config(config: &mut Value, layers: &[StoredLayer], source_date: u64) {
    let Some(object) = config.as_object_mut() else {
        return;
    };
    let date = rfc3339(source_date);
    object.insert("created".into(), json!(date));
    for volatile in ["container", "container_config", "docker_version"] {
        object.remove(volatile);
    }
    if let Some(runtime) = object.get_mut("config").and_then(Value::as_object_mut) {
        runtime.remove("Hostname");
        runtime.remove("Image");
    }
    if let Some(history) = object.get_mut("history").and_then(Value::as_array_mut) {
        for entry in history.iter_mut().filter_map(Value::as_object_mut) {
            // RFC 3339 in UTC with a Z sorts as text: clamp, never move a date forward.
            let later = entry
                .get("created")
                .and_then(Value::as_str)
                .is_some_and(|c| c > date.as_str());
            if later {
                entry.insert("created".into(), json!(date));
            }
        }
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    object.insert(
        "rootfs".into(),
        json!({"type": "layers", "diff_ids": diff_ids}),
    );
}

/// Copies a layer tar entry by entry: same order, paths, modes, owners, links and extended
/// attributes; mtimes clamped to `source_date`; no user or group names; no other PAX records.
pub fn rewrite_layer(
    input: &mut dyn Read,
    out: &mut dyn Write,
    source_date: u64,
) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(input);
    let mut tar = tar::Builder::new(out);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let records: Vec<(String, Vec<u8>)> = match entry.pax_extensions()? {
            Some(extensions) => extensions
                .filter_map(|e| e.ok())
                .filter_map(|e| Some((e.key().ok()?.to_string(), e.value_bytes().to_vec())))
                .collect(),
            None => Vec::new(),
        };
        // Past 8^11 seconds (2242) an engine writes the time as a PAX record and 0 in the
        // header; whole seconds are kept.
        let pax_mtime = records
            .iter()
            .find(|(key, _)| key == "mtime")
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
            .and_then(|value| value.split('.').next()?.parse::<u64>().ok());
        let xattrs: Vec<&(String, Vec<u8>)> = records
            .iter()
            .filter(|(key, _)| key.starts_with("SCHILY.xattr."))
            .collect();
        let path = entry.path()?.into_owned();
        let link = entry.link_name()?.map(|l| l.into_owned());
        let old = entry.header();
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(old.entry_type());
        header.set_mode(old.mode()?);
        header.set_uid(old.uid()?);
        header.set_gid(old.gid()?);
        header.set_mtime(pax_mtime.unwrap_or(old.mtime()?).min(source_date));
        // The size as read (a PAX record past 8 GiB), not the header's field.
        header.set_size(if old.entry_type().is_file() {
            entry.size()
        } else {
            0
        });
        if let (Ok(Some(major)), Ok(Some(minor))) = (old.device_major(), old.device_minor()) {
            header.set_device_major(major)?;
            header.set_device_minor(minor)?;
        }
        if !xattrs.is_empty() {
            tar.append_pax_extensions(xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        // `./` first: a layer whose first name starts with `BZh` fails to load (context::append).
        let name = format!("./{}", path.display());
        match link {
            Some(target) if header.set_link_name(&target).is_err() => {
                tar.append_link(&mut header, &name, &target)?
            }
            Some(_) => crate::context::append(&mut tar, header, &name, std::io::empty())?,
            None => crate::context::append(&mut tar, header, &name, &mut entry)?,
        }
    }
    tar.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(mtime: u64) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_mtime(mtime);
        dir.set_username("builder").unwrap();
        dir.set_uid(0);
        dir.set_gid(0);
        tar.append_data(&mut dir, "etc/", std::io::empty()).unwrap();
        let mut file = tar::Header::new_gnu();
        file.set_mode(0o600);
        file.set_uid(1000);
        file.set_gid(0);
        file.set_size(5);
        file.set_mtime(mtime);
        tar.append_data(&mut file, "etc/stamp", &b"hello"[..])
            .unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_mtime(mtime);
        link.set_mode(0o777);
        link.set_uid(0);
        link.set_gid(0);
        tar.append_link(&mut link, "etc/link", "stamp").unwrap();
        tar.into_inner().unwrap()
    }

    #[test]
    fn two_builds_an_hour_apart_normalise_to_the_same_bytes() {
        let normalised = |mtime| {
            let mut out = Vec::new();
            rewrite_layer(&mut layer(mtime).as_slice(), &mut out, 1_000).unwrap();
            out
        };
        assert_ne!(layer(1_700_000_000), layer(1_700_003_600));
        assert_eq!(normalised(1_700_000_000), normalised(1_700_003_600));
        let bytes = normalised(1_700_000_000);
        let mut archive = tar::Archive::new(bytes.as_slice());
        let entries: Vec<(String, u32, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                ("./etc/".into(), 0o755, 0, 1_000),
                ("./etc/stamp".into(), 0o600, 1000, 1_000),
                ("./etc/link".into(), 0o777, 0, 1_000)
            ]
        );
    }

    /// Times past 2242 and sizes past 8 GiB come as PAX records, with 0 in the header.
    #[test]
    fn pax_times_and_sizes_are_kept() {
        let mut tar = tar::Builder::new(Vec::new());
        tar.append_pax_extensions([("mtime", &b"9223372036.5"[..]), ("size", b"5")])
            .unwrap();
        let mut file = tar::Header::new_ustar();
        file.set_mode(0o644);
        file.set_uid(0);
        file.set_gid(0);
        file.set_mtime(0);
        file.set_size(0);
        file.set_path("big").unwrap();
        file.set_cksum();
        tar.append(&file, &b"hello"[..]).unwrap();
        let layer = tar.into_inner().unwrap();
        let mut out = Vec::new();
        rewrite_layer(&mut layer.as_slice(), &mut out, 9_223_372_036).unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.header().mtime().unwrap(), 9_223_372_036);
        let mut content = String::new();
        entry.read_to_string(&mut content).unwrap();
        assert_eq!(content, "hello");
        assert!(entries.next().is_none());
    }

    #[test]
    fn an_older_mtime_is_kept() {
        let mut out = Vec::new();
        rewrite_layer(&mut layer(500).as_slice(), &mut out, 1_000).unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        assert!(
            archive
                .entries()
                .unwrap()
                .all(|e| e.unwrap().header().mtime().unwrap() == 500)
        );
    }
}
