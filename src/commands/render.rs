//! `hallmark render`: the Dockerfile on stdout; `--out DIR` also writes the build context.

use super::parent_tag;
use crate::commands::settings::Settings;
use crate::error::{ExitStatus, Result};
use crate::make::{context, render};
use crate::plan::Plan;
use crate::plan::fetch;

pub(super) fn run(
    settings: &Settings,
    image: &str,
    out: Option<&std::path::Path>,
) -> Result<ExitStatus> {
    let name = settings.project.image_name(image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let dockerfile = render::dockerfile(
        planned,
        &settings.checksum_label,
        &render::rendered_label(planned.checksum.as_str()),
        parent_tag(&plan, &name).as_deref(),
    )?;
    crate::output::stdout_exactly(&crate::plan::compile::describe(
        &planned.compiles,
        &planned.loaded,
    ));
    crate::output::stdout_exactly(&dockerfile);
    if !planned.compiles.is_empty() {
        settings.output.note(format!(
            "hallmark: `{name}` is assembled: its compile stages run in containers on the builder (`hallmark build`), their wheels are installed into a layer of their own (the Dockerfile above installs the pinned wheels only)"
        ));
    } else if crate::make::assemble::assemblable(&planned.loaded.spec) {
        settings.output.note(format!(
            "hallmark: `{name}` only adds files and metadata to its parent: `hallmark build` assembles it without running a build (the Dockerfile above gives the same content)"
        ));
    } else {
        settings.output.note(format!(
            "hallmark: `{name}` is built by the engine's builder from the Dockerfile above"
        ));
    }
    if let Some(dir) = out {
        let fetched = fetch::fetch(&settings.cache, planned)?;
        context::unpack_into(planned, &dockerfile, &fetched, dir)?;
        settings.output.note(format!(
            "wrote the build context of {name} to {}",
            dir.display()
        ));
    }
    Ok(ExitStatus::Success)
}
