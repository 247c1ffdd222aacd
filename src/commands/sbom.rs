//! `hallmark sbom IMAGE`: the image's SBOM from its plan and pins (`plan::sbom`), offline.

use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::plan::Plan;
use crate::plan::sbom::{self, Format};
use std::path::Path;

pub(super) fn run(
    settings: &Settings,
    image: &str,
    format: Format,
    out: Option<&Path>,
) -> Result<ExitStatus> {
    let name = settings.project.image_name(image)?;
    let mut plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    // The versions the package files say (where the layer store holds them), not the pins'.
    for image in plan.images.values_mut() {
        crate::plan::apt::from_files(&settings.cache, &mut image.pins.apt);
    }
    let text = sbom::write(&plan, plan.get(&name), format);
    match out {
        None => crate::output::stdout_exactly(&text),
        Some(path) => {
            // The folder must exist: a typo in --out is said, not made.
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = dir.filter(|d| !d.is_dir()) {
                return Err(crate::error::Error::Usage {
                    message: format!(
                        "--out {}: the folder {} does not exist",
                        path.display(),
                        dir.display()
                    ),
                    hint: None,
                });
            }
            crate::images::store::write_atomically(path, text.as_bytes())?;
            settings
                .output
                .note(format!("wrote the SBOM of `{name}` to {}", path.display()));
        }
    }
    Ok(ExitStatus::Success)
}
