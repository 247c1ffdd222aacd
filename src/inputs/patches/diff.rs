//! The parts of a patch file hallmark needs to see: the mail or text before the diff (kept when
//! a patch is refreshed), and the diff's files and hunks (so a conflict names each hunk that
//! fails, not only git's first).

/// One file of a diff: its header lines (`diff --git`, `index`, `---`, `+++`) and its hunks.
#[derive(Debug, Clone)]
pub struct FileDiff {
    /// The path as the `+++` line (else the `diff --git` line) names it, prefix and all.
    pub path: String,
    pub header: String,
    pub hunks: Vec<Hunk>,
}

#[derive(Debug, Clone)]
pub struct Hunk {
    /// The `@@ -a,b +c,d @@` line, trimmed.
    pub line: String,
    pub text: String,
}

/// A patch split at its first diff header: what comes before (a mail's headers and message,
/// possibly empty) and the diff's files.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub preamble: String,
    pub files: Vec<FileDiff>,
}

impl FileDiff {
    /// The file's name with `strip` leading components removed, as git applies it.
    pub fn stripped(&self, strip: u32) -> String {
        let path = self.path.trim_matches('"');
        if strip == 0 {
            return path.to_string();
        }
        path.splitn(strip as usize + 1, '/')
            .last()
            .unwrap_or(path)
            .to_string()
    }

    /// Every path this file diff reads or writes, as git applies it: both sides of `---`/`+++`
    /// and `diff --git` (after `strip` components; not `/dev/null`), and a rename's or copy's
    /// paths (which git writes without a prefix).
    pub fn paths(&self, strip: u32) -> Vec<String> {
        let stripped = |path: &str| {
            let path = path
                .split('\t')
                .next()
                .unwrap_or_default()
                .trim_matches('"');
            match strip {
                0 => path.to_string(),
                n => path
                    .splitn(n as usize + 1, '/')
                    .last()
                    .unwrap_or(path)
                    .to_string(),
            }
        };
        let mut paths = vec![self.stripped(strip)];
        for line in self.header.lines() {
            if let Some(rest) = line.strip_prefix("diff --git ") {
                paths.extend(rest.split(' ').map(stripped));
            } else if let Some(path) = line.strip_prefix("--- ").or(line.strip_prefix("+++ ")) {
                paths.push(stripped(path));
            } else if let Some(path) = ["rename from ", "rename to ", "copy from ", "copy to "]
                .iter()
                .find_map(|p| line.strip_prefix(p))
            {
                paths.push(path.trim_matches('"').to_string());
            }
        }
        paths.retain(|p| !p.is_empty() && p != "/dev/null" && p != "dev/null");
        paths.sort();
        paths.dedup();
        paths
    }

    /// The file's header with one of its hunks: a patch of its own, for `git apply --check`.
    pub fn with_hunk(&self, hunk: &Hunk) -> String {
        format!("{}{}", self.header, hunk.text)
    }
}

/// Whether line `i` opens a file: `diff --git`, or a `--- ` line before a `+++ ` one that does
/// not continue a `diff --git` header still waiting for its hunks.
fn starts_file(files: &[FileDiff], lines: &[&str], i: usize) -> bool {
    let line = lines[i];
    if line.starts_with("diff --git ") {
        return true;
    }
    let git_header_open = files
        .last()
        .is_some_and(|f| f.hunks.is_empty() && f.header.starts_with("diff --git "));
    line.starts_with("--- ")
        && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ "))
        && !git_header_open
}

pub fn parse(text: &str) -> Parsed {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut preamble = String::new();
    let mut files: Vec<FileDiff> = Vec::new();
    // Lines left in a hunk: a removed line `--- x` inside a hunk is content, not a header.
    let (mut old_left, mut new_left) = (0u64, 0u64);
    for (i, line) in lines.iter().enumerate() {
        let in_hunk = old_left > 0 || new_left > 0;
        if in_hunk {
            let hunk = files
                .last_mut()
                .and_then(|f| f.hunks.last_mut())
                .expect("in a hunk");
            hunk.text.push_str(line);
            match line.as_bytes().first() {
                Some(b'-') => old_left = old_left.saturating_sub(1),
                Some(b'+') => new_left = new_left.saturating_sub(1),
                Some(b'\\') => {}
                _ => {
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
            }
            continue;
        }
        if starts_file(&files, &lines, i) {
            files.push(FileDiff {
                path: git_path(line).unwrap_or_default(),
                header: String::new(),
                hunks: Vec::new(),
            });
        }
        let Some(file) = files.last_mut() else {
            preamble.push_str(line);
            continue;
        };
        if line.starts_with("@@ ") {
            (old_left, new_left) = hunk_counts(line);
            file.hunks.push(Hunk {
                line: line.trim().to_string(),
                text: line.to_string(),
            });
        } else if file.hunks.is_empty() {
            if let Some(path) = line.strip_prefix("+++ ") {
                let path = path.split('\t').next().unwrap_or_default().trim();
                if path != "/dev/null" {
                    file.path = path.to_string();
                }
            } else if let Some(path) = line.strip_prefix("--- ").filter(|_| file.path.is_empty()) {
                file.path = path
                    .split('\t')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
            }
            file.header.push_str(line);
        }
        // Other text after a file's last hunk (a mail's signature, `-- \n2.43.0`) is not
        // part of the diff.
    }
    Parsed { preamble, files }
}

/// `diff --git a/x b/x` names `b/x`.
fn git_path(line: &str) -> Option<String> {
    let names = line.strip_prefix("diff --git ")?;
    names.rsplit(' ').next().map(|s| s.trim().to_string())
}

/// The old and new line counts of `@@ -a,b +c,d @@` (a missing count is 1).
fn hunk_counts(line: &str) -> (u64, u64) {
    let mut words = line.split_whitespace().skip(1);
    let count = |word: Option<&str>| {
        word.and_then(|w| w.get(1..))
            .map(|range| match range.split_once(',') {
                Some((_, n)) => n.parse().unwrap_or(0),
                None => 1,
            })
            .unwrap_or(0)
    };
    (count(words.next()), count(words.next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mail_splits_into_preamble_files_and_hunks() {
        let text = "From 1 Mon\nSubject: [PATCH] x\n\nwhy\n---\n a | 2 +-\n\n\
            diff --git a/a b/a\nindex 1..2 100644\n--- a/a\n+++ b/a\n\
            @@ -1,2 +1,2 @@\n--- removed\n+added\n ctx\n@@ -9 +9 @@\n-x\n+y\n\
            diff --git a/b b/b\nnew file mode 100644\n--- /dev/null\n+++ b/b\n@@ -0,0 +1 @@\n+b\n\
            -- \n2.43.0\n";
        let parsed = parse(text);
        assert!(
            parsed.preamble.ends_with("---\n a | 2 +-\n\n"),
            "{}",
            parsed.preamble
        );
        assert_eq!(parsed.files.len(), 2);
        assert_eq!(parsed.files[0].path, "b/a");
        assert_eq!(parsed.files[0].stripped(1), "a");
        assert_eq!(parsed.files[0].hunks.len(), 2);
        assert_eq!(
            parsed.files[0].hunks[0].text,
            "@@ -1,2 +1,2 @@\n--- removed\n+added\n ctx\n"
        );
        assert_eq!(parsed.files[1].path, "b/b");
        assert_eq!(parsed.files[1].hunks[0].text, "@@ -0,0 +1 @@\n+b\n");
    }

    #[test]
    fn a_plain_unified_diff_has_no_preamble() {
        let parsed = parse("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n");
        assert_eq!(parsed.preamble, "");
        assert_eq!(parsed.files[0].stripped(1), "x");
        assert_eq!(parsed.files[0].header, "--- a/x\n+++ b/x\n");
    }
}
