//! `hallmark bump`: moves a source's pin to the newest upstream revision where the image's
//! patch series still applies (upstream patches dropped, offset-only ones refreshed), found
//! by bisection over the candidates; writes the pin, the refreshed series and, in tags mode,
//! the spec's `rev`, all or nothing; with `--build`, builds and smoke-tests the result, and
//! with `--bisect` finds the first candidate whose build or smoke fails (docs/patches.md).

use crate::cli::BumpArgs;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::patches::report::{self, PatchStatus, Status, Target};
use crate::inputs::pins;
use crate::inputs::values::Name;
use crate::output::{Column, Row};
use crate::plan::Plan;
use crate::plan::bump::{self, Along, Candidate};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(super) fn run(settings: &Settings, args: &BumpArgs) -> Result<ExitStatus> {
    if args.base || args.wheel.is_some() || args.apt {
        return super::bump_pins::run(settings, args);
    }
    if args.bisect && !args.build {
        return Err(Error::usage(
            "--bisect bisects failed builds: it needs --build",
        ));
    }
    let name = settings.project.image_name(&args.image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let index = source_index(planned, &name, args.source.as_deref())?;
    let spec_source = &planned.loaded.spec.sources[index];
    let pin = &planned.pins.sources[index];
    let along = match (&args.tags, &args.branch) {
        (Some(glob), _) => Along::Tags(glob),
        (None, Some(branch)) => Along::Branch {
            branch,
            to: args.to.as_deref(),
        },
        (None, None) => Along::Branch {
            branch: &spec_source.rev,
            to: args.to.as_deref(),
        },
    };
    if let (Along::Branch { branch, .. }, None) = (&along, &args.branch) {
        is_branch(&pin.git, branch)?;
    }
    let (repo, candidates) = bump::candidates(&settings.cache, &pin.git, &pin.commit, &along)?;
    crate::interrupt::check("bump, after fetching (no file was written)")?;
    let sets = &planned.patches[index].sets;
    settings.output.note(format!(
        "{name} source `{}`: {} candidate(s) after {}",
        pin.name,
        candidates.len(),
        short(pin.commit.as_str())
    ));
    let mut tried = Vec::new();
    let chosen = bump::newest_holding(candidates.len(), |i| {
        crate::interrupt::check("bump, while trying candidates (no file was written)")?;
        let rows = report::examine(
            &Target {
                image: name.as_str(),
                source: pin.name.as_str(),
                repo: &repo,
                commit: &candidates[i].commit,
                pin: &pin.commit,
                sets,
            },
            true,
        )?;
        // What refresh would leave to a person fails the candidate here too (an offset into
        // another function passed the check and was refused when written).
        let mut doubtful = Vec::new();
        for row in rows.iter().filter(|r| r.status == Status::Offset) {
            if crate::inputs::patches::refresh::doubtful(row)? {
                doubtful.push(format!("{}/{}", row.set, row.patch));
            }
        }
        let row = Tried::of(i, &candidates[i], &rows, &doubtful);
        settings
            .output
            .detail(|| format!("{} {}", row.commit, row.summary));
        let applies = row.applies;
        tried.push(row);
        Ok(applies)
    })?;
    tried.sort_by_key(|t| t.index);
    let checks = tried.len();
    let mut report = Report {
        candidates: candidates.len(),
        checks,
        chosen: chosen.map(|i| Chosen::of(&candidates[i])),
        written: false,
        broken: None,
    };
    let Some(chosen) = chosen else {
        show(settings, &tried, &report);
        settings.output.note(match candidates.is_empty() {
            true => "nothing to do: no revision after the pin".to_string(),
            false => "no candidate applies the series: the pin stays".to_string(),
        });
        return Ok(ExitStatus::from_success(candidates.is_empty()));
    };
    if args.dry_run {
        show(settings, &tried, &report);
        return Ok(ExitStatus::Success);
    }
    let bumping = Bumping {
        settings,
        name: &name,
        index,
        spec_path: &planned.loaded.path,
        spec_rev: &spec_source.rev,
        branch: match &along {
            Along::Branch { branch, .. } => Some(*branch),
            Along::Tags(_) => None,
        },
        repo: &repo,
        original: Saved::of(&{
            let mut files = vec![
                planned.loaded.path.clone(),
                pins::path_for(&settings.project.root, &name),
            ];
            files.extend(sets.iter().map(|s| s.dir.clone()));
            files
        })?,
    };
    bumping.write(&candidates[chosen])?;
    report.written = true;
    if !args.build {
        show(settings, &tried, &report);
        return Ok(ExitStatus::Success);
    }
    let Err(failure) = bumping.build() else {
        show(settings, &tried, &report);
        return Ok(ExitStatus::Success);
    };
    if !args.bisect {
        show(settings, &tried, &report);
        settings.output.note(format!(
            "{} is pinned, and its build failed: {failure}",
            short(candidates[chosen].commit.as_str())
        ));
        return Ok(ExitStatus::Failure);
    }
    // The chosen candidate builds badly: the newest one before it that builds and passes its
    // smoke tests, by bisection (the old pin taken to be good).
    let mut failures: BTreeMap<usize, String> = BTreeMap::from([(chosen, failure.to_string())]);
    let good = bump::newest_holding(chosen, |i| {
        bumping.write(&candidates[i])?;
        match bumping.build() {
            Ok(()) => Ok(true),
            // Ctrl-C is the operator's, not the candidate's failure: everything goes back.
            Err(e @ Error::Interrupted { .. }) => {
                bumping.original.put_back()?;
                Err(e)
            }
            Err(e) => {
                failures.insert(i, e.to_string());
                Ok(false)
            }
        }
    })?;
    let first_bad = good.map_or(0, |g| g + 1);
    match good {
        Some(g) => bumping.write(&candidates[g])?,
        None => bumping.original.put_back()?,
    }
    report.chosen = good.map(|g| Chosen::of(&candidates[g]));
    report.written = good.is_some();
    report.broken = Some(Broken {
        commit: candidates[first_bad].commit.to_string(),
        error: failures.get(&first_bad).cloned().unwrap_or_default(),
    });
    show(settings, &tried, &report);
    settings.output.note(format!(
        "{} broke the build or its smoke tests: {}; {}",
        short(candidates[first_bad].commit.as_str()),
        failures.get(&first_bad).map(String::as_str).unwrap_or(""),
        match good {
            Some(g) => format!("{} is pinned", short(candidates[g].commit.as_str())),
            None => "the old pin stays".into(),
        }
    ));
    Ok(ExitStatus::Failure)
}

/// The source to bump: the one named, else the image's only one (else the patched one).
fn source_index(
    planned: &crate::plan::PlannedImage,
    name: &Name,
    source: Option<&str>,
) -> Result<usize> {
    let sources = &planned.loaded.spec.sources;
    if let Some(source) = source {
        return sources
            .iter()
            .position(|s| s.name.get_ref().as_str() == source)
            .ok_or_else(|| Error::usage(format!("image `{name}` has no source `{source}`")));
    }
    let patched: Vec<usize> = (0..sources.len())
        .filter(|&i| !planned.patches[i].sets.is_empty())
        .collect();
    match (sources.len(), patched.as_slice()) {
        (0, _) => Err(Error::usage(format!(
            "image `{name}` has no `[[source]]` to bump"
        ))),
        (1, _) => Ok(0),
        (_, [one]) => Ok(*one),
        _ => Err(Error::Usage {
            message: format!("image `{name}` has {} sources", sources.len()),
            hint: Some("name the one to bump with `--source`".into()),
        }),
    }
}

/// A spec `rev` that is no branch needs `--branch` to say which history to walk.
fn is_branch(url: &str, rev: &str) -> Result<()> {
    let listing = crate::inputs::git::run(
        std::process::Command::new("git").args(["ls-remote", "--heads", "--", url, rev]),
        || format!("asking {url} for branch `{rev}`"),
    )?;
    let found = listing
        .lines()
        .any(|l| l.ends_with(&format!("refs/heads/{rev}")));
    match found {
        true => Ok(()),
        false => Err(Error::Usage {
            message: format!("the source's rev `{rev}` is not a branch of {url}"),
            hint: Some(
                "name the branch to walk with `--branch`, or tags with `--tags GLOB`".into(),
            ),
        }),
    }
}

/// A chosen revision as the operator names it: the tag and its commit, or the commit.
fn named(chosen: &Chosen) -> String {
    match &chosen.tag {
        Some(tag) => format!("{tag} ({})", short(&chosen.commit)),
        None => short(&chosen.commit).to_string(),
    }
}

fn short(commit: &str) -> &str {
    &commit[..12.min(commit.len())]
}

/// One candidate checked: how each patch applies there.
#[derive(Serialize)]
struct Tried {
    #[serde(skip)]
    index: usize,
    commit: String,
    date: String,
    tag: Option<String>,
    /// How many patches have each status.
    statuses: BTreeMap<&'static str, usize>,
    /// The patches that keep the series from applying (fuzz, three-way, conflicts).
    failing: Vec<String>,
    applies: bool,
    #[serde(skip)]
    summary: String,
}

impl Tried {
    /// `doubtful`: the offset patches whose hunks would move into another function.
    fn of(index: usize, candidate: &Candidate, rows: &[PatchStatus], doubtful: &[String]) -> Tried {
        let mut statuses = BTreeMap::new();
        for row in rows {
            *statuses.entry(row.status.word()).or_insert(0) += 1;
        }
        let failing: Vec<String> = rows
            .iter()
            .map(|r| format!("{}/{}", r.set, r.patch))
            .zip(rows)
            .filter(|(name, r)| !takes(r.status) || doubtful.contains(name))
            .map(|(name, _)| name)
            .collect();
        let mut summary = statuses
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ");
        if !failing.is_empty() {
            summary.push_str(&format!("; in the way: {}", failing.join(", ")));
        }
        Tried {
            index,
            commit: short(candidate.commit.as_str()).to_string(),
            date: candidate.date.clone(),
            tag: candidate.tag.clone(),
            statuses,
            applies: failing.is_empty(),
            failing,
            summary,
        }
    }
}

/// Whether bump takes a patch in this state: as it is, refreshed (an offset), dropped
/// (upstream) or as nothing (empty). A fuzz or three-way match needs a person.
fn takes(status: Status) -> bool {
    matches!(
        status,
        Status::Applies | Status::Offset | Status::Upstream | Status::Empty
    )
}

impl Row for Tried {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 4] = [
            Column::left("revision", 12),
            Column::left("date", 0),
            Column::left("verdict", 8),
            Column::left("patches", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        let revision = match &self.tag {
            Some(tag) => format!("{tag} ({})", self.commit),
            None => self.commit.clone(),
        };
        let verdict = if self.applies { "applies" } else { "fails" };
        vec![vec![
            revision,
            self.date.clone(),
            verdict.into(),
            self.summary.clone(),
        ]]
    }
}

#[derive(Serialize)]
struct Chosen {
    commit: String,
    date: String,
    tag: Option<String>,
}

impl Chosen {
    fn of(candidate: &Candidate) -> Chosen {
        Chosen {
            commit: candidate.commit.to_string(),
            date: candidate.date.clone(),
            tag: candidate.tag.clone(),
        }
    }
}

/// The first candidate whose build or smoke tests failed (`--bisect`).
#[derive(Serialize)]
struct Broken {
    commit: String,
    error: String,
}

#[derive(Serialize)]
struct Report {
    candidates: usize,
    /// How many times the series was checked (one report of every patch each).
    checks: usize,
    chosen: Option<Chosen>,
    written: bool,
    broken: Option<Broken>,
}

fn show(settings: &Settings, tried: &[Tried], report: &Report) {
    if settings.output.json {
        settings.output.document(&[
            ("tried", serde_json::to_value(tried).expect("json")),
            ("bump", serde_json::to_value(report).expect("json")),
        ]);
        return;
    }
    settings.output.table("tried", tried);
    settings.output.note(format!(
        "{} of {} candidates checked; {}",
        report.checks,
        report.candidates,
        match (&report.chosen, report.written) {
            (Some(c), true) => format!("pinned {} ({})", named(c), c.date),
            (Some(c), false) => format!(
                "would pin {} ({}); --dry-run wrote nothing",
                named(c),
                c.date
            ),
            (None, _) => "nothing pinned".into(),
        }
    ));
}

/// One image's source being moved: what is written, and how to put it back.
struct Bumping<'a> {
    settings: &'a Settings,
    name: &'a Name,
    index: usize,
    spec_path: &'a Path,
    spec_rev: &'a str,
    /// The branch walked (its name stays the spec's `rev` when it is one).
    branch: Option<&'a str>,
    repo: &'a Path,
    /// The spec, pins and patch sets as they were before bump wrote anything: every write
    /// starts from them (a candidate's refresh never sees another's), and any failure, or a
    /// Ctrl-C, puts them back.
    original: Saved,
}

impl Bumping<'_> {
    /// Moves the pin to `candidate`: the series refreshed there, the pins file, and the
    /// spec's `rev` when it must name the candidate (a tag, or a commit off the spec's
    /// branch). All or nothing: on any failure every file is as it was.
    fn write(&self, candidate: &Candidate) -> Result<()> {
        // SIGINT and SIGTERM wait while files are half written: then the files are put back
        // and bump ends as interrupted (a Ctrl-C there left patch files deleted but listed).
        let writing = crate::interrupt::writing();
        let written = self
            .original
            .put_back()
            .and_then(|()| self.write_unguarded(candidate));
        let written = match (written, crate::interrupt::requested()) {
            (Ok(()), false) => Ok(()),
            (result, arrived) => {
                let put_back = self.original.put_back();
                match (result, arrived) {
                    (_, true) => Err(Error::Interrupted {
                        what: "bump (the spec, pins and patch sets are as they were)".into(),
                    }),
                    (Err(e), false) => Err(put_back.err().unwrap_or(e)),
                    (Ok(()), false) => unreachable!("matched above"),
                }
            }
        };
        drop(writing);
        written
    }

    fn write_unguarded(&self, candidate: &Candidate) -> Result<()> {
        let project = &self.settings.project;
        // The series as it is now, examined at the candidate, then refreshed there.
        let plan = Plan::new(project, std::slice::from_ref(self.name))?;
        let planned = plan.get(self.name);
        let pin = &planned.pins.sources[self.index];
        let rows = report::examine(
            &Target {
                image: self.name.as_str(),
                source: pin.name.as_str(),
                repo: self.repo,
                commit: &candidate.commit,
                pin: &pin.commit,
                sets: &planned.patches[self.index].sets,
            },
            true,
        )?;
        let refreshed = crate::inputs::patches::refresh::refresh(&rows, false, false)?;
        if !refreshed.conflicting.is_empty() || !refreshed.doubtful.is_empty() {
            return Err(Error::usage(format!(
                "the series does not apply at {} as it is: {}",
                candidate.commit,
                refreshed.lines().join("; ")
            )));
        }
        let rev = match (&candidate.tag, self.branch) {
            (Some(tag), _) => tag.clone(),
            (None, Some(branch)) if branch == self.spec_rev => self.spec_rev.to_string(),
            (None, _) => candidate.commit.to_string(),
        };
        if rev != self.spec_rev {
            // A variant's source is written in the spec it varies: rewriting it there would
            // move that image's rev too (an outside test saw its pins go stale).
            let own = project
                .images_dir()
                .join(self.name.as_str())
                .join("image.toml");
            if self.spec_path != own
                || crate::inputs::spec::variant::is_variant(
                    &fs_err::read_to_string(&own).unwrap_or_default(),
                )
            {
                return Err(Error::usage(format!(
                    "image `{}` is a variant: its source's rev is the spec's it varies; bump that image, or walk the variant's own branch (its rev) so that only its pin moves",
                    self.name
                )));
            }
            rewrite_rev(self.spec_path, pin.name.as_str(), &rev)?;
        }
        let mut all = pins::read(&project.root, self.name)?;
        let entry = all
            .sources
            .iter_mut()
            .find(|s| s.name == pin.name)
            .ok_or_else(|| Error::usage(format!("no pin of source `{}`", pin.name)))?;
        entry.rev = rev;
        entry.commit = candidate.commit.clone();
        pins::write(&project.root, self.name, &all)?;
        // What `check` would say: the plan loads and the series applies at the new pin.
        let plan = Plan::new(project, std::slice::from_ref(self.name))?;
        crate::plan::fetch::fetch(&self.settings.cache, plan.get(self.name))?;
        Ok(())
    }

    /// Builds the image as it is now pinned, smoke tests included.
    fn build(&self) -> Result<()> {
        super::build::build_one(self.settings, self.name)
    }
}

/// Rewrites `rev = "..."` of the `[[source]]` named `source` in the spec at `path`, the rest
/// of the file byte for byte (toml_edit would do it too; the one value is found by its span).
fn rewrite_rev(path: &Path, source: &str, rev: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Revs {
        #[serde(default)]
        source: Vec<SourceRev>,
    }
    #[derive(serde::Deserialize)]
    struct SourceRev {
        name: String,
        rev: toml::Spanned<String>,
    }
    let text = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let revs: Revs = crate::inputs::spec::parse_toml(path, &text)?;
    let span = revs
        .source
        .iter()
        .find(|s| s.name == source)
        .map(|s| s.rev.span())
        .ok_or_else(|| {
            Error::usage(format!(
                "{}: no `[[source]]` named `{source}` with a `rev` to rewrite (a variant's source is written in the spec it varies)",
                path.display()
            ))
        })?;
    let literal = toml::Value::String(rev.to_string()).to_string();
    let new = format!("{}{literal}{}", &text[..span.start], &text[span.end..]);
    fs_err::write(path, new).map_err(|e| Error::io(path, e))
}

/// Copies of files and folders, put back on failure.
struct Saved {
    copies: Vec<(PathBuf, Option<tempfile::TempDir>)>,
}

impl Saved {
    fn of(paths: &[PathBuf]) -> Result<Saved> {
        let mut copies = Vec::new();
        for path in paths {
            if !path.exists() {
                copies.push((path.clone(), None));
                continue;
            }
            let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
            copy(path, &dir.path().join("copy"))?;
            copies.push((path.clone(), Some(dir)));
        }
        Ok(Saved { copies })
    }

    /// Puts every saved file back as it was: each is tried whatever happened to the one
    /// before (a file that cannot be written does not leave the others changed), and the
    /// first failure is the answer.
    fn put_back(&self) -> Result<()> {
        let mut first_failure = None;
        for (path, copy_dir) in &self.copies {
            let attempt = || -> Result<()> {
                match copy_dir {
                    Some(dir) => sync(&dir.path().join("copy"), path),
                    None if path.is_dir() => {
                        fs_err::remove_dir_all(path).map_err(|e| Error::io(path, e))
                    }
                    None if path.exists() => {
                        fs_err::remove_file(path).map_err(|e| Error::io(path, e))
                    }
                    None => Ok(()),
                }
            };
            if let Err(e) = attempt() {
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }
}

/// Makes `to` hold what `from` holds: files written over in place (a file whose content is
/// already right is not touched), files `from` lacks removed.
fn sync(from: &Path, to: &Path) -> Result<()> {
    if from.is_file() {
        let want = fs_err::read(from).map_err(|e| Error::io(from, e))?;
        if fs_err::read(to).ok().as_deref() != Some(&want[..]) {
            fs_err::write(to, &want).map_err(|e| Error::io(to, e))?;
        }
        return Ok(());
    }
    if to.is_dir() {
        for entry in walkdir::WalkDir::new(to).contents_first(true) {
            let entry = entry.map_err(|e| Error::io(to, e.into()))?;
            let relative = entry.path().strip_prefix(to).expect("under to");
            if !from.join(relative).exists() {
                match entry.file_type().is_dir() {
                    true => fs_err::remove_dir(entry.path()),
                    false => fs_err::remove_file(entry.path()),
                }
                .map_err(|e| Error::io(entry.path(), e))?;
            }
        }
    }
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else {
            sync(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if from.is_file() {
        fs_err::copy(from, to).map_err(|e| Error::io(to, e))?;
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else {
            fs_err::copy(entry.path(), &target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(())
}
