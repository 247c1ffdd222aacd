//! Reading layers: a layer tar's entries as `Item`s (pax fields, whiteouts, opaque
//! directories made explicit against the layers below, hard-link groups led by their first
//! member), and `LowerTree`, what the layers below an opaque directory hold.

use super::*;

/// The one extended attribute kept: file capabilities (`setcap`), which both image stores
/// carry. The containerd store writes every other attribute too, the classic store none.
pub(super) const CAPABILITY: &str = "SCHILY.xattr.security.capability";
pub(super) const WHITEOUT: &str = ".wh.";
pub(super) const OPAQUE: &str = ".wh..wh..opq";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Char,
    Block,
    Fifo,
    /// `dir/.wh.name`: `dir/name` of the layers below is deleted.
    Whiteout,
}

impl Kind {
    /// Whether a group of hard links can have this kind: anything but a directory (a
    /// symlink, a fifo and a device can be linked as a file can: `cp -al` of a tree does).
    pub(super) fn leads_hard_links(self) -> bool {
        !matches!(self, Kind::Dir | Kind::HardLink | Kind::Whiteout)
    }

    /// The kind of a tar entry at `path` that is not a whiteout.
    pub(super) fn of(entry_type: tar::EntryType, path: &str) -> std::io::Result<Kind> {
        Ok(match entry_type {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::HardLink,
            tar::EntryType::Char => Kind::Char,
            tar::EntryType::Block => Kind::Block,
            tar::EntryType::Fifo => Kind::Fifo,
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{path}: a tar entry of type {other:?}"),
                ));
            }
        })
    }

    pub(super) fn entry_type(self) -> tar::EntryType {
        match self {
            Kind::File | Kind::Whiteout => tar::EntryType::Regular,
            Kind::Dir => tar::EntryType::Directory,
            Kind::Symlink => tar::EntryType::Symlink,
            Kind::HardLink => tar::EntryType::Link,
            Kind::Char => tar::EntryType::Char,
            Kind::Block => tar::EntryType::Block,
            Kind::Fifo => tar::EntryType::Fifo,
        }
    }
}

/// One entry of a layer, with where its content starts in the layer's tar.
#[derive(Debug, Clone)]
pub struct Item {
    /// No leading `./` or `/`, no trailing `/`; a whiteout's is `dir/.wh.name`.
    pub(super) path: String,
    pub(super) kind: Kind,
    pub(super) mode: u32,
    pub(super) uid: u64,
    pub(super) gid: u64,
    pub(super) mtime: u64,
    pub(super) size: u64,
    pub(super) data: u64,
    /// A symlink's target as written; a hard link's target path.
    pub(super) link: Option<String>,
    pub(super) device: Option<(u32, u32)>,
    pub(super) capability: Option<Vec<u8>>,
}

impl Item {
    pub(super) fn whiteout(path: String) -> Item {
        Item {
            path,
            kind: Kind::Whiteout,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime: 0,
            size: 0,
            data: 0,
            link: None,
            device: None,
            capability: None,
        }
    }

    /// The path the entry is about: a whiteout sorts where the name it deletes would.
    pub(super) fn key(&self) -> String {
        match self.kind {
            Kind::Whiteout => {
                let (dir, name) = split(&self.path);
                join(dir, &name[WHITEOUT.len()..])
            }
            _ => self.path.clone(),
        }
    }
}

/// A name from a tar header as text, one char per byte (U+0000 to U+00FF): names need not be
/// UTF-8, and this keeps every byte and sorts as the bytes do. [`raw`] turns it back.
pub(super) fn text(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

/// The bytes [`text`] made a name of, as a path.
pub(super) fn raw(name: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(bytes(name)).into()
}

/// The bytes [`text`] made a name of.
pub(super) fn bytes(name: &str) -> Vec<u8> {
    name.chars().map(|c| c as u8).collect()
}

/// `a/b/c` -> (`a/b`, `c`); `c` -> (``, `c`).
pub(super) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

pub(super) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Sorts as a directory walk visits: `a`, `a/x`, `a-b` (component by component).
pub(super) fn components(path: &str) -> Vec<String> {
    path.split('/').map(str::to_string).collect()
}

/// `./usr/bin/` -> `usr/bin`.
pub(super) fn canonical(path: &str) -> String {
    let mut path = path;
    loop {
        let trimmed = path.trim_start_matches('/');
        match trimmed.strip_prefix("./") {
            Some(rest) => path = rest,
            None => {
                path = trimmed;
                break;
            }
        }
    }
    let path = path.trim_end_matches('/');
    if path == "." { "" } else { path }.to_string()
}

/// Every entry of the layer (opaque markers apart), the directories marked opaque, and the
/// reader back for the content.
pub(super) fn read_items<R: Read + Seek>(input: R) -> std::io::Result<(Vec<Item>, Vec<String>, R)> {
    let mut archive = tar::Archive::new(input);
    let mut items = Vec::new();
    let mut opaque = Vec::new();
    for entry in archive.entries_with_seek()? {
        match parse(&mut entry?)? {
            Parsed::Opaque(dir) => opaque.push(dir),
            Parsed::Item(item) => items.push(item),
        }
    }
    Ok((items, opaque, archive.into_inner()))
}

/// A file the build made under a name that the layer format reads as a whiteout: kept, it
/// would delete another name in the image (`.wh.passwd` deletes `passwd`), or fail the load.
pub(super) fn whiteout_named(path: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{path}: a name beginning with `{WHITEOUT}` marks a deletion in an image layer; the build made one, which no image can hold (rename it)"
        ),
    )
}

/// A layer's entry as normalisation sees it.
pub(super) enum Parsed {
    /// `dir/.wh..wh..opq`: `dir` hides what the layers below hold in it.
    Opaque(String),
    Item(Item),
}

pub(super) fn parse<R: Read>(entry: &mut tar::Entry<'_, R>) -> std::io::Result<Parsed> {
    let path = canonical(&text(&entry.path_bytes()));
    let (dir, name) = split(&path);
    if name == OPAQUE {
        return Ok(Parsed::Opaque(dir.to_string()));
    }
    let (capability, pax_mtime) = pax_fields(entry)?;
    let is_dir = entry.header().entry_type() == tar::EntryType::Directory;
    if (name.starts_with(WHITEOUT) && is_dir) || dir.split('/').any(|c| c.starts_with(WHITEOUT)) {
        return Err(whiteout_named(&path));
    }
    if name.starts_with(WHITEOUT) {
        return Ok(Parsed::Item(Item::whiteout(path)));
    }
    let header = entry.header();
    let kind = Kind::of(header.entry_type(), &path)?;
    let link = match kind {
        Kind::Symlink => entry.link_name_bytes().map(|l| text(&l)),
        Kind::HardLink => entry.link_name_bytes().map(|l| canonical(&text(&l))),
        _ => None,
    };
    let device = match kind {
        Kind::Char | Kind::Block => Some((
            header.device_major()?.unwrap_or(0),
            header.device_minor()?.unwrap_or(0),
        )),
        _ => None,
    };
    Ok(Parsed::Item(Item {
        mode: header.mode()?,
        uid: header.uid()?,
        gid: header.gid()?,
        mtime: match pax_mtime {
            Some(mtime) => mtime,
            None => header.mtime()?,
        },
        size: if kind == Kind::File { entry.size() } else { 0 },
        data: entry.raw_file_position(),
        path,
        kind,
        link,
        device,
        capability,
    }))
}

/// The PAX records normalisation keeps: the file capability, and the mtime (past 8^11
/// seconds, 2242, an engine writes the time as a PAX record and 0 in the header; whole
/// seconds are kept).
pub(super) fn pax_fields<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> std::io::Result<(Option<Vec<u8>>, Option<u64>)> {
    let records: Vec<(String, Vec<u8>)> = match entry.pax_extensions()? {
        Some(extensions) => extensions
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.key().ok()?.to_string(), e.value_bytes().to_vec())))
            .collect(),
        None => Vec::new(),
    };
    let capability = records
        .iter()
        .find(|(key, _)| key == CAPABILITY)
        .map(|(_, value)| value.clone());
    let mtime = records
        .iter()
        .find(|(key, _)| key == "mtime")
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
        .and_then(|value| value.split('.').next()?.parse::<u64>().ok());
    Ok((capability, mtime))
}

/// An opaque directory (`dir/.wh..wh..opq`, written by Docker 20.10's overlay2 driver) hides
/// everything below it in the layers underneath; the containerd store writes a whiteout for
/// each name it deletes instead. The canonical form is the latter: a whiteout for every name
/// the layers below hold in an opaque directory that this layer does not write itself, and,
/// in a directory both hold, for the names below it likewise.
pub(super) fn explicit_whiteouts(
    items: &[Item],
    opaque: &[String],
    lower: &LowerTree,
) -> Vec<Item> {
    let written: HashMap<&str, Kind> = items.iter().map(|i| (i.path.as_str(), i.kind)).collect();
    let mut whiteouts = Vec::new();
    let mut pending: Vec<String> = opaque.to_vec();
    while let Some(dir) = pending.pop() {
        for (name, lower_is_dir) in lower.children(&dir) {
            let path = join(&dir, &name);
            match written.get(path.as_str()) {
                None => {
                    let whiteout = join(&dir, &format!("{WHITEOUT}{name}"));
                    if !written.contains_key(whiteout.as_str()) {
                        whiteouts.push(Item::whiteout(whiteout));
                    }
                }
                Some(Kind::Dir) if lower_is_dir => pending.push(path),
                Some(_) => {}
            }
        }
    }
    whiteouts
}

/// In canonical order, the first of a group of hard links holds the content and the others
/// link to it, whichever one the engine wrote first. `items` are sorted.
pub(super) fn lead_hard_links(mut items: Vec<Item>) -> Vec<Item> {
    let index: HashMap<&str, usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| item.kind != Kind::Whiteout)
        .map(|(i, item)| (item.path.as_str(), i))
        .collect();
    // Each hard link under the file its chain of targets ends at.
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in (0..items.len()).filter(|&i| items[i].kind == Kind::HardLink) {
        let mut root = i;
        for _ in 0..items.len() {
            match items[root].link.as_deref().and_then(|l| index.get(l)) {
                Some(&target) if items[root].kind == Kind::HardLink => root = target,
                _ => break,
            }
        }
        if items[root].kind.leads_hard_links() {
            groups.entry(root).or_default().push(i);
        }
    }
    for (root, mut members) in groups {
        members.push(root);
        members.sort_unstable();
        let content = items[root].clone();
        let first = items[members[0]].path.clone();
        for (n, &m) in members.iter().enumerate() {
            let path = std::mem::take(&mut items[m].path);
            items[m] = if n == 0 {
                // A symlink's target stays its own.
                Item {
                    path,
                    ..content.clone()
                }
            } else {
                Item {
                    path,
                    kind: Kind::HardLink,
                    link: Some(first.clone()),
                    size: 0,
                    ..content.clone()
                }
            };
        }
    }
    items
}

/// What the layers below one hold: each path, and whether it is a directory.
#[derive(Debug, Default, Clone)]
pub struct LowerTree {
    pub(super) paths: BTreeMap<String, bool>,
}

impl LowerTree {
    /// What `layers`, bottom first, hold together.
    pub fn of(store: &LayerStore, layers: &[StoredLayer]) -> std::io::Result<LowerTree> {
        let mut tree = LowerTree::default();
        tree.apply_stored(store, layers)?;
        Ok(tree)
    }

    /// Applies `layers` from the store, bottom first.
    pub(super) fn apply_stored(
        &mut self,
        store: &LayerStore,
        layers: &[StoredLayer],
    ) -> std::io::Result<()> {
        for layer in layers {
            let reader = store
                .open_layer(layer)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            self.apply(reader)?;
        }
        Ok(())
    }

    /// Applies a layer walked from its directory ([`overlay::walk`]): what it deletes first
    /// (its opaque directories' content below, its whiteouts' names), then what it writes;
    /// in its tar the same comes in walk order, each deletion before the names it covers.
    pub(super) fn apply_walked(&mut self, items: &[Item], opaque: &[String]) {
        for dir in opaque {
            self.remove_below(dir);
        }
        for item in items.iter().filter(|i| i.kind == Kind::Whiteout) {
            let deleted = item.key();
            self.remove_below(&deleted);
            self.paths.remove(&deleted);
        }
        for item in items.iter().filter(|i| i.kind != Kind::Whiteout) {
            let is_dir = item.kind == Kind::Dir;
            if !is_dir {
                self.remove_below(&item.path);
            }
            self.paths.insert(item.path.clone(), is_dir);
        }
    }

    /// Applies a layer on top: its whiteouts and opaque directories delete, its entries add.
    pub fn apply(&mut self, layer: impl Read) -> std::io::Result<()> {
        let mut archive = tar::Archive::new(layer);
        for entry in archive.entries()? {
            let entry = entry?;
            let path = canonical(&text(&entry.path_bytes()));
            let (dir, name) = split(&path);
            if name == OPAQUE {
                self.remove_below(dir);
            } else if let Some(deleted) = name.strip_prefix(WHITEOUT) {
                let deleted = join(dir, deleted);
                self.remove_below(&deleted);
                self.paths.remove(&deleted);
            } else {
                let is_dir = entry.header().entry_type() == tar::EntryType::Directory;
                if !is_dir {
                    self.remove_below(&path);
                }
                self.paths.insert(path, is_dir);
            }
        }
        Ok(())
    }

    pub(super) fn prefix(dir: &str) -> String {
        if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        }
    }

    pub(super) fn remove_below(&mut self, dir: &str) {
        let prefix = LowerTree::prefix(dir);
        let below: Vec<String> = self
            .paths
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .map(|(p, _)| p.clone())
            .filter(|p| !p.is_empty())
            .collect();
        for path in below {
            self.paths.remove(&path);
        }
    }

    /// The names directly in `dir`, each with whether it is a directory.
    pub(super) fn children(&self, dir: &str) -> Vec<(String, bool)> {
        let prefix = LowerTree::prefix(dir);
        let mut children: BTreeMap<String, bool> = BTreeMap::new();
        for (path, is_dir) in self
            .paths
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
        {
            let rest = &path[prefix.len()..];
            if rest.is_empty() {
                continue;
            }
            match rest.split_once('/') {
                Some((name, _)) => {
                    children.insert(name.to_string(), true);
                }
                None => {
                    children.entry(rest.to_string()).or_insert(*is_dir);
                }
            }
        }
        children.into_iter().collect()
    }
}
