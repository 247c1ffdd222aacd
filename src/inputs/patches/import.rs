//! `patches import`: a patch set as operators receive it (a folder of numbered patch files as
//! `git format-patch` writes them, an mbox, or a range of commits of a local repository)
//! written as `patches/<set>/` and its `series`. Every patch is checked as `check` checks it
//! (a patch, touching only paths inside the source tree) before anything is written.

use super::{check_touched_paths, parse_series};
use crate::error::{Error, Invalid, Result};
use crate::inputs::git;
use crate::inputs::values::{Name, RelativePath};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One patch to write: its file name in the set, its bytes, and where it came from.
struct Incoming {
    name: String,
    /// The series' `-pN` (1 unless it says otherwise).
    strip: u32,
    bytes: Vec<u8>,
    origin: PathBuf,
}

/// Writes `patches_dir/<set>/` from `from` (a folder, an mbox or a patch file; with `range`, a
/// repository); returns the patch file names in series order.
pub fn import(
    patches_dir: &Path,
    set: &Name,
    from: &Path,
    range: Option<&str>,
    force: bool,
) -> Result<Vec<String>> {
    let target = patches_dir.join(set.as_str());
    if target.exists() && !force {
        return Err(Error::Usage {
            message: format!("patch set `{set}` exists: {}", target.display()),
            hint: Some("pass --force to replace it".into()),
        });
    }
    let scratch = tempfile::Builder::new()
        .prefix("hallmark-import")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let incoming = match range {
        Some(range) => from_folder(&format_patch(from, range, scratch.path())?)?,
        None if from.is_dir() => from_folder(from)?,
        None => from_file(from, scratch.path())?,
    };
    if incoming.is_empty() {
        return Err(Error::usage(format!("{} holds no patches", from.display())));
    }
    for patch in &incoming {
        RelativePath::try_from(patch.name.clone())
            .map_err(|message| refused(&patch.origin, message.to_string()))?;
        check_touched_paths(&patch.bytes, patch.strip)
            .map_err(|message| refused(&patch.origin, format!("patch set `{set}`: {message}")))?;
    }
    write_set(patches_dir, &target, &incoming)?;
    Ok(incoming.into_iter().map(|p| p.name).collect())
}

fn refused(origin: &Path, message: String) -> Error {
    Error::from(Invalid {
        path: origin.to_path_buf(),
        location: None,
        key: None,
        message,
        hint: None,
    })
}

/// Writes the set next to where it goes, then moves it into place: a failed import leaves
/// the old set (or none) as it was.
fn write_set(patches_dir: &Path, target: &Path, incoming: &[Incoming]) -> Result<()> {
    fs_err::create_dir_all(patches_dir).map_err(|e| Error::io(patches_dir, e))?;
    let staged = tempfile::Builder::new()
        .prefix(".import")
        .tempdir_in(patches_dir)
        .map_err(|e| Error::io(patches_dir, e))?;
    let mut series = String::new();
    for patch in incoming {
        let path = staged.path().join(&patch.name);
        // A series may keep patches in subfolders (`debian/0001-x.patch`), as quilt reads it.
        if let Some(folder) = path.parent() {
            fs_err::create_dir_all(folder).map_err(|e| Error::io(folder, e))?;
        }
        fs_err::write(&path, &patch.bytes).map_err(|e| Error::io(&path, e))?;
        series.push_str(&patch.name);
        if patch.strip != 1 {
            series.push_str(&format!(" -p{}", patch.strip));
        }
        series.push('\n');
    }
    let series_path = staged.path().join("series");
    fs_err::write(&series_path, series).map_err(|e| Error::io(&series_path, e))?;
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    fs_err::set_permissions(staged.path(), mode).map_err(|e| Error::io(staged.path(), e))?;
    if target.exists() {
        fs_err::remove_dir_all(target).map_err(|e| Error::io(target, e))?;
    }
    let staged = staged.keep();
    fs_err::rename(&staged, target).map_err(|e| Error::io(target, e))?;
    Ok(())
}

/// `git format-patch` of `range` in `repo`, into `out`: the same files the operator would get
/// running it by hand, so a folder and its range import alike.
fn format_patch(repo: &Path, range: &str, out: &Path) -> Result<PathBuf> {
    let bad = |why: String| Error::Usage {
        message: format!(
            "`{range}` is not a range of commits of {}: {why}",
            repo.display()
        ),
        hint: Some("write it as `A..B`, both ends commits of that repository".into()),
    };
    if !range.contains("..") || range.starts_with('-') {
        return Err(bad("expected `A..B`".into()));
    }
    if !repo.exists() {
        return Err(bad("no such folder".into()));
    }
    let dir = out.join("range");
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(repo)
        .args(["format-patch", "--quiet", "-o"])
        .arg(&dir)
        .arg(range)
        .arg("--");
    git::run(&mut command, || {
        format!("reading {range} of {}", repo.display())
    })
    .map_err(|e| match e {
        Error::Command { stderr, .. } => bad(stderr.trim().to_string()),
        other => other,
    })?;
    if !dir.is_dir() {
        return Err(bad("it holds no commits".into()));
    }
    Ok(dir)
}

/// A folder's patches: in the order of its `series` when it has one (quilt), else by the
/// number their names start with (`git format-patch`), then by name.
fn from_folder(dir: &Path) -> Result<Vec<Incoming>> {
    let series = dir.join("series");
    let names: Vec<(String, u32)> = if series.is_file() {
        let text = crate::inputs::spec::read_text(&series)?;
        parse_series(&series, &text)?
            .into_iter()
            .map(|e| (e.file.to_string(), e.strip))
            .collect()
    } else {
        listed(dir)?.into_iter().map(|name| (name, 1)).collect()
    };
    names
        .into_iter()
        .map(|(name, strip)| {
            let origin = dir.join(&name);
            let bytes = fs_err::read(&origin).map_err(|e| Error::io(&origin, e))?;
            Ok(Incoming {
                name,
                strip,
                bytes,
                origin,
            })
        })
        .collect()
}

fn listed(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs_err::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if !entry.path().is_file() {
            return Err(refused(
                &entry.path(),
                "is not a file: a patch folder holds patch files only".into(),
            ));
        }
        names.push(name);
    }
    names.sort_by_key(|name| (number(name), name.clone()));
    Ok(names)
}

/// The number a name starts with (`0007-x.patch` is 7); names without one sort last.
fn number(name: &str) -> u64 {
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or(u64::MAX)
}

/// One patch file, or an mbox of several (split with `git mailsplit`, each named from its
/// subject as `git format-patch` names files).
fn from_file(file: &Path, scratch: &Path) -> Result<Vec<Incoming>> {
    let bytes = fs_err::read(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::usage(format!(
            "{} does not exist: import takes a folder of patches, an mbox, or `REPO A..B`",
            file.display()
        )),
        _ => Error::io(file, e),
    })?;
    if !bytes.starts_with(b"From ") {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(vec![Incoming {
            name,
            strip: 1,
            bytes,
            origin: file.to_path_buf(),
        }]);
    }
    let dir = scratch.join("mbox");
    fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut command = Command::new("git");
    command
        .arg("mailsplit")
        .arg(format!("-o{}", dir.display()))
        .arg(file);
    git::run(&mut command, || {
        format!("splitting the mbox {}", file.display())
    })?;
    let mut messages = listed(&dir)?;
    messages.sort();
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let path = dir.join(message);
            let bytes = fs_err::read(&path).map_err(|e| Error::io(file, e))?;
            Ok(Incoming {
                name: format!("{:04}-{}.patch", i + 1, slug(&subject(&path, scratch)?)),
                strip: 1,
                bytes,
                origin: PathBuf::from(format!("{} (message {})", file.display(), i + 1)),
            })
        })
        .collect()
}

/// A mail's `Subject:` as git reads it (`git mailinfo`: unfolded, RFC 2047 encoded words
/// such as `=?UTF-8?B?...?=` and `=?UTF-8?Q?...?=` decoded, `[PATCH n/m]` and the other
/// bracketed prefixes removed). `scratch` takes what mailinfo writes beside.
fn subject(message: &Path, scratch: &Path) -> Result<String> {
    let stdin = fs_err::File::open(message).map_err(|e| Error::io(message, e))?;
    let mut command = Command::new("git");
    command
        .arg("mailinfo")
        .arg(scratch.join("mailinfo-message"))
        .arg(scratch.join("mailinfo-patch"))
        .stdin(std::process::Stdio::from(std::fs::File::from(stdin)));
    // Run here and not through `git::run`, which gives no stdin; the info is printed
    // whatever the status (a cover letter holds no patch).
    let output = command.output().map_err(|e| Error::Command {
        command: "git mailinfo".into(),
        context: Some(format!("reading the subject of {}", message.display())),
        stderr: e.to_string(),
    })?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Subject:"))
        .unwrap_or("")
        .trim()
        .to_string())
}

/// `git format-patch`'s file name for a subject: runs of other characters as one `-`, at most
/// 52 characters.
fn slug(subject: &str) -> String {
    let mut slug = String::new();
    for c in subject.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.trim_matches(['-', '.']).chars().take(52).collect();
    let slug = slug.trim_end_matches(['-', '.']);
    if slug.is_empty() {
        "patch".into()
    } else {
        slug.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_names_sort_by_number_then_name() {
        let mut names = vec!["10-b.patch", "9-a.patch", "notes.patch", "0002-c.patch"];
        names.sort_by_key(|n| (number(n), n.to_string()));
        assert_eq!(
            names,
            ["0002-c.patch", "9-a.patch", "10-b.patch", "notes.patch"]
        );
    }

    fn subject_of(mail: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mail");
        std::fs::write(&path, mail).unwrap();
        subject(&path, dir.path()).unwrap()
    }

    #[test]
    fn a_subject_names_its_file_as_format_patch_would() {
        let mail = "From x\nSubject: [PATCH 03/23] [dcp2] Fix the\n KV cache: size/2\n\nbody\n";
        assert_eq!(slug(&subject_of(mail)), "Fix-the-KV-cache-size-2");
    }

    /// Issue 42: a subject in RFC 2047 encoded words (base64 and quoted-printable, folded
    /// over lines, as `git send-email` writes a non-ASCII subject) is decoded as git decodes
    /// it; the file was named `0001-UTF-8-B-...` from the encoded text.
    #[test]
    fn an_encoded_subject_is_decoded_as_git_does() {
        let mail = "From x\nFrom: A <a@b>\nSubject: [PATCH 1/2] =?UTF-8?B?RsO8Z2UgZGllIA==?=\n =?UTF-8?q?=C3=9Cbersetzung_hinzu?= and more\n\nbody\n";
        assert_eq!(subject_of(mail), "Füge die Übersetzung hinzu and more");
        assert_eq!(
            slug(&subject_of(mail)),
            "F-ge-die-bersetzung-hinzu-and-more"
        );
        let plain = "From x\nSubject: =?iso-8859-1?q?caf=E9_au_lait?=\n\nbody\n";
        assert_eq!(subject_of(plain), "café au lait");
    }
}
