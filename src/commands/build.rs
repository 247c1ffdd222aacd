//! `hallmark build`: builds on the builder (parents first), stamps, smokes, tags;
//! `--check-repro` builds twice from scratch and compares.

use super::{connect, runtime, until_interrupted};
use crate::build::{self, BuildSettings};
use crate::check;
use crate::error::{Error, ExitStatus, Result};
use crate::plan::Plan;
use crate::settings::Settings;

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    force: bool,
    check_repro: bool,
) -> Result<ExitStatus> {
    let names = settings.names(images)?;
    let plan = Plan::new(&settings.project, &names)?;
    // The lints cost nothing and a wrong ENTRYPOINT costs a deployment: refuse before building.
    let mut problems: Vec<Error> = plan
        .order
        .iter()
        .flat_map(|n| check::lints(&plan, plan.get(n)))
        .collect();
    match problems.len() {
        0 => {}
        1 => return Err(problems.remove(0)),
        _ => return Err(Error::Many(problems)),
    }
    let build_settings = BuildSettings {
        checksum_label: &settings.checksum_label,
        cache: &settings.cache,
        state_dir: &settings.state_dir,
        force,
        echo: settings.output.echo(),
    };
    let mut differences = Vec::new();
    let (records, outcome) = runtime()?.block_on(async {
        let engine = connect(settings, &settings.config.builder).await?;
        let work = async {
            if !check_repro {
                return build::build_all(&engine, &plan, &build_settings).await;
            }
            let mut records = Vec::new();
            for name in &names {
                let (mut pair, found) =
                    match crate::repro::check(&engine, &plan, name, &build_settings).await {
                        Ok(done) => done,
                        Err(error) => return (records, Err(error)),
                    };
                for record in &mut pair {
                    record.reproducible = Some(found.is_empty());
                    record.differences = found.clone();
                }
                differences.extend(found.into_iter().map(|d| format!("{name}: {d}")));
                records.extend(pair);
            }
            (records, Ok(()))
        };
        Ok::<_, Error>(until_interrupted(&engine, "the build", work).await)
    })?;
    if settings.output.json {
        settings.output.json("records", &records);
    }
    outcome?;
    for record in &records {
        let smoke = match record.smoke.len() {
            0 => String::new(),
            n => format!(", {n} smoke test(s) passed"),
        };
        settings.output.note(format!(
            "{} {}  {} ({}, {:.1} s{smoke})",
            record.checksum,
            record.reference,
            record.outcome,
            short_id(&record.image_id),
            record.seconds
        ));
    }
    if check_repro {
        if differences.is_empty() {
            settings
                .output
                .note("reproducible: two builds from scratch gave the same image");
        } else {
            for difference in &differences {
                eprintln!("differs: {difference}");
            }
            eprintln!(
                "error: not reproducible: {} difference(s) between two builds from scratch",
                differences.len()
            );
            return Ok(ExitStatus::Failure);
        }
    }
    Ok(ExitStatus::Success)
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}
