//! `hallmark caches`: the compile caches on the builder; and their trimming by `prune`.

use super::{Session, runtime};
use crate::compile::caches::{self, CacheRow};
use crate::error::Result;
use crate::plan::Plan;

fn size(bytes: Option<u64>) -> String {
    match bytes {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        Some(b) => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

fn print(session: &Session, rows: &[CacheRow]) {
    if session.json {
        println!("{}", serde_json::to_string_pretty(rows).expect("json"));
        return;
    }
    println!(
        "{:<20} {:<36} {:>12} {:>12}",
        "CACHE", "VOLUME", "SIZE", "CAP"
    );
    for row in rows {
        println!(
            "{:<20} {:<36} {:>12} {:>12}",
            row.cache,
            row.volume,
            size(row.size),
            size(row.cap)
        );
    }
}

fn caps(session: &Session) -> Result<std::collections::BTreeMap<String, u64>> {
    let names = session.project.image_names()?;
    let specs: Vec<_> = names
        .iter()
        .filter_map(|n| session.project.load_spec(n).ok())
        .collect();
    Ok(caches::caps_of(specs.iter().map(|l| &l.spec)))
}

pub(super) fn caches_command(session: &Session) -> Result<u8> {
    let caps = caps(session)?;
    let rows = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        caches::list(&builder, &caps).await
    })?;
    print(session, &rows);
    Ok(0)
}

/// `prune`'s last step: every compile cache over its cap is trimmed to it.
pub(super) fn trim_caches(session: &Session, plan: &Plan) -> Result<()> {
    let caps = caches::caps_of(plan.images.values().map(|i| &i.loaded.spec));
    let rows = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        caches::trim(&builder, &caps).await
    })?;
    for row in rows {
        session.note(format!(
            "cache `{}` ({}): {} (cap {})",
            row.cache,
            row.volume,
            size(row.size),
            size(row.cap)
        ));
    }
    Ok(())
}
