//! What `bump` shows of a pin's move: each candidate looked at (a row), the one chosen, the
//! first that broke the build, and the document `--json` prints.

use super::{Candidate, Proposal};
use crate::error::Error;
use crate::output::{Column, Output, Row};
use crate::plan::pin_moves::Order;
use serde::Serialize;

/// One candidate looked at: its pin, and what became of it.
#[derive(Serialize)]
pub struct Tried {
    pub(super) candidate: String,
    pub(super) pin: String,
    /// `newer` (the newest worth pinning), `same` (the pinned image again: skipped), `no
    /// wheel` (none for this Python), `builds`, `fails`, `unpinnable`.
    pub(super) verdict: &'static str,
    pub(super) error: Option<String>,
}

impl Tried {
    pub(super) fn seen(candidate: &str, pin: &str, same: bool) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: pin.to_string(),
            verdict: if same { "same" } else { "newer" },
            error: None,
        }
    }

    pub(super) fn built(candidate: &str, proposal: &Proposal, failure: Option<&str>) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: proposal.pin.clone(),
            verdict: if failure.is_some() { "fails" } else { "builds" },
            error: failure.map(str::to_string),
        }
    }

    pub(super) fn unpinned(candidate: &str, error: &Error) -> Tried {
        Tried {
            candidate: candidate.to_string(),
            pin: String::new(),
            verdict: "unpinnable",
            error: Some(error.to_string()),
        }
    }
}

/// Adds `row`, in place of the search's row for the same candidate (`newer`: found, not yet
/// built), so that each candidate is one row.
pub(super) fn record(tried: &mut Vec<Tried>, row: Tried) {
    match tried
        .iter_mut()
        .find(|t| t.candidate == row.candidate && t.verdict == "newer")
    {
        Some(found) => *found = row,
        None => tried.push(row),
    }
}

impl Row for Tried {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 4] = [
            Column::left("candidate", 9),
            Column::left("verdict", 7),
            Column::left("pin", 0),
            Column::left("error", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        vec![vec![
            self.candidate.clone(),
            self.verdict.into(),
            self.pin.clone(),
            self.error.clone().unwrap_or_default(),
        ]]
    }
}

#[derive(Serialize)]
pub(super) struct Chosen {
    pub(super) candidate: String,
    pub(super) pin: String,
}

impl Chosen {
    pub(super) fn of(candidate: &Candidate, proposal: &Proposal) -> Chosen {
        Chosen {
            candidate: candidate.name.clone(),
            pin: proposal.pin.clone(),
        }
    }
}

/// The first candidate whose build or smoke tests failed (`--bisect`).
#[derive(Serialize)]
pub(super) struct Broken {
    pub(super) candidate: String,
    pub(super) error: String,
}

#[derive(Serialize)]
pub(super) struct Report {
    /// `base`, `wheel` or `apt`.
    pub(super) what: &'static str,
    /// The base's repository, the wheel's name, or `apt`.
    pub(super) subject: String,
    /// What is pinned before: the base's tag, the wheel's version, how many apt packages.
    pub(super) from: String,
    pub(super) order: Option<Order>,
    /// Why the other tags or versions listed are not candidates (pre-releases, other
    /// flavours or families, excluded), one sentence each.
    pub(super) skipped: Vec<String>,
    pub(super) candidates: usize,
    pub(super) chosen: Option<Chosen>,
    /// What lock said it pinned.
    pub(super) changes: Vec<String>,
    pub(super) written: bool,
    pub(super) broken: Option<Broken>,
}

pub(super) fn show(output: &Output, tried: &[Tried], report: &Report) {
    if output.json {
        output.document(&[
            ("tried", serde_json::to_value(tried).expect("json")),
            ("bump", serde_json::to_value(report).expect("json")),
        ]);
        return;
    }
    for reason in &report.skipped {
        output.note(format!("skipped: {reason}"));
    }
    if !tried.is_empty() {
        output.table("tried", tried);
    }
    for change in &report.changes {
        output.note(format!("lock: {change}"));
    }
    output.note(match (&report.chosen, report.written) {
        (Some(c), true) => format!("pinned {} ({})", c.candidate, c.pin),
        (Some(c), false) => format!(
            "would pin {} ({}); --dry-run wrote nothing",
            c.candidate, c.pin
        ),
        (None, _) => "nothing pinned".into(),
    });
}
