//! Rewrites a series for a new commit from a report made there: a patch that needed an
//! offset, fuzz or a three-way merge becomes the diff it made (its mail header kept); one
//! already upstream leaves the series; one that conflicts stays as it is, and by default
//! stops every rewrite, so a half-refreshed series never meets a reviewer unannounced.

use super::diff;
use super::report::{PatchStatus, Status};
use crate::error::{Error, Result};
use crate::fetch;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Default)]
pub struct Refreshed {
    pub rewritten: Vec<String>,
    pub dropped: Vec<String>,
    pub conflicting: Vec<String>,
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
        lines
    }
}

pub fn refresh(rows: &[PatchStatus], force: bool) -> Result<Refreshed> {
    let mut seen = BTreeSet::new();
    let rows: Vec<&PatchStatus> = rows.iter().filter(|r| seen.insert(&r.file.path)).collect();
    let name = |r: &PatchStatus| format!("{}/{}", r.set, r.patch);
    let mut outcome = Refreshed {
        conflicting: rows
            .iter()
            .filter(|r| r.status == Status::Conflicts)
            .map(|r| name(r))
            .collect(),
        ..Refreshed::default()
    };
    if !outcome.conflicting.is_empty() && !force {
        outcome.refused = true;
        return Ok(outcome);
    }
    // Per set folder: the series lines to drop, and the ones whose strip level is now 1.
    let mut series: BTreeMap<PathBuf, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for row in rows {
        let edits = series.entry(row.set_dir.clone()).or_default();
        match row.status {
            Status::Offset | Status::Fuzz | Status::ThreeWay => {
                rewrite(row)?;
                if row.file.strip > 1 {
                    edits.1.insert(row.patch.clone());
                }
                outcome.rewritten.push(name(row));
            }
            Status::Upstream => {
                fs_err::remove_file(&row.file.path).map_err(|e| Error::io(&row.file.path, e))?;
                edits.0.insert(row.patch.clone());
                outcome.dropped.push(name(row));
            }
            Status::Applies | Status::Conflicts => {}
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
fn rewrite(row: &PatchStatus) -> Result<()> {
    let (before, after) = row.trees.as_ref().expect("refresh asks for trees");
    let path = &row.file.path;
    let old = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut command = fetch::git(&row.repo);
    command.args(["diff-tree", "-p", "--binary", "--no-renames"]);
    if row.file.strip == 0 {
        command.arg("--no-prefix");
    }
    let diff = fetch::run(command.args([before, after]), || {
        format!("diffing the refreshed {}", path.display())
    })?;
    let text = format!("{}{diff}", diff::parse(&old).preamble);
    write_atomically(path, &text)
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
