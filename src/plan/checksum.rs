//! The input checksum: sha256 over a canonical, versioned, line-oriented document of every
//! input of an image. `hallmark checksum --explain IMAGE` prints the document, so anyone can
//! recompute the checksum with `sha256sum`; `docs/checksum.md` defines each line.
//!
//! Nothing machine-specific goes in: no paths of the checkout, no mtimes, no hostnames.

use crate::inputs::patches::SourcePatches;
use crate::inputs::pins::{AptPin, SourcePin, WheelPin};
use crate::inputs::spec::ContextFile;
use crate::inputs::spec::compile::CompileStage;
use crate::inputs::values::Name;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub const VERSION_LINE: &str = "hallmark-checksum v2";

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

/// What an image's checksum covers, each part in the order the document lists it.
pub struct ImageInputs<'a> {
    /// The spec by meaning, its name filled in.
    pub spec: &'a serde_json::Value,
    pub template: &'a str,
    /// `parent <name> <checksum>` or `base <reference> <digest>`.
    pub parent_line: &'a str,
    pub sources: &'a [SourcePin],
    /// One per source, in the same order.
    pub patches: &'a [SourcePatches],
    pub wheels: &'a [WheelPin],
    /// The `[build]` apt packages, pinned.
    pub apt: &'a [&'a AptPin],
    pub files: &'a [ContextFile],
    pub compiles: &'a [(&'a Name, &'a InputChecksum)],
}

/// The document of an image's input checksum (`docs/checksum.md`). It and the stage
/// documents ([`stage_document`]) are written here alone, so what a checksum covers is read
/// in one place.
pub fn image_document(inputs: &ImageInputs<'_>) -> String {
    let mut doc = Document::new();
    doc.spec(inputs.spec);
    doc.line(format!(
        "template {}",
        sha256_hex(inputs.template.as_bytes())
    ));
    doc.line(inputs.parent_line.to_string());
    for (pin, source_patches) in inputs.sources.iter().zip(inputs.patches) {
        doc.line(format!("source {} {}", pin.name, pin.commit));
        patch_lines(&mut doc, pin, source_patches);
    }
    for wheel in inputs.wheels {
        doc.line(format!(
            "wheel {} {} {}",
            wheel.name, wheel.file, wheel.sha256
        ));
    }
    for pin in inputs.apt {
        doc.line(pin.checksum_line());
    }
    for file in inputs.files {
        doc.line(format!(
            "file {} {:04o} {}",
            file.dest,
            file.mode(),
            file.sha256
        ));
    }
    for (name, checksum) in inputs.compiles {
        doc.line(format!("compile {name} {checksum}"));
    }
    doc.text()
}

/// The version line of a compile stage's document.
const STAGE_VERSION_LINE: &str = "hallmark-compile v2";

/// The document of a compile stage's own checksum: the stage (caps left out: they decide
/// how much is cached, never what is built), the source date, what it runs in, and each
/// source it builds with its place and patches.
pub fn stage_document(
    stage: &CompileStage,
    source_date_epoch: u64,
    toolchain_line: &str,
    apt: &[&AptPin],
    sources: &[(&SourcePin, &str, &SourcePatches)],
) -> String {
    let mut doc = Document::new();
    doc.line(STAGE_VERSION_LINE.into());
    let mut canonical = stage.clone();
    for cache in canonical.caches.values_mut() {
        cache.cap = None;
    }
    doc.spec(&canonical);
    doc.line(format!("source-date-epoch {source_date_epoch}"));
    doc.line(toolchain_line.to_string());
    for pin in apt {
        doc.line(pin.checksum_line());
    }
    for (pin, dest, patches) in sources {
        doc.line(format!(
            "source {} {} {}",
            pin.name,
            pin.commit,
            crate::inputs::values::without_trailing_slash(dest)
        ));
        patch_lines(&mut doc, pin, patches);
    }
    doc.text()
}

fn patch_lines(doc: &mut Document, pin: &SourcePin, patches: &SourcePatches) {
    for set in &patches.sets {
        for patch in &set.patches {
            doc.line(format!(
                "patch {} {} {} -p{} {}",
                pin.name, set.name, patch.file, patch.strip, patch.sha256
            ));
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The sha256 and length of what `data` reads, a buffer at a time: memory stays flat
/// whatever the size.
pub fn sha256_reader(mut data: impl Read) -> std::io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match data.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buffer[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// What identifies one state of a file without reading it: size, mtime and ctime to the
/// nanosecond, inode and device (as git's index does). Any write changes the ctime, which no
/// program can set back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp(String);

impl FileStamp {
    fn of(metadata: &std::fs::Metadata) -> FileStamp {
        FileStamp(format!(
            "{} {}.{:09} {}.{:09} {} {}",
            metadata.size(),
            metadata.mtime(),
            metadata.mtime_nsec(),
            metadata.ctime(),
            metadata.ctime_nsec(),
            metadata.ino(),
            metadata.dev()
        ))
    }

    /// The later of mtime and ctime.
    fn changed(metadata: &std::fs::Metadata) -> SystemTime {
        let at = |secs: i64, nsecs: i64| {
            let since = Duration::new(secs.max(0) as u64, nsecs.clamp(0, 999_999_999) as u32);
            SystemTime::UNIX_EPOCH + since
        };
        at(metadata.mtime(), metadata.mtime_nsec()).max(at(metadata.ctime(), metadata.ctime_nsec()))
    }
}

/// How long after its last change a file's hash may be remembered. A file written twice
/// within one tick of the file system's clock keeps its timestamps; its hash is remembered
/// only once such a second write would have to show as a new ctime (coarse file systems
/// count in whole or even two seconds).
const SETTLED: Duration = Duration::from_secs(2);

/// The sha256 of the project's files, remembered in `.hallmark/file-hashes` by path and
/// [`FileStamp`], so that planning again (`status`, `verify`, every command) reads only the
/// files that changed. docs/checksum.md says why this is safe; the checksum is still over
/// content.
#[derive(Debug)]
pub struct FileHashes {
    root: PathBuf,
    /// `None`: nothing is remembered (no project folder to write in).
    file: Option<PathBuf>,
    /// Path relative to the root -> (stamp, sha256).
    entries: BTreeMap<String, (FileStamp, String)>,
    changed: bool,
    pub stats: HashStats,
}

/// What planning read: for `-v`, and for tests that must see a file was not read again.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HashStats {
    pub hashed_files: usize,
    pub hashed_bytes: u64,
    pub remembered: usize,
}

const HASHES_HEADER: &str = "hallmark-file-hashes v1";

impl FileHashes {
    /// The hashes remembered under `state_dir` for files below `root`; an unreadable or
    /// foreign file is an empty memory, never an error.
    pub fn load(root: &Path, state_dir: &Path) -> FileHashes {
        let file = state_dir.join("file-hashes");
        let mut entries = BTreeMap::new();
        if let Ok(text) = fs_err::read_to_string(&file) {
            let mut lines = text.lines();
            if lines.next() == Some(HASHES_HEADER) {
                for line in lines {
                    // `<sha256> <size> <mtime> <ctime> <ino> <dev> <path>`: the path last, as
                    // it may hold spaces.
                    let parts: Vec<&str> = line.splitn(7, ' ').collect();
                    if let [sha, stamp @ .., path] = parts.as_slice()
                        && stamp.len() == 5
                        && sha.len() == 64
                        && sha.bytes().all(|b| b.is_ascii_hexdigit())
                    {
                        entries.insert(
                            path.to_string(),
                            (FileStamp(stamp.join(" ")), sha.to_string()),
                        );
                    }
                }
            }
        }
        FileHashes {
            root: root.to_path_buf(),
            file: Some(file),
            entries,
            changed: false,
            stats: HashStats::default(),
        }
    }

    /// Remembers nothing: every file is read.
    pub fn none() -> FileHashes {
        FileHashes {
            root: PathBuf::new(),
            file: None,
            entries: BTreeMap::new(),
            changed: false,
            stats: HashStats::default(),
        }
    }

    /// The sha256 of the file at `path`: remembered if the file has not changed since,
    /// else read (streamed) and remembered once it has settled.
    pub fn sha256(&mut self, path: &Path) -> std::io::Result<String> {
        let started = SystemTime::now();
        let mut file = fs_err::File::open(path)?;
        let before = file.metadata()?;
        let stamp = FileStamp::of(&before);
        let key = self.key(path);
        if let Some(key) = &key
            && let Some((known, sha)) = self.entries.get(key)
            && *known == stamp
        {
            self.stats.remembered += 1;
            return Ok(sha.clone());
        }
        let (sha, size) = sha256_reader(&mut file)?;
        self.stats.hashed_files += 1;
        self.stats.hashed_bytes += size;
        let after = file.metadata()?;
        let settled = FileStamp::changed(&before) + SETTLED < started;
        if let Some(key) = key {
            if settled && FileStamp::of(&after) == stamp && size == before.size() {
                self.entries.insert(key, (stamp, sha.clone()));
            } else {
                self.entries.remove(&key);
            }
            self.changed = true;
        }
        Ok(sha)
    }

    /// The path below the root, if it can be written on one line of the memory file.
    fn key(&self, path: &Path) -> Option<String> {
        self.file.as_ref()?;
        let relative = path.strip_prefix(&self.root).ok()?.to_str()?;
        (!relative.is_empty() && !relative.contains(['\n', '\r'])).then(|| relative.to_string())
    }

    /// Writes what was learnt, dropping files that are gone. Best effort: a read-only
    /// checkout plans as well, only without memory.
    pub fn save(&mut self) {
        let Some(file) = &self.file else { return };
        if !self.changed {
            return;
        }
        let root = &self.root;
        self.entries
            .retain(|path, _| fs_err::symlink_metadata(root.join(path)).is_ok());
        let mut text = format!("{HASHES_HEADER}\n");
        for (path, (stamp, sha)) in &self.entries {
            text.push_str(&format!("{sha} {} {path}\n", stamp.0));
        }
        let write = || -> std::io::Result<()> {
            let dir = file.parent().expect("a folder");
            fs_err::create_dir_all(dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            std::io::Write::write_all(&mut tmp, text.as_bytes())?;
            tmp.persist(file).map_err(|e| e.error)?;
            Ok(())
        };
        if write().is_ok() {
            self.changed = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written within the last seconds could be written again without its timestamps
    /// moving: its hash is not remembered yet, so the next plan reads it again.
    #[test]
    fn a_file_changed_just_now_is_read_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fresh.txt");
        std::fs::write(&file, "fresh\n").unwrap();
        let state = dir.path().join(".hallmark");
        for _ in 0..2 {
            let mut hashes = FileHashes::load(dir.path(), &state);
            assert_eq!(hashes.sha256(&file).unwrap(), sha256_hex(b"fresh\n"));
            assert_eq!(hashes.stats.hashed_files, 1);
            hashes.save();
        }
    }

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
            "hallmark-checksum v2\nspec {\"apple\":{\"a\":1,\"b\":2},\"zebra\":1}\n"
        );
    }
}
