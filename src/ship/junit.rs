//! JUnit XML of smoke tests for CI (`smoke --junit`): one testcase per test run, the failed
//! one with its output, an error before or between tests an `<error>` case, the tests never
//! run skipped; text made XML 1.0 whatever the test printed.

use crate::error::{Error, Result};
use crate::inputs::values::Name;
use crate::make::build;
use crate::plan::PlannedImage;

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
pub fn junit_xml(
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
        // JUnit's `<properties>` inside a testcase: CI shows that the test ran emulated.
        let mut inner = match r.emulated {
            true => "\n      <properties><property name=\"emulated\" value=\"true\"/></properties>"
                .to_string(),
            false => String::new(),
        };
        if !r.passed {
            failures += 1;
            inner.push_str(&format!(
                "\n      <failure message=\"exit {}\">{}</failure>",
                r.exit_code,
                xml_escape(&r.output)
            ));
        }
        inner.push_str(&logs);
        match inner.is_empty() {
            true => cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\"/>\n",
                r.seconds
            )),
            false => cases.push_str(&format!(
                "    <testcase classname=\"{image}\" name=\"{name}\" time=\"{:.3}\">{inner}\n    </testcase>\n",
                r.seconds
            )),
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
            emulated: true,
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
        assert!(
            xml.contains("<property name=\"emulated\" value=\"true\"/>"),
            "{xml}"
        );
    }
}
