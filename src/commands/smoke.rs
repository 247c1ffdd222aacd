//! `hallmark smoke`: an image's smoke tests on a node (default: the builder), with a JUnit
//! report for CI.

use super::{connect, runtime, until_interrupted};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::images::store::LayerStore;
use crate::inputs::values::Name;
use crate::make::build;
use crate::plan::{Plan, PlannedImage};
use crate::ship;
use crate::ship::verify::{self, Holding};

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
    // Every node at once, each with its own engine and deadlines: a stuck node fails alone.
    let runs = runtime()?.block_on(futures_util::future::join_all(
        nodes.iter().map(|node| smoke_on(settings, planned, node)),
    ));
    // CI reads the report whatever happened: an unreachable node or a missing image is an
    // `<error>` case in it, not a missing file.
    if let Some(path) = junit {
        let xml = junit_xml(&name, &settings.config.builder.name, &nodes, &runs, planned);
        fs_err::write(path, xml).map_err(|e| Error::io(path, e))?;
    }
    if settings.output.json {
        let rows: Vec<_> = (nodes.iter().zip(&runs))
            .flat_map(|(node, (results, _))| {
                results.iter().map(move |r| NodeResult {
                    node: node.name.to_string(),
                    result: r,
                })
            })
            .collect();
        settings.output.json("results", &rows);
    }
    let mut failed = Vec::new();
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

/// The smoke tests of each image on its node, all at once (`distribute --smoke`): a line per
/// test passed, and the failures together.
pub(super) fn on_nodes(
    settings: &Settings,
    runs: &[(&PlannedImage, &crate::inputs::config::NodeConfig)],
) -> Result<()> {
    let outcomes = runtime()?.block_on(futures_util::future::join_all(
        runs.iter()
            .map(|(planned, node)| smoke_on(settings, planned, node)),
    ));
    let mut failed = Vec::new();
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
        if let Err(e) = outcome {
            failed.push(e);
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(Error::Many(failed)),
    }
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
        let trusted = trusted_image(builder.as_ref(), &engine, &store, planned, settings);
        let id = with_deadline_or_interrupt(&engine, trusted).await?;
        let work = async {
            (
                (),
                build::smoke(&engine, planned, &id, &mut results, on_builder).await,
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

/// The id of the image `smoke` may test on `engine`: the one a user of the tag runs, and only
/// if hallmark finished it. The rule is `distribute`'s and `verify`'s, by the same functions:
/// the builder's image under the tag must be one hallmark recorded finishing for the spec's
/// checksum ([`ship::shipment`]), and a node (`builder` is then the builder's engine) must
/// hold that very image ([`verify::holding`] says `current`). A label alone proves nothing: a
/// plain `docker build` can copy it.
async fn trusted_image(
    builder: Option<&Engine>,
    engine: &Engine,
    store: &LayerStore,
    planned: &PlannedImage,
    settings: &Settings,
) -> Result<String> {
    let reference = planned.loaded.reference();
    let label = &settings.checksum_label;
    let on_builder = builder.unwrap_or(engine);
    let shipment = ship::shipment(
        on_builder,
        store,
        &reference,
        label,
        planned.checksum.as_str(),
    );
    if builder.is_none() {
        return Ok(shipment.await?.image_id);
    }
    // The node is asked whatever the builder answers: what it holds is what the user runs.
    let (shipment, held) = futures_util::future::join(shipment, async {
        let unknown = verify::Wanted {
            reference: reference.clone(),
            checksum: planned.checksum.to_string(),
            fingerprint: String::new(),
            ids: Vec::new(),
        };
        verify::holding(engine, label, &unknown).await
    })
    .await;
    if held.as_ref().is_ok_and(|h| h.state == Holding::Missing) {
        return Err(engine.error(format!(
            "holds no image tagged {reference} for `{}`",
            planned.name()
        )));
    }
    let shipment = shipment.map_err(|e| {
        engine.error(format!(
            "cannot tell whether it holds the current build of `{}`: the builder cannot vouch for it: {e}",
            planned.name()
        ))
    })?;
    let held = verify::holding(engine, label, &shipment.wanted(store)).await?;
    match (&held.state, held.image_id) {
        (Holding::Current, Some(id)) => Ok(id),
        (state, _) => Err(engine.error(format!(
            "{reference} is not the current build of `{}` that hallmark finished on the builder: {}{}",
            planned.name(),
            crate::output::cell(state),
            held.detail.map(|d| format!(" ({d})")).unwrap_or_default()
        ))),
    }
}

/// Text as XML 1.0 character data or attribute value: markup escaped, and the characters
/// XML 1.0 cannot carry at all (escape sequences, NUL, other controls) dropped.
fn xml_escape(text: &str) -> String {
    crate::error::plain_text(text)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
        .chars()
        .filter(|c| !matches!(c, '\u{FFFE}' | '\u{FFFF}'))
        .collect()
}

/// JUnit XML for CI: one testcase per smoke test run, the failed one with its output; an
/// error before or between tests (unreachable node, no such image) is an `<error>` case.
fn junit_xml(
    image: &Name,
    builder: &Name,
    nodes: &[&crate::inputs::config::NodeConfig],
    runs: &[(Vec<build::SmokeResult>, Result<()>)],
    planned: &PlannedImage,
) -> String {
    let suites: String = (nodes.iter().zip(runs))
        .map(|(node, (results, outcome))| {
            let on_builder = node.name == *builder;
            let declared: Vec<&str> = (planned.loaded.spec.smokes.iter())
                .filter(|t| t.runs_on(on_builder))
                .map(|t| t.name.get_ref().as_str())
                .collect();
            junit_suite(image, &node.name, &declared, results, outcome)
        })
        .collect();
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n{suites}</testsuites>\n")
}

/// One node's `<testsuite>`.
fn junit_suite(
    image: &Name,
    node: &Name,
    declared: &[&str],
    results: &[build::SmokeResult],
    outcome: &Result<()>,
) -> String {
    let image = xml_escape(image.as_str());
    let mut cases = String::new();
    let mut failures = 0;
    let mut errors = 0;
    for r in results {
        let name = xml_escape(&r.name);
        // A served test's process output, as CI tools show a test's output.
        let logs = match r.logs.is_empty() {
            true => String::new(),
            false => format!(
                "\n      <system-out>{}</system-out>",
                xml_escape(&r.logs.join("\n"))
            ),
        };
        if r.passed && logs.is_empty() {
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\"/>\n",
                r.seconds
            ));
        } else if r.passed {
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\">{logs}\n    </testcase>\n",
                r.seconds
            ));
        } else {
            failures += 1;
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\">\n      <failure message=\"exit {}\">{}</failure>{logs}\n    </testcase>\n",
                r.seconds,
                r.exit_code,
                xml_escape(&r.output)
            ));
        }
    }
    if let Err(error) = outcome
        && !matches!(error, Error::SmokeFailed { .. })
    {
        errors += 1;
        cases.push_str(&format!(
            "    <testcase classname=\"{image}\" name=\"smoke\">\n      <error message=\"{}\"/>\n    </testcase>\n",
            xml_escape(&error.to_string())
        ));
    }
    // The spec's tests that did not run (a test before them failed, the node went away):
    // listed as skipped, so CI shows every test the spec has (they were left out).
    let mut skipped = 0;
    for name in declared
        .iter()
        .filter(|d| !results.iter().any(|r| r.name == **d))
    {
        skipped += 1;
        cases.push_str(&format!(
            "    <testcase classname=\"{image}\" name=\"{}\">\n      <skipped message=\"not run: an earlier test failed or the run stopped\"/>\n    </testcase>\n",
            xml_escape(name)
        ));
    }
    let tests = results.len() + errors + skipped;
    let node = xml_escape(node.as_str());
    format!(
        "  <testsuite name=\"hallmark smoke {image} on {node}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">\n{cases}  </testsuite>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_reports_are_xml_whatever_the_smoke_test_printed() {
        let result = build::SmokeResult {
            name: "quotes \"'<&>".into(),
            passed: false,
            exit_code: 3,
            seconds: 0.5,
            output: "\u{1b}[31mred\u{1b}[0m\u{0}\u{7} a < b & c\r\n".into(),
            logs: vec!["served <log>".into()],
        };
        let outcome = Err(Error::Interrupted {
            what: "the \u{1b}[1msmoke\u{1b}[0m tests".into(),
        });
        let name = Name::try_from("img".to_string()).unwrap();
        let declared = ["quotes \"'<&>", "never ran"];
        let xml = junit_suite(&name, &name, &declared, &[result], &outcome);
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        assert!(
            !xml.chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{xml:?}"
        );
        assert!(xml.contains("red a &lt; b &amp; c"), "{xml}");
        assert!(
            xml.contains("<system-out>served &lt;log&gt;</system-out>"),
            "{xml}"
        );
        assert!(
            xml.contains("name=\"quotes &quot;&apos;&lt;&amp;&gt;\""),
            "{xml}"
        );
        assert!(
            xml.contains("tests=\"3\" failures=\"1\" errors=\"1\" skipped=\"1\""),
            "{xml}"
        );
        assert!(xml.contains("name=\"never ran\">\n      <skipped"), "{xml}");
    }
}
