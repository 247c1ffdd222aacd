//! `hallmark checksum`: `<checksum>  <image>` per image, offline; `--explain` prints the
//! document each checksum is the sha256 of.

use super::hashing_note;
use crate::cli::Selection;
use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::output::Row;
use serde::Serialize;

#[derive(Serialize)]
struct Checksum {
    checksum: String,
    image: String,
}

impl Row for Checksum {
    fn lines(&self) -> Vec<String> {
        vec![format!("{}  {}", self.checksum, self.image)]
    }
}

pub(super) fn run(settings: &Settings, selection: &Selection, explain: bool) -> Result<ExitStatus> {
    let names = settings.selection(selection)?;
    // An image that cannot be planned is said on stderr and has no line; the others are
    // printed (the first broken spec hid every checksum), and the exit is 2.
    let (plan, unplanned) = super::plan_each(settings, &names);
    let status = match unplanned.is_empty() {
        true => ExitStatus::Success,
        false => ExitStatus::BadInput,
    };
    let names: Vec<_> = names
        .into_iter()
        .filter(|n| !unplanned.contains_key(n))
        .collect();
    hashing_note(settings, plan.hashing);
    // `--json` takes precedence over `--explain` (docs/checksum.md).
    if explain && !settings.output.json {
        for name in &names {
            crate::output::stdout_exactly(&plan.get(name).document);
        }
        return Ok(status);
    }
    let rows: Vec<_> = names
        .iter()
        .map(|n| Checksum {
            checksum: plan.get(n).checksum.to_string(),
            image: n.to_string(),
        })
        .collect();
    settings.output.table("images", &rows);
    Ok(status)
}
