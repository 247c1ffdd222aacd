//! The rewrite of a layer whose entries already come in canonical order, as they stream in:
//! no temporary copy, no second reading. Engines write a layer as a directory walk visits it
//! (Docker 20.10 and the classic store: Go's `filepath.Walk` over the layer's directory, by
//! name within each directory, a whiteout where the name it deletes is), which is the
//! canonical order (see the module doc of `normalize`). A layer out of that order, or one that
//! marks a directory opaque (whose canonical form needs the layers below), is refused at the
//! first such entry and goes the [`Canonical`](super::Canonical) way: the bytes are the same.

use super::{Item, Kind, Parsed, append_entry, components, parse};
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

/// Rewrites the layer `input` into `out` as it is read, when its entries come in canonical
/// order; `Ok(Err(_))` when they do not (what was written is then no layer).
pub fn rewrite(
    input: impl Read,
    out: &mut dyn Write,
    source_date: u64,
) -> std::io::Result<Result<(), Refused>> {
    let mut archive = tar::Archive::new(input);
    let mut tar = tar::Builder::new(out);
    let mut last: Option<Vec<String>> = None;
    // Each file, and each hard link to one, by path: the file that leads its group (in
    // canonical order the first, which a hard link's target always is in a tar written in
    // that order).
    let mut leaders: HashMap<String, Item> = HashMap::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let mut item = match parse(&mut entry)? {
            Parsed::Opaque(dir) => return Ok(Err(Refused::Opaque(dir))),
            Parsed::Item(item) => item,
        };
        let key = components(&item.key());
        if last.as_ref().is_some_and(|last| key <= *last) {
            return Ok(Err(Refused::OutOfOrder(item.path)));
        }
        last = Some(key);
        match item.kind {
            Kind::File => {
                leaders.insert(item.path.clone(), item.clone());
            }
            Kind::HardLink => {
                let target = item.link.clone().unwrap_or_default();
                let Some(leader) = leaders.get(&target).cloned() else {
                    return Ok(Err(Refused::LinkAhead(item.path)));
                };
                // As `lead_hard_links` writes a group's other members.
                item = Item {
                    path: item.path,
                    kind: Kind::HardLink,
                    link: Some(leader.path.clone()),
                    size: 0,
                    ..leader.clone()
                };
                leaders.insert(item.path.clone(), leader);
            }
            _ => {}
        }
        let size = item.size;
        append_entry(&mut tar, &item, source_date, (&mut entry).take(size))?;
    }
    tar.finish()?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fixture, normalised};
    use super::*;

    /// `layer` rewritten as it streams, at source date 1000, or why not.
    fn streamed(layer: &[u8]) -> Result<Vec<u8>, Refused> {
        let mut out = Vec::new();
        rewrite(layer, &mut out, 1_000).unwrap().map(|()| out)
    }

    fn file(tar: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(body.len() as u64);
        header.set_mtime(1_700_000_000);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, body).unwrap();
    }

    fn hard_link(tar: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Link);
        header.set_mode(0o600);
        header.set_size(0);
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
            streamed(&fixture("docker-20.10-2.tar")),
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

    #[test]
    fn a_layer_out_of_order_or_linking_ahead_is_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        file(&mut tar, "a-b", b"1");
        file(&mut tar, "a/x", b"2");
        assert_eq!(
            streamed(&tar.into_inner().unwrap()),
            Err(Refused::OutOfOrder("a/x".into()))
        );
        let mut tar = tar::Builder::new(Vec::new());
        file(&mut tar, "a", b"1");
        file(&mut tar, "a", b"2");
        assert_eq!(
            streamed(&tar.into_inner().unwrap()),
            Err(Refused::OutOfOrder("a".into()))
        );
        let mut tar = tar::Builder::new(Vec::new());
        hard_link(&mut tar, "a", "b");
        file(&mut tar, "b", b"1");
        assert_eq!(
            streamed(&tar.into_inner().unwrap()),
            Err(Refused::LinkAhead("a".into()))
        );
    }
}
