//! `hallmark bump`'s search: the revisions a source's pin may move to (the branch's
//! first-parent history after the pin, or tags in version order), and the newest one where a
//! condition holds, found by bisection (docs/patches.md, "Moving to a new upstream").

use crate::error::{Error, Result};
use crate::inputs::git::{git, run};
use crate::inputs::patches::PatchSet;
use crate::inputs::values::GitCommit;
use std::collections::BTreeSet;

pub mod pins;
pub mod saved;
pub mod series;
pub mod source;
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
    // The history and tags are fetched into the shared cache repository: one process at a time.
    let _turn = fetch::fetch_turn(cache, url)?;
    let listed = match along {
        Along::Branch { branch, to } => {
            is_branch(url, branch)?;
            fetch_refs(
                &repo,
                url,
                &[format!("+refs/heads/{branch}:refs/hallmark/bump/{branch}")],
            )?;
            branch_after(&repo, url, pin, branch, *to)?
        }
        Along::Tags(glob) => {
            let names = matching_tags(url, glob)?;
            // Only this run's tags: those an earlier run fetched (another glob) stay out.
            clear_refs(&repo, "refs/hallmark/bump-tags/")?;
            // Tag names cannot hold glob characters (git check-ref-format): each refspec is
            // one tag, as named.
            let refspecs: Vec<String> = names
                .iter()
                .map(|n| format!("+refs/tags/{n}:refs/hallmark/bump-tags/{n}"))
                .collect();
            fetch_refs(&repo, url, &refspecs)?;
            tags_after(&repo, pin)?
        }
    };
    Ok((repo, listed))
}

/// A branch that is not there is bad input, said in plain words (git's own fetch error
/// named a refspec).
fn is_branch(url: &str, branch: &str) -> Result<()> {
    let listing = run(
        std::process::Command::new("git").args(["ls-remote", "--heads", "--", url, branch]),
        || format!("asking {url} for branch `{branch}`"),
    )?;
    let wanted = format!("refs/heads/{branch}");
    match listing.lines().any(|l| l.ends_with(&wanted)) {
        true => Ok(()),
        false => Err(Error::Usage {
            message: format!("{url} has no branch `{branch}`"),
            hint: Some(
                "name the branch to walk with `--branch`, or tags with `--tags GLOB`".into(),
            ),
        }),
    }
}

/// The tags of `url` whose names match `glob` (matched here, never given to git).
fn matching_tags(url: &str, glob: &str) -> Result<Vec<String>> {
    let pattern = glob::Pattern::new(glob)
        .map_err(|e| Error::usage(format!("--tags `{glob}` is no glob: {e}")))?;
    let listing = run(
        std::process::Command::new("git").args(["ls-remote", "--tags", "--refs", "--", url]),
        || format!("listing the tags of {url}"),
    )?;
    let names: Vec<String> = listing
        .lines()
        .filter_map(|l| l.split_once('\t')?.1.strip_prefix("refs/tags/"))
        .filter(|name| pattern.matches(name))
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        return Err(Error::NothingMatched {
            message: format!("no tag of {url} matches `{glob}`"),
        });
    }
    Ok(names)
}

fn fetch_refs(repo: &Path, url: &str, refspecs: &[String]) -> Result<()> {
    let mut command = git(repo);
    command.args(["fetch", "--quiet", "--no-tags"]);
    // The cache fetched pins at depth 1: the history between them is needed here.
    if repo.join("shallow").exists() {
        command.arg("--unshallow");
    }
    command.args(["--", url]).args(refspecs);
    run(&mut command, || format!("fetching the history of {url}"))?;
    Ok(())
}

/// Deletes every ref under `prefix` of the cache repository.
fn clear_refs(repo: &Path, prefix: &str) -> Result<()> {
    let listing = run(
        git(repo).args(["for-each-ref", "--format=delete %(refname)", prefix]),
        || "listing earlier runs' refs".into(),
    )?;
    if listing.is_empty() {
        return Ok(());
    }
    crate::inputs::git::run_with_input(
        git(repo).args(["update-ref", "--stdin"]),
        listing.as_bytes(),
        || "deleting earlier runs' refs".into(),
    )?;
    Ok(())
}

/// The branch's first-parent line after `pin`, up to `to` when given (which must be on it).
fn branch_after(
    repo: &Path,
    url: &str,
    pin: &GitCommit,
    branch: &str,
    to: Option<&str>,
) -> Result<Vec<Candidate>> {
    let head = format!("refs/hallmark/bump/{branch}");
    // Only descendants of the pin: a pin off the branch's first-parent line (a tag on a
    // stable branch) must not move sideways to a commit that lacks what it had.
    let descends = git(repo)
        .args(["merge-base", "--is-ancestor", pin.as_str(), &head])
        .status()
        .is_ok_and(|s| s.success());
    if !descends {
        return Err(Error::usage(format!(
            "the pin {pin} is not in the history of `{branch}` in {url}: name the branch it is on with --branch"
        )));
    }
    let log = run(
        git(repo).args([
            "log",
            "--first-parent",
            "--ancestry-path",
            "--reverse",
            "--format=%H %cI",
            &format!("{pin}..{head}"),
        ]),
        || format!("listing the commits of `{branch}` after {pin}"),
    )?;
    let mut listed: Vec<Candidate> = log
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter_map(|(hex, date)| {
            Some(Candidate {
                commit: GitCommit::try_from(hex.to_string()).ok()?,
                date: date.to_string(),
                tag: None,
            })
        })
        .collect();
    if let Some(to) = to {
        let end = resolve_to(repo, url, to)?;
        // On the first-parent line of the branch's head, after the pin: a commit of a merged
        // side branch is an ancestor of the head, and still refused.
        let Some(at) = listed.iter().position(|c| c.commit == end) else {
            return Err(Error::usage(format!(
                "--to `{to}` ({end}) is not on the first-parent history of `{branch}` after the pin {pin}"
            )));
        };
        listed.truncate(at + 1);
    }
    Ok(listed)
}

/// The commit `--to` names: in the cache (a short hash, a commit of the fetched branch), else
/// a tag or branch of `url`; naming nothing is bad input.
fn resolve_to(repo: &Path, url: &str, to: &str) -> Result<GitCommit> {
    let local = git(repo)
        .args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
        .arg(format!("{to}^{{commit}}"))
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            GitCommit::try_from(String::from_utf8_lossy(&o.stdout).trim().to_string()).ok()
        });
    if let Some(commit) = local {
        return Ok(commit);
    }
    fetch::resolve_rev(url, to).map_err(|_| Error::Usage {
        message: format!("--to `{to}` names no commit, tag or branch of {url}"),
        hint: Some("--to takes a commit (a hash, or a prefix of one) of the branch walked".into()),
    })
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

/// Every path a series reads or writes, as git names them in the source's tree: both sides
/// of each file diff (a rename's or copy's source too). Only these decide whether the series
/// applies, so it can only change where one of them changes.
pub fn touched_paths(sets: &[PatchSet]) -> Result<BTreeSet<String>> {
    crate::inputs::patches::series_paths(sets)
}

/// The candidates (oldest first) whose tree differs in `paths` from the one before them (the
/// first candidate's from the pin): where a series over those paths can change its answer.
/// Always holds 0, the start of the first run. One `git diff-tree --stdin` for all of them:
/// consecutive candidates compared as trees, so tags that are no ancestors of each other, a
/// file deleted and added back, a rename (its old path deleted) all count.
pub fn change_points(
    repo: &Path,
    pin: &GitCommit,
    candidates: &[Candidate],
    paths: &BTreeSet<String>,
) -> Result<Vec<usize>> {
    let mut starts = vec![0];
    if candidates.len() < 2 || paths.is_empty() {
        return Ok(starts);
    }
    let pairs: String = (1..candidates.len())
        .map(|i| format!("{} {}\n", candidates[i].commit, candidates[i - 1].commit))
        .collect();
    let mut command = git(repo);
    command.args([
        "diff-tree",
        "--stdin",
        "-r",
        "--name-only",
        "--no-renames",
        "--",
    ]);
    // Literal pathspecs: a file named `*.py` or `[x]` is that file, not a pattern.
    command.args(paths.iter().map(|p| format!(":(literal){p}")));
    let listing = crate::inputs::git::run_with_input(&mut command, pairs.as_bytes(), || {
        format!("comparing the candidates after {pin} in the series' files")
    })?;
    // git prints a pair's first commit, then its changed paths, only for pairs that differ,
    // in input order.
    let mut next = 1;
    for line in listing.lines() {
        let Ok(commit) = GitCommit::try_from(line.to_string()) else {
            continue;
        };
        while next < candidates.len()
            && (candidates[next].commit != commit || candidates[next - 1].commit == commit)
        {
            next += 1;
        }
        if next < candidates.len() {
            starts.push(next);
            next += 1;
        }
    }
    Ok(starts)
}

/// One check of the series, and the candidates that share its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The candidate checked: the first of the run.
    pub first: usize,
    /// One past the run's last candidate.
    pub end: usize,
}

/// The runs of candidates between change points (`starts`, from [`change_points`]).
pub fn runs(starts: &[usize], n: usize) -> Vec<Run> {
    (0..starts.len())
        .map(|k| Run {
            first: starts[k],
            end: starts.get(k + 1).copied().unwrap_or(n),
        })
        .filter(|r| r.first < r.end)
        .collect()
}

/// The newest candidate where `holds`: runs checked newest first, each at its first
/// candidate (every candidate of a run has the same files, so the same answer), until one
/// holds; then its newest candidate. Exactly what a linear scan from the newest candidate
/// finds, whatever the history's shape, with one check per run looked at.
pub fn newest_holding(
    runs: &[Run],
    mut holds: impl FnMut(Run) -> Result<bool>,
) -> Result<Option<usize>> {
    for run in runs.iter().rev() {
        if holds(*run)? {
            return Ok(Some(run.end - 1));
        }
    }
    Ok(None)
}

/// The newest of `candidates` (indexes into the candidates, oldest first, the old pin taken
/// to be good before them) where `good` holds, by bisection: for `--bisect`, whose answer is
/// a build that takes minutes. A candidate `good` cannot judge (`None`: the series does not
/// apply there) is skipped, as `git bisect skip` does, for the nearest one it can. Assumes a
/// build, once broken, stays broken until the newest. The answer: the newest good one, and
/// the oldest judged bad after it (with the skipped ones between, which could not be told).
pub fn bisect(
    candidates: &[usize],
    mut good: impl FnMut(usize) -> Result<Option<bool>>,
) -> Result<Bisected> {
    let (mut lo, mut hi) = (-1i64, candidates.len() as i64 - 1);
    let mut skipped = BTreeSet::new();
    // `lo` is good (or the old pin, -1), `hi` is bad: the newest is known bad.
    'search: while hi - lo > 1 {
        let middle = lo + (hi - lo) / 2;
        // The middle, else the nearest candidate between lo and hi that can be judged.
        let mut order = vec![middle];
        for step in 1..(hi - lo) {
            order.extend([middle - step, middle + step]);
        }
        for at in order.into_iter().filter(|&at| at > lo && at < hi) {
            match good(candidates[at as usize])? {
                Some(true) => lo = at,
                Some(false) => hi = at,
                None => {
                    skipped.insert(candidates[at as usize]);
                    continue;
                }
            }
            continue 'search;
        }
        break;
    }
    let between = |k: usize| {
        let after = if lo < 0 {
            true
        } else {
            k > candidates[lo as usize]
        };
        after && k < candidates[hi as usize]
    };
    Ok(Bisected {
        good: (lo >= 0).then(|| candidates[lo as usize]),
        bad: candidates[hi as usize],
        skipped: skipped.into_iter().filter(|&k| between(k)).collect(),
    })
}

/// [`bisect`]'s answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Bisected {
    pub good: Option<usize>,
    pub bad: usize,
    /// Candidates between `good` and `bad` that could not be judged.
    pub skipped: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_search_finds_what_a_linear_scan_finds_on_any_shape() {
        // Every applicability pattern over up to 9 runs of 1-3 candidates: broken and whole
        // again, whole only in the middle, never, always.
        for pattern in 0u32..(1 << 9) {
            for n_runs in 1..=9usize {
                let mut starts = Vec::new();
                let mut n = 0;
                for k in 0..n_runs {
                    starts.push(n);
                    n += 1 + k % 3;
                }
                let all = runs(&starts, n);
                let holds_at = |i: usize| {
                    let k = starts.iter().rposition(|&s| s <= i).unwrap();
                    pattern & (1 << k) != 0
                };
                let linear = (0..n).rev().find(|&i| holds_at(i));
                let mut asked = 0;
                let found = newest_holding(&all, |run| {
                    asked += 1;
                    Ok(holds_at(run.first))
                })
                .unwrap();
                assert_eq!(found, linear, "pattern {pattern:b}, {n_runs} runs");
                assert!(asked <= n_runs);
            }
        }
    }

    #[test]
    fn bisection_skips_candidates_it_cannot_judge() {
        let candidates: Vec<usize> = (0..20).collect();
        // Good up to 11, bad from 12; 10, 11 and 12 cannot be judged.
        let found = bisect(&candidates, |i| {
            Ok(match i {
                10..=12 => None,
                i => Some(i < 12),
            })
        })
        .unwrap();
        assert_eq!(found.good, Some(9));
        assert_eq!(found.bad, 13);
        assert_eq!(found.skipped, vec![10, 11, 12]);
        // Nothing judged good: the old pin stays.
        let none = bisect(&candidates, |_| Ok(Some(false))).unwrap();
        assert_eq!((none.good, none.bad), (None, 0));
    }
}
