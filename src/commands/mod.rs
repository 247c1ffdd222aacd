//! Each command turns flags and config into work and prints the result; the library
//! modules do the work.

mod caches;
mod cluster;
mod images;
mod offline;

use cluster::{distribute_command, nodes_command, prune_command, status_command, verify_command};
use images::{build_command, smoke_command};
use offline::{check_command, checksum, lock_command, render_command};

use crate::cli::{Cli, Command, Selection};
use crate::config::Config;
use crate::config::NodeConfig;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::project::Project;
use crate::values::Name;

pub struct Session {
    pub project: Project,
    pub config: Config,
    pub json: bool,
    pub quiet: bool,
    pub verbose: bool,
}

impl Session {
    fn note(&self, message: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("{}", message.as_ref());
        }
    }

    fn selection(&self, selection: &Selection) -> Result<Vec<Name>> {
        if selection.all || selection.images.is_empty() {
            return self.project.all_images();
        }
        self.names(&selection.images)
    }

    fn names(&self, raw: &[String]) -> Result<Vec<Name>> {
        raw.iter().map(|r| self.project.image_name(r)).collect()
    }

    fn parent_tag(&self, plan: &Plan, name: &Name) -> Option<String> {
        plan.get(name)
            .parent
            .as_ref()
            .map(|p| plan.get(p).loaded.reference())
    }
}

pub fn run(cli: Cli) -> Result<u8> {
    let project = match &cli.project {
        Some(dir) => Project::at(dir)?,
        None => {
            let cwd = std::env::current_dir().map_err(|e| Error::io(".", e))?;
            Project::discover(&cwd)?
        }
    };
    // Records this process writes to the shared layer store belong to this project.
    crate::store::set_project(&project.root);
    let config = Config::load(cli.config.as_deref(), Some(&project.root))?;
    let session = Session {
        project,
        config,
        json: cli.json,
        quiet: cli.quiet,
        verbose: cli.verbose,
    };
    match cli.command {
        Command::Checksum { selection, explain } => checksum(&session, &selection, explain),
        Command::Render { image, out } => render_command(&session, &image, out.as_deref()),
        Command::Check(selection) => check_command(&session, &selection),
        Command::Lock { images, update } => lock_command(&session, &images, update),
        Command::Build {
            images,
            force,
            check_repro,
        } => build_command(&session, &images, force, check_repro),
        Command::Smoke { image, node, junit } => {
            smoke_command(&session, &image, node.as_deref(), junit.as_deref())
        }
        Command::Distribute {
            images,
            to,
            parallel,
            full,
        } => distribute_command(&session, &images, &to, parallel, full),
        Command::Verify { images, nodes } => verify_command(&session, &images, &nodes),
        Command::Status => status_command(&session),
        Command::Nodes => nodes_command(&session),
        Command::Prune => prune_command(&session),
        Command::Caches => caches::caches_command(&session),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", e))
}

impl Session {
    async fn engine(&self, node: &NodeConfig) -> Result<Engine> {
        Engine::connect(node, self.config.ssh_config.as_deref()).await
    }

    fn node(&self, name: Option<&str>) -> Result<&NodeConfig> {
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
}
