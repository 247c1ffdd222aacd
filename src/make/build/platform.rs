//! The platform check: the builder must build for the platform the spec asks, and the image it
//! made must say that platform.

use super::*;

/// Refuses an engine build for a platform the builder is not: its RUN steps would run on the
/// builder's own platform and give an image that is not what the spec names.
pub(super) async fn check_builder_platform(
    engine: &Engine,
    image: &PlannedImage,
    wanted: &str,
) -> Result<()> {
    let builder = engine.platform();
    if same_platform(&builder, wanted) {
        return Ok(());
    }
    Err(Error::Engine {
        node: engine.node.clone(),
        endpoint: engine.endpoint.clone(),
        message: format!(
            "cannot build `{}` for {wanted}: the builder is {builder}, and the image's RUN steps run on the builder",
            image.name()
        ),
        hint: Some(format!(
            "build it on a {wanted} builder (`[builder]` in hallmark.toml), or drop `[image] platform`"
        )),
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

/// Whether platform `have` satisfies `want`: the same os and architecture, and the same
/// variant when `want` names one (`linux/arm64` is `linux/arm64/v8`).
pub fn same_platform(have: &str, want: &str) -> bool {
    let canonical = |p: &str| {
        let mut parts: Vec<String> = p.split('/').map(str::to_ascii_lowercase).collect();
        if parts.len() == 2 && parts[1] == "arm64" {
            parts.push("v8".into());
        }
        parts
    };
    let (have, want) = (canonical(have), canonical(want));
    have.len() >= 2
        && want.len() >= 2
        && have[..2] == want[..2]
        && (want.len() < 3 || have.get(2) == want.get(2))
}
