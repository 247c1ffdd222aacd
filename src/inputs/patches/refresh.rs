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

use super::diff;
use super::report::{PatchStatus, Status};
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
                // Doubtful: context dropped, a merge placed it, or a hunk that moved into
                // another function (an offset git took on identical lines elsewhere).
                let landing = Landing::of(row)?;
                let doubtful = row.status != Status::Offset || landing.moved_function();
                if doubtful && !accept_fuzz {
                    outcome.doubtful.push((name(row), landing.words()));
                    continue;
                }
                // A doubtful match written says so in the patch, until a person reviews it.
                let mark = doubtful.then(|| {
                    format!(
                        "refreshed from a doubtful match ({}) at {}: {}",
                        row.status.word(),
                        &row.commit[..12.min(row.commit.len())],
                        landing.words()
                    )
                });
                rewrite(row, mark.as_deref())?;
                if row.file.strip > 1 {
                    edits.1.insert(row.patch.clone());
                }
                outcome.rewritten.push(match doubtful {
                    true => format!("{} ({})", name(row), landing.words()),
                    false => name(row),
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

/// The patch as the difference of the trees around it, after its mail header or text.
/// Whether refresh would take `row` only with `--accept-fuzz`: a fuzz or three-way match,
/// or an offset that moves a hunk into another function. `row` must carry its trees.
pub fn doubtful(row: &PatchStatus) -> Result<bool> {
    Ok(match row.status {
        Status::Fuzz | Status::ThreeWay => true,
        Status::Offset => Landing::of(row)?.moved_function(),
        _ => false,
    })
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

/// Where a patch's hunks land at the new commit (the difference of the trees around it, with
/// git's default context, as the rewrite writes it) and where the patch had them: each hunk's
/// file, first line and the function git names in its header.
struct Landing {
    now: Vec<Place>,
    was: Vec<Place>,
}

struct Place {
    file: String,
    line: String,
    function: String,
}

impl Landing {
    fn of(row: &PatchStatus) -> Result<Landing> {
        let (before, after) = row.trees.as_ref().expect("refresh asks for trees");
        let mut command = git::git(&row.repo);
        command.args(["diff-tree", "-p", "--no-renames", before, after]);
        let now = git::run(&mut command, || {
            format!("diffing where {} lands", row.file.path.display())
        })?;
        let old =
            fs_err::read_to_string(&row.file.path).map_err(|e| Error::io(&row.file.path, e))?;
        Ok(Landing {
            now: places(&now, 1),
            was: places(&old, row.file.strip),
        })
    }

    /// Whether a function the patch named in a hunk header is no longer named by any hunk of
    /// that file (the rewrite may split or join hunks, so as sets). A patch that names no
    /// function (`diff -u` without `-p`) is judged by its status alone.
    fn moved_function(&self) -> bool {
        self.was.iter().filter(|w| !w.function.is_empty()).any(|w| {
            !self
                .now
                .iter()
                .any(|n| n.file == w.file && n.function == w.function)
        })
    }

    fn words(&self) -> String {
        let list = |places: &[Place]| match places.is_empty() {
            true => "no hunk".to_string(),
            false => places
                .iter()
                .map(|p| match p.function.as_str() {
                    "" => format!("{}:{}", p.file, p.line),
                    f => format!("{}:{} (in `{f}`)", p.file, p.line),
                })
                .collect::<Vec<_>>()
                .join(", "),
        };
        format!(
            "it would land at {}; the patch had {}",
            list(&self.now),
            list(&self.was)
        )
    }
}

/// Each hunk of a diff: its file (after `strip` components), the new side's first line and
/// the function in its header.
fn places(diff: &str, strip: u32) -> Vec<Place> {
    let mut file = String::new();
    let mut places = Vec::new();
    for line in diff.lines() {
        if let Some(path) = line.strip_prefix("+++ ") {
            let path = path.split('\t').next().unwrap_or_default();
            file = path
                .splitn(strip as usize + 1, '/')
                .last()
                .unwrap_or(path)
                .to_string();
        } else if let Some(rest) = line.strip_prefix("@@ ") {
            let Some((ranges, context)) = rest.split_once(" @@") else {
                continue;
            };
            let start = ranges
                .split_whitespace()
                .find_map(|r| r.strip_prefix('+'))
                .and_then(|r| r.split(',').next())
                .unwrap_or("?");
            places.push(Place {
                file: file.clone(),
                line: start.to_string(),
                function: context.trim().to_string(),
            });
        }
    }
    places
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
