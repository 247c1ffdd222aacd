//! `hallmark nodes`: each node (the builder first): reachable, engine version, image store,
//! images. Exit 1 if any is down.

use super::{connect, runtime};
use crate::commands::settings::Settings;
use crate::engine::{ImageStore, Product};
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::config::NodeConfig;
use crate::output::{Column, Row, cell};
use serde::Serialize;

/// A node as hallmark reaches it; the keys are `--json`'s (docs/json.md).
#[derive(Serialize)]
struct NodeRow {
    node: String,
    engine: String,
    reachable: bool,
    /// Why it could not be reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    up: Option<Up>,
}

/// What a reachable engine says of itself (`null` where it does not say).
#[derive(Serialize)]
struct Up {
    via: &'static str,
    /// The engine's own platform (`linux/arm64`): what it runs natively.
    platform: String,
    version: Option<String>,
    api: Option<String>,
    api_used: String,
    image_store: Option<&'static str>,
    driver: Option<String>,
    images: Option<i64>,
    data_root: Option<String>,
    /// The GPU devices it offers: CDI device names it discovered (Docker 28.3+ lists them).
    gpus: Vec<String>,
    /// Whether it reads CDI specs (Docker 25+ with CDI on, Podman), and has the NVIDIA runtime:
    /// the ways a smoke test's `gpus` are given.
    cdi: bool,
    nvidia_runtime: bool,
}

impl Up {
    /// The table's `gpus` cell: the devices, else how it could give some, else `-`.
    fn gpus_cell(&self) -> String {
        match (self.gpus.is_empty(), self.cdi, self.nvidia_runtime) {
            (false, _, _) => self.gpus.join(","),
            (true, true, _) => "cdi (not listed)".into(),
            (true, false, true) => "nvidia runtime".into(),
            (true, false, false) => "-".into(),
        }
    }
}

impl Row for NodeRow {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 9] = [
            Column::left("node", 0),
            Column::left("state", 0),
            Column::left("platform", 0),
            Column::left("version", 0),
            Column::left("api", 0),
            Column::left("store", 0),
            Column::right("images", 0),
            Column::left("gpus", 0),
            Column::left("engine", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        vec![match &self.up {
            Some(up) => vec![
                self.node.clone(),
                "ok".into(),
                up.platform.clone(),
                cell(&up.version),
                cell(&up.api),
                cell(&up.image_store),
                cell(&up.images),
                up.gpus_cell(),
                format!("{} ({})", self.engine, up.via),
            ],
            None => vec![
                self.node.clone(),
                "down".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                format!(
                    "{}: {}",
                    self.engine,
                    self.error.as_deref().unwrap_or_default()
                ),
            ],
        }]
    }
}

pub(super) fn run(settings: &Settings) -> Result<ExitStatus> {
    let builder = &settings.config.builder;
    let nodes: Vec<&NodeConfig> = std::iter::once(builder)
        .chain(settings.config.nodes.iter().filter(|n| *n != builder))
        .collect();
    let rows = runtime()?.block_on(async {
        let mut rows = Vec::new();
        for node in nodes {
            rows.push(node_row(settings, node).await);
        }
        Ok::<_, Error>(rows)
    })?;
    settings.output.table("nodes", &rows);
    Ok(ExitStatus::from_success(rows.iter().all(|r| r.reachable)))
}

async fn node_row(settings: &Settings, node: &NodeConfig) -> NodeRow {
    let row = |reachable, error, up| NodeRow {
        node: node.name.to_string(),
        engine: node.engine.to_string(),
        reachable,
        error,
        up,
    };
    let engine = match connect(settings, node).await {
        Ok(engine) => engine,
        Err(e) => return row(false, Some(e.to_string()), None),
    };
    let some = |s: &String| Some(s.clone()).filter(|s| !s.is_empty());
    // An engine that answers its version but fails to say what it is (an outside test's
    // engine answered 500) is not one hallmark can work with: down, with its error.
    let info = match engine.info().await {
        Ok(info) => Some(info),
        Err(e) => return row(false, Some(e.to_string()), None),
    };
    row(
        true,
        None,
        Some(Up {
            via: engine.reach().name(),
            platform: engine.platform(),
            version: some(&engine.version.version),
            api: some(&engine.version.api_version),
            api_used: engine.api_version().to_string(),
            image_store: info.as_ref().map(|i| match engine.product() {
                Product::Podman => ImageStore::Podman.name(),
                Product::Docker => i.docker_store().name(),
            }),
            driver: info.as_ref().and_then(|i| some(&i.driver)),
            images: info.as_ref().and_then(|i| i.images),
            data_root: info.as_ref().and_then(|i| some(&i.docker_root_dir)),
            gpus: (info.iter())
                .flat_map(|i| &i.discovered_devices)
                .filter_map(|d| d["ID"].as_str().map(str::to_string))
                .collect(),
            // Podman reads CDI specs (from /etc/cdi and /var/run/cdi) without saying so, or
            // which devices they offer, through its API.
            cdi: engine.product() == Product::Podman
                || info.as_ref().is_some_and(|i| !i.cdi_spec_dirs.is_empty()),
            nvidia_runtime: info
                .as_ref()
                .is_some_and(|i| i.runtimes.contains_key("nvidia")),
        }),
    )
}
