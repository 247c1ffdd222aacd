//! One error type for the library, one renderer for the binary.
//!
//! Every variant carries what an operator needs to find the problem: the file, the key, the
//! image, the node. `exit_status` maps each to the documented exit codes: 2 for bad input
//! (usage, spec, pins, config), 1 for work that failed (git, pip, a patch, an engine).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a command ended, as README.md ("Using it") documents the exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done, every node current.
    Success,
    /// 1: the work failed (a build, a smoke test, a node, an image not reproducible).
    Failure,
    /// 2: input the operator must fix (usage, spec, pins, config).
    BadInput,
    /// 130: ended by Ctrl-C, the shell's convention for SIGINT (128 + 2).
    Interrupted,
}

impl ExitStatus {
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::BadInput => 2,
            ExitStatus::Interrupted => 130,
        }
    }

    /// `Success` if `ok`, else `Failure`.
    pub fn from_success(ok: bool) -> ExitStatus {
        if ok {
            ExitStatus::Success
        } else {
            ExitStatus::Failure
        }
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> std::process::ExitCode {
        std::process::ExitCode::from(status.code())
    }
}

/// A place in a text file: 1-based line and column, plus the line itself for the caret.
#[derive(Debug, Clone)]
pub struct Location {
    pub line: usize,
    pub column: usize,
    pub text: String,
}

impl Location {
    /// Line and column of a byte offset in `source`.
    pub fn of_offset(source: &str, offset: usize) -> Location {
        let offset = offset.min(source.len());
        let before = &source[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = source[line_start..offset].chars().count() + 1;
        let text = source[line_start..]
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        Location { line, column, text }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{message}")]
    Usage {
        message: String,
        hint: Option<String>,
    },

    #[error("cannot read or write {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file that does not parse, or a value of the wrong shape, found by the TOML parser.
    #[error("{}{}: {message}", path.display(), at(location))]
    Parse {
        path: PathBuf,
        location: Option<Location>,
        key: Option<String>,
        message: String,
    },

    /// A value that parses but is wrong (a duplicate name, a cycle, an escaping path).
    #[error("{}{}: {}{}", .0.path.display(), at(&.0.location), .0.key.as_deref().map(|k| format!("`{k}`: ")).unwrap_or_default(), .0.message)]
    Invalid(Box<Invalid>),

    #[error("{}", if *walked { format!("no project found: neither {} nor any folder above it holds hallmark.toml", start.display()) } else { format!("{} is not a hallmark project: it holds no hallmark.toml", start.display()) })]
    NoProject {
        start: PathBuf,
        /// Whether the folders above `start` were searched too (not with `-C`).
        walked: bool,
        /// The nearest folder with an `images/` folder, which may be a project without its file.
        images_at: Option<PathBuf>,
    },

    #[error("the project has no images: no {}/<name>/image.toml", images_dir.display())]
    NoImages { images_dir: PathBuf },

    #[error("no image `{name}` in {}", images_dir.display())]
    UnknownImage {
        name: String,
        images_dir: PathBuf,
        known: Vec<String>,
    },

    #[error("the images form a cycle: {}", chain.join(" -> "))]
    Cycle { chain: Vec<String>, path: PathBuf },

    #[error("{}: {what}", path.display())]
    Pin {
        image: String,
        path: PathBuf,
        what: String,
    },

    #[error("`{command}` failed{}", context.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Command {
        command: String,
        context: Option<String>,
        stderr: String,
    },

    #[error("patch set `{}` does not apply to source `{}` of image `{}`: {}{}", .0.set, .0.source_name, .0.image, .0.file.display(), .0.hunk.as_deref().map(|h| format!(", {h}")).unwrap_or_default())]
    PatchDoesNotApply(Box<PatchNotApplied>),

    #[error("image `{image}`: {message}")]
    Lint {
        image: String,
        path: PathBuf,
        message: String,
        hint: Option<String>,
    },

    #[error("{template}: {message}")]
    Template { template: String, message: String },

    /// An image not checked because an image up its parent chain has a problem (reported
    /// once, on its own).
    #[error(
        "image `{image}`: not checked: its parent chain holds `{parent}`, whose problem is reported above"
    )]
    ParentFailed {
        image: String,
        parent: String,
        path: PathBuf,
    },

    #[error("wheel `{name}=={version}` for image `{image}`: {message}")]
    Wheel {
        image: String,
        name: String,
        version: String,
        message: String,
        hint: Option<String>,
    },

    #[error("image `{image}`: apt package `{package}`: {message}")]
    Apt {
        image: String,
        package: String,
        message: String,
        hint: Option<String>,
    },

    #[error("node `{node}` ({endpoint}): {message}")]
    Engine {
        node: String,
        endpoint: String,
        message: String,
        hint: Option<String>,
    },

    #[error("image `{}` failed to build{} on node `{}`", .0.image, .0.step.as_deref().map(|s| format!(" at {s}")).unwrap_or_default(), .0.node)]
    BuildFailed(Box<BuildFailure>),

    #[error("image `{image}`: smoke test `{smoke}` failed on node `{node}` (exit {code})")]
    SmokeFailed {
        image: String,
        smoke: String,
        node: String,
        code: i64,
        output: String,
    },

    /// An image archive (an engine's export being read into the layer store, or an archive
    /// written to a file) whose content is not what its format says: the archive and the
    /// entry are named, not just the io error.
    #[error("{archive}{}: {message}", entry.as_deref().map(|e| format!(", entry `{e}`")).unwrap_or_default())]
    Archive {
        archive: String,
        entry: Option<String>,
        message: String,
    },

    /// The user pressed Ctrl-C (SIGINT): the containers hallmark started are removed, no tag
    /// has moved, and nothing unfinished carries a checksum.
    #[error("interrupted: {what}")]
    Interrupted { what: String },

    /// A search that found nothing to work on (`bump --tags` whose glob matches no tag): the
    /// input was well formed, the answer is no (exit 1).
    #[error("{message}")]
    NothingMatched { message: String },

    /// Several independent problems, reported together (as `check` does).
    #[error("{} problems", .0.len())]
    Many(Vec<Error>),
}

/// [`Error::Invalid`]'s payload, boxed: the largest variants are, so that every `Result`
/// stays small (clippy's `result_large_err`).
#[derive(Debug)]
pub struct Invalid {
    pub path: PathBuf,
    pub location: Option<Location>,
    pub key: Option<String>,
    pub message: String,
    pub hint: Option<String>,
}

/// [`Error::PatchDoesNotApply`]'s payload.
#[derive(Debug)]
pub struct PatchNotApplied {
    pub image: String,
    pub source_name: String,
    pub set: String,
    pub file: PathBuf,
    pub hunk: Option<String>,
    pub detail: String,
}

/// [`Error::BuildFailed`]'s payload.
#[derive(Debug)]
pub struct BuildFailure {
    pub image: String,
    pub node: String,
    pub step: Option<String>,
    pub message: String,
    pub tail: Vec<String>,
    pub log: PathBuf,
}

impl From<Invalid> for Error {
    fn from(payload: Invalid) -> Error {
        Error::Invalid(Box::new(payload))
    }
}

impl From<PatchNotApplied> for Error {
    fn from(payload: PatchNotApplied) -> Error {
        Error::PatchDoesNotApply(Box::new(payload))
    }
}

impl From<BuildFailure> for Error {
    fn from(payload: BuildFailure) -> Error {
        Error::BuildFailed(Box::new(payload))
    }
}

fn at(location: &Option<Location>) -> String {
    location
        .as_ref()
        .map(|l| format!(":{}:{}", l.line, l.column))
        .unwrap_or_default()
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    pub fn usage(message: impl std::fmt::Display) -> Error {
        Error::Usage {
            message: message.to_string(),
            hint: None,
        }
    }

    /// `BadInput` for input the operator must fix, `Failure` for work that failed.
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Usage { .. }
            | Error::Parse { .. }
            | Error::Invalid(_)
            | Error::NoProject { .. }
            | Error::NoImages { .. }
            | Error::UnknownImage { .. }
            | Error::Cycle { .. }
            | Error::Pin { .. }
            | Error::Lint { .. }
            | Error::ParentFailed { .. }
            | Error::Template { .. } => ExitStatus::BadInput,
            Error::Io { .. }
            | Error::Archive { .. }
            | Error::Command { .. }
            | Error::PatchDoesNotApply(_)
            | Error::Wheel { .. }
            | Error::Apt { .. }
            | Error::Engine { .. }
            | Error::BuildFailed(_)
            | Error::SmokeFailed { .. }
            | Error::NothingMatched { .. } => ExitStatus::Failure,
            Error::Interrupted { .. } => ExitStatus::Interrupted,
            // The lowest code wins: a failed piece of work outranks bad input elsewhere.
            Error::Many(errors) => errors
                .iter()
                .map(Error::exit_status)
                .min_by_key(|s| s.code())
                .unwrap_or(ExitStatus::Failure),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            Error::Invalid(invalid) => invalid.hint.clone(),
            Error::Usage { hint, .. }
            | Error::Lint { hint, .. }
            | Error::Wheel { hint, .. }
            | Error::Apt { hint, .. }
            | Error::Engine { hint, .. } => hint.clone(),
            Error::BuildFailed(failure) => Some(format!(
                "the whole log is in {}; the tag was not moved",
                failure.log.display()
            )),
            Error::UnknownImage { known, .. } if !known.is_empty() => {
                Some(format!("images here: {}", known.join(", ")))
            }
            Error::Pin { image, .. } => Some(format!("run `hallmark lock {image}`")),
            Error::NoProject {
                images_at: Some(dir),
                ..
            } => Some(format!(
                "{} holds images/; if it is a hallmark project, mark its root with a hallmark.toml (empty is fine): `touch {}`",
                dir.display(),
                dir.join("hallmark.toml").display()
            )),
            Error::NoProject { .. } => Some(
                "run hallmark inside a project (a folder holding hallmark.toml and images/<name>/image.toml), or name it with `-C DIR`".into(),
            ),
            Error::NoImages { .. } => Some(
                "add a spec as images/<name>/image.toml; a check of no image passes nothing".into(),
            ),
            _ => None,
        }
    }

    /// The whole report: `error:`, the source line with a caret, `caused by:`, `hint:`.
    pub fn render(&self) -> String {
        if let Error::Many(errors) = self {
            return errors
                .iter()
                .map(Error::render)
                .collect::<Vec<_>>()
                .join("\n");
        }
        let mut out = format!("error: {self}\n");
        let location = match self {
            Error::Parse { location, .. } => location.as_ref(),
            Error::Invalid(invalid) => invalid.location.as_ref(),
            _ => None,
        };
        if let Some(l) = location {
            let gutter = l.line.to_string().len();
            let _ = writeln!(out, "{:gutter$} |", "");
            let _ = writeln!(out, "{} | {}", l.line, l.text);
            let _ = writeln!(out, "{:gutter$} | {:>col$}", "", "^", col = l.column);
        }
        let joined;
        let detail = match self {
            Error::Command { stderr, .. } => Some(stderr.as_str()),
            Error::PatchDoesNotApply(failure) => Some(failure.detail.as_str()),
            Error::SmokeFailed { output, .. } => Some(output.as_str()),
            Error::BuildFailed(failure) => {
                joined = format!("{}\n{}", failure.tail.join("\n"), failure.message);
                Some(joined.as_str())
            }
            _ => None,
        };
        if let Some(detail) = detail.map(str::trim).filter(|d| !d.is_empty()) {
            for line in detail.lines() {
                let _ = writeln!(out, "  | {line}");
            }
        }
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let _ = writeln!(out, "caused by: {c}");
            cause = c.source();
        }
        if let Some(hint) = self.hint() {
            let _ = writeln!(out, "hint: {hint}");
        }
        out
    }
}

/// What the system said of a file, without the "failed to ... `path`" fs_err puts in front:
/// for messages that name the path already.
pub fn os_words(error: &std::io::Error) -> String {
    // fs_err writes "failed to <do> `<path>`: <the system's words>" and keeps the original
    // error private (unless its `expose_original_error`, which would move the system's words
    // out of every other message).
    let text = error.to_string();
    match (text.starts_with("failed to "), text.find("`: ")) {
        (true, Some(at)) => text[at + 3..].to_string(),
        _ => text,
    }
}

/// `text` without terminal escape sequences (colours, cursor moves: ESC `[` ... final byte,
/// ESC `]` ... BEL or ESC `\\`) and without other control characters but newline and tab, so
/// that build output can go into error reports, JSON and XML as plain text.
pub fn plain_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: up to BEL or the string terminator ESC \.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || (c == '\u{1b}' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                // Any other escape is two characters long.
                _ => {}
            },
            '\n' | '\t' => out.push(c),
            '\r' => {
                // A lone carriage return redraws a line (progress output): keep what follows.
                if chars.peek() != Some(&'\n') {
                    out.push('\n');
                }
            }
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Error, ExitStatus, plain_text};

    #[test]
    fn exit_statuses_are_the_documented_codes_and_failed_work_outranks_bad_input() {
        let codes: Vec<u8> = [
            ExitStatus::Success,
            ExitStatus::Failure,
            ExitStatus::BadInput,
            ExitStatus::Interrupted,
        ]
        .into_iter()
        .map(ExitStatus::code)
        .collect();
        assert_eq!(codes, [0, 1, 2, 130]);
        let interrupted = || Error::Interrupted { what: "x".into() };
        assert_eq!(interrupted().exit_status(), ExitStatus::Interrupted);
        assert_eq!(Error::usage("x").exit_status(), ExitStatus::BadInput);
        let many = Error::Many(vec![
            interrupted(),
            Error::usage("x"),
            Error::io("f", std::io::Error::other("x")),
        ]);
        assert_eq!(many.exit_status(), ExitStatus::Failure);
    }

    #[test]
    fn plain_text_drops_colours_titles_and_control_characters() {
        let raw = "\u{1b}[1;31merror\u{1b}[0m: \u{1b}]0;title\u{7}bad\u{0}\u{8} byte\r\nnext\tline\rredrawn";
        assert_eq!(plain_text(raw), "error: bad byte\nnext\tline\nredrawn");
    }
}
