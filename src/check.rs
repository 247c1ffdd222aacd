//! `hallmark check`: everything that can be known before a build, in seconds. Each image is
//! checked on its own so one broken spec does not hide the others' problems.

use crate::error::{Error, Result};
use crate::plan::{Plan, PlannedImage};
use crate::project::Project;
use crate::spec::Parent;
use crate::values::Name;
use crate::{fetch, pins, wheel};
use std::path::Path;

/// Checks `names`; returns the checked plans and every problem found.
pub fn check(project: &Project, names: &[Name], cache: &Path) -> (Vec<(Name, String)>, Vec<Error>) {
    let mut passed = Vec::new();
    let mut problems = Vec::new();
    for name in names {
        match check_one(project, name, cache) {
            Ok(checksum) => passed.push((name.clone(), checksum)),
            Err(Error::Many(errors)) => problems.extend(errors),
            Err(error) => problems.push(error),
        }
    }
    (passed, problems)
}

fn check_one(project: &Project, name: &Name, cache: &Path) -> Result<String> {
    let plan = Plan::new(project, std::slice::from_ref(name))?;
    let image = plan.get(name);
    let mut problems = lints(&plan, image);
    problems.extend(wheels_fit(project, image));
    for (pin, patches) in image.pins.sources.iter().zip(&image.patches) {
        if patches.sets.is_empty() {
            continue;
        }
        if let Err(error) = fetch::fetch_source(cache, image, pin, patches) {
            problems.push(error);
        }
    }
    match problems.len() {
        0 => Ok(image.checksum.to_string()),
        1 => Err(problems.remove(0)),
        _ => Err(Error::Many(problems)),
    }
}

/// Wheel pins that pip would not install on the Python pinned for them (a hand edit, or a
/// pin from before `[python]`).
fn wheels_fit(project: &Project, image: &PlannedImage) -> Vec<Error> {
    let Ok(Some(python)) = pins::read(&project.root, image.name()).map(|p| p.python) else {
        return Vec::new();
    };
    image
        .pins
        .wheels
        .iter()
        .filter(|pin| wheel::parse_name(&pin.file).is_ok_and(|file| !python.accepts(&file)))
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
/// else its parent's, else what the base's pin recorded.
pub fn inherited_entrypoint(plan: &Plan, image: &PlannedImage) -> Option<Vec<String>> {
    match image.loaded.spec.parent() {
        Parent::External(_) => image.pins.base.as_ref().and_then(|b| b.entrypoint.clone()),
        Parent::Image(parent) => {
            let parent = plan.get(parent);
            parent
                .loaded
                .spec
                .container
                .entrypoint
                .clone()
                .or_else(|| inherited_entrypoint(plan, parent))
        }
    }
}

/// Spec mistakes that parse but would ship a broken image.
pub fn lints(plan: &Plan, image: &PlannedImage) -> Vec<Error> {
    let mut found = Vec::new();
    let container = &image.loaded.spec.container;
    let Some(baked) = inherited_entrypoint(plan, image).filter(|e| !e.is_empty()) else {
        return found;
    };
    let shown = baked.join(" ");
    let lint = |message: String, hint: &str| Error::Lint {
        image: image.name().to_string(),
        path: image.loaded.path.clone(),
        message,
        hint: Some(hint.into()),
    };
    if let Some(entrypoint) = &container.entrypoint {
        if entrypoint.starts_with(&baked) {
            found.push(lint(
                format!("`container.entrypoint` repeats the base's baked ENTRYPOINT `{shown}`"),
                "drop `entrypoint`: the base already runs it, and a launcher that passes the same words doubles them",
            ));
        }
    }
    if let (None, Some(cmd)) = (&container.entrypoint, &container.cmd) {
        if cmd.starts_with(&baked) {
            found.push(lint(
                format!("`container.cmd` starts with the base's ENTRYPOINT `{shown}`: the container would run `{shown} {}`", cmd.join(" ")),
                "give `cmd` only the arguments (model and flags): the baked ENTRYPOINT comes first",
            ));
        }
    }
    found
}
