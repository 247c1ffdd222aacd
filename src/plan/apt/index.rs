//! Indexes: each source's signed `InRelease` (checked with `gpgv` against the image's keys) and
//! its `Packages` index, downloaded (or from the snapshot archive for a date), read into one
//! `Index` of candidates.

use super::*;

/// One package an index offers.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) architecture: String,
    pub(super) depends: String,
    pub(super) provides: Vec<Alternative>,
    pub(super) archive: String,
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) sha256: String,
    pub(super) snapshot: Option<String>,
}

/// Every package the sources offer for one architecture, by name, and who provides what.
#[derive(Debug, Default)]
pub struct Index {
    pub(super) packages: BTreeMap<String, Vec<Candidate>>,
    pub(super) providers: BTreeMap<String, BTreeSet<String>>,
    /// What was asked, for messages: `URI SUITE` each.
    pub(super) sources: Vec<String>,
}

/// HTTP with deadlines: connecting and the answer's head within the answer timeout
/// (`HALLMARK_ANSWER_TIMEOUT`, 60 s), the whole body within the stall timeout
/// (`HALLMARK_STALL_TIMEOUT`, 600 s). Proxies as the environment sets them.
pub(super) fn agent() -> ureq::Agent {
    let answer = crate::engine::answer_timeout();
    // The system's certificate authorities (a company proxy or an internal mirror adds its
    // own there), not only the ones built into the TLS library.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(answer))
        .timeout_recv_response(Some(answer))
        .timeout_recv_body(Some(crate::engine::stall::stall_timeout()))
        .http_status_as_error(false)
        .build()
        .into()
}

/// Why a download failed: the server's answer (it said no: [`Failed::answered`]), or no
/// answer (the network). `url` is shown redacted.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error("{url}: the server answered {status}")]
    Status {
        url: String,
        status: ureq::http::StatusCode,
    },
    #[error("{url}: longer than the {limit} bytes expected")]
    TooLong { url: String, limit: u64 },
    #[error("{url}: {error}")]
    Unreached { url: String, error: ureq::Error },
    #[error("{url}: {error}")]
    Read { url: String, error: std::io::Error },
    #[error("writing what {url} sent: {error}")]
    Write { url: String, error: std::io::Error },
}

impl Failed {
    /// Whether the server answered, and said no (else the network failed, or the disk).
    pub(super) fn answered(&self) -> bool {
        matches!(self, Failed::Status { .. } | Failed::TooLong { .. })
    }
}

/// Downloads `url` into `out`, at most `limit` bytes; returns the sha256 and length.
pub(super) fn download_into(
    agent: &ureq::Agent,
    url: &str,
    limit: u64,
    out: &mut dyn std::io::Write,
) -> std::result::Result<(String, u64), Failed> {
    use sha2::Digest as _;
    let shown = crate::inputs::values::redact_url(url);
    let mut answer = agent.get(url).call().map_err(|error| Failed::Unreached {
        url: shown.clone(),
        error,
    })?;
    let status = answer.status();
    if !status.is_success() {
        return Err(Failed::Status { url: shown, status });
    }
    let mut reader = answer.body_mut().as_reader().take(limit + 1);
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut length = 0u64;
    loop {
        let read = reader.read(&mut buffer).map_err(|error| Failed::Read {
            url: shown.clone(),
            error,
        })?;
        if read == 0 {
            break;
        }
        length += read as u64;
        if length > limit {
            return Err(Failed::TooLong { url: shown, limit });
        }
        hasher.update(&buffer[..read]);
        out.write_all(&buffer[..read])
            .map_err(|error| Failed::Write {
                url: shown.clone(),
                error,
            })?;
    }
    Ok((hex::encode(hasher.finalize()), length))
}

/// Downloads `url`, at most `limit` bytes, into memory (indexes: megabytes).
pub(super) fn download(
    agent: &ureq::Agent,
    url: &str,
    limit: u64,
) -> std::result::Result<Vec<u8>, Failed> {
    let mut bytes = Vec::new();
    download_into(agent, url, limit, &mut bytes)?;
    Ok(bytes)
}

/// Verifies a clearsigned `InRelease` with `gpgv` against `keyrings` and returns the text
/// that was signed (only that is read: text around a signature is nobody's word).
pub(super) fn verified_release(
    inrelease: &[u8],
    keyrings: &[(&str, &[u8])],
    url: &str,
) -> std::result::Result<String, AptError> {
    if keyrings.is_empty() {
        return Err(AptError::NoKey { url: url.into() });
    }
    let dir = tempfile::tempdir().map_err(AptError::Io)?;
    let mut command = std::process::Command::new("gpgv");
    for (index, (path, bytes)) in keyrings.iter().enumerate() {
        let binary = if bytes.starts_with(b"-----BEGIN PGP") {
            dearmor(bytes).ok_or_else(|| AptError::NotArmored {
                path: path.to_string(),
            })?
        } else {
            bytes.to_vec()
        };
        let file = dir.path().join(format!("keyring-{index}.gpg"));
        fs_err::write(&file, binary).map_err(AptError::Io)?;
        command.arg("--keyring").arg(file);
    }
    let signed = dir.path().join("InRelease");
    let out = dir.path().join("Release");
    fs_err::write(&signed, inrelease).map_err(AptError::Io)?;
    let output = command
        .arg("--output")
        .arg(&out)
        .arg(&signed)
        .env("LC_ALL", "C")
        .output()
        .map_err(AptError::Gpgv)?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        return Err(AptError::Unverified {
            url: url.into(),
            said: said.trim().to_string(),
        });
    }
    fs_err::read_to_string(&out).map_err(AptError::Io)
}

/// The binary key of an ASCII-armored one (`.asc`): the base64 between the armor lines,
/// without the headers and the CRC line. By hand: it is eight lines, and base64 is here.
pub(super) fn dearmor(text: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let text = std::str::from_utf8(text).ok()?;
    let body = text.split("-----").nth(2)?;
    let body = body.split_once("\n\n").map_or(body, |(_, b)| b);
    let data: String = body
        .lines()
        .filter(|l| !l.starts_with('='))
        .flat_map(|l| l.trim().chars())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

/// Debian's snapshot archive as of a `Release` date, for Debian's own archives.
pub(super) fn snapshot_of(uri: &str, date: &str) -> Option<String> {
    let archive = uri.rsplit('/').next()?;
    let debian = ["deb.debian.org", "ftp.debian.org", "security.debian.org"]
        .iter()
        .any(|host| uri.contains(&format!("://{host}/")));
    if !debian || !matches!(archive, "debian" | "debian-security") {
        return None;
    }
    // "Sat, 11 Jul 2026 10:16:37 UTC"
    let words: Vec<&str> = date.split_whitespace().collect();
    let [_, day, month, year, time, _] = words.as_slice() else {
        return None;
    };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)?
        + 1;
    let time = time.replace(':', "");
    Some(format!(
        "https://snapshot.debian.org/archive/{archive}/{year}{month:02}{:0>2}T{time}Z/",
        day
    ))
}

/// One index file the signed `Release` names (`sha`, `size`, `path` below `base`), from the
/// cache or the archive (by hash where it offers that), checked, decompressed.
pub(super) fn fetch_index(
    agent: &ureq::Agent,
    cache: &Path,
    base: &str,
    by_hash: bool,
    sha: &str,
    size: u64,
    path: &str,
) -> std::result::Result<String, AptError> {
    let kept = cache.join("apt/indexes").join(sha);
    let bytes = match fs_err::read(&kept) {
        Ok(bytes) if sha256_hex(&bytes) == sha => bytes,
        _ => {
            let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
            let url = match by_hash {
                true => format!("{base}/{dir}/by-hash/SHA256/{sha}"),
                false => format!("{base}/{path}"),
            };
            let bytes = download(agent, &url, size)?;
            if sha256_hex(&bytes) != sha {
                return Err(AptError::OtherIndex { url });
            }
            crate::images::store::mark_cache(cache);
            crate::images::store::write_atomically(&kept, &bytes)
                .map_err(|e| AptError::Keep(Box::new(e)))?;
            bytes
        }
    };
    let url = || format!("{base}/{path}");
    let mut text = Vec::new();
    match path.rsplit('.').next() {
        Some("xz") => lzma_rs::xz_decompress(&mut bytes.as_slice(), &mut text)
            .map_err(|error| AptError::Xz { url: url(), error })?,
        Some("gz") => {
            flate2::read::GzDecoder::new(bytes.as_slice())
                .read_to_end(&mut text)
                .map_err(|error| AptError::Gzip { url: url(), error })?;
        }
        _ => text = bytes,
    }
    String::from_utf8(text).map_err(|_| AptError::NotUtf8 { url: url() })
}

impl Index {
    /// Reads every source's signed index for `system`'s architecture; indexes are kept in
    /// `cache` by sha256, so a second lock reads only the `InRelease` files.
    pub fn load(system: &System, cache: &Path) -> std::result::Result<Index, AptError> {
        let agent = agent();
        let mut index = Index::default();
        let arch = system.architecture.as_str();
        for source in &system.sources {
            if source.suite.ends_with('/') {
                return Err(AptError::Flat {
                    uri: source.uri.clone(),
                    suite: source.suite.clone(),
                });
            }
            let redacted = crate::inputs::values::redact_url(&source.uri);
            if redacted != source.uri {
                return Err(AptError::Credentials {
                    uri: redacted,
                    suite: source.suite.clone(),
                });
            }
            let base = format!("{}/dists/{}", source.uri, source.suite);
            index
                .sources
                .push(format!("{} {}", source.uri, source.suite));
            let url = format!("{base}/InRelease");
            let signed = download(&agent, &url, 64 << 20)?;
            let release = verified_release(&signed, &system.keyrings(source), &url)?;
            let release = paragraphs(&release)
                .next()
                .ok_or_else(|| AptError::EmptyRelease { url: url.clone() })?;
            let date = release.get("Date").cloned().unwrap_or_default();
            let by_hash = release.get("Acquire-By-Hash").is_some_and(|v| v == "yes");
            let hashes = release.get("SHA256").cloned().unwrap_or_default();
            let snapshot = snapshot_of(&source.uri, &date);
            for component in &source.components {
                let wanted = |name: &str| format!("{component}/binary-{arch}/{name}");
                // What the signed text lists, smallest first: an archive may list the
                // uncompressed index without serving it (Debian's updates and security).
                let listed: Vec<(String, u64, String)> = ["Packages.xz", "Packages.gz", "Packages"]
                    .iter()
                    .filter_map(|name| {
                        hashes.lines().find_map(|line| {
                            let mut parts = line.split_whitespace();
                            let (sha, size, path) = (parts.next()?, parts.next()?, parts.next()?);
                            (path == wanted(name))
                                .then(|| {
                                    Some((
                                        sha.to_string(),
                                        size.parse::<u64>().ok()?,
                                        path.to_string(),
                                    ))
                                })
                                .flatten()
                        })
                    })
                    .collect();
                if listed.is_empty() {
                    return Err(AptError::NoIndex {
                        url: url.clone(),
                        wanted: wanted("Packages"),
                        architectures: release
                            .get("Architectures")
                            .map_or("?", String::as_str)
                            .to_string(),
                    });
                }
                let mut failures = Vec::new();
                let mut read = None;
                for (sha, size, path) in &listed {
                    match fetch_index(&agent, cache, &base, by_hash, sha, *size, path) {
                        Ok(text) => {
                            read = Some(text);
                            break;
                        }
                        Err(e) => failures.push(e),
                    }
                }
                let text = read.ok_or(AptError::Indexes(failures))?;
                index.add(&text, source, snapshot.as_deref(), arch)?;
            }
        }
        Ok(index)
    }

    pub(super) fn add(
        &mut self,
        text: &str,
        source: &Source,
        snapshot: Option<&str>,
        arch: &str,
    ) -> std::result::Result<(), AptError> {
        for paragraph in paragraphs(text) {
            let field = |name: &str| paragraph.get(name).cloned().unwrap_or_default();
            let architecture = field("Architecture");
            if architecture != arch && architecture != "all" {
                continue;
            }
            let name = field("Package");
            let depends = [field("Pre-Depends"), field("Depends")]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
            let candidate = Candidate {
                provides: provides(&paragraph).map_err(|reason| AptError::Provides {
                    name: name.clone(),
                    reason,
                })?,
                version: field("Version"),
                architecture,
                depends,
                archive: source.uri.clone(),
                path: field("Filename"),
                size: field("Size").parse().unwrap_or(0),
                sha256: field("SHA256"),
                snapshot: snapshot.map(str::to_string),
                name: name.clone(),
            };
            if candidate.path.is_empty() || candidate.sha256.len() != 64 {
                continue;
            }
            for provided in &candidate.provides {
                self.providers
                    .entry(provided.name.clone())
                    .or_default()
                    .insert(name.clone());
            }
            self.packages.entry(name).or_default().push(candidate);
        }
        Ok(())
    }

    /// The highest version of `name` that `allows` accepts.
    pub(super) fn best(&self, name: &str, allows: impl Fn(&str) -> bool) -> Option<&Candidate> {
        self.packages
            .get(name)?
            .iter()
            .filter(|c| allows(&c.version))
            .max_by(|a, b| version(&a.version).cmp(&version(&b.version)))
    }
}

pub(super) fn version(text: &str) -> Option<Version> {
    text.parse().ok()
}
