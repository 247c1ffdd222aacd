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
    // Other tests use the builder at the same time: look for containers of this image (they
    // carry its labels) and of its parent.
    let run_label = format!(
        "label=test.run={}",
        tag.trim_start_matches("tool-").trim_end_matches(":latest")
    );
    let parent_id = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            "hallmark-testbed/busybox:latest",
        ],
    );
    for filter in [
        run_label,
        format!("image={parent_id}"),
        "image=hallmark-testbed/busybox:latest".to_string(),
    ] {
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
                "--filter",
                &filter,
            ],
        );
        assert_eq!(events, "", "a container ran during the assembly ({filter})");
    }
    let checksum = project.run(&["checksum", "tool"]).success().stdout()[..64].to_string();
    let label = testbed.checksum_label("builder", &tag);
    assert_eq!(label, checksum);
    let out = testbed.docker_ok("builder", &["run", "--rm", "--network", "none", &tag]);
    assert_eq!(out, "tool assembled in /opt/tool");
    let modes = testbed.run_container(
        "builder",
        &tag,
        &[
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
    // Another classic-store engine: the image id is the config digest on both.
    let other_node = testbed.node_of("20", "classic");
    testbed.script("load-bases", &["--node", &other_node]);
    let (project, tag) = assembled_project();
    let on_builder = build(&project, &testbed.config());
    let other = testbed.config_with_builder(project.root(), &other_node);
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
    let on_other: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    // On the classic store the image id is the config digest.
    assert_eq!(on_builder["image_id"], on_other[0]["image_id"]);
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
    assert_eq!(print("builder"), print(&other_node));
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

#[test]
fn wheels_are_installed_as_pip_would_without_a_build() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let wheelhouse = project.root().join("wheelhouse");
    support::write_fixture_wheel(&wheelhouse);
    project.write(
        "images/py/image.toml",
        &format!(
            r#"
[image]
name = "py-{run}"

[from]
ref = "hallmark-testbed/python:bookworm"

[[wheel]]
name = "b12x"
version = "1.3.0"

[[wheel]]
name = "hmtool"
version = "0.1.0"

[env]
B12X_CACHE_DIR = "/cache/b12x"

[[smoke]]
name = "b12x imports"
run = ["python3", "-c", "import b12x"]

[[smoke]]
name = "console script"
run = ["hmtool"]
"#
        ),
    );
    let config = testbed.config();
    let lock = support::hallmark()
        .args(["--config", config.to_str().unwrap(), "lock", "py"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env("PIP_FIND_LINKS", &wheelhouse)
        .output()
        .unwrap();
    assert!(
        lock.status.success(),
        "{}",
        String::from_utf8_lossy(&lock.stderr)
    );
    let record = {
        let run = project.run(&[
            "--config",
            config.to_str().unwrap(),
            "--json",
            "build",
            "py",
        ]);
        run.success();
        serde_json::from_str::<serde_json::Value>(&run.stdout()).unwrap()[0].clone()
    };
    assert_eq!(record["outcome"], "assembled", "{record}");
    assert_eq!(record["smoke"].as_array().unwrap().len(), 2, "{record}");
    let tag = format!("py-{run}:latest");
    let docker_run = |args: &[&str]| {
        let mut all = vec!["run", "--rm", "--network", "none", tag.as_str()];
        all.extend_from_slice(args);
        testbed.docker_ok("builder", &all)
    };
    assert_eq!(docker_run(&["hmtool"]), "hmtool ran");
    let shown = docker_run(&["python3", "-m", "pip", "show", "-f", "b12x"]);
    assert!(shown.contains("Version: 1.3.0"), "{shown}");
    assert!(shown.contains("b12x/__init__.py"), "{shown}");
    assert!(docker_run(&["python3", "-m", "pip", "show", "hmtool"]).contains("Version: 0.1.0"));
    let installer = docker_run(&[
        "sh",
        "-c",
        "cat /usr/local/lib/python3*/dist-packages/b12x-1.3.0.dist-info/INSTALLER",
    ]);
    assert_eq!(installer, "hallmark");
}

#[test]
fn a_wheel_for_another_platform_says_why_and_what_to_do() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let spec = format!(
        "[image]\nname = \"native-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n"
    );
    project.write("images/native/image.toml", &spec);
    // The base pin is the builder's own image id for the python base. Then the wheel and a
    // pin written by hand (`lock` would choose the x86_64 wheel again).
    let config = testbed.config();
    project
        .run(&["--config", config.to_str().unwrap(), "lock", "native"])
        .success();
    let pins = project.read("pins/native.toml");
    project
        .write(
            "images/native/image.toml",
            &format!("{spec}\n[[wheel]]\nname = \"fastthing\"\nversion = \"1.0\"\n"),
        )
        .write(
            "pins/native.toml",
            &format!(
                "{pins}\n[[wheel]]\nname = \"fastthing\"\nversion = \"1.0\"\nfile = \"fastthing-1.0-cp311-cp311-manylinux_2_17_aarch64.whl\"\nsha256 = \"{}\"\n",
                "d".repeat(64)
            ),
        );
    let build = project.run(&["--config", config.to_str().unwrap(), "build", "native"]);
    assert_eq!(build.code(), 1, "{}", build.stderr());
    let err = build.stderr();
    assert!(err.contains("wheel `fastthing==1.0`"), "{err}");
    assert!(err.contains("aarch64"), "{err}");
    assert!(err.contains("[build] run"), "{err}");
}

#[test]
fn an_arm64_parent_gives_an_arm64_image_assembled_here() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let parent = format!("arm-parent-{run}:latest");
    // A parent that says arm64 (its content is never run here), written by the testbed's
    // archive maker: Docker 20.10's `docker import --platform` keeps the host's architecture.
    let layer = project.root().join("layer.tar");
    let status = std::process::Command::new("tar")
        .args(["-cf"])
        .arg(&layer)
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "README.md"])
        .status()
        .unwrap();
    assert!(status.success());
    let archive = project.root().join("parent.tar");
    let made = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.d/mkimage.py"))
        .args(["archive", "--layer"])
        .arg(&layer)
        .args([
            "--tag",
            &parent,
            "--arch",
            "arm64",
            "--variant",
            "v8",
            "--out",
        ])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let loaded = std::process::Command::new("docker")
        .args(["-H", &testbed.endpoint("builder"), "load", "-i"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let parent_platform = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Os}}/{{.Architecture}}",
            &parent,
        ],
    );
    assert_eq!(parent_platform, "linux/arm64");
    project
        .write("images/arm/image.toml", &format!("[image]\nname = \"arm-{run}\"\n\n[from]\nref = \"{parent}\"\n\n[[file]]\nsrc = \"note.txt\"\ndest = \"/note.txt\"\n"))
        .write("images/arm/note.txt", "assembled on x86\n");
    let config = testbed.config();
    project
        .run(&["--config", config.to_str().unwrap(), "lock", "arm"])
        .success();
    let build = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "--json",
        "build",
        "arm",
    ]);
    build.success();
    assert!(
        build.stdout().contains("\"assembled\""),
        "{}",
        build.stdout()
    );
    let platform = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Os}}/{{.Architecture}}",
            &format!("arm-{run}:latest"),
        ],
    );
    assert_eq!(platform, "linux/arm64");
}

#[test]
fn two_engines_assemble_the_same_wheel_image() {
    let testbed = Testbed::get();
    // Another classic-store engine: the image id is the config digest on both.
    let other_node = testbed.node_of("20", "classic");
    testbed.script("load-bases", &["--node", &other_node]);
    let project = TestProject::new();
    let run = unique();
    project.write(
        "images/b12x/image.toml",
        &format!("[image]\nname = \"b12x-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[[wheel]]\nname = \"b12x\"\nversion = \"1.3.0\"\n\n[env]\nB12X_CACHE_DIR = \"/cache/b12x\"\n"),
    );
    let config = testbed.config();
    project
        .run(&["--config", config.to_str().unwrap(), "lock", "b12x"])
        .success();
    let ids: Vec<String> = [
        (config.clone(), ".cache-a"),
        (
            testbed.config_with_builder(project.root(), &other_node),
            ".cache-b",
        ),
    ]
    .iter()
    .map(|(config, cache)| {
        let output = support::hallmark()
            .args([
                "--config",
                config.to_str().unwrap(),
                "--json",
                "build",
                "b12x",
            ])
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(cache))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let records: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(records[0]["outcome"], "assembled");
        records[0]["image_id"].as_str().unwrap().to_string()
    })
    .collect();
    assert_eq!(ids[0], ids[1], "the config digest differs between engines");
}

/// Issue 14 item 9: a `cp39-abi3` wheel (as vLLM publishes) installs on Python 3.11, as pip
/// would install it; hallmark refused it. `lock` asks the base on the builder for its Python
/// and C library and pins the wheel for them, recording them as `[python]`.
#[test]
fn an_abi3_wheel_for_an_older_python_is_locked_and_assembled() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let wheelhouse = project.root().join("wheelhouse");
    std::fs::create_dir_all(&wheelhouse).unwrap();
    let script = r#"
import sys, zipfile
path = sys.argv[1] + "/hmabi-0.1.0-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
files = {
    "hmabi/__init__.py": "print('hmabi imported')\n",
    "hmabi-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hmabi\nVersion: 0.1.0\n",
    "hmabi-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp39-abi3-manylinux_2_17_x86_64\n",
    "hmabi-0.1.0.dist-info/RECORD": "",
}
with zipfile.ZipFile(path, "w") as z:
    for name, text in files.items():
        z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), text)
"#;
    let made = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&wheelhouse)
        .status()
        .unwrap();
    assert!(made.success());
    project.write(
        "images/py/image.toml",
        &format!(
            "[image]\nname = \"abi3-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[[wheel]]\nname = \"hmabi\"\nversion = \"0.1.0\"\n\n[[smoke]]\nname = \"imports\"\nrun = [\"python3\", \"-c\", \"import hmabi\"]\n"
        ),
    );
    let config = testbed.config();
    let lock = support::hallmark()
        .args(["--config", config.to_str().unwrap(), "lock", "py"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env("PIP_FIND_LINKS", &wheelhouse)
        .env("PIP_NO_INDEX", "1")
        .output()
        .unwrap();
    assert!(
        lock.status.success(),
        "{}",
        String::from_utf8_lossy(&lock.stderr)
    );
    let pins = project.read("pins/py.toml");
    for line in [
        "version = \"3.11\"",
        "abi = \"cp311\"",
        "machine = \"x86_64\"",
        "libc = \"glibc 2.36\"",
        "file = \"hmabi-0.1.0-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl\"",
    ] {
        assert!(pins.contains(line), "{line} in {pins}");
    }
    let build = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "--json",
        "build",
        "py",
    ]);
    build.success();
    let record: serde_json::Value = serde_json::from_str(&build.stdout()).unwrap();
    assert_eq!(record[0]["outcome"], "assembled", "{record}");
    let imported = testbed.run_container(
        "builder",
        &format!("abi3-{run}:latest"),
        &["python3", "-c", "import hmabi"],
    );
    assert_eq!(imported, "hmabi imported");
}
