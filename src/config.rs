//! `hallmark.toml`: the builder and the nodes. Optional: without it, the local engine
//! (`DOCKER_HOST` honoured) is the builder and the only node.

use crate::error::{Error, Result};
use crate::render::DEFAULT_CHECKSUM_LABEL;
use crate::spec::parse_toml;
use crate::values::Name;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    checksum_label: Option<String>,
    /// An ssh config file (`ssh -F`) for `ssh://` engines, relative to this file.
    ssh_config: Option<PathBuf>,
    builder: Option<NodeConfig>,
    #[serde(default, rename = "node")]
    nodes: Vec<NodeConfig>,
    /// How images reach the nodes unless a node says otherwise.
    #[serde(default)]
    transport: Transport,
    #[serde(default)]
    registry: RegistryConfig,
}

/// How `distribute` moves an image to a node.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The builder's export, streamed to each node's `docker load` (only missing layers).
    #[default]
    Stream,
    /// Pushed once to a registry, pulled by the nodes concurrently.
    Registry,
}

/// `[registry]`: the registry of `transport = "registry"`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RegistryConfig {
    /// `host:port` of a registry the operator runs (plain HTTP or TLS, as the engines are set
    /// up for it), which the builder pushes to and every node pulls from. Without it,
    /// hallmark starts one for each distribute on the machine it runs on (the builder).
    pub address: Option<String>,
    /// The port of the registry hallmark starts, on 127.0.0.1 there and on each ssh node
    /// (through `ssh -R`). Default: a free port.
    pub port: Option<u16>,
    /// How many nodes pull at once (default 4).
    pub pulls: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeConfig {
    pub name: Name,
    /// `unix:///path`, `tcp://host:port` or `ssh://[user@]host[:port]`.
    pub engine: String,
    /// This node's transport, if not the cluster's.
    #[serde(default)]
    pub transport: Option<Transport>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any.
    pub path: Option<PathBuf>,
    pub checksum_label: String,
    pub ssh_config: Option<PathBuf>,
    pub builder: NodeConfig,
    pub nodes: Vec<NodeConfig>,
    pub transport: Transport,
    pub registry: RegistryConfig,
}

impl Config {
    /// The transport that takes images to `node`.
    pub fn transport_of(&self, node: &NodeConfig) -> Transport {
        node.transport.unwrap_or(self.transport)
    }
}

fn local_engine() -> NodeConfig {
    let engine = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into());
    NodeConfig {
        name: Name::try_from("local".to_string()).expect("valid"),
        engine,
        transport: None,
    }
}

impl Config {
    /// Reads `explicit` if given (it must exist), else `<root>/hallmark.toml` if present.
    pub fn load(explicit: Option<&Path>, root: Option<&Path>) -> Result<Config> {
        let path = match (explicit, root) {
            (Some(path), _) => Some(path.to_path_buf()),
            (None, Some(root)) => Some(root.join("hallmark.toml")).filter(|p| p.is_file()),
            (None, None) => None,
        };
        let Some(path) = path else {
            let local = local_engine();
            return Ok(Config {
                path: None,
                checksum_label: DEFAULT_CHECKSUM_LABEL.into(),
                ssh_config: None,
                builder: local.clone(),
                nodes: vec![local],
                transport: Transport::Stream,
                registry: RegistryConfig::default(),
            });
        };
        let text = match fs_err::read(&path) {
            Ok(bytes) => crate::spec::text_of(&path, bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Usage {
                    message: format!("the cluster file {} does not exist", path.display()),
                    hint: Some("`--config FILE` names a hallmark.toml; without it, hallmark.toml at the project root is read if present".into()),
                });
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        let file: ConfigFile = parse_toml(&path, &text)?;
        let invalid = |key: &str, message: String| Error::Invalid {
            path: path.clone(),
            location: None,
            key: Some(key.into()),
            message,
            hint: None,
        };
        let builder = file.builder.unwrap_or_else(local_engine);
        let nodes = if file.nodes.is_empty() {
            vec![builder.clone()]
        } else {
            file.nodes
        };
        for (i, node) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|n| n.name == node.name) {
                return Err(invalid(
                    "node.name",
                    format!("node `{}` is listed twice", node.name),
                ));
            }
        }
        for node in nodes.iter().chain([&builder]) {
            let scheme_ok = ["unix://", "tcp://", "ssh://"]
                .iter()
                .any(|s| node.engine.starts_with(s));
            if !scheme_ok {
                return Err(invalid(
                    "engine",
                    format!(
                        "node `{}`: `{}` is not an engine address (unix://, tcp:// or ssh://)",
                        node.name, node.engine
                    ),
                ));
            }
        }
        let label = file
            .checksum_label
            .unwrap_or_else(|| DEFAULT_CHECKSUM_LABEL.into());
        if label.is_empty()
            || label
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '"')
        {
            return Err(invalid(
                "checksum-label",
                format!("`{label}` is not a label key"),
            ));
        }
        if let Some(address) = &file.registry.address {
            let ok = address.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
            });
            if !ok {
                return Err(invalid(
                    "registry.address",
                    format!("`{address}` is not host:port"),
                ));
            }
        }
        if file.registry.pulls == Some(0) {
            return Err(invalid("registry.pulls", "must be at least 1".into()));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(Config {
            ssh_config: file.ssh_config.map(|p| base.join(p)),
            path: Some(path),
            checksum_label: label,
            builder,
            nodes,
            transport: file.transport,
            registry: file.registry,
        })
    }
}
