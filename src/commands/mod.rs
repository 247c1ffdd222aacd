//! One file per verb: each turns the resolved settings (settings.rs) and its own flags into
//! calls of the library modules, which do the work, and prints typed rows (output.rs).

pub mod settings;

mod build;
mod bump;
mod bump_pins;
mod caches;
mod check;
mod checksum;
mod distribute;
mod help;
mod lock;
mod nodes;
mod patches;
mod prune;
mod render;
mod sbom;
mod smoke;
mod status;
mod verify;

use crate::cli::{Cli, Command};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::config::NodeConfig;
use crate::inputs::values::Name;
use crate::plan::Plan;

pub fn run(cli: Cli) -> Result<ExitStatus> {
    // What clap writes from the command line's own definition needs no project.
    match &cli.command {
        Command::Completions { shell } => return Ok(help::completions(*shell)),
        Command::Man => return help::man(),
        _ => {}
    }
    // Ctrl-C and SIGTERM alike for every verb, from here on (interrupt.rs). The verb's name
    // is its variant's, as clap derives it.
    let verb = format!("{:?}", cli.command).to_lowercase();
    let verb = verb
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("hallmark");
    crate::interrupt::watch(&format!("hallmark {verb}"));
    crate::engine::check_deadline_env()?;
    let settings = Settings::resolve(&cli)?;
    // Records this process writes to the shared layer store belong to this project.
    crate::images::store::set_project(&settings.project.root);
    let settings = &settings;
    // These end their own way on a signal (the rows they have, the rest `interrupted`,
    // their containers removed, bump's files put back); for the others the signal thread
    // ends the process once no file is half written.
    let _listening = matches!(
        cli.command,
        Command::Build { .. }
            | Command::Smoke { .. }
            | Command::Distribute { .. }
            | Command::Verify { .. }
            | Command::Status
            | Command::Bump(_)
    )
    .then(crate::interrupt::listening);
    let ran = run_verb(settings, cli.command);
    // Whatever the verb made of it, a signal ends it as interrupted (130): an engine's
    // connection closed under it is not the work's failure.
    match ran {
        _ if !crate::interrupt::requested() => ran,
        Ok(_) => Ok(ExitStatus::Interrupted),
        Err(error @ Error::Interrupted { .. }) => Err(error),
        Err(error) => Err(Error::Interrupted {
            what: error.to_string(),
        }),
    }
}

fn run_verb(settings: &Settings, command: Command) -> Result<ExitStatus> {
    match command {
        Command::Checksum { selection, explain } => checksum::run(settings, &selection, explain),
        Command::Render { image, out } => render::run(settings, &image, out.as_deref()),
        Command::Sbom { image, format, out } => sbom::run(settings, &image, format, out.as_deref()),
        Command::Check(selection) => check::run(settings, &selection),
        Command::Lock { images, update } => lock::run(settings, &images, update),
        Command::Build {
            images,
            force,
            check_repro,
            no_emulate,
        } => build::run(settings, &images, force, check_repro, no_emulate),
        Command::Smoke {
            image,
            node,
            all_nodes,
            junit,
        } => smoke::run(
            settings,
            &image,
            node.as_deref(),
            all_nodes,
            junit.as_deref(),
        ),
        Command::Distribute {
            images,
            all: _, // no image named: all of them
            to,
            parallel,
            full,
            smoke,
        } => distribute::run(settings, &images, &to, (parallel, full), smoke),
        Command::Verify {
            images,
            nodes,
            provenance,
        } => verify::run(settings, &images, &nodes, provenance),
        Command::Provenance { image } => verify::provenance(settings, &image),
        Command::Status => status::run(settings),
        Command::Nodes => nodes::run(settings),
        Command::Prune => prune::run(settings),
        Command::Caches => caches::run(settings),
        Command::Patches(command) => patches::run(settings, &command),
        Command::Bump(args) => bump::run(settings, &args),
        Command::Completions { .. } | Command::Man => unreachable!("answered above"),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", e))
}

async fn connect(settings: &Settings, node: &NodeConfig) -> Result<Engine> {
    let ssh_config = settings.config.ssh_config.as_deref();
    node.connect(ssh_config, &settings.cache).await
}

/// Connects to every node: engines reached directly all at once (a hung one costs its own
/// wait, not everyone's), then the ssh nodes one at a time: first contact with an ssh node
/// (host-key check included) never races another on known_hosts.
async fn connect_all(settings: &Settings, nodes: &[NodeConfig]) -> Vec<Result<Engine>> {
    let is_ssh = |node: &NodeConfig| matches!(node.engine.kind(), crate::engine::Kind::Ssh { .. });
    let direct = futures_util::future::join_all(nodes.iter().map(|node| async move {
        match is_ssh(node) {
            true => None,
            false => Some(connect(settings, node).await),
        }
    }))
    .await;
    let mut engines = Vec::new();
    for (node, direct) in nodes.iter().zip(direct) {
        engines.push(match direct {
            Some(engine) => engine,
            None => connect(settings, node).await,
        });
    }
    engines
}

/// The tag of `name`'s parent spec, which its Dockerfile builds on.
/// Plans each of `names` on its own, so that one bad image does not stop the others: the plan
/// of those that can be planned, and for each other image why not, in a line (its own
/// problem is also said on stderr, whole, once; an image standing on it names it).
fn plan_each(
    settings: &Settings,
    names: &[Name],
) -> (Plan, std::collections::BTreeMap<Name, String>) {
    let (plan, failed) = Plan::each(&settings.project, names);
    let why = failed
        .into_iter()
        .map(|(name, failure)| {
            let why = match failure {
                crate::plan::Failure::Own(error) => {
                    crate::output::stderr_exactly(&error.render());
                    format!("not planned: {error}")
                }
                crate::plan::Failure::Parent(cause) => {
                    settings.output.note(format!(
                        "warning: image `{name}` is left out: its parent chain holds `{cause}`, whose problem is said above"
                    ));
                    format!("not planned: it stands on `{cause}`, whose problem is said above")
                }
            };
            (name, why)
        })
        .collect();
    (plan, why)
}

fn parent_tag(plan: &Plan, name: &Name) -> Option<String> {
    plan.get(name)
        .parent
        .as_ref()
        .map(|p| plan.get(p).loaded.reference())
}

/// With `-v`: how many files planning read, and how many it knew unchanged.
fn hashing_note(settings: &Settings, stats: crate::plan::checksum::HashStats) {
    settings.output.detail(|| {
        format!(
            "files: {} hashed ({} bytes read), {} unchanged since last hashed ({})",
            stats.hashed_files,
            stats.hashed_bytes,
            stats.remembered,
            settings.state_dir.join("file-hashes").display()
        )
    });
}

/// Runs `work`; on Ctrl-C or SIGTERM (a CI cancel, a systemd stop), drops it, removes the
/// containers it started on `engine` and gives `Error::Interrupted` (the work's own cleanup
/// would never run once it is dropped).
async fn until_interrupted<T>(
    engine: &Engine,
    what: &str,
    work: impl std::future::Future<Output = (T, Result<()>)>,
) -> (T, Result<()>)
where
    T: Default,
{
    tokio::select! {
        done = work => done,
        _ = interrupted() => {
            engine.remove_live_containers().await;
            (T::default(), Err(Error::Interrupted { what: format!("{what} on node `{}`", engine.node) }))
        }
    }
}

/// Ends on Ctrl-C (SIGINT) or SIGTERM: both ask hallmark to stop and clean up.
async fn interrupted() {
    crate::interrupt::arrived().await
}
