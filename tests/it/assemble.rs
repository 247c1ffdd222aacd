//! Assembled images (files, env and metadata on a parent): no container runs, the same
//! config digest on any engine, nothing exported to ship them.

use crate::support;

use support::{TestProject, Testbed, unique};

fn assembled_project() -> (TestProject, String) {
    let project = TestProject::new();
    let run = unique();
    project
        .write("pins/tool.toml", crate::support::hello_pins())
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
    let run = project
        .with_config(config)
        .run(&["--json", "build", "tool"]);
    run.success();
    let records: serde_json::Value = support::document(&run.stdout());
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
    let run = support::hallmark_at(&other)
        .args(["--json", "build", "tool"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".other-cache"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let on_other: serde_json::Value = support::document(&String::from_utf8_lossy(&run.stdout));
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
    let run = project.with_config(&config).run(&[
        "-v",
        "--json",
        "distribute",
        "tool",
        "--to",
        "node2,node3",
    ]);
    run.success();
    assert!(!run.stderr().contains("exported"), "{}", run.stderr());
    let report: serde_json::Value = support::document(&run.stdout());
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
    let lock = support::hallmark_at(&config)
        .args(["lock", "py"])
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
        let run = project.with_config(&config).run(&["--json", "build", "py"]);
        run.success();
        support::document(&run.stdout())[0].clone()
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
        .with_config(&config)
        .run(&["lock", "native"])
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
    let build = project.with_config(&config).run(&["build", "native"]);
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
    project.with_config(&config).run(&["lock", "arm"]).success();
    let build = project
        .with_config(&config)
        .run(&["--json", "build", "arm"]);
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
        .with_config(&config)
        .run(&["lock", "b12x"])
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
        let output = support::hallmark_at(config)
            .args(["--json", "build", "b12x"])
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(cache))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let records: serde_json::Value =
            support::document(&String::from_utf8_lossy(&output.stdout));
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
    let lock = support::hallmark_at(&config)
        .args(["lock", "py"])
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
    let build = project.with_config(&config).run(&["--json", "build", "py"]);
    build.success();
    let record: serde_json::Value = support::document(&build.stdout());
    assert_eq!(record[0]["outcome"], "assembled", "{record}");
    let imported = testbed.run_container(
        "builder",
        &format!("abi3-{run}:latest"),
        &["python3", "-c", "import hmabi"],
    );
    assert_eq!(imported, "hmabi imported");
}

/// Issue 14 item 10: two projects share one cache (one layer store). `prune` in one kept only
/// its own images and removed the other's layers; it now keeps every image another project
/// (still on disk) uses, and removes its own unused ones. The cache carries CACHEDIR.TAG.
#[test]
fn prune_in_one_project_keeps_the_layers_of_another() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let cache = tempfile::Builder::new()
        .prefix("shared-cache")
        .tempdir()
        .unwrap();
    let hallmark = |project: &TestProject, args: &[&str]| {
        let output = support::hallmark_at(&config)
            .args(args)
            .current_dir(project.root())
            .env("HALLMARK_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let built = |project: &TestProject| {
        let out = hallmark(project, &["--json", "build", "tool"]);
        let records: serde_json::Value = support::document(&out);
        assert_eq!(records[0]["outcome"], "assembled", "{records}");
        records[0]["image_id"].as_str().unwrap().to_string()
    };
    let record = |id: &str| {
        cache
            .path()
            .join("store/images")
            .join(format!("{}.json", id.trim_start_matches("sha256:")))
    };
    let complete = |id: &str| {
        let text = std::fs::read_to_string(record(id)).ok()?;
        let image: serde_json::Value = serde_json::from_str(&text).unwrap();
        let blob = |digest: &serde_json::Value| {
            cache
                .path()
                .join("store/blobs/sha256")
                .join(digest.as_str().unwrap().trim_start_matches("sha256:"))
                .is_file()
        };
        Some(
            blob(&image["config"]["digest"])
                && image["layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|l| blob(&l["blob"]["digest"])),
        )
    };

    let (b, _) = assembled_project();
    let b_id = built(&b);
    let (a, _) = assembled_project();
    let a_old = built(&a);
    // A's image changes: its first version is no longer used by anyone.
    a.write("images/tool/bin/README", "a new readme\n");
    let a_new = built(&a);
    hallmark(&a, &["prune"]);
    assert_eq!(complete(&b_id), Some(true), "b's image went with a's prune");
    assert_eq!(complete(&a_new), Some(true));
    assert_eq!(complete(&a_old), None, "a's unused image stayed");
    assert!(cache.path().join("CACHEDIR.TAG").is_file());
}

fn build_named(project: &TestProject, config: &std::path::Path, image: &str) -> serde_json::Value {
    let run = project.with_config(config).run(&["--json", "build", image]);
    run.success();
    let records: serde_json::Value = support::document(&run.stdout());
    records[0].clone()
}

/// What `image` on `node` holds below `roots` (relative paths, as `docker export` names them):
/// path -> kind, mode, owner, and for a file its mtime and sha256, for a link its target.
fn exported_tree(
    testbed: &Testbed,
    node: &str,
    image: &str,
    roots: &[&str],
) -> std::collections::BTreeMap<String, String> {
    use sha2::Digest;
    use std::io::Read;
    let container = testbed.docker_ok(node, &["create", image]);
    let mut export = std::process::Command::new("docker")
        .args(["-H", &testbed.endpoint(node), "export", &container])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut tree = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(export.stdout.take().unwrap());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let path = path.trim_end_matches('/').to_string();
        if !roots
            .iter()
            .any(|r| path == *r || path.starts_with(&format!("{r}/")))
        {
            continue;
        }
        // A time past 8^11 seconds comes as a PAX record.
        let pax_mtime = entry
            .pax_extensions()
            .unwrap()
            .into_iter()
            .flatten()
            .map(|e| e.unwrap())
            .find(|e| e.key() == Ok("mtime"))
            .map(|e| e.value().unwrap().split('.').next().unwrap().to_string());
        let header = entry.header().clone();
        let owner = format!(
            "{:o} {}:{}",
            header.mode().unwrap() & 0o7777,
            header.uid().unwrap(),
            header.gid().unwrap()
        );
        let described = match header.entry_type() {
            tar::EntryType::Directory => format!("dir {owner}"),
            tar::EntryType::Symlink => {
                format!("link -> {}", entry.link_name().unwrap().unwrap().display())
            }
            _ => {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).unwrap();
                let mtime = pax_mtime.unwrap_or_else(|| header.mtime().unwrap().to_string());
                format!(
                    "file {owner} {mtime} {}",
                    hex::encode(sha2::Sha256::digest(&bytes))
                )
            }
        };
        tree.insert(path, described);
    }
    assert!(export.wait().unwrap().success());
    testbed.docker_ok(node, &["rm", &container]);
    tree
}

/// Issue 14, item 3: file names a Dockerfile COPY would read as globs, variables or quotes,
/// and ENV/LABEL values with `$`, `\`, quotes and tabs reach the image exactly, the same on
/// every path: assembled by hallmark, a plain `docker build` of `render --out`, hallmark's
/// own engine build, and the assembled image loaded on the containerd store. Folders of the
/// parent keep their modes (`/tmp` 1777, `/root` 0700), and `/bin`, a symlink to `usr/bin` in
/// the Debian base, stays one (the file lands in `/usr/bin`).
#[test]
fn names_and_values_reach_the_image_exactly_on_every_path() {
    let testbed = Testbed::get();
    testbed.script("load-bases", &["--node", "node1"]);
    let project = TestProject::new();
    let run = unique();
    let spec = format!(
        r#"
[image]
name = "exact-{run}"
source-date-epoch = 9223372036

[from]
ref = "hallmark-testbed/python:bookworm"

[[file]]
src = "tree"
dest = "/opt/w$x"

[[file]]
src = "tool"
dest = "/bin/hm-tool-{run}"

[[file]]
src = "first"
dest = "/BZh-{run}"

[[file]]
src = "first"
dest = "/tmp/hm-note"

[[file]]
src = "first"
dest = "/root/.hm-note"

[env]
WEIRD = "a\\b \"q\" $HOME ${{X}} 'x'	tab é"

[labels]
"test.run" = "{run}"
"weird.$x" = "\\ \" $PATH ${{X}}	é"

[container]
workdir = "/opt/w$x/"
user = "0:0"
entrypoint = ["/bin/sh", "-c", "echo \"$0\"\n", "a b"]
cmd = ["x\ny", "$HOME"]
"#
    );
    let names = [
        "[ab]",
        "a",
        "b",
        "*",
        "?",
        "$x",
        "$HOME",
        "${X}",
        "sp ace",
        "q'uo\"te",
        "back\\slash",
        "é-ü-日本",
        "BZh",
        "sub/deep/f",
    ];
    for name in names {
        project.write(
            &format!("images/exact/tree/{name}"),
            &format!("content of {name}\n"),
        );
    }
    project
        .write("images/exact/image.toml", &spec)
        .write("images/exact/tool", "#!/bin/sh\necho tool\n")
        .write("images/exact/first", "first\n");
    let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(project.root().join("images/exact/tool"), exec).unwrap();
    let config = testbed.config();
    project
        .with_config(&config)
        .run(&["lock", "exact"])
        .success();

    let assembled = build_named(&project, &config, "exact");
    assert_eq!(assembled["outcome"], "assembled", "{assembled}");
    let assembled = assembled["image_id"].as_str().unwrap().to_string();
    // Another name keeps the assembled image once the engine path's build takes its tag.
    testbed.docker_ok(
        "builder",
        &["tag", &assembled, &format!("kept-exact-{run}:latest")],
    );
    project
        .with_config(&config)
        .run(&["distribute", "exact", "--to", "node1"])
        .success();

    let context = project.root().join("ctx");
    project
        .run(&["render", "exact", "--out", context.to_str().unwrap()])
        .success();
    let built = testbed.docker_ok("builder", &["build", "-q", context.to_str().unwrap()]);
    let built = built.lines().last().unwrap().to_string();

    // The same files through hallmark's engine path: a RUN step sends the spec there.
    let engine_spec = format!("{spec}\n[build]\nrun = [\"true\"]\n");
    project.write("images/exact/image.toml", &engine_spec);
    let engine = build_named(&project, &config, "exact");
    assert_eq!(engine["outcome"], "built", "{engine}");
    let engine = engine["image_id"].as_str().unwrap().to_string();
    project.write("images/exact/image.toml", &spec);

    let roots = [
        format!("BZh-{run}").leak() as &str,
        "opt",
        "bin",
        format!("usr/bin/hm-tool-{run}").leak(),
        "tmp",
        "root",
    ];
    let on_builder = exported_tree(testbed, "builder", &assembled, &roots);
    let tag = format!("exact-{run}:latest");
    assert_eq!(
        exported_tree(testbed, "node1", &tag, &roots),
        on_builder,
        "the containerd store unpacks the assembled layer differently"
    );
    let without_dir_times = |tree: &std::collections::BTreeMap<String, String>| {
        tree.iter()
            .filter(|(_, d)| !d.starts_with("dir"))
            .map(|(p, d)| (p.clone(), d.clone()))
            .collect::<Vec<_>>()
    };
    // Folder entries match too (mode and owner; times are not in the description).
    assert_eq!(
        exported_tree(testbed, "builder", &built, &roots),
        on_builder
    );
    assert_eq!(
        without_dir_times(&exported_tree(testbed, "builder", &engine, &roots)),
        without_dir_times(&on_builder)
    );

    let epoch = "9223372036";
    for name in names {
        let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(format!(
            "content of {name}\n"
        )));
        assert_eq!(
            on_builder.get(&format!("opt/w$x/{name}")),
            Some(&format!("file 644 0:0 {epoch} {sha}")),
            "{name}: {on_builder:#?}"
        );
    }
    assert_eq!(on_builder["tmp"], "dir 1777 0:0");
    assert_eq!(on_builder["root"], "dir 700 0:0");
    assert_eq!(on_builder["bin"], "link -> usr/bin");
    assert!(
        on_builder[&format!("usr/bin/hm-tool-{run}")].starts_with("file 755 0:0"),
        "{on_builder:#?}"
    );
    assert!(on_builder.contains_key(&format!("BZh-{run}")));

    let inspect = |id: &str| -> serde_json::Value {
        let text = testbed.docker_ok(
            "builder",
            &["image", "inspect", "--format", "{{json .Config}}", id],
        );
        serde_json::from_str(&text).unwrap()
    };
    let (a, mut b) = (inspect(&assembled), inspect(&built));
    // The plain build's checksum label says it was rendered, not finished by hallmark.
    let checksum = a["Labels"]["hallmark.checksum"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        b["Labels"]["hallmark.checksum"],
        format!("rendered-{checksum}"),
        "{b}"
    );
    b["Labels"]["hallmark.checksum"] = serde_json::json!(checksum);
    for key in ["Env", "Labels", "Entrypoint", "Cmd", "WorkingDir", "User"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert!(
        a["Env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("WEIRD=a\\b \"q\" $HOME ${X} 'x'\ttab é")),
        "{a}"
    );
    assert_eq!(a["Labels"]["weird.$x"], "\\ \" $PATH ${X}\té");
    assert_eq!(a["WorkingDir"], "/opt/w$x");
    assert_eq!(a["Cmd"], serde_json::json!(["x\ny", "$HOME"]));
}

/// A unix socket at `socket` in front of the engine at `endpoint` that passes every request
/// on, except an image load: that is answered `500` with `message` and the connection closed.
fn refusing_loads(socket: &std::path::Path, endpoint: &str, message: &'static str) {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    let target = endpoint
        .strip_prefix("unix://")
        .unwrap_or_else(|| panic!("a local socket: {endpoint}"))
        .to_string();
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let target = target.clone();
            std::thread::spawn(move || {
                let Ok(engine) = UnixStream::connect(&target) else {
                    return;
                };
                let (mut from_engine, mut to_client) =
                    (engine.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_engine, &mut to_client);
                    let _ = to_client.shutdown(std::net::Shutdown::Write);
                });
                let (mut from_client, mut to_engine) = (client, engine);
                let mut buffer = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = from_client.read(&mut buffer) {
                    let chunk = &buffer[..n];
                    let load = chunk.starts_with(b"POST ")
                        && chunk.windows(12).take(200).any(|w| w == b"/images/load");
                    if load {
                        // The archive read to its end first, as an engine does: an answer
                        // while the client still sends raced its broken pipe (a loaded CI
                        // machine saw the pipe, not the answer).
                        read_request_body(&mut from_client, chunk.to_vec());
                        let body = format!("{{\"message\":\"{message}\"}}");
                        let answer = format!(
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        // Answered before the engine's side is closed: its copier would
                        // otherwise close the client's side first, and the answer be lost.
                        let _ = from_client.write_all(answer.as_bytes());
                        let _ = from_client.shutdown(std::net::Shutdown::Both);
                        let _ = to_engine.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                    if to_engine.write_all(chunk).is_err() {
                        return;
                    }
                }
                let _ = to_engine.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

/// Reads the rest of the HTTP request `start` begins (its body by `Content-Length`, or
/// chunked to its last chunk) from `client`, discarding it.
fn read_request_body(client: &mut impl std::io::Read, start: Vec<u8>) {
    let mut seen = start;
    let mut buffer = vec![0u8; 1 << 16];
    let header_end = loop {
        if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match client.read(&mut buffer) {
            Ok(n @ 1..) => seen.extend_from_slice(&buffer[..n]),
            _ => return,
        }
    };
    let headers = String::from_utf8_lossy(&seen[..header_end]).to_lowercase();
    let length = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok());
    let mut body = seen.split_off(header_end);
    loop {
        let done = match length {
            Some(length) => body.len() >= length,
            None => body.ends_with(b"0\r\n\r\n"),
        };
        if done {
            return;
        }
        match client.read(&mut buffer) {
            Ok(n @ 1..) => body.extend_from_slice(&buffer[..n]),
            _ => return,
        }
        if length.is_none() {
            // Only the end is looked at: the chunked terminator.
            body.drain(..body.len().saturating_sub(5));
        }
    }
}

/// Issue 42: a load that fails names the image it was loading. Assembly loads its image
/// untagged into the builder, and the error said "load of  failed" with no name at all.
#[test]
fn a_failed_load_names_the_image() {
    let testbed = Testbed::get();
    let (project, _) = assembled_project();
    let socket = project.root().join("refusing.sock");
    refusing_loads(&socket, &testbed.endpoint("builder"), "the disk is full");
    let config = project.root().join("refusing.toml");
    std::fs::write(
        &config,
        format!(
            "[builder]\nname = \"builder\"\nengine = \"unix://{}\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let run = project.with_config(&config).run(&["build", "tool"]);
    let stderr = run.stderr();
    assert_eq!(run.code(), 1, "{stderr}");
    assert!(stderr.contains("the disk is full"), "{stderr}");
    assert!(
        stderr.contains("load of the assembled image of `tool` failed"),
        "{stderr}"
    );
}
