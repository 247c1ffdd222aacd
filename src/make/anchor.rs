//! Layers hallmark writes itself (assembly), anchored in the parent's file tree.
//!
//! An engine's ADD unpacks into the container's root: a folder on the way that is a symlink
//! in the parent is followed (`/bin/x` lands in `/usr/bin` on a merged-usr Debian), a folder
//! the parent has keeps its mode and owner, a missing one is made 0755, root's. A layer is
//! applied differently: into an empty folder, then stacked. A layer holding `bin/x` and no
//! `bin/` entry makes `/bin` a folder that hides the parent's symlink (the image loses
//! `/bin/sh`), and the classic image store makes the missing `tmp/` 0755, so `/tmp` loses
//! its sticky bit (the containerd store copies the parent's). So the layers hallmark writes
//! carry what the engine's ADD would leave: each entry at its resolved path, after an entry
//! for every folder above it, with the parent's mode and owner where the parent has that
//! folder. Then every engine applies them alike, and alike to the engine-built path.

use crate::error::{Error, Result};
use crate::images::store::{LayerStore, StoredImage};
use crate::oci::tar::{append, owned};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{Read, Write};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir { mode: u32, uid: u64, gid: u64 },
    Link(String),
    Other,
}

/// What the parent's layers leave at each path (relative, no leading `/`): folders with
/// their mode and owner, symlinks with their target, anything else.
#[derive(Debug, Default)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
}

/// A path as a layer names it: no leading `./` or `/`, no trailing `/`.
fn clean(path: &str) -> String {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

impl Tree {
    /// The tree of `image` from its layers in the store (headers only; an uncompressed layer
    /// is skipped through, not read).
    pub fn of(store: &LayerStore, image: &StoredImage) -> Result<Tree> {
        let mut tree = Tree::default();
        for layer in &image.layers {
            let path = store.blob_path(&layer.blob.digest);
            let applied = if layer.blob.media_type.contains('+') {
                let mut archive = tar::Archive::new(store.open_layer(layer)?);
                archive.entries().and_then(|entries| tree.apply(entries))
            } else {
                // Unbuffered: a header is one read, and each seek past data would drop a buffer.
                let file = fs_err::File::open(&path).map_err(|e| Error::io(&path, e))?;
                let mut archive = tar::Archive::new(file);
                archive
                    .entries_with_seek()
                    .and_then(|entries| tree.apply(entries))
            };
            applied.map_err(|e| Error::io(&path, e))?;
        }
        Ok(tree)
    }

    fn apply<R: Read>(&mut self, entries: tar::Entries<'_, R>) -> std::io::Result<()> {
        for entry in entries {
            let entry = entry?;
            let path = clean(&String::from_utf8_lossy(&entry.path_bytes()));
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
            if name == ".wh..wh..opq" {
                self.remove_below(dir);
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                let hidden = if dir.is_empty() {
                    hidden.to_string()
                } else {
                    format!("{dir}/{hidden}")
                };
                self.remove_below(&hidden);
                self.nodes.remove(&hidden);
                continue;
            }
            let header = entry.header();
            let node = match header.entry_type() {
                tar::EntryType::Directory => Node::Dir {
                    mode: header.mode()? & 0o7777,
                    uid: header.uid()?,
                    gid: header.gid()?,
                },
                tar::EntryType::Symlink => Node::Link(
                    entry
                        .link_name()?
                        .map(|l| l.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                _ => Node::Other,
            };
            if !matches!(node, Node::Dir { .. }) {
                self.remove_below(&path);
            }
            if !path.is_empty() {
                self.nodes.insert(path, node);
            }
        }
        Ok(())
    }

    fn remove_below(&mut self, dir: &str) {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let below: Vec<String> = self
            .nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for key in below {
            self.nodes.remove(&key);
        }
    }
}

/// A folder entry the anchored layer writes before the entries below it.
struct Folder {
    path: String,
    mode: u32,
    uid: u64,
    gid: u64,
    /// Not in the parent: this layer makes it.
    made: bool,
}

/// Places entries of a new layer in a parent's tree, as an engine's ADD would unpack them.
pub struct Anchor {
    tree: Tree,
    /// Paths this layer has written, folders included.
    written: BTreeSet<String>,
    mtime: u64,
}

/// Why a folder cannot be made below the parent's root; the path is without its leading `/`.
#[derive(Debug, thiserror::Error)]
enum NoFolder {
    #[error("/{0} is a symlink loop in the parent")]
    Loop(String),
    #[error("/{0} is a file in the parent, not a folder")]
    File(String),
    #[error("/{0} is missing: a symlink in the parent leads there")]
    Missing(String),
}

impl Anchor {
    pub fn new(tree: Tree, mtime: u64) -> Anchor {
        Anchor {
            tree,
            written: BTreeSet::new(),
            mtime,
        }
    }

    /// Resolves the folder `path` as the kernel would below the parent's root, making what
    /// is missing; returns its real path and the folders to write on the way.
    fn folder(&mut self, path: &str) -> std::result::Result<(String, Vec<Folder>), NoFolder> {
        let mut real: Vec<String> = Vec::new();
        let mut folders = Vec::new();
        // Each component, and whether it came from a symlink's target (those must exist:
        // the engine does not make folders through a symlink).
        let mut queue: VecDeque<(String, bool)> = clean(path)
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| (c.to_string(), false))
            .collect();
        let mut hops = 0;
        while let Some((component, through_link)) = queue.pop_front() {
            match component.as_str() {
                "." => continue,
                ".." => {
                    real.pop();
                    continue;
                }
                _ => {}
            }
            real.push(component);
            let at = real.join("/");
            match self.tree.nodes.get(&at).cloned() {
                Some(Node::Dir { mode, uid, gid }) => folders.push(Folder {
                    path: at,
                    mode,
                    uid,
                    gid,
                    made: false,
                }),
                Some(Node::Link(target)) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(NoFolder::Loop(at));
                    }
                    real.pop();
                    if target.starts_with('/') {
                        real.clear();
                    }
                    for part in target.split('/').filter(|c| !c.is_empty()).rev() {
                        queue.push_front((part.to_string(), true));
                    }
                }
                Some(Node::Other) => {
                    return Err(NoFolder::File(at));
                }
                None if through_link => {
                    return Err(NoFolder::Missing(at));
                }
                None => {
                    let made = Node::Dir {
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                    };
                    self.tree.nodes.insert(at.clone(), made);
                    folders.push(Folder {
                        path: at,
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        made: true,
                    });
                }
            }
        }
        Ok((real.join("/"), folders))
    }

    /// Starts the next layer: it writes its own entries for the folders it uses.
    pub fn next_layer(&mut self) {
        self.written.clear();
    }

    fn write_folders<W: Write>(
        &mut self,
        folders: Vec<Folder>,
        out: &mut tar::Builder<W>,
    ) -> std::io::Result<()> {
        for folder in folders {
            if self.written.insert(folder.path.clone()) {
                let header = owned(
                    tar::EntryType::Directory,
                    folder.mode,
                    0,
                    self.mtime,
                    folder.uid,
                    folder.gid,
                );
                append(
                    out,
                    header,
                    &format!("./{}/", folder.path),
                    std::io::empty(),
                )?;
            }
        }
        Ok(())
    }

    /// Where an entry at `path` lands (its name in the layer, `./` first): below its resolved
    /// folder, after that folder's own entries. The entry replaces what the parent has there.
    pub fn place<W: Write>(
        &mut self,
        path: &str,
        out: &mut tar::Builder<W>,
    ) -> std::io::Result<String> {
        let path = clean(path);
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        let (real_dir, folders) = self.folder(dir).map_err(std::io::Error::other)?;
        self.write_folders(folders, out)?;
        let real = if real_dir.is_empty() {
            name.to_string()
        } else {
            format!("{real_dir}/{name}")
        };
        if !self.written.insert(real.clone()) {
            return Err(std::io::Error::other(format!(
                "/{path} lands at /{real}, where another file of this layer already is"
            )));
        }
        self.tree.remove_below(&real);
        self.tree.nodes.insert(real.clone(), Node::Other);
        Ok(format!("./{real}"))
    }

    /// Copies the tar `input` into `out` anchored: folders resolved and kept as the parent
    /// has them (a folder the parent lacks keeps the entry's own mode), files and symlinks
    /// at their resolved paths with their own headers.
    pub fn rewrite<W: Write>(
        &mut self,
        input: impl Read,
        out: &mut tar::Builder<W>,
    ) -> std::io::Result<()> {
        let mut archive = tar::Archive::new(input);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = clean(&String::from_utf8_lossy(&entry.path_bytes()));
            let mut header = entry.header().clone();
            if header.entry_type() == tar::EntryType::Directory {
                let (_, mut folders) = self.folder(&path).map_err(std::io::Error::other)?;
                if let Some(last) = folders.last_mut().filter(|f| f.made) {
                    last.mode = header.mode()? & 0o7777;
                    last.uid = header.uid()?;
                    last.gid = header.gid()?;
                }
                self.write_folders(folders, out)?;
                continue;
            }
            let name = self.place(&path, out)?;
            match entry.link_name()? {
                Some(target) => out.append_link(&mut header, &name, &target)?,
                None => append(out, header, &name, &mut entry)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(entries: &[(&str, tar::EntryType, u32, &str)]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, kind, mode, link) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(*mode);
            header.set_size(0);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            if *kind == tar::EntryType::Symlink {
                tar.append_link(&mut header, path, link).unwrap();
            } else {
                tar.append_data(&mut header, path, std::io::empty())
                    .unwrap();
            }
        }
        tar.into_inner().unwrap()
    }

    fn tree(layers: &[Vec<u8>]) -> Tree {
        let mut tree = Tree::default();
        for bytes in layers {
            tree.apply(tar::Archive::new(bytes.as_slice()).entries().unwrap())
                .unwrap();
        }
        tree
    }

    fn entries(bytes: &[u8]) -> Vec<(String, u32)> {
        tar::Archive::new(bytes)
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    e.header().mode().unwrap(),
                )
            })
            .collect()
    }

    use tar::EntryType::{Directory as D, Regular as F, Symlink as L};

    #[test]
    fn files_follow_the_parents_symlinks_and_keep_its_folders() {
        let parent = tree(&[layer(&[
            ("usr/", D, 0o755, ""),
            ("usr/bin/", D, 0o755, ""),
            ("bin", L, 0o777, "usr/bin"),
            ("tmp/", D, 0o1777, ""),
            ("etc/", D, 0o755, ""),
            ("etc/passwd", F, 0o644, ""),
        ])]);
        let mut anchor = Anchor::new(parent, 0);
        let mut out = tar::Builder::new(Vec::new());
        for path in ["bin/x", "tmp/t", "opt/new/f"] {
            let name = anchor.place(path, &mut out).unwrap();
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            header.set_size(0);
            append(&mut out, header, &name, std::io::empty()).unwrap();
        }
        assert_eq!(
            entries(&out.into_inner().unwrap()),
            vec![
                ("./usr/".into(), 0o755),
                ("./usr/bin/".into(), 0o755),
                ("./usr/bin/x".into(), 0o644),
                ("./tmp/".into(), 0o1777),
                ("./tmp/t".into(), 0o644),
                ("./opt/".into(), 0o755),
                ("./opt/new/".into(), 0o755),
                ("./opt/new/f".into(), 0o644),
            ]
        );
        let mut out = tar::Builder::new(Vec::new());
        let err = anchor.place("etc/passwd/x", &mut out).unwrap_err();
        assert!(err.to_string().contains("is a file in the parent"), "{err}");
        let err = anchor.place("usr/bin/x", &mut out).unwrap_err();
        assert!(err.to_string().contains("another file"), "{err}");
    }

    #[test]
    fn whiteouts_and_loops() {
        let parent = tree(&[
            layer(&[
                ("a/", D, 0o700, ""),
                ("a/b/", D, 0o700, ""),
                ("loop", L, 0o777, "loop"),
                ("gone", L, 0o777, "/nowhere"),
            ]),
            layer(&[("a/.wh..wh..opq", F, 0o644, "")]),
        ]);
        let mut anchor = Anchor::new(parent, 0);
        let mut out = tar::Builder::new(Vec::new());
        anchor.place("a/b/f", &mut out).unwrap();
        assert_eq!(
            entries(&out.into_inner().unwrap()),
            vec![("./a/".into(), 0o700), ("./a/b/".into(), 0o755)]
        );
        let mut out = tar::Builder::new(Vec::new());
        assert!(anchor.place("loop/f", &mut out).is_err());
        assert!(anchor.place("gone/f", &mut out).is_err());
    }
}
