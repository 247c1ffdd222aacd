//! `hallmark bump IMAGE --base | --wheel NAME | --apt`: moves the other pins of an image, as
//! the source bump moves a source's (docs/patches.md, "Moving the other pins"): the external
//! base to the newest tag on the builder whose image differs from the pin, a wheel to the
//! newest version the package index offers for the image's Python, the apt packages to what
//! their archives serve now. The candidate is written into the spec (the tag or version) and
//! `lock` pins it, in a scratch copy of the project first; the spec and pins file are then
//! written all or nothing. With `--build`, the image is built and smoke-tested; with
//! `--bisect`, the first candidate whose build or smoke fails is named and the newest good
//! one left pinned.

use crate::cli::BumpArgs;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::pins::{self, Pins, wheel_stem};
use crate::inputs::project::Project;
use crate::inputs::spec::Parent;
use crate::inputs::values::Name;
use crate::make::base::BuilderResolver;
use crate::output::{Column, Row};
use crate::plan::Plan;
use crate::plan::lock::BaseResolver;
use crate::plan::pin_moves::{self, Order, Tag};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

pub(super) fn run(settings: &Settings, args: &BumpArgs) -> Result<ExitStatus> {
    if args.bisect && !args.build {
        return Err(Error::usage(
            "--bisect bisects failed builds: it needs --build",
        ));
    }
    if args.tags.is_some() && !args.base {
        return Err(Error::usage(
            "--tags names the tags to walk: with --base (a base's tags) or a source bump",
        ));
    }
    let name = settings.project.image_name(&args.image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let spec_path = settings
        .project
        .images_dir()
        .join(name.as_str())
        .join("image.toml");
    let text = fs_err::read_to_string(&spec_path).map_err(|e| Error::io(&spec_path, e))?;
    if planned.loaded.path != spec_path || crate::inputs::spec::variant::is_variant(&text) {
        return Err(Error::usage(format!(
            "image `{name}` is a variant: its base, wheels and apt packages are those of the spec it varies; bump that image"
        )));
    }
    let runtime = super::runtime()?;
    let resolver = BuilderResolver {
        builder: &settings.config.builder,
        ssh_config: settings.config.ssh_config.as_deref(),
        cache: &settings.cache,
        runtime: &runtime,
    };
    let pins_path = pins::path_for(&settings.project.root, &name);
    let moving = Moving {
        settings,
        name: &name,
        resolver: &resolver,
        scratch: Scratch::of(&settings.project)?,
        originals: Originals::of(&[spec_path.clone(), pins_path.clone()])?,
        spec_path,
        pins_path,
    };
    let mut tried = Vec::new();
    let search = if args.base {
        moving.base_candidates(&planned.loaded, args.tags.as_deref(), &mut tried)?
    } else if let Some(wheel) = &args.wheel {
        moving.wheel_candidates(&planned.loaded, wheel, &mut tried)?
    } else {
        moving.apt_candidates(&planned.loaded)?
    };
    let result = moving.bump(args, search, tried);
    // Whatever happened after the files were written, a failure or a signal leaves them as
    // they were (a build failure is an answer, not a failure: it comes back as `Ok`).
    if result.is_err() || crate::interrupt::requested() {
        let _writing = crate::interrupt::writing();
        moving.originals.put_back()?;
    }
    result
}

/// The candidates found, oldest first, the newest one to try first, and what they move from.
struct Search {
    what: &'static str,
    subject: String,
    from: String,
    order: Option<Order>,
    candidates: Vec<Candidate>,
    /// The newest candidate worth pinning, or why there is none.
    newest: Newest,
    /// The newest candidate, already locked (the apt search locks it to know if it moves).
    locked: Option<Proposal>,
}

/// The candidate to pin (an index into `Search::candidates`), or nothing to do and why.
enum Newest {
    At(usize),
    Nothing(String),
}

struct Moving<'a> {
    settings: &'a Settings,
    name: &'a Name,
    resolver: &'a BuilderResolver<'a>,
    scratch: Scratch,
    originals: Originals,
    spec_path: PathBuf,
    pins_path: PathBuf,
}

impl Moving<'_> {
    /// The base's tags on the builder after the pinned one, oldest first; the newest whose
    /// image differs from the pin is the one to move to.
    fn base_candidates(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
        glob: Option<&str>,
        tried: &mut Vec<Tried>,
    ) -> Result<Search> {
        let reference = match loaded.spec.parent() {
            Parent::External(reference) => reference,
            Parent::Image(parent) => {
                return Err(Error::Usage {
                    message: format!(
                        "image `{}` has no external base to move: its parent is the spec `{parent}` (`from.image`)",
                        self.name
                    ),
                    hint: Some(format!(
                        "bump the base of the image at the bottom of its chain (`hallmark bump <image> --base`); `{parent}` moves with its own spec"
                    )),
                });
            }
        };
        let parsed = crate::oci::Reference::parse(reference).map_err(Error::usage)?;
        let glob = glob.unwrap_or("*");
        let repository = parsed.name().to_string();
        let same_repository = |other: &crate::oci::Reference| {
            let without_tag = |r: &crate::oci::Reference| {
                let q = r.qualified();
                q.rsplit_once(':').map(|(n, _)| n.to_string()).unwrap_or(q)
            };
            without_tag(other) == without_tag(&parsed)
        };
        let builder = &self.settings.config.builder;
        let listed = self.resolver.runtime.block_on(async {
            let engine = super::connect(self.settings, builder).await?;
            engine.listed_images_named(&[repository.as_str()]).await
        })?;
        crate::interrupt::check("bump, listing the base's tags (no file was written)")?;
        let mut tags = Vec::new();
        let mut current = Tag {
            tag: parsed.tag_or_latest().to_string(),
            created: None,
        };
        for image in &listed {
            for named in &image.repo_tags {
                let Ok(other) = crate::oci::Reference::parse(named) else {
                    continue;
                };
                if !same_repository(&other) {
                    continue;
                }
                let tag = Tag {
                    tag: other.tag_or_latest().to_string(),
                    created: image
                        .labels
                        .get("org.opencontainers.image.created")
                        .cloned(),
                };
                if tag.tag == current.tag {
                    current.created = tag.created.clone();
                }
                if !tags.iter().any(|t: &Tag| t.tag == tag.tag) {
                    tags.push(tag);
                }
            }
        }
        // A base named with its registry: that registry's tags too, pulled onto the builder
        // when one is asked for (lock reads bases there).
        if !parsed.is_short() {
            let qualified = parsed.qualified();
            let name = qualified
                .rsplit_once(':')
                .map_or(qualified.as_str(), |(n, _)| n);
            if let Some((host, path)) = name.split_once('/') {
                match pin_moves::registry_tags(host, path) {
                    Ok(listed) => {
                        for tag in listed {
                            if !tags.iter().any(|t| t.tag == tag) {
                                tags.push(Tag { tag, created: None });
                            }
                        }
                    }
                    Err(e) => self.settings.output.note(format!(
                        "warning: {e}; only the builder's tags of `{repository}` are considered"
                    )),
                }
            }
        }
        let (ordered, order) = pin_moves::ordered_tags(tags, glob, &repository)?;
        if ordered.is_empty() {
            return Err(Error::Engine {
                node: builder.name.to_string(),
                endpoint: builder.engine.to_string(),
                message: format!(
                    "no tag matches `{glob}` among the tags of `{repository}` the builder holds{}",
                    match parsed.is_short() {
                        true => "",
                        false => " or its registry lists",
                    }
                ),
                hint: Some(
                    "load or pull the base's newer tags on the builder, or name others with --tags"
                        .into(),
                ),
            });
        }
        let after = pin_moves::after_current(&ordered, &current, order);
        let pinned = self.pins()?.base.map(|b| b.digest.to_string());
        // The newest first: a tag naming the pinned image again (`latest` beside `v3`) is no
        // move, the next older one is asked.
        let mut newest = Newest::Nothing(format!(
            "no tag after `{}` matching `{glob}` names another image than the pin",
            current.tag
        ));
        for (i, tag) in after.iter().enumerate().rev() {
            let asked = format!("{repository}:{}", tag.tag);
            let Some(pin) = self.on_builder(&asked)? else {
                continue;
            };
            crate::interrupt::check("bump, reading the base's tags (no file was written)")?;
            let same = pinned.as_deref() == Some(pin.digest.as_str());
            tried.push(Tried::seen(&tag.tag, pin.digest.as_str(), same));
            if !same {
                newest = Newest::At(i);
                break;
            }
        }
        tried.reverse();
        Ok(Search {
            what: "base",
            subject: repository.clone(),
            from: current.tag.clone(),
            order: Some(order),
            candidates: after
                .iter()
                .map(|t| Candidate {
                    name: t.tag.clone(),
                    edit: Edit::FromRef(format!("{repository}:{}", t.tag)),
                })
                .collect(),
            newest,
            locked: None,
        })
    }

    /// The versions of the wheel after the spec's, oldest first, as the package index lists
    /// them for the image's Python; the newest with a wheel for it is the one to move to.
    fn wheel_candidates(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
        wheel: &str,
        tried: &mut Vec<Tried>,
    ) -> Result<Search> {
        let spec_wheel = loaded
            .spec
            .wheels
            .iter()
            .find(|w| wheel_stem(w.name.get_ref().as_str()) == wheel_stem(wheel))
            .ok_or_else(|| {
                let names: Vec<String> = loaded
                    .spec
                    .wheels
                    .iter()
                    .map(|w| format!("`{}`", w.name.get_ref()))
                    .collect();
                Error::usage(format!(
                    "image `{}` has no wheel `{wheel}`{}",
                    self.name,
                    match names.is_empty() {
                        true => " (it has no `[[wheel]]`)".to_string(),
                        false => format!(" (its wheels: {})", names.join(", ")),
                    }
                ))
            })?;
        let wheel_name = spec_wheel.name.get_ref().to_string();
        let current = spec_wheel.version.clone();
        let python = self.pins()?.python;
        let target = python
            .as_ref()
            .map(crate::inputs::python::Interpreter::pip_options)
            .unwrap_or_default();
        let listed = pin_moves::wheel_versions(self.name.as_str(), &wheel_name, &target)?;
        // The index's order (newest first, PEP 440 as pip reads it), the ones after the pin.
        let mut newer: Vec<String> = match listed.iter().position(|v| *v == current) {
            Some(at) => listed[..at].to_vec(),
            None => listed
                .iter()
                .filter(|v| pin_moves::version_order(v, &current) == std::cmp::Ordering::Greater)
                .cloned()
                .collect(),
        };
        newer.reverse();
        let mut newest = Newest::Nothing(format!(
            "the package index lists no version of `{wheel_name}` after {current}{}",
            match &python {
                Some(python) => format!(" for {}", python.describe()),
                None => String::new(),
            }
        ));
        // A version listed may have no wheel for this Python (an sdist only): the next older.
        for (i, version) in newer.iter().enumerate().rev() {
            match crate::plan::fetch::download_wheel(
                &self.settings.cache,
                self.name.as_str(),
                &wheel_name,
                version,
                &target,
            ) {
                Ok(path) => {
                    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                    tried.push(Tried::seen(version, &file.unwrap_or_default(), false));
                    newest = Newest::At(i);
                    break;
                }
                Err(e @ Error::Wheel { .. }) => {
                    crate::interrupt::check("bump, asking the package index")?;
                    let mut row = Tried::seen(version, "", false);
                    row.verdict = "no wheel";
                    row.error = Some(e.to_string());
                    tried.push(row);
                }
                Err(e) => return Err(e),
            }
        }
        tried.reverse();
        Ok(Search {
            what: "wheel",
            subject: wheel_name.clone(),
            from: current,
            order: None,
            candidates: newer
                .iter()
                .map(|v| Candidate {
                    name: v.clone(),
                    edit: Edit::WheelVersion {
                        wheel: wheel_name.clone(),
                        version: v.clone(),
                    },
                })
                .collect(),
            newest,
            locked: None,
        })
    }

    /// The apt packages resolved again; a candidate only when they come out otherwise.
    fn apt_candidates(&self, loaded: &crate::inputs::spec::LoadedSpec) -> Result<Search> {
        let spec = &loaded.spec;
        if spec.build.apt.is_empty() && spec.compiles.iter().all(|s| s.apt.is_empty()) {
            return Err(Error::usage(format!(
                "image `{}` has no apt packages to lock again: neither `[build] apt` nor a compile stage's `apt` names one",
                self.name
            )));
        }
        let old = self.pins()?;
        let candidate = Candidate {
            name: "apt".into(),
            edit: Edit::AptRelock,
        };
        let proposal = self.propose(&candidate.edit)?;
        let new = pins::parse(self.pins_path.clone(), &proposal.pins)?;
        let moved = new.apt != old.apt;
        Ok(Search {
            what: "apt",
            subject: "apt".into(),
            from: format!("{} package(s)", old.apt.len()),
            order: None,
            newest: match moved {
                true => Newest::At(0),
                false => Newest::Nothing(
                    "the archives serve what is pinned: the apt pins are current".into(),
                ),
            },
            candidates: vec![candidate],
            locked: Some(proposal),
        })
    }

    /// The pin lock would write for the base `reference`, pulled onto the builder first when
    /// the builder lacks it and it names a registry (a tag listed there); `None` when it is
    /// nowhere to be had.
    fn on_builder(&self, reference: &str) -> Result<Option<crate::inputs::pins::BasePin>> {
        if let Some(pin) = self.resolver.resolve(reference)? {
            return Ok(Some(pin));
        }
        let parsed = crate::oci::Reference::parse(reference).map_err(Error::usage)?;
        if parsed.is_short() {
            return Ok(None);
        }
        let settings = self.settings;
        let builder = &settings.config.builder;
        let _listening = crate::interrupt::listening();
        self.resolver.runtime.block_on(async {
            let engine = super::connect(settings, builder).await?;
            let stream = engine.pull(parsed.name(), parsed.tag_or_latest(), None);
            let failure = tokio::select! {
                failure = crate::engine::follow(stream, |_| {}) => failure,
                () = crate::interrupt::arrived() => return Err(Error::Interrupted {
                    what: format!("pulling {reference} onto the builder"),
                }),
            };
            match failure {
                Some(message) => Err(engine.error(format!(
                    "cannot pull {reference}, a tag its registry lists: {message}"
                ))),
                None => Ok(()),
            }
        })?;
        settings
            .output
            .note(format!("pulled {reference} onto the builder"));
        self.resolver.resolve(reference)
    }

    fn pins(&self) -> Result<Pins> {
        pins::read(&self.settings.project.root, self.name)
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
        let report = crate::plan::lock::lock(
            project,
            self.name,
            false,
            self.resolver,
            &self.settings.cache,
        )?;
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
        super::build::build_one(self.settings, self.name)
    }

    fn bump(&self, args: &BumpArgs, search: Search, mut tried: Vec<Tried>) -> Result<ExitStatus> {
        let settings = self.settings;
        let candidates = &search.candidates;
        settings.output.note(format!(
            "{} {} `{}`: {} candidate(s) after {}{}",
            self.name,
            search.what,
            search.subject,
            candidates.len(),
            search.from,
            match search.order {
                Some(Order::Version) => ", in version order",
                Some(Order::Date) => ", in date order (their created labels)",
                None => "",
            }
        ));
        let mut report = Report {
            what: search.what,
            subject: search.subject.clone(),
            from: search.from.clone(),
            order: search.order,
            candidates: candidates.len(),
            chosen: None,
            changes: Vec::new(),
            written: false,
            broken: None,
        };
        let chosen = match search.newest {
            Newest::At(chosen) => chosen,
            Newest::Nothing(why) => {
                show(settings, &tried, &report);
                settings.output.note(format!("nothing to do: {why}"));
                return Ok(ExitStatus::Success);
            }
        };
        let proposal = match search.locked {
            Some(proposal) => proposal,
            None => self.propose(&candidates[chosen].edit)?,
        };
        report.chosen = Some(Chosen::of(&candidates[chosen], &proposal));
        report.changes = proposal.changes.clone();
        if args.dry_run {
            show(settings, &tried, &report);
            return Ok(ExitStatus::Success);
        }
        crate::interrupt::check("bump, before writing (no file was written)")?;
        self.write(&proposal)?;
        report.written = true;
        if !args.build {
            show(settings, &tried, &report);
            return Ok(ExitStatus::Success);
        }
        let failure = match self.build() {
            Ok(()) => {
                record(
                    &mut tried,
                    Tried::built(&candidates[chosen].name, &proposal, None),
                );
                show(settings, &tried, &report);
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
            show(settings, &tried, &report);
            settings.output.note(format!(
                "{} is pinned, and its build failed: {failure}",
                candidates[chosen].name
            ));
            return Ok(ExitStatus::Failure);
        }
        // The newest candidate before the chosen one that builds and passes its smoke tests,
        // by bisection, the old pin taken to be good.
        let mut failures: BTreeMap<usize, String> = BTreeMap::from([(chosen, failure)]);
        let mut good_proposal = None;
        let good = pin_moves::newest_holding(chosen, |i| {
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
                    record(&mut tried, Tried::unpinned(&candidates[i].name, &e));
                    failures.insert(i, e.to_string());
                    return Ok(false);
                }
            };
            self.write(&proposal)?;
            match self.build() {
                Ok(()) => {
                    record(
                        &mut tried,
                        Tried::built(&candidates[i].name, &proposal, None),
                    );
                    good_proposal = Some((i, proposal));
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
                        &mut tried,
                        Tried::built(&candidates[i].name, &proposal, Some(&e)),
                    );
                    failures.insert(i, e);
                    Ok(false)
                }
            }
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
        show(settings, &tried, &report);
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
}

/// One candidate looked at: its pin, and what became of it.
#[derive(Serialize)]
struct Tried {
    candidate: String,
    pin: String,
    /// `newer` (the newest worth pinning), `same` (the pinned image again: skipped), `no
    /// wheel` (none for this Python), `builds`, `fails`, `unpinnable`.
    verdict: &'static str,
    error: Option<String>,
}

impl Tried {
    fn seen(candidate: &str, pin: &str, same: bool) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: pin.to_string(),
            verdict: if same { "same" } else { "newer" },
            error: None,
        }
    }

    fn built(candidate: &str, proposal: &Proposal, failure: Option<&str>) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: proposal.pin.clone(),
            verdict: if failure.is_some() { "fails" } else { "builds" },
            error: failure.map(str::to_string),
        }
    }

    fn unpinned(candidate: &str, error: &Error) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: String::new(),
            verdict: "unpinnable",
            error: Some(error.to_string()),
        }
    }
}

/// Adds `row`, in place of the search's row for the same candidate (`newer`: found, not yet
/// built), so that each candidate is one row.
fn record(tried: &mut Vec<Tried>, row: Tried) {
    match tried
        .iter_mut()
        .find(|t| t.candidate == row.candidate && t.verdict == "newer")
    {
        Some(found) => *found = row,
        None => tried.push(row),
    }
}

impl Row for Tried {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 4] = [
            Column::left("candidate", 9),
            Column::left("verdict", 7),
            Column::left("pin", 0),
            Column::left("error", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        vec![vec![
            self.candidate.clone(),
            self.verdict.into(),
            self.pin.clone(),
            self.error.clone().unwrap_or_default(),
        ]]
    }
}

#[derive(Serialize)]
struct Chosen {
    candidate: String,
    pin: String,
}

impl Chosen {
    fn of(candidate: &Candidate, proposal: &Proposal) -> Chosen {
        Chosen {
            candidate: candidate.name.clone(),
            pin: proposal.pin.clone(),
        }
    }
}

/// The first candidate whose build or smoke tests failed (`--bisect`).
#[derive(Serialize)]
struct Broken {
    candidate: String,
    error: String,
}

#[derive(Serialize)]
struct Report {
    /// `base`, `wheel` or `apt`.
    what: &'static str,
    /// The base's repository, the wheel's name, or `apt`.
    subject: String,
    /// What is pinned before: the base's tag, the wheel's version, how many apt packages.
    from: String,
    order: Option<Order>,
    candidates: usize,
    chosen: Option<Chosen>,
    /// What lock said it pinned.
    changes: Vec<String>,
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
    if !tried.is_empty() {
        settings.output.table("tried", tried);
    }
    for change in &report.changes {
        settings.output.note(format!("lock: {change}"));
    }
    settings
        .output
        .note(match (&report.chosen, report.written) {
            (Some(c), true) => format!("pinned {} ({})", c.candidate, c.pin),
            (Some(c), false) => format!(
                "would pin {} ({}); --dry-run wrote nothing",
                c.candidate, c.pin
            ),
            (None, _) => "nothing pinned".into(),
        });
}

/// Which value of the spec a candidate rewrites.
enum Key<'a> {
    FromRef,
    /// The `version` of the `[[wheel]]` of this name (PEP 427 normalised).
    WheelVersion(&'a str),
}

/// Rewrites one string value of the spec at `path`, the rest of the file byte for byte (the
/// value is found by its span, as the source bump rewrites a `rev`).
fn rewrite(path: &Path, key: &Key<'_>, value: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Values {
        from: Option<FromRef>,
        #[serde(default)]
        wheel: Vec<WheelVersion>,
    }
    #[derive(serde::Deserialize)]
    struct FromRef {
        #[serde(rename = "ref")]
        reference: Option<toml::Spanned<String>>,
    }
    #[derive(serde::Deserialize)]
    struct WheelVersion {
        name: String,
        version: toml::Spanned<String>,
    }
    let text = fs_err::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let values: Values = crate::inputs::spec::parse_toml(path, &text)?;
    let span = match key {
        Key::FromRef => values
            .from
            .and_then(|f| f.reference)
            .map(|r| r.span())
            .ok_or_else(|| Error::usage(format!("{}: no `from.ref` to rewrite", path.display())))?,
        Key::WheelVersion(wheel) => values
            .wheel
            .iter()
            .find(|w| wheel_stem(&w.name) == wheel_stem(wheel))
            .map(|w| w.version.span())
            .ok_or_else(|| {
                Error::usage(format!(
                    "{}: no `[[wheel]]` named `{wheel}` to rewrite",
                    path.display()
                ))
            })?,
    };
    let literal = toml::Value::String(value.to_string()).to_string();
    let new = format!("{}{literal}{}", &text[..span.start], &text[span.end..]);
    fs_err::write(path, new).map_err(|e| Error::io(path, e))
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if fs_err::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    fs_err::write(path, text).map_err(|e| Error::io(path, e))
}

/// The spec and pins file as they were before bump, by content (`None`: no file), put back
/// on failure. Only these two files move here (the source bump also rewrites patch sets).
struct Originals {
    files: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl Originals {
    fn of(paths: &[PathBuf]) -> Result<Originals> {
        let mut files = Vec::new();
        for path in paths {
            let bytes = match fs_err::read(path) {
                Ok(bytes) => Some(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io(path, e)),
            };
            files.push((path.clone(), bytes));
        }
        Ok(Originals { files })
    }

    /// Every file as it was: each tried whatever happened to the one before; the first
    /// failure is the answer. A file already right is not touched.
    fn put_back(&self) -> Result<()> {
        let mut first_failure = None;
        for (path, bytes) in &self.files {
            let attempt = match bytes {
                Some(bytes) if fs_err::read(path).ok().as_ref() == Some(bytes) => Ok(()),
                Some(bytes) => fs_err::write(path, bytes).map_err(|e| Error::io(path, e)),
                None if path.exists() => fs_err::remove_file(path).map_err(|e| Error::io(path, e)),
                None => Ok(()),
            };
            if let Err(e) = attempt {
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// The originals written at `paths` instead (the scratch project's spec and pins, in the
    /// order given to [`Originals::of`]).
    fn restore_into(&self, paths: &[&Path]) -> Result<()> {
        for ((_, bytes), path) in self.files.iter().zip(paths) {
            match bytes {
                Some(bytes) => fs_err::write(path, bytes).map_err(|e| Error::io(path, e))?,
                None if path.exists() => {
                    fs_err::remove_file(path).map_err(|e| Error::io(path, e))?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// A copy of the project's inputs (hallmark.toml, images/, pins/, patches/) where candidates
/// are locked: `lock` writes the pins file it resolves, and nothing of the project may move
/// before bump has a whole answer (or at all, with `--dry-run`).
struct Scratch {
    project: Project,
    _dir: tempfile::TempDir,
}

impl Scratch {
    fn of(project: &Project) -> Result<Scratch> {
        let dir = tempfile::Builder::new()
            .prefix("hallmark-bump")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let root = dir.path().to_path_buf();
        let file = crate::inputs::project::PROJECT_FILE;
        fs_err::copy(project.root.join(file), root.join(file))
            .map_err(|e| Error::io(root.join(file), e))?;
        for folder in ["images", "pins", "patches"] {
            let from = project.root.join(folder);
            if from.is_dir() {
                copy_tree(&from, &root.join(folder))?;
            }
        }
        fs_err::create_dir_all(root.join("pins")).map_err(|e| Error::io(root.join("pins"), e))?;
        Ok(Scratch {
            project: Project { root },
            _dir: dir,
        })
    }
}

/// Folders and regular files below `from` (symlinks as what they point at), modes kept: a
/// spec's files are part of its checksum, exec bit included.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in walkdir::WalkDir::new(from).follow_links(true) {
        let entry = entry.map_err(|e| Error::io(from, e.into()))?;
        let target = to.join(entry.path().strip_prefix(from).expect("under from"));
        if entry.file_type().is_dir() {
            fs_err::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
        } else if entry.file_type().is_file() {
            fs_err::copy(entry.path(), &target).map_err(|e| Error::io(&target, e))?;
        }
    }
    Ok(())
}
