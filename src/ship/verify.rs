//! What a node holds, compared with what the plan expects, judged by the image's identity
//! (`images::identity`: the checksum label and the content fingerprint).

use crate::engine::ImageView;
use crate::error::Result;
use crate::images::identity::{fingerprint, inspect_whole, label};
use crate::oci::Reference;
use serde::Serialize;

pub mod provenance;
pub mod rows;
pub mod trusted;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Holding {
    /// The tag names an image with the expected checksum and fingerprint.
    Current,
    /// The tag names an image built from other inputs.
    Stale,
    /// The label matches but the content does not: made elsewhere under the label, or built
    /// again from the same inputs into other bytes (a build that is not reproducible).
    Mismatch,
    /// The label matches, but the content cannot be checked: the builder, whose image is the
    /// reference, does not hold it (any more). `status` says so rather than `current`.
    Unverified,
    /// `verify --provenance`: the node holds the image, but no provenance of it verifies (none
    /// kept, signed by a key hallmark.toml does not trust, or for another image). `detail`
    /// says why.
    Unsigned,
    Missing,
    /// The engine holds the name but not the image's content (a manifest whose layers or
    /// config it lacks): it cannot be saved or pushed. `distribute` completes it.
    Incomplete,
    Unreachable,
    /// The image's spec cannot be planned (it does not load, its pins are not locked, or it
    /// stands on such a spec): what it should be is not known. `detail` says why.
    Unplanned,
    /// SIGINT or SIGTERM arrived before the node answered: what it holds is not known.
    Interrupted,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeHolding {
    pub node: String,
    pub state: Holding,
    pub checksum: Option<String>,
    pub fingerprint: Option<String>,
    pub detail: Option<String>,
    /// The engine's id for the image it holds under the reference, where it was seen
    /// (`distribute` notes it for the next thin archive without asking again).
    #[serde(skip)]
    pub image_id: Option<String>,
}

/// What `engine` holds under the wanted reference, against the expected checksum and content.
pub async fn holding(
    engine: &impl ImageView,
    label_key: &str,
    wanted: &Wanted,
) -> Result<NodeHolding> {
    let holding = holding_of(engine, label_key, wanted, false).await?;
    as_run(engine, wanted, holding).await
}

/// `holding`, unless a client's `run` of the reference runs another image there (Podman: a
/// `localhost/` name, or another local name ending so, before the full name): then the node
/// does not hold what its users run, `mismatch`, saying which image they get.
async fn as_run(
    engine: &impl ImageView,
    wanted: &Wanted,
    mut holding: NodeHolding,
) -> Result<NodeHolding> {
    if holding.state != Holding::Current {
        return Ok(holding);
    }
    let reference = wanted.reference.as_str();
    let run = engine.run_as_typed(reference).await?;
    let held = holding.image_id.as_deref().unwrap_or_default();
    let hex = |id: &str| id.trim_start_matches("sha256:").to_string();
    let runs = match &run {
        None => return Ok(holding),
        Some(run) if hex(run.id().unwrap_or_default()) == hex(held) => return Ok(holding),
        Some(run) => run,
    };
    let id = hex(runs.id().unwrap_or_default());
    holding.state = Holding::Mismatch;
    holding.detail = Some(format!(
        "`run {reference}` here runs image {} ({}), not the one hallmark shipped as {}: the engine resolves the short name to another name first; `hallmark distribute` names the shipped image so",
        &id[..12.min(id.len())],
        match runs.repo_tags.is_empty() {
            true => "untagged".to_string(),
            false => runs.repo_tags.join(", "),
        },
        Reference::parse(reference).map_or_else(|_| reference.to_string(), |r| r.qualified()),
    ));
    Ok(holding)
}

/// [`holding`], told whether the engine's image list names the reference already.
async fn holding_of(
    engine: &impl ImageView,
    label_key: &str,
    wanted: &Wanted,
    listed: bool,
) -> Result<NodeHolding> {
    let (reference, checksum) = (wanted.reference.as_str(), wanted.checksum.as_str());
    let image = inspect_whole(engine, reference, listed).await?;
    // A store whose inspect leaves fields of the runtime config out (Podman's) is judged by
    // the image's id instead: there the id is the config digest, which covers the whole
    // config and the layers' diff ids, so it says no less than the fingerprint.
    let by_id = match engine.store().await {
        Ok(store) => !store.reports_whole_config(),
        Err(_) => false,
    };
    let (state, checksum_found, fingerprint_found) = match &image {
        None => (Holding::Missing, None, None),
        Some((_, false)) => (Holding::Incomplete, None, None),
        Some((image, true)) => {
            let found = label(image, label_key).map(str::to_string);
            let print = fingerprint(image);
            let same_content = match by_id {
                true => image.id().is_some_and(|id| wanted.holds_id(id)),
                false => print == wanted.fingerprint,
            };
            let state = match (found.as_deref() == Some(checksum), same_content) {
                (true, true) => Holding::Current,
                (true, false) => Holding::Mismatch,
                (false, _) => Holding::Stale,
            };
            (state, found, Some(print))
        }
    };
    tracing::debug!(node = engine.node(), reference, state = ?state, by_id, "judged");
    let detail = match state {
        Holding::Incomplete => Some(format!(
            "the engine holds {reference} without its content (it cannot be saved or pushed); `hallmark distribute` completes it"
        )),
        Holding::Mismatch => Some(format!(
            "{reference} carries this checksum but not the builder's content: made elsewhere under the label, or built again from the same inputs into other bytes (a build that is not reproducible, such as a `build --force` of steps that read the clock or /dev/urandom); `hallmark distribute` replaces it"
        )),
        _ => None,
    };
    Ok(NodeHolding {
        node: engine.node().to_string(),
        state,
        checksum: checksum_found,
        fingerprint: fingerprint_found,
        detail,
        image_id: image.and_then(|(image, _)| image.id().map(str::to_string)),
    })
}

/// One image a node should hold: its reference, checksum and the builder's fingerprint.
pub struct Wanted {
    pub reference: String,
    pub checksum: String,
    pub fingerprint: String,
    /// The ids an engine gives the builder's image ([`known_ids`]): a node that lists the tag
    /// under one of them holds that very content (ids are content addresses), no inspect asked.
    pub ids: Vec<String>,
}

impl Wanted {
    /// Whether `id` is one of the ids engines give the builder's image (an id without its
    /// `sha256:`, as Podman writes some, counts).
    pub fn holds_id(&self, id: &str) -> bool {
        let hex = |id: &str| id.trim_start_matches("sha256:").to_string();
        self.ids.iter().any(|known| hex(known) == hex(id))
    }
}

/// How many images of one engine are inspected at once.
const INSPECTS_AT_ONCE: usize = 8;

/// What `engine` holds of each of `wanted`, in order, from one listing of the engine's
/// images under those names: a tag naming an image with another checksum is `stale`, one naming an id of
/// `wanted.ids` with the checksum `current`, a tag a classic store does not list `missing`,
/// each without a request of its own. Only the others are inspected, several at a time: a
/// containerd store may hold a tag it does not list (Docker 26, an incomplete image), and an
/// image under another id is judged by its content.
pub async fn holdings(
    engine: &impl ImageView,
    label_key: &str,
    wanted: &[Wanted],
) -> Vec<Result<NodeHolding>> {
    use futures_util::StreamExt as _;
    let references: Vec<&str> = wanted.iter().map(|w| w.reference.as_str()).collect();
    let listing = engine.listed_images_named(&references);
    let (listed, store) = futures_util::future::join(listing, engine.store()).await;
    // If the engine cannot say which store it has, every unlisted tag is asked.
    let lists_all = store.is_ok_and(|store| store.lists_every_tag());
    let listed = match listed {
        Ok(listed) => listed,
        Err(e) => {
            // The engine's own error says which node already; its words, not its name twice.
            let message = match e {
                crate::error::Error::Engine { message, .. } => message,
                other => other.to_string(),
            };
            return wanted
                .iter()
                .map(|_| Err(engine.error(message.clone())))
                .collect();
        }
    };
    let by_tag = by_familiar_tag(&listed);
    futures_util::stream::iter(wanted.iter().map(|want| {
        let seen = by_tag.get(familiar(&want.reference).as_str()).copied();
        async move {
            // Another checksum under the tag is stale whatever else is true. An image listed
            // with no checksum at all is inspected: it may be a containerd store's stub,
            // whose config (and so its labels) the engine lacks.
            if let Some(seen) = seen
                && let Some(found) = seen.labels.get(label_key)
                && *found != want.checksum
            {
                return Ok(NodeHolding {
                    node: engine.node().to_string(),
                    state: Holding::Stale,
                    checksum: Some(found.clone()),
                    fingerprint: None,
                    detail: None,
                    image_id: Some(seen.id.clone()),
                });
            }
            let held = |state, fingerprint: Option<&str>| NodeHolding {
                node: engine.node().to_string(),
                state,
                checksum: fingerprint.map(|_| want.checksum.clone()),
                fingerprint: fingerprint.map(str::to_string),
                detail: None,
                image_id: seen.map(|seen| seen.id.clone()),
            };
            match seen {
                None if lists_all => return Ok(held(Holding::Missing, None)),
                Some(seen)
                    if seen.labels.get(label_key) == Some(&want.checksum)
                        && !want.fingerprint.is_empty()
                        && want.holds_id(&seen.id) =>
                {
                    return as_run(
                        engine,
                        want,
                        held(Holding::Current, Some(&want.fingerprint)),
                    )
                    .await;
                }
                _ => {}
            }
            let holding = holding_of(engine, label_key, want, seen.is_some()).await?;
            as_run(engine, want, holding).await
        }
    }))
    .buffered(INSPECTS_AT_ONCE)
    .collect()
    .await
}

/// The listed images by each of their tags, spelt [`familiar`]ly.
pub fn by_familiar_tag(
    listed: &[crate::engine::ImageListed],
) -> std::collections::HashMap<String, &crate::engine::ImageListed> {
    let mut by_tag = std::collections::HashMap::new();
    for image in listed {
        for tag in &image.repo_tags {
            by_tag.insert(familiar(tag), image);
        }
    }
    by_tag
}

/// `hello:latest` for `docker.io/library/hello:latest` (the containerd store's spelling).
/// A name that is not a reference (`<none>:<none>`) is compared as it is.
pub fn familiar(reference: &str) -> String {
    Reference::parse(reference).map_or_else(|_| reference.to_string(), |r| r.familiar())
}

/// The decisions on what a node holds, on an engine in memory: no dockerd, milliseconds.
/// The same states on real engines of every kind: tests/it (ship, podman, engine).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ImageStore;
    use crate::engine::view::fake::FakeEngine;
    use serde_json::json;
    use std::sync::atomic::Ordering;

    const LABEL: &str = "hallmark.checksum";

    /// An inspect answer: `id`, the checksum label, one layer, and `extra` config fields.
    fn image(id: &str, checksum: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut config = json!({"Labels": {LABEL: checksum}, "Cmd": ["sh"]});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({
            "Id": id,
            "Config": config,
            "RootFS": {"Layers": ["sha256:aaaa"]},
            "Os": "linux",
            "Architecture": "amd64",
        })
    }

    fn with_id(image: &serde_json::Value, id: &str) -> serde_json::Value {
        let mut image = image.clone();
        image["Id"] = json!(id);
        image
    }

    /// What the builder holds: the wanted image as `builder` answers it.
    fn wanted(reference: &str, builder: &serde_json::Value, ids: &[&str]) -> Wanted {
        let answer: crate::engine::ImageAnswer = serde_json::from_value(builder.clone()).unwrap();
        Wanted {
            reference: reference.into(),
            checksum: label(&answer, LABEL).unwrap().into(),
            fingerprint: fingerprint(&answer),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn states(engine: &FakeEngine, wanted: &[Wanted]) -> Vec<Holding> {
        let run = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        run.block_on(holdings(engine, LABEL, wanted))
            .into_iter()
            .map(|held| held.unwrap().state)
            .collect()
    }

    #[test]
    fn a_classic_node_is_judged_from_one_listing_without_an_inspect() {
        let built = image("sha256:1111", "c1", json!({}));
        let node = FakeEngine::new(ImageStore::Classic)
            .holding("hello:latest", built.clone(), true)
            .holding("old:latest", image("sha256:2222", "c0", json!({})), true);
        let wanted = [
            wanted("hello:latest", &built, &["sha256:1111"]),
            wanted(
                "old:latest",
                &image("sha256:3333", "c3", json!({})),
                &["sha256:3333"],
            ),
            wanted("gone:latest", &built, &["sha256:1111"]),
        ];
        assert_eq!(
            states(&node, &wanted),
            [Holding::Current, Holding::Stale, Holding::Missing]
        );
        assert_eq!(node.inspects.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_same_label_on_other_content_is_a_mismatch_and_an_unlisted_stub_incomplete() {
        let built = image("sha256:1111", "c1", json!({}));
        // The label copied onto another image (a HEALTHCHECK added on the node).
        let forged = image(
            "sha256:9999",
            "c1",
            json!({"Healthcheck": {"Test": ["CMD", "false"]}}),
        );
        let stub = json!({"Id": "sha256:1111", "Config": {}});
        let node = FakeEngine::new(ImageStore::Containerd)
            .holding("forged:latest", forged, true)
            .holding("stub:latest", stub, false)
            .holding("unlisted:latest", built.clone(), false);
        let wanted = [
            wanted("forged:latest", &built, &["sha256:1111"]),
            wanted("stub:latest", &built, &["sha256:1111"]),
            wanted("unlisted:latest", &built, &["sha256:1111"]),
        ];
        // A containerd store may hold a tag it does not list (Docker 26): inspected, and an
        // image it lists under no name it was asked for is not whole.
        assert_eq!(
            states(&node, &wanted),
            [Holding::Mismatch, Holding::Incomplete, Holding::Incomplete]
        );
        assert_eq!(node.inspects.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_podman_node_is_judged_by_id_where_its_inspect_leaves_config_out() {
        // The builder's image has a HEALTHCHECK; Podman reports none, under the same id.
        let built = image(
            "sha256:1111",
            "c1",
            json!({"Healthcheck": {"Test": ["CMD", "true"]}}),
        );
        let on_podman = image("1111", "c1", json!({}));
        let other = image("sha256:8888", "c1", json!({}));
        let node = FakeEngine::new(ImageStore::Podman)
            .holding("same:latest", on_podman.clone(), true)
            .holding("other:latest", other, true);
        let wanted = [
            wanted("same:latest", &built, &["sha256:1111"]),
            wanted("other:latest", &built, &["sha256:1111"]),
        ];
        assert_eq!(
            states(&node, &wanted),
            [Holding::Current, Holding::Mismatch]
        );
        // A Docker store reports the whole config: judged by content, whatever the id.
        let docker = FakeEngine::new(ImageStore::Containerd).holding(
            "same:latest",
            image("sha256:7777", "c1", json!({})),
            true,
        );
        assert_eq!(states(&docker, &wanted[..1]), [Holding::Mismatch]);
        let docker = FakeEngine::new(ImageStore::Containerd).holding(
            "same:latest",
            with_id(&built, "sha256:7777"),
            true,
        );
        assert_eq!(states(&docker, &wanted[..1]), [Holding::Current]);
    }
}
