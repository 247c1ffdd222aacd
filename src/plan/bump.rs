//! `hallmark bump`'s search: the revisions a source's pin may move to (the branch's
//! first-parent history after the pin, or tags in version order), and the newest one where a
//! condition holds, found by bisection (docs/patches.md, "Moving to a new upstream").

use crate::error::{Error, Result};
use crate::inputs::git::{git, run};
use crate::inputs::values::GitCommit;
use crate::plan::fetch;
use std::path::{Path, PathBuf};

/// Where the candidates come from.
pub enum Along<'a> {
    /// The branch's first-parent history after the pin, up to `to` (a commit of it) if given.
    Branch {
        branch: &'a str,
        to: Option<&'a str>,
    },
    /// The tags matching a glob (`v*`), in version order, that descend from the pin.
    Tags(&'a str),
}

/// A revision the pin may move to.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub commit: GitCommit,
    /// The committer date, as git writes it (`2026-11-30T10:00:00+00:00`).
    pub date: String,
    /// The tag, in tags mode.
    pub tag: Option<String>,
}

/// The candidates after `pin` in `url`, oldest first, with the cache repository holding
/// them (their whole history fetched: the source cache otherwise holds pins only).
pub fn candidates(
    cache: &Path,
    url: &str,
    pin: &GitCommit,
    along: &Along<'_>,
) -> Result<(PathBuf, Vec<Candidate>)> {
    let repo = fetch::ensure_commit(cache, url, pin)?;
    let refspec = match along {
        Along::Branch { branch, .. } => format!("+refs/heads/{branch}:refs/hallmark/bump/{branch}"),
        Along::Tags(glob) => format!("+refs/tags/{glob}:refs/hallmark/bump-tags/{glob}"),
    };
    let mut command = git(&repo);
    command.args(["fetch", "--quiet", "--no-tags"]);
    // The cache fetched pins at depth 1: the history between them is needed here.
    if repo.join("shallow").exists() {
        command.arg("--unshallow");
    }
    command.args(["--", url, &refspec]);
    run(&mut command, || format!("fetching the history of {url}"))?;
    let listed = match along {
        Along::Branch { branch, to } => {
            let head = format!("refs/hallmark/bump/{branch}");
            let end = match to {
                None => head.clone(),
                Some(to) => {
                    let commit = fetch::resolve_rev(url, to)?;
                    let on_branch = git(&repo)
                        .args(["merge-base", "--is-ancestor", commit.as_str(), &head])
                        .status()
                        .is_ok_and(|s| s.success());
                    if !on_branch {
                        return Err(Error::usage(format!(
                            "--to `{to}` ({commit}) is not on branch `{branch}` of {url}"
                        )));
                    }
                    commit.to_string()
                }
            };
            // Only descendants of the pin: a pin off the branch's first-parent line (a tag on a
            // stable branch) must not move sideways to a commit that lacks what it had.
            let descends = git(&repo)
                .args(["merge-base", "--is-ancestor", pin.as_str(), &end])
                .status()
                .is_ok_and(|s| s.success());
            if !descends {
                return Err(Error::usage(format!(
                    "the pin {pin} is not in the history of `{branch}` (up to {end}) in {url}: name the branch it is on with --branch"
                )));
            }
            let log = run(
                git(&repo).args([
                    "log",
                    "--first-parent",
                    "--ancestry-path",
                    "--reverse",
                    "--format=%H %cI",
                    &format!("{pin}..{end}"),
                ]),
                || format!("listing the commits of `{branch}` after {pin}"),
            )?;
            if let Some(to) = to
                && !log.lines().any(|l| l.starts_with(end.as_str()))
            {
                return Err(Error::usage(format!(
                    "--to `{to}` ({end}) is not on the first-parent history of `{branch}` after the pin"
                )));
            }
            log.lines()
                .filter_map(|line| line.split_once(' '))
                .filter_map(|(hex, date)| {
                    Some(Candidate {
                        commit: GitCommit::try_from(hex.to_string()).ok()?,
                        date: date.to_string(),
                        tag: None,
                    })
                })
                .collect()
        }
        Along::Tags(_) => tags_after(&repo, pin)?,
    };
    Ok((repo, listed))
}

/// The fetched tags that descend from `pin` (not the pin itself), in version order.
fn tags_after(repo: &Path, pin: &GitCommit) -> Result<Vec<Candidate>> {
    let listing = run(
        git(repo).args([
            "for-each-ref",
            "--sort=version:refname",
            "--format=%(refname:lstrip=3) %(objectname) %(*objectname)",
            "refs/hallmark/bump-tags/",
        ]),
        || "listing the tags fetched".into(),
    )?;
    let mut tags = Vec::new();
    for line in listing.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(object)) = (words.next(), words.next()) else {
            continue;
        };
        // An annotated tag's commit is the object it points at.
        let hex = words.next().unwrap_or(object);
        let Ok(commit) = GitCommit::try_from(hex.to_string()) else {
            continue;
        };
        let after = commit != *pin
            && git(repo)
                .args(["merge-base", "--is-ancestor", pin.as_str(), commit.as_str()])
                .status()
                .is_ok_and(|s| s.success());
        if after {
            let date = run(
                git(repo).args(["show", "-s", "--format=%cI", commit.as_str()]),
                || format!("reading the date of {commit}"),
            )?;
            tags.push(Candidate {
                commit,
                date: date.trim().to_string(),
                tag: Some(name.to_string()),
            });
        }
    }
    // In git's version order (`git tag --sort=v:refname`), as listed.
    Ok(tags)
}

/// The newest of `n` candidates (oldest first) where `holds` is true, the pin before them
/// taken to hold: the newest is tried first (a week whose head applies costs one check),
/// then bisection between the pin and it. `holds` is asked at most 1 + ceil(log2(n)) times.
/// Bisection assumes that once the condition fails it stays failed; where it does not (a
/// conflict that a later commit undoes), the answer is a candidate that holds and whose next
/// one fails, not always the newest that holds.
pub fn newest_holding(
    n: usize,
    mut holds: impl FnMut(usize) -> Result<bool>,
) -> Result<Option<usize>> {
    if n == 0 {
        return Ok(None);
    }
    if holds(n - 1)? {
        return Ok(Some(n - 1));
    }
    // `good` holds (or is the pin, -1); `bad` does not.
    let (mut good, mut bad) = (-1i64, (n - 1) as i64);
    while bad - good > 1 {
        let middle = good + (bad - good) / 2;
        if holds(middle as usize)? {
            good = middle;
        } else {
            bad = middle;
        }
    }
    Ok((good >= 0).then_some(good as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_holding_is_found_in_at_most_one_plus_log2_checks() {
        for n in [1usize, 2, 3, 7, 200, 257] {
            for last_good in -1..n as i64 {
                let mut asked = 0;
                let found = newest_holding(n, |i| {
                    asked += 1;
                    Ok(i as i64 <= last_good)
                })
                .unwrap();
                assert_eq!(found, (last_good >= 0).then_some(last_good as usize), "{n}");
                let bound = 1 + (n as f64).log2().ceil() as usize;
                assert!(
                    asked <= bound,
                    "n={n} last_good={last_good}: {asked} > {bound}"
                );
            }
        }
        assert_eq!(newest_holding(0, |_| Ok(true)).unwrap(), None);
    }
}
