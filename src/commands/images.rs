//! Commands that make and try images on the builder: build, smoke.

use super::{Session, runtime};
use crate::build::{self, BuildSettings};
use crate::check;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::plan::{Plan, PlannedImage};
use crate::project::cache_dir;
use crate::values::Name;

pub(super) fn build_command(
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
    let (records, outcome) = runtime()?.block_on(async {
        let engine = session.engine(&session.config.builder).await?;
        let work = async {
            if !check_repro {
                return build::build_all(&engine, &plan, &settings).await;
            }
            let mut records = Vec::new();
            for name in &names {
                let (mut pair, found) =
                    match crate::repro::check(&engine, &plan, name, &settings).await {
                        Ok(done) => done,
                        Err(error) => return (records, Err(error)),
                    };
                for record in &mut pair {
                    record.reproducible = Some(found.is_empty());
                    record.differences = found.clone();
                }
                differences.extend(found.into_iter().map(|d| format!("{name}: {d}")));
                records.extend(pair);
            }
            (records, Ok(()))
        };
        Ok::<_, Error>(until_interrupted(&engine, "the build", work).await)
    })?;
    if session.json {
        println!("{}", serde_json::to_string_pretty(&records).expect("json"));
    }
    outcome?;
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

pub(super) fn smoke_command(
    session: &Session,
    image: &str,
    node: Option<&str>,
    junit: Option<&std::path::Path>,
) -> Result<u8> {
    let name = session.project.image_name(image)?;
    let plan = Plan::new(&session.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let node = session.node(node)?;
    let mut results = Vec::new();
    let outcome = runtime()?.block_on(async {
        let engine = session.engine(node).await?;
        let id = tagged_image(&engine, planned, &session.config.checksum_label).await?;
        let work = async { ((), build::smoke(&engine, planned, &id, &mut results).await) };
        until_interrupted(&engine, "the smoke tests", work).await.1
    });
    // CI reads the report whatever happened: an unreachable node or a missing image is an
    // `<error>` case in it, not a missing file.
    if let Some(path) = junit {
        let xml = junit_xml(&name, &node.name, &results, &outcome);
        fs_err::write(path, xml).map_err(|e| Error::io(path, e))?;
    }
    if session.json {
        println!("{}", serde_json::to_string_pretty(&results).expect("json"));
    }
    outcome?;
    for result in &results {
        session.note(format!("passed  {} ({:.1} s)", result.name, result.seconds));
    }
    Ok(0)
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

/// Runs `work`; on Ctrl-C, drops it, removes the containers it started on `engine` and gives
/// `Error::Interrupted` (the work's own cleanup would never run once it is dropped).
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
        _ = tokio::signal::ctrl_c() => {
            engine.remove_live_containers().await;
            (T::default(), Err(Error::Interrupted { what: format!("{what} on node `{}`", engine.node) }))
        }
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
    node: &Name,
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
    let tests = results.len() + errors;
    let node = xml_escape(node.as_str());
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"hallmark smoke {image} on {node}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\">\n{cases}  </testsuite>\n</testsuites>\n"
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
        let xml = junit_xml(&name, &name, &[result], &outcome);
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
            xml.contains("tests=\"2\" failures=\"1\" errors=\"1\""),
            "{xml}"
        );
    }
}
