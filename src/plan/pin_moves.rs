//! `hallmark bump --base / --wheel / --apt`'s search: which tags of an external base or which
//! versions of a wheel a pin may move to, in what order, and the newest candidate whose build
//! holds, by bisection (docs/patches.md, "Moving the other pins"). Writing the pins is lock's
//! (plan/lock.rs): the spec names the new tag or version and `lock` pins it.

mod tags;
mod wheels;

pub use tags::{Shape, TagRules, shape};
pub use wheels::{WheelMoves, WheelRules, local_label, wheel_moves};

use crate::error::{Error, Result};
use std::cmp::Ordering;
use std::process::{Command, Stdio};

/// A tag of a base's repository on the builder, with what its image says of its date.
#[derive(Debug, Clone)]
pub struct Tag {
    pub tag: String,
    /// The image's `org.opencontainers.image.created` label, when it carries one.
    pub created: Option<String>,
}

/// How candidates were put in order (said in the output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// Every tag reads as a version (`v1.2.3`, `2026.01.05`, `12-bookworm`): compared part by
    /// part, numbers as numbers.
    Version,
    /// Some tag does not (`latest`, `jammy`): the images' `org.opencontainers.image.created`
    /// labels, RFC 3339 times, oldest first.
    Date,
}

/// Whether `tag` reads as a version: an optional `v`, then a digit.
pub fn is_version(tag: &str) -> bool {
    tag.strip_prefix('v')
        .unwrap_or(tag)
        .starts_with(|c: char| c.is_ascii_digit())
}

/// Version order, as `sort -V` and git's `version:refname` give it for the common cases: runs
/// of digits compare as numbers, other runs as text, a leading `v` ignored; a version that is
/// another one plus a suffix starting with `-`, `~` or a letter (`1.2-rc1`, `1.2rc1`) comes
/// before it (a pre-release), one plus `.N` after it.
pub fn version_order(a: &str, b: &str) -> Ordering {
    let a = a.strip_prefix('v').unwrap_or(a);
    let b = b.strip_prefix('v').unwrap_or(b);
    let (mut x, mut y) = (runs(a).into_iter(), runs(b).into_iter());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(rest)) => return suffix_order(rest).reverse(),
            (Some(rest), None) => return suffix_order(rest),
            (Some(p), Some(q)) => {
                let order = match (p.parse::<u128>(), q.parse::<u128>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n).then(p.len().cmp(&q.len())),
                    _ => p.cmp(q),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// Where a version with `rest` left over stands against the same version without it.
fn suffix_order(rest: &str) -> Ordering {
    match rest.chars().next() {
        Some('-' | '~') => Ordering::Less,
        Some(c) if c.is_ascii_alphabetic() => Ordering::Less,
        _ => Ordering::Greater,
    }
}

/// `1.10-rc2` as `1`, `.`, `10`, `-rc`, `2`.
fn runs(text: &str) -> Vec<&str> {
    let mut runs = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for i in 1..=bytes.len() {
        if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[i - 1].is_ascii_digit() {
            runs.push(&text[start..i]);
            start = i;
        }
    }
    runs
}

/// Whether `text` matches the shell-style `glob` (`*` any run, `?` one character).
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (glob, text): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    g = sg + 1;
                    t = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// The tags `rules` leaves for the pin `current` (see `tags::filter`), oldest first, the order
/// used, and why the others were left out: version order when every one reads as a version,
/// else date order by their `created` labels, compared as instants (a tag without one, or
/// with one that is no RFC 3339 time, is refused, naming it: its place cannot be known).
pub fn ordered_tags(
    tags: Vec<Tag>,
    current: &str,
    rules: &TagRules,
    repository: &str,
) -> Result<Ordered> {
    let (mut tags, skipped) = tags::filter(tags, current, rules);
    if tags.iter().all(|t| is_version(&t.tag)) {
        tags.sort_by(|a, b| version_order(&a.tag, &b.tag));
        return Ok(Ordered {
            tags,
            order: Order::Version,
            skipped,
        });
    }
    let mut dated = Vec::with_capacity(tags.len());
    for tag in tags {
        let Some(created) = &tag.created else {
            return Err(Error::Usage {
                message: format!(
                    "`{repository}:{}` is not a version and bump cannot read its date (the `org.opencontainers.image.created` label of its image on the builder): it cannot tell where it stands among the tags matching `{}`",
                    tag.tag, rules.include
                ),
                hint: Some(
                    "name the tags to walk with `--tags GLOB` (versions only, or dated images), or leave it out with --exclude-tags".into(),
                ),
            });
        };
        dated.push((tags::instant(repository, &tag.tag, created)?, tag));
    }
    // The tag breaks ties.
    dated.sort_by(|(a, x), (b, y)| a.cmp(b).then(x.tag.cmp(&y.tag)));
    Ok(Ordered {
        tags: dated.into_iter().map(|(_, tag)| tag).collect(),
        order: Order::Date,
        skipped,
    })
}

/// Tags in order, and why the others were left out.
#[derive(Debug)]
pub struct Ordered {
    pub tags: Vec<Tag>,
    pub order: Order,
    pub skipped: Vec<String>,
}

/// The tags after `current` (a tag of the same repository) in `order`: all of them when the
/// current tag is not among them and cannot be placed (`latest` among versions, a pin whose
/// image carries no date).
pub fn after_current<'a>(
    tags: &'a [Tag],
    current: &Tag,
    order: Order,
    repository: &str,
) -> Result<&'a [Tag]> {
    if let Some(i) = tags.iter().position(|t| t.tag == current.tag) {
        return Ok(&tags[i + 1..]);
    }
    let first = match order {
        Order::Version if is_version(&current.tag) => tags
            .iter()
            .position(|t| version_order(&t.tag, &current.tag) == Ordering::Greater),
        Order::Version => Some(0),
        Order::Date => match &current.created {
            Some(created) => {
                let pinned = tags::instant(repository, &current.tag, created)?;
                let mut first = None;
                for (i, tag) in tags.iter().enumerate() {
                    let created = tag.created.as_deref().unwrap_or_default();
                    if tags::instant(repository, &tag.tag, created)? > pinned {
                        first = Some(i);
                        break;
                    }
                }
                first
            }
            None => Some(0),
        },
    };
    Ok(&tags[first.unwrap_or(tags.len())..])
}

/// The tags of `repository` at the registry `host`, as its API lists them (`GET
/// /v2/<repository>/tags/list`, without credentials): plain HTTP for a registry on this
/// machine (`localhost`, `127.0.0.1`, `[::1]`, which engines reach without TLS too), HTTPS
/// otherwise. A registry that asks for credentials, or answers otherwise, is an error saying
/// so: the tags held by the builder are still there to be named with `--tags`.
pub fn registry_tags(host: &str, repository: &str) -> Result<Vec<String>> {
    let local = ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .any(|h| host == *h || host.starts_with(&format!("{h}:")));
    let scheme = if local { "http" } else { "https" };
    let url = format!("{scheme}://{host}/v2/{repository}/tags/list");
    let fail = |why: String| Error::Command {
        command: format!("GET {url}"),
        context: Some(format!("listing the tags of {host}/{repository}: {why}")),
        stderr: String::new(),
    };
    let answer = crate::engine::answer_timeout();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(answer))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(&url).call().map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    let body = response
        .body_mut()
        .with_config()
        .limit(16 * 1024 * 1024)
        .read_to_string()
        .map_err(|e| fail(e.to_string()))?;
    if !status.is_success() {
        return Err(fail(format!(
            "the registry answered {status}{}",
            match status.as_u16() {
                401 =>
                    " (it asks for credentials, which bump does not send: pull the tags onto the builder)",
                _ => "",
            }
        )));
    }
    #[derive(serde::Deserialize)]
    struct Listing {
        #[serde(default)]
        tags: Option<Vec<String>>,
    }
    let listing: Listing = serde_json::from_str(&body).map_err(|e| fail(e.to_string()))?;
    Ok(listing.tags.unwrap_or_default())
}

/// The versions of wheel `name` the package index offers for the interpreter `target`
/// describes (pip's `--implementation/--python-version/--abi/--platform` options; none: the
/// host's), as `pip index versions --pre` lists them with the user's pip config (its
/// index, `PIP_FIND_LINKS`, ...). A version listed may still have no wheel for the target (an
/// sdist only): the download says so.
pub fn wheel_versions(image: &str, name: &str, target: &[String]) -> Result<Vec<String>> {
    let fail = |message: String| Error::Wheel {
        image: image.to_string(),
        name: name.to_string(),
        version: "*".into(),
        message,
        hint: None,
    };
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "index",
        "versions",
        "--disable-pip-version-check",
        // Every release, pre-releases too: which ones a pin may take is bump's rule
        // (`wheels::wheel_moves`), said in its report, not pip's default left unsaid.
        "--pre",
    ])
    .args(target)
    .arg(name)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // An index that does not answer does not outlive Ctrl-C or SIGTERM.
    let output = crate::interrupt::spawn_stoppable(&mut pip)
        .and_then(|(pip, _stoppable)| pip.wait_with_output())
        .map_err(|e| fail(format!("cannot run pip: {e}")))?;
    crate::interrupt::check("bump, asking the package index (no file was written)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(fail(format!(
            "the package index lists no version: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse_pip_versions(&stdout).ok_or_else(|| fail(format!("pip answered `{}`", stdout.trim())))
}

/// The versions of `pip index versions`' `Available versions: 1.2, 1.1, 1.0` line.
fn parse_pip_versions(text: &str) -> Option<Vec<String>> {
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Available versions:"))?;
    Some(
        line.split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

/// The newest of `n` candidates (oldest first) where `holds` is true, the old pin before them
/// taken to hold: the newest is tried first (it usually builds), then bisection between the
/// old pin and it, at most 1 + ceil(log2(n)) calls. Bisection assumes that once a candidate
/// fails the newer ones fail too; where they do not, the answer is a candidate that holds and
/// whose next one fails.
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
    // Candidates below `good` hold (-1 is the old pin); `bad` does not.
    let (mut good, mut bad) = (-1i64, n as i64 - 1);
    while bad - good > 1 {
        let middle = good + (bad - good) / 2;
        match holds(middle as usize)? {
            true => good = middle,
            false => bad = middle,
        }
    }
    Ok((good >= 0).then_some(good as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_numbers_and_pre_releases_come_first() {
        let mut tags = vec![
            "v1.10.0",
            "v1.2.4",
            "v1.2.4-rc1",
            "v0.9.2",
            "v1.2",
            "v1.2.4.1",
            "2",
        ];
        tags.sort_by(|a, b| version_order(a, b));
        assert_eq!(
            tags,
            [
                "v0.9.2",
                "v1.2",
                "v1.2.4-rc1",
                "v1.2.4",
                "v1.2.4.1",
                "v1.10.0",
                "2"
            ]
        );
        assert_eq!(version_order("2026.01.05", "2026.1.5"), Ordering::Greater);
        assert_eq!(version_order("12-bookworm", "12"), Ordering::Less);
        assert!(is_version("2026-01") && is_version("v3") && !is_version("latest"));
    }

    #[test]
    fn globs_match_as_the_shell_does() {
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("v1.*", "v1.2"));
        assert!(glob_matches("2026-??-*", "2026-01-05"));
        assert!(!glob_matches("v1.*", "v2.0"));
        assert!(!glob_matches("a?c", "ac"));
        assert!(glob_matches("*-slim", "12-bookworm-slim"));
        assert!(!glob_matches("*-slim", "12-bookworm"));
    }

    fn tag(tag: &str, created: Option<&str>) -> Tag {
        Tag {
            tag: tag.into(),
            created: created.map(str::to_string),
        }
    }

    #[test]
    fn tags_go_in_version_order_else_by_their_created_labels() {
        let only_v = TagRules {
            include: "v*".into(),
            ..TagRules::default()
        };
        let Ordered { tags, order, .. } = ordered_tags(
            vec![tag("v10", None), tag("v9", None), tag("w1", None)],
            "v9",
            &only_v,
            "r",
        )
        .unwrap();
        assert_eq!(order, Order::Version);
        assert_eq!(
            tags.iter().map(|t| t.tag.as_str()).collect::<Vec<_>>(),
            ["v9", "v10"]
        );
        let dated = vec![
            tag("zulu", Some("2026-01-01T00:00:00Z")),
            tag("mike", Some("2026-03-01T00:00:00Z")),
            tag("bravo", Some("2026-02-01T00:00:00Z")),
        ];
        let Ordered { tags, order, .. } =
            ordered_tags(dated, "zulu", &TagRules::default(), "r").unwrap();
        assert_eq!(order, Order::Date);
        let names: Vec<&str> = tags.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(names, ["zulu", "bravo", "mike"]);
        let after = after_current(&tags, &tags[0], order, "r").unwrap();
        assert_eq!(after.len(), 2);
        let undated = ordered_tags(
            vec![tag("latest", None), tag("v1", None)],
            "latest",
            &TagRules::default(),
            "r",
        );
        assert!(undated.unwrap_err().to_string().contains("`r:latest`"));
    }

    #[test]
    fn a_current_tag_outside_the_glob_is_placed_by_version() {
        let tags = vec![tag("v1", None), tag("v2", None), tag("v3", None)];
        let after = after_current(&tags, &tag("v1.5", None), Order::Version, "r").unwrap();
        assert_eq!(after.len(), 2);
        let after = after_current(&tags, &tag("latest", None), Order::Version, "r").unwrap();
        assert_eq!(after.len(), 3);
    }

    #[test]
    fn pip_index_versions_are_read() {
        let text = "hmpkg (1.2)\nAvailable versions: 1.2, 1.1, 1.0\n";
        assert_eq!(parse_pip_versions(text).unwrap(), ["1.2", "1.1", "1.0"]);
        assert!(parse_pip_versions("nothing").is_none());
    }

    #[test]
    fn the_newest_holding_takes_at_most_one_plus_log2_builds() {
        for n in [1usize, 2, 3, 5, 64, 100] {
            for last_good in -1..n as i64 {
                let mut asked = 0;
                let found = newest_holding(n, |i| {
                    asked += 1;
                    Ok(i as i64 <= last_good)
                })
                .unwrap();
                assert_eq!(found, (last_good >= 0).then_some(last_good as usize));
                assert!(asked <= 1 + (n as f64).log2().ceil() as usize);
            }
        }
    }
}
