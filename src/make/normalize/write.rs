//! Writing: the rewritten layers of one image into the layer store and, on a classic-store
//! builder, into the builder's load as they are written (fan-out to both, in chunks).

use super::*;

/// Where rewritten layers go besides the store: the load's channel, each layer sent as it is
/// written (`streamed`) or once it is in the store.
pub(super) struct Into<'a> {
    pub(super) made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    pub(super) streamed: bool,
}

/// Rewrites the new layers (positions `first..` of `diff_ids`) in order as they arrive on
/// `spooled`, each into the store and the load, those not rewritten as they streamed in;
/// returns them in order, and how many were.
pub(super) fn rewrite_all(
    store: &LayerStore,
    diff_ids: &[Digest],
    first: usize,
    spooled: std::sync::mpsc::Receiver<export::New>,
    parent: impl FnOnce() -> std::io::Result<Vec<StoredLayer>>,
    into: Into<'_>,
    source_date: u64,
) -> Result<(Vec<StoredLayer>, usize)> {
    let mut streamed = 0;
    let mut arrived: HashMap<Digest, export::Taken> = HashMap::new();
    let mut below = Below::new(parent);
    let mut done: Vec<StoredLayer> = Vec::new();
    for diff_id in &diff_ids[first..] {
        while !arrived.contains_key(diff_id) {
            let Ok(layer) = spooled.recv() else {
                // The reading stopped; its error is the one reported.
                return Err(Error::io(
                    "the builder's export",
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            };
            arrived.insert(layer.diff_id, layer.taken);
        }
        let file = match &arrived[diff_id] {
            export::Taken::Spooled(file) => file,
            export::Taken::Rewritten { layer, loaded } => {
                if !loaded {
                    // A send fails only once the load has stopped, which reports its own error.
                    let _ = into.made.send(transfer::Made::Layer(layer.clone()));
                }
                done.push(layer.clone());
                streamed += 1;
                continue;
            }
        };
        let failed = |e: std::io::Error| Error::Io {
            path: store.root.join("tmp"),
            source: std::io::Error::other(format!("normalising layer {diff_id}: {e}")),
        };
        let mut input = file.try_clone().map_err(failed)?;
        input.seek(SeekFrom::Start(0)).map_err(failed)?;
        let lower = || below.tree(store, &done);
        let mut canonical = Canonical::read(input, lower).map_err(failed)?;
        let layer =
            rewrite_one(store, &mut canonical, &into, source_date).map_err(|e| match e {
                Error::Io { source, .. } => failed(source),
                other => other,
            })?;
        done.push(layer);
    }
    Ok((done, streamed))
}

/// What the layers below a new one hold, for its opaque directories: the parent's (asked for
/// once, see [`parent_below`]) and the new ones rewritten before it.
pub(super) struct Below<F> {
    pub(super) parent: Option<F>,
    pub(super) parent_layers: Option<Vec<StoredLayer>>,
}

impl<F: FnOnce() -> std::io::Result<Vec<StoredLayer>>> Below<F> {
    pub(super) fn new(parent: F) -> Below<F> {
        Below {
            parent: Some(parent),
            parent_layers: None,
        }
    }

    pub(super) fn tree(
        &mut self,
        store: &LayerStore,
        done: &[StoredLayer],
    ) -> std::io::Result<LowerTree> {
        if self.parent_layers.is_none() {
            let parent = self.parent.take().expect("asked once");
            self.parent_layers = Some(parent()?);
        }
        let mut below = self.parent_layers.clone().unwrap_or_default();
        below.extend(done.iter().cloned());
        LowerTree::of(store, &below)
    }
}

/// Writes one canonical layer into the store and hands it to the load.
pub(super) fn rewrite_one<C: Content>(
    store: &LayerStore,
    canonical: &mut Canonical<C>,
    into: &Into<'_>,
    source_date: u64,
) -> Result<StoredLayer> {
    let stored = |(digest, size): (Digest, u64)| StoredLayer {
        diff_id: digest.clone(),
        blob: Blob {
            digest,
            size,
            media_type: LAYER_TAR.into(),
        },
    };
    // A send fails only once the load has stopped, which reports its own error.
    if !into.streamed {
        let layer = stored(store.add_blob(|out| canonical.write(out, source_date))?);
        let _ = into.made.send(transfer::Made::Layer(layer.clone()));
        return Ok(layer);
    }
    let size = canonical
        .size(source_date)
        .map_err(|e| Error::io(&store.root, e))?;
    let _ = into.made.send(transfer::Made::Begin(size));
    let mut pending = store.pending_blob()?;
    // The store's copy is hashed and written on a thread of its own, from the same chunks
    // the load gets: the load, which the engine unpacks only once it has all of it, is not
    // held up by the store's writes.
    let written = std::thread::scope(|scope| {
        let (to_store, chunks) = std::sync::mpsc::sync_channel::<bytes::Bytes>(16);
        let out = &mut pending.out;
        let writer = scope.spawn(move || {
            for chunk in chunks {
                out.write_all(&chunk)?;
            }
            out.flush()
        });
        let mut fanout = Fanout {
            made: into.made,
            store: to_store,
            buffer: bytes::BytesMut::with_capacity(CHUNK),
        };
        let wrote = canonical
            .write(&mut fanout, source_date)
            .and_then(|()| fanout.flush());
        drop(fanout);
        let stored = writer.join().expect("the store's writer does not panic");
        // The store's own failure (a full disk) says more than the send it cut short.
        stored.and(wrote)
    });
    written.map_err(|e| Error::io(store.root.join("tmp"), e))?;
    let layer = stored(pending.keep(store)?);
    let _ = into.made.send(transfer::Made::End(layer.clone()));
    Ok(layer)
}

/// The pieces a streamed layer is handed on in.
pub(super) const CHUNK: usize = 1 << 20;

/// Hands what is written to it, in [`CHUNK`]s, to the load and to the store's writer alike
/// (the same bytes, not copied).
pub(super) struct Fanout<'a> {
    pub(super) made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    pub(super) store: std::sync::mpsc::SyncSender<bytes::Bytes>,
    pub(super) buffer: bytes::BytesMut,
}

impl Write for Fanout<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        if self.buffer.len() >= CHUNK {
            self.flush()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = self.buffer.split().freeze();
        self.buffer.reserve(CHUNK);
        // A load that stopped reports its own error; the store's copy goes on.
        let _ = self.made.send(transfer::Made::Chunk(chunk.clone()));
        self.store
            .send(chunk)
            .map_err(|_| std::io::Error::other("the layer store's writer stopped"))
    }
}

/// Rewrites a new layer as it streams in ([`in_order`]) into the store and, given `load`, into
/// the builder's load at once, announced there with the export's size for it (`size`: the
/// canonical layer has the raw one's size unless a name or a record changes length); a
/// layer of another size is abandoned in the load (which begins again without it) and sent
/// from the store, a refused one once the sorting rewrite has made it from what was written.
pub(super) fn rewrite_streaming(
    store: &LayerStore,
    layer: &mut dyn Read,
    size: u64,
    load: Option<&std::sync::mpsc::SyncSender<transfer::Made>>,
    source_date: u64,
) -> std::io::Result<export::Taken> {
    let failed = |e: Error| std::io::Error::other(e.to_string());
    let mut pending = store.pending_blob().map_err(failed)?;
    let mut capped = load.map(|made| {
        // A send fails only once the load has stopped, which reports its own error.
        let _ = made.send(transfer::Made::Begin(size));
        Capped {
            made,
            left: size,
            over: false,
        }
    });
    let refused = {
        let mut load = capped
            .as_mut()
            .map(|capped| std::io::BufWriter::with_capacity(1 << 20, capped));
        let load = load.as_mut().map(|l| l as &mut dyn Write);
        in_order::rewrite(layer, &mut pending.out, load, source_date)?
    };
    if refused.is_some() {
        if let Some(capped) = capped {
            let _ = capped.made.send(transfer::Made::Abandon);
        }
        return Ok(export::Taken::Spooled(pending.into_file()?));
    }
    let (digest, size) = pending.keep(store).map_err(failed)?;
    let layer = StoredLayer {
        diff_id: digest.clone(),
        blob: Blob {
            digest,
            size,
            media_type: LAYER_TAR.into(),
        },
    };
    let loaded = match capped {
        Some(capped) if capped.left == 0 && !capped.over => {
            let _ = capped.made.send(transfer::Made::End(layer.clone()));
            true
        }
        Some(capped) => {
            let _ = capped.made.send(transfer::Made::Abandon);
            false
        }
        None => false,
    };
    Ok(export::Taken::Rewritten { layer, loaded })
}

/// Sends what is written to it to the load while it fits the size announced there; past that,
/// nothing (the layer is then abandoned in the load).
pub(super) struct Capped<'a> {
    pub(super) made: &'a std::sync::mpsc::SyncSender<transfer::Made>,
    pub(super) left: u64,
    pub(super) over: bool,
}

impl Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.over || buf.len() as u64 > self.left {
            self.over = true;
        } else {
            self.left -= buf.len() as u64;
            // A load that stopped reports its own error; the store's copy goes on.
            let _ = self
                .made
                .send(transfer::Made::Chunk(bytes::Bytes::copy_from_slice(buf)));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
