//! The images a distribute supersedes on the nodes: noted in the project's state when a
//! distribute begins, removed once a node verified what replaced them, so that an update
//! leaves no untagged image behind, even when an earlier run was stopped half way.

use crate::engine::Engine;
use crate::ship::outcome::{Action, NodeOutcome};
use crate::ship::verify;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// `<state>/superseded.json`: per node, the id each reference named there when a distribute
/// began, until it has removed those it superseded (best effort: a note that cannot be
/// written leaves an interrupted run's old image to `docker image prune`).
#[derive(Default, Serialize, serde::Deserialize)]
struct Superseded(BTreeMap<String, BTreeMap<String, String>>);

impl Superseded {
    const FILE: &str = "superseded.json";

    fn read(state_dir: &Path) -> Superseded {
        fs_err::read_to_string(state_dir.join(Superseded::FILE))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    fn write(&self, state_dir: &Path) {
        let path = state_dir.join(Superseded::FILE);
        if self.0.is_empty() {
            let _ = fs_err::remove_file(path);
            return;
        }
        let text = serde_json::to_string_pretty(self).expect("json");
        let _ = fs_err::create_dir_all(state_dir).and_then(|()| fs_err::write(path, text));
    }
}

/// Every reachable node's images under `references`: the id each reference names there
/// (one listing of those names per node), noted in the project's state until
/// [`remove`] is done with them. A distribute stopped between a
/// node's load and that removal left the old image behind, and a re-run, finding the node
/// current, never removed it (outside test): an id an earlier run noted whose tag has
/// moved since is removed here, first, unless this run ships it (`shipping`: the ids
/// engines give the images it ships).
pub async fn named_ids(
    state_dir: &Path,
    engines: &[&Engine],
    references: &[&str],
    shipping: &HashSet<String>,
) -> Vec<(HashMap<String, String>, usize)> {
    let mut journal = Superseded::read(state_dir);
    let named = engines.iter().map(|engine| {
        let earlier = journal.0.get(&engine.node).cloned().unwrap_or_default();
        async move {
            let mut names: Vec<&str> = references.to_vec();
            names.extend(earlier.keys().map(String::as_str));
            names.sort_unstable();
            names.dedup();
            // Unlisted: nothing is removed, and what was noted stays noted.
            let Ok(listed) = engine.listed_images_named(&names).await else {
                return (HashMap::new(), earlier, 0);
            };
            let now: HashMap<String, String> = verify::by_familiar_tag(&listed)
                .into_iter()
                .map(|(tag, image)| (tag, image.id.clone()))
                .collect();
            let mut removed = 0;
            for (reference, old) in &earlier {
                // An image this run ships (a rollback to it) is not removed to be sent again.
                let moved = now.get(reference) != Some(old) && !shipping.contains(old);
                if moved && engine.remove_untagged(old).await {
                    removed += 1;
                }
            }
            (now, BTreeMap::new(), removed)
        }
    });
    let answers = futures_util::future::join_all(named).await;
    let mut before = Vec::new();
    for (engine, (now, kept, removed)) in engines.iter().zip(answers) {
        let mut noted = kept;
        for reference in references {
            let familiar = verify::familiar(reference);
            if let Some(id) = now.get(&familiar) {
                noted.insert(familiar, id.clone());
            }
        }
        journal.0.insert(engine.node.to_string(), noted);
        before.push((now, removed));
    }
    journal.write(state_dir);
    before
}

/// Removes from each node the images `references` named there before this distribute
/// sent it another (an update leaves the old image behind untagged: eight updates of an
/// image left 912 MB of them beside 310 MB current on a node in an outside test, and on
/// the cluster each is the size of a model server's image). Only an image no tag names
/// now is removed (a load that gave the very image back keeps it); one a container uses
/// is refused by the engine and stays. Then this run's notes go ([`named_ids`]).
pub async fn remove(
    state_dir: &Path,
    engines: &[&Engine],
    references: &[&str],
    before: Vec<(HashMap<String, String>, usize)>,
    outcomes: &[Vec<NodeOutcome>],
) -> Vec<(String, usize)> {
    let mut journal = Superseded::read(state_dir);
    let mut said = Vec::new();
    // One line a node, with what the start removed (an earlier run's notes) counted in:
    // two lines of "removed 1 image" read as one said twice.
    for (engine, (before, removed_earlier)) in engines.iter().zip(before) {
        let mut removed = removed_earlier;
        for (reference, outcomes) in references.iter().zip(outcomes) {
            let sent = outcomes.iter().any(|o| {
                o.node == engine.node && o.verified() && !matches!(o.action, Action::Skipped)
            });
            let familiar = verify::familiar(reference);
            if let Some(noted) = journal.0.get_mut(engine.node.as_str()) {
                noted.remove(&familiar);
            }
            let Some(old) = before.get(&familiar).filter(|_| sent) else {
                continue;
            };
            if engine.remove_untagged(old).await {
                removed += 1;
            }
        }
        said.push((engine.node.to_string(), removed));
    }
    journal.0.retain(|_, noted| !noted.is_empty());
    journal.write(state_dir);
    said
}
