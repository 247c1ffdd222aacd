//! Assembled images (files, env and metadata on a parent): no container runs, the same
//! config digest on any engine, nothing exported to ship them.

mod support;

use support::{TestProject, Testbed, unique};

fn assembled_project() -> (TestProject, String) {
    let project = TestProject::new();
    let run = unique();
    project
        .write("pins/tool.toml", include_str!("../pins/hello.toml"))
        .write(
            "images/tool/image.toml",
            &format!(
                r#"
[image]
name = "tool-{run}"

[from]
ref = "hallmark-testbed/busybox:latest"

[[file]]
src = "bin"
dest = "/opt/tool/bin"

[env]
TOOL_MODE = "assembled"

[labels]
"test.run" = "{run}"

[container]
workdir = "/opt/tool"
cmd = ["/opt/tool/bin/tool"]
"#
            ),
        )
        .write(
            "images/tool/bin/tool",
            "#!/bin/sh\necho \"tool $TOOL_MODE in $(pwd)\"\n",
        )
        .write("images/tool/bin/README", "not executable\n");
    let script = project.root().join("images/tool/bin/tool");
    std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (project, format!("tool-{run}:latest"))
}

fn build(project: &TestProject, config: &std::path::Path) -> serde_json::Value {
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "--json",
        "build",
        "tool",
    ]);
    run.success();
    let records: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    records[0].clone()
}

#[test]
fn an_add_on_image_is_assembled_without_a_container_and_runs() {
    let testbed = Testbed::get();
    let (project, tag) = assembled_project();
    let render = project.run(&["render", "tool"]);
    render.success();
    assert!(
        render
            .stderr()
            .contains("assembles it without running a build"),
        "{}",
        render.stderr()
    );

    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let record = build(&project, &testbed.config());
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1;
    assert_eq!(record["outcome"], "assembled", "{record}");
    let events = testbed.docker_ok(
        "builder",
        &[
            "events",
            "--since",
            &started.to_string(),
            "--until",
            &ended.to_string(),
            "--filter",
            "type=container",
        ],
    );
    assert_eq!(events, "", "a container ran during the assembly");
    let checksum = project.run(&["checksum", "tool"]).success().stdout()[..64].to_string();
    let label = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"hallmark.checksum\"}}",
            &tag,
        ],
    );
    assert_eq!(label, checksum);
    let out = testbed.docker_ok("builder", &["run", "--rm", "--network", "none", &tag]);
    assert_eq!(out, "tool assembled in /opt/tool");
    let modes = testbed.docker_ok(
        "builder",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            &tag,
            "stat",
            "-c",
            "%a %n",
            "/opt/tool/bin/tool",
            "/opt/tool/bin/README",
        ],
    );
    assert_eq!(modes, "755 /opt/tool/bin/tool\n644 /opt/tool/bin/README");
    // The parent's layers are untouched below the new one.
    let layers = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{len .RootFS.Layers}}",
            &tag,
        ],
    );
    let parent = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{len .RootFS.Layers}}",
            "hallmark-testbed/busybox:latest",
        ],
    );
    assert_eq!(
        layers.parse::<usize>().unwrap(),
        parent.parse::<usize>().unwrap() + 1
    );

    let again = build(&project, &testbed.config());
    assert_eq!(again["outcome"], "up-to-date");
    assert_eq!(again["image_id"], record["image_id"]);
}

#[test]
fn two_engines_assemble_the_same_config_digest() {
    let testbed = Testbed::get();
    let loaded = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed"),
    )
    .args(["load-bases", "--dir"])
    .arg(&testbed.dir)
    .args(["--node", "node2"])
    .output()
    .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let (project, tag) = assembled_project();
    let on_builder = build(&project, &testbed.config());
    let other = testbed.config_with_builder(project.root(), "node2");
    // A fresh layer store too: nothing carries over but the spec.
    let run = support::hallmark()
        .args([
            "--config",
            other.to_str().unwrap(),
            "--json",
            "build",
            "tool",
        ])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".other-cache"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let on_node2: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    // On the classic store the image id is the config digest.
    assert_eq!(on_builder["image_id"], on_node2[0]["image_id"]);
    let print = |node: &str| {
        testbed.docker_ok(
            node,
            &[
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}} {{json .Config}}",
                &tag,
            ],
        )
    };
    assert_eq!(print("builder"), print("node2"));
}

#[test]
fn shipping_an_assembled_image_exports_nothing() {
    let testbed = Testbed::get();
    let (project, _tag) = assembled_project();
    let config = testbed.config();
    build(&project, &config);
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "-v",
        "--json",
        "distribute",
        "tool",
        "--to",
        "node2,node3",
    ]);
    run.success();
    assert!(!run.stderr().contains("exported"), "{}", run.stderr());
    let report: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    for node in report[0]["nodes"].as_array().unwrap() {
        assert_eq!(node["verified"], true, "{node}");
    }
}
