//! Content digests: `sha256:` and 64 lowercase hex digits, as engines and OCI layouts write
//! them. Computed and parsed here only, so no other module spells the prefix.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{Read, Write};

/// A content digest as engines write it: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

const PREFIX: &str = "sha256:";

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: impl AsRef<[u8]>) -> Digest {
        Digest::of_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a finished hasher holds.
    pub fn of_hasher(hasher: Sha256) -> Digest {
        Digest(format!("{PREFIX}{}", hex::encode(hasher.finalize())))
    }

    /// `sha256:<hex>` from the 64 hex digits alone (a blob's file name, an OCI layout's
    /// `blobs/sha256/<hex>`); `None` if `hex` is not 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Digest> {
        is_hex64(hex).then(|| Digest(format!("{PREFIX}{hex}")))
    }

    /// The 64 hex digits, without `sha256:`.
    pub fn hex(&self) -> &str {
        &self.0[PREFIX.len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The digest and size of what `data` reads.
    pub fn of_reader(data: &mut impl Read) -> std::io::Result<(Digest, u64)> {
        let mut writer = Hashing::new(std::io::sink());
        std::io::copy(data, &mut writer)?;
        Ok(writer.finish().1)
    }
}

/// The 64 hex digits of a string that may carry the `sha256:` prefix (an engine's image id
/// is `sha256:<hex>`; a short form or a name is passed through).
pub fn hex_of(id: &str) -> &str {
    id.strip_prefix(PREFIX).unwrap_or(id)
}

/// A text that is not a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a digest: expected `sha256:` and 64 lowercase hex digits")]
pub struct BadDigest {
    pub value: String,
}

impl TryFrom<String> for Digest {
    type Error = BadDigest;
    fn try_from(value: String) -> Result<Self, BadDigest> {
        match value.strip_prefix(PREFIX) {
            Some(hex) if is_hex64(hex) => Ok(Digest(value)),
            _ => Err(BadDigest { value }),
        }
    }
}

impl TryFrom<&str> for Digest {
    type Error = BadDigest;
    fn try_from(value: &str) -> Result<Self, BadDigest> {
        Digest::try_from(value.to_string())
    }
}

impl From<Digest> for String {
    fn from(value: Digest) -> String {
        value.0
    }
}

impl std::ops::Deref for Digest {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Digest {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Digest {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Digest {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Digest {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Passes reads or writes through to `inner`, hashing and counting the bytes: the one
/// hashing adapter (blobs written to the store, wheel files on their way into a layer,
/// context files checked against their checksum as they are copied).
pub struct Hashing<T> {
    inner: T,
    hasher: Sha256,
    size: u64,
}

impl<T> Hashing<T> {
    pub fn new(inner: T) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    /// Bytes passed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The digest of the bytes passed so far.
    pub fn digest(&self) -> Digest {
        Digest::of_hasher(self.hasher.clone())
    }

    /// The inner reader or writer, and the digest and size of everything passed.
    pub fn finish(self) -> (T, (Digest, u64)) {
        (self.inner, (Digest::of_hasher(self.hasher), self.size))
    }

    /// The raw sha256 of everything passed (a wheel's RECORD wants it in base64).
    pub fn sha256(self) -> Vec<u8> {
        self.hasher.finalize().to_vec()
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_and_computed_here() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::of(b""), empty);
        assert_eq!(Digest::try_from(empty).unwrap().hex(), &empty[7..]);
        assert_eq!(Digest::from_hex(&empty[7..]).unwrap(), empty);
        assert!(Digest::try_from("sha256:ABC").is_err());
        assert!(Digest::from_hex("../../etc").is_none());
        let (digest, size) = Digest::of_reader(&mut &b"abc"[..]).unwrap();
        assert_eq!((digest, size), (Digest::of(b"abc"), 3));
    }
}
