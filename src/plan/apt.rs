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
use crate::inputs::apt::{Alternative, BadRelation, Paragraph, Requested, paragraphs, relations};
use crate::inputs::pins::AptPin;
use crate::inputs::values::{BadValue, Sha256Hex};
use crate::plan::checksum::{sha256_hex, sha256_reader};
use debversion::Version;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};

mod debs;
mod index;
mod resolve;

pub use debs::*;
pub use index::*;
pub use resolve::*;

/// The files `lock` reads from the image packages go into: apt's sources and trusted keys,
/// and dpkg's record of what is installed.
pub const SYSTEM_PATHS: &[&str] = &["/etc/apt", "/usr/share/keyrings", "/var/lib/dpkg/status"];

/// Why an image's apt packages cannot be pinned: its files (sources, dpkg's status), the
/// archives' signed indexes, or the resolution of what is asked for.
#[derive(Debug, thiserror::Error)]
pub enum AptError {
    /// A sources file with a line that is no source.
    #[error("{path}: {reason}")]
    Sources { path: String, reason: BadSource },
    #[error("it has no apt source (no `deb` line in /etc/apt/sources.list or sources.list.d/)")]
    NoSource,
    #[error("it has no /var/lib/dpkg/status: not a Debian-based image")]
    NoStatus,
    /// An installed package whose `Provides` does not parse.
    #[error("/var/lib/dpkg/status, package {name}: {reason}")]
    Installed { name: String, reason: BadRelation },
    #[error("{uri} {suite}: flat repositories are not supported")]
    Flat { uri: String, suite: String },
    /// `uri` is shown redacted.
    #[error(
        "{uri} {suite}: the source's address carries credentials; hallmark writes archive addresses into pins (reviewed in git) and does not read apt's auth.conf: a source that needs them is not supported"
    )]
    Credentials { uri: String, suite: String },
    #[error(transparent)]
    Download(#[from] Failed),
    #[error(
        "{url}: the image trusts no key for this source (no /etc/apt/trusted.gpg.d/ keyring, no signed-by file)"
    )]
    NoKey { url: String },
    #[error("{path}: not an armored key")]
    NotArmored { path: String },
    /// A temporary folder or file for `gpgv`, or what it wrote.
    #[error("{0}")]
    Io(std::io::Error),
    #[error("running gpgv (Debian's gpgv package): {0}")]
    Gpgv(std::io::Error),
    /// `said` is what gpgv said, trimmed.
    #[error("{url}: the signature does not verify against the keys the image trusts: {said}")]
    Unverified { url: String, said: String },
    #[error("{url}: empty")]
    EmptyRelease { url: String },
    /// `wanted` is the index's path below the suite, `architectures` the archive's (or `?`).
    #[error("{url}: the archive has no {wanted} index (its architectures: {architectures})")]
    NoIndex {
        url: String,
        wanted: String,
        architectures: String,
    },
    #[error("{url}: not the index the signed InRelease names (sha256 differs)")]
    OtherIndex { url: String },
    /// An index kept in the cache could not be written.
    #[error("{0}")]
    Keep(Box<Error>),
    #[error("{url}: {error}")]
    Xz {
        url: String,
        error: lzma_rs::error::Error,
    },
    #[error("{url}: {error}")]
    Gzip { url: String, error: std::io::Error },
    #[error("{url}: not UTF-8 text")]
    NotUtf8 { url: String },
    /// Each form of a component's index (xz, gzip, plain) failed.
    #[error("{}", joined(.0, "; "))]
    Indexes(Vec<AptError>),
    /// A package in an index whose `Provides` does not parse.
    #[error("package {name}: {reason}")]
    Provides { name: String, reason: BadRelation },
    #[error("package {name}: Depends: {reason}")]
    Depends { name: String, reason: BadRelation },
    #[error("package {name}: SHA256: {reason}")]
    Sha256 { name: String, reason: BadValue },
    /// `name:arch` asked for another architecture than the image's (`own`).
    #[error(
        "`{name}:{arch}`: hallmark pins the packages of the image's own architecture ({own}); another architecture's is not supported"
    )]
    OtherArchitecture {
        name: String,
        arch: String,
        own: String,
    },
    /// `sources` is every source asked, `URI SUITE` each.
    #[error("no package `{name}` for {arch} in {sources}")]
    NoPackage {
        name: String,
        arch: String,
        sources: String,
    },
    #[error("no package `{name}` at version {version} for {arch} in {sources}")]
    NoVersion {
        name: String,
        version: String,
        arch: String,
        sources: String,
    },
    /// A dependency none of whose alternatives can be had.
    #[error(
        "package {name} needs {}, which neither the image nor {sources} has for {arch}",
        joined(.needs, " | ")
    )]
    Unmet {
        name: String,
        needs: Vec<Alternative>,
        sources: String,
        arch: String,
    },
    /// The choice of `name` at `version` would move the image's `installed` back.
    #[error(
        "{name} {version} would replace the image's newer {name} {installed}: the image's apt sources ({sources}) do not offer what it has installed (add the suite it came from, such as the security or updates suite, to its sources)"
    )]
    Older {
        name: String,
        version: String,
        installed: String,
        sources: String,
    },
    /// Choosing `because` at `to` breaks the installed `user` (at `installed`), and no newer
    /// `user` is offered.
    #[error(
        "{} {} breaks the image's {} {}, which needs another {}, and {} has no newer {}",
        .0.because, .0.to, .0.user, .0.installed, .0.because, .0.sources, .0.user
    )]
    Breaks(Box<Breaks>),
    /// Packages that fail only when resolved together.
    #[error("together: {0}")]
    Together(Box<AptError>),
}

/// [`AptError::Breaks`]'s payload, boxed: the largest variant is, so that every `Result`
/// stays small (clippy's `result_large_err`).
#[derive(Debug)]
pub struct Breaks {
    pub because: String,
    pub to: String,
    pub user: String,
    pub installed: String,
    pub sources: String,
}

/// A line of a one-line sources file that is no source.
#[derive(Debug, thiserror::Error)]
pub enum BadSource {
    #[error("`{0}`: no closing ]")]
    Unclosed(String),
    #[error("`{0}`: a source needs a URI and a suite")]
    NoSuite(String),
}

/// `items` as text, joined by `separator`.
fn joined(items: &[impl std::fmt::Display], separator: &str) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(separator)
}

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
    ) -> std::result::Result<System, AptError> {
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
                sources.extend(one_line_sources(&body).map_err(|reason| AptError::Sources {
                    path: path.clone(),
                    reason,
                })?);
            } else if path.starts_with("/etc/apt/sources.list.d/") && path.ends_with(".sources") {
                sources.extend(deb822_sources(&body));
            }
        }
        if sources.is_empty() {
            return Err(AptError::NoSource);
        }
        let status = text("/var/lib/dpkg/status").ok_or(AptError::NoStatus)?;
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
                provides: provides(&paragraph).map_err(|reason| AptError::Installed {
                    name: name.clone(),
                    reason,
                })?,
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

fn provides(paragraph: &Paragraph<'_>) -> std::result::Result<Vec<Alternative>, BadRelation> {
    Ok(
        relations(paragraph.get("Provides").map_or("", String::as_str))?
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// `deb [options] URI SUITE COMPONENT...` lines (`deb-src` and comments skipped).
fn one_line_sources(text: &str) -> std::result::Result<Vec<Source>, BadSource> {
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
                .ok_or_else(|| BadSource::Unclosed(line.to_string()))?;
            for option in options.split_whitespace() {
                if let Some(path) = option.strip_prefix("signed-by=") {
                    signed_by = Some(path.to_string());
                }
            }
            rest = after.trim();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            return Err(BadSource::NoSuite(line.to_string()));
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
fn deb822_sources(text: &str) -> Vec<Source> {
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
    sources
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
        let Unpinned { package, reason } =
            resolve_naming(&installed, &index(PACKAGES), &asked).unwrap_err();
        assert_eq!(package.as_deref(), Some("nosuch=1"), "{reason}");
        assert!(
            reason.to_string().contains("no package `nosuch`"),
            "{reason}"
        );
        let Unpinned { package, reason } =
            resolve_naming(&system(&[]), &index(PACKAGES), &asked[..1]).unwrap_err();
        assert_eq!(package.as_deref(), Some("jq"), "{reason}");
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
        let error = resolve(&system(&[]), &index(PACKAGES), &[Requested::parse("jq")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs libc6 (>= 2.34)"), "{error}");
        let error = resolve(&system(&[]), &index(PACKAGES), &[Requested::parse("jq=9")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("no package `jq` at version 9"), "{error}");
        let error = resolve(
            &system(&[]),
            &index(PACKAGES),
            &[Requested::parse("other-arch")],
        )
        .unwrap_err()
        .to_string();
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
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("would replace the image's newer libpython3.11-stdlib"),
            "{error}"
        );
    }

    /// The typed errors say what the strings said, word for word.
    #[test]
    fn the_errors_keep_their_words() {
        let files = |entries: &[(&str, &str)]| {
            entries
                .iter()
                .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
                .collect::<BTreeMap<_, _>>()
        };
        let said = |entries: &[(&str, &str)]| {
            System::from_files("amd64", files(entries))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            said(&[("/etc/apt/sources.list", "deb [arch=amd64 http://x y\n")]),
            "/etc/apt/sources.list: `deb [arch=amd64 http://x y`: no closing ]"
        );
        assert_eq!(
            said(&[]),
            "it has no apt source (no `deb` line in /etc/apt/sources.list or sources.list.d/)"
        );
        assert_eq!(
            said(&[("/etc/apt/sources.list", "deb http://x y main\n")]),
            "it has no /var/lib/dpkg/status: not a Debian-based image"
        );
        let without_python: String = PYTHON
            .split("\n\n")
            .take(2)
            .collect::<Vec<_>>()
            .join("\n\n");
        let older = system(&[
            ("python3.11", "3.11.2-6+deb12u7"),
            ("libpython3.11-stdlib", "3.11.2-6+deb12u7"),
        ]);
        let asked = [Requested::parse("libpython3.11-dev")];
        let mut python = index(&without_python);
        python.sources = vec!["S".into()];
        assert_eq!(
            resolve(&older, &python, &asked).unwrap_err().to_string(),
            "libpython3.11-stdlib 3.11.2-6+deb12u8 breaks the image's python3.11 3.11.2-6+deb12u7, which needs another libpython3.11-stdlib, and S has no newer python3.11"
        );
        let mut lonely = index(
            "Package: a\nVersion: 1\nArchitecture: all\nDepends: b (>= 2) | c\nFilename: a.deb\nSize: 1\nSHA256: 1111111111111111111111111111111111111111111111111111111111111111\n",
        );
        lonely.sources = vec!["S".into()];
        assert_eq!(
            resolve(&system(&[]), &lonely, &[Requested::parse("a")])
                .unwrap_err()
                .to_string(),
            "package a needs b (>= 2) | c, which neither the image nor S has for amd64"
        );
        let found = NotAsPinned(vec![
            ("version", "1".into(), "2".into()),
            ("architecture", "amd64".into(), "all".into()),
        ]);
        assert_eq!(
            found.to_string(),
            "`version` is pinned as 1, the package file's control data says 2; `architecture` is pinned as amd64, the package file's control data says all"
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
        );
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
