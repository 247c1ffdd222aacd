//! `hallmark check`: everything that can be known before a build, in seconds. Each image is
//! checked on its own so one broken spec does not hide the others' problems.

use crate::error::{Error, Result};
use crate::inputs::pins;
use crate::inputs::project::Project;
use crate::inputs::python;
use crate::inputs::spec::Parent;
use crate::inputs::values::Name;
use crate::plan::checksum::HashStats;
use crate::plan::fetch;
use crate::plan::{Failure, Plan, PlannedImage};
use std::collections::BTreeMap;
use std::path::Path;

/// Every patch the images `names` apply that still carries a review mark (refreshed from a
/// doubtful match, not yet reviewed): its path and the mark's words. A warning, not a problem:
/// the patch applies; a person has not yet looked at where it landed.
pub fn unreviewed(project: &Project, names: &[Name]) -> Vec<(std::path::PathBuf, String)> {
    let (plan, _) = Plan::each(project, names);
    let mut found = BTreeMap::new();
    for image in plan.images.values() {
        for set in image.patches.iter().flat_map(|p| &p.sets) {
            for patch in &set.patches {
                if let Some(mark) = crate::inputs::patches::review_mark(&patch.path) {
                    found.insert(patch.path.clone(), mark);
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Checks `names`; returns the images that passed with their checksums, every problem
/// found, and what planning read. Each image is planned once (a 3,000-deep chain checked in
/// seconds, not in the minutes planning it again for each image cost), and a problem that
/// stops the images standing on it from being planned is reported once, each of those images
/// named after it.
pub fn check(
    project: &Project,
    names: &[Name],
    cache: &Path,
) -> (Vec<(Name, String)>, Vec<Error>, HashStats) {
    let (plan, mut failed) = Plan::each(project, names);
    // What each image inherits, parents first: one step per image, not one per ancestor.
    let mut inherited: BTreeMap<&Name, Option<Vec<String>>> = BTreeMap::new();
    for name in &plan.order {
        let image = plan.get(name);
        let entrypoint = match image.loaded.spec.parent() {
            Parent::External(_) => image.pins.base.as_ref().and_then(|b| b.entrypoint.clone()),
            Parent::Image(parent) => (plan.get(parent).loaded.spec.container.entrypoint.clone())
                .or_else(|| inherited[parent].clone()),
        };
        inherited.insert(name, entrypoint);
    }
    // The planned images asked for, checked parents first: an image whose parent (or an
    // image further up) failed its check is not checked, and says so (a child was called
    // `ok` when its parent's patch series did not apply). Each maps to the image whose
    // problem stopped it, itself included.
    let wanted: std::collections::BTreeSet<&Name> = names.iter().collect();
    let mut checked: BTreeMap<&Name, std::result::Result<String, Error>> = BTreeMap::new();
    let mut stopped_by: BTreeMap<&Name, Name> = BTreeMap::new();
    for name in plan.order.iter().filter(|n| wanted.contains(n)) {
        let blocked = plan
            .get(name)
            .parent
            .as_ref()
            .and_then(|p| stopped_by.get(p))
            .cloned();
        if let Some(cause) = blocked {
            checked.insert(
                name,
                Err(Error::ParentFailed {
                    image: name.to_string(),
                    parent: cause.to_string(),
                    path: project.images_dir().join(name.as_str()).join("image.toml"),
                }),
            );
            stopped_by.insert(name, cause);
            continue;
        }
        let result = check_planned(project, &plan, name, inherited[name].clone(), cache);
        if result.is_err() {
            stopped_by.insert(name, name.clone());
        }
        checked.insert(name, result);
    }
    let mut passed = Vec::new();
    let mut problems = Vec::new();
    let mut reported = std::collections::BTreeSet::new();
    for name in names {
        let cause = match failed.get(name) {
            // Its own problem was reported already, as the cause of an image before it.
            None if reported.contains(name) => continue,
            None => {
                // The problem that stopped it first, so that "reported above" holds.
                if let Some(cause) = stopped_by.get(name).filter(|c| *c != name)
                    && reported.insert(cause.clone())
                    && let Some(Err(error)) = checked.remove(cause)
                {
                    match error {
                        Error::Many(errors) => problems.extend(errors),
                        error => problems.push(error),
                    }
                }
                match checked.remove(name).expect("checked in plan order") {
                    Ok(checksum) => passed.push((name.clone(), checksum)),
                    Err(Error::Many(errors)) => problems.extend(errors),
                    Err(error) => problems.push(error),
                }
                continue;
            }
            Some(Failure::Own(_)) => name.clone(),
            Some(Failure::Parent(cause)) => cause.clone(),
        };
        if reported.insert(cause.clone())
            && let Some(Failure::Own(error)) = failed.remove(&cause)
        {
            problems.push(error);
        }
        if cause != *name {
            problems.push(Error::ParentFailed {
                image: name.to_string(),
                parent: cause.to_string(),
                path: project.images_dir().join(name.as_str()).join("image.toml"),
            });
        }
    }
    (passed, problems, plan.hashing)
}

fn check_planned(
    project: &Project,
    plan: &Plan,
    name: &Name,
    inherited: Option<Vec<String>>,
    cache: &Path,
) -> Result<String> {
    let image = plan.get(name);
    let mut problems = lints_under(image, inherited);
    problems.extend(wheels_fit(project, image));
    problems.extend(apt_files_agree(project, image, cache).0);
    for (pin, patches) in image.pins.sources.iter().zip(&image.patches) {
        if patches.sets.is_empty() {
            continue;
        }
        match fetch::fetch_source(cache, image, pin, patches) {
            Err(error) => problems.push(error),
            Ok(fetched) => problems.extend(needing_a_person(image, pin, patches, &fetched.repo)?),
        }
    }
    match problems.len() {
        0 => Ok(image.checksum.to_string()),
        1 => Err(problems.remove(0)),
        _ => Err(Error::Many(problems)),
    }
}

/// The patches of a series that applies which still need a person, judged as `patches
/// report` judges them (the same code): one that may already be upstream applies, and
/// repeats what is there (a second definition of a function). Each a problem naming it.
fn needing_a_person(
    image: &PlannedImage,
    pin: &crate::inputs::pins::SourcePin,
    patches: &crate::inputs::patches::SourcePatches,
    repo: &Path,
) -> Result<Vec<Error>> {
    use crate::inputs::patches::report;
    let rows = report::examine(
        &report::Target {
            image: image.name().as_str(),
            source: pin.name.as_str(),
            repo,
            commit: &pin.commit,
            pin: &pin.commit,
            sets: &patches.sets,
        },
        report::Asked::default(),
    )?;
    Ok(rows
        .iter()
        .filter(|r| r.needs_person())
        .map(|r| Error::Lint {
            image: image.name().to_string(),
            path: r.file.path.clone(),
            message: format!(
                "patch `{}/{}` of source `{}` {}: {}",
                r.set,
                r.patch,
                r.source,
                r.status.word(),
                r.evidence.as_deref().or(r.doubtful.as_deref()).unwrap_or("it needs a person")
            ),
            hint: Some(format!(
                "`hallmark patches report {}` shows it; drop the patch from the series if upstream has it",
                image.name()
            )),
        })
        .collect())
}

/// apt pins whose package file (in the layer store, where `lock` or a build put it) says
/// another name, version or architecture than the pin (a hand edit: the SBOM and the
/// provenance said one version and the image held another), each an error at its key in the
/// pins file; and, as warnings, the pins whose file could not be read, so not checked.
fn apt_files_agree(
    project: &Project,
    image: &PlannedImage,
    cache: &Path,
) -> (Vec<Error>, Vec<String>) {
    let (mut problems, mut unread) = (Vec::new(), Vec::new());
    if image.pins.apt.is_empty() {
        return (problems, unread);
    }
    let path = pins::path_for(&project.root, image.name());
    let text = fs_err::read_to_string(&path).unwrap_or_default();
    let shown = path.strip_prefix(&project.root).unwrap_or(&path).display();
    for pin in &image.pins.apt {
        let file = crate::plan::apt::deb_in_cache(cache, &pin.sha256);
        if !file.exists() {
            unread.push(format!(
                "{shown}: apt `{}`: its package file is not in the layer store yet, so its version is not checked against the file (`hallmark build {}` fetches it)",
                pin.describe(),
                image.name()
            ));
            continue;
        }
        let control = match crate::plan::apt::control_of(&file) {
            Ok(control) => control,
            Err(why) => {
                unread.push(format!(
                    "{shown}: apt `{}`: its package file {} cannot be read ({why}), so its version is not checked against the file",
                    pin.describe(),
                    file.display()
                ));
                continue;
            }
        };
        for (field, pinned, said) in crate::plan::apt::differences(pin, &control) {
            problems.push(Error::from(crate::error::Invalid {
                location: crate::inputs::spec::locate(&text, &["apt", pin.sha256.as_str(), field]),
                path: path.clone(),
                key: Some(format!("apt.{field}")),
                message: format!(
                    "apt package `{}`: `{field}` is {pinned}, and its package file ({}) says {said}",
                    pin.name, pin.path
                ),
                hint: Some(format!(
                    "the pins are what the archive's index and the file say: undo the edit, or run `hallmark lock --update {}`",
                    image.name()
                )),
            }));
        }
    }
    (problems, unread)
}

/// What `check` could not check of the apt pins of `names`: those whose package file is not
/// in the layer store yet, or cannot be read (warnings, not problems).
pub fn apt_unread(project: &Project, names: &[Name], cache: &Path) -> Vec<String> {
    let (plan, _) = Plan::each(project, names);
    names
        .iter()
        .filter_map(|n| plan.images.get(n))
        .flat_map(|image| apt_files_agree(project, image, cache).1)
        .collect()
}

/// Wheel pins that pip would not install on the Python pinned for them (a hand edit, or a
/// pin from before `[python]`).
fn wheels_fit(project: &Project, image: &PlannedImage) -> Vec<Error> {
    if image.pins.wheels.is_empty() {
        return Vec::new();
    }
    let Ok(Some(python)) = pins::read(&project.root, image.name()).map(|p| p.python) else {
        return Vec::new();
    };
    image
        .pins
        .wheels
        .iter()
        .filter(|pin| python::parse_name(&pin.file).is_ok_and(|file| !python.accepts(&file)))
        .map(|pin| Error::Pin {
            image: image.name().to_string(),
            path: pins::path_for(&project.root, image.name()),
            what: format!(
                "wheel `{}`: {} does not install on the pinned {}",
                pin.name,
                pin.file,
                python.describe()
            ),
        })
        .collect()
}

/// The ENTRYPOINT an image inherits from its parent chain, when it is known: a spec's own,
/// else its parent's, else what the base's pin recorded. (A loop: chains can be thousands
/// deep.)
pub fn inherited_entrypoint(plan: &Plan, image: &PlannedImage) -> Option<Vec<String>> {
    let mut current = image;
    loop {
        match current.loaded.spec.parent() {
            Parent::External(_) => {
                return current
                    .pins
                    .base
                    .as_ref()
                    .and_then(|b| b.entrypoint.clone());
            }
            Parent::Image(parent) => {
                current = plan.get(parent);
                if let Some(entrypoint) = &current.loaded.spec.container.entrypoint {
                    return Some(entrypoint.clone());
                }
            }
        }
    }
}

/// Spec mistakes that parse but would ship a broken image.
pub fn lints(plan: &Plan, image: &PlannedImage) -> Vec<Error> {
    lints_under(image, inherited_entrypoint(plan, image))
}

/// [`lints`], given the ENTRYPOINT the image inherits.
fn lints_under(image: &PlannedImage, inherited: Option<Vec<String>>) -> Vec<Error> {
    let mut found = Vec::new();
    let container = &image.loaded.spec.container;
    let Some(baked) = inherited.filter(|e| !e.is_empty()) else {
        return found;
    };
    let shown = baked.join(" ");
    let lint = |message: String, hint: &str| Error::Lint {
        image: image.name().to_string(),
        path: image.loaded.path.clone(),
        message,
        hint: Some(hint.into()),
    };
    if let Some(entrypoint) = &container.entrypoint
        && entrypoint.starts_with(&baked)
    {
        found.push(lint(
                format!("`container.entrypoint` repeats the base's baked ENTRYPOINT `{shown}`"),
                "drop `entrypoint`: the base already runs it, and a launcher that passes the same words doubles them",
            ));
    }
    if let (None, Some(cmd)) = (&container.entrypoint, &container.cmd)
        && cmd.starts_with(&baked)
    {
        found.push(lint(
                format!("`container.cmd` starts with the base's ENTRYPOINT `{shown}`: the container would run `{shown} {}`", cmd.join(" ")),
                "give `cmd` only the arguments (model and flags): the baked ENTRYPOINT comes first",
            ));
    }
    found
}

/// The lints cost nothing and a wrong ENTRYPOINT costs a deployment: refused before building.
pub fn refuse_lint_problems(plan: &Plan) -> Result<()> {
    let mut problems: Vec<Error> = plan
        .order
        .iter()
        .flat_map(|n| lints(plan, plan.get(n)))
        .collect();
    match problems.len() {
        0 => Ok(()),
        1 => Err(problems.remove(0)),
        _ => Err(Error::Many(problems)),
    }
}
