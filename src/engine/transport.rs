//! How requests reach an engine: one pooled HTTP client per engine, over its unix socket, its
//! TCP port or an ssh bridge's socket, shared by bollard and by hallmark's own reads
//! (`answers.rs`). It puts the negotiated API version into every request path.
//!
//! bollard 0.21.1 writes `/v1.xx` into its URLs and then joins an absolute path that drops it
//! (bollard issue #736; fixed upstream by PR #737, in no release yet: 0.21.1 is the newest on
//! crates.io), so every engine answered at its newest API whatever was negotiated, and
//! response shapes differed per engine. A path that already carries a version is left alone, so the
//! day bollard carries the fix nothing is sent twice.

use super::answers::EngineVersion;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The highest API version hallmark asks for: what its bollard speaks.
pub const NEWEST_API: &bollard::ClientVersion = bollard::API_DEFAULT_VERSION;

/// Where each new connection to the engine goes.
#[derive(Clone, Debug)]
pub enum Dial {
    Unix(PathBuf),
    /// `host:port`, plain HTTP.
    Tcp(String),
    /// `host:port` over TLS: the engine's certificate checked against the given CA, and the
    /// client's certificate presented, as `docker --tlsverify` does.
    Tls {
        address: String,
        config: Arc<rustls::ClientConfig>,
    },
}

impl Dial {
    /// TLS with the docker CLI's files in `dir`: `ca.pem` (the only CA trusted), `cert.pem`
    /// and `key.pem` (the client's).
    pub fn tls(address: String, dir: &std::path::Path) -> Result<Dial, TlsError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let read = |name: &str| fs_err::read(dir.join(name));
        let pem = |name: &'static str| move |source| TlsError::Pem { name, source };
        let certificates = |name: &'static str| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            CertificateDer::pem_slice_iter(&read(name)?)
                .collect::<Result<_, _>>()
                .map_err(pem(name))
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in certificates("ca.pem")? {
            roots.add(ca).map_err(TlsError::Ca)?;
        }
        let key = PrivateKeyDer::from_pem_slice(&read("key.pem")?).map_err(pem("key.pem"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Protocols)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certificates("cert.pem")?, key)
            .map_err(TlsError::ClientCertificate)?;
        Ok(Dial::Tls {
            address,
            config: Arc::new(config),
        })
    }
}

/// Why the docker CLI's TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("{name}: {source}")]
    Pem {
        name: &'static str,
        source: rustls_pki_types::pem::Error,
    },
    #[error("ca.pem: {0}")]
    Ca(rustls::Error),
    #[error("{0}")]
    Protocols(rustls::Error),
    #[error("cert.pem and key.pem: {0}")]
    ClientCertificate(rustls::Error),
}

/// The request body type bollard hands its transport (its name is private to bollard).
trait HasBody {
    type Body;
}
impl<B> HasBody for hyper::Request<B> {
    type Body = B;
}
type Body = <bollard::BollardRequest as HasBody>::Body;

#[derive(Clone)]
pub struct Transport {
    client: hyper_util::client::legacy::Client<Connector, Body>,
    /// `1.45`: set once the engine said which versions it speaks.
    version: Arc<OnceLock<String>>,
}

/// An answer with a status other than 2xx: the engine's own message.
#[derive(Debug, thiserror::Error)]
#[error("{message} (HTTP {status})")]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

/// Why a request to the engine brought no answer hallmark reads.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("{method} {path}: {source}")]
    Request {
        method: String,
        path: String,
        source: hyper::http::Error,
    },
    #[error("{}", with_causes(.0))]
    Unsent(bollard::errors::Error),
    #[error("reading the answer to {method} {path}: {source}")]
    Unread {
        method: String,
        path: String,
        source: hyper::Error,
    },
    #[error(
        "no answer to {method} {path} in {secs} s: the engine is hung or overloaded, \
         or the work runs longer ({setting} sets how long to wait)"
    )]
    Hung {
        method: String,
        path: String,
        secs: u64,
        setting: String,
    },
    #[error("the answer to {method} {path} is not what hallmark reads: {source}")]
    Unreadable {
        method: String,
        path: String,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the engine has no /version")]
    NoVersion,
    #[error("the engine speaks API {0:?}, not a version hallmark can use")]
    UnusableApi(String),
}

impl Transport {
    pub fn new(dial: Dial) -> Transport {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(Connector { dial });
        Transport {
            client,
            version: Arc::new(OnceLock::new()),
        }
    }

    /// Asks the engine which API versions it speaks (an unversioned `/version`, as the docker
    /// CLI's first request is) and settles on the newest both sides speak; every later request
    /// carries it. Returns the engine's answer.
    pub async fn negotiate(&self) -> Result<EngineVersion, AnswerError> {
        let answer: EngineVersion = self.get("/version").await?.ok_or(AnswerError::NoVersion)?;
        let version = answer
            .usable_api(NEWEST_API)
            .ok_or_else(|| AnswerError::UnusableApi(answer.api_version.clone()))?;
        let _ = self.version.set(version);
        Ok(answer)
    }

    /// The negotiated API version, `1.45`.
    pub fn api_version(&self) -> Option<&str> {
        self.version.get().map(String::as_str)
    }

    /// A bollard client whose every request goes through this transport.
    pub fn bollard(&self, timeout_secs: u64) -> bollard::Docker {
        let version = self
            .api_version()
            .and_then(|v| v.split_once('.'))
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
            .map_or(*NEWEST_API, |(major_version, minor_version)| {
                bollard::ClientVersion {
                    major_version,
                    minor_version,
                }
            });
        let transport = self.clone();
        bollard::Docker::connect_with_custom_transport(
            move |request: bollard::BollardRequest| {
                let transport = transport.clone();
                async move { transport.send(request).await }
            },
            Some("http://localhost"),
            timeout_secs,
            &version,
        )
        .expect("a custom transport always connects")
    }

    /// Sends `request` with the negotiated version in its path.
    pub async fn send(
        &self,
        mut request: bollard::BollardRequest,
    ) -> Result<hyper::Response<Incoming>, bollard::errors::Error> {
        if let Some(version) = self.version.get() {
            *request.uri_mut() = versioned(request.uri(), version);
        }
        self.client
            .request(request)
            .await
            .map_err(bollard::errors::Error::from)
    }

    /// GETs `path_and_query` and reads the answer as JSON; `Ok(None)` on 404.
    pub async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
    ) -> Result<Option<T>, AnswerError> {
        self.call("GET", path_and_query, None).await
    }

    /// POSTs `body` (JSON, if any) to `path_and_query` and reads the answer as JSON;
    /// `Ok(None)` on 404.
    pub async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<T>, AnswerError> {
        self.call("POST", path_and_query, body).await
    }

    /// POSTs to `path_and_query` and waits up to `wait` for the answer: for answers that come
    /// when work ends (a container's exit), not at once as a document does.
    /// `setting` names the variable that sets `wait`.
    pub async fn post_within<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
        (wait, setting): (std::time::Duration, &str),
    ) -> Result<Option<T>, AnswerError> {
        self.call_within("POST", path_and_query, None, (wait, setting))
            .await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<T>, AnswerError> {
        let wait = (answer_timeout(), ANSWER_TIMEOUT_ENV);
        self.call_within(method, path_and_query, body, wait).await
    }

    async fn call_within<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
        (wait, setting): (std::time::Duration, &str),
    ) -> Result<Option<T>, AnswerError> {
        let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let (method_, path) = (method.to_string(), path_and_query.to_string());
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://localhost{path_and_query}"))
            .header("content-type", "application/json")
            .body(bollard::body_full(bytes))
            .map_err(|source| AnswerError::Request {
                method: method_.clone(),
                path: path.clone(),
                source,
            })?;
        // A document (a version, an inspect, a listing) comes in seconds even from a busy
        // engine; one that never comes is a hung engine, which must not hang every command
        // that asks it (an outside test stopped a node's dockerd: `status` waited for good).
        let asked = async {
            let response = self.send(request).await.map_err(AnswerError::Unsent)?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|source| AnswerError::Unread {
                    method: method_.clone(),
                    path: path.clone(),
                    source,
                })?
                .to_bytes();
            Ok::<_, AnswerError>((status, body))
        };
        let (status, body) =
            tokio::time::timeout(wait, asked)
                .await
                .map_err(|_| AnswerError::Hung {
                    method: method_.clone(),
                    path: path.clone(),
                    secs: wait.as_secs(),
                    setting: setting.to_string(),
                })??;
        match status {
            404 => Ok(None),
            200..=299 => {
                serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|source| AnswerError::Unreadable {
                        method: method_,
                        path,
                        source,
                    })
            }
            _ => Err(Refused {
                status,
                message: super::answers::error_message(&body),
            }
            .into()),
        }
    }
}

/// An error in its own words and those of its causes (a failed connection says "client
/// error (Connect)", its cause "No such file or directory").
pub(crate) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let words = next.to_string();
        if !text.contains(&words) {
            text = format!("{text}: {words}");
        }
        cause = next.source();
    }
    text
}

/// The environment variable that sets how long a document may take, in seconds.
pub const ANSWER_TIMEOUT_ENV: &str = "HALLMARK_ANSWER_TIMEOUT";

/// How long an engine may take to answer with a document: 60 s, or `HALLMARK_ANSWER_TIMEOUT`.
/// A stream (build, load, export) has no such bound: a build step may take hours.
pub fn answer_timeout() -> std::time::Duration {
    seconds_from_env(ANSWER_TIMEOUT_ENV, 60)
}

/// A deadline in whole seconds from the environment variable `name`, else `default`; a
/// value that is not a positive number counts as unset.
pub(crate) fn seconds_from_env(name: &str, default: u64) -> std::time::Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| seconds(&v))
        .unwrap_or(default);
    std::time::Duration::from_secs(secs)
}

/// The longest any of hallmark's deadlines may be set to: a week. A deadline is a bound on a
/// wait, and `u64::MAX` seconds overflows the clock it is added to.
pub const LONGEST_DEADLINE_SECS: u64 = 7 * 24 * 3600;

/// `text` as a whole number of seconds from 1 to `LONGEST_DEADLINE_SECS`.
pub(super) fn seconds(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|s| (1..=LONGEST_DEADLINE_SECS).contains(s))
}

/// `uri` with `/v<version>` in front of its path, unless its path carries a version already.
fn versioned(uri: &hyper::Uri, version: &str) -> hyper::Uri {
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let has_version = path_and_query
        .strip_prefix("/v")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    if has_version {
        return uri.clone();
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = format!("/v{version}{path_and_query}").parse().ok();
    hyper::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// Percent-encodes `text` for a URL path segment or query value (RFC 3986 unreserved kept).
pub fn escape(text: &str, keep: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        let c = byte as char;
        if c.is_ascii_alphanumeric() || "-._~".contains(c) || keep.contains(c) {
            out.push(c);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Opens a connection to the engine, whatever the URI says.
#[derive(Clone)]
struct Connector {
    dial: Dial,
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

impl tower_service::Service<hyper::Uri> for Connector {
    type Response = Connection;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Connection>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Self::Future {
        let dial = self.dial.clone();
        Box::pin(async move {
            let stream: Box<dyn Io> = match dial {
                Dial::Unix(socket) => Box::new(tokio::net::UnixStream::connect(socket).await?),
                Dial::Tcp(address) => Box::new(tokio::net::TcpStream::connect(address).await?),
                Dial::Tls { address, config } => {
                    let host = address
                        .rsplit_once(':')
                        .map_or(address.as_str(), |(host, _)| host)
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string();
                    let name = rustls_pki_types::ServerName::try_from(host)
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                    let tcp = tokio::net::TcpStream::connect(&address).await?;
                    let tls = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await?;
                    Box::new(tls)
                }
            };
            Ok(Connection(hyper_util::rt::TokioIo::new(stream)))
        })
    }
}

struct Connection(hyper_util::rt::TokioIo<Box<dyn Io>>);

impl hyper_util::client::legacy::connect::Connection for Connection {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

impl hyper::rt::Read for Connection {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Connection {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_goes_in_front_of_a_path_without_one() {
        let uri: hyper::Uri = "http://localhost/images/a%2Fb/json?x=1".parse().unwrap();
        assert_eq!(
            versioned(&uri, "1.45").to_string(),
            "http://localhost/v1.45/images/a%2Fb/json?x=1"
        );
        let fixed: hyper::Uri = "http://localhost/v1.41/version".parse().unwrap();
        assert_eq!(versioned(&fixed, "1.45"), fixed);
        let volumes: hyper::Uri = "http://localhost/volumes".parse().unwrap();
        assert_eq!(
            versioned(&volumes, "1.45").to_string(),
            "http://localhost/v1.45/volumes"
        );
    }

    #[test]
    fn escape_keeps_what_it_is_told_to() {
        assert_eq!(escape("a b/c:d@e", "/:@"), "a%20b/c:d@e");
        assert_eq!(
            escape(r#"{"label":["k=v"]}"#, ""),
            "%7B%22label%22%3A%5B%22k%3Dv%22%5D%7D"
        );
    }
}
