//! `hallmark bump`'s source bump, after the flags: the search (plan/bump.rs, series.rs), the
//! writes of the pin, the refreshed series and the spec's `rev`, all or nothing
//! (saved.rs), the build and the bisection, and the rows and document it shows.

use super::saved::{Saved, rewrite_rev, sync};
use super::series::{Scratch, Series, Tried, short};
use super::{Along, Candidate};
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::patches::report::Target;
use crate::inputs::pins;
use crate::inputs::project::Project;
use crate::inputs::values::Name;
use crate::output::{Column, Output, Row};
use crate::plan::Plan;
use crate::plan::bump;
use serde::Serialize;
use std::path::Path;

/// What a source bump is handed by its command: the project, the cache, and a build of the
/// image as its files now say (the layers above `plan`).
pub struct Env<'a> {
    pub output: &'a Output,
    pub project: &'a Project,
    pub cache: &'a Path,
    pub build: &'a dyn Fn() -> Result<()>,
}

/// The flags of a source bump: which source, along what, and how far to go.
pub struct Asked<'a> {
    pub source: Option<&'a str>,
    pub tags: Option<&'a str>,
    pub branch: Option<&'a str>,
    pub to: Option<&'a str>,
    pub dry_run: bool,
    pub build: bool,
    pub bisect: bool,
}

/// Moves the pin of one source of the image `name` (docs/patches.md).
pub fn run(env: &Env<'_>, name: &Name, args: &Asked<'_>) -> Result<ExitStatus> {
    let plan = Plan::new(env.project, std::slice::from_ref(name))?;
    let planned = plan.get(name);
    let index = source_index(planned, name, args.source)?;
    let spec_source = &planned.loaded.spec.sources[index];
    let pin = &planned.pins.sources[index];
    let along = along(args, &spec_source.rev);
    let (repo, candidates) = bump::candidates(env.cache, &pin.git, &pin.commit, &along)?;
    crate::interrupt::check("bump, after fetching (no file was written)")?;
    let sets = &planned.patches[index].sets;
    let paths = bump::touched_paths(sets)?;
    let starts = bump::change_points(&repo, &pin.commit, &candidates, &paths)?;
    let runs = bump::runs(&starts, candidates.len());
    env.output.note(format!(
        "{name} source `{}`: {} candidate(s) after {}, in {} run(s) of the same series files",
        pin.name,
        candidates.len(),
        short(pin.commit.as_str()),
        runs.len()
    ));
    let target = Target {
        image: name.as_str(),
        source: pin.name.as_str(),
        repo: &repo,
        commit: &pin.commit,
        pin: &pin.commit,
        sets,
    };
    let mut series = Series::new(&target, &candidates, runs);
    let seen = |t: &Tried| {
        env.output
            .detail(|| format!("{} {}", t.commit, t.summary()))
    };
    let settled = series.settle(&seen)?;
    let mut report = Report {
        candidates: candidates.len(),
        runs: series.runs.len(),
        checks: 0,
        chosen: settled.as_ref().map(|(i, _)| Chosen::of(&candidates[*i])),
        written: false,
        broken: None,
        skipped: Vec::new(),
    };
    let Some((chosen, scratch)) = settled else {
        show(env, &series.tried, &mut report);
        env.output.note(match candidates.is_empty() {
            true => "nothing to do: no revision after the pin".to_string(),
            false => "no candidate applies the series: the pin stays".to_string(),
        });
        warn_upstream_maybe(env, &series.tried, None);
        return Ok(ExitStatus::from_success(candidates.is_empty()));
    };
    warn_upstream_maybe(env, &series.tried, Some(chosen));
    if args.dry_run {
        show(env, &series.tried, &mut report);
        return Ok(ExitStatus::Success);
    }
    let bumping = bumping(env, name, planned, (index, &along))?;
    bumping.write(&candidates[chosen], &scratch)?;
    report.written = true;
    if !args.build {
        show(env, &series.tried, &mut report);
        return Ok(ExitStatus::Success);
    }
    let Err(failure) = bumping.build() else {
        show(env, &series.tried, &mut report);
        return Ok(ExitStatus::Success);
    };
    if !args.bisect {
        show(env, &series.tried, &mut report);
        env.output.note(format!(
            "{} is pinned, and its build failed: {failure}",
            short(candidates[chosen].commit.as_str())
        ));
        return Ok(ExitStatus::Failure);
    }
    bisect(env, &bumping, &mut series, chosen, failure, &mut report)
}

/// `--bisect`: the chosen candidate builds badly; the newest one before it that builds and
/// passes its smoke tests, by bisection (the old pin taken to be good), skipping candidates
/// where the series does not apply. A signal is the operator's, never a candidate's failure:
/// everything goes back and bump ends as interrupted.
fn bisect(
    env: &Env<'_>,
    bumping: &Bumping,
    series: &mut Series,
    chosen: usize,
    failure: Error,
    report: &mut Report,
) -> Result<ExitStatus> {
    let candidates = series.candidates;
    let mut failures = std::collections::BTreeMap::from([(chosen, failure.to_string())]);
    let seen = |t: &Tried| {
        env.output
            .detail(|| format!("{} {}", t.commit, t.summary()))
    };
    let domain: Vec<usize> = (0..=chosen).collect();
    let bisected = bump::bisect(&domain, |i| {
        if !series.applies_at(i, &seen)? {
            return Ok(None);
        }
        let built = series
            .refreshed_at(i)
            .and_then(|scratch| bumping.write(&candidates[i], &scratch))
            .and_then(|()| bumping.build());
        match built {
            Ok(()) => Ok(Some(true)),
            Err(e) if crate::interrupt::requested() || matches!(e, Error::Interrupted { .. }) => {
                bumping.original.put_back()?;
                Err(Error::Interrupted {
                    what: "bump --bisect (the spec, pins and patch sets are as they were)".into(),
                })
            }
            Err(e) => {
                failures.insert(i, e.to_string());
                Ok(Some(false))
            }
        }
    });
    let bisected = match bisected {
        Ok(found) => found,
        Err(e) => {
            bumping.original.put_back()?;
            return Err(e);
        }
    };
    match bisected.good {
        Some(g) => bumping.write(&candidates[g], &series.refreshed_at(g)?)?,
        None => bumping.original.put_back()?,
    }
    let bad = bisected.bad;
    report.chosen = bisected.good.map(|g| Chosen::of(&candidates[g]));
    report.written = bisected.good.is_some();
    report.skipped = (bisected.skipped.iter())
        .map(|&k| candidates[k].commit.to_string())
        .collect();
    report.broken = Some(Broken {
        commit: candidates[bad].commit.to_string(),
        error: failures.get(&bad).cloned().unwrap_or_default(),
    });
    show(env, &series.tried, report);
    if !bisected.skipped.is_empty() {
        env.output.note(format!(
            "{} candidate(s) before it could not be built (the series does not apply there): {}",
            bisected.skipped.len(),
            report
                .skipped
                .iter()
                .map(|c| short(c))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    env.output.note(format!(
        "{} broke the build or its smoke tests: {}; {}",
        short(candidates[bad].commit.as_str()),
        failures.get(&bad).map(String::as_str).unwrap_or(""),
        match bisected.good {
            Some(g) => format!("{} is pinned", short(candidates[g].commit.as_str())),
            None => "the old pin stays".into(),
        }
    ));
    Ok(ExitStatus::Failure)
}

/// Bump reads and rewrites a project's spec, pins and patch sets from its search to its last
/// write: two at once would each undo the other. The turn is an flock on the project's
/// `pins/` folder (no file of its own), waited for; a signal ends the wait.
pub fn one_bump_at_a_time(project: &Project, output: &Output) -> Result<std::fs::File> {
    let dir = project.root.join("pins");
    fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    // fs_err opens it (its errors name the path); flock is std's.
    let lock = fs_err::File::open(&dir)
        .map_err(|e| Error::io(&dir, e))?
        .into_file();
    let told = || {
        output.note(format!(
            "waiting for another bump of this project to finish ({} is locked)",
            dir.display()
        ));
    };
    let stopping = "bump, waiting for another bump (no file was written)";
    crate::images::turn::lock_blocking(&lock, &dir, told, stopping)?;
    Ok(lock)
}

/// Says when a newer revision was left because a patch may already be upstream there: the
/// answer a person gives (drop it, then bump again), never a silent older pin.
fn warn_upstream_maybe(env: &Env<'_>, tried: &[Tried], chosen: Option<usize>) {
    for t in tried
        .iter()
        .filter(|t| !t.upstream_maybe.is_empty() && chosen.is_none_or(|c| t.index > c))
    {
        env.output.note(format!(
            "warning: at {} (and the {} candidate(s) through {}) {} may already be upstream (upstream?): if so, drop it from the series and bump again",
            t.commit,
            t.covers,
            t.through,
            t.upstream_maybe.join(", ")
        ));
    }
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

/// A chosen revision as the operator names it: the tag and its commit, or the commit.
fn named(chosen: &Chosen) -> String {
    match &chosen.tag {
        Some(tag) => format!("{tag} ({})", short(&chosen.commit)),
        None => short(&chosen.commit).to_string(),
    }
}

impl Row for Tried {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 5] = [
            Column::left("revision", 12),
            Column::left("date", 0),
            Column::left("covers", 0),
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
        let covers = match self.covers {
            1 => "1".to_string(),
            n => format!("{n} (to {})", self.through),
        };
        vec![vec![
            revision,
            self.date.clone(),
            covers,
            verdict.into(),
            self.summary(),
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
    /// Runs of candidates whose series files are the same: the most checks an exact search
    /// can need.
    runs: usize,
    /// How many times the series was checked (one report of every patch each).
    checks: usize,
    chosen: Option<Chosen>,
    written: bool,
    broken: Option<Broken>,
    /// `--bisect`: candidates before `broken` that could not be built (the series does not
    /// apply there).
    skipped: Vec<String>,
}

fn show(env: &Env<'_>, tried: &[Tried], report: &mut Report) {
    report.checks = tried.len();
    let mut tried: Vec<&Tried> = tried.iter().collect();
    tried.sort_by_key(|t| (t.index, t.pass));
    if env.output.json {
        env.output.document(&[
            ("tried", serde_json::to_value(&tried).expect("json")),
            ("bump", serde_json::to_value(&*report).expect("json")),
        ]);
        return;
    }
    let rows: Vec<Tried> = tried.into_iter().cloned().collect();
    env.output.table("tried", &rows);
    env.output.note(format!(
        "{} check(s) of {} candidates in {} run(s); {}",
        report.checks,
        report.candidates,
        report.runs,
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
    env: &'a Env<'a>,
    name: &'a Name,
    index: usize,
    spec_path: &'a Path,
    spec_rev: &'a str,
    /// The branch walked (its name stays the spec's `rev` when it is one).
    branch: Option<&'a str>,
    /// The patch sets in the project, written from a refreshed scratch copy.
    sets: &'a [crate::inputs::patches::PatchSet],
    /// The spec, pins and patch sets as they were before bump wrote anything: every write
    /// starts from them (a candidate's refresh never sees another's), and any failure, or a
    /// Ctrl-C, puts them back.
    original: Saved,
}

impl Bumping<'_> {
    /// Moves the pin to `candidate`: the series refreshed there, the pins file, and the
    /// spec's `rev` when it must name the candidate (a tag, or a commit off the spec's
    /// branch). All or nothing: on any failure every file is as it was.
    fn write(&self, candidate: &Candidate, series: &Scratch) -> Result<()> {
        // SIGINT and SIGTERM wait while files are half written: then the files are put back
        // and bump ends as interrupted (a Ctrl-C there left patch files deleted but listed).
        let writing = crate::interrupt::writing();
        let written = self
            .original
            .put_back()
            .and_then(|()| self.write_unguarded(candidate, series));
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

    fn write_unguarded(&self, candidate: &Candidate, series: &Scratch) -> Result<()> {
        let project = &self.env.project;
        // The series as refreshed at the candidate, set by set.
        for (set, refreshed) in self.sets.iter().zip(&series.sets) {
            sync(&refreshed.dir, &set.dir)?;
        }
        let plan = Plan::new(project, std::slice::from_ref(self.name))?;
        let planned = plan.get(self.name);
        let pin = &planned.pins.sources[self.index];
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
        crate::plan::fetch::fetch(self.env.cache, plan.get(self.name))?;
        Ok(())
    }

    /// Builds the image as it is now pinned, smoke tests included.
    fn build(&self) -> Result<()> {
        (self.env.build)()
    }
}

/// What the candidates come from: the tags `--tags` matches, else the branch `--branch`
/// names, else the spec's `rev`.
fn along<'a>(args: &Asked<'a>, spec_rev: &'a str) -> Along<'a> {
    match (args.tags, args.branch) {
        (Some(glob), _) => Along::Tags(glob),
        (None, Some(branch)) => Along::Branch {
            branch,
            to: args.to,
        },
        (None, None) => Along::Branch {
            branch: spec_rev,
            to: args.to,
        },
    }
}

/// The source at `index` of `planned` to be moved along `along`: its files as they are.
fn bumping<'a>(
    env: &'a Env<'a>,
    name: &'a Name,
    planned: &'a crate::plan::PlannedImage,
    (index, along): (usize, &Along<'a>),
) -> Result<Bumping<'a>> {
    let sets = &planned.patches[index].sets;
    let spec_source = &planned.loaded.spec.sources[index];
    Ok(Bumping {
        env,
        name,
        index,
        spec_path: &planned.loaded.path,
        spec_rev: &spec_source.rev,
        branch: match along {
            Along::Branch { branch, .. } => Some(*branch),
            Along::Tags(_) => None,
        },
        sets,
        original: Saved::of(&{
            let mut files = vec![
                planned.loaded.path.clone(),
                pins::path_for(&env.project.root, name),
            ];
            files.extend(sets.iter().map(|s| s.dir.clone()));
            files
        })?,
    })
}
