//! Commands that make and try images on the builder: build, smoke.

use super::{Session, runtime};
use crate::build::{self, BuildSettings};
use crate::check;
use crate::error::{Error, Result};
use crate::plan::Plan;
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
        build::smoke(&engine, planned, id).await
    });
    // CI reads the report whatever happened: an unreachable node or a missing image is an
    // `<error>` case in it, not a missing file.
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
