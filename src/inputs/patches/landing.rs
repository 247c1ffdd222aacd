//! Where a patch's hunks land: each hunk's file, first line and the function git names in its
//! header. Comparing where a patch lands at a candidate commit with where it landed at its own
//! pin tells an offset that only moved lines from one that moved a hunk into another function
//! (git takes identical lines elsewhere): the second needs a person.

use crate::error::Result;
use crate::inputs::git;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: String,
    pub line: String,
    pub function: String,
}

/// Where the change between two trees lands (`git diff-tree -p`, git's default context and
/// function names, as a refreshed patch is written).
pub fn between(repo: &Path, before: &str, after: &str, what: &Path) -> Result<Vec<Place>> {
    let mut command = git::git(repo);
    command.args(["diff-tree", "-p", "--no-renames", before, after]);
    let diff = git::run(&mut command, || {
        format!("diffing where {} lands", what.display())
    })?;
    Ok(places(&diff, 1))
}

/// Each hunk of a diff: its file (after `strip` components), the new side's first line and
/// the function in its header.
pub fn places(diff: &str, strip: u32) -> Vec<Place> {
    let mut file = String::new();
    let mut places = Vec::new();
    for line in diff.lines() {
        if let Some(path) = line.strip_prefix("+++ ") {
            let path = path.split('\t').next().unwrap_or_default();
            file = path
                .splitn(strip as usize + 1, '/')
                .last()
                .unwrap_or(path)
                .to_string();
        } else if let Some(rest) = line.strip_prefix("@@ ") {
            let Some((ranges, context)) = rest.split_once(" @@") else {
                continue;
            };
            let start = ranges
                .split_whitespace()
                .find_map(|r| r.strip_prefix('+'))
                .and_then(|r| r.split(',').next())
                .unwrap_or("?");
            places.push(Place {
                file: file.clone(),
                line: start.to_string(),
                function: context.trim().to_string(),
            });
        }
    }
    places
}

/// Whether a function named where the patch was (`was`) is no longer named by any hunk of
/// that file where it lands (`now`); hunks may split or join, so as sets. A place with no
/// function (`diff -u` without `-p`, the top of a file) is judged by nothing.
pub fn moved_function(was: &[Place], now: &[Place]) -> bool {
    was.iter().filter(|w| !w.function.is_empty()).any(|w| {
        !now.iter()
            .any(|n| n.file == w.file && n.function == w.function)
    })
}

/// `it would land at F:L (in `f`); the patch had F:L (in `g`)`.
pub fn words(now: &[Place], was: &[Place]) -> String {
    let list = |places: &[Place]| match places.is_empty() {
        true => "no hunk".to_string(),
        false => places
            .iter()
            .map(|p| match p.function.as_str() {
                "" => format!("{}:{}", p.file, p.line),
                f => format!("{}:{} (in `{f}`)", p.file, p.line),
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "it would land at {}; the patch had {}",
        list(now),
        list(was)
    )
}
