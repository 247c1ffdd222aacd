//! Commands that need no node: checksum, render, check, lock (which asks the builder for
//! base digests when it can).

use super::{Session, runtime};
use crate::cli::Selection;
use crate::error::{Error, Result};
use crate::lock::{self, BaseResolver};
use crate::pins::{BasePin, DigestKind};
use crate::plan::Plan;
use crate::project::cache_dir;
use crate::values::Digest;
use crate::wheel::{self, Interpreter};
use crate::{base, check, context, fetch, render};
use serde_json::json;

impl Session {
    /// With `-v`: how many files planning read, and how many it knew unchanged.
    fn hashing_note(&self, stats: crate::checksum::HashStats) {
        if self.verbose {
            self.note(format!(
                "files: {} hashed ({} bytes read), {} unchanged since last hashed ({})",
                stats.hashed_files,
                stats.hashed_bytes,
                stats.remembered,
                self.project.state_dir().join("file-hashes").display()
            ));
        }
    }
}

pub(super) fn checksum(session: &Session, selection: &Selection, explain: bool) -> Result<u8> {
    let names = session.selection(selection)?;
    let plan = Plan::new(&session.project, &names)?;
    session.hashing_note(plan.hashing);
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

pub(super) fn render_command(
    session: &Session,
    image: &str,
    out: Option<&std::path::Path>,
) -> Result<u8> {
    let name = session.project.image_name(image)?;
    let plan = Plan::new(&session.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let dockerfile = render::dockerfile(
        planned,
        &session.config.checksum_label,
        planned.checksum.as_str(),
        session.parent_tag(&plan, &name).as_deref(),
    )?;
    print!(
        "{}",
        crate::compile::describe(&planned.compiles, &planned.loaded)
    );
    print!("{dockerfile}");
    if !planned.compiles.is_empty() {
        session.note(format!(
            "hallmark: `{name}` is assembled: its compile stages run in containers on the builder (`hallmark build`), their wheels are installed into a layer of their own (the Dockerfile above installs the pinned wheels only)"
        ));
    } else if crate::assemble::assemblable(&planned.loaded.spec) {
        session.note(format!(
            "hallmark: `{name}` only adds files and metadata to its parent: `hallmark build` assembles it without running a build (the Dockerfile above gives the same content)"
        ));
    } else {
        session.note(format!(
            "hallmark: `{name}` is built by the engine's builder from the Dockerfile above"
        ));
    }
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

pub(super) fn check_command(session: &Session, selection: &Selection) -> Result<u8> {
    let names = session.selection(selection)?;
    let (passed, problems, hashing) = check::check(&session.project, &names, &cache_dir());
    session.hashing_note(hashing);
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

/// Pins an external base from the builder, when it is reachable and holds the image.
struct EngineResolver<'a> {
    session: &'a Session,
    runtime: tokio::runtime::Runtime,
}

impl BaseResolver for EngineResolver<'_> {
    fn resolve(&self, reference: &str) -> Result<Option<BasePin>> {
        self.runtime.block_on(async {
            let Ok(engine) = self.session.engine(&self.session.config.builder).await else {
                return Ok(None);
            };
            let Some(image) = engine.inspect(reference).await? else {
                return Ok(None);
            };
            // `host:5000/repo:tag` -> `host:5000/repo`: a colon followed by a `/` is a port.
            let repository = reference
                .rsplit_once(':')
                .filter(|(_, tag)| !tag.contains('/'))
                .map_or(reference, |(r, _)| r);
            // Only the classic store's repo digests are a registry's: the containerd store
            // names every image by a manifest digest, one it made at `docker load` too.
            let classic = engine.info().await?.image_store() == "classic";
            let repo_digest = image.repo_digests.iter().filter(|_| classic).find_map(|d| {
                d.split_once('@')
                    .filter(|(r, _)| *r == repository || r.ends_with(&format!("/{repository}")))
                    .map(|(_, digest)| digest.to_string())
            });
            let (digest, kind) = match repo_digest {
                Some(digest) => (digest, DigestKind::RepoDigest),
                None => match base::config_digest(&engine, reference, &cache_dir()).await? {
                    Some((_, config)) => (config, DigestKind::ConfigDigest),
                    None => return Ok(None),
                },
            };
            let digest =
                Digest::try_from(digest).map_err(|e| engine.error(format!("{reference}: {e}")))?;
            Ok(Some(BasePin {
                reference: reference.to_string(),
                digest,
                kind,
                entrypoint: image.strings("Entrypoint"),
                cmd: image.strings("Cmd"),
            }))
        })
    }

    fn interpreter(&self, reference: &str) -> Result<Option<Interpreter>> {
        self.runtime.block_on(async {
            let Ok(engine) = self.session.engine(&self.session.config.builder).await else {
                return Ok(None);
            };
            if engine.inspect(reference).await?.is_none() {
                return Ok(None);
            }
            // Fails on an image for another machine or without python3: not an answer.
            Ok(
                match engine.run_once(reference, &wheel::probe_command()).await {
                    Ok((0, output)) => wheel::parse_probe_answer(&output)
                        .ok()
                        .map(|target| target.interpreter),
                    _ => None,
                },
            )
        })
    }
}

pub(super) fn lock_command(session: &Session, images: &[String], update: bool) -> Result<u8> {
    let names = if images.is_empty() {
        session.project.all_images()?
    } else {
        session.names(images)?
    };
    let resolver = EngineResolver {
        session,
        runtime: runtime()?,
    };
    for name in &names {
        let report = lock::lock(&session.project, name, update, &resolver, &cache_dir())?;
        if report.changes.is_empty() {
            session.note(format!("{}: pins current", report.image));
        }
        for change in &report.changes {
            session.note(format!("{}: {change}", report.image));
        }
    }
    Ok(0)
}
