//! `hallmark sbom IMAGE`: the image's SBOM from its plan and pins (`plan::sbom`), offline.

use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
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
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let text = sbom::write(&plan, plan.get(&name), format);
    match out {
        None => crate::output::stdout_exactly(&text),
        Some(path) => {
            // Written beside and renamed: a reader never sees half a document.
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
            std::io::Write::write_all(&mut file, text.as_bytes())
                .map_err(|e| Error::io(path, e))?;
            file.persist(path).map_err(|e| Error::io(path, e.error))?;
            settings
                .output
                .note(format!("wrote the SBOM of `{name}` to {}", path.display()));
        }
    }
    Ok(ExitStatus::Success)
}
