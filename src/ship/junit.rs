//! JUnit XML of smoke tests for CI (`smoke --junit`): one testcase per test of the spec on
//! each node, the failed one with its output, one that could not run with the error, the
//! ones after a failure skipped naming it; text made XML 1.0 whatever the test printed.

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
            let declared = declared(planned, node.name == *builder);
            junit_suite(image, &node.name, &declared, results, outcome)
        })
        .collect();
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n{suites}</testsuites>\n")
}

/// The names of the image's tests that run on the builder (`on_builder`) or on a node.
pub fn declared(planned: &PlannedImage, on_builder: bool) -> Vec<&str> {
    (planned.loaded.spec.smokes.iter())
        .filter(|t| t.runs_on(on_builder))
        .map(|t| t.name.get_ref().as_str())
        .collect()
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
    let (unrun, unrun_errors, skipped) =
        unrun_cases(&image, declared, results, outcome, &mut cases);
    errors += unrun_errors;
    let tests = results.len() + unrun;
    let node = xml_escape(node.as_str());
    format!(
        "  <testsuite name=\"hallmark smoke {image} on {node}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">\n{cases}  </testsuite>\n"
    )
}

/// Why a declared test did not run on a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unrun {
    pub name: String,
    /// An error (it could not run: no image, unreachable, refused to start, a signal), or
    /// skipped (a test before it failed or could not run).
    pub error: bool,
    pub reason: String,
}

/// The declared tests that did not run, each with its own reason: the error that stopped the
/// run (a test the engine refused to start, the node went away, a signal) is the first unrun
/// test's, and the ones after it are skipped, naming it; with no result at all, nothing could
/// run there (no image, unreachable), and that error is every test's; after a failed test,
/// the rest are skipped naming it.
pub fn unrun(
    declared: &[&str],
    results: &[build::SmokeResult],
    outcome: &Result<()>,
) -> Vec<Unrun> {
    let stopped = match outcome {
        Err(error) if !matches!(error, Error::SmokeFailed { .. }) => Some(error.to_string()),
        _ => None,
    };
    let failed = results.iter().find(|r| !r.passed).map(|r| r.name.as_str());
    let names: Vec<&str> = (declared.iter().copied())
        .filter(|d| !results.iter().any(|r| r.name == *d))
        .collect();
    let reason = |i: usize| match (&stopped, failed) {
        (Some(error), _) if i == 0 || results.is_empty() => (true, error.clone()),
        (Some(_), _) => (
            false,
            format!("not run: `{}` could not run before it", names[0]),
        ),
        (None, Some(failed)) => (false, format!("not run: `{failed}` failed before it")),
        (None, None) => (false, "not run: the run stopped before it".to_string()),
    };
    (names.iter().enumerate())
        .map(|(i, name)| {
            let (error, reason) = reason(i);
            Unrun {
                name: name.to_string(),
                error,
                reason,
            }
        })
        .collect()
}

/// The testcases of the declared tests that did not run (`unrun`), appended to `cases`: how
/// many, and how many of them are errors and skipped.
fn unrun_cases(
    image: &str,
    declared: &[&str],
    results: &[build::SmokeResult],
    outcome: &Result<()>,
    cases: &mut String,
) -> (usize, usize, usize) {
    let unrun = unrun(declared, results, outcome);
    let (mut errors, mut skipped) = (0, 0);
    for test in &unrun {
        let inner = match test.error {
            true => {
                errors += 1;
                format!("<error message=\"{}\"/>", xml_escape(&test.reason))
            }
            false => {
                skipped += 1;
                format!("<skipped message=\"{}\"/>", xml_escape(&test.reason))
            }
        };
        cases.push_str(&format!(
            "    <testcase classname=\"{image}\" name=\"{}\">\n      {inner}\n    </testcase>\n",
            xml_escape(&test.name)
        ));
    }
    (unrun.len(), errors, skipped)
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
            xml.contains("tests=\"2\" failures=\"1\" errors=\"1\" skipped=\"0\""),
            "{xml}"
        );
        // The test the interrupt stopped before carries the interrupt; no case is invented.
        assert!(
            xml.contains("name=\"never ran\">\n      <error message=\"interrupted"),
            "{xml}"
        );
        assert!(!xml.contains("name=\"smoke\""), "{xml}");
        assert!(
            xml.contains("<property name=\"emulated\" value=\"true\"/>"),
            "{xml}"
        );
    }

    fn result(name: &str, passed: bool) -> build::SmokeResult {
        build::SmokeResult {
            name: name.into(),
            passed,
            exit_code: i64::from(!passed),
            seconds: 0.1,
            output: String::new(),
            logs: Vec::new(),
            emulated: false,
        }
    }

    #[test]
    fn every_declared_test_is_a_case_with_its_own_reason() {
        let name = Name::try_from("img".to_string()).unwrap();
        let declared = ["a", "b", "c"];
        // Nothing could run on the node: every test carries why.
        let unreachable = Err(Error::usage("node `n1` cannot be reached"));
        let xml = junit_suite(&name, &name, &declared, &[], &unreachable);
        assert_eq!(xml.matches("cannot be reached").count(), 3, "{xml}");
        assert!(
            xml.contains("tests=\"3\" failures=\"0\" errors=\"3\" skipped=\"0\""),
            "{xml}"
        );
        // A test failed: the ones after it are skipped, naming it.
        let failed = Err(Error::SmokeFailed {
            image: "img".into(),
            smoke: "a".into(),
            node: "n1".into(),
            code: 1,
            output: String::new(),
        });
        let xml = junit_suite(&name, &name, &declared, &[result("a", false)], &failed);
        assert_eq!(
            xml.matches("not run: `a` failed before it").count(),
            2,
            "{xml}"
        );
        assert!(
            xml.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"2\""),
            "{xml}"
        );
        // A test the engine refused to start is an error; the rest are skipped, naming it.
        let refused = Err(Error::usage("smoke test `b` could not run `x`"));
        let xml = junit_suite(&name, &name, &declared, &[result("a", true)], &refused);
        assert!(
            xml.contains("name=\"b\">\n      <error message=\"smoke test `b` could not run"),
            "{xml}"
        );
        assert!(
            xml.contains("not run: `b` could not run before it"),
            "{xml}"
        );
        assert!(
            xml.contains("tests=\"3\" failures=\"0\" errors=\"1\" skipped=\"1\""),
            "{xml}"
        );
    }
}
