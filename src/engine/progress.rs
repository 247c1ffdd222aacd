//! What engines report while they work, in hallmark's own types: a build's output and the
//! image it made, and the messages of a push, pull or load. bollard's models are read here
//! so that no caller names them. Engines report a failed push, pull or load inside a
//! successful response, so such a stream is read to its end ([`follow`]).

use futures_util::StreamExt;
use futures_util::stream::BoxStream;

/// A stream of engine reports; `Err` is the stream's own failure.
pub type Reports<'a, T> = BoxStream<'a, Result<T, StreamError>>;

/// A stream's own failure: the connection, in the words of the library that read it, or
/// nothing moving for too long.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{}", super::transport::with_causes(.0))]
    Engine(#[from] bollard::errors::Error),
    /// [`super::stall::stalled_words`].
    #[error("{0}")]
    Stalled(String),
}

impl StreamError {
    /// The engine answered 404: what was asked for (an image, a path in a container) is not
    /// there. Judged by the status, not by the words, which differ between engines.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            StreamError::Engine(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        )
    }
}

/// One message of a push, pull or load.
#[derive(Debug, Clone, Default)]
pub struct ProgressEvent {
    /// `Pushed`, `Layer already exists`, `Downloading`, `Pull complete`, ...
    pub status: Option<String>,
    /// The layer the message is about.
    pub id: Option<String>,
    pub progress_detail: Option<ProgressDetail>,
    /// The failure the engine reports inside the stream.
    pub error: Option<String>,
}

/// Bytes done and in all, of one layer's download or upload.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgressDetail {
    pub current: Option<i64>,
    pub total: Option<i64>,
}

/// One part of a message of an engine build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildEvent {
    /// Output: the steps and what they print.
    Output(String),
    /// The engine's report of a failure (the stream then ends).
    Error(String),
    /// The id of the image the build made.
    Built(String),
}

fn detail(detail: Option<bollard::models::ProgressDetail>) -> Option<ProgressDetail> {
    detail.map(|d| ProgressDetail {
        current: d.current,
        total: d.total,
    })
}

fn error(detail: Option<bollard::models::ErrorDetail>) -> Option<String> {
    detail.and_then(|d| d.message)
}

impl From<bollard::models::PushImageInfo> for ProgressEvent {
    fn from(info: bollard::models::PushImageInfo) -> ProgressEvent {
        ProgressEvent {
            status: info.status,
            id: None,
            progress_detail: detail(info.progress_detail),
            error: error(info.error_detail),
        }
    }
}

impl From<bollard::models::CreateImageInfo> for ProgressEvent {
    fn from(info: bollard::models::CreateImageInfo) -> ProgressEvent {
        ProgressEvent {
            status: info.status,
            id: info.id,
            progress_detail: detail(info.progress_detail),
            error: error(info.error_detail),
        }
    }
}

/// A load answers with the messages of a build.
impl From<bollard::models::BuildInfo> for ProgressEvent {
    fn from(info: bollard::models::BuildInfo) -> ProgressEvent {
        ProgressEvent {
            status: info.status,
            id: info.id,
            progress_detail: detail(info.progress_detail),
            error: error(info.error_detail),
        }
    }
}

/// The parts of one build message, in the order they are read: output, failure, image id.
pub(super) fn build_events(info: bollard::models::BuildInfo) -> Vec<BuildEvent> {
    let mut events = Vec::new();
    if let Some(text) = info.stream {
        events.push(BuildEvent::Output(text));
    }
    if let Some(message) = error(info.error_detail) {
        events.push(BuildEvent::Error(message));
    }
    if let Some(id) = info.aux.and_then(|aux| aux.id) {
        events.push(BuildEvent::Built(id));
    }
    events
}

/// A bollard stream as hallmark's reports.
pub(super) fn reports<'a, T, B: Into<T>>(
    stream: impl futures_util::Stream<Item = Result<B, bollard::errors::Error>> + Send + 'a,
) -> Reports<'a, T> {
    stream
        .map(|item| item.map(Into::into).map_err(StreamError::from))
        .boxed()
}

/// Why a push, pull or load did not end well: the engine said so inside its stream, or the
/// stream itself broke (the link, the engine's answer, a stall).
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The engine's own words (an `error` message in the stream).
    #[error("{0}")]
    Reported(String),
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// Reads a progress stream to its end, handing each message to `each`; fails with the error
/// the engine reported in it (the last, read to the end), or the stream's own.
pub async fn follow(
    mut stream: Reports<'_, ProgressEvent>,
    mut each: impl FnMut(ProgressEvent),
) -> Result<(), FollowError> {
    let mut reported = None;
    while let Some(item) = stream.next().await {
        let message = item?;
        if let Some(error) = &message.error {
            reported = Some(error.clone());
        }
        each(message);
    }
    reported.map_or(Ok(()), |words| Err(FollowError::Reported(words)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_message_gives_its_output_failure_and_image_in_that_order() {
        let info: bollard::models::BuildInfo = serde_json::from_value(serde_json::json!({
            "stream": "Step 2/2 : RUN false\n",
            "errorDetail": {"code": 1, "message": "returned a non-zero code: 1"},
            "aux": {"ID": "sha256:abc"},
        }))
        .unwrap();
        assert_eq!(
            build_events(info),
            [
                BuildEvent::Output("Step 2/2 : RUN false\n".into()),
                BuildEvent::Error("returned a non-zero code: 1".into()),
                BuildEvent::Built("sha256:abc".into()),
            ]
        );
    }

    #[test]
    fn follow_reads_to_the_end_and_returns_the_failure_reported_inside() {
        let messages = [
            ProgressEvent {
                status: Some("Loading layer".into()),
                ..Default::default()
            },
            ProgressEvent {
                error: Some("unexpected EOF".into()),
                ..Default::default()
            },
            ProgressEvent {
                status: Some("after".into()),
                ..Default::default()
            },
        ];
        let stream = futures_util::stream::iter(messages.map(Ok)).boxed();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut seen = 0;
        let failure = runtime.block_on(follow(stream, |_| seen += 1));
        let words = failure.as_ref().map_err(ToString::to_string).err();
        assert_eq!((words.as_deref(), seen), (Some("unexpected EOF"), 3));
        assert!(matches!(failure, Err(FollowError::Reported(_))));
        let broken =
            futures_util::stream::iter([Err(StreamError::Stalled("connection reset".into()))])
                .boxed();
        let failure = runtime.block_on(follow(broken, drop));
        assert!(matches!(failure, Err(FollowError::Stream(_))));
        assert_eq!(failure.unwrap_err().to_string(), "connection reset");
    }
}
