//! Progress deadlines for streams: a load, an export, a push or a pull that stops moving
//! fails, with its node's name, instead of waiting for ever.
//!
//! A document has a deadline for its whole answer (`transport::answer_timeout`); a stream
//! cannot: a 24 GB load takes minutes. What it can have is a deadline on progress: no byte
//! sent (a request body the engine reads) and no message or chunk received for N seconds
//! means the engine, or the link to it, is frozen. An outside test froze one node's engine
//! during a load: the other nodes finished in seconds, then `distribute` waited for good, no
//! table, no exit. Builds and containers are not watched here: a build step or a smoke test
//! may be silent for an hour.
//!
//! Written here rather than taken from a crate: the deadline is on the two directions of one
//! request together (bytes going out count as progress while no answer comes), which no
//! timeout adaptor of tokio or futures expresses.

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The environment variable that sets the progress deadline of streams, in seconds.
pub const STALL_TIMEOUT_ENV: &str = "HALLMARK_STALL_TIMEOUT";

/// How long a stream may go without moving: 600 s, or `HALLMARK_STALL_TIMEOUT`. Sized for a
/// loaded engine: after the last byte of a 20 GB load a containerd store unpacks the layers
/// before it answers, without a message, for minutes.
pub fn stall_timeout() -> Duration {
    super::transport::seconds_from_env(STALL_TIMEOUT_ENV, 600)
}

/// When one request last moved, either way, and whether the connection is waiting on
/// hallmark itself (the body's next chunk is being made: a layer normalised, read from the
/// store), which is no stall of the engine's.
#[derive(Clone)]
pub struct Moved(Arc<Mutex<State>>);

struct State {
    at: Instant,
    ours: bool,
    /// A request body is being sent and has not ended: the engine reads as it goes, so a
    /// silence then is a frozen engine or link, judged on the answer deadline's scale; only
    /// after the last byte may the engine work for long without a word (a containerd
    /// store unpacking a 20 GB load).
    sending: bool,
    /// Silence the engine is allowed beyond the limit, for work it does before it answers
    /// ([`Moved::allow`]).
    grace: Duration,
}

impl Moved {
    pub fn now() -> Moved {
        Moved(Arc::new(Mutex::new(State {
            at: Instant::now(),
            ours: false,
            sending: false,
            grace: Duration::ZERO,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, ours: bool) {
        let mut state = self.state();
        (state.at, state.ours) = (Instant::now(), ours);
    }

    fn touch(&self) {
        self.state().at = Instant::now();
    }

    /// Allows the engine `more` silence: an engine that takes the whole body before it
    /// starts on it (Podman spools a load, then imports it without a word) is silent for a
    /// time that grows with what it was sent.
    pub fn allow(&self, more: Duration) {
        self.state().grace += more;
    }

    /// The deadline that holds now, for a stream whose deadline is `limit`: the answer
    /// deadline (`HALLMARK_ANSWER_TIMEOUT`) while a body is being sent, if shorter.
    fn limit(&self, limit: Duration) -> Duration {
        match self.state().sending {
            true => limit.min(super::transport::answer_timeout()),
            false => limit,
        }
    }

    /// How long since it moved, less the grace; zero while the wait is on hallmark's side.
    fn stalled_for(&self) -> Duration {
        let state = self.state();
        match state.ours {
            true => Duration::ZERO,
            false => state.at.elapsed().saturating_sub(state.grace),
        }
    }
}

/// `body` (a request body), each chunk the connection takes noted as progress, and the time
/// the connection waits for hallmark to make the next one not counted: an outside test saw a
/// normalisation of a 200 MB layer (hallmark at full CPU, the engine idle) called the
/// engine's stall.
pub fn noting<T: Send + 'static>(
    body: impl Stream<Item = T> + Send + 'static,
    moved: &Moved,
) -> impl Stream<Item = T> + Send + 'static {
    moved.state().sending = true;
    Noting {
        body: Box::pin(body),
        moved: moved.clone(),
    }
}

struct Noting<T> {
    body: std::pin::Pin<Box<dyn Stream<Item = T> + Send>>,
    moved: Moved,
}

impl<T> Stream for Noting<T> {
    type Item = T;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let polled = self.body.as_mut().poll_next(cx);
        // Asked for a chunk and none ready: hallmark is making it. A chunk (or the end)
        // given: from here the wait is the engine's.
        self.moved.set(polled.is_pending());
        if let std::task::Poll::Ready(None) = polled {
            self.moved.state().sending = false;
        }
        polled
    }
}

/// The words of a stall, for the stream's error.
pub fn stalled_words(limit: Duration) -> String {
    format!(
        "nothing moved for {} s: the engine, or the link to it, stopped ({} while hallmark sends, {STALL_TIMEOUT_ENV} after the last byte, set how long to wait)",
        limit.as_secs(),
        super::transport::ANSWER_TIMEOUT_ENV
    )
}

/// `stream` (an answer), ended by `stalled(words)` as its last item once, while it is being
/// read, neither it nor the request's body (`moved`) moved for `limit`. Dropping the stream then drops the request,
/// which closes its connection.
pub fn watched<'a, T: Send + 'a, E: Send + 'a>(
    stream: BoxStream<'a, Result<T, E>>,
    moved: Moved,
    limit: Duration,
    stalled: impl Fn(String) -> E + Send + Sync + 'a,
) -> BoxStream<'a, Result<T, E>> {
    let stalled = Arc::new(stalled);
    futures_util::stream::unfold(Some(stream), move |state| {
        let (moved, stalled) = (moved.clone(), Arc::clone(&stalled));
        async move {
            let mut stream = state?;
            // The wait starts now: time the reader spent elsewhere (a slow consumer, a node
            // the export also feeds) is not the engine's stall.
            moved.touch();
            loop {
                let now = moved.limit(limit);
                let left = now.saturating_sub(moved.stalled_for());
                if left.is_zero() {
                    return Some((Err(stalled(stalled_words(now))), None));
                }
                // Re-checked when it fires: the body may have moved meanwhile. `next` may be
                // given up and asked again: a stream keeps its place.
                match tokio::time::timeout(left, stream.next()).await {
                    Ok(Some(item)) => {
                        moved.touch();
                        return Some((item, Some(stream)));
                    }
                    Ok(None) => return None,
                    Err(_) => continue,
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_stops_moving_ends_with_a_stall_and_one_that_moves_does_not() {
        let limit = Duration::from_secs(10);
        // Moves every 6 s, 4 times: 24 s in all, never 10 s without a chunk.
        let slow = futures_util::stream::iter(0..4)
            .then(|i| async move {
                tokio::time::sleep(Duration::from_secs(6)).await;
                Ok::<_, String>(i)
            })
            .boxed();
        let items: Vec<_> = watched(slow, Moved::now(), limit, |w| w).collect().await;
        assert_eq!(items, [Ok(0), Ok(1), Ok(2), Ok(3)]);

        // One chunk, then silence.
        let frozen = futures_util::stream::iter([Ok::<_, String>(1)])
            .chain(futures_util::stream::pending())
            .boxed();
        let items: Vec<_> = watched(frozen, Moved::now(), limit, |w| w).collect().await;
        assert_eq!(items.len(), 2, "{items:?}");

        // A reader that takes its time between chunks (a node the export feeds is slow)
        // does not make the stream stalled.
        let chunks = futures_util::stream::iter([Ok::<_, String>(1), Ok(2)]).boxed();
        let mut read = watched(chunks, Moved::now(), limit, |w| w);
        assert_eq!(read.next().await, Some(Ok(1)));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(read.next().await, Some(Ok(2)));
        assert!(
            items[1]
                .as_ref()
                .unwrap_err()
                .contains("nothing moved for 10 s")
        );

        // No answer yet, but the request's body keeps going: not a stall.
        let moved = Moved::now();
        let body = noting(
            futures_util::stream::iter(0..3).then(|i| async move {
                tokio::time::sleep(Duration::from_secs(6)).await;
                i
            }),
            &moved,
        );
        let sent = tokio::spawn(body.collect::<Vec<_>>());
        let answer = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(19)).await;
            Ok::<_, String>(7)
        })
        .boxed();
        let items: Vec<_> = watched(answer, moved, limit, |w| w).collect().await;
        assert_eq!(items, [Ok(7)]);
        assert_eq!(sent.await.unwrap(), [0, 1, 2]);

        // The body's next chunk takes hallmark 60 s to make, while the connection waits for
        // it: not a stall. The engine then answers.
        let moved = Moved::now();
        let body = noting(
            futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                1
            }),
            &moved,
        );
        let sent = tokio::spawn(body.collect::<Vec<_>>());
        let answer = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(65)).await;
            Ok::<_, String>(7)
        })
        .boxed();
        let items: Vec<_> = watched(answer, moved, limit, |w| w).collect().await;
        assert_eq!(items, [Ok(7)]);
        assert_eq!(sent.await.unwrap(), [1]);
    }

    /// Issue 42: an engine that stops reading the body (frozen mid-load) fails on the answer
    /// deadline's scale; after the last byte, the long bound holds (a silent unpack).
    #[tokio::test(start_paused = true)]
    async fn an_engine_that_stops_reading_fails_at_the_answer_deadline_and_an_unpack_does_not() {
        let limit = Duration::from_secs(600);
        let answer = super::super::transport::answer_timeout();
        assert!(answer < limit);
        // A body the connection stops taking after its first chunk (never polled again).
        let moved = Moved::now();
        let mut body = Box::pin(noting(futures_util::stream::iter([1, 2]), &moved));
        assert_eq!(body.next().await, Some(1));
        let started = Instant::now();
        let never = futures_util::stream::pending::<Result<u8, String>>().boxed();
        let items: Vec<_> = watched(never, moved, limit, |w| w).collect().await;
        assert_eq!(started.elapsed(), answer, "{items:?}");
        assert!(
            items[0]
                .as_ref()
                .unwrap_err()
                .contains(&format!("nothing moved for {} s", answer.as_secs()))
        );
        // The whole body taken, then a silent unpack longer than the answer deadline.
        let moved = Moved::now();
        let body = noting(futures_util::stream::iter([1, 2]), &moved);
        assert_eq!(body.collect::<Vec<_>>().await, [1, 2]);
        let unpacked = futures_util::stream::once(async move {
            tokio::time::sleep(answer * 3).await;
            Ok::<_, String>(7)
        })
        .boxed();
        let items: Vec<_> = watched(unpacked, moved, limit, |w| w).collect().await;
        assert_eq!(items, [Ok(7)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_allowed_silence_after_the_body_is_no_stall_and_a_longer_one_is() {
        let limit = Duration::from_secs(10);
        let answer_after = |seconds| {
            futures_util::stream::once(async move {
                tokio::time::sleep(Duration::from_secs(seconds)).await;
                Ok::<_, String>(7)
            })
            .boxed()
        };
        let moved = Moved::now();
        moved.allow(Duration::from_secs(30));
        let items: Vec<_> = watched(answer_after(35), moved, limit, |w| w)
            .collect()
            .await;
        assert_eq!(items, [Ok(7)]);
        let moved = Moved::now();
        moved.allow(Duration::from_secs(30));
        let items: Vec<_> = watched(answer_after(45), moved, limit, |w| w)
            .collect()
            .await;
        assert!(
            matches!(&items[..], [Err(words)] if words.contains("nothing moved")),
            "{items:?}"
        );
    }
}
