//! The rewrite of a layer whose entries already come in canonical order, as they stream in:
//! no temporary copy, no second reading. Engines write a layer as a directory walk visits it
//! (Docker 20.10 and the classic store: Go's `filepath.Walk` over the layer's directory, by
//! name within each directory, a whiteout where the name it deletes is), which is the
//! canonical order (see the module doc of `normalize`). A layer out of that order, or one that
//! marks a directory opaque (whose canonical form needs the layers below), is refused at the
//! first such entry: from there its entries are still written one by one in canonical form,
//! and what was written is the sorting rewrite's ([`Canonical`](super::Canonical)) input in
//! place of the raw layer, with the same outcome (each entry's rewrite is idempotent).

use super::{Item, Kind, OPAQUE, Parsed, append_entry, bytes, components, join, parse};
use std::collections::HashMap;
use std::io::{Read, Write};

/// Why a layer cannot be rewritten as it streams.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// An entry at or before the one written last, in canonical order.
    OutOfOrder(String),
    /// A directory marked opaque: its canonical whiteouts come from the layers below.
    Opaque(String),
    /// A hard link to a file this layer has not written before it.
    LinkAhead(String),
}

/// Rewrites the layer `input` as it is read into `out`, and into `load` too until the layer is
/// refused or its rewrite is seen to take another size than the layer had. Not refused, `out` holds the canonical layer; refused, the entries in canonical
/// form, out of order, opaque markers kept.
pub fn rewrite(
    input: impl Read,
    out: &mut dyn Write,
    load: Option<&mut dyn Write>,
    source_date: u64,
) -> std::io::Result<Option<Refused>> {
    let mut archive = tar::Archive::new(input);
    let mut tar = tar::Builder::new(Fork {
        out,
        load,
        written: 0,
    });
    let mut refused = None;
    let mut last: Option<Vec<String>> = None;
    // Each file, and each hard link to one, by path: the file that leads its group (in
    // canonical order the first, which a hard link's target always is in a tar written in
    // that order).
    let mut leaders: HashMap<String, Item> = HashMap::new();
    let mut refuse = |tar: &mut tar::Builder<Fork>, why: Refused| {
        tar.get_mut().load = None;
        refused.get_or_insert(why);
    };
    for entry in archive.entries()? {
        let mut entry = entry?;
        let mut item = match parse(&mut entry)? {
            Parsed::Opaque(dir) => {
                let marker = crate::oci::tar::header(tar::EntryType::Regular, 0, 0, 0);
                let name = bytes(&format!("./{}", join(&dir, OPAQUE)));
                crate::oci::tar::append_bytes(&mut tar, marker, &name, std::io::empty())?;
                refuse(&mut tar, Refused::Opaque(dir));
                continue;
            }
            Parsed::Item(item) => item,
        };
        let key = components(&item.key());
        if last.as_ref().is_some_and(|last| key <= *last) {
            refuse(&mut tar, Refused::OutOfOrder(item.path.clone()));
        }
        last = Some(key);
        match item.kind {
            kind if kind.leads_hard_links() => {
                leaders.insert(item.path.clone(), item.clone());
            }
            Kind::HardLink => match item.link.as_ref().and_then(|l| leaders.get(l)).cloned() {
                // As `lead_hard_links` writes a group's other members.
                Some(leader) => {
                    item = Item {
                        path: item.path,
                        kind: Kind::HardLink,
                        link: Some(leader.path.clone()),
                        size: 0,
                        ..leader.clone()
                    };
                    leaders.insert(item.path.clone(), leader);
                }
                None => refuse(&mut tar, Refused::LinkAhead(item.path.clone())),
            },
            _ => {}
        }
        let size = item.size;
        let raw_end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
        append_entry(&mut tar, &item, source_date, (&mut entry).take(size))?;
        // The load was told the raw layer's size: once the rewrite has written other than
        // what it has read (a name the `./` makes long, an attribute dropped), it will not
        // end at that size, and the load is left at once rather than at the end.
        if tar.get_ref().written != raw_end {
            tar.get_mut().load = None;
        }
    }
    tar.finish()?;
    Ok(refused)
}

/// Writes to `out`, and to `load` while there is one; counts what it writes.
struct Fork<'a, 'b> {
    out: &'a mut dyn Write,
    load: Option<&'b mut dyn Write>,
    written: u64,
}

impl Write for Fork<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.write_all(buf)?;
        self.written += buf.len() as u64;
        if let Some(load) = &mut self.load {
            load.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        match &mut self.load {
            Some(load) => load.flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fixture, header, normalised};
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    /// `layer` rewritten as it streams, at source date 1000, or why not; refused, what was
    /// written gives the canonical layer through the sorting rewrite (`lower`: the layers
    /// below).
    fn streamed_on(layer: &[u8], lower: &[&[u8]]) -> Result<Vec<u8>, Refused> {
        let mut out = Vec::new();
        match rewrite(layer, &mut out, None, 1_000).unwrap() {
            None => Ok(out),
            Some(why) => {
                assert!(
                    normalised(&out, lower) == normalised(layer, lower),
                    "{why:?}"
                );
                Err(why)
            }
        }
    }

    fn streamed(layer: &[u8]) -> Result<Vec<u8>, Refused> {
        streamed_on(layer, &[])
    }

    fn file(tar: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut header = header(tar::EntryType::Regular, 0o644, body.len() as u64);
        header.set_mtime(1_700_000_000);
        tar.append_data(&mut header, path, body).unwrap();
    }

    fn hard_link(tar: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
        let mut header = header(tar::EntryType::Link, 0o600, 0);
        header.set_mtime(1_800_000_000);
        header.set_uid(7);
        header.set_gid(7);
        tar.append_link(&mut header, path, target).unwrap();
    }

    /// Layers written by real engines (Docker 20.10's classic store and Docker 26's containerd
    /// store, tests/fixtures/layers): each is either rewritten as it streams into the very
    /// bytes the sorting rewrite gives, or refused (an opaque directory, which needs the layers
    /// below). The classic store's first layer, with no opaque directory, streams.
    #[test]
    fn real_engines_layers_stream_into_the_canonical_bytes_or_are_refused() {
        let mut streamed_any = false;
        for name in [
            "docker-20.10-1.tar",
            "docker-20.10-2.tar",
            "docker-26-containerd-1.tar",
            "docker-26-containerd-2.tar",
        ] {
            let layer = fixture(name);
            match streamed(&layer) {
                Ok(bytes) => {
                    assert!(bytes == normalised(&layer, &[]), "{name}: other bytes");
                    streamed_any = true;
                }
                Err(refused) => {
                    assert!(name.ends_with("-2.tar"), "{name}: {refused:?}");
                }
            }
        }
        assert!(streamed_any);
        assert!(streamed(&fixture("docker-20.10-1.tar")).is_ok());
        assert!(matches!(
            streamed_on(
                &fixture("docker-20.10-2.tar"),
                &[&fixture("docker-20.10-1.tar")]
            ),
            Err(Refused::Opaque(_))
        ));
    }

    /// Hard links come out led by the first of their group, with its metadata, as the sorting
    /// rewrite writes them; long names and a link to a link too.
    #[test]
    fn hard_links_and_long_names_stream_as_the_sorting_rewrite_writes_them() {
        let long = format!("a/{}", "n".repeat(120));
        let mut tar = tar::Builder::new(Vec::new());
        file(&mut tar, "a/f", b"data");
        hard_link(&mut tar, "a/g", "a/f");
        hard_link(&mut tar, "a/h", "a/g");
        file(&mut tar, &long, b"long");
        file(&mut tar, "b", b"");
        let layer = tar.into_inner().unwrap();
        let bytes = streamed(&layer).unwrap();
        assert!(bytes == normalised(&layer, &[]));
    }

    /// A hard link to a symlink, a fifo or a device streams as the sorting rewrite writes it.
    #[test]
    fn hard_links_to_a_symlink_or_a_fifo_stream_as_the_sorting_rewrite_writes_them() {
        for kind in [tar::EntryType::Symlink, tar::EntryType::Fifo] {
            let mut tar = tar::Builder::new(Vec::new());
            let mut leader = crate::oci::tar::header(kind, 0o644, 0, 0);
            leader.set_uid(0);
            leader.set_gid(0);
            leader.set_device_major(0).unwrap();
            leader.set_device_minor(0).unwrap();
            match kind {
                tar::EntryType::Symlink => tar.append_link(&mut leader, "a", "../etc/passwd"),
                _ => tar.append_data(&mut leader, "a", std::io::empty()),
            }
            .unwrap();
            hard_link(&mut tar, "b", "a");
            let layer = tar.into_inner().unwrap();
            let bytes = streamed(&layer).unwrap();
            assert!(bytes == normalised(&layer, &[]), "{kind:?}");
        }
    }

    /// A pseudo-random layer written in walk order as engines write it: directories, files
    /// (some with a capability, some with names of 95-130 bytes, some not UTF-8, some with
    /// mtimes past the source date), symlinks, hard links to an earlier file, devices, fifos
    /// and whiteouts.
    // One generator of every kind of entry, its state threaded through: split, the parts
    // would share the state and the archive being written.
    #[allow(clippy::too_many_lines)]
    fn generated(seed: u64) -> Vec<u8> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut names: Vec<Vec<u8>> = Vec::new();
        for _ in 0..(3 + next(40)) {
            let mut name = format!("d{}/", next(4)).into_bytes();
            name.extend(match next(5) {
                0 => vec![b'l'; 93 + next(37) as usize],
                1 => vec![b'n', 0xe9, b'0' + next(10) as u8],
                _ => format!("f{}", next(50)).into_bytes(),
            });
            names.push(name);
        }
        names.sort();
        names.dedup();
        let mut tar = tar::Builder::new(Vec::new());
        let header = |kind: tar::EntryType, mode: u32, size: u64, mtime: u64| {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_size(size);
            header.set_mtime(mtime);
            header.set_uid(mtime % 3);
            header.set_gid(mtime % 2);
            header
        };
        let mut dirs = std::collections::BTreeSet::new();
        let mut files: Vec<Vec<u8>> = Vec::new();
        for name in &names {
            let dir = name.split(|&b| b == b'/').next().unwrap().to_vec();
            if dirs.insert(dir.clone()) {
                let mut h = header(tar::EntryType::Directory, 0o755, 0, 500 + next(1000));
                let mut path = dir.clone();
                path.push(b'/');
                let path = OsStr::from_bytes(&path);
                tar.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            let path = OsStr::from_bytes(name);
            let mtime = 500 + next(1000);
            match next(8) {
                0 if !files.is_empty() => {
                    let target = &files[next(files.len() as u64) as usize];
                    let target = OsStr::from_bytes(target);
                    let mut h = header(tar::EntryType::Link, 0o644, 0, mtime);
                    tar.append_link(&mut h, path, target).unwrap();
                }
                1 => {
                    let mut h = header(tar::EntryType::Symlink, 0o777, 0, mtime);
                    tar.append_link(&mut h, path, "../elsewhere").unwrap();
                }
                2 => {
                    let mut h = header(tar::EntryType::Char, 0o600, 0, mtime);
                    h.set_device_major(1).unwrap();
                    h.set_device_minor(3).unwrap();
                    tar.append_data(&mut h, path, std::io::empty()).unwrap();
                }
                3 => {
                    let mut h = header(tar::EntryType::Fifo, 0o600, 0, mtime);
                    tar.append_data(&mut h, path, std::io::empty()).unwrap();
                }
                4 => {
                    let (dir, file) =
                        name.split_at(name.iter().position(|&b| b == b'/').unwrap() + 1);
                    let mut whiteout = dir.to_vec();
                    whiteout.extend(b".wh.");
                    whiteout.extend(file);
                    let whiteout = OsStr::from_bytes(&whiteout);
                    let mut h = header(tar::EntryType::Regular, 0, 0, mtime);
                    tar.append_data(&mut h, whiteout, std::io::empty()).unwrap();
                }
                kind => {
                    if kind == 5 {
                        tar.append_pax_extensions([(super::super::CAPABILITY, &b"cap"[..])])
                            .unwrap();
                    }
                    let body = vec![b'x'; next(700) as usize];
                    let mut h = header(tar::EntryType::Regular, 0o644, body.len() as u64, mtime);
                    tar.append_data(&mut h, path, body.as_slice()).unwrap();
                    files.push(name.clone());
                }
            }
        }
        tar.into_inner().unwrap()
    }

    /// Layers in walk order, generated: each streams into the bytes of the sorting rewrite.
    #[test]
    fn generated_layers_in_walk_order_stream_into_the_canonical_bytes() {
        for seed in 0..300 {
            let layer = generated(seed);
            let bytes = streamed(&layer).unwrap_or_else(|why| panic!("seed {seed}: {why:?}"));
            assert!(bytes == normalised(&layer, &[]), "seed {seed}: other bytes");
        }
    }

    /// The load is told the raw layer's size: it gets the whole rewrite when that has the
    /// same size, and is left after the first entry that changes length (a name over 100
    /// bytes in a ustar header's prefix, as Go's writer puts it, takes a long-name entry in
    /// canonical form), the rest of the layer not sent.
    #[test]
    fn the_load_is_left_after_the_first_entry_the_rewrite_makes_longer() {
        let rewritten = |layer: &[u8]| {
            let (mut out, mut load) = (Vec::new(), Vec::new());
            let refused = rewrite(layer, &mut out, Some(&mut load), 1_000).unwrap();
            assert_eq!(refused, None);
            (out, load)
        };
        let ustar = |tar: &mut tar::Builder<Vec<u8>>, path: &str| {
            let mut header = tar::Header::new_ustar();
            header.set_mode(0o644);
            header.set_size(3);
            header.set_mtime(5);
            header.set_uid(0);
            header.set_gid(0);
            tar.append_data(&mut header, path, &b"abc"[..]).unwrap();
        };
        let mut tar = tar::Builder::new(Vec::new());
        ustar(&mut tar, "a/f");
        ustar(&mut tar, "b");
        let layer = tar.into_inner().unwrap();
        let (out, load) = rewritten(&layer);
        assert_eq!(out.len(), layer.len());
        assert!(load == out);

        let long = format!("{}/{}", "p".repeat(60), "n".repeat(60));
        let mut tar = tar::Builder::new(Vec::new());
        ustar(&mut tar, "a/f");
        ustar(&mut tar, &long);
        ustar(&mut tar, "q");
        let layer = tar.into_inner().unwrap();
        // Three entries of a header and a block of data, and the two closing blocks.
        assert_eq!(layer.len(), 8 * 512, "the long name fits a ustar header");
        let (out, load) = rewritten(&layer);
        assert!(out.len() > layer.len());
        // The first entry, and the long one: a long-name entry (header and name), the header
        // and a block of data.
        assert_eq!(load.len(), 2 * 512 + 4 * 512);
        assert!(out.starts_with(&load));
    }

    #[test]
    fn a_layer_out_of_order_or_linking_ahead_is_refused() {
        type Entries = fn(&mut tar::Builder<Vec<u8>>);
        let cases: [(Entries, Refused); 3] = [
            (
                |tar| {
                    file(tar, "a-b", b"1");
                    file(tar, "a/x", b"2");
                },
                Refused::OutOfOrder("a/x".into()),
            ),
            (
                |tar| {
                    file(tar, "a", b"1");
                    file(tar, "a", b"2");
                },
                Refused::OutOfOrder("a".into()),
            ),
            (
                |tar| {
                    hard_link(tar, "a", "b");
                    file(tar, "b", b"1");
                },
                Refused::LinkAhead("a".into()),
            ),
        ];
        for (write, refused) in cases {
            let mut tar = tar::Builder::new(Vec::new());
            write(&mut tar);
            assert_eq!(streamed(&tar.into_inner().unwrap()), Err(refused));
        }
    }
}
