//! The platform check: the builder must build for the platform the spec asks, and the image it
//! made must say that platform.

use super::*;
use crate::engine::emulation::Execution;
pub use crate::engine::emulation::same_platform;

/// Whether the spec makes the engine build run code of the image's platform: apt, pip, RUN
/// steps or the expected-files check (a spec of files, sources and config alone runs none;
/// compile stages ask on their own, as their toolchain's platform).
pub fn runs_code(spec: &crate::inputs::spec::ImageSpec) -> bool {
    let build = &spec.build;
    !build.run.is_empty()
        || !build.apt.is_empty()
        || !build.expect_files.is_empty()
        || !spec.wheels.is_empty()
}

impl Job<'_> {
    /// The one question before any code of the image's platform runs on the builder: the
    /// platform is the spec's, else the parent's; the builder runs it natively, or emulated
    /// (said, and recorded), or the build is refused saying how to make it possible.
    pub(super) async fn builder_runs_the_platform(&self, record: &mut BuildRecord) -> Result<()> {
        if !runs_code(&self.image.loaded.spec) && self.image.compiles.is_empty() {
            return Ok(());
        }
        let platform = match self.image.loaded.spec.image.platform.clone() {
            Some(platform) => Some(platform),
            None => match self.parent_id.as_deref().or(self.parent_tag) {
                Some(parent) => self.engine.inspect(parent).await?.map(|p| p.platform()),
                None => None,
            },
        };
        let Some(platform) = platform else {
            return Ok(());
        };
        let execution = runs_platform(
            self.engine,
            self.image,
            &platform,
            self.settings.emulate,
            "its RUN, apt and pip steps",
        )
        .await?;
        if execution == Execution::Emulated {
            // Said before the steps start: they run many times slower than natively.
            crate::output::stderr(&format!(
                "{}: emulated: {platform} on a {} builder (`{}`): its RUN, apt, pip and compile steps run through the builder's emulator",
                self.image.name(),
                self.engine.platform(),
                self.engine.node
            ));
        }
        record.execution = Some(execution);
        record.platform = Some(platform);
        Ok(())
    }
}

/// How `engine` runs `what` of `image`, of `platform`: natively, emulated when `emulate`
/// allows it and the engine can, else a refusal that says why and what to do.
pub async fn runs_platform(
    engine: &Engine,
    image: &PlannedImage,
    platform: &str,
    emulate: bool,
    what: &str,
) -> Result<Execution> {
    let own = engine.platform();
    if same_platform(&own, platform) {
        return Ok(Execution::Native);
    }
    if !emulate {
        return Err(Error::Engine {
            node: engine.node.clone(),
            endpoint: engine.endpoint.clone(),
            message: format!(
                "cannot run {what} of `{}` ({platform}) here: the engine is {own}, and emulation is off for node `{}` (`emulate = false` in hallmark.toml, or --no-emulate)",
                image.name(),
                engine.node
            ),
            hint: Some(format!(
                "run them on a {platform} machine, or allow emulation there"
            )),
        });
    }
    engine.runs_platform(platform).await.map_err(|e| match e {
        Error::Engine {
            node,
            endpoint,
            message,
            ..
        } => Error::Engine {
            node,
            endpoint,
            message: format!("cannot run {what} of `{}`: {message}", image.name()),
            hint: Some(format!(
                "or run them on a {platform} machine (for a build: `[builder]` in hallmark.toml)"
            )),
        },
        other => other,
    })
}

/// The image made for a spec must be of the platform the spec names, whatever made it.
pub(super) fn check_image_platform(
    engine: &Engine,
    image: &PlannedImage,
    made: &crate::engine::ImageAnswer,
    wanted: &str,
) -> Result<()> {
    let got = made.platform();
    if same_platform(&got, wanted) {
        return Ok(());
    }
    Err(engine.error(format!(
        "the image made for `{}` is {got}, but its spec names {wanted} (is its parent of another platform?)",
        image.name()
    )))
}
