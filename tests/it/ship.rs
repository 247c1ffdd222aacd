//! Shipping on the testbed: a builder and four nodes (Docker 20.10, 26 and 28, both image
//! stores, the last node over ssh; testbed.env says which is which). The tests here that
//! count on the default testbed's node state run one at a time; the one that kills a daemon
//! has a testbed of its own, since the other suites of the crate run beside these.

use crate::support;

use serde_json::Value;
use std::sync::Mutex;
use support::{TestProject, Testbed};

static NODES: Mutex<()> = Mutex::new(());

use support::{MIB, hallmark_json, nodes_of, reference, ship_project as project};

fn layer_count(testbed: &Testbed, node: &str, image: &str) -> usize {
    testbed
        .docker_ok(
            node,
            &[
                "image",
                "inspect",
                "--format",
                "{{len .RootFS.Layers}}",
                image,
            ],
        )
        .parse()
        .unwrap()
}

/// On a testbed of its own: it kills a node's daemon, which every other suite of the crate,
/// running at the same time, would see go down.
#[test]
fn thin_update_full_copy_skip_and_a_daemon_killed_mid_transfer() {
    let own = support::OwnTestbed::up(&["--nodes", "4"]);
    let testbed: &Testbed = &own;
    let config = testbed.config();
    let project = project(256, "v1");
    let (base, wrap) = (reference(&project, "base"), reference(&project, "wrap"));
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();

    // Every node first holds the base (a full copy where it has nothing of it).
    let (code, report) = hallmark_json(&project, &config, &["distribute", "base"]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["verified"], true, "{node}");
    }

    // The thin update: only the wrapper's layer crosses, to every node.
    let new_layers =
        layer_count(testbed, "builder", &wrap) - layer_count(testbed, "builder", &base);
    assert_eq!(new_layers, 1);
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let nodes = nodes_of(&report);
    assert_eq!(nodes.len(), 4);
    for node in &nodes {
        assert_eq!(node["action"], "thin", "{node}");
        assert_eq!(node["layers_sent"], new_layers, "{node}");
        let layer = node["layer_bytes"].as_u64().unwrap();
        let archive = node["archive_bytes"].as_u64().unwrap();
        assert!((4 * MIB..5 * MIB).contains(&layer), "{node}");
        assert!(
            archive as f64 <= 1.1 * layer as f64,
            "sent {archive} for {layer} missing: {node}"
        );
        assert_eq!(node["verified"], true, "{node}");
    }
    for node in testbed.nodes() {
        testbed.run_container(&node, &wrap, &["test", "-s", "/wrap.bin"]);
    }

    // Again: nothing to do anywhere.
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0);
    assert!(
        nodes_of(&report)
            .iter()
            .all(|n| n["action"] == "skipped" && n["archive_bytes"] == 0),
        "{report}"
    );

    // --full: a new version goes whole to every node, as `docker save | docker load` would.
    let spec = project.read("images/wrap/image.toml");
    project.write("images/wrap/image.toml", &spec.replace("\"v1\"", "\"v2\""));
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--full"]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["action"], "full", "{node}");
        assert!(
            node["archive_bytes"].as_u64().unwrap() >= 260 * MIB,
            "{node}"
        );
    }
    // A classic node, whose load can be seen under way (its unpack folder).
    let victim = testbed.node_of("20", "classic");
    let v2 = testbed.image_id(&victim, &wrap);

    // v3, whole again, and that node's daemon killed while it loads: it fails alone and keeps
    // v2.
    project.write("images/wrap/image.toml", &spec.replace("\"v1\"", "\"v3\""));
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let tmp = testbed.dir.join(&victim).join("data/tmp");
    let child = support::hallmark_at(&config)
        .args(["--json", "distribute", "wrap", "--full"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = testbed.env[&format!("HMTB_{}_PID", victim.to_uppercase())].clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    // Wait for the load to begin (the daemon unpacks into its tmp folder), then kill it.
    loop {
        let loading = std::fs::read_dir(&tmp)
            .map(|d| {
                d.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("docker-import-")
                })
            })
            .unwrap_or(false);
        if loading {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{victim} never started loading"
        );
        std::thread::yield_now();
    }
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = support::document(&String::from_utf8_lossy(&output.stdout));
    support::assert_fails_alone(&report, &victim, None, &[]);
    testbed.script("restart-node", &["--node", &victim]);
    assert_eq!(
        testbed.image_id(&victim, &wrap),
        v2,
        "{victim} lost its previous image"
    );

    // The re-run finishes that node only.
    support::assert_rerun_finishes_only(&project, &config, &victim, "thin");
}

#[test]
fn verify_fails_on_a_node_whose_content_differs_under_the_same_label() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = project(1, "forged");
    let wrap = reference(&project, "wrap");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let (code, _) = hallmark_json(
        &project,
        &config,
        &["distribute", "wrap", "--to", "node2,node3"],
    );
    assert_eq!(code, 0);
    let label = testbed.checksum_label("builder", &wrap);
    // node3 gets an image with the same label and other content, under the same tag.
    let forged = project.root().join("forged");
    std::fs::create_dir_all(&forged).unwrap();
    std::fs::write(
        forged.join("Dockerfile"),
        format!("FROM {wrap}\nRUN echo forged > /wrap.bin\nLABEL hallmark.checksum={label}\n"),
    )
    .unwrap();
    let built = std::process::Command::new("docker")
        .args(["-H", &testbed.endpoint("node3"), "build", "-q", "-t", &wrap])
        .arg(&forged)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let (code, report) = hallmark_json(
        &project,
        &config,
        &["verify", "wrap", "--nodes", "node2,node3"],
    );
    assert_eq!(code, 1, "{report}");
    let states: Vec<(String, String)> = report
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().into(),
                r["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            ("node2".into(), "current".into()),
            ("node3".into(), "mismatch".into())
        ]
    );
    // The row says what it may be, and what replaces it.
    let detail = support::row(&report, "node3")["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("not reproducible") && detail.contains("distribute"),
        "{report}"
    );
}

/// A node's image changed in its runtime config only (no layer, the label inherited): a
/// `HEALTHCHECK`, a `SHELL`, an `ONBUILD`. It is `mismatch`, and `distribute` replaces it; an
/// outside test saw each called `current` and skipped (the fingerprint counted nine fields).
/// On Docker 26 and 28 containerd and 20.10 classic nodes.
#[test]
fn a_node_image_changed_in_its_config_only_is_a_mismatch_and_is_replaced() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = project(1, "reconfigured");
    let wrap = reference(&project, "wrap");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let forged: [(String, &str); 3] = [
        (testbed.node_of("26", "containerd"), "ONBUILD RUN true"),
        (
            testbed.node_of("28", "containerd"),
            "HEALTHCHECK --interval=1s CMD false",
        ),
        (
            testbed.node_of("20", "classic"),
            "SHELL [\"/bin/sh\", \"-x\", \"-c\"]",
        ),
    ];
    let nodes: Vec<&str> = forged.iter().map(|(n, _)| n.as_str()).collect();
    let to = nodes.join(",");
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    for (node, instruction) in &forged {
        let dir = project.root().join(format!("forged-{node}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("Dockerfile"),
            format!("FROM {wrap}\n{instruction}\n"),
        )
        .unwrap();
        let built = std::process::Command::new("docker")
            .args(["-H", &testbed.endpoint(node), "build", "-q", "-t", &wrap])
            .arg(&dir)
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap", "--nodes", &to]);
    assert_eq!(code, 1, "{report}");
    for node in &nodes {
        assert_eq!(
            support::row(&report, node)["state"],
            "mismatch",
            "{node}: {report}"
        );
    }
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    for row in nodes_of(&report) {
        assert_ne!(row["action"], "skipped", "{row}");
        assert_eq!(row["verified"], true, "{row}");
    }
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap", "--nodes", &to]);
    assert_eq!(code, 0, "{report}");

    // And an honest image whose base sets a field the containerd store leaves out of its
    // inspect (`StopTimeout`): verified on every node kind (a second outside test saw it a
    // `mismatch`, failed on every distribute, when the fingerprint counted that field).
    let base = format!("stop-timeout-{}:latest", support::unique());
    let container = format!("stop-timeout-{}", support::unique());
    testbed.docker_ok(
        "builder",
        &[
            "create",
            "--name",
            &container,
            "--stop-timeout",
            "7",
            "hallmark-testbed/busybox:latest",
            "sh",
        ],
    );
    testbed.docker_ok("builder", &["commit", &container, &base]);
    testbed.docker_ok("builder", &["rm", &container]);
    let name = format!("timed-{}", support::unique());
    project.write(
        "images/timed/image.toml",
        &format!("[image]\nname = \"{name}\"\n\n[from]\nref = \"{base}\"\n\n[build]\nrun = [\"echo timed > /timed.txt\"]\n"),
    );
    project
        .with_config(&config)
        .run(&["-q", "lock", "timed"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "build", "timed"])
        .success();
    let (code, report) = hallmark_json(&project, &config, &["distribute", "timed", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    let (code, report) = hallmark_json(&project, &config, &["verify", "timed", "--nodes", &to]);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn an_unreachable_node_fails_alone() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let project = project(1, "unreachable");
    let mut config = std::fs::read_to_string(testbed.config()).unwrap();
    config.push_str("\n[[node]]\nname = \"gone\"\nengine = \"unix:///nonexistent/docker.sock\"\n");
    let path = project.root().join("hallmark.toml");
    std::fs::write(&path, config).unwrap();
    project
        .with_config(&path)
        .run(&["-q", "build", "wrap"])
        .success();
    let (code, report) = hallmark_json(
        &project,
        &path,
        &[
            "distribute",
            "wrap",
            "wrap",
            "--to",
            "node3,gone,node3",
            "--parallel",
        ],
    );
    assert_eq!(code, 1, "{report}");
    let nodes = nodes_of(&report);
    // Named twice, served once (two loads went into one engine at once).
    assert_eq!(nodes.len(), 2, "{report}");
    let gone = nodes.iter().find(|n| n["node"] == "gone").unwrap();
    assert_eq!(gone["action"], "failed");
    assert!(
        gone["error"].as_str().unwrap().contains("unreachable"),
        "{gone}"
    );
    let node3 = nodes.iter().find(|n| n["node"] == "node3").unwrap();
    assert_eq!(node3["verified"], true, "{node3}");
}

/// A builder of its own testbed (`builder_args`) builds the wrapper, ships the base, then
/// the wrapper as a thin update to every node (by default Docker 26 and 28 on the
/// containerd store, Docker 20.10 over ssh), then a new version through a registry.
fn thin_update_from_a_builder(builder_args: &[&str], base_mib: u64) {
    let mut args = vec!["--nodes", "3"];
    args.extend_from_slice(builder_args);
    let testbed = support::OwnTestbed::up(&args);
    let config = testbed.config();
    let project = project(base_mib, "builder");
    let wrap = reference(&project, "wrap");
    // The repo's pin (the base's config digest) serves every builder: no `lock` first.
    let (code, records) = hallmark_json(&project, &config, &["build", "wrap"]);
    assert_eq!(code, 0, "{records}");
    // A builder on this machine has its new layers read where it keeps them: a classic
    // store's directories, a containerd store's content store (no export, no reason why).
    let classic = !builder_args.contains(&"containerd");
    for record in records.as_array().unwrap() {
        let from = if classic {
            "layer directories"
        } else {
            "content store"
        };
        assert_eq!(record["normalized_from"], from, "{record}");
        assert_eq!(record["normalized_from_reason"], Value::Null, "{record}");
    }
    let (code, report) = hallmark_json(&project, &config, &["distribute", "base"]);
    assert_eq!(code, 0, "{report}");
    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let nodes = nodes_of(&report);
    assert_eq!(nodes.len(), 3);
    for node in &nodes {
        assert_eq!(node["action"], "thin", "{node}");
        let layer = node["layer_bytes"].as_u64().unwrap();
        let archive = node["archive_bytes"].as_u64().unwrap();
        assert!(layer < 5 * MIB, "{node}");
        assert!(archive as f64 <= 1.1 * layer as f64, "{node}");
        assert_eq!(node["verified"], true, "{node}");
    }
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap"]);
    assert_eq!(code, 0, "{report}");
    for node in testbed.nodes() {
        testbed.run_container(&node, &wrap, &["test", "-s", "/wrap.bin"]);
        testbed.assert_saves_whole(&node, &wrap);
    }

    // The next version through the registry hallmark starts, filled from the layer store:
    // the containerd-store nodes pull (the new layer only); the classic node, which would
    // download the base it got by stream again, gets the new layer by stream.
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &spec.replace("\"builder\"", "\"builder-2\""),
    );
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let port = support::free_port().to_string();
    let pull = support::registry_config(&testbed, &support::unique(), &port);
    let (code, report) = hallmark_json(&project, &pull, &["distribute", "wrap"]);
    assert_eq!(code, 0, "{report}");
    let containerd = testbed.containerd_nodes();
    for node in nodes_of(&report) {
        let pulls = containerd.iter().any(|n| node["node"] == n.as_str());
        assert_eq!(
            node["action"],
            if pulls { "pulled" } else { "thin" },
            "{node}"
        );
        assert!(node["layer_bytes"].as_u64().unwrap() < 5 * MIB, "{node}");
        assert_eq!(node["verified"], true, "{node}");
    }
    for node in testbed.nodes() {
        testbed.assert_saves_whole(&node, &wrap);
    }
}

#[test]
fn thin_update_from_a_builder_on_the_containerd_store() {
    thin_update_from_a_builder(&["--builder-store", "containerd"], 64);
}

/// With Docker 29's floor (API 1.44 at least) on the builder and on the Docker 28 node.
#[test]
fn thin_update_from_a_docker_28_builder_on_the_containerd_store() {
    thin_update_from_a_builder(
        &[
            "--builder-engine",
            "28",
            "--builder-store",
            "containerd",
            "--min-api",
            "builder=1.44",
            "--min-api",
            "node2=1.44",
        ],
        16,
    );
}

/// And Docker 28 on the classic store as a node too.
#[test]
fn thin_update_from_a_docker_28_builder_on_the_classic_store() {
    thin_update_from_a_builder(
        &[
            "--builder-engine",
            "28",
            "--builder-store",
            "classic",
            "--kind",
            "node1=28/classic",
        ],
        16,
    );
}

/// Docker 28's containerd store accepts a thin archive whose layers it has unpacked but
/// whose blobs it lacks (Docker 26 refuses it), and keeps an image it cannot read. A node
/// that got the base by a registry pull holds its layers under their compressed digests, not
/// the ones hallmark's archives name: what the node holds counts only layers hallmark loaded
/// there, so its archive carries what the store needs at once (no refused or incomplete load).
#[test]
fn a_stream_load_onto_a_containerd_store_holding_pulled_layers_leaves_the_whole_image() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let stream = testbed.config();
    let pull = support::registry_config(
        testbed,
        &support::unique(),
        &support::free_port().to_string(),
    );
    let project = project(8, "pulled-base");
    let wrap = reference(&project, "wrap");
    project
        .with_config(&stream)
        .run(&["-q", "build", "wrap"])
        .success();
    let nodes = testbed.local_containerd_nodes();
    assert!(
        nodes.contains(&testbed.node_of("28", "containerd")),
        "{nodes:?}"
    );
    let to = nodes.join(",");
    let (code, report) = hallmark_json(&project, &pull, &["distribute", "base", "--to", &to]);
    assert_eq!(code, 0, "{report}");

    let (code, report) = hallmark_json(&project, &stream, &["distribute", "wrap", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["verified"], true, "{node}");
        assert_eq!(node["fell_back_to_full"], false, "not refused: {node}");
        assert_eq!(node["completed"], false, "not left incomplete: {node}");
    }
    let (code, report) = hallmark_json(&project, &stream, &["verify", "wrap", "--nodes", &to]);
    assert_eq!(code, 0, "{report}");
    for node in &nodes {
        testbed.assert_saves_whole(node, &wrap);
        testbed.run_container(node, &wrap, &["test", "-s", "/wrap.bin"]);
    }

    // The next version goes thin: the node now holds the layers hallmark loaded. (What hallmark
    // loaded where is kept apart from the layer store: emptied, as by `prune` or by hand, it
    // is exported again, and the nodes do not look empty.)
    std::fs::remove_dir_all(project.root().join(".test-cache/store")).unwrap();
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &spec.replace("\"pulled-base\"", "\"pulled-base-2\""),
    );
    project
        .with_config(&stream)
        .run(&["-q", "build", "wrap"])
        .success();
    let (code, report) = hallmark_json(&project, &stream, &["distribute", "wrap", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["action"], "thin", "{node}");
        assert_eq!(node["layers_sent"], 1, "{node}");
        assert_eq!(node["verified"], true, "{node}");
    }
    for node in &nodes {
        testbed.assert_saves_whole(node, &wrap);
    }
}

/// What a user reads of `hallmark nodes` (support::testbed_transcript), with what varies by
/// engine version or by what other tests left on a node written `[version]`, `[api]` and
/// `[n] images`, and the platform (the host's) `[platform]`: `NODE ok PLATFORM VERSION API
/// STORE N GPUS ENGINE (VIA)`.
fn nodes_table(
    project: &support::TestProject,
    config: &std::path::Path,
    run: &support::Run,
) -> String {
    let text = support::testbed_transcript(project, config, run);
    // Versions, API versions and image counts vary with the engines and what ran before:
    // redacted, the columns then joined by one space (their widths follow the values).
    let row = |line: &str| -> Option<String> {
        let mut cells: Vec<&str> = line.split_whitespace().collect();
        if cells.get(1) != Some(&"ok") || cells.len() < 8 {
            return None;
        }
        cells[2] = "[platform]";
        cells[3] = "[version]";
        cells[4] = "[api]";
        cells[6] = "[n]";
        Some(cells.join(" "))
    };
    text.lines()
        .map(|line| row(line).unwrap_or_else(|| line.to_string()) + "\n")
        .collect()
}

#[test]
fn nodes_status_and_prune_report_what_is_there() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = project(1, "status");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let (code, nodes) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{nodes}");
    let rows = nodes.as_array().unwrap();
    assert_eq!(rows.len(), 5, "the builder and four nodes: {nodes}");
    for node in testbed.nodes() {
        let row = support::row(&nodes, &node);
        let (engine, store) = testbed.kind(&node);
        assert_eq!(row["image_store"], store.as_str(), "{row}");
        assert!(
            row["version"].as_str().unwrap().starts_with(&engine),
            "{engine}: {row}"
        );
        // The platform the engine says it is, as its own CLI reads it.
        let platform = testbed.docker_ok(
            &node,
            &["version", "--format", "{{.Server.Os}}/{{.Server.Arch}}"],
        );
        assert_eq!(row["platform"], platform.as_str(), "{row}");
    }
    assert!(
        rows.iter()
            .all(|r| r["reachable"] == true && r["version"].is_string()),
        "{nodes}"
    );
    // The table, as a user reads it.
    let table = project.with_config(&config).run(&["nodes"]);
    assert_eq!(table.code(), 0, "{}", table.stderr());
    insta::assert_snapshot!("nodes_table", nodes_table(&project, &config, &table));

    let (code, _) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", "node3"]);
    assert_eq!(code, 0);
    let (code, status) = hallmark_json(&project, &config, &["status"]);
    assert_eq!(code, 0, "{status}");
    let state = |image: &str, node: &str| {
        status
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["image"] == image && r["node"] == node)
            .unwrap()["state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(state("wrap", "node3"), "current");
    assert_eq!(state("wrap", "node2"), "missing");

    // The wrapper changes: node3 now holds a stale one.
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &spec.replace("\"status\"", "\"status-2\""),
    );
    let (_, status) = hallmark_json(&project, &config, &["status"]);
    let row = status
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["image"] == "wrap" && r["node"] == "node3")
        .unwrap()
        .clone();
    assert_eq!(row["state"], "stale", "{row}");

    // prune keeps what the project's images on the builder use, and drops the rest.
    let cache = project.root().join(".test-cache/store");
    let stray = cache.join("blobs/sha256").join("0".repeat(64));
    std::fs::write(&stray, "stray").unwrap();
    project.with_config(&config).run(&["prune"]).success();
    assert!(!stray.exists());
    let (code, _) = hallmark_json(&project, &config, &["distribute", "base", "--to", "node2"]);
    assert_eq!(code, 0, "the store still serves the images the project has");
}

#[test]
fn a_tcp_engine_is_reached_loaded_and_verified() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let unix = testbed.env["HMTB_NODE2"].clone();
    let port = support::tcp_to_unix(unix.strip_prefix("unix://").unwrap());
    let config = testbed
        .dir
        .join(format!("hallmark-tcp-{}.toml", support::unique()));
    let text = std::fs::read_to_string(testbed.config()).unwrap();
    let tcp = format!("tcp://127.0.0.1:{port}");
    assert!(text.contains(&format!("\"{unix}\"")));
    std::fs::write(
        &config,
        text.replace(&format!("\"{unix}\""), &format!("\"{tcp}\"")),
    )
    .unwrap();
    let project = project(1, "tcp");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();

    let (code, nodes) = hallmark_json(&project, &config, &["nodes"]);
    assert_eq!(code, 0, "{nodes}");
    let node2 = support::row(&nodes, "node2");
    assert_eq!(node2["via"], "tcp", "{node2}");
    assert_eq!(node2["engine"], tcp.as_str(), "{node2}");

    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", "node2"]);
    assert_eq!(code, 0, "{report}");
    let sent = &nodes_of(&report)[0];
    assert_eq!(sent["node"], "node2");
    assert_eq!(sent["verified"], true, "{sent}");
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap", "--nodes", "node2"]);
    assert_eq!(code, 0, "{report}");
    let wrap = reference(&project, "wrap");
    testbed.run_container("node2", &wrap, &["test", "-s", "/wrap.bin"]);
}

/// Issue 19 item 3: a base the nodes hold, a 4 MiB `mid` assembled on it, and `x`, `y`, `z`
/// assembled on `mid` with a small file each (under names of their own).
fn many_project() -> support::TestProject {
    let project = support::TestProject::new();
    let run = support::unique();
    let random = |mib: u64| {
        let mut bytes = vec![0u8; (mib * MIB) as usize];
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ run.len() as u64 ^ mib;
        for byte in bytes.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        bytes
    };
    project
        .write("pins/base.toml", crate::support::hello_pins())
        .write(
            "images/base/image.toml",
            &format!("[image]\nname = \"many-base-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\nrun = [\"echo {run} > /base.txt\"]\n"),
        )
        .write(
            "images/mid/image.toml",
            &format!("[image]\nname = \"many-mid-{run}\"\n\n[from]\nimage = \"base\"\n\n[[file]]\nsrc = \"payload\"\ndest = \"/opt/mid\"\n"),
        );
    std::fs::create_dir_all(project.root().join("images/mid/payload")).unwrap();
    std::fs::write(project.root().join("images/mid/payload/mid.bin"), random(4)).unwrap();
    for name in ["x", "y", "z"] {
        project.write(
            &format!("images/{name}/image.toml"),
            &format!("[image]\nname = \"many-{name}-{run}\"\n\n[from]\nimage = \"mid\"\n\n[[file]]\nsrc = \"payload\"\ndest = \"/opt/{name}\"\n\n[env]\nMANY_VERSION = \"v1\"\n"),
        );
        let payload = project.root().join(format!("images/{name}/payload"));
        std::fs::create_dir_all(&payload).unwrap();
        let mut bytes = random(1);
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        std::fs::write(payload.join(format!("{name}.bin")), bytes).unwrap();
    }
    project
}

/// The rows of `image` in a distribute report, node by node.
fn image_rows(report: &Value, image: &str) -> Vec<Value> {
    report
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == image)
        .unwrap_or_else(|| panic!("no {image}: {report}"))["nodes"]
        .as_array()
        .unwrap()
        .clone()
}

/// Issue 19 item 3: `distribute x y` sends each node one archive holding both images and the
/// 4 MiB layer they share (which the node lacks) once; one image at a time sent it twice
/// (the second image's parent is not on the node, so its layers were not found there). A node
/// that already holds some of the images receives only the rest.
#[test]
fn many_images_go_in_one_archive_per_node() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = many_project();
    project
        .with_config(&config)
        .run(&["-q", "build", "x", "y", "z"])
        .success();
    let (code, report) = hallmark_json(&project, &config, &["distribute", "base"]);
    assert_eq!(code, 0, "{report}");

    let (code, report) = hallmark_json(&project, &config, &["distribute", "x", "y"]);
    assert_eq!(code, 0, "{report}");
    let (x, y) = (image_rows(&report, "x"), image_rows(&report, "y"));
    assert_eq!(x.len(), 4);
    for (x, y) in x.iter().zip(&y) {
        for row in [x, y] {
            assert_eq!(row["action"], "thin", "{row}");
            assert_eq!(row["verified"], true, "{row}");
        }
        // mid's 4 MiB once, and 1 MiB each of x and y.
        let layers = x["layer_bytes"].as_u64().unwrap() + y["layer_bytes"].as_u64().unwrap();
        assert!((6 * MIB..7 * MIB).contains(&layers), "one archive: {x} {y}");
        let archive = x["archive_bytes"].as_u64().unwrap() + y["archive_bytes"].as_u64().unwrap();
        assert!(archive < layers + MIB / 4, "{x} {y}");
    }
    for node in testbed.nodes() {
        for image in ["x", "y"] {
            let name = reference(&project, image);
            testbed.run_container(
                &node,
                &name,
                &["test", "-s", &format!("/opt/{image}/{image}.bin")],
            );
        }
    }

    // z joins them: x and y are skipped, z carries its own layer only (mid is on the nodes).
    let (code, report) = hallmark_json(&project, &config, &["distribute", "x", "y", "z"]);
    assert_eq!(code, 0, "{report}");
    for image in ["x", "y"] {
        for row in image_rows(&report, image) {
            assert_eq!(row["action"], "skipped", "{row}");
        }
    }
    for row in image_rows(&report, "z") {
        assert_eq!(row["action"], "thin", "{row}");
        assert_eq!(row["layers_sent"], 1, "{row}");
        assert_eq!(row["verified"], true, "{row}");
    }
    let (code, report) = hallmark_json(&project, &config, &["verify", "x", "y", "z"]);
    assert_eq!(code, 0, "{report}");
}

/// Issue 19 item 3: among images sent together, one whose stored config was altered (same
/// length, another env value) fails on every node, named with the node and the image, and
/// the other is sent and verified.
#[test]
fn a_bad_image_among_many_fails_alone() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = many_project();
    project
        .with_config(&config)
        .run(&["-q", "build", "x", "y"])
        .success();
    let y = reference(&project, "y");
    let id = testbed.image_id("builder", &y);
    let store = project.root().join(".test-cache/store");
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(store.join(format!("images/{}.json", &id[7..]))).unwrap(),
    )
    .unwrap();
    let digest = record["config"]["digest"].as_str().unwrap();
    let blob = store.join("blobs/sha256").join(&digest[7..]);
    let text = std::fs::read_to_string(&blob).unwrap();
    assert!(text.contains("MANY_VERSION=v1"), "{text}");
    std::fs::write(&blob, text.replace("MANY_VERSION=v1", "MANY_VERSION=v9")).unwrap();

    let (code, report) = hallmark_json(&project, &config, &["distribute", "x", "y"]);
    assert_eq!(code, 1, "{report}");
    for row in image_rows(&report, "x") {
        assert_eq!(row["verified"], true, "{row}");
    }
    for row in image_rows(&report, "y") {
        assert_eq!(row["action"], "failed", "{row}");
        let error = row["error"].as_str().unwrap();
        assert!(
            error.contains(row["node"].as_str().unwrap()),
            "names the node: {error}"
        );
        assert!(error.contains(&y), "names the image: {error}");
    }
}

/// Issue 19 item 4: `status` and `verify` judge every node from one listing of its images
/// (an inspect only where the listing cannot tell); their answers are the ones inspecting
/// each image gave: current (by stream, on both stores and over ssh), stale, missing,
/// unreachable, and `verify` agrees with `status` row for row.
#[test]
fn status_and_verify_from_one_listing_per_node() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let project = many_project();
    let mut config = std::fs::read_to_string(testbed.config()).unwrap();
    config.push_str("\n[[node]]\nname = \"gone\"\nengine = \"unix:///nonexistent/docker.sock\"\n");
    let config_path = project.root().join("hallmark.toml");
    std::fs::write(&config_path, config).unwrap();
    let config = config_path;
    project
        .with_config(&config)
        .run(&["-q", "build", "x", "y", "z"])
        .success();
    let nodes = ["node1", "node2", "node3", "node4"];
    let to = nodes.join(",");
    let (code, report) = hallmark_json(&project, &config, &["distribute", "x", "y", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    // y changes on the builder only: the nodes hold a stale y.
    let spec = project.read("images/y/image.toml");
    project.write("images/y/image.toml", &spec.replace("\"v1\"", "\"v2\""));
    project
        .with_config(&config)
        .run(&["-q", "build", "y"])
        .success();

    let (_, status) = hallmark_json(&project, &config, &["status"]);
    let (code, verified) = hallmark_json(&project, &config, &["verify", "x", "y", "z"]);
    assert_eq!(code, 1, "{verified}");
    let state = |rows: &Value, image: &str, node: &str| -> Value {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["image"] == image && r["node"] == node)
            .unwrap_or_else(|| panic!("no {image} on {node}: {rows}"))
            .clone()
    };
    for (image, expected) in [("x", "current"), ("y", "stale"), ("z", "missing")] {
        for node in nodes {
            let row = state(&status, image, node);
            assert_eq!(row["state"], expected, "{row}");
            assert_eq!(
                row,
                state(&verified, image, node),
                "status and verify agree"
            );
        }
        let gone = state(&status, image, "gone");
        assert_eq!(gone["state"], "unreachable", "{gone}");
        assert_eq!(gone, state(&verified, image, "gone"));
    }
    // A current row carries the checksum and fingerprint it was judged by.
    for node in nodes {
        let row = state(&status, "x", node);
        assert!(
            row["fingerprint"].as_str().is_some_and(|f| f.len() == 64),
            "{row}"
        );
        assert!(row["checksum"].is_string(), "{row}");
    }
}

/// An image hallmark loaded onto a containerd-store node loses a layer's blob (a `ctr content
/// rm`, a disk repair): `status` says `incomplete`, and the next distribute loads the same
/// image back, which completes the very image the tag names (same manifest, same id). An
/// outside test found that image then removed as the "stub" it had been, and the row saying
/// verified: the node kept nothing under the tag. Now it keeps the whole image.
#[test]
fn an_image_missing_a_blob_on_a_containerd_store_is_repaired_in_place() {
    let testbed = Testbed::get();
    let project = project(4, "blob-gone");
    let config = testbed.config();
    let wrap = reference(&project, "wrap");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let nodes = testbed.local_containerd_nodes();
    assert!(nodes.len() >= 2, "Docker 26 and 28: {nodes:?}");
    let to = nodes.join(",");
    for image in ["base", "wrap"] {
        let (code, report) = hallmark_json(&project, &config, &["distribute", image, "--to", &to]);
        assert_eq!(code, 0, "{report}");
    }
    for node in &nodes {
        let manifest = testbed.image_id(node, &wrap);
        let manifest: Value =
            serde_json::from_str(&testbed.ctr(node, &["content", "get", &manifest]))
                .unwrap_or_else(|e| panic!("{node}: the manifest of {wrap}: {e}"));
        let last = manifest["layers"].as_array().unwrap().last().unwrap()["digest"].clone();
        testbed.ctr(node, &["content", "rm", last.as_str().unwrap()]);
    }
    let (_, status) = hallmark_json(&project, &config, &["status"]);
    for node in &nodes {
        let row = status
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["image"] == "wrap" && r["node"] == node.as_str())
            .unwrap_or_else(|| panic!("no row of wrap on {node}: {status}"));
        assert_eq!(row["state"], "incomplete", "{status}");
    }

    let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", &to]);
    assert_eq!(code, 0, "{report}");
    for node in nodes_of(&report) {
        assert_eq!(node["verified"], true, "{node}");
    }
    let (code, report) = hallmark_json(&project, &config, &["verify", "wrap", "--nodes", &to]);
    assert_eq!(code, 0, "the nodes still hold it: {report}");
    for node in &nodes {
        testbed.assert_saves_whole(node, &wrap);
        testbed.run_container(node, &wrap, &["test", "-s", "/wrap.bin"]);
    }
}

/// A node whose engine takes connections and never answers (a stopped dockerd; here a socket
/// nobody reads) is `unreachable` in `status`, `verify`, `nodes` and `distribute`, after
/// `HALLMARK_ANSWER_TIMEOUT`, and the other nodes are answered: an outside test saw each of
/// those commands wait for good.
#[test]
fn a_hung_engine_is_unreachable_and_no_command_waits_for_it() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    let project = project(1, "hung");
    let socket = project.root().join("hung.sock");
    // Connections queue in the listener's backlog: connected, never answered.
    let _hung = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut config = std::fs::read_to_string(testbed.config()).unwrap();
    config.push_str(&format!(
        "\n[[node]]\nname = \"hung\"\nengine = \"unix://{}\"\n",
        socket.display()
    ));
    let path = project.root().join("hallmark.toml");
    std::fs::write(&path, config).unwrap();
    project
        .with_config(&path)
        .run(&["-q", "build", "wrap"])
        .success();
    // Each command bounded from outside too: a wait for good fails the test, not the suite.
    let run = |args: &[&str]| {
        let output = std::process::Command::new("timeout")
            .args(["--kill-after=10", "300", env!("CARGO_BIN_EXE_hallmark")])
            .args(["--config", path.to_str().unwrap(), "--json"])
            .args(args)
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(".test-cache"))
            .env("HALLMARK_ANSWER_TIMEOUT", "5")
            .env_remove("DOCKER_HOST")
            .output()
            .unwrap();
        let code = output.status.code().expect("exited");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_ne!(code, 124, "{args:?} waited for the hung engine");
        (code, support::document(&stdout))
    };
    let hung_row = |rows: &Value, what: &str| {
        let row = support::row(rows, "hung").clone();
        let said = row.to_string();
        assert!(
            said.contains("unreachable") && said.contains("no answer"),
            "{what}: {row}"
        );
    };

    let (code, report) = run(&["distribute", "wrap", "--to", "node3,hung"]);
    assert_eq!(code, 1, "{report}");
    let node3 = nodes_of(&report)
        .into_iter()
        .find(|n| n["node"] == "node3")
        .unwrap();
    assert_eq!(node3["verified"], true, "{report}");
    let hung = nodes_of(&report)
        .into_iter()
        .find(|n| n["node"] == "hung")
        .unwrap();
    assert!(
        hung["error"].as_str().unwrap().contains("no answer"),
        "{hung}"
    );

    let (code, report) = run(&["verify", "wrap", "--nodes", "node3,hung"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        support::row(&report, "node3")["state"],
        "current",
        "{report}"
    );
    hung_row(&report, "verify");

    let (code, status) = run(&["status"]);
    assert_eq!(code, 0, "{status}");
    let rows = status.as_array().unwrap();
    let wrap_on = |node: &str| {
        rows.iter()
            .find(|r| r["image"] == "wrap" && r["node"] == node)
    };
    assert_eq!(wrap_on("node3").unwrap()["state"], "current", "{status}");
    let hung = wrap_on("hung").unwrap_or_else(|| panic!("no row of the hung node: {status}"));
    assert_eq!(hung["state"], "unreachable", "{status}");

    let (code, nodes) = run(&["nodes"]);
    assert_eq!(code, 1, "{nodes}");
    assert!(
        support::row(&nodes, "hung")
            .to_string()
            .contains("no answer"),
        "{nodes}"
    );
}

/// An update leaves no superseded image on the nodes: the image the tag named before is
/// removed once the tag names the new one (eight updates left 912 MB of them on a node in an
/// outside test), on every node kind, except where a container still uses it, which the
/// engine refuses (a containerd store and a classic one here).
#[test]
fn an_update_removes_the_image_it_superseded_unless_a_container_uses_it() {
    let testbed = Testbed::get();
    let project = project(1, "superseded");
    let config = testbed.config();
    let wrap = reference(&project, "wrap");
    let nodes = testbed.nodes();
    let to = nodes.join(",");
    let update = |version: &str| {
        let spec = project.read("images/wrap/image.toml");
        let (head, rest) = spec.split_once("VERSION = \"").unwrap();
        let rest = rest.split_once('"').unwrap().1;
        project.write(
            "images/wrap/image.toml",
            &format!("{head}VERSION = \"{version}\"{rest}"),
        );
        project
            .with_config(&config)
            .run(&["-q", "build", "wrap"])
            .success();
        let before: Vec<String> = nodes.iter().map(|n| testbed.image_id(n, &wrap)).collect();
        let (code, report) = hallmark_json(&project, &config, &["distribute", "wrap", "--to", &to]);
        assert_eq!(code, 0, "{report}");
        for (node, old) in nodes.iter().zip(&before) {
            assert_ne!(&testbed.image_id(node, &wrap), old, "{node}: updated");
        }
        before
    };
    let held = |node: &str, id: &str| {
        testbed
            .docker(node, &["image", "inspect", id])
            .status
            .success()
    };
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    for image in ["base", "wrap"] {
        let (code, report) = hallmark_json(&project, &config, &["distribute", image, "--to", &to]);
        assert_eq!(code, 0, "{report}");
    }

    let old = update("superseded-2");
    for (node, old) in nodes.iter().zip(&old) {
        let kind = testbed.kind(node);
        assert!(
            !held(node, old),
            "{node} {kind:?}: the superseded image is removed"
        );
    }

    let used = [
        testbed.node_of("28", "containerd"),
        testbed.node_of("20", "classic"),
    ];
    struct Remove<'a>(&'a Testbed, String, String);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            self.0.docker(&self.1, &["rm", "-f", &self.2]);
        }
    }
    let _remove: Vec<Remove> = used
        .iter()
        .map(|node| {
            let container = format!("uses-{}", support::unique());
            testbed.docker_ok(node, &["create", "--name", &container, &wrap]);
            Remove(testbed, node.clone(), container)
        })
        .collect();
    let old = update("superseded-3");
    for (node, old) in nodes.iter().zip(&old) {
        let kind = testbed.kind(node);
        let kept = used.contains(node);
        assert_eq!(
            held(node, old),
            kept,
            "{node} {kind:?}: kept only if a container uses it"
        );
    }
}

/// An engine that answers its version and then fails every other request (HTTP 500): `nodes`
/// says it is down, with the engine's words, and exits 1; `status` says `unreachable` with
/// those words, naming the node once. An outside test saw `nodes` call it `ok` and `status`
/// name it twice.
#[test]
fn an_engine_that_fails_its_requests_is_down_with_its_words() {
    let testbed = Testbed::get();
    let project = project(1, "sick");
    let socket = project.root().join("sick.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer_sick(stream));
        }
    });
    let mut config = std::fs::read_to_string(testbed.config()).unwrap();
    config.push_str(&format!(
        "\n[[node]]\nname = \"sick\"\nengine = \"unix://{}\"\n",
        socket.display()
    ));
    let path = project.root().join("hallmark.toml");
    std::fs::write(&path, config).unwrap();

    let (code, nodes) = hallmark_json(&project, &path, &["nodes"]);
    assert_eq!(code, 1, "{nodes}");
    let sick = support::row(&nodes, "sick");
    assert_eq!(sick["reachable"], false, "{nodes}");
    assert!(sick["error"].as_str().unwrap().contains("boom"), "{nodes}");

    let (code, status) = hallmark_json(&project, &path, &["status"]);
    assert_eq!(code, 0, "{status}");
    let rows: Vec<&Value> = status
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["node"] == "sick")
        .collect();
    assert!(!rows.is_empty(), "{status}");
    for row in rows {
        assert_eq!(row["state"], "unreachable", "{row}");
        let detail = row["detail"].as_str().unwrap();
        assert!(detail.contains("boom"), "{row}");
        assert_eq!(
            detail.matches("node `sick`").count(),
            1,
            "named once: {row}"
        );
    }
}

/// A sick engine's side of one connection: `/version` as Docker 28 answers it, HTTP 500 to
/// anything else, for as many requests as the client sends (it keeps connections).
fn answer_sick(mut stream: std::os::unix::net::UnixStream) {
    use std::io::{Read, Write};
    let mut pending = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&pending[..end]).to_string();
        pending.drain(..end + 4);
        let (status, body) = match head.split_whitespace().nth(1) {
            Some(path) if path.ends_with("/version") => (
                "200 OK",
                r#"{"Version":"28.5.2","ApiVersion":"1.51","MinAPIVersion":"1.24","Os":"linux","Arch":"amd64"}"#,
            ),
            _ => ("500 Internal Server Error", r#"{"message":"boom"}"#),
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// A load the engine completes but whose answer never comes back (the connection dropped at
/// the end, as an ssh link can) is judged by what the node holds: each engine kind holds the
/// image, so the row is a verified `full`, for one image and for an archive of several. An
/// outside test saw such a node called `failed`.
#[test]
fn a_load_whose_answer_is_lost_is_verified_by_what_the_node_holds() {
    let _serial = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let testbed = Testbed::get();
    for images in [&["wrap"][..], &["base", "wrap"]] {
        let project = project(1, &format!("lost{}", images.len()));
        let mut config = std::fs::read_to_string(testbed.config()).unwrap();
        let mut lossy = Vec::new();
        for node in testbed.nodes() {
            let socket = project.root().join(format!("{node}.sock"));
            losing_load_answers(&socket, &testbed.endpoint(&node));
            config.push_str(&format!(
                "\n[[node]]\nname = \"lossy-{node}\"\nengine = \"unix://{}\"\n",
                socket.display()
            ));
            lossy.push((node.clone(), format!("lossy-{node}")));
        }
        let path = project.root().join("hallmark.toml");
        std::fs::write(&path, config).unwrap();
        project
            .with_config(&path)
            .run(&["-q", "build", "wrap"])
            .success();

        let names: Vec<&str> = lossy.iter().map(|(_, name)| name.as_str()).collect();
        let to = names.join(",");
        let mut args = vec!["distribute", "--full", "--to", &to];
        args.extend(images);
        let (code, report) = hallmark_json(&project, &path, &args);
        assert_eq!(code, 0, "{report}");
        for image in images {
            let sent = report
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["image"] == *image)
                .unwrap_or_else(|| panic!("{image} in {report}"));
            for (node, name) in &lossy {
                let row = support::row(&sent["nodes"], name);
                let kind = testbed.kind(node);
                assert_eq!(row["action"], "full", "{image} on {node} {kind:?}: {row}");
                assert_eq!(row["verified"], true, "{row}");
                assert!(row["archive_bytes"].as_u64().unwrap() > 0, "{row}");
                let reference = reference(&project, image);
                assert!(
                    !testbed.image_id(node, &reference).is_empty(),
                    "{node}: {reference}"
                );
            }
        }
    }
}

/// A unix socket at `socket` in front of the engine at `endpoint` that passes everything on
/// both ways, except the answer to an image load: that is held back until the engine has
/// said it loaded the image (or ended its answer), then the client's connection is closed
/// without a byte of it.
fn losing_load_answers(socket: &std::path::Path, endpoint: &str) {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    let target = endpoint
        .strip_prefix("unix://")
        .unwrap_or_else(|| panic!("a local socket: {endpoint}"))
        .to_string();
    let listener = UnixListener::bind(socket).unwrap();
    let has = |bytes: &[u8], what: &[u8]| bytes.windows(what.len()).any(|w| w == what);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let target = target.clone();
            std::thread::spawn(move || {
                let Ok(engine) = UnixStream::connect(&target) else {
                    return;
                };
                let loading = std::sync::Arc::new(AtomicBool::new(false));
                let (mut from, mut to) = (client.try_clone().unwrap(), engine.try_clone().unwrap());
                let asked = std::sync::Arc::clone(&loading);
                std::thread::spawn(move || {
                    let mut buffer = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = from.read(&mut buffer) {
                        if has(&buffer[..n], b"/images/load") {
                            asked.store(true, Ordering::SeqCst);
                        }
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
                let (mut from, mut to) = (engine, client);
                let (mut buffer, mut held) = (vec![0u8; 1 << 16], Vec::new());
                while let Ok(n @ 1..) = from.read(&mut buffer) {
                    if !loading.load(Ordering::SeqCst) {
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                        continue;
                    }
                    held.extend_from_slice(&buffer[..n]);
                    if has(&held, b"Loaded image") || has(&held, b"\r\n0\r\n\r\n") {
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                }
            });
        }
    });
}

/// An image that carries an image's checksum label but that hallmark did not finish is never
/// taken for it, however it was made: a plain `docker build` of `render --out`'s context with
/// the checksum written in, a `docker import --change LABEL ...`, a `docker commit` over the
/// tag (each with the label in its newest step, which the old history rule took for
/// finished). Each is refused by `distribute`, is the reason nodes holding the real image are
/// `unverified` in `verify` and `status` (not `current`, not `mismatch`), and `build` warns
/// and moves the tag back to the image it made. An image made on top of it (a later build's
/// step image carries the label too; here one committed by hand and loaded alone into
/// another engine, so that it is the only image there with the label) is not "up to date":
/// the image is built. On the classic builder and on Docker 26's and 28's containerd stores.
#[test]
fn an_image_hallmark_did_not_finish_is_never_taken_for_the_built_one() {
    let shared = Testbed::get();
    let containerd = shared.node_of("28", "containerd");
    // A builder on Docker 28's containerd store needs the testbed's base images: one of the
    // test's own.
    let own = support::OwnTestbed::up(&[
        "--nodes",
        "2",
        "--builder-engine",
        "28",
        "--builder-store",
        "containerd",
    ]);
    // And one on Docker 26's containerd store, which answers no history for an image it has
    // not unpacked: the record, not the history, decides there too.
    let own26 = support::OwnTestbed::up(&[
        "--nodes",
        "2",
        "--builder-engine",
        "26",
        "--builder-store",
        "containerd",
    ]);
    let testbeds: [(&Testbed, &str); 3] =
        [(shared, &containerd), (&own, "node2"), (&own26, "node2")];
    for (testbed, other) in testbeds {
        let builder = "builder";
        let project = project(1, "unfinished");
        let cluster = |builder: &str| {
            let path = project.root().join(format!("cluster-{builder}.toml"));
            let text = format!(
                "[builder]\nname = \"{builder}\"\nengine = \"{}\"\n\n[[node]]\nname = \"node1\"\nengine = \"{}\"\n",
                testbed.endpoint(builder),
                testbed.endpoint("node1")
            );
            std::fs::write(&path, text).unwrap();
            path
        };
        let config = cluster(builder);
        project
            .with_config(&config)
            .run(&["-q", "build", "wrap"])
            .success();
        let (code, report) = hallmark_json(&project, &config, &["distribute", "base"]);
        assert_eq!(code, 0, "{report}");
        let base = reference(&project, "base");
        let made = testbed.image_id(builder, &base);
        let commit = |engine: &str, to: &str| {
            let container = format!("hotfix-{}", support::unique());
            let touch = ["run", "--name", &container, &base, "touch", "/hotfix"];
            testbed.docker_ok(engine, &touch);
            testbed.docker_ok(engine, &["commit", &container, to]);
            testbed.docker_ok(engine, &["rm", &container]);
        };
        let checksum = testbed.checksum_label(builder, &base);
        let label = format!("LABEL hallmark.checksum={checksum}");

        // Three ways of making an image whose label, and newest step, look finished; each
        // over the tag. None is hallmark's: only its record says what it finished.
        for way in [
            "docker build of the rendered context",
            "docker import",
            "docker commit",
        ] {
            match way {
                "docker build of the rendered context" => {
                    let context = project.root().join(format!("ctx-{}", support::unique()));
                    project
                        .run(&["render", "base", "--out", context.to_str().unwrap()])
                        .success();
                    // `render` says the label is rendered, not finished; a person (or a
                    // script) who writes the checksum in makes what the outside test made.
                    let dockerfile = context.join("Dockerfile");
                    let text = std::fs::read_to_string(&dockerfile).unwrap();
                    let rendered = format!("rendered-{checksum}");
                    assert!(text.contains(&rendered), "{text}");
                    std::fs::write(&dockerfile, text.replace(&rendered, &checksum)).unwrap();
                    let context = context.to_str().unwrap();
                    testbed.docker_ok(builder, &["build", "-q", "-t", &base, context]);
                }
                "docker import" => {
                    let container = format!("export-{}", support::unique());
                    testbed.docker_ok(builder, &["create", "--name", &container, &base, "true"]);
                    let tar = project.root().join(format!("{container}.tar"));
                    let tar = tar.to_str().unwrap();
                    testbed.docker_ok(builder, &["export", "-o", tar, &container]);
                    testbed.docker_ok(builder, &["rm", &container]);
                    testbed.docker_ok(builder, &["import", "--change", &label, tar, &base]);
                }
                _ => commit(builder, &base),
            }
            assert_ne!(testbed.image_id(builder, &base), made, "{builder} {way}");
            assert_eq!(testbed.checksum_label(builder, &base), checksum, "{way}");
            let (code, report) = hallmark_json(&project, &config, &["distribute", "base"]);
            assert_eq!(code, 1, "{builder} {way}: {report}");
            let row = &nodes_of(&report)[0];
            assert_eq!(row["action"], "failed", "{builder} {way}: {report}");
            let error = row["error"].as_str().unwrap();
            assert!(error.contains("did not finish"), "{builder} {way}: {error}");
            for command in [&["verify", "base"][..], &["status"]] {
                let (_, rows) = hallmark_json(&project, &config, command);
                let on_node1 = rows
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["image"] == "base" && r["node"] == "node1")
                    .unwrap_or_else(|| panic!("{builder} {way} {command:?}: {rows}"));
                assert_eq!(
                    on_node1["state"], "unverified",
                    "{builder} {way} {command:?}: {rows}"
                );
                let detail = on_node1["detail"].as_str().unwrap();
                assert!(
                    detail.contains("finish"),
                    "{builder} {way} {command:?}: {detail}"
                );
            }
            let built = project
                .with_config(&config)
                .run(&["build", "base"])
                .success()
                .stderr();
            assert!(built.contains("did not finish"), "{builder} {way}: {built}");
            assert_eq!(
                testbed.image_id(builder, &base),
                made,
                "{builder} {way}: the tag is back"
            );
        }

        // An image not built yet fails alone: the others are shipped and verified, and every
        // image has its rows (one unbuilt image hid them all, the JSON document too).
        project.write(
            "images/unbuilt/image.toml",
            "[from]\nimage = \"base\"\n\n[build]\nrun = [\"true\"]\n",
        );
        let (code, report) = hallmark_json(&project, &config, &["distribute", "base", "unbuilt"]);
        assert_eq!(code, 1, "{report}");
        let rows = report.as_array().unwrap();
        assert_eq!(rows[0]["nodes"][0]["verified"], true, "{report}");
        let unbuilt = &rows[1]["nodes"][0];
        assert_eq!(unbuilt["action"], "failed", "{report}");
        assert!(
            unbuilt["error"].as_str().unwrap().contains("does not hold"),
            "{report}"
        );
        let (code, rows) = hallmark_json(&project, &config, &["verify", "base", "unbuilt"]);
        assert_eq!(code, 1, "{rows}");
        assert_eq!(rows[0]["state"], "current", "{rows}");
        assert_eq!(rows[1]["image"], "unbuilt", "{rows}");
        assert_eq!(rows[1]["state"], "missing", "{rows}");
        std::fs::remove_dir_all(project.root().join("images/unbuilt")).unwrap();

        // An image on top of it, alone on another engine.
        let child = format!("child-{}:latest", support::unique());
        commit(builder, &child);
        let saved = project.root().join("child.tar");
        testbed.docker_ok(builder, &["save", "-o", saved.to_str().unwrap(), &child]);
        testbed.docker_ok(builder, &["rmi", &child]);
        testbed.docker_ok(other, &["load", "-i", saved.to_str().unwrap()]);
        let on_other = cluster(other);
        // (The other engine may lack the base's pinned image: the build then fails, which
        // is still not taking the child for the image.)
        let (_, report) = hallmark_json(&project, &on_other, &["build", "base"]);
        let record = &report.as_array().unwrap()[0];
        assert_ne!(record["outcome"], "up-to-date", "{other}: {report}");
        let child_id = testbed.image_id(other, &child);
        let tagged = testbed.docker(other, &["image", "inspect", "-f", "{{.Id}}", &base]);
        let tagged = String::from_utf8_lossy(&tagged.stdout).trim().to_string();
        assert_ne!(
            tagged, child_id,
            "{other}: the child is not tagged as the image"
        );
        testbed.docker(other, &["rmi", &child, &base]);
    }
}

/// `status` shows every image it can plan: a spec whose pins are not locked (and an image on
/// it) is said on stderr and left out, and the others still have their rows. An outside test
/// saw one unlocked spec hide the whole table (exit 2).
#[test]
fn status_shows_the_images_it_can_plan_and_says_which_it_cannot() {
    let testbed = Testbed::get();
    let project = project(1, "unlocked");
    project
        .write(
            "images/unlocked/image.toml",
            "[from]\nref = \"hallmark-testbed/python:bookworm\"\n",
        )
        .write("images/kid/image.toml", "[from]\nimage = \"unlocked\"\n");
    let output = support::hallmark_at(testbed.config())
        .args(["--json", "status"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("pins/unlocked.toml"), "{stderr}");
    assert!(stderr.contains("`kid` is left out"), "{stderr}");
    let rows = support::document(&String::from_utf8_lossy(&output.stdout));
    let images: std::collections::BTreeSet<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["image"].as_str().unwrap())
        .collect();
    assert_eq!(images, ["base", "kid", "unlocked", "wrap"].into(), "{rows}");
    for row in rows.as_array().unwrap() {
        let planned = ["base", "wrap"].contains(&row["image"].as_str().unwrap());
        assert_eq!(row["state"] == "unplanned", !planned, "{row}");
    }
    let unlocked = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["image"] == "unlocked")
        .unwrap();
    assert!(
        unlocked["detail"]
            .as_str()
            .unwrap()
            .contains("pins/unlocked.toml"),
        "{unlocked}"
    );
    let kid = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["image"] == "kid")
        .unwrap();
    assert!(
        kid["detail"].as_str().unwrap().contains("`unlocked`"),
        "{kid}"
    );

    // `verify` of a planned and an unplanned image: rows for both, exit 2 (no rows before).
    let (code, rows) = hallmark_json(&project, &testbed.config(), &["verify", "base", "unlocked"]);
    assert_eq!(code, 1, "{rows}");
    let states: std::collections::BTreeSet<(&str, &str)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["image"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .filter(|(image, _)| *image == "unlocked")
        .collect();
    assert_eq!(states, [("unlocked", "unplanned")].into(), "{rows}");

    // `distribute` of them all ships the plannable images and fails the others alone, on
    // every node, with why; `build` of them all builds the plannable ones. Bad input alone
    // is exit 2. (One bad spec made `--all` ship nothing, and `build A B C` build nothing.)
    let config = testbed.config();
    let built = project
        .with_config(&config)
        .run(&["-q", "build", "wrap", "unlocked"]);
    assert_eq!(built.code(), 2, "{}", built.stderr());
    assert!(
        !testbed
            .image_id("builder", &reference(&project, "wrap"))
            .is_empty()
    );
    let (code, report) =
        hallmark_json(&project, &config, &["distribute", "--all", "--to", "node1"]);
    assert_eq!(code, 2, "{report}");
    for shipped in report.as_array().unwrap() {
        let row = &shipped["nodes"][0];
        match shipped["image"].as_str().unwrap() {
            "base" | "wrap" => assert_eq!(row["verified"], true, "{row}"),
            _ => {
                assert_eq!(row["action"], "failed", "{row}");
                assert!(
                    row["error"].as_str().unwrap().contains("not planned"),
                    "{row}"
                );
            }
        }
    }
}

/// Two distributes of one image to one node at once take turns: one sends, the other, once
/// its turn comes, finds the node current and skips it. An outside test saw both send
/// everything.
#[test]
fn two_distributes_to_one_node_take_turns() {
    let testbed = Testbed::get();
    let project = project(8, "turns");
    let config = testbed.config();
    project
        .with_config(&config)
        .run(&["-q", "build", "base"])
        .success();
    let args = ["--json", "distribute", "base", "--to", "node1"];
    let children: Vec<_> = (0..2)
        .map(|_| support::spawn(&project, &config, &args))
        .collect();
    let mut actions = Vec::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = support::document(&stdout);
        let row = &nodes_of(&report)[0];
        assert_eq!(row["verified"], true, "{row}");
        actions.push(row["action"].as_str().unwrap().to_string());
    }
    actions.sort();
    assert_eq!(
        actions.iter().filter(|a| *a == "skipped").count(),
        1,
        "{actions:?}"
    );
}

/// `RUST_LOG=hallmark=debug` shows the spans and events of a distribute on stderr: per
/// image and node, what was decided and how the node's image was judged; without it, none.
#[test]
fn rust_log_shows_spans_per_image_and_node() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = project(1, "traced");
    let configured = project.with_config(&config);
    configured.run(&["-q", "build", "wrap"]).success();
    let node = testbed.node_of("20", "classic");
    let traced = configured.run_with(
        &["distribute", "wrap", "--to", &node],
        &[("RUST_LOG", "hallmark=debug")],
    );
    traced.success();
    let stderr = traced.stderr();
    assert!(
        stderr.contains("decide{") && stderr.contains(&format!("node={node}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("judged") && stderr.contains("state=Current"),
        "{stderr}"
    );
    let quiet = configured.run(&["distribute", "wrap", "--to", &node]);
    quiet.success();
    assert!(!quiet.stderr().contains("decide{"), "{}", quiet.stderr());
}

/// Issue 42: why the nodes' images cannot be checked (the builder's image under the tag is
/// not one hallmark finished) is said once, not on every node's row of `status` and
/// `verify`.
#[test]
fn the_reason_an_image_is_unverified_is_said_once() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = support::unique();
    project
        .write(
            "images/once/image.toml",
            &format!(
                "[image]\nname = \"hm-once-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[env]\nRUN = \"{run}\"\n"
            ),
        )
        .write("pins/once.toml", crate::support::hello_pins());
    let checksum = project.run(&["checksum", "once"]).success().stdout();
    let checksum = checksum.split_whitespace().next().unwrap().to_string();
    // The label written by a plain `docker build`, on the builder and two nodes.
    let context = project.root().join("forged");
    std::fs::create_dir_all(&context).unwrap();
    std::fs::write(
        context.join("Dockerfile"),
        format!("FROM scratch\nLABEL hallmark.checksum={checksum}\n"),
    )
    .unwrap();
    let tag = format!("hm-once-{run}:latest");
    let holders = ["builder", "node3", "node4"];
    for node in holders {
        testbed.docker_ok(
            node,
            &["build", "-q", "-t", &tag, context.to_str().unwrap()],
        );
    }
    let config = testbed.config();
    for verb in [&["status"][..], &["verify", "once"]] {
        let out = project.with_config(&config).run(verb);
        let said = format!("{}{}", out.stdout(), out.stderr());
        assert_eq!(
            said.matches("hallmark has no record of finishing").count(),
            1,
            "{verb:?}: {said}"
        );
        assert!(said.matches("unverified").count() >= 2, "{verb:?}: {said}");
    }
    for node in holders {
        testbed.docker_ok(node, &["rmi", &tag]);
    }
}

/// Issue 40: the first distribute after a build exported the whole image from the builder
/// again (a `docker save` that Docker 20.10 spools whole on the builder before its first
/// byte; 1 GiB of 4 in the first-copy bench), because a normalised image's record names its
/// `from.ref` base's layers, which nothing had put into the layer store. Now only the base is
/// exported, and the image goes from the layer store; a node that lacks all of it gets it all.
#[test]
fn the_first_distribute_after_a_build_exports_the_base_not_the_whole_image() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = project(8, "first");
    let wrap = reference(&project, "wrap");
    let configured = project.with_config(&config);
    configured.run(&["-q", "build", "wrap"]).success();
    let node = testbed.node_of("20", "classic");
    let shipped = configured.run_with(
        &["-v", "distribute", "wrap", "--to", &node],
        &[("RUST_LOG", "hallmark::images::transfer=info")],
    );
    shipped.success();
    let stderr = shipped.stderr();
    assert!(
        stderr.contains("exported its parent hallmark-testbed/busybox:latest"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&format!("exported {wrap} from the builder")),
        "{stderr}"
    );
    // and the next one needs no export at all: the layer store holds the whole image
    testbed.docker_ok(&node, &["rmi", "-f", &wrap]);
    let again = configured.run_with(
        &["-v", "distribute", "wrap", "--to", &node],
        &[("RUST_LOG", "hallmark::images::transfer=info")],
    );
    again.success();
    assert!(!again.stderr().contains("exported"), "{}", again.stderr());
}
