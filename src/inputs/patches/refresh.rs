//! Rewrites a series for a new commit from a report made there: a patch that needed an
//! offset becomes the diff it made (its mail header kept); one already upstream leaves the
//! series; one that conflicts stays as it is, and by default stops every rewrite, so a
//! half-refreshed series never meets a reviewer unannounced.
//!
//! A doubtful match is never silent: a patch that applied only with fuzz (context lines
//! dropped) or through a three-way merge may have landed somewhere else (an outside test saw
//! a fuzzed hunk of a real series rewritten into another function of the same file, refresh
//! exit 0, and `check` pass it). It stays as it is unless `--accept-fuzz`, and the outcome says
//! where it would land and where it was, so a person can judge.

use super::report::{PatchStatus, Status};
use super::{diff, landing};
use crate::error::{Error, Result};
use crate::inputs::git;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Default)]
pub struct Refreshed {
    pub rewritten: Vec<String>,
    pub dropped: Vec<String>,
    pub conflicting: Vec<String>,
    /// Fuzz or three-way matches left as they are (no `--accept-fuzz`): the patch, and where
    /// its hunks would land against where they were.
    pub doubtful: Vec<(String, String)>,
    /// Whether conflicts stopped every rewrite.
    pub refused: bool,
}

impl Refreshed {
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.refused {
            lines.push(format!(
                "nothing rewritten: {} conflicts ({}); resolve it by hand, or pass --force to refresh the others",
                if self.conflicting.len() == 1 { "1 patch".to_string() } else { format!("{} patches", self.conflicting.len()) },
                self.conflicting.join(", ")
            ));
            return lines;
        }
        lines.extend(self.rewritten.iter().map(|p| format!("rewrote {p}")));
        lines.extend(
            self.dropped
                .iter()
                .map(|p| format!("dropped {p}: already upstream")),
        );
        lines.extend(
            self.conflicting
                .iter()
                .map(|p| format!("left {p} untouched: it conflicts")),
        );
        lines.extend(self.doubtful.iter().map(|(p, place)| {
            format!(
                "left {p} untouched: a doubtful match; {place}; if that is right, pass --accept-fuzz to rewrite it"
            )
        }));
        lines
    }
}

pub fn refresh(rows: &[PatchStatus], force: bool, accept_fuzz: bool) -> Result<Refreshed> {
    let mut seen = BTreeSet::new();
    let rows: Vec<&PatchStatus> = rows.iter().filter(|r| seen.insert(&r.file.path)).collect();
    let name = |r: &PatchStatus| format!("{}/{}", r.set, r.patch);
    let mut outcome = Refreshed {
        conflicting: rows
            .iter()
            .filter(|r| matches!(r.status, Status::Conflicts | Status::UpstreamMaybe))
            .map(|r| name(r))
            .collect(),
        ..Refreshed::default()
    };
    if !outcome.conflicting.is_empty() && !force {
        outcome.refused = true;
        return Ok(outcome);
    }
    // Patches and series are rewritten together: a signal ends hallmark after, not between.
    let _writing = crate::interrupt::writing();
    // Per set folder: the series lines to drop, and the ones whose strip level is now 1.
    let mut series: BTreeMap<PathBuf, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for row in rows {
        let edits = series.entry(row.set_dir.clone()).or_default();
        match row.status {
            Status::Offset | Status::Fuzz | Status::ThreeWay => {
                // Doubtful: context dropped, a merge placed it, or an offset that moved a hunk
                // into another function than at the pin (report's judgement, shared).
                let doubtful = match (&row.status, &row.doubtful) {
                    (Status::Offset, None) => None,
                    (Status::Offset, Some(words)) => Some(words.clone()),
                    _ => Some(fuzzy_landing(row)?),
                };
                if let (Some(words), false) = (&doubtful, accept_fuzz) {
                    outcome.doubtful.push((name(row), words.clone()));
                    continue;
                }
                // A doubtful match written says so in the patch, until a person reviews it.
                let mark = doubtful.as_ref().map(|words| {
                    format!(
                        "refreshed from a doubtful match ({}) at {}: {words}",
                        row.status.word(),
                        &row.commit[..12.min(row.commit.len())],
                    )
                });
                rewrite(row, mark.as_deref())?;
                if row.file.strip > 1 {
                    edits.1.insert(row.patch.clone());
                }
                outcome.rewritten.push(match &doubtful {
                    Some(words) => format!("{} ({words})", name(row)),
                    None => name(row),
                });
            }
            Status::Upstream => {
                fs_err::remove_file(&row.file.path).map_err(|e| Error::io(&row.file.path, e))?;
                edits.0.insert(row.patch.clone());
                outcome.dropped.push(name(row));
            }
            Status::Applies | Status::Conflicts | Status::Empty | Status::UpstreamMaybe => {}
        }
    }
    for (dir, (dropped, restripped)) in series {
        if !dropped.is_empty() || !restripped.is_empty() {
            rewrite_series(&dir, &dropped, &restripped)?;
        }
    }
    Ok(outcome)
}

/// The patch at `row` rewritten as the difference its application made, after its header
/// (stale `Index:` and `===` lines, which name files and revisions of the old diff, left
/// out), with `mark` as a [`REVIEW_MARK`] line when a doubtful match was written.
fn rewrite(row: &PatchStatus, mark: Option<&str>) -> Result<()> {
    let (before, after) = row.trees.as_ref().expect("refresh asks for trees");
    let path = &row.file.path;
    let old = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut command = git::git(&row.repo);
    command.args(["diff-tree", "-p", "--binary", "--no-renames"]);
    if row.file.strip == 0 {
        command.arg("--no-prefix");
    }
    let diff = git::run(command.args([before, after]), || {
        format!("diffing the refreshed {}", path.display())
    })?;
    let preamble: String = (diff::parse(&old).preamble.split_inclusive('\n'))
        .filter(|line| !stale_header(line))
        .collect();
    let text = format!("{}{diff}", with_mark(&preamble, mark));
    write_atomically(path, &text)
}

use super::REVIEW_MARK;

/// `Index: file` and its `=====` rule (quilt's and CVS's headers): stale once the diff
/// below them is rewritten.
fn stale_header(line: &str) -> bool {
    let line = line.trim_end();
    line.starts_with("Index: ") || (line.len() >= 10 && line.bytes().all(|b| b == b'='))
}

/// `preamble` with the review mark: among a mail's headers (before the first blank line) when
/// it is one (`git am` keeps reading it), else as the first line (a DEP-3 style field).
fn with_mark(preamble: &str, mark: Option<&str>) -> String {
    let Some(mark) = mark else {
        return preamble.to_string();
    };
    let line = format!("{REVIEW_MARK} {mark}\n");
    if preamble.starts_with("From ")
        && let Some(end) = preamble.find("\n\n")
    {
        return format!("{}{line}{}", &preamble[..=end], &preamble[end + 1..]);
    }
    format!("{line}{preamble}")
}

/// Where a fuzz or three-way match lands against where the patch had its hunks (its header's
/// lines and functions): the words a doubtful match is shown with.
fn fuzzy_landing(row: &PatchStatus) -> Result<String> {
    let (before, after) = row.trees.as_ref().expect("refresh asks for trees");
    let now = landing::between(&row.repo, before, after, &row.file.path)?;
    let old = fs_err::read_to_string(&row.file.path).map_err(|e| Error::io(&row.file.path, e))?;
    Ok(landing::words(&now, &landing::places(&old, row.file.strip)))
}

/// The series without the dropped patches' lines; a patch rewritten from strip level 2 or
/// more is now `-p1`. Comments and order stay.
fn rewrite_series(
    dir: &Path,
    dropped: &BTreeSet<String>,
    restripped: &BTreeSet<String>,
) -> Result<()> {
    let path = dir.join("series");
    let text = fs_err::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let file = line
            .split('#')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .next();
        match file {
            Some(f) if dropped.contains(f) => continue,
            Some(f) if restripped.contains(f) => out.push_str(&format!("{f} -p1\n")),
            _ => out.push_str(line),
        }
    }
    write_atomically(&path, &out)
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().expect("a file in a set folder");
    let mut temp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
    std::io::Write::write_all(&mut temp, text.as_bytes()).map_err(|e| Error::io(path, e))?;
    // A temporary file is made 0600; a patch file is an ordinary one.
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    temp.as_file()
        .set_permissions(mode)
        .map_err(|e| Error::io(path, e))?;
    temp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}
