//! The registry hallmark starts is filled from the layer store, not by the builder's push:
//! the blobs the stream transport sends (same bytes, same digests) and the manifest its
//! archives carry. So the registry holds an image the way the nodes that got it by stream
//! hold it: a containerd store that loaded the base from an archive finds the base's blobs
//! under the digests the registry's manifest names and fetches only the new layers (the
//! builder's push compressed every layer again, under new digests, so those nodes fetched the
//! base once more, or took an image they could not read). A blob the registry has is not
//! sent again, and one it lacks is hard-linked from the layer store into its storage where
//! both are on one file system ([`link_stored`]); only the rest goes through its upload API.
//! Plain HTTP on 127.0.0.1, no credentials: only for the registry hallmark runs.

use crate::engine::body_from_writer;
use crate::images::store::{Blob, LayerStore, StoredImage};
use crate::oci::archive;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::{Method, Request, StatusCode};
use std::collections::HashSet;
use std::sync::Arc;

type Body = BoxBody<Bytes, std::io::Error>;

/// Why the registry did not take what was sent.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// `what` is `<method> <path> at <address>`.
    #[error("{what}: {source}")]
    Connect {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Http { what: String, source: hyper::Error },
    #[error("{what}: {source}")]
    Request {
        what: String,
        source: hyper::http::Error,
    },
    #[error("the registry gave no upload location")]
    NoLocation,
    /// The registry's words, trimmed.
    #[error("the registry answered {status} to {path}: {words}")]
    Answered {
        status: StatusCode,
        path: String,
        words: String,
    },
}

/// Puts `image` into the registry at `address` (`host:port`) as `name:tag`; returns how many
/// blobs were sent and how many the registry had.
pub async fn push_stored(
    address: &str,
    name: &str,
    tag: &str,
    store: &Arc<LayerStore>,
    image: &StoredImage,
) -> Result<(usize, usize), SeedError> {
    let (mut sent, mut present) = (0, 0);
    let mut seen = HashSet::new();
    let blobs = std::iter::once(&image.config).chain(image.layers.iter().map(|l| &l.blob));
    for blob in blobs.filter(|b| seen.insert(b.digest.clone())) {
        let path = format!("/v2/{name}/blobs/{}", blob.digest);
        let head = request(address, Method::HEAD, &path, None, empty()).await?;
        if head.status() == StatusCode::OK {
            present += 1;
            continue;
        }
        upload(address, name, store, blob).await?;
        sent += 1;
    }
    let (_, manifest) = archive::manifest(image);
    let path = format!("/v2/{name}/manifests/{tag}");
    let media_type = "application/vnd.oci.image.manifest.v1+json";
    let body = http_body_util::Full::new(Bytes::from(manifest))
        .map_err(|never| match never {})
        .boxed();
    let answer = request(address, Method::PUT, &path, Some(media_type), body).await?;
    expect(answer, StatusCode::CREATED, &path).await?;
    Ok((sent, present))
}

/// Links the blobs of `image` the registry's `storage` lacks from the layer store into it,
/// as docker-registry's filesystem driver keeps them (`docker/registry/v2/blobs/...`, and a
/// `_layers` link in the repository `name`); returns how many (a blob the registry held as
/// another file is linked again, and counted). [`push_stored`] then finds
/// them there and sends only the manifest.
///
/// Why behind the registry's back: sending a 24 GB image through its upload API copied every
/// byte once more (and hashed it) before the first node could pull, and kept the image twice
/// on the builder's disk. A hard link costs neither. The layer store's blobs are the bytes the
/// registry would have written (same digests: `push_stored`), stored once and never changed
/// in place (new content is a new file), and the registry never writes into a blob it holds.
/// A blob that cannot be linked (another filesystem) is left to the upload.
pub fn link_stored(
    storage: &std::path::Path,
    name: &str,
    store: &LayerStore,
    image: &StoredImage,
) -> usize {
    // A repository name is slash-separated path components ([a-z0-9._-]); anything else
    // is not put into a path here (the upload API judges it).
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && (part.bytes())
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if !name.split('/').all(plain) {
        return 0;
    }
    let v2 = storage.join("docker/registry/v2");
    let blobs = std::iter::once(&image.config).chain(image.layers.iter().map(|l| &l.blob));
    let linked = blobs.filter(|blob| {
        let Some(data) = blob_data(storage, blob.digest.as_str()) else {
            return false;
        };
        let hex = blob.digest.hex();
        let link = (v2.join("repositories").join(name))
            .join("_layers/sha256")
            .join(hex)
            .join("link");
        // Linked again where the registry holds another file under that digest: a copy an
        // earlier upload wrote, or one the layer store has since written anew (after it was
        // emptied and filled again). Else the disk held both for good (the registry's tag
        // keeps its copy), and a registry copy damaged apart from the store was served on.
        let source = store.blob_path(&blob.digest);
        let fresh = !same_file(&source, &data);
        let put = || -> std::io::Result<()> {
            if fresh {
                let folder = data.parent().expect("a folder");
                fs_err::create_dir_all(folder)?;
                let part = folder.join("data.part");
                let _ = fs_err::remove_file(&part);
                fs_err::hard_link(&source, &part)?;
                fs_err::rename(&part, &data)?;
            }
            if !link.exists() {
                // Written whole, then renamed: the registry never reads half a link.
                let folder = link.parent().expect("a folder");
                fs_err::create_dir_all(folder)?;
                let part = folder.join("link.part");
                fs_err::write(&part, blob.digest.as_str())?;
                fs_err::rename(&part, &link)?;
            }
            Ok(())
        };
        match put() {
            Ok(()) => fresh,
            Err(e) => {
                tracing::debug!("not linked into the registry: {}: {e}", blob.digest);
                false
            }
        }
    });
    linked.count()
}

/// Where docker-registry's filesystem driver under `storage` keeps the blob `digest`
/// (`sha256:` digests only).
pub(super) fn blob_data(storage: &std::path::Path, digest: &str) -> Option<std::path::PathBuf> {
    let hex = digest.strip_prefix("sha256:").filter(|h| h.len() > 2)?;
    let folder = storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2]);
    Some(folder.join(hex).join("data"))
}

/// Whether `a` and `b` are one file (hard links to one inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs_err::metadata(a), fs_err::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Puts the DSSE `envelope` (signed provenance) beside the image whose manifest is
/// `subject` (digest and size), as cosign keeps attestations where a registry has no
/// referrers API (distribution 2.8 has none): an OCI manifest at the tag
/// `sha256-<hex>.att` whose one layer is the envelope. Returns the tag.
pub async fn push_attestation(
    address: &str,
    name: &str,
    subject: (&str, usize),
    envelope: &[u8],
) -> Result<String, SeedError> {
    let config = b"{}".to_vec();
    let blob = |bytes: &[u8], media_type: &str| archive::Blob {
        digest: crate::oci::Digest::of(bytes),
        size: bytes.len() as u64,
        media_type: media_type.to_string(),
    };
    let config_blob = blob(&config, archive::CONFIG);
    let envelope_blob = blob(envelope, archive::DSSE_ENVELOPE);
    for (bytes, described) in [(&config[..], &config_blob), (envelope, &envelope_blob)] {
        let digest = described.digest.as_str();
        let head = request(
            address,
            Method::HEAD,
            &format!("/v2/{name}/blobs/{digest}"),
            None,
            empty(),
        )
        .await?;
        if head.status() != StatusCode::OK {
            let body = http_body_util::Full::new(Bytes::from(bytes.to_vec()))
                .map_err(|never| match never {})
                .boxed();
            upload_body(address, name, digest, body).await?;
        }
    }
    let manifest = archive::attestation_manifest(&config_blob, &envelope_blob, subject);
    let tag = format!("{}.att", subject.0.replace(':', "-"));
    let path = format!("/v2/{name}/manifests/{tag}");
    let body = http_body_util::Full::new(Bytes::from(manifest))
        .map_err(|never| match never {})
        .boxed();
    let media_type = "application/vnd.oci.image.manifest.v1+json";
    let answer = request(address, Method::PUT, &path, Some(media_type), body).await?;
    expect(answer, StatusCode::CREATED, &path).await?;
    Ok(tag)
}

/// One blob, in one PUT (the registry's monolithic upload), streamed from the store.
async fn upload(
    address: &str,
    name: &str,
    store: &Arc<LayerStore>,
    blob: &Blob,
) -> Result<(), SeedError> {
    let file_path = store.blob_path(&blob.digest);
    let stream = body_from_writer(None, move |writer| {
        let mut file =
            fs_err::File::open(&file_path).map_err(|e| crate::error::Error::io(&file_path, e))?;
        std::io::copy(&mut file, writer).map_err(|e| crate::error::Error::io(&file_path, e))?;
        Ok(())
    });
    let frames = stream.map(|chunk| Ok::<_, std::io::Error>(hyper::body::Frame::data(chunk)));
    let body = BodyExt::boxed(http_body_util::StreamBody::new(frames));
    upload_body(address, name, blob.digest.as_ref(), body).await
}

/// `body` as the blob `digest`: an upload started, then one PUT to where the registry says.
async fn upload_body(address: &str, name: &str, digest: &str, body: Body) -> Result<(), SeedError> {
    let path = format!("/v2/{name}/blobs/uploads/");
    let started = request(address, Method::POST, &path, None, empty()).await?;
    let location = started
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_string);
    expect(started, StatusCode::ACCEPTED, &path).await?;
    let location = location.ok_or(SeedError::NoLocation)?;
    // Absolute (`http://host:port/v2/...`) or a path: the path is what is asked for.
    let location = match location.find("/v2/") {
        Some(at) => location[at..].to_string(),
        None => location,
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let put = format!("{location}{separator}digest={digest}");
    let answer = request(
        address,
        Method::PUT,
        &put,
        Some("application/octet-stream"),
        body,
    )
    .await?;
    expect(answer, StatusCode::CREATED, &put).await
}

fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}

/// One request on a connection of its own.
async fn request(
    address: &str,
    method: Method,
    path: &str,
    content_type: Option<&str>,
    body: Body,
) -> Result<hyper::Response<hyper::body::Incoming>, SeedError> {
    let shown = path.split('?').next().unwrap_or(path);
    let what = format!("{method} {shown} at {address}");
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|source| SeedError::Connect {
            what: what.clone(),
            source,
        })?;
    let http = |source| SeedError::Http {
        what: what.clone(),
        source,
    };
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(http)?;
    tokio::spawn(connection);
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, address);
    if let Some(content_type) = content_type {
        builder = builder.header(hyper::header::CONTENT_TYPE, content_type);
    }
    let request = builder.body(body).map_err(|source| SeedError::Request {
        what: what.clone(),
        source,
    })?;
    sender.send_request(request).await.map_err(http)
}

/// `Ok` if `answer` has the `status`, else the registry's words.
async fn expect(
    answer: hyper::Response<hyper::body::Incoming>,
    status: StatusCode,
    path: &str,
) -> Result<(), SeedError> {
    if answer.status() == status {
        return Ok(());
    }
    let got = answer.status();
    let body = answer.into_body().collect().await.map(|b| b.to_bytes());
    let text = body
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    Err(SeedError::Answered {
        status: got,
        // Without the query: an upload's carries the registry's whole `_state` token.
        path: path.split('?').next().unwrap_or(path).to_string(),
        words: text.trim().to_string(),
    })
}
