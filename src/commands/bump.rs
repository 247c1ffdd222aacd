//! `hallmark bump`: moves a source's pin to the newest upstream revision where the image's
//! patch series still applies (upstream patches dropped, offset-only ones refreshed). The
//! search is exact: the series is checked once per run of candidates whose files it touches
//! are the same, newest first (plan/bump.rs). Writes the pin, the refreshed series and, in
//! tags mode, the spec's `rev`, all or nothing, one bump of a project at a time; with
//! `--build`, builds and smoke-tests the result, and with `--bisect` finds the first
//! candidate whose build or smoke fails (docs/patches.md). The work is plan/bump/source.rs's
//! (a source) and plan/bump/pins.rs's (`--base`, `--wheel`, `--apt`).

use crate::cli::BumpArgs;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::plan::bump::source::{self, Asked, Env};

pub(super) fn run(settings: &Settings, args: &BumpArgs) -> Result<ExitStatus> {
    if args.bisect && !args.build {
        return Err(Error::usage(
            "--bisect bisects failed builds: it needs --build",
        ));
    }
    // Read the spec and pins only once the turn is ours: another bump may be moving them.
    let _turn = source::one_bump_at_a_time(&settings.project, &settings.output)?;
    if args.base || args.wheel.is_some() || args.apt {
        return super::bump_pins::run(settings, args);
    }
    let name = settings.project.image_name(&args.image)?;
    let build = || super::build::build_one(settings, &name);
    let env = Env {
        output: &settings.output,
        project: &settings.project,
        cache: &settings.cache,
        build: &build,
    };
    let asked = Asked {
        source: args.source.as_deref(),
        tags: args.tags.as_deref(),
        branch: args.branch.as_deref(),
        to: args.to.as_deref(),
        dry_run: args.dry_run,
        build: args.build,
        bisect: args.bisect,
    };
    source::run(&env, &name, &asked)
}
