//! Resolving: the packages the spec names and everything they need that the image lacks,
//! chosen as apt's default choice (the module doc of `apt.rs`), pinned; and which of the
//! packages asked for fails on its own when they cannot be had.

use super::*;

/// The packages chosen so far, by name: the candidate, and whether the spec asked for it.
type Chosen = BTreeMap<String, (Candidate, bool)>;

/// Resolves `requested` against `index` for what `system` has installed: the packages to
/// pin, sorted by name. An error names the package that cannot be had and why.
pub fn resolve(
    system: &System,
    index: &Index,
    requested: &[Requested],
) -> std::result::Result<Vec<AptPin>, AptError> {
    let sources = index.sources.join(", ");
    let (mut chosen, mut queue) = chosen_as_asked(system, index, requested, &sources)?;
    loop {
        drain(system, index, &sources, &mut chosen, &mut queue)?;
        // What is chosen replaces what the image has of the same name: an installed package
        // that needs the old version exactly (`libfoo-dev (= 1.2-3)`) must move with it, and
        // nothing may move back (apt refuses both, at the build, after the lock said yes).
        let moved = moved_with(system, &chosen, &sources)?;
        if moved.is_empty() {
            break;
        }
        for (user, because, to) in moved {
            let installed = system
                .installed
                .iter()
                .find(|i| i.name == user)
                .expect("found above");
            let newer = index
                .best(&user, |v| version(v) > version(&installed.version))
                .ok_or_else(|| {
                    AptError::Breaks(Box::new(Breaks {
                        because: because.clone(),
                        to: to.clone(),
                        user: user.clone(),
                        installed: installed.version.clone(),
                        sources: sources.clone(),
                    }))
                })?;
            chosen.insert(user.clone(), (newer.clone(), false));
            queue.push_back(user);
        }
    }
    chosen
        .into_values()
        .map(|(c, wanted)| {
            Ok(AptPin {
                stage: None,
                wanted,
                sha256: Sha256Hex::try_from(c.sha256.clone()).map_err(|reason| {
                    AptError::Sha256 {
                        name: c.name.clone(),
                        reason,
                    }
                })?,
                name: c.name,
                version: c.version,
                architecture: c.architecture,
                archive: c.archive,
                path: c.path,
                size: c.size,
                snapshot: c.snapshot,
            })
        })
        .collect()
}

/// The packages asked for, each at its best version (or the one asked), marked wanted;
/// and the queue of those whose dependencies are to be met.
fn chosen_as_asked(
    system: &System,
    index: &Index,
    requested: &[Requested],
    sources: &str,
) -> std::result::Result<(Chosen, VecDeque<String>), AptError> {
    let mut chosen: BTreeMap<String, (Candidate, bool)> = BTreeMap::new();
    let mut queue: VecDeque<String> = VecDeque::new();
    for wanted in requested {
        if let Some(arch) = wanted.arch.as_ref().filter(|a| **a != system.architecture) {
            return Err(AptError::OtherArchitecture {
                name: wanted.name.clone(),
                arch: arch.clone(),
                own: system.architecture.clone(),
            });
        }
        let candidate = index
            .best(&wanted.name, |v| {
                wanted.version.as_deref().is_none_or(|w| w == v)
            })
            .ok_or_else(|| match &wanted.version {
                Some(version) => AptError::NoVersion {
                    name: wanted.name.clone(),
                    version: version.clone(),
                    arch: system.architecture.clone(),
                    sources: sources.to_string(),
                },
                None => AptError::NoPackage {
                    name: wanted.name.clone(),
                    arch: system.architecture.clone(),
                    sources: sources.to_string(),
                },
            })?;
        chosen.insert(wanted.name.clone(), (candidate.clone(), true));
        queue.push_back(wanted.name.clone());
    }
    Ok((chosen, queue))
}

/// The installed packages that must move with what is chosen (they need the old version
/// exactly): (the package, because of which, to what version); an error when a choice
/// would move a package back.
fn moved_with(
    system: &System,
    chosen: &Chosen,
    sources: &str,
) -> std::result::Result<Vec<(String, String, String)>, AptError> {
    let mut moved = Vec::new();
    for (name, (candidate, _)) in chosen {
        let Some(installed) = system.installed.iter().find(|i| &i.name == name) else {
            continue;
        };
        if version(&candidate.version) < version(&installed.version) {
            return Err(AptError::Older {
                name: name.clone(),
                version: candidate.version.clone(),
                installed: installed.version.clone(),
                sources: sources.to_string(),
            });
        }
        for user in system
            .installed
            .iter()
            .filter(|u| !chosen.contains_key(&u.name))
        {
            let needs = relations(&user.depends).unwrap_or_default();
            let broken = needs.iter().any(|dependency| {
                dependency.iter().any(|alt| &alt.name == name)
                    && !dependency.iter().any(|alt| {
                        &alt.name == name
                            && alt
                                .constraint
                                .as_ref()
                                .is_none_or(|c| c.allows(&candidate.version))
                    })
                    && !satisfied(system, chosen, dependency)
            });
            if broken {
                moved.push((user.name.clone(), name.clone(), candidate.version.clone()));
            }
        }
    }
    Ok(moved)
}

/// Chooses, for each package in `queue`, what its dependencies need that neither the image
/// nor the choice so far has.
pub(super) fn drain(
    system: &System,
    index: &Index,
    sources: &str,
    chosen: &mut BTreeMap<String, (Candidate, bool)>,
    queue: &mut VecDeque<String>,
) -> std::result::Result<(), AptError> {
    while let Some(name) = queue.pop_front() {
        let depends = chosen[&name].0.depends.clone();
        let dependencies = relations(&depends).map_err(|reason| AptError::Depends {
            name: name.clone(),
            reason,
        })?;
        for dependency in dependencies {
            if satisfied(system, chosen, &dependency) {
                continue;
            }
            let pick = dependency.iter().find_map(|alt| {
                let allows = |v: &str| alt.constraint.as_ref().is_none_or(|c| c.allows(v));
                index.best(&alt.name, allows).or_else(|| {
                    index.providers.get(&alt.name)?.iter().find_map(|provider| {
                        index.best(provider, |_| true).filter(|c| {
                            c.provides
                                .iter()
                                .any(|p| p.name == alt.name && provided_allows(p, alt))
                        })
                    })
                })
            });
            let Some(pick) = pick else {
                return Err(AptError::Unmet {
                    name,
                    needs: dependency,
                    sources: sources.to_string(),
                    arch: system.architecture.clone(),
                });
            };
            queue.push_back(pick.name.clone());
            chosen.insert(pick.name.clone(), (pick.clone(), false));
        }
    }
    Ok(())
}

/// Whether a `Provides` entry meets a dependency: unversioned provides meet only
/// unversioned dependencies (dpkg's rule).
pub(super) fn provided_allows(provided: &Alternative, wanted: &Alternative) -> bool {
    match (&wanted.constraint, &provided.constraint) {
        (None, _) => true,
        (Some(c), Some(p)) => c.allows(&p.version),
        (Some(_), None) => false,
    }
}

/// Whether the image, with what is chosen so far, meets one dependency (any alternative).
pub(super) fn satisfied(
    system: &System,
    chosen: &BTreeMap<String, (Candidate, bool)>,
    dependency: &[Alternative],
) -> bool {
    dependency.iter().any(|alt| {
        let allows = |v: &str| alt.constraint.as_ref().is_none_or(|c| c.allows(v));
        let real = match chosen.get(&alt.name) {
            Some((c, _)) => allows(&c.version),
            None => system
                .installed
                .iter()
                .any(|i| i.name == alt.name && allows(&i.version)),
        };
        let provided = chosen
            .values()
            .flat_map(|(c, _)| &c.provides)
            .chain(system.installed.iter().flat_map(|i| &i.provides))
            .any(|p| p.name == alt.name && provided_allows(p, alt));
        real || provided
    })
}

/// Why packages could not be pinned: the one package of those asked for that fails on its
/// own (`None`: the indexes could not be read, or the packages fail only together), and why.
/// `reason` is boxed so that every `Result` stays small (clippy's `result_large_err`).
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Unpinned {
    pub package: Option<String>,
    pub reason: Box<AptError>,
}

/// The packages `requested` need in `system`, pinned for `stage` (`None`: `[build]`).
pub fn lock_packages(
    system: &System,
    requested: &[String],
    stage: Option<&crate::inputs::values::Name>,
    cache: &Path,
) -> std::result::Result<Vec<AptPin>, Unpinned> {
    let index = Index::load(system, cache).map_err(|reason| Unpinned {
        package: None,
        reason: Box::new(reason),
    })?;
    let mut pins = resolve_naming(system, &index, requested)?;
    for pin in &mut pins {
        pin.stage = stage.cloned();
    }
    Ok(pins)
}

/// [`resolve`] of `requested` as the spec writes them; when they cannot be resolved, each is
/// resolved alone to name the first that fails by itself (an error about `jq nosuch` named
/// both).
pub fn resolve_naming(
    system: &System,
    index: &Index,
    requested: &[String],
) -> std::result::Result<Vec<AptPin>, Unpinned> {
    let parsed: Vec<Requested> = requested.iter().map(|r| Requested::parse(r)).collect();
    let together = match resolve(system, index, &parsed) {
        Ok(pins) => return Ok(pins),
        Err(reason) => reason,
    };
    if let [one] = requested {
        return Err(Unpinned {
            package: Some(one.clone()),
            reason: Box::new(together),
        });
    }
    let alone = parsed.iter().zip(requested).find_map(|(wanted, raw)| {
        resolve(system, index, std::slice::from_ref(wanted))
            .err()
            .map(|reason| Unpinned {
                package: Some(raw.clone()),
                reason: Box::new(reason),
            })
    });
    Err(alone.unwrap_or_else(|| Unpinned {
        package: None,
        reason: Box::new(AptError::Together(Box::new(together))),
    }))
}
