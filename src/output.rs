//! What commands print: typed rows on stdout, as a table or, with `--json`, as one JSON
//! document; notes on stderr. docs/json.md describes every document; each carries
//! `"version"`, raised when a shape changes in a way a reader would notice.

pub mod progress;

use serde::Serialize;

/// The `"version"` of every `--json` document.
pub const JSON_VERSION: u32 = 1;

/// The version first, then the command's fields.
#[derive(Serialize)]
struct Document {
    version: u32,
    #[serde(flatten)]
    fields: serde_json::Map<String, serde_json::Value>,
}

/// `{"version": 1, "<key>": rows}`, serialised straight from the rows (a `serde_json::Value`
/// would sort their keys).
struct Rows<'a, T: ?Sized> {
    key: &'a str,
    rows: &'a T,
}

impl<T: Serialize + ?Sized> Serialize for Rows<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("version", &JSON_VERSION)?;
        map.serialize_entry(self.key, self.rows)?;
        map.end()
    }
}

/// A row of a command's table: the same value is one JSON object with `--json`.
pub trait Row: Serialize {
    /// The table's header line, if the table has one.
    fn header() -> Option<String> {
        None
    }
    /// The row's lines in the table (a row may stand for several lines, or none).
    fn lines(&self) -> Vec<String> {
        Vec::new()
    }
    /// A table whose columns widen to what they hold (names of any length stay in line): its
    /// columns, and each row's [`Row::cells`] instead of its lines.
    fn columns() -> Option<&'static [Column]> {
        None
    }
    /// The row's lines as cells, one per column.
    fn cells(&self) -> Vec<Vec<String>> {
        Vec::new()
    }
}

/// A column of a table of [`Row::columns`]: its title (none, if every title is empty: no
/// header line), its least width and its side.
pub struct Column {
    pub title: &'static str,
    pub least: usize,
    pub right: bool,
}

impl Column {
    pub const fn left(title: &'static str, least: usize) -> Column {
        Column {
            title,
            least,
            right: false,
        }
    }

    pub const fn right(title: &'static str, least: usize) -> Column {
        Column {
            title,
            least,
            right: true,
        }
    }
}

/// The lines of a table of `columns`: each column as wide as its widest cell, at least its
/// least width; cells one space apart; the last column unpadded.
fn aligned(columns: &[Column], rows: Vec<Vec<String>>) -> Vec<String> {
    let titled = columns.iter().any(|c| !c.title.is_empty());
    let header = titled.then(|| columns.iter().map(|c| c.title.to_string()).collect());
    let lines: Vec<Vec<String>> = header.into_iter().chain(rows).collect();
    let width = |i: usize| {
        let widest = lines
            .iter()
            .filter_map(|l| l.get(i))
            .map(|c| c.chars().count());
        widest.max().unwrap_or(0).max(columns[i].least)
    };
    let widths: Vec<usize> = (0..columns.len()).map(width).collect();
    lines
        .iter()
        .map(|cells| {
            let last = cells.len().saturating_sub(1);
            let padded = cells
                .iter()
                .enumerate()
                .map(|(i, cell)| match columns.get(i) {
                    Some(_) if i == last && !columns[i].right => cell.clone(),
                    Some(column) if column.right => format!("{cell:>width$}", width = widths[i]),
                    Some(_) => format!("{cell:<width$}", width = widths[i]),
                    None => cell.clone(),
                });
            // An empty last cell leaves no trailing space.
            padded.collect::<Vec<_>>().join(" ").trim_end().to_string()
        })
        .collect()
}

/// `--json`, `-q`, `-v`, resolved once (settings.rs).
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
    pub quiet: bool,
    pub verbose: bool,
    /// stderr is a terminal: progress lines can redraw themselves there.
    terminal: bool,
}

impl Output {
    pub fn new(json: bool, quiet: bool, verbose: bool, terminal: bool) -> Output {
        Output {
            json,
            quiet,
            verbose,
            terminal,
        }
    }

    /// A line on stderr, unless `-q`.
    pub fn note(&self, message: impl AsRef<str>) {
        if !self.quiet {
            stderr(message.as_ref());
        }
    }

    /// A note only `-v` asks for.
    pub fn detail(&self, message: impl FnOnce() -> String) {
        if self.verbose {
            self.note(message());
        }
    }

    /// Whether a build's log streams to stderr: not with `-q`, nor with `--json` (whose
    /// reader wants stdout alone, and a quiet stderr).
    pub fn echo(&self) -> bool {
        !self.quiet && !self.json
    }

    /// Whether transfers draw progress on stderr: as [`Output::echo`], on a terminal only.
    pub fn progress(&self) -> bool {
        self.echo() && self.terminal
    }

    /// Where stderr is no terminal, and output is not quiet nor `--json`: a line every few
    /// seconds while `verb` works ([`progress::Heartbeat`]); `None` elsewhere (a terminal
    /// has the bars and the streamed log).
    pub fn heartbeat(&self, verb: &str) -> Option<progress::Heartbeat> {
        (self.echo() && !self.terminal).then(|| progress::Heartbeat::start(verb))
    }

    /// Prints `{"version": 1, "<key>": value}` on stdout, `value`'s keys in its own order.
    pub fn json<T: Serialize + ?Sized>(&self, key: &str, value: &T) {
        let document = Rows { key, rows: value };
        stdout(&serde_json::to_string_pretty(&document).expect("json"));
    }

    /// Prints `{"version": 1, ...fields}` on stdout.
    pub fn document(&self, fields: &[(&str, serde_json::Value)]) {
        let document = Document {
            version: JSON_VERSION,
            fields: fields
                .iter()
                .map(|(key, value)| (key.to_string(), value.clone()))
                .collect(),
        };
        stdout(&serde_json::to_string_pretty(&document).expect("json"));
    }

    /// `rows` on stdout: a JSON document under `key` with `--json`, else a table.
    pub fn table<R: Row>(&self, key: &str, rows: &[R]) {
        if self.json {
            return self.json(key, rows);
        }
        if let Some(columns) = R::columns() {
            let cells = rows.iter().flat_map(Row::cells).collect();
            for line in aligned(columns, cells) {
                stdout(&line);
            }
            return;
        }
        if let Some(header) = R::header() {
            stdout(&header);
        }
        for row in rows {
            for line in row.lines() {
                stdout(line.trim_end());
            }
        }
    }
}

/// `text` and a newline on stdout. A reader that went away (`hallmark status | head`) ends
/// the printing, not the command: `println!` would panic on the broken pipe, and the command's
/// work (a build, a distribute) is done by then; its exit status still says how it went.
pub fn stdout(text: &str) {
    stdout_exactly(&format!("{text}\n"));
}

/// `text` on stdout as it is (a rendered Dockerfile, a checksum document), as [`stdout`].
pub fn stdout_exactly(text: &str) {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            stderr(&format!("hallmark: cannot write to stdout: {e}"))
        }
        _ => {}
    }
}

/// Spans and events on stderr when `RUST_LOG` asks for them (`RUST_LOG=hallmark=debug`):
/// per image, node and layer, what was decided and why. Off otherwise, so the tables, notes
/// and progress are all a user sees. Fields carry names, ids and sizes, never credentials
/// (docs/security.md).
pub fn tracing_from_env() {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// `text` on stderr as it is: the one place outside [`Output`] that writes there (an error
/// report, a build's streamed log, a note before any `Output` exists). Like [`stdout`], a
/// stderr that went away ends the printing, not the command.
pub fn stderr_exactly(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `text` and a newline on stderr, as [`stderr_exactly`].
pub fn stderr(text: &str) {
    stderr_exactly(&format!("{text}\n"));
}

/// A value in a table cell as the JSON document has it: a string plain, anything else
/// (numbers, `null`) as JSON.
pub fn cell<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value).expect("json") {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outside test saw a distribute table's columns shift under an image name longer
    /// than the column: a column now widens to its widest cell, for every line.
    #[test]
    fn a_column_widens_to_its_widest_cell_on_every_line() {
        let columns = [
            Column::left("image", 5),
            Column::right("bytes", 5),
            Column::left("error", 0),
        ];
        let row = |cells: [&str; 3]| cells.map(String::from).to_vec();
        let lines = aligned(
            &columns,
            vec![
                row(["a", "12", ""]),
                row(["a-long-image-name", "123456", "gone"]),
            ],
        );
        assert_eq!(
            lines,
            [
                "image              bytes error",
                "a                     12",
                "a-long-image-name 123456 gone",
            ]
        );
        let untitled = [Column::left("", 3), Column::left("", 0)];
        assert_eq!(
            aligned(&untitled, vec![row(["ab", "x", ""])[..2].to_vec()]),
            ["ab  x"]
        );
    }

    #[test]
    fn cells_read_as_the_json_does() {
        assert_eq!(cell(&Some("26.1")), "26.1");
        assert_eq!(cell(&None::<String>), "null");
        assert_eq!(cell(&Some(3)), "3");
    }
}
