//! System packages locked like every other input: `hallmark lock` reads, from the image the
//! packages go into, its apt sources, the keys it trusts and what dpkg has installed; asks
//! each source's archive for its signed index (`InRelease`, checked with `gpgv` against those
//! keys, as apt checks it); resolves the packages the spec names and everything they need
//! that the image lacks; and pins each by archive path, size and sha256. The build gets the
//! pinned files from the layer store (`debs/`, fetched and checked here) and installs them
//! with the network off, so the label's promise holds for them too.
//!
//! The resolver is apt's default choice made plain: for each dependency not met by what is
//! installed or already chosen, the first alternative that some package (or, failing that,
//! a provider) satisfies, at its highest version across the sources. Recommends are left
//! out (the build installs with `--no-install-recommends`). Conflicts are not solved here:
//! apt refuses such a set at the build, naming the packages.
//!
//! `gpgv` and not an OpenPGP crate: it is what apt itself runs on these signatures (the
//! keyrings are the image's own), it is on every Debian host, and a pure-Rust OpenPGP stack
//! is a large dependency for one verification per index.

use crate::error::{Error, Result};
use crate::images::store::LayerStore;
use crate::inputs::apt::{Alternative, Paragraph, Requested, paragraphs, relations};
use crate::inputs::pins::AptPin;
use crate::inputs::values::Sha256Hex;
use crate::plan::checksum::{sha256_hex, sha256_reader};
use debversion::Version;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The files `lock` reads from the image packages go into: apt's sources and trusted keys,
/// and dpkg's record of what is installed.
pub const SYSTEM_PATHS: &[&str] = &["/etc/apt", "/usr/share/keyrings", "/var/lib/dpkg/status"];

/// An apt source: `deb URI SUITE COMPONENT...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub uri: String,
    pub suite: String,
    pub components: Vec<String>,
    /// A keyring file that alone may sign this source (`signed-by`).
    pub signed_by: Option<String>,
}

/// A package dpkg records as installed, and what it provides.
#[derive(Debug, Clone)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub provides: Vec<Alternative>,
    /// Its `Pre-Depends` and `Depends`, as dpkg recorded them.
    pub depends: String,
}

/// What an image's own files say about its packages.
#[derive(Debug, Clone)]
pub struct System {
    pub architecture: String,
    pub sources: Vec<Source>,
    pub installed: Vec<Installed>,
    /// Keyring files by their path in the image.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl System {
    /// Reads `files` (by path in the image: [`SYSTEM_PATHS`] and what is under them).
    pub fn from_files(
        architecture: &str,
        files: BTreeMap<String, Vec<u8>>,
    ) -> std::result::Result<System, String> {
        let text = |path: &str| {
            files
                .get(path)
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        let mut sources = Vec::new();
        for (path, bytes) in &files {
            let body = String::from_utf8_lossy(bytes);
            if path == "/etc/apt/sources.list"
                || (path.starts_with("/etc/apt/sources.list.d/") && path.ends_with(".list"))
            {
                sources.extend(one_line_sources(&body).map_err(|e| format!("{path}: {e}"))?);
            } else if path.starts_with("/etc/apt/sources.list.d/") && path.ends_with(".sources") {
                sources.extend(deb822_sources(&body).map_err(|e| format!("{path}: {e}"))?);
            }
        }
        if sources.is_empty() {
            return Err(
                "it has no apt source (no `deb` line in /etc/apt/sources.list or sources.list.d/)"
                    .into(),
            );
        }
        let status = text("/var/lib/dpkg/status")
            .ok_or("it has no /var/lib/dpkg/status: not a Debian-based image")?;
        let mut installed = Vec::new();
        for paragraph in paragraphs(&status) {
            let is_installed = paragraph
                .get("Status")
                .is_some_and(|s| s.ends_with(" installed"));
            let (Some(name), Some(version)) = (paragraph.get("Package"), paragraph.get("Version"))
            else {
                continue;
            };
            if !is_installed {
                continue;
            }
            let depends = ["Pre-Depends", "Depends"]
                .iter()
                .filter_map(|f| paragraph.get(f))
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            installed.push(Installed {
                depends,
                name: name.clone(),
                version: version.clone(),
                provides: provides(&paragraph)
                    .map_err(|e| format!("/var/lib/dpkg/status, package {name}: {e}"))?,
            });
        }
        Ok(System {
            architecture: architecture.to_string(),
            sources,
            installed,
            files,
        })
    }

    /// The keyrings that may sign `source`: its `signed-by` file, else every key apt trusts.
    fn keyrings(&self, source: &Source) -> Vec<(&str, &[u8])> {
        let trusted = |path: &str| match &source.signed_by {
            Some(signed_by) => path == signed_by,
            None => {
                path == "/etc/apt/trusted.gpg"
                    || (path.starts_with("/etc/apt/trusted.gpg.d/")
                        && (path.ends_with(".gpg") || path.ends_with(".asc")))
            }
        };
        self.files
            .iter()
            .filter(|(path, _)| trusted(path))
            .map(|(path, bytes)| (path.as_str(), bytes.as_slice()))
            .collect()
    }
}

fn provides(paragraph: &Paragraph<'_>) -> std::result::Result<Vec<Alternative>, String> {
    Ok(
        relations(paragraph.get("Provides").map_or("", String::as_str))?
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// `deb [options] URI SUITE COMPONENT...` lines (`deb-src` and comments skipped).
fn one_line_sources(text: &str) -> std::result::Result<Vec<Source>, String> {
    let mut sources = Vec::new();
    for line in text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
    {
        let Some(rest) = line.strip_prefix("deb ") else {
            continue;
        };
        let mut rest = rest.trim();
        let mut signed_by = None;
        if let Some(options) = rest.strip_prefix('[') {
            let (options, after) = options
                .split_once(']')
                .ok_or_else(|| format!("`{line}`: no closing ]"))?;
            for option in options.split_whitespace() {
                if let Some(path) = option.strip_prefix("signed-by=") {
                    signed_by = Some(path.to_string());
                }
            }
            rest = after.trim();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            return Err(format!("`{line}`: a source needs a URI and a suite"));
        };
        sources.push(Source {
            uri: uri.trim_end_matches('/').to_string(),
            suite: suite.to_string(),
            components: words.map(str::to_string).collect(),
            signed_by,
        });
    }
    Ok(sources)
}

/// deb822 `.sources` files: `Types`, `URIs`, `Suites`, `Components`, `Signed-By`.
fn deb822_sources(text: &str) -> std::result::Result<Vec<Source>, String> {
    let mut sources = Vec::new();
    for paragraph in paragraphs(text) {
        let words = |field: &str| -> Vec<String> {
            paragraph
                .get(field)
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default()
        };
        if !words("Types").iter().any(|t| t == "deb")
            || paragraph.get("Enabled").is_some_and(|v| v == "no")
        {
            continue;
        }
        let signed_by = paragraph
            .get("Signed-By")
            .filter(|v| v.starts_with('/'))
            .cloned();
        for uri in words("URIs") {
            for suite in words("Suites") {
                sources.push(Source {
                    uri: uri.trim_end_matches('/').to_string(),
                    suite,
                    components: words("Components"),
                    signed_by: signed_by.clone(),
                });
            }
        }
    }
    Ok(sources)
}

/// One package an index offers.
#[derive(Debug, Clone)]
struct Candidate {
    name: String,
    version: String,
    architecture: String,
    depends: String,
    provides: Vec<Alternative>,
    archive: String,
    path: String,
    size: u64,
    sha256: String,
    snapshot: Option<String>,
}

/// Every package the sources offer for one architecture, by name, and who provides what.
#[derive(Debug, Default)]
pub struct Index {
    packages: BTreeMap<String, Vec<Candidate>>,
    providers: BTreeMap<String, BTreeSet<String>>,
    /// What was asked, for messages: `URI SUITE` each.
    sources: Vec<String>,
}

/// HTTP with deadlines: connecting and the answer's head within the answer timeout
/// (`HALLMARK_ANSWER_TIMEOUT`, 60 s), the whole body within the stall timeout
/// (`HALLMARK_STALL_TIMEOUT`, 600 s). Proxies as the environment sets them.
fn agent() -> ureq::Agent {
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

/// Why a download failed: the server's answer (it said no), or no answer (the network).
enum Failed {
    Answered(String),
    Unreached(String),
}

impl Failed {
    fn text(self) -> String {
        match self {
            Failed::Answered(text) | Failed::Unreached(text) => text,
        }
    }
}

/// Downloads `url` into `out`, at most `limit` bytes; returns the sha256 and length.
fn download_into(
    agent: &ureq::Agent,
    url: &str,
    limit: u64,
    out: &mut dyn std::io::Write,
) -> std::result::Result<(String, u64), Failed> {
    use sha2::Digest as _;
    let shown = crate::inputs::values::redact_url(url);
    let mut answer = agent
        .get(url)
        .call()
        .map_err(|e| Failed::Unreached(format!("{shown}: {e}")))?;
    let status = answer.status();
    if !status.is_success() {
        return Err(Failed::Answered(format!(
            "{shown}: the server answered {status}"
        )));
    }
    let mut reader = answer.body_mut().as_reader().take(limit + 1);
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut length = 0u64;
    loop {
        let read = reader
            .read(&mut buffer)
            .map_err(|e| Failed::Unreached(format!("{shown}: {e}")))?;
        if read == 0 {
            break;
        }
        length += read as u64;
        if length > limit {
            return Err(Failed::Answered(format!(
                "{shown}: longer than the {limit} bytes expected"
            )));
        }
        hasher.update(&buffer[..read]);
        out.write_all(&buffer[..read])
            .map_err(|e| Failed::Unreached(format!("writing what {shown} sent: {e}")))?;
    }
    Ok((hex::encode(hasher.finalize()), length))
}

/// Downloads `url`, at most `limit` bytes, into memory (indexes: megabytes).
fn download(agent: &ureq::Agent, url: &str, limit: u64) -> std::result::Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    download_into(agent, url, limit, &mut bytes).map_err(Failed::text)?;
    Ok(bytes)
}

/// Verifies a clearsigned `InRelease` with `gpgv` against `keyrings` and returns the text
/// that was signed (only that is read: text around a signature is nobody's word).
fn verified_release(
    inrelease: &[u8],
    keyrings: &[(&str, &[u8])],
    url: &str,
) -> std::result::Result<String, String> {
    if keyrings.is_empty() {
        return Err(format!(
            "{url}: the image trusts no key for this source (no /etc/apt/trusted.gpg.d/ keyring, no signed-by file)"
        ));
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut command = std::process::Command::new("gpgv");
    for (index, (path, bytes)) in keyrings.iter().enumerate() {
        let binary = if bytes.starts_with(b"-----BEGIN PGP") {
            dearmor(bytes).ok_or_else(|| format!("{path}: not an armored key"))?
        } else {
            bytes.to_vec()
        };
        let file = dir.path().join(format!("keyring-{index}.gpg"));
        fs_err::write(&file, binary).map_err(|e| e.to_string())?;
        command.arg("--keyring").arg(file);
    }
    let signed = dir.path().join("InRelease");
    let out = dir.path().join("Release");
    fs_err::write(&signed, inrelease).map_err(|e| e.to_string())?;
    let output = command
        .arg("--output")
        .arg(&out)
        .arg(&signed)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| format!("running gpgv (Debian's gpgv package): {e}"))?;
    if !output.status.success() {
        let said = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{url}: the signature does not verify against the keys the image trusts: {}",
            said.trim()
        ));
    }
    fs_err::read_to_string(&out).map_err(|e| e.to_string())
}

/// The binary key of an ASCII-armored one (`.asc`): the base64 between the armor lines,
/// without the headers and the CRC line. By hand: it is eight lines, and base64 is here.
fn dearmor(text: &[u8]) -> Option<Vec<u8>> {
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
fn snapshot_of(uri: &str, date: &str) -> Option<String> {
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
fn fetch_index(
    agent: &ureq::Agent,
    cache: &Path,
    base: &str,
    by_hash: bool,
    sha: &str,
    size: u64,
    path: &str,
) -> std::result::Result<String, String> {
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
                return Err(format!(
                    "{url}: not the index the signed InRelease names (sha256 differs)"
                ));
            }
            crate::images::store::mark_cache(cache);
            crate::images::store::write_atomically(&kept, &bytes).map_err(|e| e.to_string())?;
            bytes
        }
    };
    let mut text = Vec::new();
    let decoded = match path.rsplit('.').next() {
        Some("xz") => {
            lzma_rs::xz_decompress(&mut bytes.as_slice(), &mut text).map_err(|e| e.to_string())
        }
        Some("gz") => flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut text)
            .map(drop)
            .map_err(|e| e.to_string()),
        _ => {
            text = bytes;
            Ok(())
        }
    };
    decoded.map_err(|e| format!("{base}/{path}: {e}"))?;
    String::from_utf8(text).map_err(|_| format!("{base}/{path}: not UTF-8 text"))
}

impl Index {
    /// Reads every source's signed index for `system`'s architecture; indexes are kept in
    /// `cache` by sha256, so a second lock reads only the `InRelease` files.
    pub fn load(system: &System, cache: &Path) -> std::result::Result<Index, String> {
        let agent = agent();
        let mut index = Index::default();
        let arch = system.architecture.as_str();
        for source in &system.sources {
            if source.suite.ends_with('/') {
                return Err(format!(
                    "{} {}: flat repositories are not supported",
                    source.uri, source.suite
                ));
            }
            if crate::inputs::values::redact_url(&source.uri) != source.uri {
                return Err(format!(
                    "{} {}: the source's address carries credentials; hallmark writes archive addresses into pins (reviewed in git) and does not read apt's auth.conf: a source that needs them is not supported",
                    crate::inputs::values::redact_url(&source.uri),
                    source.suite
                ));
            }
            let base = format!("{}/dists/{}", source.uri, source.suite);
            index
                .sources
                .push(format!("{} {}", source.uri, source.suite));
            let url = format!("{base}/InRelease");
            let signed = download(&agent, &url, 64 << 20)?;
            let release = verified_release(&signed, &system.keyrings(source), &url)?;
            let release = paragraphs(&release).next().ok_or(format!("{url}: empty"))?;
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
                    return Err(format!(
                        "{url}: the archive has no {} index (its architectures: {})",
                        wanted("Packages"),
                        release.get("Architectures").map_or("?", String::as_str)
                    ));
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
                let text = read.ok_or_else(|| failures.join("; "))?;
                index.add(&text, source, snapshot.as_deref(), arch)?;
            }
        }
        Ok(index)
    }

    fn add(
        &mut self,
        text: &str,
        source: &Source,
        snapshot: Option<&str>,
        arch: &str,
    ) -> std::result::Result<(), String> {
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
                provides: provides(&paragraph).map_err(|e| format!("package {name}: {e}"))?,
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
    fn best(&self, name: &str, allows: impl Fn(&str) -> bool) -> Option<&Candidate> {
        self.packages
            .get(name)?
            .iter()
            .filter(|c| allows(&c.version))
            .max_by(|a, b| version(&a.version).cmp(&version(&b.version)))
    }
}

fn version(text: &str) -> Option<Version> {
    text.parse().ok()
}

/// Resolves `requested` against `index` for what `system` has installed: the packages to
/// pin, sorted by name. An error names the package that cannot be had and why.
pub fn resolve(
    system: &System,
    index: &Index,
    requested: &[Requested],
) -> std::result::Result<Vec<AptPin>, String> {
    let mut chosen: BTreeMap<String, (Candidate, bool)> = BTreeMap::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    let sources = index.sources.join(", ");
    for wanted in requested {
        if let Some(arch) = wanted.arch.as_ref().filter(|a| **a != system.architecture) {
            return Err(format!(
                "`{}:{arch}`: hallmark pins the packages of the image's own architecture ({}); another architecture's is not supported",
                wanted.name, system.architecture
            ));
        }
        let candidate = index
            .best(&wanted.name, |v| {
                wanted.version.as_deref().is_none_or(|w| w == v)
            })
            .ok_or_else(|| match &wanted.version {
                Some(version) => format!(
                    "no package `{}` at version {version} for {} in {sources}",
                    wanted.name, system.architecture
                ),
                None => format!(
                    "no package `{}` for {} in {sources}",
                    wanted.name, system.architecture
                ),
            })?;
        chosen.insert(wanted.name.clone(), (candidate.clone(), true));
        queue.push_back(wanted.name.clone());
    }
    loop {
        drain(system, index, &sources, &mut chosen, &mut queue)?;
        // What is chosen replaces what the image has of the same name: an installed package
        // that needs the old version exactly (`libfoo-dev (= 1.2-3)`) must move with it, and
        // nothing may move back (apt refuses both, at the build, after the lock said yes).
        let mut moved = Vec::new();
        for (name, (candidate, _)) in &chosen {
            let Some(installed) = system.installed.iter().find(|i| &i.name == name) else {
                continue;
            };
            if version(&candidate.version) < version(&installed.version) {
                return Err(format!(
                    "{name} {} would replace the image's newer {name} {}: the image's apt sources ({sources}) do not offer what it has installed (add the suite it came from, such as the security or updates suite, to its sources)",
                    candidate.version, installed.version
                ));
            }
            for user in system
                .installed
                .iter()
                .filter(|u| !chosen.contains_key(&u.name))
            {
                let needs = relations(&user.depends).unwrap_or_default();
                let broken = needs.iter().any(|dependency| {
                    dependency.iter().any(|alt| &alt.name == name)
                        && !dependency.iter().any(|alt| {
                            &alt.name == name
                                && alt
                                    .constraint
                                    .as_ref()
                                    .is_none_or(|c| c.allows(&candidate.version))
                        })
                        && !satisfied(system, &chosen, dependency)
                });
                if broken {
                    moved.push((user.name.clone(), name.clone(), candidate.version.clone()));
                }
            }
        }
        if moved.is_empty() {
            break;
        }
        for (user, because, to) in moved {
            let installed = system
                .installed
                .iter()
                .find(|i| i.name == user)
                .expect("found above");
            let newer = index
                .best(&user, |v| version(v) > version(&installed.version))
                .ok_or_else(|| {
                    format!(
                        "{because} {to} breaks the image's {user} {}, which needs another {because}, and {sources} has no newer {user}",
                        installed.version
                    )
                })?;
            chosen.insert(user.clone(), (newer.clone(), false));
            queue.push_back(user);
        }
    }
    chosen
        .into_values()
        .map(|(c, wanted)| {
            Ok(AptPin {
                stage: None,
                wanted,
                sha256: Sha256Hex::try_from(c.sha256.clone())
                    .map_err(|e| format!("package {}: SHA256: {e}", c.name))?,
                name: c.name,
                version: c.version,
                architecture: c.architecture,
                archive: c.archive,
                path: c.path,
                size: c.size,
                snapshot: c.snapshot,
            })
        })
        .collect()
}

/// Chooses, for each package in `queue`, what its dependencies need that neither the image
/// nor the choice so far has.
fn drain(
    system: &System,
    index: &Index,
    sources: &str,
    chosen: &mut BTreeMap<String, (Candidate, bool)>,
    queue: &mut VecDeque<String>,
) -> std::result::Result<(), String> {
    while let Some(name) = queue.pop_front() {
        let depends = chosen[&name].0.depends.clone();
        let dependencies =
            relations(&depends).map_err(|e| format!("package {name}: Depends: {e}"))?;
        for dependency in dependencies {
            if satisfied(system, chosen, &dependency) {
                continue;
            }
            let pick = dependency.iter().find_map(|alt| {
                let allows = |v: &str| alt.constraint.as_ref().is_none_or(|c| c.allows(v));
                index.best(&alt.name, allows).or_else(|| {
                    index.providers.get(&alt.name)?.iter().find_map(|provider| {
                        index.best(provider, |_| true).filter(|c| {
                            c.provides
                                .iter()
                                .any(|p| p.name == alt.name && provided_allows(p, alt))
                        })
                    })
                })
            });
            let Some(pick) = pick else {
                let wanted: Vec<String> = dependency.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "package {name} needs {}, which neither the image nor {sources} has for {}",
                    wanted.join(" | "),
                    system.architecture
                ));
            };
            queue.push_back(pick.name.clone());
            chosen.insert(pick.name.clone(), (pick.clone(), false));
        }
    }
    Ok(())
}

/// Whether a `Provides` entry meets a dependency: unversioned provides meet only
/// unversioned dependencies (dpkg's rule).
fn provided_allows(provided: &Alternative, wanted: &Alternative) -> bool {
    match (&wanted.constraint, &provided.constraint) {
        (None, _) => true,
        (Some(c), Some(p)) => c.allows(&p.version),
        (Some(_), None) => false,
    }
}

/// Whether the image, with what is chosen so far, meets one dependency (any alternative).
fn satisfied(
    system: &System,
    chosen: &BTreeMap<String, (Candidate, bool)>,
    dependency: &[Alternative],
) -> bool {
    dependency.iter().any(|alt| {
        let allows = |v: &str| alt.constraint.as_ref().is_none_or(|c| c.allows(v));
        let real = match chosen.get(&alt.name) {
            Some((c, _)) => allows(&c.version),
            None => system
                .installed
                .iter()
                .any(|i| i.name == alt.name && allows(&i.version)),
        };
        let provided = chosen
            .values()
            .flat_map(|(c, _)| &c.provides)
            .chain(system.installed.iter().flat_map(|i| &i.provides))
            .any(|p| p.name == alt.name && provided_allows(p, alt));
        real || provided
    })
}

/// Where the layer store keeps a package file: by its sha256, shared by every project.
pub fn deb_path(store: &LayerStore, sha256: &Sha256Hex) -> PathBuf {
    store.root.join("debs").join(sha256.as_str())
}

/// What a package file's own control data says it is (`Package`, `Version`, `Architecture`
/// of `control.tar.*` in the `.deb`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub package: String,
    pub version: String,
    pub architecture: String,
}

/// Reads the control data of the `.deb` at `path`: an `ar` archive whose `control.tar` is
/// plain, gzip or xz (what Debian writes; zstd, which Ubuntu writes, is not read here).
pub fn control_of(path: &Path) -> std::result::Result<Control, String> {
    let bytes = fs_err::read(path).map_err(|e| e.to_string())?;
    control_of_bytes(&bytes)
}

fn control_of_bytes(bytes: &[u8]) -> std::result::Result<Control, String> {
    let mut rest = bytes
        .strip_prefix(b"!<arch>\n")
        .ok_or("not a Debian package (no ar archive)")?;
    while rest.len() >= 60 {
        let (header, body) = rest.split_at(60);
        let name = String::from_utf8_lossy(&header[..16]);
        let name = name.trim_end().trim_end_matches('/');
        let size: usize = String::from_utf8_lossy(&header[48..58])
            .trim()
            .parse()
            .map_err(|_| "a damaged ar header")?;
        let member = body.get(..size).ok_or("a truncated ar member")?;
        if let Some(compression) = name.strip_prefix("control.tar") {
            let mut tar = Vec::new();
            match compression {
                "" => tar.extend_from_slice(member),
                ".gz" => {
                    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(member), &mut tar)
                        .map_err(|e| format!("{name}: {e}"))?;
                }
                ".xz" => lzma_rs::xz_decompress(&mut &member[..], &mut tar)
                    .map_err(|e| format!("{name}: {e}"))?,
                other => {
                    return Err(format!(
                        "its control data is compressed as `{other}`, which hallmark does not read"
                    ));
                }
            }
            return control_in_tar(&tar);
        }
        rest = &body[(size + size % 2).min(body.len())..];
    }
    Err("no control.tar in the package".into())
}

fn control_in_tar(tar: &[u8]) -> std::result::Result<Control, String> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        if path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .eq([std::path::Component::Normal("control".as_ref())])
        {
            let mut text = String::new();
            entry.read_to_string(&mut text).map_err(|e| e.to_string())?;
            let fields = paragraphs(&text).next().ok_or("an empty control file")?;
            let field = |name: &str| {
                fields
                    .get(name)
                    .cloned()
                    .ok_or_else(|| format!("its control file has no `{name}`"))
            };
            return Ok(Control {
                package: field("Package")?,
                version: field("Version")?,
                architecture: field("Architecture")?,
            });
        }
    }
    Err("no control file in control.tar".into())
}

/// What `pin` says and its file's control data says differently: each as `(field, pinned,
/// in the file)`.
pub fn differences(pin: &AptPin, control: &Control) -> Vec<(&'static str, String, String)> {
    [
        ("name", &pin.name, &control.package),
        ("version", &pin.version, &control.version),
        ("architecture", &pin.architecture, &control.architecture),
    ]
    .into_iter()
    .filter(|(_, pinned, file)| pinned != file)
    .map(|(field, pinned, file)| (field, pinned.clone(), file.clone()))
    .collect()
}

/// `pins` with the name, version and architecture their files in the layer store say, where
/// the store holds a file and it can be read (the SBOM and the provenance record what was
/// installed, not what a hand edit wrote); the others as pinned (`check` warns of them).
pub fn from_files(cache: &Path, pins: &mut [AptPin]) {
    for pin in pins {
        if let Ok(control) = control_of(&deb_in_cache(cache, &pin.sha256)) {
            pin.name = control.package;
            pin.version = control.version;
            pin.architecture = control.architecture;
        }
    }
}

/// [`deb_path`] for the layer store of the cache `cache`, without opening the store (its
/// lock, its marks): for reading alone (`check`, `sbom`).
pub fn deb_in_cache(cache: &Path, sha256: &Sha256Hex) -> PathBuf {
    cache.join("store").join("debs").join(sha256.as_str())
}

/// Makes sure the store holds every pinned file with the pinned size and sha256, fetching
/// the missing ones from their archive; returns each pin with its file. A file in the store
/// with other bytes is an error naming the package (it is not fetched again: something
/// changed the store); so is an archive that serves other bytes or no longer has the file.
pub fn ensure_debs<'a>(
    store: &LayerStore,
    image: &str,
    pins: &[&'a AptPin],
) -> Result<Vec<(&'a AptPin, PathBuf)>> {
    let agent = agent();
    let mut files = Vec::new();
    for pin in pins {
        let fail = |message: String, hint: Option<String>| Error::Apt {
            image: image.to_string(),
            package: pin.describe(),
            message,
            hint,
        };
        let path = deb_path(store, &pin.sha256);
        if path.exists() {
            let file = fs_err::File::open(&path).map_err(|e| Error::io(&path, e))?;
            let (sha, size) = sha256_reader(file).map_err(|e| Error::io(&path, e))?;
            if sha != pin.sha256.as_str() || size != pin.size {
                return Err(fail(
                    format!(
                        "{} in the layer store is not the pinned file (sha256 {sha}, {size} bytes; pinned {}, {} bytes)",
                        path.display(),
                        pin.sha256,
                        pin.size
                    ),
                    Some(format!(
                        "remove {} and build again to fetch it from {}",
                        path.display(),
                        pin.archive
                    )),
                ));
            }
            store.mark_debs(pin.sha256.as_str());
            same_as_control(pin, &path).map_err(|m| fail(m, None))?;
            files.push((*pin, path));
            continue;
        }
        let url = format!("{}/{}", pin.archive, pin.path);
        let dir = path.parent().expect("a file in a folder");
        fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
        let (sha, length) = match download_into(&agent, &url, pin.size, &mut file) {
            Ok(done) => done,
            Err(Failed::Answered(message)) => {
                let hint = match &pin.snapshot {
                    Some(snapshot) => format!(
                        "the archive no longer serves it; this version can still be found in Debian's snapshot archive: {snapshot}{}",
                        pin.path
                    ),
                    None => format!(
                        "the archive no longer serves it: `hallmark lock --update {image}` pins what it serves now"
                    ),
                };
                return Err(fail(format!("fetching it: {message}"), Some(hint)));
            }
            Err(Failed::Unreached(message)) => {
                return Err(fail(
                    format!("fetching it: {message}"),
                    Some("the archive could not be reached (no network, a proxy, DNS): the layer store does not hold the file".into()),
                ));
            }
        };
        if sha != pin.sha256.as_str() || length != pin.size {
            return Err(fail(
                format!(
                    "{} answered other bytes than the pinned file (sha256 {sha}, {length} bytes; pinned {}, {} bytes)",
                    crate::inputs::values::redact_url(&url),
                    pin.sha256,
                    pin.size
                ),
                None,
            ));
        }
        crate::images::store::mark_cache(&store.root);
        file.persist(&path).map_err(|e| Error::io(&path, e.error))?;
        store.mark_debs(pin.sha256.as_str());
        same_as_control(pin, &path).map_err(|m| fail(m, None))?;
        files.push((*pin, path));
    }
    Ok(files)
}

/// `Err` naming what differs when the package file at `path` says another name, version or
/// architecture than `pin` (a hand edit of the pins file); a file whose control data cannot
/// be read is taken as pinned (its sha256 is the pinned one).
fn same_as_control(pin: &AptPin, path: &Path) -> std::result::Result<(), String> {
    let Ok(control) = control_of(path) else {
        return Ok(());
    };
    match differences(pin, &control).as_slice() {
        [] => Ok(()),
        found => Err(found
            .iter()
            .map(|(field, pinned, file)| {
                format!(
                    "`{field}` is pinned as {pinned}, the package file's control data says {file}"
                )
            })
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// Why packages could not be pinned: the one package of those asked for that fails on its
/// own (`None`: the indexes could not be read, or the packages fail only together), and why.
pub type Unpinned = (Option<String>, String);

/// The packages `requested` need in `system`, pinned for `stage` (`None`: `[build]`).
pub fn lock_packages(
    system: &System,
    requested: &[String],
    stage: Option<&crate::inputs::values::Name>,
    cache: &Path,
) -> std::result::Result<Vec<AptPin>, Unpinned> {
    let index = Index::load(system, cache).map_err(|e| (None, e))?;
    let mut pins = resolve_naming(system, &index, requested)?;
    for pin in &mut pins {
        pin.stage = stage.cloned();
    }
    Ok(pins)
}

/// [`resolve`] of `requested` as the spec writes them; when they cannot be resolved, each is
/// resolved alone to name the first that fails by itself (an error about `jq nosuch` named
/// both).
pub fn resolve_naming(
    system: &System,
    index: &Index,
    requested: &[String],
) -> std::result::Result<Vec<AptPin>, Unpinned> {
    let parsed: Vec<Requested> = requested.iter().map(|r| Requested::parse(r)).collect();
    let together = match resolve(system, index, &parsed) {
        Ok(pins) => return Ok(pins),
        Err(message) => message,
    };
    if let [one] = requested {
        return Err((Some(one.clone()), together));
    }
    let alone = parsed.iter().zip(requested).find_map(|(wanted, raw)| {
        resolve(system, index, std::slice::from_ref(wanted))
            .err()
            .map(|message| (Some(raw.clone()), message))
    });
    Err(alone.unwrap_or((None, format!("together: {together}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(installed: &[(&str, &str)]) -> System {
        System {
            architecture: "amd64".into(),
            sources: vec![],
            installed: installed
                .iter()
                .map(|(n, v)| Installed {
                    name: n.to_string(),
                    version: v.to_string(),
                    provides: vec![],
                    depends: match *n {
                        "python3.11" => format!("libpython3.11-stdlib (= {v})"),
                        _ => String::new(),
                    },
                })
                .collect(),
            files: BTreeMap::new(),
        }
    }

    fn index(text: &str) -> Index {
        let mut index = Index::default();
        let source = Source {
            uri: "http://deb.debian.org/debian".into(),
            suite: "bookworm".into(),
            components: vec!["main".into()],
            signed_by: None,
        };
        index.add(text, &source, None, "amd64").unwrap();
        index
    }

    const PACKAGES: &str = "\
Package: jq
Version: 1.6-2.1
Architecture: amd64
Depends: libjq1 (= 1.6-2.1), libc6 (>= 2.34)
Filename: pool/main/j/jq/jq_1.6-2.1_amd64.deb
Size: 10
SHA256: 1111111111111111111111111111111111111111111111111111111111111111

Package: libjq1
Version: 1.6-2.1
Architecture: amd64
Depends: libonig5 (>= 6.1.3), libc6 (>= 2.14)
Filename: pool/main/j/jq/libjq1_1.6-2.1_amd64.deb
Size: 20
SHA256: 2222222222222222222222222222222222222222222222222222222222222222

Package: libonig5
Version: 6.9.8-1
Architecture: amd64
Depends: libc6 (>= 2.14)
Filename: pool/main/libo/libonig/libonig5_6.9.8-1_amd64.deb
Size: 30
SHA256: 3333333333333333333333333333333333333333333333333333333333333333

Package: mailer
Version: 1
Architecture: all
Depends: mail-transport-agent | nothing-at-all
Filename: pool/main/m/mailer/mailer_1_all.deb
Size: 1
SHA256: 4444444444444444444444444444444444444444444444444444444444444444

Package: tiny-mta
Version: 2
Architecture: amd64
Provides: mail-transport-agent
Filename: pool/main/t/tiny-mta/tiny-mta_2_amd64.deb
Size: 1
SHA256: 5555555555555555555555555555555555555555555555555555555555555555

Package: other-arch
Version: 1
Architecture: arm64
Filename: pool/main/o/other/other_1_arm64.deb
Size: 1
SHA256: 6666666666666666666666666666666666666666666666666666666666666666
";

    /// A package made by `dpkg-deb` with `compression` (its control.tar's too), in `dir`.
    fn made_deb(dir: &Path, version: &str, compression: &str) -> PathBuf {
        let root = dir.join(format!("pkg-{compression}"));
        std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
        std::fs::create_dir_all(root.join("usr/share/hm")).unwrap();
        std::fs::write(root.join("usr/share/hm/note"), "x\n").unwrap();
        std::fs::write(
            root.join("DEBIAN/control"),
            format!("Package: hm-test\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: a test\n"),
        )
        .unwrap();
        let deb = dir.join(format!("hm-test-{compression}.deb"));
        let made = std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", &format!("-Z{compression}"), "--build"])
            .arg(&root)
            .arg(&deb)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        deb
    }

    /// Issue 42: the version is read from the package file itself, whatever dpkg-deb
    /// compressed its control data with (Debian's xz, gzip, none).
    #[test]
    fn a_package_file_s_control_data_is_read() {
        let dir = tempfile::tempdir().unwrap();
        for compression in ["xz", "gzip", "none"] {
            let deb = made_deb(dir.path(), "1.2-3+deb12u1", compression);
            let control = control_of(&deb).unwrap();
            assert_eq!(
                control,
                Control {
                    package: "hm-test".into(),
                    version: "1.2-3+deb12u1".into(),
                    architecture: "amd64".into(),
                },
                "{compression}"
            );
        }
        assert!(control_of_bytes(b"!<arch>\n").is_err());
        assert!(control_of_bytes(b"not a package").is_err());
    }

    /// Issue 42: an error about several packages names the one that failed: `jq nosuch`
    /// was said as "apt package `jq nosuch`: no package `nosuch`".
    #[test]
    fn of_several_packages_the_one_that_fails_is_named() {
        let installed = system(&[("libc6", "2.36-9")]);
        let asked = ["jq".to_string(), "nosuch=1".to_string()];
        let (package, message) = resolve_naming(&installed, &index(PACKAGES), &asked).unwrap_err();
        assert_eq!(package.as_deref(), Some("nosuch=1"), "{message}");
        assert!(message.contains("no package `nosuch`"), "{message}");
        let (package, message) =
            resolve_naming(&system(&[]), &index(PACKAGES), &asked[..1]).unwrap_err();
        assert_eq!(package.as_deref(), Some("jq"), "{message}");
        assert!(resolve_naming(&installed, &index(PACKAGES), &asked[..1]).is_ok());
    }

    #[test]
    fn the_closure_leaves_out_what_the_image_has() {
        let pins = resolve(
            &system(&[("libc6", "2.36-9")]),
            &index(PACKAGES),
            &[Requested::parse("jq")],
        )
        .unwrap();
        let names: Vec<(&str, bool)> = pins.iter().map(|p| (p.name.as_str(), p.wanted)).collect();
        assert_eq!(
            names,
            [("jq", true), ("libjq1", false), ("libonig5", false)]
        );
    }

    #[test]
    fn an_old_installed_version_is_upgraded_and_a_missing_one_named() {
        let pins = resolve(
            &system(&[("libc6", "2.36-9"), ("libonig5", "6.0-1")]),
            &index(PACKAGES),
            &[Requested::parse("jq")],
        )
        .unwrap();
        assert!(pins.iter().any(|p| p.name == "libonig5"));
        let error = resolve(&system(&[]), &index(PACKAGES), &[Requested::parse("jq")]).unwrap_err();
        assert!(error.contains("needs libc6 (>= 2.34)"), "{error}");
        let error =
            resolve(&system(&[]), &index(PACKAGES), &[Requested::parse("jq=9")]).unwrap_err();
        assert!(error.contains("no package `jq` at version 9"), "{error}");
        let error = resolve(
            &system(&[]),
            &index(PACKAGES),
            &[Requested::parse("other-arch")],
        )
        .unwrap_err();
        assert!(
            error.contains("no package `other-arch` for amd64"),
            "{error}"
        );
    }

    const PYTHON: &str = "\
Package: libpython3.11-dev
Version: 3.11.2-6+deb12u8
Architecture: amd64
Depends: libpython3.11-stdlib (= 3.11.2-6+deb12u8)
Filename: pool/main/p/python3.11/libpython3.11-dev_3.11.2-6+deb12u8_amd64.deb
Size: 1
SHA256: 7777777777777777777777777777777777777777777777777777777777777777

Package: libpython3.11-stdlib
Version: 3.11.2-6+deb12u8
Architecture: amd64
Filename: pool/main/p/python3.11/libpython3.11-stdlib_3.11.2-6+deb12u8_amd64.deb
Size: 1
SHA256: 8888888888888888888888888888888888888888888888888888888888888888

Package: python3.11
Version: 3.11.2-6+deb12u8
Architecture: amd64
Depends: libpython3.11-stdlib (= 3.11.2-6+deb12u8)
Filename: pool/main/p/python3.11/python3.11_3.11.2-6+deb12u8_amd64.deb
Size: 1
SHA256: 9999999999999999999999999999999999999999999999999999999999999999
";

    #[test]
    fn an_installed_package_tied_to_an_upgraded_one_moves_with_it_and_nothing_moves_back() {
        let older = system(&[
            ("python3.11", "3.11.2-6+deb12u7"),
            ("libpython3.11-stdlib", "3.11.2-6+deb12u7"),
        ]);
        let pins = resolve(
            &older,
            &index(PYTHON),
            &[Requested::parse("libpython3.11-dev")],
        )
        .unwrap();
        let names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["libpython3.11-dev", "libpython3.11-stdlib", "python3.11"]
        );

        let newer = system(&[
            ("python3.11", "3.11.2-6+deb12u9"),
            ("libpython3.11-stdlib", "3.11.2-6+deb12u9"),
        ]);
        let error = resolve(
            &newer,
            &index(PYTHON),
            &[Requested::parse("libpython3.11-dev")],
        )
        .unwrap_err();
        assert!(
            error.contains("would replace the image's newer libpython3.11-stdlib"),
            "{error}"
        );
    }

    #[test]
    fn a_virtual_package_is_met_by_a_provider() {
        let pins = resolve(
            &system(&[]),
            &index(PACKAGES),
            &[Requested::parse("mailer")],
        )
        .unwrap();
        let names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["mailer", "tiny-mta"]);
    }

    #[test]
    fn sources_in_both_formats() {
        let one = one_line_sources(
            "# comment\ndeb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://deb.debian.org/debian/ bookworm main contrib\ndeb-src http://x y z\n",
        )
        .unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].uri, "http://deb.debian.org/debian");
        assert_eq!(one[0].components, ["main", "contrib"]);
        assert_eq!(
            one[0].signed_by.as_deref(),
            Some("/usr/share/keyrings/x.gpg")
        );
        let two = deb822_sources(
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].suite, "bookworm-updates");
    }

    #[test]
    fn snapshot_addresses_for_debian_archives_only() {
        assert_eq!(
            snapshot_of(
                "http://deb.debian.org/debian",
                "Sat, 11 Jul 2026 10:16:37 UTC"
            )
            .as_deref(),
            Some("https://snapshot.debian.org/archive/debian/20260711T101637Z/")
        );
        assert_eq!(
            snapshot_of("http://example.com/debian", "Sat, 11 Jul 2026 10:16:37 UTC"),
            None
        );
    }
}
