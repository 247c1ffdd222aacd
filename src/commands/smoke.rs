//! `hallmark smoke`: an image's smoke tests on a node (default: the builder), with a JUnit
//! report for CI.

use super::{connect, runtime, until_interrupted};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::make::build;
use crate::plan::{Plan, PlannedImage};
use crate::ship::junit::junit_xml;
use crate::ship::verify::trusted::trusted_image;

pub(super) fn run(
    settings: &Settings,
    image: &str,
    node: Option<&str>,
    all_nodes: bool,
    junit: Option<&std::path::Path>,
) -> Result<ExitStatus> {
    let name = settings.project.image_name(image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let nodes: Vec<&crate::inputs::config::NodeConfig> = match all_nodes {
        true => settings.config.nodes.iter().collect(),
        false => vec![settings.node(node)?],
    };
    refuse_nothing_to_run(settings, planned, &nodes)?;
    // A report that cannot be written is said before the tests run (they still run, and
    // their results are shown; the exit says the report is missing).
    let report = junit.map(|path| {
        fs_err::File::create(path).map_err(|e| {
            let error = Error::io(path, e);
            settings.output.note(format!(
                "warning: the JUnit report cannot be written ({error}); the tests run all the same"
            ));
            error
        })
    });
    // Every node at once, each with its own engine and deadlines: a stuck node fails alone.
    let runs = runtime()?.block_on(futures_util::future::join_all(
        nodes.iter().map(|node| smoke_on(settings, planned, node)),
    ));
    // CI reads the report whatever happened: an unreachable node or a missing image is an
    // `<error>` case in it, not a missing file.
    let mut failed = Vec::new();
    if let (Some(path), Some(report)) = (junit, report) {
        let xml = junit_xml(&name, &settings.config.builder.name, &nodes, &runs, planned);
        let written = report.and_then(|mut file| {
            std::io::Write::write_all(&mut file, xml.as_bytes()).map_err(|e| Error::io(path, e))
        });
        if let Err(e) = written {
            failed.push(e);
        }
    }
    if settings.output.json {
        let builder = &settings.config.builder.name;
        let mut rows: Vec<serde_json::Value> = Vec::new();
        for (node, (results, outcome)) in nodes.iter().zip(&runs) {
            rows.extend(results.iter().map(|r| {
                serde_json::to_value(NodeResult {
                    node: node.name.to_string(),
                    result: r,
                })
                .expect("json")
            }));
            // Every test of the spec has its row: those that did not run, with why.
            let declared = crate::ship::junit::declared(planned, node.name == *builder);
            for unrun in crate::ship::junit::unrun(&declared, results, outcome) {
                rows.push(serde_json::json!({
                    "node": node.name.as_str(),
                    "name": unrun.name,
                    "passed": false,
                    "ran": false,
                    "error": unrun.error,
                    "reason": crate::error::plain_text(&unrun.reason),
                }));
            }
        }
        settings.output.json("results", &rows);
    }
    for (node, (results, outcome)) in nodes.iter().zip(runs) {
        for result in &results {
            let shown = match all_nodes {
                true => format!("{:<12} {}", node.name, result.name),
                false => result.name.clone(),
            };
            if result.passed {
                settings
                    .output
                    .note(format!("passed  {shown} ({:.1} s)", result.seconds));
            }
        }
        if let Err(e) = outcome {
            failed.push(e);
        }
    }
    match failed.len() {
        0 => Ok(ExitStatus::Success),
        1 => Err(failed.remove(0)),
        _ => Err(Error::Many(failed)),
    }
}

/// A smoke that would run no test is an error, not a pass: a CI job that forgets `--node`
/// for tests that are `on = "nodes"` must not go green.
fn refuse_nothing_to_run(
    settings: &Settings,
    planned: &PlannedImage,
    nodes: &[&crate::inputs::config::NodeConfig],
) -> Result<()> {
    let tests = &planned.loaded.spec.smokes;
    let builder = &settings.config.builder.name;
    let runs = |node: &&crate::inputs::config::NodeConfig| {
        tests.iter().any(|t| t.runs_on(node.name == *builder))
    };
    if nodes.iter().any(runs) {
        return Ok(());
    }
    let name = planned.name();
    let message = match (tests.is_empty(), nodes) {
        (true, _) => format!(
            "image `{name}` has no smoke test (its spec has no `[[smoke]]`): nothing was run"
        ),
        (false, [node]) if node.name == *builder => format!(
            "none of image `{name}`'s {} smoke test(s) runs on the builder `{builder}`: they are `on = \"nodes\"`; nothing was run",
            tests.len()
        ),
        (false, _) => format!(
            "none of image `{name}`'s {} smoke test(s) runs on {}: they are `on = \"builder\"`; nothing was run",
            tests.len(),
            nodes
                .iter()
                .map(|n| format!("`{}`", n.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let hint = match tests.is_empty() {
        true => "add a `[[smoke]]` test to the spec (docs/spec.md, smoke)".to_string(),
        false if nodes.iter().all(|n| n.name == *builder) => {
            "name a node with --node N, or every node with --all-nodes".to_string()
        }
        false => format!("run them on the builder: `hallmark smoke {name}`"),
    };
    Err(Error::Usage {
        message,
        hint: Some(hint),
    })
}

/// The smoke tests of each image on its node, all at once (`distribute --smoke`): a line per
/// test passed, and the failures together.
pub(super) fn on_nodes(
    settings: &Settings,
    runs: &[(&PlannedImage, &crate::inputs::config::NodeConfig)],
) -> (Vec<ImageResult>, Result<()>) {
    let outcomes = match runtime() {
        Ok(runtime) => runtime.block_on(futures_util::future::join_all(
            runs.iter()
                .map(|(planned, node)| smoke_on(settings, planned, node)),
        )),
        Err(e) => return (Vec::new(), Err(e)),
    };
    let mut failed = Vec::new();
    let mut rows = Vec::new();
    for ((planned, node), (results, outcome)) in runs.iter().zip(outcomes) {
        for result in results.iter().filter(|r| r.passed) {
            settings.output.note(format!(
                "smoke passed  {:<12} {} `{}` ({:.1} s)",
                node.name,
                planned.name(),
                result.name,
                result.seconds
            ));
        }
        if let Err(e) = &outcome {
            rows.push(ImageResult {
                image: planned.name().to_string(),
                node: node.name.to_string(),
                passed: Some(false),
                result: None,
                error: Some(crate::error::plain_text(&e.to_string())),
            });
        }
        rows.extend(results.into_iter().map(|result| ImageResult {
            image: planned.name().to_string(),
            node: node.name.to_string(),
            passed: None,
            result: Some(result),
            error: None,
        }));
        if let Err(e) = outcome {
            failed.push(e);
        }
    }
    let outcome = match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(Error::Many(failed)),
    };
    (rows, outcome)
}

/// A smoke result of `distribute --smoke --json`: the image and node, and the test's result
/// (`name`, `passed`, ... as `smoke --json` has them), or why the tests could not run there
/// (`passed: false` and `error`, no `name`).
#[derive(serde::Serialize)]
pub(super) struct ImageResult {
    image: String,
    node: String,
    /// Only on a row without a result (the result carries its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    passed: Option<bool>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    result: Option<build::SmokeResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A smoke result with the node it ran on (`--json` rows).
#[derive(serde::Serialize)]
struct NodeResult<'a> {
    node: String,
    #[serde(flatten)]
    result: &'a build::SmokeResult,
}

/// The image's smoke tests on `node` (those `on` it: the builder, or the nodes), on the image
/// hallmark finished there.
async fn smoke_on(
    settings: &Settings,
    planned: &PlannedImage,
    node: &crate::inputs::config::NodeConfig,
) -> (Vec<build::SmokeResult>, Result<()>) {
    let mut results = Vec::new();
    let on_builder = node.name == settings.config.builder.name;
    let outcome = async {
        let engine = connect(settings, node).await?;
        let builder = match on_builder {
            true => None,
            false => Some(connect(settings, &settings.config.builder).await?),
        };
        let store = LayerStore::open(&settings.cache);
        let trusted = trusted_image(
            builder.as_ref(),
            &engine,
            &store,
            planned,
            &settings.checksum_label,
        );
        let id = with_deadline_or_interrupt(&engine, trusted).await?;
        let work = async {
            (
                (),
                build::smoke(
                    &engine,
                    planned,
                    &id,
                    &mut results,
                    on_builder,
                    node.emulate,
                )
                .await,
            )
        };
        until_interrupted(&engine, "the smoke tests", work).await.1
    }
    .await;
    (results, outcome)
}

/// The question before a smoke test, ended by Ctrl-C or SIGTERM like the tests themselves.
async fn with_deadline_or_interrupt<T>(
    engine: &Engine,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        done = work => done,
        _ = super::interrupted() => Err(Error::Interrupted {
            what: format!("the smoke tests on node `{}`", engine.node),
        }),
    }
}
