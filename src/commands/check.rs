//! `hallmark check`: specs, pins, patch series and lints; no engine needed.

use super::hashing_note;
use crate::cli::Selection;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use serde::Serialize;

/// An image that passed; with `--json`, the problems are the errors' messages.
#[derive(Serialize)]
struct Passed {
    checksum: String,
    image: String,
    ok: bool,
}

pub(super) fn run(settings: &Settings, selection: &Selection) -> Result<ExitStatus> {
    let names = settings.selection(selection)?;
    let (passed, problems, hashing) =
        crate::plan::check::check(&settings.project, &names, &settings.cache);
    hashing_note(settings, hashing);
    let unreviewed = crate::plan::check::unreviewed(&settings.project, &names);
    let mut warnings: Vec<String> = unreviewed
        .iter()
        .map(|(path, mark)| {
            format!(
                "{}: {mark}; review where it landed, then delete its `{}` line",
                path.strip_prefix(&settings.project.root)
                    .unwrap_or(path)
                    .display(),
                crate::inputs::patches::REVIEW_MARK
            )
        })
        .collect();
    warnings.extend(crate::plan::check::apt_unread(
        &settings.project,
        &names,
        &settings.cache,
    ));
    if settings.output.json {
        let passed: Vec<_> = passed
            .iter()
            .map(|(n, c)| Passed {
                checksum: c.to_string(),
                image: n.to_string(),
                ok: true,
            })
            .collect();
        let problems: Vec<_> = problems.iter().map(|e| e.to_string()).collect();
        settings.output.document(&[
            ("passed", serde_json::to_value(&passed).expect("json")),
            ("problems", serde_json::to_value(&problems).expect("json")),
            ("warnings", serde_json::to_value(&warnings).expect("json")),
        ]);
    } else {
        for (name, _) in &passed {
            settings.output.note(format!("ok  {name}"));
        }
        for warning in &warnings {
            settings.output.note(format!("warning: {warning}"));
        }
    }
    if problems.is_empty() {
        return Ok(ExitStatus::Success);
    }
    Err(Error::Many(problems))
}
