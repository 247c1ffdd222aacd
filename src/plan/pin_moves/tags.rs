//! Which tags of a base's repository a pin may move to. A tag is read as registries' users
//! write them: a version, maybe a pre-release marker, then a variant that names a family
//! (`12.6.3-cudnn-devel-ubuntu24.04` is version 12.6.3 of the family
//! `-cudnn-devel-ubuntu24.04`; `v0.11.2rc1` a pre-release of 0.11.2). A pin moves within its
//! family and skips pre-releases unless asked (`--pre`); tags that are not versions
//! (`latest`, `jammy`) are placed by their images' creation times, compared as instants.

use super::{glob_matches, wheels::sample};
use crate::error::{Error, Result};

/// A tag as bump reads it: its leading version, whether it is a pre-release, its family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The leading version (`12.6.3` of `12.6.3-cudnn-devel-ubuntu24.04`), without a `v`.
    pub version: Option<String>,
    /// A pre-release or development build: a marker (`rc`, `alpha`, `beta`, `a1`/`b1` after a
    /// number, `dev`, `pre`, `preview`, `nightly`, `snapshot`, `canary`, `edge`) anywhere in it.
    pub pre: bool,
    /// What follows the version and its pre-release marker: the variant the tag names
    /// (`-cudnn-devel-ubuntu24.04`, `-cu126`, `-slim`), `""` for a bare version. A tag that is
    /// no version is its own family.
    pub family: String,
}

/// Words that mark a pre-release or a development build wherever they stand in a tag, as a
/// whole word (`devel`, `rcu` are not).
const PRE_WORDS: &[&str] = &[
    "rc", "alpha", "beta", "pre", "preview", "dev", "nightly", "snapshot", "canary", "edge",
];

/// Reads `tag` (see `Shape`).
pub fn shape(tag: &str) -> Shape {
    let text = tag.strip_prefix(['v', 'V']).unwrap_or(tag);
    let number_end = leading_version_end(text);
    let pre = pre_release(text);
    if number_end == 0 {
        return Shape {
            version: None,
            pre,
            family: tag.to_string(),
        };
    }
    let rest = &text[number_end..];
    Shape {
        version: Some(text[..number_end].to_string()),
        pre,
        family: rest[pre_marker_len(rest)..].to_string(),
    }
}

/// Where `1.2.3` ends in `1.2.3-x`: digits, and `.` followed by a digit.
fn leading_version_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut end = 0;
    while end < bytes.len() {
        let digit = bytes[end].is_ascii_digit();
        let dot_before_digit =
            bytes[end] == b'.' && end > 0 && bytes.get(end + 1).is_some_and(u8::is_ascii_digit);
        if !(digit || dot_before_digit) {
            break;
        }
        end += 1;
    }
    end
}

/// The length of a pre-release or post-release marker right after the version (`rc1`,
/// `-beta.2`, `.dev0`, `a1`, `.post1`), which belongs to the version, not the family.
fn pre_marker_len(rest: &str) -> usize {
    let separator = usize::from(rest.starts_with(['-', '.', '_', '~']));
    let word: String = rest[separator..]
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .collect();
    let lower = word.to_ascii_lowercase();
    let marker = PRE_WORDS.contains(&lower.as_str())
        || lower == "post"
        || (matches!(lower.as_str(), "a" | "b" | "c") && separator == 0);
    if word.is_empty() || !marker {
        return 0;
    }
    let mut end = separator + word.len();
    let after = &rest[end..];
    let dot = usize::from(
        after.starts_with(['.', '-']) && after[1..].starts_with(|c: char| c.is_ascii_digit()),
    );
    let digits = after[dot..]
        .chars()
        .take_while(char::is_ascii_digit)
        .count();
    if digits > 0 {
        end += dot + digits;
    } else if matches!(lower.as_str(), "a" | "b" | "c") {
        // `12.4b` is no pre-release `b` (`1.0b1` is).
        return 0;
    }
    end
}

/// Whether a word of `text` marks a pre-release (see `PRE_WORDS`), or a single `a`/`b`/`c`
/// stands between digits (`1.0b2`).
fn pre_release(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        if !bytes[start].is_ascii_alphabetic() {
            start += 1;
            continue;
        }
        let end = start
            + bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_alphabetic())
                .count();
        let word = text[start..end].to_ascii_lowercase();
        let between_digits = start > 0
            && bytes[start - 1].is_ascii_digit()
            && bytes.get(end).is_some_and(u8::is_ascii_digit);
        if PRE_WORDS.contains(&word.as_str())
            || (matches!(word.as_str(), "a" | "b" | "c") && between_digits)
        {
            return true;
        }
        start = end;
    }
    false
}

/// What the operator allows a base to move to.
#[derive(Debug, Clone)]
pub struct TagRules {
    /// The tags to consider (`--tags GLOB`; `*` for all).
    pub include: String,
    /// Tags left out whatever `include` says (`--exclude-tags GLOB`, repeatable).
    pub exclude: Vec<String>,
    /// Take pre-releases too (`--pre`).
    pub pre: bool,
}

impl Default for TagRules {
    fn default() -> TagRules {
        TagRules {
            include: "*".into(),
            exclude: Vec::new(),
            pre: false,
        }
    }
}

/// The tags `rules` and the pin `current` leave to consider, and one sentence per reason for
/// those left out. A version pin keeps to its family (`--tags` widens nothing: a family is
/// what the tag names, and crossing it is another base).
pub fn filter(
    tags: Vec<super::Tag>,
    current: &str,
    rules: &TagRules,
) -> (Vec<super::Tag>, Vec<String>) {
    let family = shape(current);
    let (mut kept, mut excluded, mut pre, mut others) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for tag in tags {
        if !glob_matches(&rules.include, &tag.tag) {
            continue;
        }
        if rules
            .exclude
            .iter()
            .any(|glob| glob_matches(glob, &tag.tag))
        {
            excluded.push(tag.tag);
            continue;
        }
        let this = shape(&tag.tag);
        if family.version.is_some() && (this.version.is_none() || this.family != family.family) {
            others.push(tag.tag);
        } else if this.pre && !rules.pre && tag.tag != current {
            pre.push(tag.tag);
        } else {
            kept.push(tag);
        }
    }
    let mut skipped = Vec::new();
    let names = |tags: &[String]| sample(&tags.iter().map(String::as_str).collect::<Vec<_>>());
    if !excluded.is_empty() {
        skipped.push(format!(
            "{} tag(s) excluded by --exclude-tags ({})",
            excluded.len(),
            names(&excluded)
        ));
    }
    if !pre.is_empty() {
        skipped.push(format!(
            "{} pre-release tag(s) left out ({}): --pre takes them",
            pre.len(),
            names(&pre)
        ));
    }
    if !others.is_empty() {
        skipped.push(format!(
            "{} tag(s) of other families left out ({}): `{current}` is of the family {}",
            others.len(),
            names(&others),
            match family.family.is_empty() {
                true => "of bare versions".to_string(),
                false => format!("`<version>{}`", family.family),
            }
        ));
    }
    (kept, skipped)
}

/// The instant a `created` label names (RFC 3339, with its offset), as nanoseconds since
/// 1970 in UTC; an error names the tag and the value when it is no such time (a label
/// compared as text would put `2026-03-01T09:00:00+05:00` after `2026-03-01T06:00:00Z`).
pub fn instant(repository: &str, tag: &str, created: &str) -> Result<i128> {
    chrono::DateTime::parse_from_rfc3339(created.trim())
        .map(|time| i128::from(time.timestamp()) * 1_000_000_000 + i128::from(time.timestamp_subsec_nanos()))
        .map_err(|e| Error::Usage {
            message: format!(
                "`{repository}:{tag}` says it was created `{created}` (its `org.opencontainers.image.created` label), which is not an RFC 3339 time ({e}): bump cannot place it among the tags by date"
            ),
            hint: Some("leave it out with --exclude-tags, or name the tags to walk with --tags".into()),
        })
}

#[cfg(test)]
mod tests {
    use super::super::{Order, Tag, after_current, ordered_tags};
    use super::*;

    fn tags(fixture: &str) -> Vec<Tag> {
        fixture
            .lines()
            .map(|tag| Tag {
                tag: tag.into(),
                created: None,
            })
            .collect()
    }

    /// The tags bump would consider after `current`, oldest first.
    fn later(fixture: &str, current: &str, rules: &TagRules) -> (Vec<String>, Vec<String>) {
        let ordered = ordered_tags(tags(fixture), current, rules, "r").unwrap();
        assert_eq!(ordered.order, Order::Version);
        let pin = Tag {
            tag: current.into(),
            created: None,
        };
        let after = after_current(&ordered.tags, &pin, ordered.order, "r").unwrap();
        (
            after.iter().map(|t| t.tag.clone()).collect(),
            ordered.skipped,
        )
    }

    const CUDA: &str = include_str!("fixtures/nvidia-cuda-tags.txt");
    const VLLM: &str = include_str!("fixtures/vllm-openai-tags.txt");

    #[test]
    fn a_tag_is_a_version_a_pre_release_marker_and_a_family() {
        let read = |tag: &str| {
            let s = shape(tag);
            (s.version, s.pre, s.family)
        };
        let v = |s: &str| Some(s.to_string());
        assert_eq!(
            read("12.6.3-cudnn-devel-ubuntu24.04"),
            (v("12.6.3"), false, "-cudnn-devel-ubuntu24.04".into())
        );
        assert_eq!(read("v0.11.2rc1"), (v("0.11.2"), true, String::new()));
        assert_eq!(read("1.0.0-beta.2"), (v("1.0.0"), true, String::new()));
        assert_eq!(read("2.5.1.dev0"), (v("2.5.1"), true, String::new()));
        assert_eq!(read("3.12.0a1-slim"), (v("3.12.0"), true, "-slim".into()));
        assert_eq!(read("12-bookworm"), (v("12"), false, "-bookworm".into()));
        assert_eq!(read("1.0.post1"), (v("1.0"), false, String::new()));
        assert_eq!(
            read("v0.11.0-aarch64"),
            (v("0.11.0"), false, "-aarch64".into())
        );
        assert_eq!(read("nightly"), (None, true, "nightly".into()));
        assert_eq!(read("latest"), (None, false, "latest".into()));
        assert!(
            !shape("12.4.1-cudnn-devel-ubuntu22.04").pre,
            "`devel` is no `dev`"
        );
    }

    #[test]
    fn a_cuda_base_stays_in_its_family() {
        let (after, skipped) = later(CUDA, "12.4.1-cudnn-devel-ubuntu22.04", &TagRules::default());
        assert_eq!(
            after,
            [
                "12.6.3-cudnn-devel-ubuntu22.04",
                "12.8.1-cudnn-devel-ubuntu22.04",
                "12.9.1-cudnn-devel-ubuntu22.04"
            ]
        );
        assert!(
            skipped[0].contains("other families")
                && skipped[0].contains("`<version>-cudnn-devel-ubuntu22.04`"),
            "{skipped:?}"
        );
        let (after, _) = later(CUDA, "12.6.3-runtime-ubuntu22.04", &TagRules::default());
        assert_eq!(after, ["12.8.1-runtime-ubuntu22.04"]);
        let (after, _) = later(CUDA, "12.8.1-cudnn-devel-ubuntu24.04", &TagRules::default());
        assert_eq!(
            after,
            [
                "12.9.1-cudnn-devel-ubuntu24.04",
                "13.0.0-cudnn-devel-ubuntu24.04"
            ]
        );
    }

    #[test]
    fn vllm_releases_skip_candidates_and_other_architectures() {
        let (found, skipped) = later(VLLM, "v0.10.1", &TagRules::default());
        assert_eq!(
            found,
            ["v0.10.1.1", "v0.10.2", "v0.11.0", "v0.11.1", "v0.11.2"]
        );
        assert!(
            skipped
                .iter()
                .any(|s| s.starts_with("4 pre-release tag(s)")),
            "{skipped:?}"
        );
        assert!(
            skipped
                .iter()
                .any(|s| s.contains("latest") && s.contains("v0.11.0-aarch64")),
            "{skipped:?}"
        );
        let pre = TagRules {
            pre: true,
            ..TagRules::default()
        };
        let (found, _) = later(VLLM, "v0.11.1", &pre);
        assert_eq!(found, ["v0.11.2rc1", "v0.11.2rc2", "v0.11.2", "v0.12.0rc1"]);
        let (found, _) = later(VLLM, "v0.10.2-aarch64", &TagRules::default());
        assert_eq!(
            found,
            ["v0.11.0-aarch64", "v0.11.1-aarch64", "v0.11.2-aarch64"]
        );
        let excluded = TagRules {
            exclude: vec!["v0.11.2*".into()],
            ..TagRules::default()
        };
        let (found, skipped) = later(VLLM, "v0.11.0", &excluded);
        assert_eq!(found, ["v0.11.1"]);
        assert!(skipped[0].contains("--exclude-tags"), "{skipped:?}");
    }

    #[test]
    fn dates_compare_as_instants_with_their_offsets() {
        let dated = |tag: &str, created: &str| Tag {
            tag: tag.into(),
            created: Some(created.into()),
        };
        // 09:00 at +05:00 is 04:00 UTC: before 06:00 UTC, though it sorts after it as text.
        let list = vec![
            dated("jammy", "2026-03-01T06:00:00Z"),
            dated("focal", "2026-03-01T09:00:00+05:00"),
            dated("noble", "2026-03-01T06:00:00.5Z"),
        ];
        let ordered = ordered_tags(list.clone(), "focal", &TagRules::default(), "r").unwrap();
        assert_eq!(ordered.order, Order::Date);
        let names: Vec<&str> = ordered.tags.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(names, ["focal", "jammy", "noble"]);
        let pin = dated("bionic", "2026-03-01T05:00:00+00:00");
        let later = after_current(&ordered.tags, &pin, Order::Date, "r").unwrap();
        assert_eq!(later.len(), 2);
        let mut bad = list;
        bad.push(dated("devel", "yesterday"));
        let error = ordered_tags(bad, "focal", &TagRules::default(), "r")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`r:devel`") && error.contains("`yesterday`"),
            "{error}"
        );
    }
}
