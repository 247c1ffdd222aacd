//! Debian's package metadata as apt reads it: deb822 paragraphs (`Packages`, `Release`,
//! `/var/lib/dpkg/status`), dependency relations, and the packages a spec asks for.
//!
//! Written here rather than taken from a crate: the deb822 crates on crates.io either keep
//! every byte for editing (a syntax tree per 50 MB index) or want serde structs for one
//! file kind; what is read here is a dozen fields split on blank lines. Versions are
//! compared by the `debversion` crate (dpkg's algorithm).

use debversion::Version;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One deb822 paragraph: its fields by name, continuation lines joined with `\n`.
pub type Paragraph<'a> = BTreeMap<&'a str, String>;

/// The paragraphs of a deb822 text. Field names are case-sensitive as Debian writes them.
pub fn paragraphs(text: &str) -> impl Iterator<Item = Paragraph<'_>> {
    text.split("\n\n").filter_map(|block| {
        let mut fields = Paragraph::new();
        let mut last: Option<&str> = None;
        for line in block.lines() {
            if line.starts_with('#') {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if let Some(value) = last.and_then(|name| fields.get_mut(name)) {
                    value.push('\n');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                fields.insert(name, value.trim().to_string());
                last = Some(name);
            }
        }
        (!fields.is_empty()).then_some(fields)
    })
}

/// A version constraint of a relation: `(>= 1.2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub op: Op,
    pub version: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Less,
    LessEqual,
    Equal,
    GreaterEqual,
    Greater,
}

impl Constraint {
    /// Whether `version` meets it; a version that does not parse meets nothing.
    pub fn allows(&self, version: &str) -> bool {
        let (Ok(have), Ok(want)) = (version.parse::<Version>(), self.version.parse::<Version>())
        else {
            return false;
        };
        let order = have.cmp(&want);
        match self.op {
            Op::Less => order == Ordering::Less,
            Op::LessEqual => order != Ordering::Greater,
            Op::Equal => order == Ordering::Equal,
            Op::GreaterEqual => order != Ordering::Less,
            Op::Greater => order == Ordering::Greater,
        }
    }
}

/// One alternative of a dependency: `libfoo:any (>= 1.2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    pub name: String,
    pub constraint: Option<Constraint>,
}

impl std::fmt::Display for Alternative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name)?;
        if let Some(c) = &self.constraint {
            let op = match c.op {
                Op::Less => "<<",
                Op::LessEqual => "<=",
                Op::Equal => "=",
                Op::GreaterEqual => ">=",
                Op::Greater => ">>",
            };
            write!(f, " ({op} {})", c.version)?;
        }
        Ok(())
    }
}

/// A `Depends`-style field: dependencies, each a list of alternatives. Architecture
/// qualifiers (`:any`, `:native`) are dropped: one architecture is resolved at a time.
/// Architecture lists and build profiles (`[amd64]`, `<!nocheck>`) are source-package
/// syntax and never appear in binary indexes; a relation that does not parse is an error.
/// Why a relation (`name (op version)`) does not parse; `text` is the relation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRelation {
    #[error("`{text}`: no closing parenthesis")]
    Unclosed { text: String },
    #[error("`{text}`: no version")]
    NoVersion { text: String },
    #[error("`{text}`: unknown operator `{op}`")]
    Operator { text: String, op: String },
    #[error("`{text}`: no package name")]
    NoName { text: String },
}

pub fn relations(field: &str) -> Result<Vec<Vec<Alternative>>, BadRelation> {
    field
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|dependency| dependency.split('|').map(alternative).collect())
        .collect()
}

fn alternative(text: &str) -> Result<Alternative, BadRelation> {
    let text = text.trim();
    let (name, constraint) = match text.split_once('(') {
        None => (text, None),
        Some((name, rest)) => {
            let inner = rest
                .strip_suffix(')')
                .ok_or_else(|| BadRelation::Unclosed { text: text.into() })?
                .trim();
            let split = inner
                .find(|c: char| !matches!(c, '<' | '>' | '='))
                .ok_or_else(|| BadRelation::NoVersion { text: text.into() })?;
            let op = match &inner[..split] {
                "<<" | "<" => Op::Less,
                "<=" => Op::LessEqual,
                "=" => Op::Equal,
                ">=" => Op::GreaterEqual,
                ">>" | ">" => Op::Greater,
                other => {
                    return Err(BadRelation::Operator {
                        text: text.into(),
                        op: other.into(),
                    });
                }
            };
            let version = inner[split..].trim().to_string();
            (name.trim(), Some(Constraint { op, version }))
        }
    };
    let name = name.split(':').next().unwrap_or_default().trim();
    if name.is_empty() {
        return Err(BadRelation::NoName { text: text.into() });
    }
    Ok(Alternative {
        name: name.to_string(),
        constraint,
    })
}

/// A package a spec asks for: `name`, `name=version`, `name:arch` (`check` keeps the
/// alphabet safe; see `spec::is_apt_package`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub name: String,
    pub version: Option<String>,
    /// `name:arch`: hallmark pins the image's architecture only; another is refused.
    pub arch: Option<String>,
}

impl Requested {
    pub fn parse(text: &str) -> Requested {
        let (rest, version) = match text.split_once('=') {
            Some((name, version)) => (name, Some(version.to_string())),
            None => (text, None),
        };
        let (name, arch) = match rest.split_once(':') {
            Some((name, arch)) => (name, Some(arch.to_string())),
            None => (rest, None),
        };
        Requested {
            name: name.to_string(),
            version,
            arch,
        }
    }
}

/// The architecture Debian calls a platform's (`linux/arm64` -> `arm64`); `None` for one it
/// has no port for.
pub fn debian_architecture(platform: &str) -> Option<&'static str> {
    let mut parts = platform.split('/').skip(1);
    Some(match (parts.next()?, parts.next()) {
        ("amd64", _) => "amd64",
        ("arm64", _) => "arm64",
        ("arm", Some("v5")) => "armel",
        ("arm", _) => "armhf",
        ("386", _) => "i386",
        ("ppc64le", _) => "ppc64el",
        ("s390x", _) => "s390x",
        ("riscv64", _) => "riscv64",
        ("mips64le", _) => "mips64el",
        _ => return None,
    })
}

/// The file name Debian gives a package's archive: `name_version_arch.deb`, the epoch's
/// colon written `%3a` as in the pool.
pub fn deb_file_name(name: &str, version: &str, architecture: &str) -> String {
    format!("{name}_{}_{architecture}.deb", version.replace(':', "%3a"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_with_alternatives_constraints_and_qualifiers() {
        let parsed =
            relations("libc6 (>= 2.34), python3:any, default-mta | mail-transport-agent").unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0][0].name, "libc6");
        assert!(parsed[0][0].constraint.as_ref().unwrap().allows("2.36-9"));
        assert!(!parsed[0][0].constraint.as_ref().unwrap().allows("2.31-1"));
        assert_eq!(parsed[1][0].name, "python3");
        assert_eq!(parsed[2].len(), 2);
        assert!(relations("foo (~= 1)").is_err());
        assert!(relations("foo (>= 1").is_err());
    }

    #[test]
    fn versions_compare_as_dpkg_does() {
        let ge = |v: &str| Constraint {
            op: Op::GreaterEqual,
            version: v.into(),
        };
        assert!(ge("1.0~rc1").allows("1.0"));
        assert!(!ge("1.0").allows("1.0~rc1"));
        assert!(ge("1.9").allows("1:0.1"));
        assert!(ge("2.36-9").allows("2.36-9+deb12u4"));
    }

    #[test]
    fn paragraphs_join_continuation_lines() {
        let text = "Package: a\nDescription: one\n two\n\nPackage: b\nVersion: 1\n";
        let all: Vec<_> = paragraphs(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0]["Description"], "one\ntwo");
        assert_eq!(all[1]["Version"], "1");
    }

    #[test]
    fn requested_names_and_platforms() {
        assert_eq!(
            Requested::parse("jq=1.6-2.1"),
            Requested {
                name: "jq".into(),
                version: Some("1.6-2.1".into()),
                arch: None,
            }
        );
        assert_eq!(Requested::parse("libc6:arm64").name, "libc6");
        assert_eq!(debian_architecture("linux/arm64/v8"), Some("arm64"));
        assert_eq!(debian_architecture("linux/arm/v7"), Some("armhf"));
        assert_eq!(deb_file_name("a", "1:2-3", "all"), "a_1%3a2-3_all.deb");
    }
}
