//! The JSON Schemas of docs/schema/ against real `--json` documents: each schema is a valid
//! draft 2020-12 schema linked from docs/json.md, and what the commands print (offline, and
//! on the testbed's real engines) validates against it. A schema that drifts from the code
//! fails here, not in a reader's script.

use crate::support;

use serde_json::Value;
use std::path::Path;
use support::{Testbed, unique};

/// Every document hallmark prints with `--json`: its schema file's stem.
const SCHEMAS: [&str; 12] = [
    "build",
    "bump",
    "bump-pins",
    "caches",
    "check",
    "checksum",
    "distribute",
    "nodes",
    "patches",
    "smoke",
    "status",
    "verify",
];

fn schema(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schema")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The errors of `document` against schema `name`, one line each (empty: it validates).
fn errors(name: &str, document: &Value) -> Vec<String> {
    let validator = jsonschema::draft202012::new(&schema(name))
        .unwrap_or_else(|e| panic!("docs/schema/{name}.json does not compile: {e}"));
    validator
        .iter_errors(document)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .collect()
}

/// `run`'s stdout, one JSON document valid against schema `name`; returns it.
fn valid(name: &str, run: &support::Run) -> Value {
    let stdout = run.stdout();
    let document: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not json ({e}): {stdout}\n{}", run.stderr()));
    let errors = errors(name, &document);
    assert!(
        errors.is_empty(),
        "the {name} document does not match docs/schema/{name}.json:\n{}\n{document:#}",
        errors.join("\n")
    );
    document
}

/// The rows under `key`, which must not be empty: a schema checked against no rows checks
/// nothing of them.
fn rows<'a>(document: &'a Value, key: &str) -> &'a Vec<Value> {
    let rows = document[key]
        .as_array()
        .unwrap_or_else(|| panic!("{document:#}"));
    assert!(!rows.is_empty(), "no rows under `{key}`: {document:#}");
    rows
}

#[test]
fn every_schema_is_draft_2020_12_pins_version_1_and_is_linked_from_json_md() {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/json.md"))
        .unwrap();
    let on_disk: std::collections::BTreeSet<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    let listed: std::collections::BTreeSet<String> =
        SCHEMAS.iter().map(|n| format!("{n}.json")).collect();
    assert_eq!(
        on_disk, listed,
        "docs/schema/ holds exactly the schemas tested here"
    );
    for name in SCHEMAS {
        let schema = schema(name);
        if let Err(e) = jsonschema::draft202012::meta::validate(&schema) {
            panic!("docs/schema/{name}.json is not a draft 2020-12 schema: {e}");
        }
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
        assert_eq!(schema["properties"]["version"]["const"], 1, "{name}");
        assert_eq!(schema["additionalProperties"], false, "{name}");
        assert!(
            docs.contains(&format!("(schema/{name}.json)")),
            "docs/json.md links docs/schema/{name}.json"
        );
    }
    // Closed rows refuse a field the code does not print, and a version other than 1.
    let row = serde_json::json!({"checksum": "0".repeat(64), "image": "hello"});
    let good = serde_json::json!({"version": 1, "images": [row]});
    assert_eq!(errors("checksum", &good), Vec::<String>::new());
    let mut extra = good.clone();
    extra["images"][0]["extra"] = Value::Bool(true);
    assert!(!errors("checksum", &extra).is_empty());
    let mut version = good.clone();
    version["version"] = 2.into();
    assert!(!errors("checksum", &version).is_empty());
}

/// check, checksum, patches import, report and refresh, and bump of a git source, on real git
/// repositories made here: no engine.
#[test]
fn offline_documents_match_their_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = crate::patches::upstream(dir.path());
    let project = crate::patches::project_at(&upstream, "v1", &upstream.v1);
    let url = upstream.repo.url();

    let import = project.run(&["--json", "patches", "import", "dcp", &url, "v1..dcp"]);
    assert_eq!(import.code(), 0, "{}", import.stderr());
    rows(&valid("patches", &import), "patches");

    let check = project.run(&["--json", "check", "app"]);
    assert_eq!(check.code(), 0, "{}", check.stderr());
    rows(&valid("check", &check), "passed");
    let checksum = project.run(&["--json", "checksum", "app"]);
    assert_eq!(checksum.code(), 0, "{}", checksum.stderr());
    rows(&valid("checksum", &checksum), "images");

    // At v2: offset, upstream, three-way and conflicts rows, with their offsets, conflicts
    // and `after`.
    let report = project.run(&["--json", "patches", "report", "app", "--rev", "v2"]);
    assert_eq!(report.code(), 1, "{}", report.stderr());
    let statuses: std::collections::BTreeSet<String> = rows(&valid("patches", &report), "patches")
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect();
    assert!(statuses.len() >= 4, "{statuses:?}");
    let refresh = project.run(&["--json", "patches", "refresh", "app", "--rev", "v2"]);
    assert_eq!(refresh.code(), 1, "{}", refresh.stderr());
    rows(&valid("patches", &refresh), "patches");

    // Pinned at v2, where the series does not apply: `problems`.
    let pins = project.read("pins/app.toml");
    project.write("pins/app.toml", &pins.replace(&upstream.v1, &upstream.v2));
    let failed = project.run(&["--json", "check", "app"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    rows(&valid("check", &failed), "problems");

    // bump of a git source: a run that applies, one that conflicts from commit 5 on.
    let history = tempfile::tempdir().unwrap();
    let a = (1..=20)
        .map(|n| format!("a line {n}\n"))
        .collect::<String>();
    let broken = a.replace("a line 10\n", "a line 10 changed upstream\n");
    let (repo, commits) = crate::bump::simple_history(history.path(), 8, |k| match k {
        5 => vec![("a.txt".to_string(), broken.clone())],
        _ => Vec::new(),
    });
    let project = crate::bump::project_on(&repo, &commits[0]);
    crate::bump::a_patch(&project);
    let bump = project.run(&["--json", "bump", "app", "--dry-run"]);
    assert_eq!(bump.code(), 0, "{}", bump.stderr());
    let document = valid("bump", &bump);
    rows(&document, "tried");
    assert!(document["bump"]["chosen"].is_object(), "{document:#}");
}

/// build, smoke, distribute, verify, status, nodes, caches and bump --wheel on the testbed's
/// real engines, with a node that cannot be reached (`failed`, `unreachable` and `down`
/// rows), an image whose build fails (a record with `error`) and one without pins
/// (`unplanned`); `lock` prints no document (docs/json.md).
#[test]
fn engine_documents_match_their_schemas() {
    let testbed = Testbed::get();
    let project = support::ship_project(1, &unique());
    let run = unique();
    project
        .write("pins/broken.toml", &project.read("pins/base.toml"))
        .write(
            "images/broken/image.toml",
            &format!(
                "[image]\nname = \"broken-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\nrun = [\"exit 3\"]\n"
            ),
        )
        .write(
            "images/loose/image.toml",
            &format!("[image]\nname = \"loose-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n"),
        );
    let mut gone = std::fs::read_to_string(testbed.config()).unwrap();
    gone.push_str("\n[[node]]\nname = \"gone\"\nengine = \"unix:///nonexistent/docker.sock\"\n");
    let config = project.root().join("with-gone.toml");
    std::fs::write(&config, gone).unwrap();
    let on = project.with_config(&config);

    let build = on.run(&["--json", "build", "wrap"]);
    assert_eq!(build.code(), 0, "{}", build.stderr());
    let records = valid("build", &build);
    assert_eq!(rows(&records, "records").len(), 2, "{records:#}");
    let failed = on.run(&["--json", "build", "broken"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let records = valid("build", &failed);
    assert_eq!(
        rows(&records, "records")[0]["outcome"],
        "failed",
        "{records:#}"
    );
    let smoke = on.run(&["--json", "smoke", "wrap"]);
    assert_eq!(smoke.code(), 0, "{}", smoke.stderr());
    rows(&valid("smoke", &smoke), "results");
    let distribute = on.run(&["--json", "distribute", "wrap"]);
    assert_eq!(distribute.code(), 1, "{}", distribute.stderr());
    let shipped = valid("distribute", &distribute);
    rows(&shipped, "images");
    support::assert_fails_alone(&shipped["images"], "gone", None, &[]);
    let verify = on.run(&["--json", "verify", "wrap"]);
    assert_eq!(verify.code(), 1, "{}", verify.stderr());
    rows(&valid("verify", &verify), "holdings");
    // `base` was never distributed, `broken` never built, `loose` has no pins: every word
    // but `stale`, `mismatch` and the interrupted or unsigned ones.
    let status = on.run(&["--json", "status"]);
    assert_eq!(status.code(), 0, "{}", status.stderr());
    let states: std::collections::BTreeSet<String> = rows(&valid("status", &status), "holdings")
        .iter()
        .map(|r| r["state"].as_str().unwrap().to_string())
        .collect();
    let expected = ["current", "missing", "unplanned", "unreachable"];
    assert!(expected.iter().all(|s| states.contains(*s)), "{states:?}");
    let nodes = on.run(&["--json", "nodes"]);
    assert_eq!(nodes.code(), 1, "{}", nodes.stderr());
    let nodes = valid("nodes", &nodes);
    assert_eq!(
        support::row(&nodes["nodes"], "gone")["reachable"],
        false,
        "{nodes:#}"
    );
    // The builder's compile caches: other tests' (or none); the shape is what is checked.
    let caches = on.run(&["--json", "caches"]);
    assert_eq!(caches.code(), 0, "{}", caches.stderr());
    valid("caches", &caches);

    let config = testbed.config();
    let (project, wheels) = crate::bump_pins::wheel_project(&unique());
    let pip = [
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", wheels.to_str().unwrap()),
    ];
    let on = project.with_config(&config);
    let lock = on.run_with(&["--json", "lock", "py"], &pip);
    lock.success();
    assert_eq!(lock.stdout(), "", "lock prints no document");
    let bump = on.run_with(
        &["--json", "bump", "py", "--wheel", "hmbump", "--dry-run"],
        &pip,
    );
    assert_eq!(bump.code(), 0, "{}", bump.stderr());
    let document = valid("bump-pins", &bump);
    rows(&document, "tried");
    assert_eq!(document["bump"]["what"], "wheel", "{document:#}");
}
