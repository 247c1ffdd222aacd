//! `hallmark lock`: resolves pins into pins/<image>.toml, asking the builder for base
//! digests when it can (base.rs).

use super::runtime;
use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::make::base::BuilderResolver;

pub(super) fn run(settings: &Settings, images: &[String], update: bool) -> Result<ExitStatus> {
    let names = if images.is_empty() {
        settings.project.all_images()?
    } else {
        settings.names(images)?
    };
    let runtime = runtime()?;
    let resolver = BuilderResolver {
        builder: &settings.config.builder,
        ssh_config: settings.config.ssh_config.as_deref(),
        cache: &settings.cache,
        runtime: &runtime,
    };
    for name in &names {
        let report =
            crate::plan::lock::lock(&settings.project, name, update, &resolver, &settings.cache)?;
        if report.changes.is_empty() {
            settings
                .output
                .note(format!("{}: pins current", report.image));
        }
        for change in &report.changes {
            settings.output.note(format!("{}: {change}", report.image));
        }
    }
    Ok(ExitStatus::Success)
}
