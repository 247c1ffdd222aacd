//! `transport = "auto"` (the default once hallmark.toml has a `[registry]` table): each such
//! node takes the registry for a first copy, where it lacks most of what this distribute
//! ships, and the stream for a thin update, where it lacks little.
//!
//! Why that way round, from `scripts/bench-first-copy` on the testbed (docs/benchmarks.md):
//! for a first copy the registry led in every run, because an engine that pulls unpacks
//! each layer as it arrives, where a load unpacks after the archive's last byte. For a
//! child with one new layer the two are about even since the registry is filled by hard
//! links (1.1 s and 1.4 s to 4 nodes at 4 GiB; 8-9 s for the registry when it was filled
//! through its upload API), and the stream keeps updates: a classic-store node downloads
//! from a registry again the layers it got by stream (docs/shipping.md, "The registry after
//! the stream"), which a thin archive never sends.
//!
//! A node that cannot pull from the registry takes the stream, whatever it lacks: a Podman
//! node (its pulls are refused, docs/shipping.md says why), a `tcp://` node when the registry
//! is the one hallmark starts on this machine's loopback, and every node when that registry
//! cannot be started here (no `docker-registry` on PATH); and every node while another
//! hallmark holds that registry (a distribute of its own, or `prune`'s garbage collection),
//! where the registry's way would fail (`Targets::choose` reserves it for the distribute).

use crate::engine::Engine;
use crate::error::Result;
use crate::images::store::LayerStore;
use crate::images::transfer;
use crate::inputs::config::{RegistryConfig, Transport};
use crate::ship::Shipment;
use std::path::Path;

/// The way one node takes, and why (said with `-v`).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub transport: Transport,
    pub why: String,
}

/// What a node lacks of the shipments, weighed by layer size where the layer store knows
/// the sizes (by layer count where it does not).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lacking {
    pub missing: u64,
    pub total: u64,
}

impl Lacking {
    /// A first copy: the node lacks more than half of what is shipped.
    pub fn is_first_copy(&self) -> bool {
        self.total > 0 && self.missing * 2 > self.total
    }

    fn percent(&self) -> u64 {
        (self.missing * 100).checked_div(self.total).unwrap_or(0)
    }
}

/// Why `node` cannot pull from the registry `config` describes, if it cannot.
pub fn cannot_pull(node: &Engine, config: &RegistryConfig) -> Option<String> {
    if let Some(podman) = node.version.podman() {
        return Some(format!(
            "{podman} does not pull from the registry transport"
        ));
    }
    if config.address.is_some() {
        return None;
    }
    if !matches!(
        node.address().kind(),
        crate::engine::Kind::Unix(_) | crate::engine::Kind::Ssh { .. }
    ) {
        return Some(
            "the registry hallmark starts is on this machine's loopback, which a tcp:// engine \
             does not reach ([registry] address names one it does)"
                .into(),
        );
    }
    if !super::registry::can_start() {
        return Some("no `docker-registry` on PATH to start a registry with".into());
    }
    None
}

/// What `node` lacks of `shipments`: from the first layer it does not hold on (the layers
/// a stream would send), weighed by the sizes the layer store has for each image. An
/// engine that does not answer is an error: that node fails alone, at once, rather than
/// being asked again by the transport the guess chose.
pub async fn lacking(
    node: &Engine,
    store: &LayerStore,
    cache: &Path,
    shipments: &[Shipment],
) -> Result<Lacking> {
    let mut lacking = Lacking {
        missing: 0,
        total: 0,
    };
    for shipment in shipments {
        let chains = transfer::chain_ids(&shipment.diff_ids);
        let held = transfer::held_prefix(node, cache, &chains, &shipment.related).await?;
        let sizes: Vec<u64> = match store.record(&shipment.image_id) {
            Some(image) if image.layers.len() == shipment.diff_ids.len() => {
                image.layers.iter().map(|l| l.blob.size.max(1)).collect()
            }
            _ => vec![1; shipment.diff_ids.len()],
        };
        lacking.total += sizes.iter().sum::<u64>();
        lacking.missing += sizes.iter().skip(held).sum::<u64>();
    }
    Ok(lacking)
}

/// The way `node` takes: the registry for a first copy where it can pull, else the stream;
/// an error if it did not say what it holds (its questions have the engines' answer
/// deadline, so a frozen node delays the others' start by that much at most).
pub async fn choose(
    node: &Engine,
    config: &RegistryConfig,
    store: &LayerStore,
    cache: &Path,
    shipments: &[Shipment],
) -> Result<Choice> {
    if let Some(why) = cannot_pull(node, config) {
        return Ok(Choice {
            transport: Transport::Stream,
            why,
        });
    }
    let lacking = lacking(node, store, cache, shipments).await?;
    if lacking.total == 0 {
        return Ok(Choice {
            transport: Transport::Stream,
            why: "nothing to ship".into(),
        });
    }
    let percent = lacking.percent();
    Ok(if lacking.is_first_copy() {
        Choice {
            transport: Transport::Registry,
            why: format!("a first copy: it lacks {percent}% of what is shipped"),
        }
    } else {
        Choice {
            transport: Transport::Stream,
            why: format!("an update: it lacks {percent}% of what is shipped"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_copy_is_more_than_half_missing() {
        let of = |missing, total| Lacking { missing, total }.is_first_copy();
        assert!(of(10, 10));
        assert!(of(6, 10));
        assert!(!of(5, 10));
        assert!(!of(0, 10));
        assert!(!of(0, 0));
    }
}
