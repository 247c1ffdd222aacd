//! Values checked when they are parsed, so a malformed one never gets past the spec reader:
//! a bad commit or digest is an error at its line and column, not a surprise at build time.

use serde::{Deserialize, Serialize};
use std::fmt;

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a text is not the value it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    #[error(
        "`{0}` is not a commit: a pin must be 40 lowercase hex digits (a branch or tag is resolved by `hallmark lock`)"
    )]
    Commit(String),
    #[error("`{0}` is not a sha256: expected 64 lowercase hex digits")]
    Sha256(String),
    #[error(
        "`{0}` is not a valid name: use letters, digits, `.`, `_` and `-`, not starting with `.` or `-`"
    )]
    Name(String),
    #[error("`{0}` must be an absolute path in the image")]
    NotAbsolute(String),
    #[error("`{0}` must be a relative path, not an absolute one")]
    NotRelative(String),
    #[error("the path is empty")]
    EmptyPath,
    #[error("`{0}` escapes with `..`")]
    Escapes(String),
    #[error("`{0}` has an empty or `.` component")]
    EmptyComponent(String),
    #[error("`{0}` has whitespace, quotes or control characters")]
    OddCharacters(String),
}

macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl TryFrom<String> for $name {
            type Error = BadValue;
            fn try_from(value: String) -> Result<Self, BadValue> {
                let check: fn(&str) -> Result<(), BadValue> = $check;
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
        Err(BadValue::Commit(s.to_string()))
    }
);

pub use crate::oci::Digest;

checked_string!(
    /// A bare sha256: 64 lowercase hex digits (wheel hashes, checksums).
    Sha256Hex,
    |s| if is_lower_hex(s, 64) {
        Ok(())
    } else {
        Err(BadValue::Sha256(s.to_string()))
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
            Err(BadValue::Name(s.to_string()))
        }
    }
);

checked_string!(
    /// An absolute path inside the image: no `..`, no `.`, no empty components, no spaces
    /// (it is written into Dockerfile instructions and checksum lines).
    ImagePath,
    |s| {
        if !s.starts_with('/') {
            return Err(BadValue::NotAbsolute(s.to_string()));
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
            return Err(BadValue::NotRelative(s.to_string()));
        }
        if s.is_empty() {
            return Err(BadValue::EmptyPath);
        }
        check_components(s, s)
    }
);

fn check_components(rest: &str, whole: &str) -> Result<(), BadValue> {
    if rest.is_empty() {
        return Ok(());
    }
    for part in rest.trim_end_matches('/').split('/') {
        match part {
            ".." => return Err(BadValue::Escapes(whole.to_string())),
            "" | "." => return Err(BadValue::EmptyComponent(whole.to_string())),
            _ if part
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"') =>
            {
                return Err(BadValue::OddCharacters(whole.to_string()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `path` without a trailing `/`, but `/` itself: the same place in the image.
pub fn without_trailing_slash(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

impl ImagePath {
    /// True if `self` is `other` or lies below it.
    pub fn is_within(&self, other: &ImagePath) -> bool {
        let (a, b) = (self.0.trim_end_matches('/'), other.0.trim_end_matches('/'));
        b.is_empty() || a == b || a.starts_with(&format!("{b}/"))
    }
}

/// `https://user:token@host/x.git` -> `https://host/x.git`: credentials never reach a label, a pin or a message.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            if path.is_empty() && !rest.contains('/') {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => url.to_string(),
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
    fn relative_paths_stay_inside() {
        assert!(RelativePath::try_from("../secret".to_string()).is_err());
        assert!(RelativePath::try_from("/etc/passwd".to_string()).is_err());
        assert!(RelativePath::try_from("files/run.sh".to_string()).is_ok());
    }
}
