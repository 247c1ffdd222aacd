//! `hallmark smoke`: an image's smoke tests on a node (default: the builder), with a JUnit
//! report for CI.

use super::{connect, runtime, until_interrupted};
use crate::commands::settings::Settings;
use crate::engine::Engine;
use crate::error::{Error, ExitStatus, Result};
use crate::inputs::values::Name;
use crate::make::build;
use crate::plan::{Plan, PlannedImage};

pub(super) fn run(
    settings: &Settings,
    image: &str,
    node: Option<&str>,
    junit: Option<&std::path::Path>,
) -> Result<ExitStatus> {
    let name = settings.project.image_name(image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let node = settings.node(node)?;
    let mut results = Vec::new();
    let outcome = runtime()?.block_on(async {
        let engine = connect(settings, node).await?;
        let id = tagged_image(&engine, planned, &settings.checksum_label).await?;
        let work = async { ((), build::smoke(&engine, planned, &id, &mut results).await) };
        until_interrupted(&engine, "the smoke tests", work).await.1
    });
    // CI reads the report whatever happened: an unreachable node or a missing image is an
    // `<error>` case in it, not a missing file.
    if let Some(path) = junit {
        let declared: Vec<&str> = planned
            .loaded
            .spec
            .smokes
            .iter()
            .map(|t| t.name.get_ref().as_str())
            .collect();
        let xml = junit_xml(&name, &node.name, &declared, &results, &outcome);
        fs_err::write(path, xml).map_err(|e| Error::io(path, e))?;
    }
    if settings.output.json {
        settings.output.json("results", &results);
    }
    outcome?;
    for result in &results {
        settings
            .output
            .note(format!("passed  {} ({:.1} s)", result.name, result.seconds));
    }
    Ok(ExitStatus::Success)
}

/// The image `smoke` tests: the one the tag names, if it carries the expected checksum. An
/// image elsewhere on the node with the same label is not what a user of the tag runs.
async fn tagged_image(engine: &Engine, planned: &PlannedImage, label: &str) -> Result<String> {
    let reference = planned.loaded.reference();
    let Some(tagged) = engine.inspect(&reference).await? else {
        return Err(engine.error(format!(
            "holds no image tagged {reference} for `{}`",
            planned.name()
        )));
    };
    let found = tagged.label(label);
    if found != Some(planned.checksum.as_str()) {
        return Err(engine.error(format!(
            "{reference} is not the current build of `{}`: it carries {} as `{label}`, the spec's checksum is {}",
            planned.name(),
            found.map_or("no checksum".to_string(), |f| format!("`{f}`")),
            planned.checksum
        )));
    }
    tagged
        .id()
        .map(str::to_string)
        .ok_or_else(|| engine.error(format!("{reference} has no image id")))
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
        if r.passed {
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\"/>\n",
                r.seconds
            ));
        } else {
            failures += 1;
            cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\">\n      <failure message=\"exit {}\">{}</failure>\n    </testcase>\n",
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
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"hallmark smoke {image} on {node}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">\n{cases}  </testsuite>\n</testsuites>\n"
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
        };
        let outcome = Err(Error::Interrupted {
            what: "the \u{1b}[1msmoke\u{1b}[0m tests".into(),
        });
        let name = Name::try_from("img".to_string()).unwrap();
        let declared = ["quotes \"'<&>", "never ran"];
        let xml = junit_xml(&name, &name, &declared, &[result], &outcome);
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        assert!(
            !xml.chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{xml:?}"
        );
        assert!(xml.contains("red a &lt; b &amp; c"), "{xml}");
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
