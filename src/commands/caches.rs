//! `hallmark caches`: the compile caches on the builder; and their trimming by `prune`.

use super::{connect, runtime};
use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::make::compile::caches::{self, CacheRow};
use crate::output::Row;
use crate::plan::Plan;

fn size(bytes: Option<u64>) -> String {
    match bytes {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        Some(b) => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

impl Row for CacheRow {
    fn header() -> Option<String> {
        Some(format!(
            "{:<20} {:<36} {:>12} {:>12}",
            "CACHE", "VOLUME", "SIZE", "CAP"
        ))
    }

    fn lines(&self) -> Vec<String> {
        vec![format!(
            "{:<20} {:<36} {:>12} {:>12}",
            self.cache,
            self.volume,
            size(self.size),
            size(self.cap)
        )]
    }
}

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let names = settings.project.image_names()?;
    let specs: Vec<_> = names
        .iter()
        .filter_map(|n| settings.project.load_spec(n).ok())
        .collect();
    let caps = caches::caps_of(specs.iter().map(|l| &l.spec));
    let rows = runtime()?.block_on(async {
        let builder = connect(settings, &settings.config.builder).await?;
        caches::list(&builder, &caps).await
    })?;
    settings.output.table("caches", &rows);
    Ok(ExitStatus::Success)
}

/// `prune`'s last step: every compile cache over its cap is trimmed to it.
pub(super) fn trim(settings: &Settings, plan: &Plan) -> Result<()> {
    let caps = caches::caps_of(plan.images.values().map(|i| &i.loaded.spec));
    let rows = runtime()?.block_on(async {
        let builder = connect(settings, &settings.config.builder).await?;
        caches::trim(&builder, &caps).await
    })?;
    for row in rows {
        settings.output.note(format!(
            "cache `{}` ({}): {} (cap {})",
            row.cache,
            row.volume,
            size(row.size),
            size(row.cap)
        ));
    }
    Ok(())
}
