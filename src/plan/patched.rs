//! The patched sources of a project's images examined (`patches report`, `import`,
//! `refresh`): each source's series at its pin or at a `--rev` fetched into the cache, one
//! row per patch (inputs/patches/report.rs judges them).

use crate::error::{Error, Result};
use crate::inputs::patches::report::{self, PatchStatus, Target};
use crate::inputs::project::Project;
use crate::inputs::values::Name;
use crate::plan::Plan;
use crate::plan::fetch;
use std::path::Path;

/// Every patched source of the images asked for, examined at its pin or at `rev`.
pub fn examine(
    project: &Project,
    cache: &Path,
    image: Option<&str>,
    rev: Option<&str>,
    source: Option<&str>,
    keep_trees: bool,
) -> Result<Vec<PatchStatus>> {
    let names = match image {
        Some(image) => vec![project.image_name(image)?],
        None => project.all_images()?,
    };
    let plan = Plan::new(project, &names)?;
    let mut rows = Vec::new();
    let mut examined = 0;
    for name in &names {
        let planned = plan.get(name);
        let patched: Vec<_> = (planned.pins.sources.iter().zip(&planned.patches))
            .filter(|(pin, p)| !p.sets.is_empty() && source.is_none_or(|s| pin.name.as_str() == s))
            .collect();
        if rev.is_some() && patched.len() > 1 {
            return Err(Error::usage(format!(
                "image `{name}` has {} patched sources: name the one `--rev` is for with `--source`",
                patched.len()
            )));
        }
        for (pin, patches) in patched {
            let repo = fetch::ensure_commit(cache, &pin.git, &pin.commit)?;
            let commit = match rev {
                Some(rev) => candidate(cache, &pin.git, rev)?,
                None => pin.commit.clone(),
            };
            rows.extend(report::examine(
                &Target {
                    image: name.as_str(),
                    source: pin.name.as_str(),
                    repo: &repo,
                    commit: &commit,
                    pin: &pin.commit,
                    sets: &patches.sets,
                },
                report::Asked {
                    trees: keep_trees,
                    after: true,
                },
            )?);
            examined += 1;
        }
    }
    if examined == 0 {
        return Err(nothing_patched(image, source));
    }
    Ok(rows)
}

/// The commit `rev` names in `url`, fetched into the cache. A rev that names nothing there
/// is bad input (exit 2), not failed work: git answered, and said no.
fn candidate(cache: &Path, url: &str, rev: &str) -> Result<crate::inputs::values::GitCommit> {
    let named_nothing = |error: Error| match error {
        Error::Command {
            context: Some(context),
            stderr,
            ..
        } if stderr.is_empty() => Error::Usage {
            message: format!("--rev `{rev}`: {context}"),
            hint: Some(
                "--rev takes a tag, branch or 40-hex commit of the source's repository".into(),
            ),
        },
        other => other,
    };
    let commit = fetch::resolve_rev(url, rev).map_err(named_nothing)?;
    fetch::ensure_commit(cache, url, &commit).map_err(named_nothing)?;
    Ok(commit)
}

fn nothing_patched(image: Option<&str>, source: Option<&str>) -> Error {
    let what = match (image, source) {
        (Some(image), Some(source)) => format!("image `{image}` has no patched source `{source}`"),
        (Some(image), None) => format!("image `{image}` applies no patch sets"),
        (None, _) => "no image of the project applies patch sets".into(),
    };
    Error::Usage {
        message: what,
        hint: Some("a `[[source]]` lists its sets as `patches = [\"<set>\"]`".into()),
    }
}

/// The images whose sources list patch set `set`.
pub fn images_using(project: &Project, set: &Name) -> Result<Vec<Name>> {
    let mut users = Vec::new();
    for name in project.image_names()? {
        let loaded = project.load_spec(&name)?;
        if loaded
            .spec
            .sources
            .iter()
            .any(|s| s.patches.iter().any(|p| p.get_ref() == set))
        {
            users.push(name);
        }
    }
    Ok(users)
}
