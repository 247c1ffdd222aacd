//! The nodes one distribute ships to, connected and grouped by transport: the stream's nodes
//! get all the images in one archive each, the registry's image by image; the unreachable
//! ones get a failed outcome for every image. Before and after, what the tags named, so that
//! what this distribute superseded is removed.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::images::store::LayerStore;
use crate::inputs::config::{Config, NodeConfig, Transport};
use crate::output::Output;
use crate::ship::choose;
use crate::ship::registry;
use crate::ship::superseded;
use crate::ship::{self, NodeOutcome, ShipSettings, Shipped};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

fn say_removed(output: &Output, node: &str, removed: usize) {
    if removed > 0 {
        output.note(format!(
            "{node}: removed {removed} image{} the tags named before (superseded, untagged)",
            if removed == 1 { "" } else { "s" }
        ));
    }
}

/// The selected nodes, connected and grouped by transport; each image goes to both groups.
pub struct Targets<'a> {
    nodes: &'a [NodeConfig],
    by_stream: Vec<Engine>,
    by_registry: Vec<Engine>,
    /// `transport = "auto"` nodes, until [`Targets::choose`] puts each with one of the two.
    by_auto: Vec<Engine>,
    /// Nodes that could not be reached, with why: a failed outcome for every image.
    unreachable: Vec<(String, String)>,
    /// The registry hallmark starts, held from `auto`'s choice to the end of the distribute.
    _reserved: Option<registry::Reserved>,
}

impl<'a> Targets<'a> {
    /// `nodes` as `connected` answered them (in order), grouped by the transport `config`
    /// gives each.
    pub fn group(
        config: &Config,
        nodes: &'a [NodeConfig],
        connected: Vec<Result<Engine>>,
    ) -> Targets<'a> {
        let mut targets = Targets {
            nodes,
            by_stream: Vec::new(),
            by_registry: Vec::new(),
            by_auto: Vec::new(),
            unreachable: Vec::new(),
            _reserved: None,
        };
        for (node, engine) in nodes.iter().zip(connected) {
            match engine {
                Err(e) => targets
                    .unreachable
                    .push((node.name.to_string(), e.to_string())),
                Ok(engine) => match config.transport_of(node) {
                    Transport::Registry => targets.by_registry.push(engine),
                    Transport::Stream => targets.by_stream.push(engine),
                    Transport::Auto => targets.by_auto.push(engine),
                },
            }
        }
        targets
    }

    /// Puts each `transport = "auto"` node with the stream's or the registry's, by what it
    /// lacks of `shipments` ([`choose::choose`], all nodes asked at once); `-v` says which
    /// and why. The table says it too: `pulled` came through the registry. A node that did
    /// not answer fails alone, with why.
    pub async fn choose(
        &mut self,
        config: &Config,
        store: &LayerStore,
        cache: &Path,
        shipments: &[ship::Shipment],
        output: &Output,
    ) {
        let auto = std::mem::take(&mut self.by_auto);
        let choices = futures_util::future::join_all(
            (auto.iter())
                .map(|node| choose::choose(node, &config.registry, store, cache, shipments)),
        )
        .await;
        // The registry hallmark starts, held for this distribute if a node takes it: while
        // another hallmark holds it, those nodes take the stream.
        let pulls =
            |c: &Result<choose::Choice>| matches!(c, Ok(c) if c.transport == Transport::Registry);
        if config.registry.address.is_none() && choices.iter().any(pulls) {
            self._reserved = registry::reserve(cache).ok().flatten();
        }
        let held = self._reserved.is_some() || config.registry.address.is_some();
        for (node, choice) in auto.into_iter().zip(choices) {
            let mut choice = match choice {
                Ok(choice) => choice,
                Err(e) => {
                    let why = format!("{e} (asked what it holds, to choose its transport)");
                    self.unreachable.push((node.node.clone(), why));
                    continue;
                }
            };
            if choice.transport == Transport::Registry && !held {
                choice = choose::Choice {
                    transport: Transport::Stream,
                    why: "another hallmark holds the registry hallmark starts (its lock)".into(),
                };
            }
            if output.verbose {
                output.note(format!(
                    "{}: transport auto: {} ({})",
                    node.node,
                    choice.transport.name(),
                    choice.why
                ));
            }
            // Every transport named (no wildcard): a new one fails to compile here until it
            // is handled. `choose` resolves `auto` to one of the other two; one left
            // unresolved goes by the stream, the transport that needs nothing but the node.
            match choice.transport {
                Transport::Registry => self.by_registry.push(node),
                Transport::Stream | Transport::Auto => self.by_stream.push(node),
            }
        }
    }

    /// Every reachable node's images under `references`, noted until
    /// [`Targets::remove_superseded`] ([`superseded::named_ids`]).
    pub async fn named_ids(
        &self,
        state_dir: &Path,
        references: &[&str],
        shipping: &std::collections::HashSet<String>,
    ) -> Vec<(HashMap<String, String>, usize)> {
        let engines: Vec<&Engine> = self.by_stream.iter().chain(&self.by_registry).collect();
        superseded::named_ids(state_dir, &engines, references, shipping).await
    }

    /// Removes what this distribute superseded ([`superseded::remove`]) and says so, one
    /// line a node.
    pub async fn remove_superseded(
        &self,
        state_dir: &Path,
        output: &Output,
        references: &[&str],
        before: Vec<(HashMap<String, String>, usize)>,
        outcomes: &[Vec<NodeOutcome>],
    ) {
        let engines: Vec<&Engine> = self.by_stream.iter().chain(&self.by_registry).collect();
        let removed = superseded::remove(state_dir, &engines, references, before, outcomes).await;
        for (node, removed) in removed {
            say_removed(output, &node, removed);
        }
    }

    /// Ships `shipments` to every node: per image, the outcomes in the cluster file's order.
    /// The stream nodes get all the images in one archive each (one image: the export goes
    /// straight into the first node that needs all of it); the registry's, image by image.
    pub async fn ship(
        &self,
        config: &Config,
        builder: &Engine,
        store: &Arc<LayerStore>,
        shipments: &[ship::Shipment],
        ship_settings: &ShipSettings<'_>,
    ) -> Result<Vec<Vec<NodeOutcome>>> {
        // A failure of the whole transfer (the builder's export stalled) is every stream
        // node's row, so the table and the JSON still print (they printed nothing).
        let failed_all = |nodes: &[Engine], error: &Error| -> Vec<NodeOutcome> {
            (nodes.iter())
                .map(|node| NodeOutcome::failed(&node.node, error.to_string()))
                .collect()
        };
        let mut outcomes: Vec<Vec<NodeOutcome>> = match (&self.by_stream[..], shipments) {
            ([], _) => shipments.iter().map(|_| Vec::new()).collect(),
            (nodes, [one]) => vec![
                ship::distribute(builder, nodes, store, one, ship_settings)
                    .await
                    .unwrap_or_else(|e| failed_all(nodes, &e)),
            ],
            (nodes, _) => {
                ship::batch::distribute_many(builder, nodes, store, shipments, ship_settings)
                    .await
                    .unwrap_or_else(|e| shipments.iter().map(|_| failed_all(nodes, &e)).collect())
            }
        };
        for (shipment, outcomes) in shipments.iter().zip(&mut outcomes) {
            if !self.by_registry.is_empty() {
                outcomes.extend(
                    registry::distribute(
                        builder,
                        &self.by_registry,
                        &config.registry,
                        ship_settings.cache,
                        store,
                        shipment,
                        ship_settings,
                    )
                    .await,
                );
            }
            for (node, error) in &self.unreachable {
                outcomes.push(NodeOutcome::failed(node, error.clone()));
            }
            outcomes.sort_by_key(|o| self.nodes.iter().position(|n| n.name.as_str() == o.node));
        }
        Ok(outcomes)
    }
}

/// The shipments found, and for each image its reference or why it cannot be shipped.
pub fn split_found(
    found: Vec<Result<ship::Shipment>>,
) -> (
    Vec<ship::Shipment>,
    Vec<std::result::Result<String, crate::error::Error>>,
) {
    let mut shipments = Vec::new();
    let found = found
        .into_iter()
        .map(|found| {
            let shipment = found?;
            let reference = shipment.reference.clone();
            shipments.push(shipment);
            Ok(reference)
        })
        .collect();
    (shipments, found)
}

/// One row per image: the outcomes of those shipped, in order; a failure on every node for
/// one that could not be, with why.
pub fn shipped_rows(
    names: &[crate::inputs::values::Name],
    found: Vec<std::result::Result<String, crate::error::Error>>,
    outcomes: Vec<Vec<NodeOutcome>>,
    nodes: &[NodeConfig],
    reference: &dyn Fn(&crate::inputs::values::Name) -> String,
) -> Vec<Shipped> {
    let mut outcomes = outcomes.into_iter();
    let rows = names.iter().zip(found).map(|(name, found)| match found {
        Ok(reference) => Shipped {
            image: name.to_string(),
            nodes: outcomes.next().expect("an outcome per image shipped"),
            reference,
        },
        Err(error) => Shipped {
            image: name.to_string(),
            nodes: (nodes.iter())
                .map(|node| NodeOutcome::failed(node.name.as_str(), error.to_string()))
                .collect(),
            reference: reference(name),
        },
    });
    rows.collect()
}
