//! Inputs from outside the project: git sources by commit and wheels by sha256, both cached
//! under the user's cache folder. Git goes through the git CLI and pip through pip, so the
//! user's credentials, proxies and config apply, and no secret passes through hallmark.
//!
//! Patches are applied to a throwaway index of the bare cache repository (`git apply
//! --cached`), never to a checkout: checking a 23-patch series against vLLM takes a second,
//! and `git archive` of the resulting tree is the patched source, ready for the context.

use crate::error::{Error, PatchNotApplied, Result};
use crate::inputs::git::{git, run};
use crate::inputs::patches::Patch;
use crate::inputs::patches::SourcePatches;
use crate::inputs::pins::{SourcePin, WheelPin, wheel_stem};
use crate::inputs::python;
use crate::inputs::values::GitCommit;
use crate::plan::PlannedImage;
use crate::plan::checksum::{sha256_hex, sha256_reader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The bare repository that caches one upstream URL.
pub fn repo_dir(cache: &Path, url: &str) -> PathBuf {
    cache
        .join("git")
        .join(format!("{}.git", &sha256_hex(url.as_bytes())[..20]))
}

/// Resolves a tag, branch or commit to the commit it names now (`git ls-remote`).
pub fn resolve_rev(url: &str, rev: &str) -> Result<GitCommit> {
    if let Ok(commit) = GitCommit::try_from(rev.to_string()) {
        return Ok(commit);
    }
    let listing = run(
        Command::new("git").args(["ls-remote", "--", url, rev]),
        || format!("resolving `{rev}` in {url}"),
    )?;
    let refs: Vec<(&str, &str)> = listing.lines().filter_map(|l| l.split_once('\t')).collect();
    let wanted = [
        format!("refs/tags/{rev}^{{}}"),
        format!("refs/tags/{rev}"),
        format!("refs/heads/{rev}"),
        rev.to_string(),
    ];
    wanted
        .iter()
        .find_map(|name| refs.iter().find(|(_, r)| r == name))
        .and_then(|(commit, _)| GitCommit::try_from(commit.to_string()).ok())
        .ok_or_else(|| Error::Command {
            command: format!("git ls-remote {url} {rev}"),
            context: Some(format!("no tag or branch `{rev}` in {url}")),
            stderr: String::new(),
        })
}

/// Makes sure the cache holds `commit` of `url`, fetching only that commit when the server
/// allows it and every branch and tag otherwise.
///
/// Fetches into one cache repository take turns (`git-<url>` in the cache's locks): two at
/// once collided on git's `shallow.lock`, failing one of them.
pub fn ensure_commit(cache: &Path, url: &str, commit: &GitCommit) -> Result<PathBuf> {
    let repo = repo_dir(cache, url);
    let has_commit = |repo: &Path| {
        git(repo)
            .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if repo.join("HEAD").is_file() && has_commit(&repo) {
        return Ok(repo);
    }
    let _turn = fetch_turn(cache, url)?;
    if !repo.join("HEAD").is_file() {
        crate::images::store::mark_cache(cache);
        fs_err::create_dir_all(&repo).map_err(|e| Error::io(&repo, e))?;
        run(
            Command::new("git")
                .args(["init", "--bare", "--quiet"])
                .arg(&repo),
            || format!("creating the cache for {url}"),
        )?;
    }
    // Another process may have fetched it while this one waited.
    if has_commit(&repo) {
        return Ok(repo);
    }
    let by_id = run(
        git(&repo).args([
            "fetch",
            "--quiet",
            "--no-tags",
            "--depth",
            "1",
            "--",
            url,
            commit.as_str(),
        ]),
        || format!("fetching {commit} from {url}"),
    );
    if by_id.is_err() || !has_commit(&repo) {
        run(
            git(&repo).args([
                "fetch",
                "--quiet",
                "--no-tags",
                "--",
                url,
                "+refs/heads/*:refs/hallmark/heads/*",
                "+refs/tags/*:refs/hallmark/tags/*",
            ]),
            || format!("fetching {url}"),
        )?;
    }
    if !has_commit(&repo) {
        return Err(Error::Command {
            command: format!("git fetch {url}"),
            context: Some(format!("commit {commit} is not in {url}")),
            stderr: String::new(),
        });
    }
    Ok(repo)
}

/// The turn to write into `url`'s cache repository (fetches and ref updates).
pub fn fetch_turn(cache: &Path, url: &str) -> Result<crate::images::turn::Turn> {
    crate::images::turn::Turn::take_blocking(
        cache,
        "git",
        url,
        &format!("waiting for another hallmark fetching {url} into the cache"),
    )
}

/// Where a failed patch broke: the set, the file and, when git says where, the hunk.
#[derive(Debug)]
pub struct PatchFailure {
    pub set: String,
    pub patch: Patch,
    pub hunk: Option<String>,
    pub detail: String,
}

/// Applies the sets in order to `commit` in a throwaway index; returns the patched tree.
pub fn patched_tree<'a>(
    repo: &Path,
    commit: &GitCommit,
    sets: impl IntoIterator<Item = (&'a str, &'a [Patch])>,
) -> Result<std::result::Result<String, PatchFailure>> {
    let index = crate::inputs::patches::scratch::ScratchIndex::of(repo, commit.as_str())?;
    for (set, patches) in sets {
        for patch in patches {
            let output = index.apply(&patch.path, patch.strip, &[])?;
            if !output.status.success() {
                let detail = String::from_utf8_lossy(&output.stderr).into_owned();
                return Ok(Err(PatchFailure {
                    set: set.to_string(),
                    hunk: failed_hunk(&patch.path, &detail),
                    patch: patch.clone(),
                    detail,
                }));
            }
        }
    }
    Ok(Ok(index.write_tree()?))
}

/// Git reports `patch failed: <file>:<line>`; find the hunk of that file starting there.
fn failed_hunk(patch_path: &Path, stderr: &str) -> Option<String> {
    let location = stderr
        .lines()
        .find_map(|l| l.split_once("patch failed: ").map(|(_, rest)| rest.trim()))?;
    let (file, line) = location.rsplit_once(':')?;
    let text = fs_err::read_to_string(patch_path).ok()?;
    let mut in_file = false;
    let mut hunk_number = 0;
    for l in text.lines() {
        if let Some(target) = l.strip_prefix("+++ ") {
            in_file = target.split('\t').next().is_some_and(|t| t.ends_with(file));
            hunk_number = 0;
        } else if l.starts_with("@@ ") && in_file {
            hunk_number += 1;
            let old_start = l.trim_start_matches("@@ -").split([',', ' ']).next();
            if old_start == Some(line) {
                return Some(format!("hunk #{hunk_number} `{}` of {file}", l.trim()));
            }
        }
    }
    Some(format!("the hunk at line {line} of {file}"))
}

/// `git archive` of a tree, as a child whose stdout is the tar stream.
pub fn archive(repo: &Path, tree: &str) -> Result<Child> {
    git(repo)
        .args(["archive", "--format=tar", tree])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(repo, e))
}

pub fn wheel_path(cache: &Path, pin: &WheelPin) -> PathBuf {
    cache
        .join("wheels")
        .join(pin.sha256.as_str())
        .join(&pin.file)
}

/// Downloads `name==version` as a wheel with the user's pip; returns its cached path.
/// `target` holds pip's options for the image's interpreter and platform
/// ([`python::Interpreter::pip_options`]); without them pip chooses for the host.
pub fn download_wheel(
    cache: &Path,
    image: &str,
    name: &str,
    version: &str,
    target: &[String],
) -> Result<PathBuf> {
    crate::images::store::mark_cache(cache);
    let wheels = cache.join("wheels");
    fs_err::create_dir_all(&wheels).map_err(|e| Error::io(&wheels, e))?;
    let scratch = tempfile::Builder::new()
        .prefix("download")
        .tempdir_in(&wheels)
        .map_err(|e| Error::io(&wheels, e))?;
    let fail = |message: String, hint: Option<String>| Error::Wheel {
        image: image.to_string(),
        name: name.to_string(),
        version: version.to_string(),
        message,
        hint,
    };
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
    ])
    .args(target)
    .arg("--dest")
    .arg(scratch.path())
    .arg(format!("{name}=={version}"))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // An index that does not answer does not outlive Ctrl-C or SIGTERM.
    let output = crate::interrupt::spawn_stoppable(&mut pip)
        .and_then(|(pip, _stoppable)| pip.wait_with_output())
        .map_err(|e| fail(format!("cannot run pip: {e}"), None))?;
    if !output.status.success() {
        return Err(fail(
            format!("pip found no wheel: {}", String::from_utf8_lossy(&output.stderr).trim()),
            Some("hallmark installs wheels only; a package published as an sdist needs a `[build] run` step that builds it".into()),
        ));
    }
    let downloaded = fs_err::read_dir(scratch.path())
        .map_err(|e| Error::io(scratch.path(), e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            // `MarkupSafe-2.1.5-...whl` for `markupsafe`: names compare normalised.
            p.file_name().and_then(|f| f.to_str()).is_some_and(|f| {
                f.ends_with(".whl") && f.split('-').next().map(wheel_stem) == Some(wheel_stem(name))
            })
        })
        .ok_or_else(|| fail("pip downloaded no wheel file".into(), None))?;
    let (sha256, _) = fs_err::File::open(&downloaded)
        .and_then(sha256_reader)
        .map_err(|e| Error::io(&downloaded, e))?;
    let target = wheels
        .join(sha256)
        .join(downloaded.file_name().expect("a file"));
    fs_err::create_dir_all(target.parent().expect("has a parent"))
        .map_err(|e| Error::io(&target, e))?;
    fs_err::rename(&downloaded, &target).map_err(|e| Error::io(&target, e))?;
    Ok(target)
}

/// The pinned wheel from the cache, downloaded again if absent; refused if the bytes differ
/// from the pin.
pub fn ensure_wheel(cache: &Path, image: &str, pin: &WheelPin) -> Result<PathBuf> {
    let cached = wheel_path(cache, pin);
    let matches = |path: &Path| {
        fs_err::File::open(path)
            .and_then(sha256_reader)
            .is_ok_and(|(sha256, _)| sha256 == pin.sha256.as_str())
    };
    if matches(&cached) {
        return Ok(cached);
    }
    // Asked for with the pinned file's own tags, so the host's Python and machine do not
    // decide which file comes.
    let target = python::parse_name(&pin.file)
        .map(|name| name.pip_options())
        .unwrap_or_default();
    let downloaded = download_wheel(cache, image, pin.name.as_str(), &pin.version, &target)?;
    if downloaded == cached && matches(&cached) {
        return Ok(cached);
    }
    Err(Error::Wheel {
        image: image.to_string(),
        name: pin.name.to_string(),
        version: pin.version.clone(),
        message: format!(
            "the index now serves {}, not the pinned {} with sha256 {}",
            downloaded.display(),
            pin.file,
            pin.sha256
        ),
        hint: Some(
            "if the change is expected, run `hallmark lock --update` and review the new pin".into(),
        ),
    })
}

/// One source, fetched and patched: the tree to archive into the context.
#[derive(Debug, Clone)]
pub struct FetchedSource {
    pub name: String,
    pub repo: PathBuf,
    pub tree: String,
}

/// Everything outside the project that an image's context needs.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub sources: Vec<FetchedSource>,
    pub wheels: Vec<PathBuf>,
    /// The `[build]` apt packages: each file's name in the context (`apt/`) and where the
    /// layer store keeps it, checked against its pin.
    pub debs: Vec<(String, PathBuf)>,
}

/// One source of `image` at its pinned commit with its patch series applied: the step both
/// `check` (series still apply?) and `build` (what goes into the context) need.
pub fn fetch_source(
    cache: &Path,
    image: &PlannedImage,
    pin: &SourcePin,
    patches: &SourcePatches,
) -> Result<FetchedSource> {
    let repo = ensure_commit(cache, &pin.git, &pin.commit)?;
    let sets = patches
        .sets
        .iter()
        .map(|s| (s.name.as_str(), s.patches.as_slice()));
    let tree = patched_tree(&repo, &pin.commit, sets)?.map_err(|failure| {
        Error::from(PatchNotApplied {
            image: image.name().to_string(),
            source_name: pin.name.to_string(),
            set: failure.set,
            file: failure.patch.path,
            hunk: failure.hunk,
            detail: failure.detail,
        })
    })?;
    Ok(FetchedSource {
        name: pin.name.to_string(),
        repo,
        tree,
    })
}

pub fn fetch(cache: &Path, image: &PlannedImage) -> Result<Fetched> {
    let sources = image
        .pins
        .sources
        .iter()
        .zip(&image.patches)
        .map(|(pin, patches)| fetch_source(cache, image, pin, patches))
        .collect::<Result<_>>()?;
    let wheels = image
        .pins
        .wheels
        .iter()
        .map(|pin| ensure_wheel(cache, image.name().as_str(), pin))
        .collect::<Result<_>>()?;
    let apt = image.pins.apt_for(None);
    let debs = match apt.is_empty() {
        true => Vec::new(),
        false => {
            let store = crate::images::store::LayerStore::open(cache);
            crate::plan::apt::ensure_debs(&store, image.name().as_str(), &apt)?
                .into_iter()
                .map(|(pin, path)| {
                    let name = crate::inputs::apt::deb_file_name(
                        &pin.name,
                        &pin.version,
                        &pin.architecture,
                    );
                    (name, path)
                })
                .collect()
        }
    };
    Ok(Fetched {
        sources,
        wheels,
        debs,
    })
}
