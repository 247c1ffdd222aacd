//! Patch sets: `patches/<set>/series` lists the patch files in order, quilt style (one per
//! line, `#` comments, an optional `-pN` strip level). Paths a patch touches are checked here,
//! before git sees them, so an escaping patch is refused with its set and file named.

pub mod diff;
pub mod import;
pub mod landing;
pub mod refresh;
pub mod report;
pub mod scratch;

use crate::error::{Error, Invalid, Location, Result};
use crate::inputs::values::{Name, RelativePath};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// The patch sets of one `[[source]]`, read, in the spec's order.
#[derive(Debug, Clone)]
pub struct SourcePatches {
    pub source: Name,
    pub sets: Vec<PatchSet>,
}

#[derive(Debug, Clone)]
pub struct PatchSet {
    pub name: Name,
    pub dir: PathBuf,
    pub patches: Vec<Patch>,
}

#[derive(Debug, Clone)]
pub struct Patch {
    pub file: RelativePath,
    pub path: PathBuf,
    pub strip: u32,
    pub sha256: String,
}

/// Reads the set `name` from `patches_dir` (the project's `patches/`, whose parent is the
/// project root: the set and every file it lists must resolve inside it).
pub fn read_set(patches_dir: &Path, name: &Name) -> Result<PatchSet> {
    let root = patches_dir.parent().unwrap_or(patches_dir);
    let dir = patches_dir.join(name.as_str());
    let series_path = dir.join("series");
    crate::inputs::project::stays_inside(root, &series_path)?;
    let text = crate::inputs::spec::read_text(&series_path)?;
    let mut patches = Vec::new();
    for entry in parse_series(&series_path, &text)? {
        let path = dir.join(entry.file.as_str());
        crate::inputs::project::stays_inside(root, &path)?;
        let bytes = match fs_err::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::from(Invalid {
                    path: series_path.clone(),
                    location: Some(entry.location),
                    key: None,
                    message: format!(
                        "patch `{}` is listed but {} does not exist",
                        entry.file,
                        path.display()
                    ),
                    hint: None,
                }));
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        check_touched_paths(&bytes, entry.strip).map_err(|message| {
            Error::from(Invalid {
                path: path.clone(),
                location: None,
                key: None,
                message: format!("patch set `{name}`: {message}"),
                hint: None,
            })
        })?;
        patches.push(Patch {
            file: entry.file,
            path,
            strip: entry.strip,
            sha256: hex::encode(Sha256::digest(&bytes)),
        });
    }
    Ok(PatchSet {
        name: name.clone(),
        dir,
        patches,
    })
}

/// One line of a series file: the patch, its strip level and where the line is.
pub struct SeriesEntry {
    pub file: RelativePath,
    pub strip: u32,
    pub location: Location,
}

/// Reads the lines of a series file (`series_path` only names it in errors).
pub fn parse_series(series_path: &Path, text: &str) -> Result<Vec<SeriesEntry>> {
    let mut entries = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let at = offset;
        offset += line.len();
        let content = line.split('#').next().unwrap_or_default().trim();
        if content.is_empty() {
            continue;
        }
        let invalid = |message: String| {
            Error::from(Invalid {
                path: series_path.to_path_buf(),
                location: Some(Location::of_offset(text, at)),
                key: None,
                message,
                hint: None,
            })
        };
        let mut words = content.split_whitespace();
        let file = words.next().unwrap_or_default();
        let strip = match words.next() {
            None => 1,
            Some(flag) => flag
                .strip_prefix("-p")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "`{flag}` is not a strip level; write `-p0`, `-p1`, ..."
                    ))
                })?,
        };
        if let Some(extra) = words.next() {
            return Err(invalid(format!(
                "unexpected `{extra}` after the strip level"
            )));
        }
        let file = RelativePath::try_from(file.to_string()).map_err(|e| invalid(e.to_string()))?;
        entries.push(SeriesEntry {
            file,
            strip,
            location: Location::of_offset(text, at),
        });
    }
    // An empty series is allowed: bump leaves one when every patch went upstream.
    Ok(entries)
}

/// Every path the patches of `sets` read or write, as git names them in the source's tree:
/// both sides of each file diff (a rename's or copy's source too).
pub fn series_paths(sets: &[PatchSet]) -> Result<std::collections::BTreeSet<String>> {
    let mut paths = std::collections::BTreeSet::new();
    for patch in sets.iter().flat_map(|s| &s.patches) {
        let text = fs_err::read(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        for file in diff::parse(&String::from_utf8_lossy(&text)).files {
            paths.extend(file.paths(patch.strip));
        }
    }
    Ok(paths)
}

/// Every file a unified or git diff names must stay inside the source tree.
/// The field a patch refreshed from a doubtful match carries until reviewed
/// (`patches refresh --accept-fuzz`); `check` warns about every patch that has it.
pub const REVIEW_MARK: &str = "Hallmark-Review:";

/// The review mark's text if the patch at `path` carries one in its header.
pub fn review_mark(path: &Path) -> Option<String> {
    let text = fs_err::read_to_string(path).ok()?;
    let preamble = diff::parse(&text).preamble;
    preamble
        .lines()
        .find_map(|line| line.strip_prefix(REVIEW_MARK))
        .map(|rest| rest.trim().to_string())
}

/// Whether a patch file holds nothing but white space: quilt applies it as nothing ("appears
/// to be empty"), and so do `check`, `build` and the patch tools (its status is `empty`).
pub fn is_empty_patch(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// Why a patch is refused before it is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadPatch {
    #[error("touches `{0}`, outside the source tree")]
    Outside(String),
    #[error("touches the absolute path `{0}`")]
    Absolute(String),
    #[error("is not a patch: it names no file")]
    NoFile,
}

pub fn check_touched_paths(bytes: &[u8], strip: u32) -> Result<(), BadPatch> {
    if is_empty_patch(bytes) {
        return Ok(());
    }
    let text = String::from_utf8_lossy(bytes);
    let mut touched = 0;
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        // A file header is a `--- ` line right before a `+++ ` line; a removed line that
        // happens to start with `-- ` inside a hunk is content, not a path.
        let header = (line.starts_with("--- ")
            && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")))
            || (line.starts_with("+++ ") && i > 0 && lines[i - 1].starts_with("--- "));
        // git takes the names of a file created, deleted or renamed without a hunk from its
        // `diff --git a/X b/Y` line: check every word of it (a quoted name with spaces only
        // makes this stricter).
        if let Some(names) = line.strip_prefix("diff --git ") {
            // A binary or mode-only change, a pure rename or copy: git names its files here
            // and nowhere else that needs a hunk (they were refused as naming no file).
            touched += 1;
            for name in names.split_whitespace() {
                let name = &c_unquoted(name.trim_matches('"'));
                let stripped = name
                    .splitn(strip as usize + 1, '/')
                    .last()
                    .unwrap_or_default();
                if name.starts_with('/')
                    || stripped.starts_with('/')
                    || stripped.split('/').any(|part| part == "..")
                {
                    return Err(BadPatch::Outside(name.to_string()));
                }
            }
            continue;
        }
        let path = if let Some(rest) = line
            .strip_prefix("--- ")
            .or_else(|| line.strip_prefix("+++ "))
            .filter(|_| header)
        {
            rest.split('\t').next().unwrap_or_default().trim()
        } else if let Some(rest) = line
            .strip_prefix("rename to ")
            .or_else(|| line.strip_prefix("rename from "))
            .or_else(|| line.strip_prefix("copy to "))
            .or_else(|| line.strip_prefix("copy from "))
        {
            rest.trim()
        } else {
            continue;
        };
        if path == "/dev/null" {
            continue;
        }
        // git writes a name with unusual bytes C-quoted (`"b/\056\056/evil"` is `b/../evil`):
        // the check reads it as git will.
        let path = &c_unquoted(
            path.strip_prefix('"')
                .and_then(|p| p.strip_suffix('"'))
                .unwrap_or(path),
        );
        touched += 1;
        let stripped = if line.starts_with("---") || line.starts_with("+++") {
            if path.starts_with('/') {
                return Err(BadPatch::Absolute(path.to_string()));
            }
            path.splitn(strip as usize + 1, '/')
                .last()
                .unwrap_or_default()
        } else {
            path
        };
        if path.starts_with('/') || stripped.split('/').any(|part| part == "..") {
            return Err(BadPatch::Outside(path.to_string()));
        }
    }
    if touched == 0 {
        return Err(BadPatch::NoFile);
    }
    Ok(())
}

/// A name as git reads it from its C-quoted form (without the quotes): `\\`, `\"`, `\a`
/// `\b` `\f` `\n` `\r` `\t` `\v` and three-digit octal bytes; anything else as written.
/// Written here: no crate of the registry unquotes git's quoting (quote_c_style in git's
/// quote.c).
fn c_unquoted(name: &str) -> String {
    if !name.contains('\\') {
        return name.to_string();
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' || i + 1 == bytes.len() {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let next = bytes[i + 1];
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let Some(digits) = octal {
            let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
            continue;
        }
        out.push(match next {
            b'a' => 0x07,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'v' => 0x0b,
            other => other,
        });
        i += 2;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::check_touched_paths;

    #[test]
    fn escaping_patches_are_refused() {
        let ok = b"--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_touched_paths(ok, 1).is_ok());
        let up = b"--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_touched_paths(up, 1).is_err());
        let abs = b"--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_touched_paths(abs, 1).is_err());
        assert!(check_touched_paths(b"hello\n", 1).is_err());
        // A removed line reading `-- /abs` is content, not a header.
        let content = b"--- a/x.sql\n+++ b/x.sql\n@@ -1,2 +1 @@\n--- /etc/passwd\n a\n";
        assert!(check_touched_paths(content, 1).is_ok());
        // A file created with no hunk is named only on its `diff --git` line.
        let created = b"--- a/ok\n+++ b/ok\n@@ -1 +1 @@\n-a\n+b\n\
            diff --git a/../../etc/x b/../../etc/x\nnew file mode 100644\n";
        assert!(check_touched_paths(created, 1).is_err());
        // git's C-quoted names are read as git reads them.
        let quoted = b"--- \"a/\\056\\056/evil\"\n+++ \"b/\\056\\056/evil\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_touched_paths(quoted, 1).is_err());
        let quoted_git =
            b"diff --git \"a/\\056\\056/x\" \"b/\\056\\056/x\"\nnew file mode 100644\n";
        assert!(check_touched_paths(quoted_git, 1).is_err());
        let fine = b"--- \"a/caf\\303\\251\"\n+++ \"b/caf\\303\\251\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_touched_paths(fine, 1).is_ok());
        // Binary, mode-only, pure renames: named on their `diff --git` line only.
        let mode = b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n";
        assert!(check_touched_paths(mode, 1).is_ok());
        let binary = b"diff --git a/logo.png b/logo.png\nindex 1111111..2222222 100644\nGIT binary patch\nliteral 3\nKcmZ?wVgLXD3jhEB\n\nliteral 0\nHcmV?d00001\n";
        assert!(check_touched_paths(binary, 1).is_ok());
        let rename = b"diff --git a/old.txt b/new.txt\nsimilarity index 100%\nrename from old.txt\nrename to new.txt\n";
        assert!(check_touched_paths(rename, 1).is_ok());
    }
}
