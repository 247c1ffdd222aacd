//! `hallmark checksum`: `<checksum>  <image>` per image, offline; `--explain` prints the
//! document each checksum is the sha256 of.

use super::hashing_note;
use crate::cli::Selection;
use crate::error::{ExitStatus, Result};
use crate::output::Row;
use crate::plan::Plan;
use crate::settings::Settings;
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
    let plan = Plan::new(&settings.project, &names)?;
    hashing_note(settings, plan.hashing);
    // `--json` takes precedence over `--explain` (docs/checksum.md).
    if explain && !settings.output.json {
        for name in &names {
            crate::output::stdout_exactly(&plan.get(name).document);
        }
        return Ok(ExitStatus::Success);
    }
    let rows: Vec<_> = names
        .iter()
        .map(|n| Checksum {
            checksum: plan.get(n).checksum.to_string(),
            image: n.to_string(),
        })
        .collect();
    settings.output.table("images", &rows);
    Ok(ExitStatus::Success)
}
