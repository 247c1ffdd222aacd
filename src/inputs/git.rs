//! Running git and other tools to completion, their stderr kept for the error: for the
//! source cache (`plan::fetch`) and the patch tools alike.

use crate::error::{Error, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs a command to completion; its stderr goes into the error.
pub(crate) fn run(command: &mut Command, context: impl Fn() -> String) -> Result<String> {
    let printable = format!("{command:?}").replace('"', "");
    let failed = |e: std::io::Error| Error::Command {
        command: printable.clone(),
        context: Some(context()),
        stderr: e.to_string(),
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A fetch from a remote that does not answer ends on Ctrl-C or SIGTERM, with hallmark.
    let (child, stoppable) = crate::interrupt::spawn_stoppable(command).map_err(failed)?;
    let output = child.wait_with_output().map_err(failed)?;
    drop(stoppable);
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: printable,
            context: Some(context()),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// `git` on the bare repository `repo`.
pub(crate) fn git(repo: &Path) -> Command {
    let mut command = Command::new("git");
    command.arg("--git-dir").arg(repo);
    command
}
