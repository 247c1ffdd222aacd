//! Each command turns flags and config into work and prints the result; the library
//! modules do the work.

use crate::build::{self, BuildSettings};
use crate::cli::{Cli, Command, Selection};
use crate::config::NodeConfig;
use crate::config::{Config, Transport};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lock::{self, BaseResolver};
use crate::pins::{BasePin, DigestKind};
use crate::plan::Plan;
use crate::project::{Project, cache_dir};
use crate::ship::{self, ShipSettings};
use crate::store::LayerStore;
use crate::values::Digest;
use crate::values::Name;
use crate::verify::{self, Holding};
use crate::{check, context, fetch, registry, render};
use serde_json::json;

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
    if crate::assemble::assemblable(&planned.loaded.spec) {
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
            let repo_digest = image
                .repo_digests
                .unwrap_or_default()
                .into_iter()
                .find_map(|d| {
                    d.split_once('@')
                        .filter(|(r, _)| *r == repository || r.ends_with(&format!("/{repository}")))
                        .map(|(_, digest)| digest.to_string())
                });
            let (digest, kind) = match repo_digest {
                Some(digest) => (digest, DigestKind::RepoDigest),
                None => (image.id.unwrap_or_default(), DigestKind::ImageId),
            };
            let digest =
                Digest::try_from(digest).map_err(|e| engine.error(format!("{reference}: {e}")))?;
            let config = image.config.unwrap_or_default();
            Ok(Some(BasePin {
                reference: reference.to_string(),
                digest,
                kind,
                entrypoint: config.entrypoint.filter(|e| !e.is_empty()),
                cmd: config.cmd.filter(|c| !c.is_empty()),
            }))
        })
    }
}

fn build_command(
    session: &Session,
    images: &[String],
    force: bool,
    check_repro: bool,
) -> Result<u8> {
    let names = session.names(images)?;
    let plan = Plan::new(&session.project, &names)?;
    // The lints cost nothing and a wrong ENTRYPOINT costs a deployment: refuse before building.
    let mut problems: Vec<Error> = plan
        .order
        .iter()
        .flat_map(|n| check::lints(&plan, plan.get(n)))
        .collect();
    match problems.len() {
        0 => {}
        1 => return Err(problems.remove(0)),
        _ => return Err(Error::Many(problems)),
    }
    let state_dir = session.project.state_dir();
    let settings = BuildSettings {
        checksum_label: &session.config.checksum_label,
        cache: &cache_dir(),
        state_dir: &state_dir,
        force,
        echo: !session.quiet && !session.json,
    };
    let mut differences = Vec::new();
    let records = runtime()?.block_on(async {
        let engine = session.engine(&session.config.builder).await?;
        if !check_repro {
            return build::build_all(&engine, &plan, &settings).await;
        }
        let mut records = Vec::new();
        for name in &names {
            let (mut pair, found) = crate::repro::check(&engine, &plan, name, &settings).await?;
            for record in &mut pair {
                record.reproducible = Some(found.is_empty());
                record.differences = found.clone();
            }
            differences.extend(found.into_iter().map(|d| format!("{name}: {d}")));
            records.extend(pair);
        }
        Ok(records)
    })?;
    if session.json {
        println!("{}", serde_json::to_string_pretty(&records).expect("json"));
    }
    for record in &records {
        let smoke = match record.smoke.len() {
            0 => String::new(),
            n => format!(", {n} smoke test(s) passed"),
        };
        session.note(format!(
            "{} {}  {} ({}, {:.1} s{smoke})",
            record.checksum,
            record.reference,
            record.outcome,
            short_id(&record.image_id),
            record.seconds
        ));
    }
    if check_repro {
        if differences.is_empty() {
            session.note("reproducible: two builds from scratch gave the same image");
        } else {
            for difference in &differences {
                eprintln!("differs: {difference}");
            }
            eprintln!(
                "error: not reproducible: {} difference(s) between two builds from scratch",
                differences.len()
            );
            return Ok(1);
        }
    }
    Ok(0)
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

fn smoke_command(
    session: &Session,
    image: &str,
    node: Option<&str>,
    junit: Option<&std::path::Path>,
) -> Result<u8> {
    let name = session.project.image_name(image)?;
    let plan = Plan::new(&session.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let node = session.node(node)?;
    let outcome = runtime()?.block_on(async {
        let engine = session.engine(node).await?;
        let ids = engine
            .images_with_label(&session.config.checksum_label, planned.checksum.as_str())
            .await?;
        let Some(id) = ids.first() else {
            return Err(engine.error(format!(
                "holds no image with checksum {} for `{name}`",
                planned.checksum
            )));
        };
        Ok(build::smoke(&engine, planned, id).await)
    })?;
    if let Some(path) = junit {
        let xml = junit_xml(&name, &node.name, &outcome);
        fs_err::write(path, xml).map_err(|e| Error::io(path, e))?;
    }
    let results = outcome?;
    if session.json {
        println!("{}", serde_json::to_string_pretty(&results).expect("json"));
    }
    for result in &results {
        session.note(format!("passed  {} ({:.1} s)", result.name, result.seconds));
    }
    Ok(0)
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML for CI: one testcase per smoke test run.
fn junit_xml(image: &Name, node: &Name, outcome: &Result<Vec<build::SmokeResult>>) -> String {
    let mut cases = String::new();
    let (tests, failures) = match outcome {
        Ok(results) => {
            for r in results {
                cases.push_str(&format!(
                    "    <testcase classname=\"{image}\" name=\"{}\" time=\"{:.3}\"/>\n",
                    xml_escape(&r.name),
                    r.seconds
                ));
            }
            (results.len(), 0)
        }
        Err(Error::SmokeFailed {
            smoke,
            code,
            output,
            ..
        }) => {
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{}\">\n      <failure message=\"exit {code}\">{}</failure>\n    </testcase>\n",
                xml_escape(smoke),
                xml_escape(output)
            ));
            (1, 1)
        }
        Err(error) => {
            cases.push_str(&format!("    <testcase classname=\"{image}\" name=\"smoke\">\n      <error message=\"{}\"/>\n    </testcase>\n", xml_escape(&error.to_string())));
            (1, 1)
        }
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"hallmark smoke {image} on {node}\" tests=\"{tests}\" failures=\"{failures}\">\n{cases}  </testsuite>\n</testsuites>\n"
    )
}

fn lock_command(session: &Session, images: &[String], update: bool) -> Result<u8> {
    let names = if images.is_empty() {
        session.project.image_names()?
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

fn distribute_command(
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
                        &shipment,
                        &settings,
                    )
                    .await,
                );
            }
            for (node, error) in &unreachable {
                outcomes.push(ship::NodeOutcome {
                    node: node.clone(),
                    action: "failed",
                    layer_bytes: 0,
                    archive_bytes: 0,
                    layers_sent: 0,
                    seconds: 0.0,
                    verified: false,
                    fell_back_to_full: false,
                    error: Some(error.clone()),
                });
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

fn verify_command(session: &Session, images: &[String], nodes: &[String]) -> Result<u8> {
    let names = session.names(images)?;
    let plan = Plan::new(&session.project, &names)?;
    let nodes = session.selected_nodes(nodes)?;
    let rows = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        let connected = session.connect_all(&nodes).await;
        let mut rows = Vec::new();
        for name in &names {
            let image = plan.get(name);
            let shipment = session.shipment(&builder, &plan, image).await?;
            for (node, engine) in nodes.iter().zip(&connected) {
                let holding = match engine {
                    Ok(engine) => verify::holding(
                        engine,
                        &shipment.reference,
                        &session.config.checksum_label,
                        &shipment.checksum,
                        &shipment.fingerprint,
                    )
                    .await
                    .unwrap_or_else(|e| unreachable_holding(node, e)),
                    Err(e) => unreachable_holding(node, e.to_string()),
                };
                rows.push((name.to_string(), holding));
            }
        }
        Ok::<_, Error>(rows)
    })?;
    print_holdings(session, &rows);
    let all_current = rows.iter().all(|(_, h)| h.state == Holding::Current);
    Ok(if all_current { 0 } else { 1 })
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

fn status_command(session: &Session) -> Result<u8> {
    let names = session.project.image_names()?;
    let plan = Plan::new(&session.project, &names)?;
    let nodes = session.config.nodes.clone();
    let rows = runtime()?.block_on(async {
        let connected = session.connect_all(&nodes).await;
        let builder = session.engine(&session.config.builder).await.ok();
        let mut rows = Vec::new();
        for name in &names {
            let image = plan.get(name);
            let reference = image.loaded.reference();
            // The builder's fingerprint is the reference; without it, the label alone decides.
            let expected = match &builder {
                Some(b) => b
                    .inspect(&reference)
                    .await
                    .ok()
                    .flatten()
                    .filter(|i| {
                        verify::label(i, &session.config.checksum_label).map(String::as_str)
                            == Some(image.checksum.as_str())
                    })
                    .map(|i| verify::fingerprint(&i)),
                None => None,
            };
            for (node, engine) in nodes.iter().zip(&connected) {
                let holding = match engine {
                    Ok(engine) => {
                        let fingerprint = expected.clone().unwrap_or_default();
                        match verify::holding(
                            engine,
                            &reference,
                            &session.config.checksum_label,
                            image.checksum.as_str(),
                            &fingerprint,
                        )
                        .await
                        {
                            Ok(mut h) if expected.is_none() && h.state == Holding::Mismatch => {
                                h.state = Holding::Current;
                                h.detail =
                                    Some("label only: the builder does not hold the image".into());
                                h
                            }
                            Ok(h) => h,
                            Err(e) => unreachable_holding(node, e),
                        }
                    }
                    Err(e) => unreachable_holding(node, e.to_string()),
                };
                rows.push((name.to_string(), holding));
            }
        }
        Ok::<_, Error>(rows)
    })?;
    print_holdings(session, &rows);
    Ok(0)
}

fn nodes_command(session: &Session) -> Result<u8> {
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
                    let version = engine.docker.version().await.ok();
                    let info = engine.docker.info().await.ok();
                    let store = info.as_ref().map(|i| {
                        let status = format!("{:?}", i.driver_status);
                        if status.contains("io.containerd.snapshotter") { "containerd" } else { "classic" }
                    });
                    json!({
                        "node": node.name,
                        "engine": node.engine,
                        "reachable": true,
                        "version": version.as_ref().and_then(|v| v.version.clone()),
                        "api": version.as_ref().and_then(|v| v.api_version.clone()),
                        "image_store": store,
                        "driver": info.as_ref().and_then(|i| i.driver.clone()),
                        "images": info.as_ref().and_then(|i| i.images),
                        "data_root": info.as_ref().and_then(|i| i.docker_root_dir.clone()),
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
                    "{:<10} {:<8} {:<10} api {:<6} {:<11} {} images  {}",
                    s("node"),
                    "ok",
                    s("version"),
                    s("api"),
                    s("image_store"),
                    s("images"),
                    s("engine")
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

fn prune_command(session: &Session) -> Result<u8> {
    let names = session.project.image_names()?;
    let plan = Plan::new(&session.project, &names)?;
    let keep = runtime()?.block_on(async {
        let builder = session.engine(&session.config.builder).await?;
        let mut keep = Vec::new();
        for name in &names {
            if let Some(image) = builder.inspect(&plan.get(name).loaded.reference()).await? {
                keep.extend(image.id);
            }
        }
        Ok::<_, Error>(keep)
    })?;
    let (removed, bytes) = LayerStore::open(&cache_dir()).prune(&keep)?;
    session.note(format!(
        "removed {removed} blobs, {bytes} bytes, from the layer store"
    ));
    if let Some(collected) = registry::collect_garbage(&cache_dir())? {
        session.note(collected);
    }
    Ok(0)
}
