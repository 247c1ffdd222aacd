//! Request and answer bodies as hallmark's code writes and reads them: a `Write` whose bytes
//! become a streamed request body, and a blocking `Read` over an answer's chunks. Both go
//! through bounded channels, so an image is never whole in memory (a load or an export of
//! 24 GB holds a few chunks at a time).

use crate::error::{Error, Result};
use futures_util::stream::BoxStream;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A request body: bytes in hand (sent with their length), or a stream of chunks.
pub enum Body {
    Bytes(bytes::Bytes),
    Stream(BoxStream<'static, bytes::Bytes>),
}

impl Body {
    pub fn stream(chunks: impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static) -> Body {
        Body::Stream(Box::pin(chunks))
    }
}

impl From<Vec<u8>> for Body {
    fn from(bytes: Vec<u8>) -> Body {
        Body::Bytes(bytes.into())
    }
}

/// A `Write` whose bytes become the chunks of a request body: a bounded channel, so at most
/// a few chunks are in memory whatever the size of what is written. It counts what passes
/// (a transfer's progress); a writer that wants a digest hashes on its side.
pub struct ChannelWriter {
    sender: tokio::sync::mpsc::Sender<bytes::Bytes>,
    written: Option<Arc<AtomicU64>>,
    /// Set once a write finds the reading side gone.
    stopped: bool,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self
            .sender
            .blocking_send(bytes::Bytes::copy_from_slice(buf))
            .is_err()
        {
            self.stopped = true;
            let stopped = "the engine stopped reading";
            return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, stopped));
        }
        if let Some(counter) = &self.written {
            counter.fetch_add(buf.len() as u64, Ordering::Relaxed);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A request body produced by `produce` on its own thread through a buffered
/// `ChannelWriter`. If `produce` fails, the body ends early (the engine then reports a
/// truncated stream) and the error is printed.
pub fn body_from_writer(
    written: Option<Arc<AtomicU64>>,
    produce: impl FnOnce(&mut std::io::BufWriter<ChannelWriter>) -> Result<()> + Send + 'static,
) -> impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    std::thread::spawn(move || {
        let writer = ChannelWriter {
            sender,
            written,
            stopped: false,
        };
        let mut buffered = std::io::BufWriter::with_capacity(256 * 1024, writer);
        let outcome = produce(&mut buffered)
            .and_then(|()| buffered.flush().map_err(|e| Error::io("request body", e)));
        // The engine stopping reading (it failed, or the connection dropped) is the
        // request's own error, which its caller reports: said here too, it blamed the
        // layer store the archive was read from, twice.
        if let Err(e) = outcome
            && !buffered.get_ref().stopped
        {
            crate::output::stderr_exactly(&e.render());
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    })
}

/// A blocking `Read` over byte chunks that an async task sends (an image export, read by
/// the store on a blocking thread).
pub struct StreamReader {
    receiver: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    current: bytes::Bytes,
}

impl StreamReader {
    /// A reader fed through the returned sender, by whoever holds it.
    pub fn channel() -> (
        tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
        StreamReader,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        (
            sender,
            StreamReader {
                receiver,
                current: bytes::Bytes::new(),
            },
        )
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}
