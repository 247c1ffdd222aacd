//! Judging one source's patch series at bump's candidates: once per run of candidates whose
//! files the series touches are the same (they share the answer), by the judgement `check`,
//! `patches report` and `patches refresh` use ([`PatchStatus::needs_person`]). The series is
//! refreshed in a scratch copy, never in the project, until bump writes its answer.

use super::{Candidate, Run};
use crate::error::{Error, Result};
use crate::inputs::patches::refresh::{self, Refreshed};
use crate::inputs::patches::report::{self, Asked, PatchStatus, PinLandings, Target};
use crate::inputs::patches::{PatchSet, read_set};
use crate::inputs::values::GitCommit;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One check of the series: how each patch fared at a run's first candidate, an answer for
/// every candidate of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Tried {
    #[serde(skip)]
    pub index: usize,
    pub commit: String,
    pub date: String,
    pub tag: Option<String>,
    /// How many candidates share this answer (the run's length), and the newest of them.
    pub covers: usize,
    pub through: String,
    /// How many patches have each status.
    pub statuses: BTreeMap<&'static str, usize>,
    /// The patches that need a person here (fuzz, three-way, conflicts, `upstream?`, an
    /// offset into another function): each keeps the series from being taken.
    pub failing: Vec<String>,
    /// Of `failing`, those that may already be upstream (`upstream?`).
    pub upstream_maybe: Vec<String>,
    pub applies: bool,
    /// Which pass of the search judged it: 1, then again after the series was refreshed at
    /// the revision the pass chose (a refreshed series may apply further on).
    pub pass: usize,
}

impl Tried {
    fn of(run: Run, candidates: &[Candidate], rows: &[PatchStatus], pass: usize) -> Tried {
        let candidate = &candidates[run.first];
        let mut statuses = BTreeMap::new();
        for row in rows {
            *statuses.entry(row.status.word()).or_insert(0) += 1;
        }
        let name = |r: &PatchStatus| format!("{}/{}", r.set, r.patch);
        let failing: Vec<String> = rows.iter().filter(|r| r.needs_person()).map(name).collect();
        let upstream_maybe = rows
            .iter()
            .filter(|r| r.status == report::Status::UpstreamMaybe)
            .map(name)
            .collect();
        Tried {
            index: run.first,
            commit: short(candidate.commit.as_str()).to_string(),
            date: candidate.date.clone(),
            tag: candidate.tag.clone(),
            covers: run.end - run.first,
            through: short(candidates[run.end - 1].commit.as_str()).to_string(),
            statuses,
            applies: failing.is_empty(),
            failing,
            upstream_maybe,
            pass,
        }
    }

    /// `2 applies, 1 offset; in the way: dcp/3.patch`.
    pub fn summary(&self) -> String {
        let mut summary = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ");
        if !self.failing.is_empty() {
            summary.push_str(&format!("; in the way: {}", self.failing.join(", ")));
        }
        summary
    }
}

pub fn short(commit: &str) -> &str {
    &commit[..12.min(commit.len())]
}

/// A source's series and the candidates it is judged at.
pub struct Series<'a> {
    pub image: &'a str,
    pub source: &'a str,
    pub repo: &'a Path,
    pub pin: &'a GitCommit,
    pub sets: &'a [PatchSet],
    pub candidates: &'a [Candidate],
    pub runs: Vec<Run>,
    landings: PinLandings,
    /// Every check made, in order.
    pub tried: Vec<Tried>,
    /// The answers of the series as it is, by run.
    verdicts: BTreeMap<usize, bool>,
}

/// A patch series copied to a scratch folder, refreshed there.
pub struct Scratch {
    _dir: tempfile::TempDir,
    pub sets: Vec<PatchSet>,
}

impl Scratch {
    fn of(sets: &[PatchSet]) -> Result<Scratch> {
        let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let patches = dir.path().join("patches");
        let mut copied = Vec::new();
        for set in sets {
            super::saved::copy(&set.dir, &patches.join(set.name.as_str()))?;
            copied.push(read_set(&patches, &set.name)?);
        }
        Ok(Scratch {
            _dir: dir,
            sets: copied,
        })
    }
}

impl<'a> Series<'a> {
    pub fn new(target: &Target<'a>, candidates: &'a [Candidate], runs: Vec<Run>) -> Series<'a> {
        Series {
            image: target.image,
            source: target.source,
            repo: target.repo,
            pin: target.pin,
            sets: target.sets,
            candidates,
            runs,
            landings: PinLandings::default(),
            tried: Vec::new(),
            verdicts: BTreeMap::new(),
        }
    }

    fn examine(
        &self,
        sets: &[PatchSet],
        pin: &GitCommit,
        at: usize,
        asked: Asked,
        landings: &PinLandings,
    ) -> Result<Vec<PatchStatus>> {
        report::examine_with(
            &Target {
                image: self.image,
                source: self.source,
                repo: self.repo,
                commit: &self.candidates[at].commit,
                pin,
                sets,
            },
            asked,
            landings,
        )
    }

    /// The newest candidate where the series applies, and the series refreshed there; again
    /// from it with the refreshed series until nothing newer applies (so bumping twice goes no
    /// further than once). `seen` is told each check.
    pub fn settle(&mut self, seen: &dyn Fn(&Tried)) -> Result<Option<(usize, Scratch)>> {
        let mut scratch = Scratch::of(self.sets)?;
        let mut chosen: Option<usize> = None;
        for pass in 1.. {
            crate::interrupt::check("bump, while trying candidates (no file was written)")?;
            let after = chosen.map_or(0, |c| c + 1);
            let pin = chosen.map_or(self.pin, |c| &self.candidates[c].commit);
            // A run the last answer falls inside is judged from the candidate after it.
            let runs: Vec<Run> = (self.runs.iter())
                .filter(|r| r.end > after)
                .map(|r| Run {
                    first: r.first.max(after),
                    end: r.end,
                })
                .collect();
            let landings = PinLandings::default();
            let mut found = None;
            for run in runs.iter().rev() {
                crate::interrupt::check("bump, while trying candidates (no file was written)")?;
                let rows = self.examine(
                    &scratch.sets,
                    pin,
                    run.first,
                    Asked::default(),
                    if pass == 1 { &self.landings } else { &landings },
                )?;
                let tried = Tried::of(*run, self.candidates, &rows, pass);
                seen(&tried);
                let applies = tried.applies;
                if pass == 1 {
                    self.verdicts.insert(run.first, applies);
                }
                self.tried.push(tried);
                if applies {
                    found = Some(run.end - 1);
                    break;
                }
            }
            let Some(at) = found else { break };
            let refreshed = self.refresh_at(&scratch.sets, pin, at)?;
            chosen = Some(at);
            if refreshed.rewritten.is_empty() && refreshed.dropped.is_empty() {
                break;
            }
            // The series was rewritten: the new series goes on from the new pin.
            scratch.sets = (scratch.sets.iter())
                .map(|s| read_set(s.dir.parent().expect("a set folder"), &s.name))
                .collect::<Result<_>>()?;
        }
        Ok(chosen.map(|c| (c, scratch)))
    }

    /// The series as it is, refreshed at candidate `at` in a scratch copy (for `--bisect`'s
    /// builds), refused when it needs a person there.
    pub fn refreshed_at(&self, at: usize) -> Result<Scratch> {
        let scratch = Scratch::of(self.sets)?;
        self.refresh_at(&scratch.sets, self.pin, at)?;
        Ok(scratch)
    }

    /// `patches refresh` of `sets` at candidate `at`, written where `sets` are.
    fn refresh_at(&self, sets: &[PatchSet], pin: &GitCommit, at: usize) -> Result<Refreshed> {
        let asked = Asked {
            trees: true,
            after: false,
        };
        let rows = self.examine(sets, pin, at, asked, &PinLandings::default())?;
        let refreshed = refresh::refresh(&rows, false, false)?;
        if !refreshed.conflicting.is_empty() || !refreshed.doubtful.is_empty() {
            return Err(Error::usage(format!(
                "the series does not apply at {} as it is: {}",
                self.candidates[at].commit,
                refreshed.lines().join("; ")
            )));
        }
        Ok(refreshed)
    }

    /// Whether the series as it is applies at candidate `i` (its run judged once).
    pub fn applies_at(&mut self, i: usize, seen: &dyn Fn(&Tried)) -> Result<bool> {
        let run = *self
            .runs
            .iter()
            .find(|r| r.first <= i && i < r.end)
            .expect("every candidate is in a run");
        if let Some(known) = self.verdicts.get(&run.first) {
            return Ok(*known);
        }
        let rows = self.examine(
            self.sets,
            self.pin,
            run.first,
            Asked::default(),
            &self.landings,
        )?;
        let tried = Tried::of(run, self.candidates, &rows, 1);
        seen(&tried);
        let applies = tried.applies;
        self.verdicts.insert(run.first, applies);
        self.tried.push(tried);
        Ok(applies)
    }
}
