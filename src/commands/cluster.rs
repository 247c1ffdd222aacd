//! Commands about the nodes: distribute, verify, status, nodes, prune.

use super::{Session, runtime};
use crate::config::NodeConfig;
use crate::config::Transport;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::project::cache_dir;
use crate::registry;
use crate::ship::{self, ShipSettings};
use crate::store::LayerStore;
use crate::verify::{self, Holding};
use futures_util::StreamExt as _;
use serde_json::json;

impl Session {
    /// The builder's image for `image`, checked against its checksum, with the names of
    /// the images most likely to share its layers: its parents, up to the external base.
    async fn shipment(
        &self,
        builder: &Engine,
        plan: &Plan,
        image: &crate::plan::PlannedImage,
    ) -> Result<ship::Shipment> {
        let mut shipment = ship::shipment(
            builder,
            &image.loaded.reference(),
            &self.config.checksum_label,
            image.checksum.as_str(),
        )
        .await?;
        let mut current = image;
        while let Some(parent) = &current.parent {
            current = plan.get(parent);
            shipment.related.push(current.loaded.reference());
        }
        if let Some(base) = &current.pins.base {
            shipment.related.push(base.reference.clone());
        }
        Ok(shipment)
    }

    fn selected_nodes(&self, names: &[String]) -> Result<Vec<NodeConfig>> {
        if names.is_empty() {
            return Ok(self.config.nodes.clone());
        }
        names.iter().map(|n| self.node(Some(n)).cloned()).collect()
    }

    /// Connects to each node in turn: first contact with an ssh node (host-key check
    /// included) happens one at a time, so parallel transfers never race on known_hosts.
    async fn connect_all(&self, nodes: &[NodeConfig]) -> Vec<std::result::Result<Engine, Error>> {
        let mut engines = Vec::new();
        for node in nodes {
            engines.push(self.engine(node).await);
        }
        engines
    }
}

pub(super) fn distribute_command(
    session: &Session,
    images: &[String],
    to: &[String],
    parallel: bool,
    full: bool,
) -> Result<u8> {
    let names = session.names(images)?;
    let plan = Plan::new(&session.project, &names)?;
    let nodes = session.selected_nodes(to)?;
    let state_dir = session.project.state_dir();
    let settings = ShipSettings {
        checksum_label: &session.config.checksum_label,
        full,
        parallel,
        state_dir: &state_dir,
        verbose: session.verbose,
        progress: !session.quiet
            && !session.json
            && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let store = std::sync::Arc::new(LayerStore::open(&cache_dir()));
    let mut all = Vec::new();
    runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        let connected = session.connect_all(&nodes).await;
        let mut engines = Vec::new();
        let mut unreachable = Vec::new();
        for (node, engine) in nodes.iter().zip(connected) {
            match engine {
                Ok(engine) => engines.push(engine),
                Err(e) => unreachable.push((node.name.to_string(), e.to_string())),
            }
        }
        // Nodes by transport; each image goes to both groups, outcomes in the config's order.
        let (by_registry, by_stream): (Vec<Engine>, Vec<Engine>) =
            engines.into_iter().partition(|e| {
                nodes.iter().any(|n| {
                    n.name.as_str() == e.node
                        && session.config.transport_of(n) == Transport::Registry
                })
            });
        let order = |outcome: &ship::NodeOutcome| {
            nodes.iter().position(|n| n.name.as_str() == outcome.node)
        };
        for name in &names {
            let image = plan.get(name);
            let shipment = session.shipment(&builder, &plan, image).await?;
            let mut outcomes = if by_stream.is_empty() {
                Vec::new()
            } else {
                ship::distribute(&builder, &by_stream, &store, &shipment, &settings).await?
            };
            if !by_registry.is_empty() {
                outcomes.extend(
                    registry::distribute(
                        &builder,
                        &by_registry,
                        &session.config.registry,
                        &cache_dir(),
                        &store,
                        &shipment,
                        &settings,
                    )
                    .await,
                );
            }
            for (node, error) in &unreachable {
                outcomes.push(ship::NodeOutcome::failed(node, error.clone()));
            }
            outcomes.sort_by_key(|o| order(o));
            all.push((name.to_string(), shipment.reference, outcomes));
        }
        Ok::<_, Error>(())
    })?;
    let failed = all
        .iter()
        .flat_map(|(_, _, o)| o)
        .filter(|o| o.action == "failed")
        .count();
    if session.json {
        let rows: Vec<_> = all.iter().map(|(image, reference, outcomes)| json!({"image": image, "reference": reference, "nodes": outcomes})).collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
    } else if !session.quiet {
        println!(
            "{:<12} {:<10} {:<8} {:>12} {:>8} {:>9}  {}",
            "image", "node", "action", "bytes sent", "seconds", "verified", "error"
        );
        for (image, _, outcomes) in &all {
            for o in outcomes {
                println!(
                    "{:<12} {:<10} {:<8} {:>12} {:>8.2} {:>9}  {}",
                    image,
                    o.node,
                    o.action,
                    o.archive_bytes,
                    o.seconds,
                    if o.verified { "yes" } else { "no" },
                    o.error.as_deref().unwrap_or("")
                );
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

pub(super) fn verify_command(session: &Session, images: &[String], nodes: &[String]) -> Result<u8> {
    let names = session.names(images)?;
    let plan = Plan::new(&session.project, &names)?;
    let nodes = session.selected_nodes(nodes)?;
    let rows = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        let connected = session.connect_all(&nodes).await;
        let shipments = futures_util::stream::iter(
            names
                .iter()
                .map(|name| session.shipment(&builder, &plan, plan.get(name))),
        )
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
        let mut wanted = Vec::new();
        for shipment in shipments {
            let shipment = shipment?;
            wanted.push(verify::Wanted {
                reference: shipment.reference,
                checksum: shipment.checksum,
                fingerprint: shipment.fingerprint,
            });
        }
        let columns = holdings_of_nodes(session, &nodes, &connected, &wanted).await;
        Ok::<_, Error>(image_rows(&names, columns))
    })?;
    print_holdings(session, &rows);
    let all_current = rows.iter().all(|(_, h)| h.state == Holding::Current);
    Ok(if all_current { 0 } else { 1 })
}

/// What every node holds of `wanted`: the nodes asked at once, one column per node.
async fn holdings_of_nodes(
    session: &Session,
    nodes: &[NodeConfig],
    connected: &[std::result::Result<Engine, Error>],
    wanted: &[verify::Wanted],
) -> Vec<Vec<verify::NodeHolding>> {
    let label = &session.config.checksum_label;
    futures_util::future::join_all(
        nodes
            .iter()
            .zip(connected)
            .map(|(node, engine)| async move {
                match engine {
                    Ok(engine) => verify::holdings(engine, label, wanted)
                        .await
                        .into_iter()
                        .map(|h| h.unwrap_or_else(|e| unreachable_holding(node, e)))
                        .collect(),
                    Err(e) => wanted
                        .iter()
                        .map(|_| unreachable_holding(node, e.to_string()))
                        .collect(),
                }
            }),
    )
    .await
}

/// Rows image by image, each image's nodes in order, from one column per node.
fn image_rows(
    names: &[crate::values::Name],
    columns: Vec<Vec<verify::NodeHolding>>,
) -> Vec<(String, verify::NodeHolding)> {
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        for column in &columns {
            rows.push((name.to_string(), column[i].clone()));
        }
    }
    rows
}

fn unreachable_holding(node: &NodeConfig, error: impl ToString) -> verify::NodeHolding {
    verify::NodeHolding {
        node: node.name.to_string(),
        state: Holding::Unreachable,
        checksum: None,
        fingerprint: None,
        detail: Some(error.to_string()),
    }
}

fn print_holdings(session: &Session, rows: &[(String, verify::NodeHolding)]) {
    if session.json {
        let rows: Vec<_> = rows.iter().map(|(image, h)| json!({"image": image, "node": h.node, "state": h.state, "checksum": h.checksum, "fingerprint": h.fingerprint, "detail": h.detail})).collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
        return;
    }
    for (image, h) in rows {
        let state = serde_json::to_value(&h.state).expect("json");
        println!(
            "{:<20} {:<10} {:<12} {}",
            image,
            h.node,
            state.as_str().unwrap_or_default(),
            h.detail.as_deref().unwrap_or("")
        );
    }
}

pub(super) fn status_command(session: &Session) -> Result<u8> {
    let names = session.project.image_names()?;
    let plan = Plan::new(&session.project, &names)?;
    let nodes = session.config.nodes.clone();
    let label = &session.config.checksum_label;
    let rows = runtime()?.block_on(async {
        let connected = session.connect_all(&nodes).await;
        let builder = session.engine(&session.config.builder).await.ok();
        // The builder's fingerprint is the reference; without it, the label alone is known.
        let expected = futures_util::stream::iter(names.iter().map(|name| {
            let image = plan.get(name);
            let builder = builder.as_ref();
            async move {
                let held = builder?.inspect(&image.loaded.reference()).await.ok()??;
                (verify::label(&held, label) == Some(image.checksum.as_str()))
                    .then(|| verify::fingerprint(&held))
            }
        }))
        .buffered(8)
        .collect::<Vec<Option<String>>>()
        .await;
        let wanted: Vec<verify::Wanted> = names
            .iter()
            .zip(&expected)
            .map(|(name, expected)| {
                let image = plan.get(name);
                verify::Wanted {
                    reference: image.loaded.reference(),
                    checksum: image.checksum.to_string(),
                    fingerprint: expected.clone().unwrap_or_default(),
                }
            })
            .collect();
        let mut columns = holdings_of_nodes(session, &nodes, &connected, &wanted).await;
        for column in &mut columns {
            for (holding, expected) in column.iter_mut().zip(&expected) {
                // Without the builder's image, a matching label is all there is: the
                // content is not checked, so the node is not `current`.
                if expected.is_none() && holding.state == Holding::Mismatch {
                    holding.state = Holding::Unverified;
                    holding.detail = Some("the label matches; the content is not checked: the builder does not hold the image".into());
                }
            }
        }
        Ok::<_, Error>(image_rows(&names, columns))
    })?;
    print_holdings(session, &rows);
    Ok(0)
}

pub(super) fn nodes_command(session: &Session) -> Result<u8> {
    let nodes: Vec<NodeConfig> = std::iter::once(session.config.builder.clone())
        .chain(
            session
                .config
                .nodes
                .iter()
                .filter(|n| **n != session.config.builder)
                .cloned(),
        )
        .collect();
    let rows = runtime()?.block_on(async {
        let mut rows = Vec::new();
        for node in &nodes {
            let row = match session.engine(node).await {
                Err(e) => json!({"node": node.name, "engine": node.engine, "reachable": false, "error": e.to_string()}),
                Ok(engine) => {
                    let version = &engine.version;
                    let info = engine.info().await.ok();
                    let store = info.as_ref().map(|i| i.image_store());
                    json!({
                        "node": node.name,
                        "engine": node.engine,
                        "via": engine.via(),
                        "reachable": true,
                        "version": Some(&version.version).filter(|v| !v.is_empty()),
                        "api": Some(&version.api_version).filter(|v| !v.is_empty()),
                        "api_used": engine.api_version(),
                        "image_store": store,
                        "driver": info.as_ref().map(|i| &i.driver).filter(|d| !d.is_empty()),
                        "images": info.as_ref().and_then(|i| i.images),
                        "data_root": info.as_ref().map(|i| &i.docker_root_dir).filter(|d| !d.is_empty()),
                    })
                }
            };
            rows.push(row);
        }
        Ok::<_, Error>(rows)
    })?;
    if session.json {
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
    } else {
        for r in &rows {
            let s = |k: &str| {
                r[k].as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| r[k].to_string())
            };
            if r["reachable"] == true {
                println!(
                    "{:<10} {:<8} {:<10} api {:<6} {:<11} {} images  {} ({})",
                    s("node"),
                    "ok",
                    s("version"),
                    s("api"),
                    s("image_store"),
                    s("images"),
                    s("engine"),
                    s("via")
                );
            } else {
                println!("{:<10} {:<8} {}", s("node"), "down", s("error"));
            }
        }
    }
    Ok(if rows.iter().all(|r| r["reachable"] == true) {
        0
    } else {
        1
    })
}

pub(super) fn prune_command(session: &Session) -> Result<u8> {
    let names = session.project.image_names()?;
    let plan = Plan::new(&session.project, &names)?;
    let keep = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        let mut keep = Vec::new();
        for name in &names {
            if let Some(image) = builder.inspect(&plan.get(name).loaded.reference()).await? {
                keep.extend(image.id().map(str::to_string));
            }
        }
        Ok::<_, Error>(keep)
    })?;
    // Alone with the store: no command using it may lose a blob it has not recorded yet.
    let cache = cache_dir();
    let root = &session.project.root;
    let store = match LayerStore::for_prune(&cache, root, false)? {
        Some(store) => store,
        None => {
            session.note("waiting for other hallmark commands to finish with the layer store");
            LayerStore::for_prune(&cache, root, true)?.expect("waited for the lock")
        }
    };
    let (removed, bytes) = store.prune(&keep)?;
    drop(store);
    session.note(format!(
        "removed {removed} blobs, {bytes} bytes, from the layer store (kept what other projects use)"
    ));
    let collected = match registry::collect_garbage(&cache, false)? {
        registry::Garbage::Busy => {
            session.note("waiting for the distribute using the registry to finish");
            registry::collect_garbage(&cache, true)?
        }
        done => done,
    };
    if let registry::Garbage::Collected(collected) = collected {
        session.note(collected);
    }
    super::caches::trim_caches(session, &plan)?;
    Ok(0)
}
