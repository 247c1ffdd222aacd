//! How each patch of a series fares at a commit (the pin, or a candidate pin bump), the
//! series applied in order so each patch meets the tree the ones before it left.
//!
//! Everything runs in throwaway indexes of the bare cache repository, as `fetch` applies
//! series: `git apply --cached` is atomic (a patch that fails leaves the index as it was), so
//! the common case costs one git process per patch; only a patch that fails plainly costs
//! more (a reverse check, a three-way merge in a copy of the index, reduced context, one check
//! per hunk to name the conflicts).

use super::diff;
use super::landing::{self, Place};
use super::scratch::ScratchIndex;
use super::{Patch, PatchSet};
use crate::error::{Error, Result};
use crate::inputs::values::GitCommit;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// `git apply` takes it as it is, every hunk where the patch says.
    Applies,
    /// `git apply` takes it, some hunks moved (`offset` lines at most).
    Offset,
    /// Only with less context than the patch has (`fuzz`: the context lines still matched).
    Fuzz,
    /// Only by a three-way merge with the file the patch was made against.
    ThreeWay,
    /// Already in the tree: the patch reverses cleanly.
    Upstream,
    /// Neither: `conflicts` names the files and hunks.
    Conflicts,
    /// Nothing but white space: applied as nothing, as quilt does.
    Empty,
    /// Probably already upstream in another form: it neither applies nor reverses, but the
    /// lines each hunk adds are in the tree (re-indented, reordered, with other context);
    /// `evidence` says where. A person confirms before dropping it.
    #[serde(rename = "upstream?")]
    UpstreamMaybe,
}

impl Status {
    /// Whether `check` and `build` take the patch as it is (git allows an offset).
    pub fn as_is(self) -> bool {
        matches!(self, Status::Applies | Status::Offset | Status::Empty)
    }

    pub fn word(self) -> &'static str {
        match self {
            Status::Applies => "applies",
            Status::Offset => "offset",
            Status::Fuzz => "fuzz",
            Status::ThreeWay => "three-way",
            Status::Upstream => "upstream",
            Status::Conflicts => "conflicts",
            Status::Empty => "empty",
            Status::UpstreamMaybe => "upstream?",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Conflict {
    pub file: String,
    /// `#2 @@ -7,7 +7,7 @@`; none when the file as a whole does not apply (a created file
    /// that exists, a binary patch).
    pub hunk: Option<String>,
}

/// One patch of a series at one commit.
#[derive(Debug, Clone, Serialize)]
pub struct PatchStatus {
    pub image: String,
    pub source: String,
    pub commit: String,
    pub set: String,
    pub patch: String,
    pub status: Status,
    /// With `offset`: the most lines a hunk moved.
    pub offset: Option<i64>,
    /// With `fuzz`: the context lines git still matched.
    pub fuzz: Option<u32>,
    pub conflicts: Vec<Conflict>,
    /// With `conflicts`, what the conflict is when it is only whitespace (line endings: a
    /// CRLF patch on LF files shows as a conflict on every hunk, which named nothing).
    pub whitespace: Option<String>,
    /// The earlier patches this one applies only after (it does not apply to the commit
    /// alone): the cumulative effect of the series.
    pub after: Vec<String>,
    /// With `upstream?`: where each hunk's lines were found.
    pub evidence: Option<String>,
    /// With `offset`: set when a hunk lands in another function than it did at the pin
    /// (git took identical lines elsewhere): where it would land and where it was.
    pub doubtful: Option<String>,
    #[serde(skip)]
    pub file: Patch,
    /// The set's folder, which holds its `series`.
    #[serde(skip)]
    pub set_dir: PathBuf,
    /// The cache repository the trees are in.
    #[serde(skip)]
    pub repo: PathBuf,
    /// The trees before and after the patch, when asked for (refresh rewrites the patch as
    /// their difference).
    #[serde(skip)]
    pub trees: Option<(String, String)>,
}

/// What to examine: one source's series at `commit`; `pin` is the commit the series was
/// made for (its blobs feed the three-way merge; where each patch lands there is where it is
/// meant to land).
pub struct Target<'a> {
    pub image: &'a str,
    pub source: &'a str,
    pub repo: &'a Path,
    pub commit: &'a GitCommit,
    pub pin: &'a GitCommit,
    pub sets: &'a [PatchSet],
}

/// What to work out besides each patch's status.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked {
    /// The trees before and after each patch (refresh rewrites a patch as their difference).
    pub trees: bool,
    /// The earlier patches each one needs (`after`): a report's detail, not a verdict.
    pub after: bool,
}

/// Where each patch landed at the pin, by patch file: made once per series and reused for
/// every commit examined against that pin (bump examines many).
#[derive(Default)]
pub struct PinLandings(std::cell::OnceCell<BTreeMap<PathBuf, Vec<Place>>>);

impl PinLandings {
    fn get(&self, target: &Target) -> Result<&BTreeMap<PathBuf, Vec<Place>>> {
        if let Some(found) = self.0.get() {
            return Ok(found);
        }
        let at_pin = Target {
            commit: target.pin,
            ..*target
        };
        let rows = examine_with(
            &at_pin,
            Asked {
                trees: true,
                after: false,
            },
            &PinLandings::default(),
        )?;
        let mut found = BTreeMap::new();
        for row in rows {
            if let Some((before, after)) = &row.trees {
                let places = landing::between(&row.repo, before, after, &row.file.path)?;
                found.insert(row.file.path.clone(), places);
            }
        }
        Ok(self.0.get_or_init(|| found))
    }
}

/// Every patch of `target`'s sets, in series order.
pub fn examine(target: &Target, asked: Asked) -> Result<Vec<PatchStatus>> {
    examine_with(target, asked, &PinLandings::default())
}

/// [`examine`], with where the patches landed at the pin kept from an earlier call.
pub fn examine_with(
    target: &Target,
    asked: Asked,
    at_pin: &PinLandings,
) -> Result<Vec<PatchStatus>> {
    let paths = super::series_paths(target.sets)?;
    let mut run = Run {
        target,
        asked,
        at_pin,
        index: ScratchIndex::of_paths(target.repo, target.commit.as_str(), &paths)?,
        paths,
        pristine: None,
        primed: target.commit == target.pin,
        touched: BTreeMap::new(),
        taken: BTreeMap::new(),
    };
    let mut found = Vec::new();
    for set in target.sets {
        for patch in &set.patches {
            found.push(run.one(set, patch)?);
        }
    }
    Ok(found)
}

impl PatchStatus {
    /// Whether the patch needs a person at this commit: it does not apply as it is or
    /// refreshed (fuzz, three-way, conflicts), may already be upstream (`upstream?`), or
    /// lands in another function (a doubtful offset). `check`, `patches report`, `patches
    /// refresh` and `bump` all judge a patch by this.
    pub fn needs_person(&self) -> bool {
        self.doubtful.is_some()
            || matches!(
                self.status,
                Status::Fuzz | Status::ThreeWay | Status::Conflicts | Status::UpstreamMaybe
            )
    }
}

struct Run<'a> {
    target: &'a Target<'a>,
    /// The paths the series reads or writes: the only ones its indexes hold.
    paths: std::collections::BTreeSet<String>,
    asked: Asked,
    at_pin: &'a PinLandings,
    /// The commit with every patch so far that applied one way or another.
    index: ScratchIndex,
    /// The commit alone, made when first needed.
    pristine: Option<ScratchIndex>,
    /// Whether the blobs the series was made against are in the repository.
    primed: bool,
    /// Each file the patches so far changed, with the patches that changed it.
    touched: BTreeMap<String, Vec<String>>,
    /// The patches so far that applied, by name (`set/file`), in series order.
    taken: BTreeMap<String, (usize, Patch)>,
}

impl Run<'_> {
    fn one(&mut self, set: &PatchSet, patch: &Patch) -> Result<PatchStatus> {
        let text = fs_err::read(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        let files: Vec<String> = diff::parse(&String::from_utf8_lossy(&text))
            .files
            .iter()
            .map(|f| f.stripped(patch.strip))
            .collect();
        let mut status = PatchStatus {
            image: self.target.image.to_string(),
            source: self.target.source.to_string(),
            commit: self.target.commit.to_string(),
            set: set.name.to_string(),
            patch: patch.file.to_string(),
            status: Status::Conflicts,
            offset: None,
            fuzz: None,
            conflicts: Vec::new(),
            whitespace: None,
            after: Vec::new(),
            evidence: None,
            doubtful: None,
            file: patch.clone(),
            set_dir: set.dir.clone(),
            repo: self.target.repo.to_path_buf(),
            trees: None,
        };
        // The index as it was before the patch, in memory (a few entries: the series' files),
        // made a scratch index only when asked for.
        let before = self.index.snapshot()?;
        let applied = self.classify(patch, &mut status)?;
        // At its own pin, a patch that applies where it was made (no offset) is taken to be
        // meant there: the reverse check costs a git run per patch, and the report at the pin
        // is the one run most often. Elsewhere, and at an offset, it is always made.
        let at_pin = self.target.commit == self.target.pin;
        let worth_checking = match status.status {
            Status::Offset => true,
            Status::Applies => !at_pin,
            _ => false,
        };
        if applied && worth_checking {
            self.already_there(patch, &self.index.restored(&before)?, &mut status)?;
        }
        if applied {
            if self.asked.after && status.status.as_is() {
                status.after = self.applies_only_after(patch, &files)?;
            }
            let name = format!("{}/{}", set.name, patch.file);
            let order = self.taken.len();
            self.taken.insert(name.clone(), (order, patch.clone()));
            for file in &files {
                self.touched
                    .entry(file.clone())
                    .or_default()
                    .push(name.clone());
            }
            let offset = status.status == Status::Offset;
            if self.asked.trees || offset {
                let before = self.index.restored(&before)?.write_tree()?;
                status.trees = Some((before, self.index.write_tree()?));
            }
            if offset && self.target.commit != self.target.pin {
                status.doubtful = self.lands_elsewhere(&status)?;
            }
            if !self.asked.trees {
                status.trees = None;
            }
        }
        Ok(status)
    }

    /// With an offset, where the patch lands here against where it landed at the pin (at the
    /// pin itself, where it lands is where it is meant to): the words when a hunk moved into
    /// another function. A patch that did not apply at the pin is compared with its header.
    fn lands_elsewhere(&self, status: &PatchStatus) -> Result<Option<String>> {
        let (before, after) = status.trees.as_ref().expect("kept for an offset");
        let now = landing::between(self.target.repo, before, after, &status.file.path)?;
        let was = match self.at_pin.get(self.target)?.get(&status.file.path) {
            Some(places) => places.clone(),
            None => {
                let text = fs_err::read_to_string(&status.file.path)
                    .map_err(|e| Error::io(&status.file.path, e))?;
                landing::places(&text, status.file.strip)
            }
        };
        Ok(landing::moved_function(&was, &now).then(|| landing::words(&now, &was)))
    }

    /// Whether a patch that applied was already in the tree, so applying it repeats it (a
    /// second definition of a function upstream took): it also reverses there, or it took an
    /// offset and every hunk's added lines already stand in the file as a block.
    fn already_there(
        &self,
        patch: &Patch,
        before: &ScratchIndex,
        status: &mut PatchStatus,
    ) -> Result<()> {
        // Only lines added count: a mode change, a rename or a binary patch reverses as well
        // as it applies, and says nothing about upstream.
        let text = fs_err::read_to_string(&patch.path).unwrap_or_default();
        let adds_lines = (diff::parse(&text).files.iter())
            .flat_map(|f| &f.hunks)
            .any(|h| h.text.lines().skip(1).any(|l| l.starts_with('+')));
        if !adds_lines {
            return Ok(());
        }
        let reverse = before.apply(&patch.path, patch.strip, &["--check", "--reverse"])?;
        let evidence = if reverse.status.success() {
            Some("it applies, and it also reverses: its change is already in the tree (applying it repeats it)".to_string())
        } else if status.status == Status::Offset {
            self.added_lines_present(patch, before, status.offset.unwrap_or(0))?
        } else {
            None
        };
        if let Some(evidence) = evidence {
            status.status = Status::UpstreamMaybe;
            status.evidence = Some(evidence);
        }
        Ok(())
    }

    /// Where every hunk's added lines already stand as one block in the file before the
    /// patch, if they all do: two lines or more of them, or one within the offset's reach of
    /// where the hunk was (one common line alone, `return 0;`, is no evidence).
    fn added_lines_present(
        &self,
        patch: &Patch,
        before: &ScratchIndex,
        offset: i64,
    ) -> Result<Option<String>> {
        let text = fs_err::read_to_string(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        let mut places = Vec::new();
        for file in diff::parse(&text).files {
            let path = file.stripped(patch.strip);
            let Some(now) = meaningful_lines(before, &path)? else {
                return Ok(None);
            };
            for hunk in &file.hunks {
                let added: Vec<String> = (hunk.text.lines().skip(1))
                    .filter_map(|l| l.strip_prefix('+'))
                    .map(squeezed)
                    .filter(|l| l.chars().any(char::is_alphanumeric))
                    .collect();
                if added.is_empty() {
                    continue;
                }
                let near = hunk_start(&hunk.line);
                let reach = offset.unsigned_abs() as usize + hunk.text.lines().count() + 3;
                // `found_at` counts in the meaningful lines: `near` as their count up to it.
                let near_meaningful = now.1.partition_point(|&n| n < near) + 1;
                let Some((at, _)) = found_at(&now.0, &added, near_meaningful, false) else {
                    return Ok(None);
                };
                let line = now.1[at - 1];
                if added.len() < 2 && line.abs_diff(near) > reach {
                    return Ok(None);
                }
                places.push(format!("{path}:{line}"));
            }
        }
        Ok((!places.is_empty()).then(|| {
            format!(
                "it applies at an offset, and the lines it adds are already there: {}",
                places.join(", ")
            )
        }))
    }

    /// Tries the ways a patch can go on, cheapest first; the index takes the patch when one
    /// succeeds (the answer: whether it took it).
    fn classify(&mut self, patch: &Patch, status: &mut PatchStatus) -> Result<bool> {
        let bytes = fs_err::read(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        if super::is_empty_patch(&bytes) {
            status.status = Status::Empty;
            return Ok(true);
        }
        let plain = self.index.apply(&patch.path, patch.strip, &["-v"])?;
        if plain.status.success() {
            status.offset = offset(&String::from_utf8_lossy(&plain.stderr));
            status.status = match status.offset {
                Some(_) => Status::Offset,
                None => Status::Applies,
            };
            return Ok(true);
        }
        let reverse = self
            .index
            .apply(&patch.path, patch.strip, &["--check", "--reverse"])?;
        if reverse.status.success() {
            status.status = Status::Upstream;
            return Ok(false);
        }
        self.prime()?;
        let trial = self.index.copy()?;
        let merged = trial.apply(&patch.path, patch.strip, &["--3way"])?;
        if merged.status.success() && trial.unmerged()?.is_empty() {
            self.index = trial;
            status.status = Status::ThreeWay;
            return Ok(true);
        }
        for context in [2, 1] {
            let fuzzed = self
                .index
                .apply(&patch.path, patch.strip, &[&format!("-C{context}")])?;
            if fuzzed.status.success() {
                status.status = Status::Fuzz;
                status.fuzz = Some(context);
                return Ok(true);
            }
        }
        status.conflicts = self.conflicts(patch, &trial.unmerged()?)?;
        status.whitespace = self.whitespace_only(patch)?;
        if status.whitespace.is_none()
            && let Some(evidence) = self.upstream_in_another_form(patch)?
        {
            status.status = Status::UpstreamMaybe;
            status.evidence = Some(evidence);
        }
        Ok(false)
    }

    /// Whether a patch that neither applies nor reverses is upstream in another form: every
    /// hunk's added lines are in the file as it is now, whitespace aside, in one block or
    /// (reordered) each somewhere; a hunk that only removes, its lines gone. Only lines with
    /// more than punctuation count (a `}` is everywhere). Where each was found, if all were.
    fn upstream_in_another_form(&self, patch: &Patch) -> Result<Option<String>> {
        let text = fs_err::read_to_string(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        let mut places = Vec::new();
        for file in diff::parse(&text).files {
            let path = file.stripped(patch.strip);
            let shown = self
                .index
                .git()
                .args(["show", &format!(":{path}")])
                .output();
            let Ok(shown) = shown.map_err(|e| Error::io(&patch.path, e)) else {
                return Ok(None);
            };
            let now: Vec<String> = String::from_utf8_lossy(&shown.stdout)
                .lines()
                .map(squeezed)
                .collect();
            for hunk in &file.hunks {
                let lines = |signs: &[char]| -> Vec<String> {
                    (hunk.text.lines().skip(1))
                        .filter(|l| l.starts_with(signs))
                        .map(|l| squeezed(&l[1..]))
                        .filter(|l| l.chars().any(char::is_alphanumeric))
                        .collect()
                };
                let (added, removed) = (lines(&['+']), lines(&['-']));
                let new_side = lines(&['+', ' ']);
                let near = hunk_start(&hunk.line);
                // Lines the hunk removes and does not add back must be gone from the file
                // (each of them: one left means the change is not there).
                let gone = removed
                    .iter()
                    .filter(|l| !added.contains(l))
                    .all(|l| !now.contains(l));
                if !gone {
                    return Ok(None);
                }
                // A hunk that moves lines (adds what it removes) is there only as its whole
                // new side, context and all, in order: the moved lines alone are in the
                // file before any change.
                let moves = added.iter().any(|l| removed.contains(l));
                let place = match (added.is_empty(), removed.is_empty()) {
                    (true, true) => continue,
                    (true, false) => Some(format!("{path} (removed)")),
                    (false, _) if moves => found_at(&now, &new_side, near, false)
                        .map(|(line, _)| format!("{path}:{line}")),
                    (false, _) => found_at(&now, &added, near, true).map(|(line, together)| {
                        let how = if together { "" } else { ", reordered" };
                        format!("{path}:{line}{how}")
                    }),
                };
                match place {
                    Some(place) => places.push(place),
                    None => return Ok(None),
                }
            }
        }
        if places.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "every hunk's lines are in the tree, whitespace and context aside: {}",
            places.join(", ")
        )))
    }

    /// Why a patch that conflicts would apply if whitespace did not count, if it would: line
    /// endings (a patch with CRLF lines, or files with them) named as such.
    fn whitespace_only(&self, patch: &Patch) -> Result<Option<String>> {
        let ignoring = self.index.apply(
            &patch.path,
            patch.strip,
            &["--check", "--ignore-whitespace"],
        )?;
        if !ignoring.status.success() {
            return Ok(None);
        }
        let bytes = fs_err::read(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        Ok(Some(if bytes.windows(2).any(|w| w == b"\r\n") {
            "line endings: the patch has CRLF (\\r\\n) lines and applies with them made LF (dos2unix), or with `git apply --ignore-whitespace`".into()
        } else {
            "whitespace only: it applies with `git apply --ignore-whitespace` (line endings or spaces differ from the source's)".into()
        }))
    }

    /// Applies the series at the pin once, into a scratch index of its own: `git apply`
    /// stores the blobs it makes, so every patch's preimage is then in the repository for a
    /// three-way merge (a patch made against patch 3's result names a blob no commit holds).
    fn prime(&mut self) -> Result<()> {
        if self.primed {
            return Ok(());
        }
        self.primed = true;
        let at_pin =
            ScratchIndex::of_paths(self.target.repo, self.target.pin.as_str(), &self.paths)?;
        for set in self.target.sets {
            for patch in &set.patches {
                at_pin.apply(&patch.path, patch.strip, &[])?;
            }
        }
        Ok(())
    }

    /// Each hunk that does not apply, checked on its own against the index; the files a
    /// three-way merge left conflicted are named even when git could not split them.
    fn conflicts(&self, patch: &Patch, unmerged: &[String]) -> Result<Vec<Conflict>> {
        let text = fs_err::read_to_string(&patch.path).map_err(|e| Error::io(&patch.path, e))?;
        let one = self.index.path("one.patch");
        let mut found = Vec::new();
        for file in diff::parse(&text).files {
            let name = file.stripped(patch.strip);
            let whole = if file.hunks.is_empty() {
                vec![(None, file.header.clone())]
            } else {
                file.hunks
                    .iter()
                    .enumerate()
                    .map(|(i, h)| (Some(format!("#{} {}", i + 1, h.line)), file.with_hunk(h)))
                    .collect()
            };
            for (hunk, text) in whole {
                fs_err::write(&one, text).map_err(|e| Error::io(&one, e))?;
                if !self
                    .index
                    .apply(&one, patch.strip, &["--check"])?
                    .status
                    .success()
                {
                    found.push(Conflict {
                        file: name.clone(),
                        hunk,
                    });
                }
            }
        }
        for file in unmerged {
            if !found.iter().any(|c| &c.file == file) {
                found.push(Conflict {
                    file: file.clone(),
                    hunk: None,
                });
            }
        }
        Ok(found)
    }

    /// The earlier patches a patch that applied needs: the least set, each one without
    /// which it does not apply (an outside test's real series named 58 where 20 were
    /// needed: every earlier patch touching the same files). Those candidates are the
    /// earlier patches that changed its files, when it does not apply to the commit alone;
    /// each is tried left out, the others applied to those files only.
    fn applies_only_after(&mut self, patch: &Patch, files: &[String]) -> Result<Vec<String>> {
        let earlier = self.candidates_before(patch, files)?;
        if earlier.len() < 2 {
            return Ok(earlier);
        }
        let only_its_files: Vec<String> = files.iter().map(|f| format!("--include={f}")).collect();
        let only_its_files: Vec<&str> = only_its_files.iter().map(String::as_str).collect();
        let mut needed = Vec::new();
        for left_out in &earlier {
            let index = self
                .pristine
                .as_ref()
                .expect("made by candidates_before")
                .copy()?;
            // The others, each applied if it can be: one that needs the patch left out does
            // not apply and is left out too (git apply is atomic), and the patch is then
            // judged on what does apply (an outside test saw T named after A and B, B only
            // because C, which T does not need, needs B).
            for name in earlier.iter().filter(|n| *n != left_out) {
                let (_, other) = &self.taken[name];
                index.apply(&other.path, other.strip, &only_its_files)?;
            }
            let alone = index.apply(&patch.path, patch.strip, &["--check"])?;
            if !alone.status.success() {
                needed.push(left_out.clone());
            }
        }
        // Two earlier patches that each would do (either one suffices): neither is needed
        // alone, so both are named.
        Ok(if needed.is_empty() { earlier } else { needed })
    }

    /// The earlier patches that changed `files`, in series order, when `patch` does not
    /// apply to the commit alone (else none).
    fn candidates_before(&mut self, patch: &Patch, files: &[String]) -> Result<Vec<String>> {
        let mut earlier: Vec<String> = files
            .iter()
            .filter_map(|f| self.touched.get(f))
            .flatten()
            .cloned()
            .collect();
        if earlier.is_empty() {
            return Ok(earlier);
        }
        if self.pristine.is_none() {
            self.pristine = Some(ScratchIndex::of_paths(
                self.target.repo,
                self.target.commit.as_str(),
                &self.paths,
            )?);
        }
        let pristine = self.pristine.as_ref().expect("made above");
        if pristine
            .apply(&patch.path, patch.strip, &["--check"])?
            .status
            .success()
        {
            return Ok(Vec::new());
        }
        earlier.sort_by_key(|name| self.taken.get(name).map(|(order, _)| *order));
        earlier.dedup();
        Ok(earlier)
    }
}

/// The lines of `path` in `index` with more than punctuation, white space squeezed, with
/// their line numbers; none when the file is not there.
fn meaningful_lines(index: &ScratchIndex, path: &str) -> Result<Option<(Vec<String>, Vec<usize>)>> {
    let shown = index
        .git()
        .args(["show", &format!(":{path}")])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::io(path, e))?;
    if !shown.status.success() {
        return Ok(None);
    }
    let (mut lines, mut numbers) = (Vec::new(), Vec::new());
    for (i, line) in String::from_utf8_lossy(&shown.stdout).lines().enumerate() {
        let line = squeezed(line);
        if line.chars().any(char::is_alphanumeric) {
            lines.push(line);
            numbers.push(i + 1);
        }
    }
    Ok(Some((lines, numbers)))
}

/// A line with its runs of white space made one space, trimmed.
fn squeezed(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The first line of the new side of a hunk (`@@ -a,b +c,d @@`: `c`), where to look first.
fn hunk_start(header: &str) -> usize {
    (header.split_whitespace())
        .find_map(|w| w.strip_prefix('+'))
        .and_then(|w| w.split(',').next()?.parse().ok())
        .unwrap_or(1)
}

/// Where `wanted` is in `lines` (1-based), the place nearest `near` when it is in several:
/// as one block (`true`), else, with `reordered`, when each of its lines is somewhere, the
/// first of their places nearest `near` (`false`).
fn found_at(
    lines: &[String],
    wanted: &[String],
    near: usize,
    reordered: bool,
) -> Option<(usize, bool)> {
    let distance = |at: &usize| (at + 1).abs_diff(near);
    let blocks = lines
        .windows(wanted.len())
        .enumerate()
        .filter(|(_, w)| *w == wanted);
    if let Some(at) = blocks.map(|(at, _)| at).min_by_key(distance) {
        return Some((at + 1, true));
    }
    if !reordered || !wanted.iter().all(|w| lines.contains(w)) {
        return None;
    }
    // Each line where it is nearest `near`; the hunk starts at the first of them.
    let nearest = |w: &String| {
        (0..lines.len())
            .filter(|&at| lines[at] == *w)
            .min_by_key(distance)
    };
    let first = wanted.iter().filter_map(nearest).min()?;
    Some((first + 1, false))
}

/// The most lines a hunk moved, from `git apply -v`'s `Hunk #1 succeeded at 9 (offset 2
/// lines).`
fn offset(stderr: &str) -> Option<i64> {
    stderr
        .lines()
        .filter_map(|l| l.split_once("(offset ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<i64>().ok())
        .max_by_key(|n| n.abs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_largest_offset_is_the_patchs() {
        let stderr = "Checking patch f...\nHunk #1 succeeded at 9 (offset 2 lines).\n\
            Hunk #2 succeeded at 20 (offset -5 lines).\nApplied patch f cleanly.\n";
        assert_eq!(super::offset(stderr), Some(-5));
        assert_eq!(super::offset("Applied patch f cleanly.\n"), None);
    }
}
