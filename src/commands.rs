//! Each command turns flags and config into work and prints the result; the library
//! modules do the work.

use crate::cli::{Cli, Command, Selection};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lock::{self, BaseResolver};
use crate::pins::BasePin;
use crate::plan::Plan;
use crate::project::{Project, cache_dir};
use crate::values::Name;
use crate::{check, context, fetch, render};
use serde_json::json;

pub struct Session {
    pub project: Project,
    pub config: Config,
    pub json: bool,
    pub quiet: bool,
}

impl Session {
    fn note(&self, message: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("{}", message.as_ref());
        }
    }

    fn selection(&self, selection: &Selection) -> Result<Vec<Name>> {
        if selection.all || selection.images.is_empty() {
            return self.project.image_names();
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
    let cwd = std::env::current_dir().map_err(|e| Error::io(".", e))?;
    let project = Project::discover(&cwd)?;
    let config = Config::load(cli.config.as_deref(), Some(&project.root))?;
    let session = Session {
        project,
        config,
        json: cli.json,
        quiet: cli.quiet,
    };
    match cli.command {
        Command::Checksum { selection, explain } => checksum(&session, &selection, explain),
        Command::Render { image, out } => render_command(&session, &image, out.as_deref()),
        Command::Check(selection) => check_command(&session, &selection),
        Command::Lock { images, update } => lock_command(&session, &images, update),
    }
}

fn checksum(session: &Session, selection: &Selection, explain: bool) -> Result<u8> {
    let names = session.selection(selection)?;
    let plan = Plan::new(&session.project, &names)?;
    if session.json {
        let rows: Vec<_> = names
            .iter()
            .map(|n| json!({"image": n, "checksum": plan.get(n).checksum}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
    } else if explain {
        for name in &names {
            print!("{}", plan.get(name).document);
        }
    } else {
        for name in &names {
            println!("{}  {name}", plan.get(name).checksum);
        }
    }
    Ok(0)
}

fn render_command(session: &Session, image: &str, out: Option<&std::path::Path>) -> Result<u8> {
    let name = session.project.image_name(image)?;
    let plan = Plan::new(&session.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let dockerfile = render::dockerfile(
        planned,
        &session.config.checksum_label,
        session.parent_tag(&plan, &name).as_deref(),
    )?;
    print!("{dockerfile}");
    if let Some(dir) = out {
        let fetched = fetch::fetch(&cache_dir(), planned)?;
        context::unpack_into(planned, &dockerfile, &fetched, dir)?;
        session.note(format!(
            "wrote the build context of {name} to {}",
            dir.display()
        ));
    }
    Ok(0)
}

fn check_command(session: &Session, selection: &Selection) -> Result<u8> {
    let names = session.selection(selection)?;
    let (passed, problems) = check::check(&session.project, &names, &cache_dir());
    if session.json {
        let rows: Vec<_> = passed
            .iter()
            .map(|(n, c)| json!({"image": n, "ok": true, "checksum": c}))
            .collect();
        let errors: Vec<_> = problems.iter().map(|e| e.to_string()).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"passed": rows, "problems": errors}))
                .expect("json")
        );
    } else {
        for (name, _) in &passed {
            session.note(format!("ok  {name}"));
        }
    }
    if problems.is_empty() {
        return Ok(0);
    }
    Err(Error::Many(problems))
}

/// Without an engine module yet, an external base keeps the digest written in pins/.
struct NoEngine;

impl BaseResolver for NoEngine {
    fn resolve(&self, _reference: &str) -> Result<Option<BasePin>> {
        Ok(None)
    }
}

fn lock_command(session: &Session, images: &[String], update: bool) -> Result<u8> {
    let names = if images.is_empty() {
        session.project.image_names()?
    } else {
        session.names(images)?
    };
    for name in &names {
        let report = lock::lock(&session.project, name, update, &NoEngine, &cache_dir())?;
        if report.changes.is_empty() {
            session.note(format!("{}: pins current", report.image));
        }
        for change in &report.changes {
            session.note(format!("{}: {change}", report.image));
        }
    }
    Ok(0)
}
