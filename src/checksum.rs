//! The input checksum: sha256 over a canonical, versioned, line-oriented document of every
//! input of an image. `hallmark checksum --explain IMAGE` prints the document, so anyone can
//! recompute the checksum with `sha256sum`; `docs/checksum.md` defines each line.
//!
//! Nothing machine-specific goes in: no paths of the checkout, no mtimes, no hostnames.

use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::fmt;

pub const VERSION_LINE: &str = "hallmark-checksum v1";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct InputChecksum(String);

impl InputChecksum {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn of(document: &str) -> InputChecksum {
        InputChecksum(hex::encode(Sha256::digest(document.as_bytes())))
    }
}

impl fmt::Display for InputChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The document, one input per line, in a fixed order.
#[derive(Debug, Default)]
pub struct Document {
    lines: Vec<String>,
}

impl Document {
    pub fn new() -> Document {
        Document {
            lines: vec![VERSION_LINE.to_string()],
        }
    }

    /// The spec with defaults applied, as JSON with sorted keys and no whitespace, so
    /// comments, key order and formatting of the TOML do not count.
    pub fn spec(&mut self, spec: &impl Serialize) {
        let value = serde_json::to_value(spec).expect("spec serializes");
        self.line(format!("spec {value}"));
    }

    pub fn line(&mut self, line: String) {
        // Every value on a line is validated on parse to hold no newline; a line with one would
        // make two documents hash alike, so it is a bug worth stopping for.
        assert!(
            !line.contains('\n'),
            "checksum line with a newline: {line:?}"
        );
        self.lines.push(line);
    }

    pub fn text(&self) -> String {
        let mut text = self.lines.join("\n");
        text.push('\n');
        text
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The canonical JSON sorts keys; a dependency enabling serde_json's `preserve_order`
    /// would silently change every checksum, so this pins it down.
    #[test]
    fn spec_json_has_sorted_keys() {
        #[derive(Serialize)]
        struct Unsorted {
            zebra: u8,
            apple: std::collections::HashMap<&'static str, u8>,
        }
        let mut doc = Document::new();
        doc.spec(&Unsorted {
            zebra: 1,
            apple: [("b", 2), ("a", 1)].into_iter().collect(),
        });
        assert_eq!(
            doc.text(),
            "hallmark-checksum v1\nspec {\"apple\":{\"a\":1,\"b\":2},\"zebra\":1}\n"
        );
    }
}
