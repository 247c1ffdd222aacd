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
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeConfig {
    pub name: Name,
    /// `unix:///path`, `tcp://host:port` or `ssh://[user@]host[:port]`.
    pub engine: String,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from, if any.
    pub path: Option<PathBuf>,
    pub checksum_label: String,
    pub ssh_config: Option<PathBuf>,
    pub builder: NodeConfig,
    pub nodes: Vec<NodeConfig>,
}

fn local_engine() -> NodeConfig {
    let engine = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into());
    NodeConfig {
        name: Name::try_from("local".to_string()).expect("valid"),
        engine,
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
            });
        };
        let text = match fs_err::read_to_string(&path) {
            Ok(text) => text,
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
                .any(|c| c.is_whitespace() || c == '=' || c == '"')
        {
            return Err(invalid(
                "checksum-label",
                format!("`{label}` is not a label key"),
            ));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(Config {
            ssh_config: file.ssh_config.map(|p| base.join(p)),
            path: Some(path),
            checksum_label: label,
            builder,
            nodes,
        })
    }
}
