//! `hallmark bump IMAGE --base | --wheel NAME | --apt`'s search and writes: moves the other pins of an image, as
//! the source bump moves a source's (docs/patches.md, "Moving the other pins"): the external
//! base to the newest tag on the builder whose image differs from the pin, a wheel to the
//! newest version the package index offers for the image's Python, the apt packages to what
//! their archives serve now. The candidate is written into the spec (the tag or version) and
//! `lock` pins it, in a scratch copy of the project first; the spec and pins file are then
//! written all or nothing. With `--build`, the image is built and smoke-tested; with
//! `--bisect`, the first candidate whose build or smoke fails is named and the newest good
//! one left pinned.

mod files;
mod report;
mod search;

pub use files::Originals;
use files::{Key, Scratch, rewrite, write_if_changed};
use report::{Broken, Chosen, Report, Tried, record, show};

use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::config::NodeConfig;
use crate::inputs::pins::{self, Pins, wheel_stem};
use crate::inputs::project::Project;
use crate::inputs::values::Name;
use crate::output::Output;
use crate::plan::Plan;
use crate::plan::lock::BaseResolver;
use crate::plan::pin_moves::{self, Order, TagRules, WheelRules};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What moving a pin is handed by its command: the project, its builder, and what it asks of
/// the layers above `plan` (a base pinned from the builder, a build of the image).
pub struct Env<'a> {
    pub output: &'a Output,
    pub project: &'a Project,
    pub cache: &'a Path,
    pub builder: &'a NodeConfig,
    pub ssh_config: Option<&'a Path>,
    pub runtime: &'a tokio::runtime::Runtime,
    pub resolver: &'a dyn BaseResolver,
    /// Builds and smoke-tests the image as the project's files now say.
    pub build: &'a dyn Fn() -> Result<()>,
}

impl Env<'_> {
    async fn connect(&self) -> Result<Engine> {
        self.builder.connect(self.ssh_config, self.cache).await
    }
}

/// Which pin moves: the base (to the tags its rules allow), a wheel (to the versions its
/// rules allow), or the apt packages.
pub enum Which<'a> {
    Base(TagRules),
    Wheel(&'a str, WheelRules),
    Apt,
}

/// How far bump goes: `--dry-run` writes nothing, `--build` builds what it pins, `--bisect`
/// looks for the newest candidate that builds.
pub struct Asked {
    pub dry_run: bool,
    pub build: bool,
    pub bisect: bool,
}

/// What a candidate changes in the spec before `lock` pins it.
#[derive(Debug, Clone)]
enum Edit {
    /// `from.ref` names another tag.
    FromRef(String),
    /// The `[[wheel]]` of this name asks for another version.
    WheelVersion { wheel: String, version: String },
    /// The spec stays; the apt pins are resolved again.
    AptRelock,
}

/// A pin the image may move to: as the operator names it (the tag, the version), and how.
#[derive(Debug, Clone)]
struct Candidate {
    name: String,
    edit: Edit,
}

/// A candidate locked in the scratch project: the files to write, and what lock said.
struct Proposal {
    spec: String,
    pins: String,
    /// The pin, in a cell: the base's digest, the wheel's file and sha256, the apt packages.
    pin: String,
    changes: Vec<String>,
}

/// The candidates found, oldest first, the newest one to try first, and what they move from.
pub struct Search {
    what: &'static str,
    subject: String,
    from: String,
    order: Option<Order>,
    candidates: Vec<Candidate>,
    /// The newest candidate worth pinning, or why there is none.
    newest: Newest,
    /// The newest candidate, already locked (the apt search locks it to know if it moves).
    locked: Option<Proposal>,
    /// Why the others the registry or index lists are not candidates, one sentence each.
    skipped: Vec<String>,
}

/// The candidate to pin (an index into `Search::candidates`), or nothing to do and why.
enum Newest {
    At(usize),
    Nothing(String),
}

/// Moving one image's base, wheel or apt pins: the spec and pins file as they were, and the
/// scratch project where each candidate is locked first.
pub struct Moving<'a> {
    env: Env<'a>,
    name: &'a Name,
    scratch: Scratch,
    pub originals: Originals,
    spec_path: PathBuf,
    pins_path: PathBuf,
}

impl<'a> Moving<'a> {
    /// The image `name` (its spec at `spec_path`), its files read as they are before bump.
    pub fn new(env: Env<'a>, name: &'a Name, spec_path: PathBuf) -> Result<Moving<'a>> {
        let pins_path = pins::path_for(&env.project.root, name);
        Ok(Moving {
            scratch: Scratch::of(env.project)?,
            originals: Originals::of(&[spec_path.clone(), pins_path.clone()])?,
            env,
            name,
            spec_path,
            pins_path,
        })
    }

    /// The candidates for `which`, from the spec `loaded`; the rows of those looked at.
    pub fn search(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
        which: &Which<'_>,
    ) -> Result<(Search, Vec<Tried>)> {
        let mut tried = Vec::new();
        let search = match which {
            Which::Base(rules) => self.base_candidates(loaded, rules, &mut tried)?,
            Which::Wheel(wheel, rules) => {
                self.wheel_candidates(loaded, wheel, rules, &mut tried)?
            }
            Which::Apt => self.apt_candidates(loaded)?,
        };
        Ok((search, tried))
    }

    /// The pin lock would write for the base `reference`, pulled onto the builder first when
    /// the builder lacks it and it names a registry (a tag listed there); `None` when it is
    /// nowhere to be had.
    fn on_builder(&self, reference: &str) -> Result<Option<crate::inputs::pins::BasePin>> {
        if let Some(pin) = self.env.resolver.resolve(reference)? {
            return Ok(Some(pin));
        }
        let parsed = crate::oci::Reference::parse(reference).map_err(Error::usage)?;
        if parsed.is_short() {
            return Ok(None);
        }
        let settings = &self.env;
        let _listening = crate::interrupt::listening();
        self.env.runtime.block_on(async {
            let engine = self.env.connect().await?;
            let stream = engine.pull(parsed.name(), parsed.tag_or_latest(), None);
            let failure = tokio::select! {
                failure = crate::engine::follow(stream, |_| {}) => failure,
                () = crate::interrupt::arrived() => return Err(Error::Interrupted {
                    what: format!("pulling {reference} onto the builder"),
                }),
            };
            failure.map_err(|message| {
                engine.error(format!(
                    "cannot pull {reference}, a tag its registry lists: {message}"
                ))
            })
        })?;
        settings
            .output
            .note(format!("pulled {reference} onto the builder"));
        self.env.resolver.resolve(reference)
    }

    fn pins(&self) -> Result<Pins> {
        pins::read(&self.env.project.root, self.name)
    }

    /// Locks `edit` in the scratch project, from the files as they were before bump.
    fn propose(&self, edit: &Edit) -> Result<Proposal> {
        let project = &self.scratch.project;
        let spec_path = project
            .images_dir()
            .join(self.name.as_str())
            .join("image.toml");
        let pins_path = pins::path_for(&project.root, self.name);
        self.originals.restore_into(&[&spec_path, &pins_path])?;
        match edit {
            Edit::FromRef(reference) => {
                self.on_builder(reference)?;
                rewrite(&spec_path, &Key::FromRef, reference)?;
            }
            Edit::WheelVersion { wheel, version } => {
                rewrite(&spec_path, &Key::WheelVersion(wheel), version)?;
            }
            Edit::AptRelock => {
                let mut pins = pins::read(&project.root, self.name)?;
                pins.apt.clear();
                pins.apt_against.clear();
                pins::write(&project.root, self.name, &pins)?;
            }
        }
        let report =
            crate::plan::lock::lock(project, self.name, false, self.env.resolver, self.env.cache)?;
        // What `check` would say of the files: the plan loads with them.
        Plan::new(project, std::slice::from_ref(self.name))?;
        let read = |path: &Path| fs_err::read_to_string(path).map_err(|e| Error::io(path, e));
        let pins_text = read(&pins_path)?;
        let new = pins::parse(pins_path.clone(), &pins_text)?;
        let pin = match edit {
            Edit::FromRef(_) => new.base.map(|b| b.digest.to_string()).unwrap_or_default(),
            Edit::WheelVersion { wheel, .. } => new
                .wheels
                .iter()
                .find(|w| wheel_stem(w.name.as_str()) == wheel_stem(wheel))
                .map(|w| format!("{} sha256:{}", w.file, w.sha256))
                .unwrap_or_default(),
            Edit::AptRelock => new
                .apt
                .iter()
                .filter(|p| p.wanted)
                .map(|p| p.describe())
                .collect::<Vec<_>>()
                .join(" "),
        };
        Ok(Proposal {
            spec: read(&spec_path)?,
            pins: pins_text,
            pin,
            changes: report.changes,
        })
    }

    /// Writes a proposal's spec and pins, all or nothing: on any failure, or a signal while
    /// they are written, both are as they were before bump.
    fn write(&self, proposal: &Proposal) -> Result<()> {
        let writing = crate::interrupt::writing();
        let written = self.originals.put_back().and_then(|()| {
            write_if_changed(&self.spec_path, &proposal.spec)?;
            if let Some(dir) = self.pins_path.parent() {
                fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            }
            write_if_changed(&self.pins_path, &proposal.pins)
        });
        let result = match (written, crate::interrupt::requested()) {
            (Ok(()), false) => Ok(()),
            (written, arrived) => {
                let put_back = self.originals.put_back();
                match arrived {
                    true => Err(Error::Interrupted {
                        what: "bump (the spec and pins are as they were)".into(),
                    }),
                    false => Err(put_back
                        .err()
                        .or(written.err())
                        .expect("an error or a signal")),
                }
            }
        };
        drop(writing);
        result
    }

    fn build(&self) -> Result<()> {
        (self.env.build)()
    }

    pub fn bump(
        &self,
        args: &Asked,
        mut search: Search,
        mut tried: Vec<Tried>,
    ) -> Result<ExitStatus> {
        let settings = &self.env;
        let candidates = &search.candidates;
        self.say_search(&search);
        let mut report = Report {
            what: search.what,
            subject: search.subject.clone(),
            from: search.from.clone(),
            order: search.order,
            skipped: search.skipped.clone(),
            candidates: candidates.len(),
            chosen: None,
            changes: Vec::new(),
            written: false,
            broken: None,
        };
        let chosen = match search.newest {
            Newest::At(chosen) => chosen,
            Newest::Nothing(why) => {
                show(settings.output, &tried, &report);
                settings.output.note(format!("nothing to do: {why}"));
                return Ok(ExitStatus::Success);
            }
        };
        let proposal = match search.locked.take() {
            Some(proposal) => proposal,
            None => self.propose(&candidates[chosen].edit)?,
        };
        report.chosen = Some(Chosen::of(&candidates[chosen], &proposal));
        report.changes = proposal.changes.clone();
        if args.dry_run {
            show(settings.output, &tried, &report);
            return Ok(ExitStatus::Success);
        }
        crate::interrupt::check("bump, before writing (no file was written)")?;
        self.write(&proposal)?;
        report.written = true;
        if !args.build {
            show(settings.output, &tried, &report);
            return Ok(ExitStatus::Success);
        }
        let failure = match self.build() {
            Ok(()) => {
                record(
                    &mut tried,
                    Tried::built(&candidates[chosen].name, &proposal, None),
                );
                show(settings.output, &tried, &report);
                return Ok(ExitStatus::Success);
            }
            Err(e @ Error::Interrupted { .. }) => return Err(e),
            Err(_) if crate::interrupt::requested() => {
                return Err(Error::Interrupted {
                    what: "bump, building (the spec and pins are put back)".into(),
                });
            }
            Err(failure) => failure.to_string(),
        };
        record(
            &mut tried,
            Tried::built(&candidates[chosen].name, &proposal, Some(&failure)),
        );
        if !args.bisect {
            show(settings.output, &tried, &report);
            settings.output.note(format!(
                "{} is pinned, and its build failed: {failure}",
                candidates[chosen].name
            ));
            return Ok(ExitStatus::Failure);
        }
        self.bisect(&search, tried, report, (chosen, failure))
    }

    /// One step of the bisection: candidate `i` locked, written and built; `Ok(true)` when
    /// it builds (its proposal kept in `good`), `Ok(false)` when it cannot be pinned or
    /// fails (why in `failures`).
    fn try_candidate(
        &self,
        i: usize,
        candidates: &[Candidate],
        tried: &mut Vec<Tried>,
        (failures, good_proposal): (&mut BTreeMap<usize, String>, &mut Option<(usize, Proposal)>),
    ) -> Result<bool> {
        crate::interrupt::check("bump, bisecting (the spec and pins are put back)")?;
        let proposal = match self.propose(&candidates[i].edit) {
            Ok(proposal) => proposal,
            Err(e @ Error::Interrupted { .. }) => return Err(e),
            // The pip or engine lock asked was stopped by the signal: not the candidate's.
            Err(_) if crate::interrupt::requested() => {
                return Err(Error::Interrupted {
                    what: "bump, bisecting (the spec and pins are put back)".into(),
                });
            }
            // A candidate that cannot be pinned (a version with no wheel for this
            // Python) is not one to pin: it counts as failed.
            Err(e) => {
                record(tried, Tried::unpinned(&candidates[i].name, &e));
                failures.insert(i, e.to_string());
                return Ok(false);
            }
        };
        self.write(&proposal)?;
        match self.build() {
            Ok(()) => {
                record(tried, Tried::built(&candidates[i].name, &proposal, None));
                *good_proposal = Some((i, proposal));
                Ok(true)
            }
            Err(e @ Error::Interrupted { .. }) => Err(e),
            // A build cut by the signal is not the candidate's failure.
            Err(_) if crate::interrupt::requested() => Err(Error::Interrupted {
                what: "bump, bisecting (the spec and pins are put back)".into(),
            }),
            Err(e) => {
                let e = e.to_string();
                record(
                    tried,
                    Tried::built(&candidates[i].name, &proposal, Some(&e)),
                );
                failures.insert(i, e);
                Ok(false)
            }
        }
    }

    /// `--bisect`: the chosen candidate (`chosen`, with its failure) builds badly; the
    /// newest one before it that builds and passes its smoke tests, by bisection, the old
    /// pin taken to be good.
    fn bisect(
        &self,
        search: &Search,
        mut tried: Vec<Tried>,
        mut report: Report,
        (chosen, failure): (usize, String),
    ) -> Result<ExitStatus> {
        let settings = &self.env;
        let candidates = &search.candidates;
        let mut failures: BTreeMap<usize, String> = BTreeMap::from([(chosen, failure)]);
        let mut good_proposal = None;
        let good = pin_moves::newest_holding(chosen, |i| {
            self.try_candidate(
                i,
                candidates,
                &mut tried,
                (&mut failures, &mut good_proposal),
            )
        })?;
        let first_bad = good.map_or(0, |g| g + 1);
        match good {
            Some(g) => {
                let proposal = match good_proposal.take() {
                    Some((i, proposal)) if i == g => proposal,
                    _ => self.propose(&candidates[g].edit)?,
                };
                self.write(&proposal)?;
                report.chosen = Some(Chosen::of(&candidates[g], &proposal));
                report.changes = proposal.changes;
            }
            None => {
                let _writing = crate::interrupt::writing();
                self.originals.put_back()?;
                report.chosen = None;
                report.changes = Vec::new();
            }
        }
        report.written = good.is_some();
        let error = failures.get(&first_bad).cloned().unwrap_or_default();
        report.broken = Some(Broken {
            candidate: candidates[first_bad].name.clone(),
            error: error.clone(),
        });
        show(settings.output, &tried, &report);
        settings.output.note(format!(
            "{} {} `{}` {} broke the build or its smoke tests: {error}; {}",
            self.name,
            search.what,
            search.subject,
            candidates[first_bad].name,
            match good {
                Some(g) => format!("{} is pinned", candidates[g].name),
                None => format!("the old pin ({}) stays", search.from),
            }
        ));
        Ok(ExitStatus::Failure)
    }

    /// What was found: how many candidates after what, in which order.
    fn say_search(&self, search: &Search) {
        self.env.output.note(format!(
            "{} {} `{}`: {} candidate(s) after {}{}",
            self.name,
            search.what,
            search.subject,
            search.candidates.len(),
            search.from,
            match search.order {
                Some(Order::Version) => ", in version order",
                Some(Order::Date) => ", in date order (their created labels)",
                None => "",
            }
        ));
    }
}
