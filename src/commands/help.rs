//! `hallmark completions SHELL` and `hallmark man`: written by clap_complete and
//! clap_mangen from the command line's own definition (cli.rs), so they never drift from it.

use crate::cli::Cli;
use crate::error::{Error, ExitStatus, Result};
use clap::CommandFactory;

pub(super) fn completions(shell: clap_complete::Shell) -> ExitStatus {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "hallmark", &mut script);
    crate::output::stdout_exactly(&String::from_utf8_lossy(&script));
    ExitStatus::Success
}

pub(super) fn man() -> Result<ExitStatus> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut page)
        .map_err(|e| Error::usage(format!("cannot write the man page: {e}")))?;
    crate::output::stdout_exactly(&String::from_utf8_lossy(&page));
    Ok(ExitStatus::Success)
}
