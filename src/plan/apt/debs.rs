//! Fetching: the pinned package files into the layer store (`debs/`), each checked against
//! its pin, and the control fields a package file says of itself.

use super::*;

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

/// Why a package file's control data cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BadControl {
    /// The file itself (fs_err's words name it).
    #[error("{0}")]
    File(std::io::Error),
    #[error("not a Debian package (no ar archive)")]
    NotAr,
    #[error("a damaged ar header")]
    Header,
    #[error("a truncated ar member")]
    Truncated,
    #[error("{member}: {error}")]
    Gzip {
        member: String,
        error: std::io::Error,
    },
    #[error("{member}: {error}")]
    Xz {
        member: String,
        error: lzma_rs::error::Error,
    },
    #[error("its control data is compressed as `{0}`, which hallmark does not read")]
    Compression(String),
    #[error("no control.tar in the package")]
    NoControlTar,
    /// `control.tar` that cannot be read as a tar.
    #[error("{0}")]
    Tar(std::io::Error),
    #[error("an empty control file")]
    Empty,
    #[error("its control file has no `{0}`")]
    NoField(&'static str),
    #[error("no control file in control.tar")]
    NoControl,
}

/// What a package file's control data says differently from its pin: each as `(field,
/// pinned, in the file)`.
#[derive(Debug, thiserror::Error)]
#[error("{}", unlike(.0))]
pub struct NotAsPinned(pub Vec<(&'static str, String, String)>);

fn unlike(found: &[(&'static str, String, String)]) -> String {
    found
        .iter()
        .map(|(field, pinned, file)| {
            format!("`{field}` is pinned as {pinned}, the package file's control data says {file}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Reads the control data of the `.deb` at `path`: an `ar` archive whose `control.tar` is
/// plain, gzip or xz (what Debian writes; zstd, which Ubuntu writes, is not read here).
pub fn control_of(path: &Path) -> std::result::Result<Control, BadControl> {
    let bytes = fs_err::read(path).map_err(BadControl::File)?;
    control_of_bytes(&bytes)
}

pub(super) fn control_of_bytes(bytes: &[u8]) -> std::result::Result<Control, BadControl> {
    let mut rest = bytes.strip_prefix(b"!<arch>\n").ok_or(BadControl::NotAr)?;
    while rest.len() >= 60 {
        let (header, body) = rest.split_at(60);
        let name = String::from_utf8_lossy(&header[..16]);
        let name = name.trim_end().trim_end_matches('/');
        let size: usize = String::from_utf8_lossy(&header[48..58])
            .trim()
            .parse()
            .map_err(|_| BadControl::Header)?;
        let member = body.get(..size).ok_or(BadControl::Truncated)?;
        if let Some(compression) = name.strip_prefix("control.tar") {
            let mut tar = Vec::new();
            match compression {
                "" => tar.extend_from_slice(member),
                ".gz" => {
                    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(member), &mut tar)
                        .map_err(|error| BadControl::Gzip {
                            member: name.to_string(),
                            error,
                        })?;
                }
                ".xz" => lzma_rs::xz_decompress(&mut &member[..], &mut tar).map_err(|error| {
                    BadControl::Xz {
                        member: name.to_string(),
                        error,
                    }
                })?,
                other => return Err(BadControl::Compression(other.to_string())),
            }
            return control_in_tar(&tar);
        }
        rest = &body[(size + size % 2).min(body.len())..];
    }
    Err(BadControl::NoControlTar)
}

pub(super) fn control_in_tar(tar: &[u8]) -> std::result::Result<Control, BadControl> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(BadControl::Tar)? {
        let mut entry = entry.map_err(BadControl::Tar)?;
        let path = entry.path().map_err(BadControl::Tar)?.into_owned();
        if path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .eq([std::path::Component::Normal("control".as_ref())])
        {
            let mut text = String::new();
            entry.read_to_string(&mut text).map_err(BadControl::Tar)?;
            let fields = paragraphs(&text).next().ok_or(BadControl::Empty)?;
            let field =
                |name: &'static str| fields.get(name).cloned().ok_or(BadControl::NoField(name));
            return Ok(Control {
                package: field("Package")?,
                version: field("Version")?,
                architecture: field("Architecture")?,
            });
        }
    }
    Err(BadControl::NoControl)
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
            same_as_control(pin, &path).map_err(|e| fail(e.to_string(), None))?;
            files.push((*pin, path));
            continue;
        }
        let url = format!("{}/{}", pin.archive, pin.path);
        let dir = path.parent().expect("a file in a folder");
        fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
        let (sha, length) = match download_into(&agent, &url, pin.size, &mut file) {
            Ok(done) => done,
            Err(failed) => {
                let hint = match (failed.answered(), &pin.snapshot) {
                    (true, Some(snapshot)) => format!(
                        "the archive no longer serves it; this version can still be found in Debian's snapshot archive: {snapshot}{}",
                        pin.path
                    ),
                    (true, None) => format!(
                        "the archive no longer serves it: `hallmark lock --update {image}` pins what it serves now"
                    ),
                    (false, _) => "the archive could not be reached (no network, a proxy, DNS): the layer store does not hold the file".into(),
                };
                return Err(fail(format!("fetching it: {failed}"), Some(hint)));
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
        same_as_control(pin, &path).map_err(|e| fail(e.to_string(), None))?;
        files.push((*pin, path));
    }
    Ok(files)
}

/// `Err` naming what differs when the package file at `path` says another name, version or
/// architecture than `pin` (a hand edit of the pins file); a file whose control data cannot
/// be read is taken as pinned (its sha256 is the pinned one).
pub(super) fn same_as_control(pin: &AptPin, path: &Path) -> std::result::Result<(), NotAsPinned> {
    let Ok(control) = control_of(path) else {
        return Ok(());
    };
    let found = differences(pin, &control);
    match found.is_empty() {
        true => Ok(()),
        false => Err(NotAsPinned(found)),
    }
}
