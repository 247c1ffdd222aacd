//! `hallmark build`: builds on the builder (parents first), stamps, smokes, tags;
//! `--check-repro` builds twice from scratch and compares.

use super::{connect, runtime, until_interrupted};
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::make::build::{self, BuildSettings};
use crate::make::provenance;
use crate::plan::Plan;
use crate::plan::check;

/// Builds `name` (and the parents it needs) on the builder, smoke tests included: the
/// error says what failed (`bump --build`).
pub(super) fn build_one(settings: &Settings, name: &crate::inputs::values::Name) -> Result<()> {
    let plan = Plan::new(&settings.project, std::slice::from_ref(name))?;
    let build_settings = BuildSettings {
        checksum_label: &settings.checksum_label,
        cache: &settings.cache,
        state_dir: &settings.state_dir,
        force: false,
        echo: settings.output.echo(),
        emulate: settings.config.builder.emulate,
    };
    let (_, outcome) = runtime()?.block_on(async {
        let engine = connect(settings, &settings.config.builder).await?;
        let work = build::build_all(&engine, &plan, &build_settings);
        Ok::<_, Error>(until_interrupted(&engine, "the build", work).await)
    })?;
    outcome
}

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    force: bool,
    check_repro: bool,
    no_emulate: bool,
) -> Result<ExitStatus> {
    // A line every few seconds where stderr is no terminal (CI logs, ssh): a silent step
    // (a compile, a long load) showed nothing there for many minutes.
    let _heartbeat = settings.output.heartbeat("build");
    let names = settings.names(images)?;
    // An image that cannot be planned is said on stderr and not built; the others are
    // (`build A B C` with a bad B built nothing), and the exit says the input was bad.
    let (plan, unplanned) = super::plan_each(settings, &names);
    let names: Vec<_> = names
        .into_iter()
        .filter(|n| !unplanned.contains_key(n))
        .collect();
    check::refuse_lint_problems(&plan)?;
    provenance::refuse_unusable_key(&settings.config, &settings.project)?;
    let build_settings = BuildSettings {
        checksum_label: &settings.checksum_label,
        cache: &settings.cache,
        state_dir: &settings.state_dir,
        force,
        echo: settings.output.echo(),
        emulate: settings.config.builder.emulate && !no_emulate,
    };
    let mut differences = Vec::new();
    let (records, outcome, signed) = runtime()?.block_on(async {
        let engine = connect(settings, &settings.config.builder).await?;
        let work = async {
            if check_repro {
                crate::make::repro::repro_all(
                    &engine,
                    &plan,
                    &names,
                    &build_settings,
                    &mut differences,
                )
                .await
            } else {
                build::build_all(&engine, &plan, &build_settings).await
            }
        };
        let (records, outcome) = until_interrupted(&engine, "the build", work).await;
        let around = (&settings.config, &settings.project, &settings.output);
        let signed =
            provenance::sign_provenance(around, &build_settings, &engine, &plan, &records).await;
        Ok::<_, Error>((records, outcome, signed))
    })?;
    if settings.output.json {
        settings.output.json("records", &records);
    }
    outcome?;
    // After the records: a failed signature does not hide what was built.
    signed?;
    show_records(settings, &records);
    if !unplanned.is_empty() {
        return Ok(ExitStatus::BadInput);
    }
    if !check_repro {
        return Ok(ExitStatus::Success);
    }
    if differences.is_empty() {
        settings
            .output
            .note("reproducible: two builds from scratch gave the same image");
        return Ok(ExitStatus::Success);
    }
    for difference in &differences {
        crate::output::stderr(&format!("differs: {difference}"));
    }
    crate::output::stderr(&format!(
        "error: not reproducible: {} difference(s) between two builds from scratch",
        differences.len()
    ));
    Ok(ExitStatus::Failure)
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

/// A line per image built: its checksum, reference, outcome, id, time, smoke tests passed,
/// and how it ran when it ran emulated.
fn show_records(settings: &Settings, records: &[build::BuildRecord]) {
    for record in records {
        let smoke = match record.smoke.len() {
            0 => String::new(),
            n => format!(", {n} smoke test(s) passed"),
        };
        let emulated = match (&record.execution, &record.platform) {
            (Some(crate::engine::emulation::Execution::Emulated), Some(platform)) => format!(
                ", emulated: {platform} on builder `{}`",
                settings.config.builder.name
            ),
            _ => String::new(),
        };
        settings.output.note(format!(
            "{} {}  {} ({}, {:.1} s{smoke}{emulated})",
            record.checksum,
            record.reference,
            record.outcome,
            short_id(&record.image_id),
            record.seconds
        ));
    }
}
