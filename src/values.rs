//! Values checked when they are parsed, so a malformed one never gets past the spec reader:
//! a bad commit or digest is an error at its line and column, not a surprise at build time.

use serde::{Deserialize, Serialize};
use std::fmt;

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(value: String) -> Result<Self, String> {
                let check: fn(&str) -> Result<(), String> = $check;
                check(&value)?;
                Ok($name(value))
            }
        }
        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

checked_string!(
    /// A full git commit id: 40 lowercase hex digits. A branch or tag name is never a commit.
    GitCommit,
    |s| if is_lower_hex(s, 40) {
        Ok(())
    } else {
        Err(format!("`{s}` is not a commit: a pin must be 40 lowercase hex digits (a branch or tag is resolved by `hallmark lock`)"))
    }
);

checked_string!(
    /// A content digest as engines write it: `sha256:` and 64 lowercase hex digits.
    Digest,
    |s| match s.strip_prefix("sha256:") {
        Some(hex) if is_lower_hex(hex, 64) => Ok(()),
        _ => Err(format!("`{s}` is not a digest: expected `sha256:` and 64 lowercase hex digits")),
    }
);

checked_string!(
    /// A bare sha256: 64 lowercase hex digits (wheel hashes, checksums).
    Sha256Hex,
    |s| if is_lower_hex(s, 64) {
        Ok(())
    } else {
        Err(format!("`{s}` is not a sha256: expected 64 lowercase hex digits"))
    }
);

checked_string!(
    /// A name for an image, source, wheel, smoke test or patch set: it becomes a folder name
    /// and a path component, so it is kept to a safe alphabet.
    Name,
    |s| {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !s.starts_with(['.', '-']);
        if ok {
            Ok(())
        } else {
            Err(format!("`{s}` is not a valid name: use letters, digits, `.`, `_` and `-`, not starting with `.` or `-`"))
        }
    }
);

checked_string!(
    /// An absolute path inside the image: no `..`, no `.`, no empty components, no spaces
    /// (it is written into Dockerfile instructions and checksum lines).
    ImagePath,
    |s| {
        if !s.starts_with('/') {
            return Err(format!("`{s}` must be an absolute path in the image"));
        }
        check_components(s.trim_start_matches('/'), s)
    }
);

checked_string!(
    /// A path relative to the image's folder (files copied into the context): it may not
    /// escape that folder.
    RelativePath,
    |s| {
        if s.starts_with('/') {
            return Err(format!("`{s}` must be a relative path, not an absolute one"));
        }
        if s.is_empty() {
            return Err("the path is empty".into());
        }
        check_components(s, s)
    }
);

fn check_components(rest: &str, whole: &str) -> Result<(), String> {
    if rest.is_empty() {
        return Ok(());
    }
    for part in rest.trim_end_matches('/').split('/') {
        match part {
            ".." => return Err(format!("`{whole}` escapes with `..`")),
            "" | "." => return Err(format!("`{whole}` has an empty or `.` component")),
            _ if part
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"') =>
            {
                return Err(format!(
                    "`{whole}` has whitespace, quotes or control characters"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Docker's reference grammar (distribution/reference), as every engine applies it to the
/// names and tags hallmark hands over; a name check passes that the engine then refuses
/// would cost a build.
pub mod reference {
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

    /// `[domain/]path[:tag]`, without a digest. The first component is a domain when it holds
    /// `.` or `:` or is `localhost` (the rule every engine version agrees on).
    pub fn reference_error(reference: &str) -> Option<String> {
        let bad = |why: &str| Some(format!("`{reference}` is not an image reference: {why}"));
        let (name, tag) = match reference.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (reference, None),
        };
        if name.len() > NAME_MAX {
            return bad("the name is longer than 255 characters");
        }
        let mut components: Vec<&str> = name.split('/').collect();
        if components.len() > 1
            && (components[0].contains(['.', ':']) || components[0] == "localhost")
        {
            if !is_domain(components[0]) {
                return bad(&format!("`{}` is not a registry host", components[0]));
            }
            components.remove(0);
        }
        if let Some(component) = components.iter().find(|c| !is_path_component(c)) {
            return bad(&format!(
                "`{component}` must be lowercase letters and digits, joined by `.`, `_`, `__` or `-`"
            ));
        }
        match tag.and_then(tag_error) {
            Some(why) => bad(&why),
            None => None,
        }
    }
}

impl ImagePath {
    /// True if `self` is `other` or lies below it.
    pub fn is_within(&self, other: &ImagePath) -> bool {
        let (a, b) = (self.0.trim_end_matches('/'), other.0.trim_end_matches('/'));
        b.is_empty() || a == b || a.starts_with(&format!("{b}/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_is_not_a_commit() {
        assert!(GitCommit::try_from("main".to_string()).is_err());
        assert!(GitCommit::try_from("A".repeat(40)).is_err());
        assert!(GitCommit::try_from("a".repeat(40)).is_ok());
    }

    #[test]
    fn image_paths_do_not_escape() {
        assert!(ImagePath::try_from("/workspace/../etc".to_string()).is_err());
        assert!(ImagePath::try_from("workspace".to_string()).is_err());
        assert!(ImagePath::try_from("/a b".to_string()).is_err());
        let vllm = ImagePath::try_from("/workspace/vllm".to_string()).unwrap();
        let cutlass =
            ImagePath::try_from("/workspace/vllm/build/_deps/cutlass-src".to_string()).unwrap();
        assert!(cutlass.is_within(&vllm));
        assert!(!vllm.is_within(&cutlass));
        let sibling = ImagePath::try_from("/workspace/vllm2".to_string()).unwrap();
        assert!(!sibling.is_within(&vllm));
    }

    #[test]
    fn references_follow_the_engines_grammar() {
        use reference::*;
        for good in ["a", "a-b", "a--b", "a__b", "a.b", "a_b", "a1", "1a"] {
            assert!(repository_error(good).is_none(), "{good}");
        }
        for bad in ["a-", "-a", "a.", "a..b", "a___b", "a._b", "A", "", "a b"] {
            assert!(repository_error(bad).is_some(), "{bad}");
        }
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
            assert!(reference_error(good).is_none(), "{good}");
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
            assert!(reference_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn relative_paths_stay_inside() {
        assert!(RelativePath::try_from("../secret".to_string()).is_err());
        assert!(RelativePath::try_from("/etc/passwd".to_string()).is_err());
        assert!(RelativePath::try_from("files/run.sh".to_string()).is_ok());
    }
}
