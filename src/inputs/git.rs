//! Running git and other tools to completion, their stderr kept for the error: for the
//! source cache (`plan::fetch`) and the patch tools alike.

use crate::error::{Error, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs a command to completion; its stderr goes into the error.
pub(crate) fn run(command: &mut Command, context: impl Fn() -> String) -> Result<String> {
    run_with_input(command, &[], context)
}

/// [`run`], with `input` written to the command's stdin (from a thread, so a command that
/// answers while it reads never blocks on a full pipe).
pub(crate) fn run_with_input(
    command: &mut Command,
    input: &[u8],
    context: impl Fn() -> String,
) -> Result<String> {
    let printable = format!("{command:?}").replace('"', "");
    let failed = |e: std::io::Error| Error::Command {
        command: printable.clone(),
        context: Some(context()),
        stderr: e.to_string(),
    };
    let stdin = match input.is_empty() {
        true => Stdio::null(),
        false => Stdio::piped(),
    };
    command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A fetch from a remote that does not answer ends on Ctrl-C or SIGTERM, with hallmark.
    let (mut child, stoppable) = crate::interrupt::spawn_stoppable(command).map_err(failed)?;
    let output = std::thread::scope(|scope| {
        if let Some(mut pipe) = child.stdin.take() {
            // A write that fails (git ended early) shows as git's own failure below.
            scope.spawn(move || std::io::Write::write_all(&mut pipe, input));
        }
        child.wait_with_output()
    })
    .map_err(failed)?;
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
