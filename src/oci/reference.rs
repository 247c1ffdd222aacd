//! Image references as the engines read them: Docker's grammar (distribution/reference),
//! which every engine applies to the names and tags hallmark hands over. A name that passes
//! here and that an engine then refuses would cost a build, so every reference hallmark
//! reads (a spec's `from.ref`, a pin, an engine's tag) is parsed by [`Reference`].
//!
//! [`Reference`] is hallmark's own type on top of oci-spec's `distribution::Reference`:
//! oci-spec holds the grammar and the Docker Hub normalisation (`hello` ->
//! `docker.io/library/hello:latest`), but it keeps only that normalised form, and engines are
//! handed (and `FROM` lines written with) the name as the spec wrote it; and its errors
//! ("invalid reference format") do not say which part is wrong, which a spec's author needs.

use crate::oci::Digest;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The longest name (domain and path) an engine accepts.
const NAME_MAX: usize = 255;

/// A path component: runs of `[a-z0-9]` joined by `.`, `_`, `__` or one or more `-`.
pub fn is_path_component(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        let separator = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let ok = match &s[separator..i] {
            "." | "_" | "__" => true,
            dashes => dashes.bytes().all(|b| b == b'-'),
        };
        if !ok {
            return false;
        }
    }
}

/// `host[:port]`: dot-separated labels of `[A-Za-z0-9-]` not starting or ending in `-`.
fn is_domain(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    host.split('.').all(label_ok) && port_ok
}

/// A tag: a word character, then up to 127 of word characters, `.` and `-`.
pub fn tag_error(tag: &str) -> Option<String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let ok = tag.len() <= 128
        && tag.bytes().next().is_some_and(word)
        && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    (!ok).then(|| format!("`{tag}` is not a valid tag: 1 to 128 of `A-Z a-z 0-9 _ . -`, starting with a letter, digit or `_`"))
}

/// A repository name hallmark gives an image: one lowercase path component.
pub fn repository_error(name: &str) -> Option<String> {
    // The engine refuses to tag these, which would fail a build at its very end.
    if name == "sha256" {
        return Some(
            "`sha256` is the digest algorithm's name; an engine refuses it as a repository (an ambiguous tag)".into(),
        );
    }
    if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(format!(
            "`{name}` reads as an image id (64 hex digits); an engine refuses it as a repository"
        ));
    }
    if is_path_component(name) && name.len() <= NAME_MAX {
        return None;
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(format!(
            "`{name}` has capitals; image repositories are lowercase"
        ));
    }
    Some(format!(
        "`{name}` is not a valid repository name: lowercase letters and digits, joined by `.`, `_`, `__` or `-` (not at either end)"
    ))
}

/// An image reference: `[domain/]path[:tag][@sha256:digest]`, as written, with the registry
/// and repository an engine resolves it to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reference {
    /// The name as written: `vllm/vllm-openai`, `localhost:5000/a/b`.
    name: String,
    tag: Option<String>,
    digest: Option<Digest>,
    /// `docker.io` for a name without a domain.
    registry: String,
    /// `library/hello` for Docker Hub's official `hello`.
    repository: String,
}

/// A text that is not an image reference, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{reference}` is not an image reference: {why}")]
pub struct BadReference {
    pub reference: String,
    pub why: String,
}

impl Reference {
    /// Parses `reference`; the error says what is wrong with it.
    pub fn parse(reference: &str) -> Result<Reference, BadReference> {
        let bad = |why: &str| BadReference {
            reference: reference.to_string(),
            why: why.to_string(),
        };
        let (named, digest) = match reference.split_once('@') {
            Some((named, digest)) => (
                named,
                Some(Digest::try_from(digest).map_err(|e| bad(&e.to_string()))?),
            ),
            None => (reference, None),
        };
        let (name, tag) = match named.rsplit_once(':') {
            // `host:5000/repo`: a colon followed by a `/` is a port.
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (named, None),
        };
        if let Some(why) = name_error(name) {
            return Err(bad(&why));
        }
        if let Some(why) = tag.and_then(tag_error) {
            return Err(bad(&why));
        }
        // oci-spec is the grammar's authority; it also splits off the registry as engines do.
        let parsed = oci_spec::distribution::Reference::try_from(reference)
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Reference {
            name: name.to_string(),
            tag: tag.map(str::to_string),
            digest,
            registry: parsed.registry().to_string(),
            repository: parsed.repository().to_string(),
        })
    }

    /// `repository:tag` for an image hallmark names (both checked by the spec reader).
    pub fn tagged(repository: &str, tag: &str) -> Result<Reference, BadReference> {
        Reference::parse(&format!("{repository}:{tag}"))
    }

    /// The name as written, without tag or digest.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The tag an engine takes for this reference: the one written, else `latest`.
    pub fn tag_or_latest(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `name@digest` (the tag dropped): the same image, pinned by content.
    pub fn with_digest(&self, digest: &Digest) -> Reference {
        Reference {
            tag: None,
            digest: Some(digest.clone()),
            ..self.clone()
        }
    }

    /// Whether the name as written has no registry (`hello`, `vllm/vllm-openai`): Docker
    /// reads it as Docker Hub's, Podman looks for it among its own names first.
    pub fn is_short(&self) -> bool {
        let first = self.name.split('/').next().unwrap_or_default();
        !(self.name.contains('/') && (first.contains(['.', ':']) || first == "localhost"))
    }

    /// `localhost/hello:latest` for `hello`: the name Podman tries first for a short one.
    pub fn on_localhost(&self) -> Result<Reference, BadReference> {
        Reference::tagged(&format!("localhost/{}", self.name), self.tag_or_latest())
    }

    /// `docker.io/library/hello:latest` for `hello`: how the containerd image store names
    /// an image.
    pub fn qualified(&self) -> String {
        let mut qualified = format!(
            "{}/{}:{}",
            self.registry,
            self.repository,
            self.tag_or_latest()
        );
        if let Some(digest) = &self.digest {
            qualified = format!("{qualified}@{digest}");
        }
        qualified
    }

    /// `hello:latest` for `docker.io/library/hello:latest`: Docker's short spelling, so the
    /// classic store's and the containerd store's names for one image compare equal.
    pub fn familiar(&self) -> String {
        let name = match self.registry.as_str() {
            "docker.io" => self
                .repository
                .strip_prefix("library/")
                .filter(|rest| !rest.contains('/'))
                .unwrap_or(&self.repository)
                .to_string(),
            registry => format!("{registry}/{}", self.repository),
        };
        Reference {
            name,
            ..self.clone()
        }
        .to_string()
    }
}

/// `[domain/]path`: the first component is a domain when it holds `.` or `:` or is
/// `localhost` (the rule every engine version agrees on).
fn name_error(name: &str) -> Option<String> {
    if name.len() > NAME_MAX {
        return Some("the name is longer than 255 characters".into());
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 && (components[0].contains(['.', ':']) || components[0] == "localhost")
    {
        if !is_domain(components[0]) {
            return Some(format!("`{}` is not a registry host", components[0]));
        }
        components.remove(0);
    }
    components
        .iter()
        .find(|c| !is_path_component(c))
        .map(|component| {
            format!(
                "`{component}` must be lowercase letters and digits, joined by `.`, `_`, `__` or `-`"
            )
        })
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// The reference compared as written (a pin's `ref` against the spec's `from.ref`).
impl PartialEq<str> for Reference {
    fn eq(&self, other: &str) -> bool {
        let written = self.to_string();
        written == other
    }
}

impl PartialEq<&str> for Reference {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl std::str::FromStr for Reference {
    type Err = BadReference;
    fn from_str(s: &str) -> Result<Self, BadReference> {
        Reference::parse(s)
    }
}

impl TryFrom<String> for Reference {
    type Error = BadReference;
    fn try_from(value: String) -> Result<Self, BadReference> {
        Reference::parse(&value)
    }
}

impl From<Reference> for String {
    fn from(value: Reference) -> String {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_follow_the_engines_grammar() {
        for good in ["a", "a-b", "a--b", "a__b", "a.b", "a_b", "a1", "1a"] {
            assert!(repository_error(good).is_none(), "{good}");
        }
        for bad in ["a-", "-a", "a.", "a..b", "a___b", "a._b", "A", "", "a b"] {
            assert!(repository_error(bad).is_some(), "{bad}");
        }
        // Names the engine refuses to tag (an outside test's build failed at its end).
        for refused in ["sha256", &"ab".repeat(32)] {
            assert!(repository_error(refused).is_some(), "{refused}");
        }
        assert!(repository_error("sha256x").is_none());
        for good in ["v1", "_x", "1.0-rc", &"a".repeat(128)] {
            assert!(tag_error(good).is_none(), "{good}");
        }
        for bad in ["-x", ".x", "", "a b", "a/b", &"a".repeat(129)] {
            assert!(tag_error(bad).is_some(), "{bad}");
        }
        for good in [
            "busybox",
            "vllm/vllm-openai:v0.11.0",
            "localhost:5000/a/b:1",
            "registry.example.org/team/app",
            "Registry.Example.org/app",
        ] {
            assert!(Reference::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "Vllm/openai",
            "vllm/openai:-x",
            "a-/b",
            "a/b:",
            "-bad.host/a",
            "host:x/a",
            &format!("{}:1", "a".repeat(256)),
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn references_normalise_as_engines_do() {
        let hello = Reference::parse("hello").unwrap();
        assert_eq!(hello.qualified(), "docker.io/library/hello:latest");
        assert_eq!(hello.tag_or_latest(), "latest");
        assert_eq!(hello.to_string(), "hello");
        let full = Reference::parse("docker.io/library/hello:1").unwrap();
        assert_eq!(full.familiar(), "hello:1");
        assert_eq!(
            Reference::parse("docker.io/team/app:2").unwrap().familiar(),
            "team/app:2"
        );
        let port = Reference::parse("host:5000/a/b:2").unwrap();
        assert_eq!((port.name(), port.tag()), ("host:5000/a/b", Some("2")));
        assert_eq!(port.qualified(), "host:5000/a/b:2");
        assert_eq!(port.familiar(), "host:5000/a/b:2");
        let digest = Digest::of(b"x");
        assert_eq!(
            port.with_digest(&digest).to_string(),
            format!("host:5000/a/b@{digest}")
        );
        let pinned = Reference::parse(&format!("vllm/vllm-openai@{digest}")).unwrap();
        assert_eq!(pinned.digest(), Some(&digest));
        assert!(Reference::parse("vllm/vllm-openai@sha256:abc").is_err());
        assert!(
            Reference::parse("Hello:1")
                .unwrap_err()
                .to_string()
                .contains("lowercase")
        );
    }
}
