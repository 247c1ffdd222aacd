//! Rewriting: one layer into its canonical form (`rewrite_layer`, `Canonical`), the entry
//! headers it writes, and the `Content` a rewrite reads file bodies from.

use super::*;

/// Rewrites one layer into its canonical form (see the module doc): what the layer changes,
/// written the same way whatever engine wrote it. `input` is the layer's tar; `lower` gives
/// what the layers below it hold, asked for only when the layer has an opaque directory.
pub fn rewrite_layer<R: Read + Seek>(
    input: R,
    lower: impl FnOnce() -> std::io::Result<LowerTree>,
    out: &mut dyn Write,
    source_date: u64,
) -> std::io::Result<()> {
    Canonical::read(input, lower)?.write(out, source_date)
}

/// Where a canonical layer's file content is read from.
pub trait Content {
    /// The content of the file `item` (no more than its size).
    fn open(&mut self, item: &Item) -> std::io::Result<impl Read + '_>;
}

/// A layer's tar: an item's content lies at its `data` offset.
pub struct InTar<R>(pub(super) std::io::BufReader<R>);

impl<R: Read + Seek> Content for InTar<R> {
    fn open(&mut self, item: &Item) -> std::io::Result<impl Read + '_> {
        self.0.seek(SeekFrom::Start(item.data))?;
        Ok((&mut self.0).take(item.size))
    }
}

/// A layer's entries put in canonical order, ready to be written with their content.
pub struct Canonical<C> {
    pub(super) items: Vec<Item>,
    pub(super) content: C,
}

impl<R: Read + Seek> Canonical<InTar<R>> {
    /// Reads the layer's entries (not their content); `lower` as for [`rewrite_layer`].
    pub fn read(
        input: R,
        lower: impl FnOnce() -> std::io::Result<LowerTree>,
    ) -> std::io::Result<Canonical<InTar<R>>> {
        let (items, opaque, input) =
            read_items(std::io::BufReader::with_capacity(256 * 1024, input))?;
        Canonical::of(items, &opaque, lower, InTar(input))
    }
}

impl<C: Content> Canonical<C> {
    /// The layer of `items` (opaque markers apart) whose directories `opaque` are marked
    /// opaque; `lower` is asked only if there are any.
    pub(super) fn of(
        mut items: Vec<Item>,
        opaque: &[String],
        lower: impl FnOnce() -> std::io::Result<LowerTree>,
        content: C,
    ) -> std::io::Result<Canonical<C>> {
        if !opaque.is_empty() {
            let lower = lower()?;
            items.extend(explicit_whiteouts(&items, opaque, &lower));
        }
        items.sort_by_cached_key(|item| components(&item.key()));
        let items = lead_hard_links(items);
        Ok(Canonical { items, content })
    }

    /// How many bytes [`Canonical::write`] writes (files' content is not read): an archive
    /// entry's size comes before its content.
    pub fn size(&mut self, source_date: u64) -> std::io::Result<u64> {
        let mut counted = Counted(0);
        self.write_to(&mut counted, source_date, false)?;
        Ok(counted.0)
    }

    /// Writes the canonical layer.
    pub fn write(&mut self, out: &mut dyn Write, source_date: u64) -> std::io::Result<()> {
        self.write_to(out, source_date, true)
    }

    /// With `content` false, files hold zeros of their size.
    pub(super) fn write_to(
        &mut self,
        out: &mut dyn Write,
        source_date: u64,
        content: bool,
    ) -> std::io::Result<()> {
        let mut tar = tar::Builder::new(out);
        for item in &self.items {
            if content && item.kind == Kind::File {
                append_entry(&mut tar, item, source_date, self.content.open(item)?)?;
            } else {
                let zeros = std::io::repeat(0).take(item.size);
                append_entry(&mut tar, item, source_date, zeros)?;
            }
        }
        tar.finish()
    }
}

/// Counts what is written to it.
pub(super) struct Counted(pub(super) u64);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The canonical header of `item` (see the module doc).
pub(super) fn header_of(item: &Item, source_date: u64) -> std::io::Result<tar::Header> {
    let size = if item.kind == Kind::File {
        item.size
    } else {
        0
    };
    let mut header = crate::oci::tar::owned(
        item.kind.entry_type(),
        item.mode & 0o7777,
        size,
        item.mtime.min(source_date),
        item.uid,
        item.gid,
    );
    if let Some((major, minor)) = item.device {
        header.set_device_major(major)?;
        header.set_device_minor(minor)?;
    }
    Ok(header)
}

/// Appends `item` in its canonical form, a file's content read from `data` (which holds no
/// more than the file's size; nothing is read for other kinds).
pub(super) fn append_entry<W: Write>(
    tar: &mut tar::Builder<W>,
    item: &Item,
    source_date: u64,
    data: impl Read,
) -> std::io::Result<()> {
    let mut header = header_of(item, source_date)?;
    if let Some(capability) = &item.capability {
        tar.append_pax_extensions([(CAPABILITY, capability.as_slice())])?;
    }
    // `./` first: a layer whose first name starts with `BZh` fails to load
    // (`oci::tar::append`).
    let name = match item.kind {
        Kind::Dir => format!("./{}/", item.path),
        _ => format!("./{}", item.path),
    };
    match (&item.kind, &item.link) {
        (Kind::Symlink | Kind::HardLink, Some(target))
            if header.set_link_name(raw(target)).is_err() =>
        {
            tar.append_link(&mut header, raw(&name), raw(target))
        }
        (Kind::File, _) => crate::oci::tar::append_bytes(tar, header, &bytes(&name), data),
        _ => crate::oci::tar::append_bytes(tar, header, &bytes(&name), std::io::empty()),
    }
}
