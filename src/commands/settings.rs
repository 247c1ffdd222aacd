//! Settings resolved once, before any command runs: the command line's global flags, the
//! cluster file and the environment become one value that every command receives (as
//! astral-sh/uv's `settings.rs` does), so no command derives them again its own way.

use crate::cli::{Cli, Selection};
use crate::error::{Error, Result};
use crate::inputs::config::{Config, NodeConfig};
use crate::inputs::project::{self, Project};
use crate::inputs::values::Name;
use crate::output::Output;
use std::path::PathBuf;

pub struct Settings {
    /// The project's root (`-C DIR`, else found by walking up from the current folder).
    pub project: Project,
    /// The cluster file (`--config FILE`, else hallmark.toml at the project root).
    pub config: Config,
    /// The user's cache (`$HALLMARK_CACHE`, `$XDG_CACHE_HOME/hallmark`, `~/.cache/hallmark`):
    /// sources, wheels, the layer store, the registry's storage.
    pub cache: PathBuf,
    /// The label that carries the checksum (the cluster file's `checksum-label`).
    pub checksum_label: String,
    /// `.hallmark/` in the project: logs, records, file hashes.
    pub state_dir: PathBuf,
    /// `--json`, `-q`, `-v`, and whether stderr shows progress.
    pub output: Output,
}

impl Settings {
    pub fn resolve(cli: &Cli) -> Result<Settings> {
        let project = match &cli.project {
            Some(dir) => Project::at(dir)?,
            None => {
                let cwd = std::env::current_dir().map_err(|e| Error::io(".", e))?;
                Project::discover(&cwd)?
            }
        };
        let config = Config::load(cli.config.as_deref(), Some(&project.root))?;
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        Ok(Settings {
            cache: project::cache_dir(),
            checksum_label: config.checksum_label.clone(),
            state_dir: project.state_dir(),
            output: Output::new(cli.json, cli.quiet, cli.verbose, progress),
            project,
            config,
        })
    }

    /// The images `selection` names; every image of the project if it names none.
    pub fn selection(&self, selection: &Selection) -> Result<Vec<Name>> {
        if selection.all || selection.images.is_empty() {
            return self.project.all_images();
        }
        self.names(&selection.images)
    }

    /// The images named on the command line, each checked to be one of the project's, each
    /// once in the order first named.
    pub fn names(&self, raw: &[String]) -> Result<Vec<Name>> {
        let mut names: Vec<Name> = raw
            .iter()
            .map(|r| self.project.image_name(r))
            .collect::<Result<_>>()?;
        let mut seen = std::collections::BTreeSet::new();
        names.retain(|n| seen.insert(n.clone()));
        Ok(names)
    }

    /// The node called `name` (the builder included); the builder if `None`.
    pub fn node(&self, name: Option<&str>) -> Result<&NodeConfig> {
        let Some(name) = name else {
            return Ok(&self.config.builder);
        };
        self.config
            .nodes
            .iter()
            .chain([&self.config.builder])
            .find(|n| n.name.as_str() == name)
            .ok_or_else(|| Error::Usage {
                message: format!(
                    "no node `{name}` in {}",
                    self.config
                        .path
                        .as_ref()
                        .map_or("the default config".into(), |p| p.display().to_string())
                ),
                hint: Some(format!(
                    "nodes: {}",
                    self.config
                        .nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            })
    }

    /// The nodes `--to`/`--nodes` names, each once (named twice, two loads went into one
    /// engine at once); all of the cluster file's if none.
    pub fn selected_nodes(&self, names: &[String]) -> Result<Vec<NodeConfig>> {
        if names.is_empty() {
            return Ok(self.config.nodes.clone());
        }
        let mut seen = std::collections::HashSet::new();
        names
            .iter()
            .filter(|n| seen.insert(n.as_str()))
            .map(|n| self.node(Some(n)).cloned())
            .collect()
    }
}
