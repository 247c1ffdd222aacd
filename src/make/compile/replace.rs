//! Installing a wheel over a distribution the parent already has (the vllm-openai base ships
//! vLLM), as pip would: pip uninstalls the old distribution first, removing every file its
//! RECORD lists. In a layer, removing is a whiteout (`.wh.<name>`); the old dist-info folder
//! and old top-level folders the new wheel does not write go whole. So one dist-info remains
//! and `pip show`/`pip check` see the new version only.
//!
//! Only distributions in the target's site-packages (`purelib`) are looked for, where pip
//! installs; the parent's layers are read for their `*.dist-info/RECORD` files (whiteouts in
//! the parent honoured).

use crate::error::{Error, Result};
use crate::images::store::{LayerStore, StoredImage};
use crate::inputs::python;
use crate::inputs::python::PythonTarget;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

/// A distribution installed in the parent: its dist-info folder (absolute) and RECORD text.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Installed {
    pub dist_info: String,
    pub record: String,
}

fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

/// The distributions among `wheels` (by name) that the parent `image` has installed in
/// `target`'s site-packages.
pub fn installed(
    store: &LayerStore,
    image: &StoredImage,
    target: &PythonTarget,
    wheels: &[PathBuf],
) -> Result<Vec<Installed>> {
    let wanted: BTreeSet<String> = wheels
        .iter()
        .filter_map(|p| p.file_name()?.to_str())
        .filter_map(|f| python::parse_name(f).ok())
        .map(|n| crate::inputs::pins::wheel_stem(&n.distribution))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let site = clean(&target.purelib);
    // The parent's layers are read once per parent and set of names (a 20 GB base takes a
    // while): the answer is kept in the store by the parent's config digest.
    let key = crate::plan::checksum::sha256_hex(
        format!(
            "{site}\n{}",
            wanted.iter().cloned().collect::<Vec<_>>().join("\n")
        )
        .as_bytes(),
    );
    let kept = store.root.join("python").join(format!(
        "{}-installed-{}.json",
        image.config.digest.trim_start_matches("sha256:"),
        &key[..16]
    ));
    if let Some(found) = fs_err::read(&kept)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
    {
        return Ok(found);
    }
    // Path (relative) of each RECORD -> its text, as the layers leave them.
    let mut records: BTreeMap<String, String> = BTreeMap::new();
    for layer in &image.layers {
        let path = store.blob_path(&layer.blob.digest);
        let reader = store.open_layer(layer)?;
        scan_layer(reader, &site, &wanted, &mut records).map_err(|e| Error::io(&path, e))?;
    }
    let found: Vec<Installed> = records
        .into_iter()
        .map(|(path, record)| Installed {
            dist_info: format!("/{}", path.trim_end_matches("/RECORD")),
            record,
        })
        .collect();
    let dir = kept.parent().expect("a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let text = serde_json::to_vec(&found).expect("json");
    fs_err::write(&kept, text).map_err(|e| Error::io(&kept, e))?;
    Ok(found)
}

/// Applies one layer to `records`: its whiteouts remove what they hide, and the RECORD files of
/// `wanted` distributions directly in `site`'s dist-info folders are read.
fn scan_layer(
    reader: impl Read,
    site: &str,
    wanted: &BTreeSet<String>,
    records: &mut BTreeMap<String, String>,
) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = clean(&String::from_utf8_lossy(&entry.path_bytes()));
        let (dir, base) = name.rsplit_once('/').unwrap_or(("", name.as_str()));
        if let Some(gone) = base.strip_prefix(".wh.") {
            let hidden = |path: &str| match gone {
                // An opaque folder hides everything below it.
                ".wh..opq" => path.starts_with(&format!("{dir}/")),
                _ => {
                    let gone = if dir.is_empty() {
                        gone.to_string()
                    } else {
                        format!("{dir}/{gone}")
                    };
                    path == gone || path.starts_with(&format!("{gone}/"))
                }
            };
            records.retain(|path, _| !hidden(path));
            continue;
        }
        let in_site = dir
            .strip_prefix(site)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|folder| folder.ends_with(".dist-info") && !folder.contains('/'));
        if base != "RECORD" || !in_site {
            continue;
        }
        let folder = dir.rsplit('/').next().unwrap_or_default();
        let distribution = folder.split('-').next().unwrap_or_default();
        if !wanted.contains(&crate::inputs::pins::wheel_stem(distribution)) {
            continue;
        }
        let mut text = String::new();
        entry.read_to_string(&mut text)?;
        records.insert(name, text);
    }
    Ok(())
}

/// The first field of a RECORD row (CSV: a path with a comma is quoted).
fn record_path(row: &str) -> Option<String> {
    let row = row.trim_end_matches('\r');
    if row.is_empty() {
        return None;
    }
    if let Some(rest) = row.strip_prefix('"') {
        let mut path = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek()) {
                ('"', Some('"')) => {
                    path.push('"');
                    chars.next();
                }
                ('"', _) => return Some(path),
                _ => path.push(c),
            }
        }
        return None;
    }
    row.split(',').next().map(str::to_string)
}

/// Writes into `out` the whiteouts that uninstall `old` (paths the new install writes are
/// left: the new layer replaces them), then the entries of `new_layer` (the new install).
pub fn write_replacing<W: Write>(
    old: &[Installed],
    target: &PythonTarget,
    mut new_layer: std::fs::File,
    mtime: u64,
    out: &mut tar::Builder<W>,
) -> std::io::Result<()> {
    new_layer.rewind()?;
    let mut written = BTreeSet::new();
    for entry in tar::Archive::new(&mut new_layer).entries()? {
        let entry = entry?;
        written.insert(clean(&String::from_utf8_lossy(&entry.path_bytes())));
    }
    let site = clean(&target.purelib);
    let mut gone: BTreeSet<String> = BTreeSet::new();
    for installed in old {
        let dist_info = clean(&installed.dist_info);
        if !written.contains(&dist_info) {
            gone.insert(dist_info.clone());
        }
        for row in installed.record.lines() {
            let Some(path) = record_path(row) else {
                continue;
            };
            let path = clean(&format!("{site}/{path}"));
            // The old top-level folder in site-packages, if the new install has none.
            let top = path
                .strip_prefix(&format!("{site}/"))
                .and_then(|rest| rest.split_once('/'))
                .map(|(folder, _)| format!("{site}/{folder}"));
            match top {
                Some(top) if !written.contains(&top) => {
                    gone.insert(top);
                }
                _ if !written.contains(&path) => {
                    gone.insert(path);
                }
                _ => {}
            }
        }
    }
    // A path below another that goes is gone with it.
    let outer: Vec<String> = gone.iter().cloned().collect();
    gone.retain(|path| !outer.iter().any(|o| path.starts_with(&format!("{o}/"))));
    for path in &gone {
        let (dir, base) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        let whiteout = if dir.is_empty() {
            format!(".wh.{base}")
        } else {
            format!("{dir}/.wh.{base}")
        };
        let mut header = crate::oci::tar::owned(tar::EntryType::Regular, 0o644, 0, mtime, 0, 0);
        out.append_data(&mut header, whiteout, std::io::empty())?;
    }
    new_layer.rewind()?;
    for entry in tar::Archive::new(&mut new_layer).entries()? {
        let mut entry = entry?;
        let mut header = entry.header().clone();
        let path = entry.path_bytes().into_owned();
        let path = String::from_utf8_lossy(&path).into_owned();
        match entry.link_name()? {
            Some(target) => out.append_link(&mut header, &path, target)?,
            None => out.append_data(&mut header, &path, &mut entry)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer holding one file.
    fn layer(path: &str, text: &str) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, text.as_bytes())
            .unwrap();
        builder.into_inner().unwrap()
    }

    #[test]
    fn a_whiteout_hides_its_own_name_and_what_lies_below_only() {
        let site = "usr/lib/python3/site-packages";
        let wanted = BTreeSet::from(["hmext".to_string()]);
        let record = format!("{site}/hmext-0.1.0.dist-info/RECORD");
        let mut records = BTreeMap::new();
        scan_layer(
            layer(record.as_str(), "hmext.so,,\n").as_slice(),
            site,
            &wanted,
            &mut records,
        )
        .unwrap();
        assert_eq!(records.len(), 1);
        // `hmext` (a folder of that name) goes: the dist-info, whose name only starts the
        // same, stays.
        let hmext = format!("{site}/.wh.hmext");
        scan_layer(
            layer(hmext.as_str(), "").as_slice(),
            site,
            &wanted,
            &mut records,
        )
        .unwrap();
        assert_eq!(records.len(), 1, "a whiteout hid a name it only prefixes");
        let dist_info = format!("{site}/.wh.hmext-0.1.0.dist-info");
        scan_layer(
            layer(dist_info.as_str(), "").as_slice(),
            site,
            &wanted,
            &mut records,
        )
        .unwrap();
        assert!(records.is_empty());
        scan_layer(
            layer(record.as_str(), "x\n").as_slice(),
            site,
            &wanted,
            &mut records,
        )
        .unwrap();
        let opaque = format!("{site}/.wh..wh..opq");
        scan_layer(
            layer(opaque.as_str(), "").as_slice(),
            site,
            &wanted,
            &mut records,
        )
        .unwrap();
        assert!(records.is_empty(), "an opaque folder hides what lies below");
    }

    #[test]
    fn record_rows_give_their_paths() {
        assert_eq!(record_path("a/b.py,sha256=x,3").as_deref(), Some("a/b.py"));
        assert_eq!(
            record_path("\"a,\"\"b\"\".py\",sha256=x,3").as_deref(),
            Some("a,\"b\".py")
        );
        assert_eq!(
            record_path("../../../bin/tool,,").as_deref(),
            Some("../../../bin/tool")
        );
        assert_eq!(record_path(""), None);
    }
}
