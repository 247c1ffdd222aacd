//! `hallmark check`: specs, pins, patch series and lints; no engine needed.

use super::hashing_note;
use crate::cli::Selection;
use crate::error::{Error, ExitStatus, Result};
use crate::settings::Settings;
use serde_json::json;

pub(super) fn run(settings: &Settings, selection: &Selection) -> Result<ExitStatus> {
    let names = settings.selection(selection)?;
    let (passed, problems, hashing) =
        crate::check::check(&settings.project, &names, &settings.cache);
    hashing_note(settings, hashing);
    if settings.output.json {
        let rows: Vec<_> = passed
            .iter()
            .map(|(n, c)| json!({"image": n, "ok": true, "checksum": c}))
            .collect();
        let errors: Vec<_> = problems.iter().map(|e| e.to_string()).collect();
        settings
            .output
            .document(&[("passed", json!(rows)), ("problems", json!(errors))]);
    } else {
        for (name, _) in &passed {
            settings.output.note(format!("ok  {name}"));
        }
    }
    if problems.is_empty() {
        return Ok(ExitStatus::Success);
    }
    Err(Error::Many(problems))
}
