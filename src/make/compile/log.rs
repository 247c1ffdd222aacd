//! A stage container's output: followed to its end into the stage's log, with the command
//! it was at and its last lines kept for the error.

use crate::engine::Engine;
use crate::error::{Error, Result};
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;

/// The marker the driver (`run.rs`) prints before command N, alone on a line.
pub(super) const STEP_MARKER: &str = "##hallmark-step ";

/// What a container printed: the command it was at (the driver's last marker; 0 before the
/// first) and its last lines since that marker.
pub(super) struct Followed {
    pub step: usize,
    pub tail: Vec<String>,
}

/// Follows a started container's output to its end into the log at `log_path` (and stderr
/// with `echo`).
pub(super) async fn follow_output(
    engine: &Engine,
    id: &str,
    log_path: &Path,
    echo: bool,
) -> Result<Followed> {
    let dir = log_path.parent().expect("logs live in a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut log = fs_err::File::create(log_path).map_err(|e| Error::io(log_path, e))?;
    let mut output = engine.follow_logs(id);
    let (mut step, mut tail, mut partial) = (0usize, VecDeque::new(), String::new());
    // A command's marker goes to the log only; its output to the log, stderr and the tail.
    let mut keep = |line: &str, tail: Option<&mut VecDeque<String>>| {
        let _ = writeln!(log, "{line}");
        let Some(tail) = tail else { return };
        if echo {
            crate::output::stderr(line);
        }
        tail.push_back(line.to_string());
        if tail.len() > 20 {
            tail.pop_front();
        }
    };
    while let Some(chunk) = output.next().await {
        let text = chunk.map_err(|e| engine.error(format!("reading the output of {id}: {e}")))?;
        partial.push_str(&text);
        while let Some(end) = partial.find('\n') {
            let line: String = partial.drain(..=end).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            match line.strip_prefix(STEP_MARKER).and_then(|n| n.parse().ok()) {
                Some(n) => {
                    step = n;
                    tail.clear();
                    keep(&format!("# hallmark: command {n}"), None);
                }
                None => keep(line, Some(&mut tail)),
            }
        }
    }
    if !partial.is_empty() {
        keep(&partial, Some(&mut tail));
    }
    Ok(Followed {
        step,
        tail: tail.into(),
    })
}
