//! `hallmark lock`: resolves pins into pins/<image>.toml, asking the builder for base
//! digests when it can (base.rs).

use super::runtime;
use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::make::base::BuilderResolver;

pub(super) fn run(settings: &Settings, images: &[String], update: bool) -> Result<ExitStatus> {
    // A line every few seconds where stderr is no terminal (CI logs, ssh).
    let _heartbeat = settings.output.heartbeat("lock");
    let mut names = if images.is_empty() {
        settings.project.all_images()?
    } else {
        settings.names(images)?
    };
    // Parents first: apt pins record the parent's checksum, which needs the parent's pins.
    let depth = |name: &crate::inputs::values::Name| {
        let mut depth = 0;
        let mut current = settings.project.load_spec(name).ok();
        while let Some(loaded) = current.take() {
            if let crate::inputs::spec::Parent::Image(parent) = loaded.spec.parent() {
                depth += 1;
                if depth < 64 {
                    current = settings.project.load_spec(parent).ok();
                }
            }
        }
        depth
    };
    names.sort_by_cached_key(depth);
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
