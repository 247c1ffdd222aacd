//! `hallmark lock`: turns every moving reference of a spec into a pin. Existing pins that
//! still match the spec are kept unless `--update`; nothing else changes in the file.

use crate::error::{Error, Result};
use crate::fetch;
use crate::pins::{self, BasePin, Pins, SourcePin, WheelPin, wheel_stem};
use crate::project::Project;
use crate::spec::Parent;
use crate::values::{Name, Sha256Hex};

/// What resolved an external base: the engine, or a digest already written in pins/.
pub trait BaseResolver {
    /// `Ok(None)` when no engine is reachable or it does not hold the image.
    fn resolve(&self, reference: &str) -> Result<Option<BasePin>>;
}

/// One line of what `lock` did, for the operator.
pub struct LockReport {
    pub image: Name,
    pub changes: Vec<String>,
}

pub fn lock(
    project: &Project,
    image: &Name,
    update: bool,
    bases: &dyn BaseResolver,
    cache: &std::path::Path,
) -> Result<LockReport> {
    let loaded = project.load_spec(image)?;
    let old = pins::read(&project.root, image)?;
    let mut new = Pins::default();
    let mut changes = Vec::new();

    if let Parent::External(reference) = loaded.spec.parent() {
        let current = old.base.as_ref().filter(|b| b.reference == reference);
        new.base = Some(match (current, update) {
            (Some(base), false) => {
                changes.push(format!("base {reference}: kept the digest written in pins/ ({}); `--update` asks the engine", base.digest));
                base.clone()
            }
            _ => match (bases.resolve(reference)?, current) {
                (Some(base), _) => {
                    changes.push(format!("base {reference} -> {}", base.digest));
                    base
                }
                (None, Some(hand)) => {
                    changes.push(format!("base {reference}: no engine holds it; kept the digest written in pins/ ({})", hand.digest));
                    hand.clone()
                }
                (None, None) => {
                    return Err(Error::Pin {
                        image: image.to_string(),
                        path: pins::path_for(&project.root, image),
                        what: format!(
                            "cannot pin the base `{reference}`: no reachable engine holds it; load it on the builder, or write `[base]` with `ref` and `digest` in this file by hand"
                        ),
                    });
                }
            },
        });
    }

    for source in &loaded.spec.sources {
        let name = source.name.get_ref();
        let kept = old
            .sources
            .iter()
            .find(|p| &p.name == name && p.git == source.git && p.rev == source.rev)
            .filter(|_| !update);
        let pin = match kept {
            Some(pin) => pin.clone(),
            None => {
                let commit = fetch::resolve_rev(&source.git, &source.rev)?;
                changes.push(format!("source {name}: {} -> {commit}", source.rev));
                SourcePin {
                    name: name.clone(),
                    git: source.git.clone(),
                    rev: source.rev.clone(),
                    commit,
                }
            }
        };
        new.sources.push(pin);
    }

    for wheel in &loaded.spec.wheels {
        let name = wheel.name.get_ref();
        let kept = old
            .wheels
            .iter()
            .find(|p| {
                wheel_stem(p.name.as_str()) == wheel_stem(name.as_str())
                    && p.version == wheel.version
            })
            .filter(|_| !update);
        let pin = match kept {
            Some(pin) => pin.clone(),
            None => {
                let path =
                    fetch::download_wheel(cache, image.as_str(), name.as_str(), &wheel.version)?;
                let sha = path
                    .parent()
                    .and_then(|d| d.file_name())
                    .expect("cache layout <sha>/<file>");
                let pin = WheelPin {
                    name: name.clone(),
                    version: wheel.version.clone(),
                    file: path
                        .file_name()
                        .expect("a file")
                        .to_string_lossy()
                        .into_owned(),
                    sha256: Sha256Hex::try_from(sha.to_string_lossy().into_owned())
                        .expect("cache dirs are sha256"),
                };
                changes.push(format!(
                    "wheel {name}=={}: {} sha256 {}",
                    wheel.version, pin.file, pin.sha256
                ));
                pin
            }
        };
        new.wheels.push(pin);
    }

    if new != old {
        pins::write(&project.root, image, &new)?;
    }
    Ok(LockReport {
        image: image.clone(),
        changes,
    })
}
