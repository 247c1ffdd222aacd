//! `hallmark.toml`: the builder and the nodes (the same file marks the project root). Every
//! key is optional: without them, the local engine (found as the docker CLI finds it:
//! `DOCKER_HOST`, `DOCKER_CONTEXT`, the current context) is the builder and the only node.

use crate::engine::Address;
use crate::engine::credentials::docker_config_dir;
use crate::error::{Error, Invalid, Result};
use crate::inputs::spec::parse_toml;
use crate::inputs::values::Name;

use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    checksum_label: Option<String>,
    /// An ssh config file (`ssh -F`) for `ssh://` engines, relative to this file.
    ssh_config: Option<PathBuf>,
    builder: Option<NodeTable>,
    #[serde(default, rename = "node")]
    nodes: Vec<NodeTable>,
    /// How images reach the nodes unless a node says otherwise (default: `auto` with a
    /// `[registry]` table, else `stream`).
    transport: Option<Transport>,
    registry: Option<RegistryConfig>,
    provenance: Option<ProvenanceConfig>,
}

/// `[provenance]`: the key that signs each image's provenance when it is built, and the
/// public keys `verify --provenance` accepts; paths relative to the project root.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ProvenanceConfig {
    /// An ed25519 private key in OpenSSH format (`ssh-keygen -t ed25519 -N ''`).
    pub key: Option<PathBuf>,
    /// OpenSSH public keys (`.pub`).
    #[serde(default)]
    pub trusted: Vec<PathBuf>,
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
    /// The registry for a node's first copy of what is shipped (it lacks most of it), the
    /// stream for an update; the stream for a node that cannot pull (`ship/choose.rs`).
    Auto,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Stream => "stream",
            Transport::Registry => "registry",
            Transport::Auto => "auto",
        }
    }
}

/// `[registry]`: the registry of `transport = "registry"` and `"auto"`.
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

/// `[builder]` or a `[[node]]` as written; its engine address is parsed once read.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct NodeTable {
    name: Name,
    /// `unix:///path`, `tcp://host:port` or `ssh://[user@]host[:port]`.
    engine: String,
    #[serde(default)]
    transport: Option<Transport>,
    #[serde(default)]
    emulate: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: Name,
    /// Where its engine listens. A `tcp://` engine of the docker CLI's is reached with TLS
    /// when the CLI would (`DOCKER_TLS_VERIFY` with `DOCKER_CERT_PATH`, or a context's TLS
    /// folder).
    pub engine: Address,
    /// This node's transport, if not the cluster's.
    pub transport: Option<Transport>,
    /// Whether code of another platform may run here through an emulator (`emulate`,
    /// default true): the builder's RUN steps and smoke tests of a foreign image.
    pub emulate: bool,
}

impl NodeConfig {
    /// This node's engine (an `ssh://` one through the user's ssh and `ssh_config`, its
    /// control master kept in `cache`).
    pub async fn connect(
        &self,
        ssh_config: Option<&Path>,
        cache: &Path,
    ) -> Result<crate::engine::Engine> {
        crate::engine::Engine::connect(self.name.as_str(), &self.engine, ssh_config, cache).await
    }
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
    pub provenance: Option<ProvenanceConfig>,
}

impl Config {
    /// The transport that takes images to `node`.
    pub fn transport_of(&self, node: &NodeConfig) -> Transport {
        node.transport.unwrap_or(self.transport)
    }
}

/// The engine the docker CLI would use here, found the way it finds it: `DOCKER_HOST` (with
/// `DOCKER_TLS_VERIFY` and `DOCKER_CERT_PATH` for TLS), else the context `DOCKER_CONTEXT`
/// names, else the current context of the docker config (`DOCKER_CONFIG`, else
/// `~/.docker`), else the default socket. Written here because no crate reads docker
/// contexts; the layout is the docker CLI's (`contexts/meta/<sha256 of the name>/meta.json`,
/// `contexts/tls/<sha256 of the name>/docker/`).
pub fn local_engine() -> Result<NodeConfig> {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    let config_dir = docker_config_dir();
    let node = |engine: Address| NodeConfig {
        name: Name::try_from("local".to_string()).expect("valid"),
        engine,
        transport: None,
        emulate: true,
    };
    if let Some(host) = env("DOCKER_HOST") {
        let tls = env("DOCKER_TLS_VERIFY").map(|_| {
            env("DOCKER_CERT_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| config_dir.clone())
        });
        let engine = Address::parse(&host, tls.as_deref()).map_err(|e| Error::Usage {
            message: format!("node `local`: DOCKER_HOST: {e}"),
            hint: None,
        })?;
        return Ok(node(engine));
    }
    let (context, from) = match env("DOCKER_CONTEXT") {
        Some(name) => (Some(name), "DOCKER_CONTEXT".to_string()),
        None => {
            let file = config_dir.join("config.json");
            (current_context(&file)?, file.display().to_string())
        }
    };
    match context.filter(|name| name != "default") {
        None => Ok(node(
            Address::parse(DEFAULT_ENGINE, None).expect("a valid address"),
        )),
        Some(name) => docker_context(&config_dir, &name, &from).map(node),
    }
}

/// The label that carries an image's input checksum unless `checksum-label` names another.
pub const DEFAULT_CHECKSUM_LABEL: &str = "hallmark.checksum";

const DEFAULT_ENGINE: &str = "unix:///var/run/docker.sock";

/// `currentContext` of the docker CLI's `config.json`, if it names one.
fn current_context(file: &Path) -> Result<Option<String>> {
    let text = match fs_err::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(file, e)),
    };
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Parse {
        path: file.to_path_buf(),
        location: None,
        key: None,
        message: format!("not the docker CLI's JSON config: {e}"),
    })?;
    Ok(config
        .get("currentContext")
        .and_then(|c| c.as_str())
        .filter(|c| !c.is_empty())
        .map(String::from))
}

/// The engine address of the docker context `name` (chosen by `from`), with its TLS folder.
fn docker_context(config_dir: &Path, name: &str, from: &str) -> Result<Address> {
    use sha2::Digest as _;
    let id = hex::encode(sha2::Sha256::digest(name.as_bytes()));
    let meta = config_dir.join("contexts/meta").join(&id).join("meta.json");
    let text = match fs_err::read_to_string(&meta) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Usage {
                message: format!(
                    "the docker context `{name}` (chosen by {from}) does not exist: no {}",
                    meta.display()
                ),
                hint: Some("`docker context ls` lists the contexts; unset DOCKER_CONTEXT or choose another with `docker context use`".into()),
            });
        }
        Err(e) => return Err(Error::io(&meta, e)),
    };
    let invalid = |message: String| Error::Parse {
        path: meta.clone(),
        location: None,
        key: Some("Endpoints.docker.Host".into()),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("not a docker context: {e}")))?;
    let endpoint = &value["Endpoints"]["docker"];
    let host = endpoint["Host"]
        .as_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| invalid(format!("the docker context `{name}` names no engine")))?;
    if endpoint["SkipTLSVerify"].as_bool() == Some(true) {
        return Err(Error::Usage {
            message: format!(
                "the docker context `{name}` skips TLS verification; hallmark does not connect to an engine it cannot verify"
            ),
            hint: Some(
                "give the context the engine's CA (`docker context update --docker ca=...`)".into(),
            ),
        });
    }
    let tls = config_dir.join("contexts/tls").join(&id).join("docker");
    let tls = tls.join("ca.pem").is_file().then_some(tls);
    Address::parse(host, tls.as_deref())
        .map_err(|e| invalid(format!("the docker context `{name}`: {e}")))
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
            let local = local_engine()?;
            return Ok(Config {
                path: None,
                checksum_label: DEFAULT_CHECKSUM_LABEL.into(),
                ssh_config: None,
                builder: local.clone(),
                nodes: vec![local],
                transport: Transport::Stream,
                registry: RegistryConfig::default(),
                provenance: None,
            });
        };
        let file = read_cluster_file(&path)?;
        let invalid = |key: &str, message: String| {
            Error::from(Invalid {
                path: path.clone(),
                location: None,
                key: Some(key.into()),
                message,
                hint: None,
            })
        };
        // Errors in the order users have seen them: the local engine's discovery, then
        // duplicate names, then addresses, then the label and the registry.
        let (builder, nodes) = engines(file.builder, file.nodes, &invalid)?;
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
        // A registry written down is one to use: first copies go through it by themselves.
        let transport = match (file.transport, &file.registry) {
            (Some(transport), _) => transport,
            (None, Some(_)) => Transport::Auto,
            (None, None) => Transport::Stream,
        };
        let registry = file.registry.unwrap_or_default();
        check_registry(&registry, &invalid)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(Config {
            ssh_config: file.ssh_config.map(|p| base.join(p)),
            path: Some(path),
            checksum_label: label,
            builder,
            nodes,
            transport,
            registry,
            provenance: file.provenance,
        })
    }
}

/// The cluster file's text, parsed (a missing file is a usage error: `--config` named it).
fn read_cluster_file(path: &Path) -> Result<ConfigFile> {
    let text = match fs_err::read(path) {
        Ok(bytes) => crate::inputs::spec::text_of(path, bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Usage {
                message: format!("the cluster file {} does not exist", path.display()),
                hint: Some("`--config FILE` names a cluster file; without it, hallmark.toml at the project root is read".into()),
            });
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    parse_toml(path, &text)
}

/// The builder (the cluster file's, else the local engine) and the nodes (the builder alone
/// when none is listed), each address parsed once.
fn engines(
    builder: Option<NodeTable>,
    tables: Vec<NodeTable>,
    invalid: &impl Fn(&str, String) -> Error,
) -> Result<(NodeConfig, Vec<NodeConfig>)> {
    let local = match &builder {
        Some(_) => None,
        None => Some(local_engine()?),
    };
    for (i, node) in tables.iter().enumerate() {
        if tables[..i].iter().any(|n| n.name == node.name) {
            return Err(invalid(
                "node.name",
                format!("node `{}` is listed twice", node.name),
            ));
        }
    }
    let node = |table: NodeTable| -> Result<NodeConfig> {
        let engine = Address::parse(&table.engine, None)
            .map_err(|e| invalid("engine", format!("node `{}`: {e}", table.name)))?;
        Ok(NodeConfig {
            name: table.name,
            engine,
            transport: table.transport,
            emulate: table.emulate.unwrap_or(true),
        })
    };
    let nodes: Vec<NodeConfig> = tables.into_iter().map(node).collect::<Result<_>>()?;
    let builder = match (builder, local) {
        (Some(table), _) => node(table)?,
        (None, local) => local.expect("found above"),
    };
    // The builder listed as a node too is one engine under one name; under a node's name
    // with another engine, `nodes` showed two rows of one name and `smoke --node` took one.
    if let Some(node) = nodes.iter().find(|n| n.name == builder.name)
        && node.engine != builder.engine
    {
        return Err(invalid(
            "builder.name",
            format!(
                "the builder is named `{}`, as is a node with another engine ({} and {})",
                builder.name, builder.engine, node.engine
            ),
        ));
    }
    let nodes = if nodes.is_empty() {
        vec![builder.clone()]
    } else {
        nodes
    };
    Ok((builder, nodes))
}

/// `[registry]`: an address is `host:port`, at least one pull at a time, a port not 0.
fn check_registry(
    registry: &RegistryConfig,
    invalid: &impl Fn(&str, String) -> Error,
) -> Result<()> {
    if let Some(address) = &registry.address {
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
    if registry.pulls == Some(0) {
        return Err(invalid("registry.pulls", "must be at least 1".into()));
    }
    if registry.port == Some(0) {
        return Err(invalid(
            "registry.port",
            "is 0, which no registry listens on: name a port from 1 to 65535, or leave it out for a free one".into(),
        ));
    }
    Ok(())
}
