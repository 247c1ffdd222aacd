//! The candidates a pin may move to: the base's tags on the builder (and its registry), the
//! versions of a wheel the package index offers for the image's Python, the apt packages
//! resolved again; each search names the newest one worth pinning.

use super::{Candidate, Edit, Moving, Newest, Search, Tried};
use crate::error::{Error, Result};
use crate::inputs::pins::{self, wheel_stem};
use crate::inputs::spec::Parent;
use crate::plan::pin_moves::{self, Tag, TagRules, WheelMoves, WheelRules};

impl Moving<'_> {
    /// The base's tags on the builder after the pinned one, oldest first; the newest whose
    /// image differs from the pin is the one to move to.
    pub(super) fn base_candidates(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
        rules: &TagRules,
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
        let glob = rules.include.as_str();
        let repository = parsed.name().to_string();
        let (mut tags, current) = self.builder_tags(&parsed, &repository)?;
        self.add_registry_tags(&mut tags, &parsed, &repository);
        let pin_moves::Ordered {
            tags: ordered,
            order,
            skipped,
        } = pin_moves::ordered_tags(tags, &current.tag, rules, &repository)?;
        if ordered.is_empty() {
            return Err(self.no_tag_matches(glob, &repository, parsed.is_short(), &skipped));
        }
        let after = pin_moves::after_current(&ordered, &current, order, &repository)?;
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
            skipped,
        })
    }

    /// The error for a search that leaves no tag, with what was left out and why.
    fn no_tag_matches(
        &self,
        glob: &str,
        repository: &str,
        short: bool,
        skipped: &[String],
    ) -> Error {
        let builder = &self.env.builder;
        Error::Engine {
            node: builder.name.to_string(),
            endpoint: builder.engine.to_string(),
            message: format!(
                "no tag matches `{glob}` among the tags of `{repository}` the builder holds{}{}",
                match short {
                    true => "",
                    false => " or its registry lists",
                },
                match skipped.is_empty() {
                    true => String::new(),
                    false => format!(" ({})", skipped.join("; ")),
                }
            ),
            hint: Some(
                "load or pull the base's newer tags on the builder, or name others with --tags"
                    .into(),
            ),
        }
    }

    /// The versions of the wheel after the spec's, oldest first, as the package index lists
    /// them for the image's Python; the newest with a wheel for it is the one to move to.
    pub(super) fn wheel_candidates(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
        wheel: &str,
        rules: &WheelRules,
        tried: &mut Vec<Tried>,
    ) -> Result<Search> {
        let spec_wheel = self.spec_wheel(loaded, wheel)?;
        let wheel_name = spec_wheel.name.get_ref().to_string();
        let current = spec_wheel.version.clone();
        let python = self.pins()?.python;
        let target = python
            .as_ref()
            .map(crate::inputs::python::Interpreter::pip_options)
            .unwrap_or_default();
        let listed = pin_moves::wheel_versions(self.name.as_str(), &wheel_name, &target)?;
        // PEP 440's order, in the pin's flavour, pre-releases only when asked.
        let WheelMoves { newer, skipped } = pin_moves::wheel_moves(&listed, &current, rules)
            .map_err(|message| Error::Wheel {
                image: self.name.to_string(),
                name: wheel_name.clone(),
                version: current.clone(),
                message,
                hint: Some(
                    "pin a PEP 440 version (`1.2.3`, `1.2.3+cu126`) in the spec's `[[wheel]]`"
                        .into(),
                ),
            })?;
        let mut newest = Newest::Nothing(format!(
            "the package index lists no version of `{wheel_name}` after {current} that it may take{}",
            match &python {
                Some(python) => format!(" for {}", python.describe()),
                None => String::new(),
            }
        ));
        // A version listed may have no wheel for this Python (an sdist only): the next older.
        for (i, version) in newer.iter().enumerate().rev() {
            match crate::plan::fetch::download_wheel(
                self.env.cache,
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
            skipped,
        })
    }

    /// The apt packages resolved again; a candidate only when they come out otherwise.
    pub(super) fn apt_candidates(
        &self,
        loaded: &crate::inputs::spec::LoadedSpec,
    ) -> Result<Search> {
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
            skipped: Vec::new(),
        })
    }

    /// The tags of the base's repository the builder holds (each with its created label),
    /// and the pinned one among them.
    fn builder_tags(
        &self,
        parsed: &crate::oci::Reference,
        repository: &str,
    ) -> Result<(Vec<Tag>, Tag)> {
        let same_repository = |other: &crate::oci::Reference| {
            let without_tag = |r: &crate::oci::Reference| {
                let q = r.qualified();
                q.rsplit_once(':').map(|(n, _)| n.to_string()).unwrap_or(q)
            };
            without_tag(other) == without_tag(parsed)
        };
        let listed = self.env.runtime.block_on(async {
            let engine = self.env.connect().await?;
            engine.listed_images_named(&[repository]).await
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
        Ok((tags, current))
    }

    /// A base named with its registry: that registry's tags too, pulled onto the builder
    /// when one is asked for (lock reads bases there).
    fn add_registry_tags(
        &self,
        tags: &mut Vec<Tag>,
        parsed: &crate::oci::Reference,
        repository: &str,
    ) {
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
                    Err(e) => self.env.output.note(format!(
                        "warning: {e}; only the builder's tags of `{repository}` are considered"
                    )),
                }
            }
        }
    }

    /// The spec's `[[wheel]]` named `wheel` (PEP 427 normalised), or a usage error naming
    /// the wheels it has.
    fn spec_wheel<'s>(
        &self,
        loaded: &'s crate::inputs::spec::LoadedSpec,
        wheel: &str,
    ) -> Result<&'s crate::inputs::spec::Wheel> {
        loaded
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
            })
    }
}
