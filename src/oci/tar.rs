//! The one deterministic tar writer: every archive hallmark writes (build contexts, wheel
//! and file layers, normalised layers, archives for `docker load`) takes its headers and
//! names from here. GNU headers; the mtime, mode and owner the caller fixes (no user or group
//! names, no host times); names written exactly as given, `./` kept, with a `././@LongLink`
//! entry for a name longer than the header holds. The same inputs give the same bytes.

use std::io::{Read, Write};
pub use tar::{Archive, Builder, EntryType, Header};

/// A header with only the fields hallmark decides: type, mode, size and mtime. The owner is
/// left unset (read as root) unless [`owned`] sets it.
pub fn header(kind: EntryType, mode: u32, size: u64, mtime: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(mtime);
    header
}

/// [`header`] owned by `uid:gid`, written out (contexts and layers write `0:0`).
pub fn owned(kind: EntryType, mode: u32, size: u64, mtime: u64, uid: u64, gid: u64) -> Header {
    let mut header = header(kind, mode, size, mtime);
    header.set_uid(uid);
    header.set_gid(gid);
    header
}

/// Appends an entry named exactly `name`: the tar crate drops a leading `./` from names it
/// sets, and hallmark's archives keep it. Engines sniff an archive (a layer on load, ADD's
/// source) for compression by its first bytes, and a first name starting with `BZh` reads as
/// bzip2: the load fails, or ADD copies the archive instead of unpacking it.
pub fn append<W: Write>(
    tar: &mut Builder<W>,
    header: Header,
    name: &str,
    data: impl Read,
) -> std::io::Result<()> {
    append_bytes(tar, header, name.as_bytes(), data)
}

/// [`append`] for a name that need not be UTF-8 (a layer's names are bytes).
pub fn append_bytes<W: Write>(
    tar: &mut Builder<W>,
    mut header: Header,
    raw: &[u8],
    data: impl Read,
) -> std::io::Result<()> {
    let field = &mut header.as_old_mut().name;
    if raw.len() > field.len() {
        // A long name goes first as a `././@LongLink` entry, which is safe to sniff too.
        use std::os::unix::ffi::OsStrExt;
        return tar.append_data(&mut header, std::ffi::OsStr::from_bytes(raw), data);
    }
    field.fill(0);
    field[..raw.len()].copy_from_slice(raw);
    header.set_cksum();
    tar.append(&header, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of each kind of entry, pinned: a change here changes every checksum.
    #[test]
    fn entries_are_written_byte_for_byte_as_pinned() {
        let mut tar = Builder::new(Vec::new());
        let file = owned(EntryType::Regular, 0o644, 3, 1_700_000_000, 0, 0);
        append(&mut tar, file, "./BZh", &b"abc"[..]).unwrap();
        let dir = owned(EntryType::Directory, 0o755, 0, 1_700_000_000, 1000, 1000);
        append(&mut tar, dir, "./d/", std::io::empty()).unwrap();
        let long = format!("./{}", "x/".repeat(80));
        append(
            &mut tar,
            header(EntryType::Regular, 0o444, 0, 0),
            &long,
            std::io::empty(),
        )
        .unwrap();
        append_bytes(
            &mut tar,
            header(EntryType::Regular, 0o444, 0, 0),
            b"./\xff",
            std::io::empty(),
        )
        .unwrap();
        let bytes = tar.into_inner().unwrap();
        let names: Vec<Vec<u8>> = ::tar::Archive::new(bytes.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path_bytes().into_owned())
            .collect();
        assert_eq!(names[0], b"./BZh");
        assert_eq!(names[2], long.as_bytes());
        assert_eq!(names[3], b"./\xff");
        assert_eq!(
            crate::oci::Digest::of(&bytes).as_str(),
            "sha256:c5b061f6001e0ba6e9feebe305eb8827519fc13ae65d0d917133b697ec85ad8e"
        );
    }
}
