//! The engine's build cache that hallmark's engine builds leave on the builder.
//!
//! The classic builder commits an image for every instruction of a Dockerfile. These step
//! images are its cache, and hallmark leaves them when it removes a build's raw image, because
//! the next build of a changed spec reuses the steps before the change (the hours of compiling
//! vLLM). But each forced or changed build adds a chain of its own, as big as what it built (a
//! forced rebuild of the 23.8 GB vLLM image leaves 23.8 GB), and nothing removed the old ones:
//! a dozen forced builds of a 2 GiB test image filled a 64 GB disk. So every engine build notes
//! the step images it stands on, in the project's folder of the layer store, and `prune`
//! removes the steps of every noted build that is not the latest build of a current image.
//! What a current image's build made or reused stays, as the cache of the next build.
//!
//! Removing is careful: only under prune's exclusive lock on the store, which every build holds
//! shared (no hallmark build can be standing on a step at that moment), one image at a time,
//! never a tagged one, never with its parents (`noprune`); the engine refuses to remove an
//! image another image stands on or a container uses, and it stays, noted, for the next prune.

use crate::engine::Engine;
use crate::images::store::LayerStore;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The folder of the project's notes in the layer store (`projects/<key>/build-cache`).
const KIND: &str = "build-cache";

/// One engine build's step images.
#[derive(Serialize, Deserialize)]
struct Noted {
    /// The builder's address, as configured: only its own steps are removed from a builder.
    builder: String,
    image: String,
    /// The image the build made, once it is finished; current while the builder's tag names
    /// it.
    made: Option<String>,
    /// When the build was noted (milliseconds since the epoch): of two builds that made the
    /// same current image (a forced rebuild is reproducible), the later one's steps stay.
    at: u128,
    /// The step images, newest first, with the size of the layer each added.
    steps: Vec<Step>,
}

#[derive(Serialize, Deserialize)]
struct Step {
    id: String,
    size: u64,
}

/// What `prune` removed from the builder.
#[derive(Debug, Default, PartialEq)]
pub struct Removed {
    pub images: usize,
    /// The sizes of the layers the removed steps added.
    pub bytes: u64,
    /// Steps of superseded builds the engine kept (another image stands on them, a container
    /// uses them, or a tag names them).
    pub kept: usize,
}

fn file_name(raw: &str) -> String {
    format!("{}.json", raw.trim_start_matches("sha256:"))
}

/// Notes the step images of the engine's build `raw`, those above its `parent` (best effort:
/// a build that could not be noted leaves its cache to `docker image prune`).
pub async fn note(
    engine: &Engine,
    store: &LayerStore,
    image: &str,
    raw: &str,
    parent: Option<&str>,
) {
    let Ok(Some(history)) = engine.history(raw).await else {
        return;
    };
    let steps = history
        .into_iter()
        .take_while(|step| Some(step.id.as_str()) != parent)
        // `<missing>`: a layer the engine holds without an image of its own (a loaded one's).
        .filter(|step| step.id.starts_with("sha256:"))
        .map(|step| Step {
            id: step.id,
            size: u64::try_from(step.size).unwrap_or(0),
        })
        .collect();
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let noted = Noted {
        builder: engine.address().to_string(),
        image: image.to_string(),
        made: None,
        at,
        steps,
    };
    write(store, raw, &noted);
}

/// Notes that the engine's build `raw` made the image `made`; nothing when `raw` was not
/// noted (an assembled image has no engine build).
pub fn finished(store: &LayerStore, raw: &str, made: &str) {
    let name = file_name(raw);
    let noted = store
        .project_records(KIND)
        .into_iter()
        .find(|(path, _)| path.file_name().is_some_and(|n| *n == *name))
        .and_then(|(_, bytes)| serde_json::from_slice::<Noted>(&bytes).ok());
    if let Some(mut noted) = noted {
        noted.made = Some(made.to_string());
        write(store, raw, &noted);
    }
}

/// The noted builds that are superseded (all but the latest build of each image that is
/// `current`), and the steps that stay whatever: those the latest builds stand on.
fn superseded<'a>(builds: &[&'a Noted], current: &HashSet<&str>) -> (Vec<usize>, HashSet<&'a str>) {
    let mut latest: HashMap<&str, usize> = HashMap::new();
    for (i, build) in builds.iter().enumerate() {
        if !build.made.as_deref().is_some_and(|id| current.contains(id)) {
            continue;
        }
        let later = latest
            .get(build.image.as_str())
            .is_none_or(|&j| builds[j].at < build.at);
        if later {
            latest.insert(&build.image, i);
        }
    }
    let keep = latest
        .values()
        .flat_map(|&i| builds[i].steps.iter().map(|step| step.id.as_str()))
        .collect();
    let superseded = (0..builds.len())
        .filter(|i| !latest.values().any(|j| j == i))
        .collect();
    (superseded, keep)
}

fn write(store: &LayerStore, raw: &str, noted: &Noted) {
    let text = serde_json::to_vec_pretty(noted).expect("serializes");
    store.write_project_record(KIND, &file_name(raw), &text);
}

/// Removes from `engine` the step images of this project's builds on it that did not make
/// one of the `current` images (the builder's ids of the project's images now), or were
/// followed by a later build of the same image. The store must be held for prune.
pub async fn prune(engine: &Engine, store: &LayerStore, current: &[String]) -> Removed {
    let builder = engine.address().to_string();
    let noted: Vec<_> = store
        .project_records(KIND)
        .into_iter()
        .filter_map(|(path, bytes)| Some((path, serde_json::from_slice::<Noted>(&bytes).ok()?)))
        .filter(|(_, noted)| noted.builder == builder)
        .collect();
    let current: HashSet<&str> = current.iter().map(String::as_str).collect();
    let builds: Vec<&Noted> = noted.iter().map(|(_, build)| build).collect();
    let (superseded, keep) = superseded(&builds, &current);
    let mut removed = Removed::default();
    for i in superseded {
        let (path, build) = &noted[i];
        let mut all_gone = true;
        // Newest first: a step's parent can go only once the step has.
        for step in build.steps.iter().filter(|s| !keep.contains(s.id.as_str())) {
            match engine.inspect(&step.id).await {
                Ok(None) => continue,
                Ok(Some(image)) if image.repo_tags.is_empty() => {
                    engine.remove_untagged(&step.id).await;
                }
                _ => {}
            }
            if matches!(engine.inspect(&step.id).await, Ok(None)) {
                removed.images += 1;
                removed.bytes += step.size;
            } else {
                removed.kept += 1;
                all_gone = false;
            }
        }
        if all_gone {
            let _ = fs_err::remove_file(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(image: &str, made: Option<&str>, at: u128, steps: &[&str]) -> Noted {
        Noted {
            builder: "unix:///run/docker.sock".into(),
            image: image.into(),
            made: made.map(str::to_string),
            at,
            steps: steps
                .iter()
                .map(|id| Step {
                    id: id.to_string(),
                    size: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn only_the_latest_build_of_a_current_image_keeps_its_steps() {
        let builds = [
            // A forced rebuild made the same image again: the earlier build is superseded.
            build("vllm", Some("sha256:v"), 1, &["s3", "s2", "s1"]),
            build("vllm", Some("sha256:v"), 2, &["t3", "t2", "s1"]),
            // An image no spec names any more, and a build that never finished.
            build("gone", Some("sha256:g"), 3, &["g1"]),
            build("vllm", None, 4, &["u1"]),
            // Another image, current, sharing a step with the superseded build.
            build("wheel", Some("sha256:w"), 0, &["s2", "w1"]),
        ];
        let refs: Vec<&Noted> = builds.iter().collect();
        let current = HashSet::from(["sha256:v", "sha256:w"]);
        let (superseded, keep) = superseded(&refs, &current);
        assert_eq!(superseded, [0, 2, 3]);
        let mut keep: Vec<&str> = keep.into_iter().collect();
        keep.sort();
        assert_eq!(keep, ["s1", "s2", "t2", "t3", "w1"]);
    }
}
