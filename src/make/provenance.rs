//! The provenance of a built image: an in-toto Statement v1 with a SLSA Provenance v1
//! predicate. Its subject is the image by its config digest (the one identity every image
//! store agrees on: a node's manifest digest depends on how its store took the image in);
//! its build definition is the spec, the pins and every input they resolve, and the input
//! checksum; its run details the builder node, its engine and hallmark. Signed with the key
//! `[provenance]` names (`images::attest`) when the image is finished, kept in the layer
//! store by subject and in the project's state by image.

mod signing;

pub use signing::{refuse_unusable_key, sign_provenance};

use crate::error::{Error, Result};
use crate::images::attest::{self, Envelope};
use crate::images::store::LayerStore;
use crate::plan::checksum::sha256_hex;
use crate::plan::{Plan, PlannedImage};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Who built it, for `runDetails`.
pub struct Builder<'a> {
    pub node: &'a str,
    pub engine_version: &'a str,
}

/// The Statement for `image`, built as `subject` (`sha256:<config digest>`).
pub fn statement(
    plan: &Plan,
    image: &PlannedImage,
    subject: &str,
    builder: &Builder<'_>,
    checksum_label: &str,
) -> Value {
    let hex = subject.strip_prefix("sha256:").unwrap_or(subject);
    let dependencies = dependencies(plan, image);
    json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": image.loaded.reference(), "digest": {"sha256": hex}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://hallmark.invalid/build/v1",
                "externalParameters": {
                    "image": image.name().to_string(),
                    "checksum": image.checksum.to_string(),
                },
                "internalParameters": {"checksumLabel": checksum_label},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {
                    "id": format!("https://hallmark.invalid/builder/{}", builder.node),
                    "version": {
                        "hallmark": env!("CARGO_PKG_VERSION"),
                        "engine": builder.engine_version,
                    },
                },
                "metadata": {"invocationId": image.checksum.to_string()},
            },
        },
    })
}

/// What the image was made from, in the Statement's order: its spec and pins files, the
/// parent or base, the sources and patches, the files, wheels, apt packages and compile
/// stages.
fn dependencies(plan: &Plan, image: &PlannedImage) -> Vec<Value> {
    let mut dependencies = spec_files(image);
    if let Some(parent) = &image.parent {
        let below = plan.get(parent);
        dependencies.push(json!({
            "name": below.loaded.reference(),
            "digest": {"hallmarkChecksum": below.checksum.to_string()},
        }));
    }
    if let Some(base) = &image.pins.base {
        let digest = base.digest.to_string();
        let (algorithm, value) = digest.split_once(':').unwrap_or(("sha256", &digest));
        dependencies
            .push(json!({"name": base.reference.to_string(), "digest": {algorithm: value}}));
    }
    dependencies.extend(sources(image));
    for file in &image.files {
        dependencies.push(json!({"name": file.dest, "digest": {"sha256": file.sha256}}));
    }
    for wheel in &image.pins.wheels {
        dependencies.push(json!({
            "name": wheel.file,
            "uri": format!("pkg:pypi/{}@{}", wheel.name.as_str().to_lowercase().replace(['_', '.'], "-"), wheel.version),
            "digest": {"sha256": wheel.sha256.to_string()},
        }));
    }
    for pin in &image.pins.apt {
        dependencies.push(json!({
            "name": match &pin.stage {
                None => pin.describe(),
                Some(stage) => format!("{} (compile stage {stage})", pin.describe()),
            },
            "uri": format!("{}/{}", pin.archive, pin.path),
            "digest": {"sha256": pin.sha256.to_string()},
        }));
    }
    for stage in &image.compiles {
        dependencies.push(json!({
            "name": format!("compile stage {}", stage.name),
            "digest": {"hallmarkChecksum": stage.checksum.to_string()},
        }));
    }
    dependencies
}

/// The spec and pins files, by sha256, named relative to the project.
fn spec_files(image: &PlannedImage) -> Vec<Value> {
    let file = |path: &Path| fs_err::read(path).map(|bytes| sha256_hex(&bytes)).ok();
    let root = image
        .loaded
        .path
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent);
    let relative = |path: &Path| {
        root.and_then(|r| path.strip_prefix(r).ok())
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let mut dependencies = Vec::new();
    let mut files = vec![image.loaded.path.clone()];
    files.extend(root.map(|root| crate::inputs::pins::path_for(root, image.name())));
    for path in files {
        if let Some(sha256) = file(&path) {
            dependencies.push(json!({"name": relative(&path), "digest": {"sha256": sha256}}));
        }
    }
    dependencies
}

/// Each source at its commit (its URL without credentials), and its patches.
fn sources(image: &PlannedImage) -> Vec<Value> {
    let mut dependencies = Vec::new();
    for (pin, patches) in image.pins.sources.iter().zip(&image.patches) {
        // Credentials never reach the Statement; a local path is no URI (and is the builder's).
        let git = crate::inputs::values::redact_url(&pin.git);
        let mut source = json!({
            "name": pin.name.to_string(),
            "digest": {"gitCommit": pin.commit.to_string()},
        });
        if git.contains("://") {
            source["uri"] = json!(format!("git+{git}@{}", pin.commit));
        }
        dependencies.push(source);
        for set in &patches.sets {
            for patch in &set.patches {
                dependencies.push(json!({
                    "name": format!("patches/{}/{}", set.name, patch.file),
                    "digest": {"sha256": patch.sha256},
                }));
            }
        }
    }
    dependencies
}

/// Where the store keeps the envelope of `subject`, shared by projects.
pub fn kept_in_store(store: &LayerStore, subject: &str) -> PathBuf {
    let hex = subject.strip_prefix("sha256:").unwrap_or(subject);
    store.root.join("provenance").join(format!("{hex}.json"))
}

/// Where the project keeps the envelope of its image `name`, the latest it signed.
pub fn kept_in_project(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("provenance").join(format!("{name}.json"))
}

/// Signs the Statement with `key` and keeps the envelope in both places.
pub fn sign_and_keep(
    statement: &Value,
    key: &Path,
    store: &LayerStore,
    state_dir: &Path,
    name: &str,
    subject: &str,
) -> Result<Envelope> {
    let envelope = attest::sign(statement, key).map_err(|message| Error::Usage {
        message: format!("signing the provenance of `{name}`: {message}"),
        hint: Some(
            "[provenance] key in hallmark.toml names the signing key (docs/supply-chain.md)".into(),
        ),
    })?;
    let mut text = serde_json::to_string_pretty(&envelope).expect("an envelope serializes");
    text.push('\n');
    for path in [
        kept_in_store(store, subject),
        kept_in_project(state_dir, name),
    ] {
        crate::images::store::write_atomically(&path, text.as_bytes())?;
    }
    Ok(envelope)
}

/// The envelope kept for the image `name`, if any (not checked here).
pub fn kept(state_dir: &Path, name: &str) -> Result<Option<Envelope>> {
    let path = kept_in_project(state_dir, name);
    match fs_err::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Parse {
                path: path.clone(),
                location: None,
                key: None,
                message: format!("not a DSSE envelope: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The Statement an envelope carries, unverified (to tell whether it is the one to keep).
pub fn payload(envelope: &Envelope) -> Option<Value> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&envelope.payload)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}
