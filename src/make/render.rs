//! The Dockerfile, from the spec's template (handlebars, strict mode: a template that names
//! a field we do not provide is an error, not an empty string).

use crate::error::{Error, Result};
use crate::inputs::pins::DigestKind;
use crate::inputs::spec::Parent;
use crate::plan::PlannedImage;
use serde::Serialize;
use std::collections::BTreeMap;

/// The build argument through which `hallmark build` passes the parent's exact image id; the
/// Dockerfile's default (the parent's tag) serves a plain `docker build` of `render --out`.
pub const PARENT_ARG: &str = "HALLMARK_PARENT";

#[derive(Serialize)]
struct TemplateContext {
    name: String,
    checksum: String,
    parent: String,
    source_date_epoch: u64,
    args: Vec<Pair>,
    env: Vec<Pair>,
    /// Every pinned `[build]` apt package, `name=version`; their files are in the context's
    /// `apt/` folder.
    apt: Vec<String>,
    sources: Vec<Copy>,
    files: bool,
    wheels: bool,
    run: Vec<String>,
    expect_files: Vec<String>,
    workdir: Option<String>,
    user: Option<String>,
    entrypoint: Option<String>,
    cmd: Option<String>,
    labels: Vec<Pair>,
}

#[derive(Serialize)]
struct Pair {
    name: String,
    value: String,
}

#[derive(Serialize)]
struct Copy {
    context_path: String,
    dest: String,
}

/// A Dockerfile double-quoted word, for the instructions that expand variables and remove
/// quotes (ENV, ARG, LABEL, WORKDIR, COPY): `\`, `"` and `$` escaped, everything else as it
/// is, so the engine reads back the value byte for byte. A line break cannot be written at
/// all: the spec's checks refuse control characters other than tab in these values. (COPY
/// splits its arguments at whitespace first: an image path has none.)
fn quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"' | '$') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// A POSIX shell word in single quotes, for arguments of a shell-form RUN.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// A `run` step as an exec-form RUN: the step is the script `/bin/sh -c` runs, exactly as
/// written (line breaks, a trailing `\`, `#` lines and all). The Dockerfile's shell form
/// would join lines, drop comment lines and let a trailing `\` swallow the next instruction.
pub fn run_instruction(step: &str) -> String {
    serde_json::to_string(&["/bin/sh", "-c", step]).expect("strings serialize")
}

/// The working directory as the engines record it: without a trailing `/` (Docker 26 drops
/// it, 20.10 keeps it), so both build paths and every engine agree.
pub fn workdir(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

fn pairs<'a>(
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
    quote_name: bool,
) -> Vec<Pair> {
    map.into_iter()
        .map(|(name, value)| Pair {
            name: if quote_name {
                quote(name)
            } else {
                name.clone()
            },
            value: quote(value),
        })
        .collect()
}

/// The tag or digest the Dockerfile's FROM names by default.
pub fn parent_reference(image: &PlannedImage, parent_tag: Option<&str>) -> String {
    match (image.loaded.spec.parent(), &image.pins.base) {
        (Parent::Image(_), _) => parent_tag
            .expect("derived images have a parent tag")
            .to_string(),
        (Parent::External(_), Some(base)) => match base.kind {
            DigestKind::RepoDigest => crate::make::base::repo_digest_reference(base).to_string(),
            // A local-only base: a plain `docker build` finds it by its tag on any image store
            // (a containerd store would look a bare config digest up on Docker Hub);
            // `hallmark build` passes the image it checked as HALLMARK_PARENT (base.rs).
            DigestKind::ConfigDigest | DigestKind::ImageId => base.reference.to_string(),
        },
        (Parent::External(_), None) => unreachable!("checked pins"),
    }
}

pub use crate::inputs::values::redact_url;

pub use crate::oci::rfc3339;

/// Labels every hallmark image carries besides the spec's own: the checksum and
/// `org.opencontainers.image.*` provenance.
///
/// `checksum_value` is the checksum itself, or `build::pending_label` while the image is not
/// finished: only an image that passed every step may carry the checksum.
pub fn stamped_labels(
    image: &PlannedImage,
    checksum_label: &str,
    checksum_value: &str,
    parent_tag: Option<&str>,
) -> BTreeMap<String, String> {
    let spec = &image.loaded.spec;
    let mut labels = spec.labels.clone();
    labels.insert(
        "org.opencontainers.image.created".into(),
        rfc3339(spec.image.source_date_epoch),
    );
    labels.insert(
        "org.opencontainers.image.title".into(),
        image.loaded.repository().to_string(),
    );
    labels.insert(
        "org.opencontainers.image.base.name".into(),
        parent_reference(image, parent_tag),
    );
    // A derived image would inherit its grandparent's digest beside its parent's name; its
    // parent's own digest depends on the builder's image store, so the key is cleared.
    let base_digest = image.pins.base.as_ref().map(|b| b.digest.to_string());
    labels.insert(
        "org.opencontainers.image.base.digest".into(),
        base_digest.unwrap_or_default(),
    );
    if let Some(first) = image.pins.sources.first() {
        labels.insert(
            "org.opencontainers.image.source".into(),
            redact_url(&first.git),
        );
        labels.insert(
            "org.opencontainers.image.revision".into(),
            first.commit.to_string(),
        );
    }
    for pin in &image.pins.sources {
        labels.insert(
            format!("hallmark.source.{}", pin.name),
            format!("{}@{}", redact_url(&pin.git), pin.commit),
        );
    }
    labels.insert(checksum_label.to_string(), checksum_value.to_string());
    labels
}

/// The checksum label's value in what `hallmark render` prints and writes: a plain `docker
/// build` of it is not an image hallmark finished (no smoke test, no normalisation, no record),
/// and its label says so rather than claim the checksum. Like the pending label, it never
/// equals a checksum, so `verify` calls a node holding it `stale`.
pub fn rendered_label(checksum: &str) -> String {
    format!("rendered-{checksum}")
}

/// Renders the Dockerfile of `image`; `parent_tag` is the parent spec's `repo:tag`.
pub fn dockerfile(
    image: &PlannedImage,
    checksum_label: &str,
    checksum_value: &str,
    parent_tag: Option<&str>,
) -> Result<String> {
    let spec = &image.loaded.spec;
    let json = |v: &Vec<String>| serde_json::to_string(v).expect("strings serialize");
    let context = TemplateContext {
        name: image.name().to_string(),
        checksum: image.checksum.to_string(),
        parent: parent_reference(image, parent_tag),
        source_date_epoch: spec.image.source_date_epoch,
        args: pairs(&spec.build.args, false),
        env: pairs(&spec.env, false),
        apt: image
            .pins
            .apt_for(None)
            .iter()
            .map(|p| p.describe())
            .collect(),
        // Compiled sources reach the image as wheels, not as a tree.
        sources: spec
            .sources
            .iter()
            .filter(|_| spec.compiles.is_empty())
            .map(|s| Copy {
                context_path: format!("sources/{}", s.name.get_ref()),
                dest: quote(s.dest.get_ref().as_str()),
            })
            .collect(),
        files: !image.files.is_empty(),
        wheels: !spec.wheels.is_empty(),
        run: spec.build.run.iter().map(|s| run_instruction(s)).collect(),
        expect_files: spec
            .build
            .expect_files
            .iter()
            .map(|f| shell_quote(f.as_str()))
            .collect(),
        workdir: spec
            .container
            .workdir
            .as_ref()
            .map(|w| quote(workdir(w.as_str()))),
        user: spec.container.user.clone(),
        entrypoint: spec.container.entrypoint.as_ref().map(json),
        cmd: spec.container.cmd.as_ref().map(json),
        labels: pairs(
            &stamped_labels(image, checksum_label, checksum_value, parent_tag),
            true,
        ),
    };
    let mut handlebars = handlebars::Handlebars::new();
    handlebars.set_strict_mode(true);
    handlebars.register_escape_fn(handlebars::no_escape);
    handlebars
        .render_template(&image.template.text, &context)
        .map(|text| tidy(&text))
        .map_err(|e| Error::Template {
            template: image.template.origin.clone(),
            message: e.to_string(),
        })
}

/// Handlebars leaves blank lines where blocks were skipped; keep at most one in a row.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = false;
    for line in text.lines() {
        let is_blank = line.trim().is_empty();
        if !(is_blank && blank) {
            out.push_str(line);
            out.push('\n');
        }
        blank = is_blank;
    }
    out
}

/// The pip requirements file for the wheels: exact versions and their pinned hashes.
pub fn wheel_requirements(image: &PlannedImage) -> String {
    image
        .pins
        .wheels
        .iter()
        .map(|w| format!("{}=={} --hash=sha256:{}\n", w.name, w.version, w.sha256))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_labels() {
        assert_eq!(
            redact_url("https://user:tok@github.com/a/b.git"),
            "https://github.com/a/b.git"
        );
        assert_eq!(
            redact_url("https://github.com/a/b.git"),
            "https://github.com/a/b.git"
        );
        assert_eq!(redact_url("/srv/git/repo"), "/srv/git/repo");
    }

    #[test]
    fn values_are_quoted_for_the_dockerfile_lexer() {
        assert_eq!(quote(r#"a\b"c$d 'é'	"#), r#""a\\b\"c\$d 'é'	""#);
        assert_eq!(shell_quote("/a'b$c"), r"'/a'\''b$c'");
        assert_eq!(
            run_instruction("a \\\n# c\n"),
            r#"["/bin/sh","-c","a \\\n# c\n"]"#
        );
        assert_eq!(workdir("/app/"), "/app");
        assert_eq!(workdir("/"), "/");
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
