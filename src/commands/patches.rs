//! `hallmark patches`: import a patch set, report how each patch applies at the pin or at a
//! candidate pin, refresh a series for a new pin (docs/patches.md).

use crate::cli::PatchesCommand;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::patches::report::{PatchStatus, Status};
use crate::inputs::values::Name;
use crate::output::{Row, cell};
use crate::plan::patched::{examine, images_using};

pub(super) fn run(settings: &Settings, command: &PatchesCommand) -> Result<ExitStatus> {
    match command {
        PatchesCommand::Report { image, rev, source } => {
            let rows = examine(
                &settings.project,
                &settings.cache,
                image.as_deref(),
                rev.as_deref(),
                source.as_deref(),
                false,
            )?;
            Ok(print_report(settings, &rows))
        }
        PatchesCommand::Import {
            set,
            from,
            range,
            force,
        } => import(settings, set, from, range.as_deref(), *force),
        PatchesCommand::Refresh {
            image,
            rev,
            source,
            force,
            accept_fuzz,
        } => refresh(
            settings,
            image.as_deref(),
            rev,
            source.as_deref(),
            (*force, *accept_fuzz),
        ),
    }
}

impl Row for PatchStatus {
    fn header() -> Option<String> {
        Some(format!("{:<10} {:<44} {}", "STATUS", "PATCH", "DETAIL"))
    }

    fn lines(&self) -> Vec<String> {
        vec![format!(
            "{:<10} {:<44} {}",
            self.status.word(),
            format!("{}/{}", self.set, self.patch),
            detail(self)
        )]
    }
}

/// The status's particulars, as one cell.
fn detail(row: &PatchStatus) -> String {
    let mut parts = Vec::new();
    if let Some(offset) = row.offset {
        parts.push(format!("hunks moved up to {offset} lines"));
    }
    if let Some(fuzz) = row.fuzz {
        parts.push(format!("only {fuzz} context lines matched"));
    }
    if row.status == Status::Upstream {
        parts.push("already upstream (reverses cleanly)".into());
    }
    if let Some(evidence) = &row.evidence {
        parts.push(match row.conflicts.is_empty() {
            true => format!("may already be upstream: {evidence}"),
            false => format!("probably upstream in another form: {evidence}"),
        });
    }
    if let Some(words) = &row.doubtful {
        parts.push(format!(
            "doubtful: a hunk moves into another function: {words}"
        ));
    }
    for conflict in row.conflicts.iter().filter(|_| row.evidence.is_none()) {
        parts.push(match &conflict.hunk {
            Some(hunk) => format!("{} hunk {hunk}", conflict.file),
            None => conflict.file.clone(),
        });
    }
    if let Some(why) = &row.whitespace {
        parts.push(why.clone());
    }
    if !row.after.is_empty() {
        parts.push(format!("applies only after {}", row.after.join(", ")));
    }
    cell(&parts.join("; "))
}

/// Prints the rows (one table per image and source) and gives 0 when every patch applies as
/// it is, 1 otherwise.
fn print_report(settings: &Settings, rows: &[PatchStatus]) -> ExitStatus {
    if !settings.output.json {
        let mut shown = None;
        for row in rows {
            let at = (row.image.as_str(), row.source.as_str(), row.commit.as_str());
            if shown != Some(at) {
                settings.output.note(format!(
                    "{} source `{}` at {}:",
                    row.image, row.source, row.commit
                ));
                shown = Some(at);
            }
        }
    }
    settings.output.table("patches", rows);
    // The judgement check, refresh and bump share: as it is, or a person is needed.
    let failing = rows.iter().filter(|r| !r.status.as_is()).count();
    if failing > 0 {
        settings.output.note(format!(
            "{failing} of {} patches do not apply as they are",
            rows.len()
        ));
    }
    let doubtful = (rows.iter())
        .filter(|r| r.status.as_is() && r.needs_person())
        .count();
    if doubtful > 0 {
        settings.output.note(format!(
            "{doubtful} of {} patches apply, but a hunk lands in another function than at the pin (doubtful)",
            rows.len()
        ));
    }
    let failing = failing + doubtful;
    ExitStatus::from_success(failing == 0)
}

fn import(
    settings: &Settings,
    set: &str,
    from: &std::path::Path,
    range: Option<&str>,
    force: bool,
) -> Result<ExitStatus> {
    let set = Name::try_from(set.to_string()).map_err(Error::usage)?;
    let written = crate::inputs::patches::import::import(
        &settings.project.patches_dir(),
        &set,
        from,
        range,
        force,
    )?;
    settings.output.note(format!(
        "wrote {} patches and their series to {}",
        written.len(),
        settings.project.patches_dir().join(set.as_str()).display()
    ));
    // The set is written: from here on, nothing fails the import but a patch that does not
    // apply (exit 1). An image that cannot be examined yet (its pins not locked, its spec
    // wrong) is said on stderr and left out; `--json` always prints the report document, empty
    // when no image applies the set yet (it printed nothing, and a missing pin exited 2 after
    // the set was written).
    let users = images_using(&settings.project, &set)?;
    if users.is_empty() {
        settings.output.note(format!(
            "no image applies `{set}` yet: add it to a `[[source]]`'s `patches`, then run `hallmark patches report`"
        ));
    }
    let mut rows = Vec::new();
    for image in &users {
        match examine(&settings.project, &settings.cache, Some(image.as_str()), None, None, false) {
            Ok(found) => rows.extend(found),
            Err(e) => settings.output.note(format!(
                "warning: `{image}` applies `{set}` but was not examined: {e}; run `hallmark patches report {image}` once it plans (`hallmark lock {image}` for its pins)"
            )),
        }
    }
    Ok(print_report(settings, &rows))
}

fn refresh(
    settings: &Settings,
    image: Option<&str>,
    rev: &str,
    source: Option<&str>,
    (force, accept_fuzz): (bool, bool),
) -> Result<ExitStatus> {
    let rows = examine(
        &settings.project,
        &settings.cache,
        image,
        Some(rev),
        source,
        true,
    )?;
    let outcome = crate::inputs::patches::refresh::refresh(&rows, force, accept_fuzz)?;
    let status = print_report(settings, &rows);
    for line in outcome.lines() {
        settings.output.note(line);
    }
    // The rows describe the series before the refresh: the refresh's own outcome decides.
    let _ = status;
    // A doubtful match left as it is fails the refresh as a conflict does: the series does
    // not yet apply as it is at `rev`.
    Ok(ExitStatus::from_success(
        outcome.conflicting.is_empty() && outcome.doubtful.is_empty(),
    ))
}
