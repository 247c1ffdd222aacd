//! Builds on real engines of the testbed (scripts/testbed): nothing here is mocked.

use crate::support;

use support::{GitRepo, TestProject, Testbed, one_line_patch, unique};

/// The repository's `hello`, under a repository name and label of its own, so tests that
/// share a builder share neither a tag nor a checksum. Returns the project and the tag.
fn hello_project() -> (TestProject, String) {
    let project = TestProject::new();
    let spec = include_str!("../../images/hello/image.toml");
    let run = unique();
    let spec =
        format!("{spec}\n[image]\nname = \"hello-{run}\"\n\n[labels]\n\"test.run\" = \"{run}\"\n");
    project
        .write("images/hello/image.toml", &spec)
        .write(
            "images/hello/hello.sh",
            include_str!("../../images/hello/hello.sh"),
        )
        .write("pins/hello.toml", support::hello_pins());
    let script = project.root().join("images/hello/hello.sh");
    std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (project, format!("hello-{run}:latest"))
}

fn build_json(project: &TestProject, config: &std::path::Path, image: &str) -> serde_json::Value {
    let run = project.with_config(config).run(&["--json", "build", image]);
    run.success();
    let records: serde_json::Value = support::document(&run.stdout());
    records.as_array().unwrap().last().unwrap().clone()
}

#[test]
fn hello_builds_smokes_and_is_up_to_date_the_second_time() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    let config = testbed.config();
    let checksum = project.run(&["checksum", "hello"]).success().stdout()[..64].to_string();

    let first = build_json(&project, &config, "hello");
    assert_eq!(first["outcome"], "built");
    assert_eq!(first["checksum"], checksum.as_str());
    assert_eq!(first["smoke"].as_array().unwrap().len(), 2);
    assert_eq!(testbed.checksum_label("builder", &tag), checksum);
    let log = std::fs::read_to_string(first["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("Step 1/"), "{log}");
    let records = std::fs::read_dir(project.root().join(".hallmark/records"))
        .unwrap()
        .count();
    assert_eq!(records, 1);

    // Only this test's images count: other tests build on the same builder at the same time.
    let run = tag.trim_start_matches("hello-").trim_end_matches(":latest");
    let ours = || {
        let filter = format!("label=test.run={run}");
        let listed = testbed.docker_ok(
            "builder",
            &["images", "-aq", "--no-trunc", "--filter", &filter],
        );
        let mut ids: Vec<String> = listed
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let images_before = ours();
    assert_eq!(images_before.len(), 1, "{images_before:?}");
    let second = build_json(&project, &config, "hello");
    assert_eq!(second["outcome"], "up-to-date");
    assert_eq!(second["image_id"], first["image_id"]);
    assert_eq!(ours(), images_before, "a second build created images");

    let junit = project.root().join("smoke.xml");
    project
        .with_config(&config)
        .run(&["smoke", "hello", "--junit", junit.to_str().unwrap()])
        .success();
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"2\" failures=\"0\""), "{xml}");

    // On a node that never received the image the smoke run fails, and CI still gets its
    // report, with the reason as an error case.
    let missing = project.with_config(&config).run(&[
        "smoke",
        "hello",
        "--node",
        "node2",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(missing.code(), 1, "{}", missing.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    // Each of the spec's tests is a case, none of which could run there: each carries why;
    // no case is invented for the run itself.
    assert!(
        xml.contains("tests=\"2\" failures=\"0\" errors=\"2\" skipped=\"0\"")
            && xml.matches("holds no image tagged").count() == 2,
        "{xml}"
    );
    // And `--json` has a row for each, saying it did not run and why.
    let missing = project
        .with_config(&config)
        .run(&["--json", "smoke", "hello", "--node", "node2"]);
    assert_eq!(missing.code(), 1, "{}", missing.stderr());
    let rows = support::document(&missing.stdout());
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in rows {
        assert_eq!(row["ran"], false, "{row}");
        assert_eq!(row["error"], true, "{row}");
        assert!(
            row["reason"]
                .as_str()
                .unwrap()
                .contains("holds no image tagged"),
            "{row}"
        );
    }
}

#[test]
fn patched_source_and_real_wheel_on_the_debian_base() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let upstream = GitRepo::new(project.root(), "upstream");
    upstream.commit(&[("greeting.txt", "hello\n")], "first");
    upstream.git(&["tag", "v1"]);
    let marker = unique();
    project
        .write(
            "images/app/image.toml",
            &format!(
                r#"
[from]
ref = "hallmark-testbed/python:bookworm"

[[source]]
name = "upstream"
git = "{}"
rev = "v1"
dest = "/opt/upstream"
patches = ["fix"]

[[wheel]]
name = "b12x"
version = "1.3.0"

[env]
MARKER = "{marker}"

[[smoke]]
name = "b12x imports"
run = ["python3", "-c", "import b12x"]

[[smoke]]
name = "patched"
run = ["grep", "-qx", "hello, world!", "/opt/upstream/greeting.txt"]
"#,
                upstream.url()
            ),
        )
        .write("patches/fix/series", "0001-world.patch\n0002-comma.patch\n")
        .write(
            "patches/fix/0001-world.patch",
            &one_line_patch("greeting.txt", "hello", "hello world"),
        )
        .write(
            "patches/fix/0002-comma.patch",
            &one_line_patch("greeting.txt", "hello world", "hello, world!"),
        );
    let config = testbed.config();
    let lock = project.with_config(&config).run(&["lock", "app"]);
    lock.success();
    let pins = project.read("pins/app.toml");
    assert!(pins.contains("kind = \"config-digest\""), "{pins}");
    assert!(
        pins.contains("c97d88635521a7fdd4f67717c1835a017d0dcea49d49cc7aa5b4299f290d19e3"),
        "{pins}"
    );

    let record = build_json(&project, &config, "app");
    assert_eq!(record["outcome"], "built");
    let checksum = project.run(&["checksum", "app"]).success().stdout()[..64].to_string();
    assert_eq!(testbed.checksum_label("builder", "app:latest"), checksum);
    let content = testbed.docker_ok(
        "builder",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "app:latest",
            "cat",
            "/opt/upstream/greeting.txt",
        ],
    );
    assert_eq!(content, "hello, world!");
    let shown = testbed.docker_ok(
        "builder",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "app:latest",
            "python3",
            "-m",
            "pip",
            "show",
            "b12x",
        ],
    );
    assert!(shown.contains("Version: 1.3.0"), "{shown}");
}

#[test]
fn two_engines_get_the_same_label_and_the_same_context_bytes() {
    let testbed = Testbed::get();
    // Another Docker 20.10: the `hello` pin is an image id of the classic store.
    let node3 = testbed.node_of("20", "classic");
    testbed.script("load-bases", &["--node", &node3]);
    let (project, tag) = hello_project();
    let on_builder = build_json(&project, &testbed.config(), "hello");
    let other = testbed.config_with_builder(project.root(), &node3);
    let on_node3 = build_json(&project, &other, "hello");
    assert_eq!(on_builder["checksum"], on_node3["checksum"]);
    assert_eq!(on_builder["outcome"], "built");
    assert_eq!(on_node3["outcome"], "built");
    assert!(on_builder["context_sha256"].is_string());
    assert_eq!(on_builder["context_sha256"], on_node3["context_sha256"]);
    assert_eq!(
        testbed.checksum_label(&node3, &tag),
        on_builder["checksum"].as_str().unwrap()
    );
}

#[test]
fn a_failing_run_step_names_the_step_and_keeps_the_previous_tag() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    let config = testbed.config();
    let first = build_json(&project, &config, "hello");
    let spec = project.read("images/hello/image.toml");
    let broken = spec.replace(
        "run = [\"hello > /etc/hello.txt\"]",
        "run = [\"hello > /etc/hello.txt\", \"echo boom-from-the-step && exit 3\"]",
    );
    assert_ne!(spec, broken);
    project.write("images/hello/image.toml", &broken);
    let run = project.with_config(&config).run(&["build", "hello"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("failed to build at Step 7/"), "{err}");
    assert!(
        err.contains(r#"RUN ["/bin/sh","-c","echo boom-from-the-step && exit 3"]"#),
        "{err}"
    );
    assert!(err.contains(".hallmark/logs/hello-"), "{err}");
    let tagged = testbed.docker_ok(
        "builder",
        &["image", "inspect", "--format", "{{.Id}}", &tag],
    );
    assert_eq!(tagged, first["image_id"].as_str().unwrap());
}

#[test]
fn a_cmd_repeating_the_parents_entrypoint_is_refused_before_any_build() {
    let testbed = Testbed::get();
    let (project, _tag) = hello_project();
    let spec = project.read("images/hello/image.toml");
    project.write(
        "images/hello/image.toml",
        &spec.replace("cmd = [\"hello\"]", "entrypoint = [\"vllm\", \"serve\"]"),
    );
    project.write(
        "images/served/image.toml",
        "[from]\nimage = \"hello\"\n\n[container]\ncmd = [\"vllm\", \"serve\", \"/models/m\"]\n",
    );
    let check = project.run(&["check", "served"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(
        check.stderr().contains("vllm serve vllm serve /models/m"),
        "{}",
        check.stderr()
    );
    let config = testbed.config();
    let build = project.with_config(&config).run(&["build", "served"]);
    assert_eq!(build.code(), 2, "{}", build.stderr());
    assert!(
        !project.root().join(".hallmark/logs").exists(),
        "nothing may be built"
    );
}

/// Issues 7 and 15: normalised images are bit-for-bit the same on every kind of engine of the
/// testbed (each engine version and image store, e.g. Docker 20.10 classic and Docker 26
/// containerd): the same layers and the same config digest.
#[test]
fn normalised_builds_on_every_engine_kind_are_identical() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    // A clone-at-pin image too: a patched source copied in, and a RUN step on it that deletes
    // a file and replaces a directory of its parent's, and makes hard links (to a file, and
    // with `cp -al`, to a symlink and a fifo).
    let upstream = GitRepo::new(project.root(), "upstream");
    // A name past 100 bytes too, which engines and the canonical form write differently.
    let deep = format!("{}/{}.txt", "d".repeat(70), "n".repeat(60));
    upstream.commit(&[("greeting.txt", "hello\n"), (&deep, "deep\n")], "first");
    upstream.git(&["tag", "v1"]);
    let run = unique();
    let clone = format!("clone-{run}:latest");
    project
        .write(
            "images/clone/image.toml",
            &format!(
                "[image]\nname = \"clone-{run}\"\n\n[from]\nimage = \"hello\"\n\n[[source]]\nname = \"upstream\"\ngit = \"{}\"\nrev = \"v1\"\ndest = \"/opt/upstream\"\npatches = [\"fix\"]\n\n[build]\nrun = [\"wc -c /opt/upstream/greeting.txt > /opt/size.txt && mkdir -p /var/made && rm /etc/hello.txt && rm -rf /usr/local/bin && mkdir /usr/local/bin && ln /opt/size.txt /usr/local/bin/size && mkdir /src && ln -s ../etc/passwd /src/pw && mkfifo /src/f && cp -al /src /snap\"]\n",
                upstream.url()
            ),
        )
        .write("patches/fix/series", "0001-world.patch\n")
        .write("patches/fix/0001-world.patch", &one_line_patch("greeting.txt", "hello", "hello world"));
    project.run(&["lock", "clone"]).success();
    let engines = engine_kinds(testbed, &project);
    assert!(engines.len() >= 2, "{engines:?}");
    let mut seen: Vec<(String, Vec<String>)> = Vec::new();
    // On this machine the new layers are read where the builder keeps them: a classic
    // store's layer directories, a containerd store's content store; the export is read
    // where asked to.
    let ways: [(&str, &[(&str, &str)]); 2] = [
        ("where it keeps them", &[]),
        ("export", &[("HALLMARK_NORMALIZE_FROM", "export")]),
    ];
    for (node, kind) in &engines {
        if node != "builder" {
            testbed.script("load-bases", &["--node", node]);
        }
        let config = testbed.config_with_builder(project.root(), node);
        for (way, env) in ways {
            let classic = kind.contains("classic");
            let from = match (way, classic) {
                ("export", _) => "export",
                (_, true) => "layer directories",
                (_, false) => "content store",
            };
            let args = ["build", "--force", "clone"];
            let (code, records) = support::hallmark_json_with(&project, &config, &args, env);
            assert_eq!(code, 0, "{records}");
            // The layers each build added, and how many were rewritten as the export
            // streamed in.
            let record = |image: &str| {
                let record = records
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["image"] == image)
                    .unwrap_or_else(|| panic!("no record of {image}: {records}"))
                    .clone();
                assert_eq!(record["normalized_from"], from, "{node} ({kind}): {record}");
                // Why the export, where it was read (the containerd store's own reason is
                // asserted in ship.rs's thin updates).
                let reason = record["normalized_from_reason"]
                    .as_str()
                    .unwrap_or_default();
                let why = match way {
                    "export" => "HALLMARK_NORMALIZE_FROM=export",
                    _ => "",
                };
                assert!(
                    reason.contains(why) && reason.is_empty() == why.is_empty(),
                    "{node} ({kind}): {record}"
                );
                let layers = record["normalized_layers"].as_u64().unwrap();
                (record["normalized_as_streamed"].as_u64().unwrap(), layers)
            };
            let ((hello, hello_layers), (cloned, clone_layers)) =
                (record("hello"), record("clone"));
            if classic && way == "export" {
                // Both ways of the export's rewrite give these bytes: the hello image's
                // layers stream; the clone's replaced directory is opaque on the classic
                // store, rewritten from a copy.
                assert!(
                    hello == hello_layers && hello > 0,
                    "{node} ({kind}): {records}"
                );
                assert!(cloned < clone_layers, "{node} ({kind}): {records}");
            }
            let image = |reference: &str| {
                let layers = testbed.docker_ok(
                    node,
                    &[
                        "image",
                        "inspect",
                        "--format",
                        "{{json .RootFS.Layers}}",
                        reference,
                    ],
                );
                format!(
                    "{layers} config {}",
                    config_digest(testbed, node, reference)
                )
            };
            let images = vec![image(&tag), image(&clone)];
            seen.push((format!("{node} ({kind}, from the {from})"), images));
        }
    }
    for from in ["layer directories", "content store", "export"] {
        assert!(seen.iter().any(|(way, _)| way.contains(from)), "{seen:?}");
    }
    for (engine, images) in &seen[1..] {
        assert_eq!(images, &seen[0].1, "{engine} and {} differ", seen[0].0);
    }
}

/// A new layer exactly the size of one of its parent's (4 MiB of random bytes in an
/// eight-letter file over the same in the parent) builds and normalises on every engine kind.
/// On Docker 20.10, whose export names layers by an id that says nothing of their content,
/// such a layer is first taken for the parent's by its size and the export read again; with
/// the load running beside the export, that second reading once left the build waiting for
/// good. `timeout` turns such a wait into this test's failure.
#[test]
fn a_new_layer_the_size_of_its_parents_builds_on_every_engine_kind() {
    let testbed = Testbed::get();
    let project = support::ship_project(4, "same-size");
    let wrap = support::reference(&project, "wrap");
    for (node, kind) in engine_kinds(testbed, &project) {
        if node != "builder" {
            testbed.script("load-bases", &["--node", &node]);
        }
        let config = testbed.config_with_builder(project.root(), &node);
        let build = std::process::Command::new("timeout")
            .args(["--kill-after=10", "600", env!("CARGO_BIN_EXE_hallmark")])
            .args([
                "--config",
                config.to_str().unwrap(),
                "-q",
                "build",
                "--force",
            ])
            .arg("wrap")
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(".test-cache"))
            .env_remove("DOCKER_HOST")
            .output()
            .unwrap();
        assert!(
            build.status.success(),
            "build on {node} ({kind}): {:?}\n{}",
            build.status,
            String::from_utf8_lossy(&build.stderr)
        );
        let layers = testbed.docker_ok(
            &node,
            &[
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}}",
                &wrap,
            ],
        );
        let layers: Vec<String> = serde_json::from_str(&layers).unwrap();
        let (last, below) = layers.split_last().unwrap();
        assert!(!below.contains(last), "{node} ({kind}): {layers:?}");
        let sizes = testbed.run_container(&node, &wrap, &["wc", "-c", "/base.bin", "/wrap.bin"]);
        assert_eq!(
            sizes.matches("4194304").count(),
            2,
            "{node} ({kind}): {sizes}"
        );
    }
}

/// One engine of each kind (version and image store) in the testbed, the builder first.
fn engine_kinds(testbed: &Testbed, project: &TestProject) -> Vec<(String, String)> {
    let (_, nodes) = support::hallmark_json(project, &testbed.config(), &["nodes"]);
    let mut kinds: Vec<(String, String)> = Vec::new();
    for row in nodes.as_array().unwrap() {
        let kind = format!("{} {}", row["version"], row["image_store"]);
        if !kinds.iter().any(|(_, k)| *k == kind) {
            kinds.push((row["node"].as_str().unwrap().to_string(), kind));
        }
    }
    kinds
}

/// The digest of the config of `reference` on `node`, from its `docker save`.
fn config_digest(testbed: &Testbed, node: &str, reference: &str) -> String {
    let saved = testbed.docker(node, &["save", reference]);
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    let mut archive = tar::Archive::new(saved.stdout.as_slice());
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.path().unwrap().to_str() == Some("manifest.json") {
            let manifest: serde_json::Value = serde_json::from_reader(entry).unwrap();
            let config = manifest[0]["Config"].as_str().unwrap();
            // `blobs/sha256/<hex>` (Docker 25+) or `<hex>.json` (Docker 20.10).
            let hex = config
                .trim_start_matches("blobs/sha256/")
                .trim_end_matches(".json");
            return format!("sha256:{hex}");
        }
    }
    panic!("no manifest.json in the save of {reference} on {node}")
}

#[test]
fn check_repro_names_a_file_that_differs_and_passes_hello() {
    let testbed = Testbed::get();
    let (project, _tag) = hello_project();
    let config = testbed.config();
    let run = project
        .with_config(&config)
        .run(&["--json", "build", "--check-repro", "hello"]);
    run.success();
    assert!(run.stderr().contains("reproducible"), "{}", run.stderr());
    let records: serde_json::Value = support::document(&run.stdout());
    assert!(
        records
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["reproducible"] == true),
        "{records}"
    );

    let spec = project.read("images/hello/image.toml");
    project.write(
        "images/hello/image.toml",
        &spec.replace(
            "run = [\"hello > /etc/hello.txt\"]",
            "run = [\"hello > /etc/hello.txt\", \"date +%s%N > /stamp\"]",
        ),
    );
    let run = project
        .with_config(&config)
        .run(&["build", "--check-repro", "hello"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    let differs: Vec<&str> = err.lines().filter(|l| l.starts_with("differs: ")).collect();
    assert_eq!(differs.len(), 1, "{err}");
    assert!(differs[0].ends_with("/stamp: content"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Every answer true: a checksum label only on images that passed (issue 14).

/// A project with one image `name` on the testbed's busybox base, `image_keys` added to its
/// `[image]` table and `body` after `[from]`, labelled with a run word of its own so tests
/// sharing the builder share nothing (`RUNWORD` in `body` becomes it too, for RUN steps the
/// engine's build cache must not have seen). Returns the project, the tag and the checksum.
fn busybox_project(name: &str, image_keys: &str, body: &str) -> (TestProject, String, String) {
    let project = TestProject::new();
    let run = unique();
    let body = body.replace("RUNWORD", &run);
    let spec = format!(
        "[image]\nname = \"{name}-{run}\"\n{image_keys}\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n{body}\n\n[labels]\n\"test.run\" = \"{run}\"\n"
    );
    project
        .write(&format!("images/{name}/image.toml"), &spec)
        .write(&format!("pins/{name}.toml"), support::hello_pins())
        .write(&format!("images/{name}/marker.txt"), "marker\n");
    let checksum = project.run(&["checksum", name]).success().stdout()[..64].to_string();
    (project, format!("{name}-{run}:latest"), checksum)
}

/// Ids of the images on `node` (intermediate ones included) labelled `hallmark.checksum=value`.
fn images_labelled(testbed: &Testbed, node: &str, value: &str) -> Vec<String> {
    let filter = format!("label=hallmark.checksum={value}");
    let listed = testbed.docker_ok(node, &["images", "-aq", "--filter", &filter]);
    listed.lines().map(String::from).collect()
}

/// Containers on `node` (running or not) whose image is labelled `hallmark.checksum=value`.
/// (The engine's builder commits a LABEL step through such a container too: it is created,
/// never started, and removed by the engine itself.)
fn containers_labelled(testbed: &Testbed, node: &str, value: &str) -> Vec<String> {
    let filter = format!("label=hallmark.checksum={value}");
    let listed = testbed.docker_ok(node, &["ps", "-aq", "--filter", &filter]);
    listed.lines().map(String::from).collect()
}

/// The running containers among them: smoke tests.
fn running_labelled(testbed: &Testbed, node: &str, value: &str) -> Vec<String> {
    let filter = format!("label=hallmark.checksum={value}");
    let listed = testbed.docker_ok(
        node,
        &[
            "ps",
            "-q",
            "--filter",
            &filter,
            "--filter",
            "status=running",
        ],
    );
    listed.lines().map(String::from).collect()
}

fn pending(checksum: &str) -> String {
    format!("pending-{checksum}")
}

/// The three ways an image is made (assembled, engine-built and normalised, engine-built
/// as is): each stamps its checksum only after its smoke tests pass.
const MAKINGS: [(&str, &str, &str); 3] = [
    ("assembled", "", ""),
    ("built", "", "[build]\nrun = [\"echo built > /built\"]\n"),
    (
        "built",
        "normalize = false",
        "[build]\nrun = [\"echo built > /built\"]\n",
    ),
];

#[test]
fn a_failed_smoke_test_leaves_no_image_with_the_checksum_and_a_re_run_builds_again() {
    let testbed = Testbed::get();
    let config = testbed.config();
    for (outcome, image_keys, build) in MAKINGS {
        let body = format!(
            "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n\n{build}\n[[smoke]]\nname = \"fails\"\nrun = [\"sh\", \"-c\", \"echo smoke-said-no; exit 3\"]\n"
        );
        let (project, tag, checksum) = busybox_project("smokefail", image_keys, &body);
        for attempt in ["first", "re-run"] {
            let (code, records) =
                support::hallmark_json(&project, &config, &["build", "smokefail"]);
            assert_eq!(code, 1, "{outcome} {image_keys} {attempt}: {records}");
            let record = records.as_array().unwrap().last().unwrap();
            assert_eq!(record["outcome"], "failed", "{attempt}: {record}");
            assert!(
                record["error"]
                    .as_str()
                    .unwrap()
                    .contains("smoke test `fails`"),
                "{record}"
            );
            assert_eq!(record["smoke"][0]["passed"], false, "{record}");
            assert!(
                images_labelled(testbed, "builder", &checksum).is_empty(),
                "{outcome} {image_keys} {attempt}: an image that failed its smoke test carries the checksum"
            );
            assert!(
                !testbed
                    .docker("builder", &["image", "inspect", &tag])
                    .status
                    .success()
            );
        }
        let shipped =
            project
                .with_config(&config)
                .run(&["distribute", "smokefail", "--to", "node2"]);
        assert_ne!(shipped.code(), 0, "a failed image was shipped");

        // The same making with a passing smoke test is stamped, and nothing unfinished stays.
        let passing = body.replace("echo smoke-said-no; exit 3", "grep -q marker /marker.txt");
        let (project, tag, checksum) = busybox_project("smokepass", image_keys, &passing);
        let (code, records) = support::hallmark_json(&project, &config, &["build", "smokepass"]);
        assert_eq!(code, 0, "{records}");
        assert_eq!(records[0]["outcome"], outcome, "{records}");
        assert_eq!(testbed.checksum_label("builder", &tag), checksum);
        assert_eq!(
            images_labelled(testbed, "builder", &checksum),
            vec![testbed.image_id("builder", &tag)[7..19].to_string()]
        );
        // What is left unfinished is at most the parent of the stamped image (normalize =
        // false): never an image of its own, so never found.
        let filter = format!("label=hallmark.checksum={}", pending(&checksum));
        let top_level = testbed.docker_ok("builder", &["images", "-q", "--filter", &filter]);
        assert_eq!(top_level, "", "{outcome} {image_keys}");
    }
}

/// Sends `signal` to `child` (`-INT` as Ctrl-C does, `-TERM` as a CI cancel or a systemd stop
/// does) and returns how it ended.
fn interrupt(child: std::process::Child, signal: &str) -> (Option<i32>, String) {
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn ctrl_c_during_normalisation_or_smoke_leaves_no_container_and_nothing_to_adopt() {
    let testbed = Testbed::get();
    let config = testbed.config();
    // A layer big enough that normalising it takes a while, and a smoke test that never ends.
    let body = "[build]\nrun = [\"dd if=/dev/zero of=/big bs=1M count=200 && echo RUNWORD > /built-by\"]\n\n[[smoke]]\nname = \"hangs\"\nrun = [\"sleep\", \"600\"]\n";
    let (project, tag, checksum) = busybox_project("interrupted", "", body);
    let unfinished = pending(&checksum);

    // First: interrupted during normalisation: the engine's image is there, the normalised
    // one (a second unfinished image) not yet.
    let child = support::spawn(&project, &config, &["build", "interrupted"]);
    support::wait_for("the engine's unfinished image alone", || {
        images_labelled(testbed, "builder", &unfinished).len() == 1
    });
    let (code, stderr) = interrupt(child, "-INT");
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    // Second: the re-run makes the image again (nothing was adopted) and is stopped by
    // SIGTERM in its smoke test, handled as Ctrl-C is (it killed hallmark and left the
    // smoke container running).
    let child = support::spawn(&project, &config, &["build", "interrupted"]);
    support::wait_for("the re-run's smoke container", || {
        !running_labelled(testbed, "builder", &unfinished).is_empty()
    });
    let (code, stderr) = interrupt(child, "-TERM");
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        !stderr.contains("up-to-date"),
        "an unfinished image was adopted: {stderr}"
    );

    let left = containers_labelled(testbed, "builder", &unfinished);
    assert!(
        left.is_empty(),
        "{left:?} {}",
        testbed.docker_ok("builder", &["ps", "-a", "--no-trunc"])
    );
    assert!(containers_labelled(testbed, "builder", &checksum).is_empty());
    assert!(images_labelled(testbed, "builder", &checksum).is_empty());
    assert!(
        !testbed
            .docker("builder", &["image", "inspect", &tag])
            .status
            .success()
    );
    let verify = project
        .with_config(&config)
        .run(&["verify", "interrupted", "--nodes", "node2"]);
    assert_ne!(verify.code(), 0, "{}", verify.stdout());
}

#[test]
fn smoke_runs_the_tagged_image_not_another_with_the_same_label() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n\n[[smoke]]\nname = \"marker\"\nrun = [\"grep\", \"-q\", \"marker\", \"/marker.txt\"]\n";
    let (project, tag, _) = busybox_project("forged", "", body);
    project
        .with_config(&config)
        .run(&["build", "forged"])
        .success();
    project
        .with_config(&config)
        .run(&["smoke", "forged"])
        .success();
    // The tag now names an image hallmark did not make; the real one is still on the engine.
    testbed.docker_ok("builder", &["tag", "hallmark-testbed/busybox:latest", &tag]);
    let forged = project.with_config(&config).run(&["smoke", "forged"]);
    assert_eq!(forged.code(), 1, "{}", forged.stderr());
    // Judged as verify judges (issue 42): the image under the tag is not the build of the
    // spec's checksum.
    assert!(
        forged
            .stderr()
            .contains("carries checksum (none), the spec says"),
        "{}",
        forged.stderr()
    );
}

/// `docker build` of an image on `node` tagged `tag` that carries `checksum` as its label,
/// as anyone can write it: what hallmark must not take for its own build.
fn forge(testbed: &Testbed, node: &str, from: &str, tag: &str, checksum: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("Dockerfile"),
        format!("FROM {from}\nRUN echo marker > /marker.txt && echo forged > /forged\nLABEL hallmark.checksum={checksum}\n"),
    )
    .unwrap();
    let built = std::process::Command::new("docker")
        .args(["-H", &testbed.endpoint(node), "build", "-q", "-t", tag])
        .arg(dir.path())
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

/// Issue 42: `smoke` trusts hallmark's record as `verify` does, not the label. A plain
/// `docker build` with the checksum label copied in is refused on the builder and on every
/// node kind of the testbed (the image there is not the one hallmark finished).
#[test]
fn smoke_refuses_an_image_hallmark_did_not_finish_on_the_builder_and_on_nodes() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n\n[[smoke]]\nname = \"marker\"\nrun = [\"grep\", \"-q\", \"marker\", \"/marker.txt\"]\n";
    let (project, tag, checksum) = busybox_project("forgery", "", body);
    // Nothing built by hallmark yet: a forged image on the builder passes no smoke.
    forge(
        testbed,
        "builder",
        "hallmark-testbed/busybox:latest",
        &tag,
        &checksum,
    );
    let forged = project.with_config(&config).run(&["smoke", "forgery"]);
    assert_eq!(forged.code(), 1, "{}", forged.stderr());
    assert!(
        forged.stderr().contains("hallmark did not finish it"),
        "{}",
        forged.stderr()
    );
    // The real one, built and shipped; then on each node a forged image under its tag (the
    // label copied onto another image).
    project
        .with_config(&config)
        .run(&["-q", "build", "forgery", "--force"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "forgery"])
        .success();
    for node in testbed.nodes() {
        forge(testbed, &node, &tag, &tag, &checksum);
        let forged = project
            .with_config(&config)
            .run(&["smoke", "forgery", "--node", &node]);
        assert_eq!(forged.code(), 1, "{node}: {}", forged.stderr());
        assert!(
            forged.stderr().contains("is not the current build of"),
            "{node}: {}",
            forged.stderr()
        );
    }
    // The real image, shipped again, passes on every node.
    project
        .with_config(&config)
        .run(&["-q", "distribute", "forgery"])
        .success();
    for node in testbed.nodes() {
        project
            .with_config(&config)
            .run(&["smoke", "forgery", "--node", &node])
            .success();
    }
}

/// The `distribute`, `status` and `verify` tables, exactly: one image sent to one node (then
/// skipped there), current on it and missing on the others, then stale everywhere it is once
/// its spec changes, and current everywhere once the new build is sent to every node. The
/// project's unique names, engine addresses, the hex of checksums and ids, and the bytes and
/// seconds of a transfer are filtered out (support::testbed_transcript); the rest is what the
/// user reads.
#[test]
fn distribute_status_and_verify_tables_read_exactly_as_snapshotted() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let project = support::ship_project(1, "v1");
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    let first = &testbed.nodes()[0];
    let filtered = |run: &support::Run| support::testbed_transcript(&project, &config, run);
    // The distribute table: what each node took; the bytes and seconds vary. (Whether a
    // node takes a thin or a full copy of an image new to it depends on what earlier tests
    // left there, so a first sending is `--full`.)
    let shipped = |run: &support::Run| {
        let text = support::without_column(&filtered(run), "bytes sent", "[bytes]");
        support::without_column(&text, "seconds", "[s]")
    };
    let run = project
        .with_config(&config)
        .run(&["distribute", "wrap", "--to", first, "--full"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    insta::assert_snapshot!("distribute_to_one_node", shipped(&run));
    let run = project
        .with_config(&config)
        .run(&["distribute", "wrap", "--to", first]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    insta::assert_snapshot!("distribute_again_skips_it", shipped(&run));
    insta::assert_snapshot!(
        "status_one_node_current",
        filtered(&project.with_config(&config).run(&["status"]))
    );
    insta::assert_snapshot!(
        "verify_one_node_current",
        filtered(&project.with_config(&config).run(&["verify", "wrap"]))
    );
    let spec = project.read("images/wrap/image.toml");
    project.write(
        "images/wrap/image.toml",
        &spec.replace("VERSION = \"v1\"", "VERSION = \"v2\""),
    );
    insta::assert_snapshot!(
        "status_after_a_spec_change",
        filtered(&project.with_config(&config).run(&["status"]))
    );
    insta::assert_snapshot!(
        "verify_before_the_new_build",
        filtered(&project.with_config(&config).run(&["verify", "wrap"]))
    );
    project
        .with_config(&config)
        .run(&["-q", "build", "wrap"])
        .success();
    insta::assert_snapshot!(
        "verify_after_the_new_build",
        filtered(&project.with_config(&config).run(&["verify", "wrap"]))
    );
    // The new build: thin to the node that holds the old one (its parent's layers), then
    // skipped there and whole to every other node; verify and status say current everywhere.
    let run = project
        .with_config(&config)
        .run(&["distribute", "wrap", "--to", first]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    insta::assert_snapshot!("distribute_the_new_build_thin", shipped(&run));
    let run = project
        .with_config(&config)
        .run(&["distribute", "wrap", "--full"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    insta::assert_snapshot!("distribute_to_every_node", shipped(&run));
    insta::assert_snapshot!(
        "verify_every_node_current",
        filtered(&project.with_config(&config).run(&["verify", "wrap"]))
    );
    insta::assert_snapshot!(
        "status_every_node_current",
        filtered(&project.with_config(&config).run(&["status"]))
    );
}

#[test]
fn status_says_unverified_when_the_builder_no_longer_holds_the_image() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n";
    let (project, tag, _) = busybox_project("gone", "", body);
    project
        .with_config(&config)
        .run(&["build", "gone"])
        .success();
    project
        .with_config(&config)
        .run(&["distribute", "gone", "--to", "node2"])
        .success();
    let state = |report: &serde_json::Value| {
        report
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == "node2")
            .unwrap()["state"]
            .clone()
    };
    let (_, report) = support::hallmark_json(&project, &config, &["status"]);
    assert_eq!(state(&report), "current", "{report}");
    testbed.docker_ok("builder", &["rmi", &tag]);
    let (code, report) = support::hallmark_json(&project, &config, &["status"]);
    assert_eq!(code, 0);
    assert_eq!(state(&report), "unverified", "{report}");
}

#[test]
fn two_builds_of_one_image_at_once_give_one_build_and_one_adoption() {
    let testbed = Testbed::get();
    let config = testbed.config();
    // Not normalised: two builds would give two different images.
    let body = "[build]\nrun = [\"sleep 5 && echo RUNWORD > /built-by\"]\n";
    let (project, _, checksum) = busybox_project("twice", "normalize = false", body);
    let log = project
        .root()
        .join(format!(".hallmark/logs/twice-{}.log", &checksum[..12]));
    let first = support::spawn(&project, &config, &["--json", "build", "twice"]);
    support::wait_for("the first build's RUN step", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("sleep 5"))
    });
    let second = support::spawn(&project, &config, &["--json", "build", "twice"]);
    let mut records = Vec::new();
    for child in [first, second] {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = support::document(&String::from_utf8_lossy(&output.stdout));
        records.push(report[0].clone());
    }
    let mut outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["built", "up-to-date"], "{records:?}");
    assert_eq!(records[0]["image_id"], records[1]["image_id"]);
    assert_eq!(images_labelled(testbed, "builder", &checksum).len(), 1);
}

#[test]
fn a_failed_build_still_reports_its_parents_in_json_and_its_output_as_plain_text() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let (project, _, _) = busybox_project(
        "parent",
        "",
        "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n",
    );
    project.write(
        "images/child/image.toml",
        "[from]\nimage = \"parent\"\n\n[build]\nrun = [\"printf '\\\\033[31mred-failure\\\\033[0m\\\\n'; exit 4\"]\n",
    );
    let run = project
        .with_config(&config)
        .run(&["--json", "build", "child"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let records: serde_json::Value = support::document(&run.stdout());
    let outcomes: Vec<&str> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["assembled", "failed"], "{records}");
    assert!(
        records[0]["image_id"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let stderr = run.stderr();
    assert!(stderr.contains("red-failure"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "escape sequences in {stderr:?}");
    assert!(!records[1]["error"].as_str().unwrap().contains('\u{1b}'));
}

/// The builder's platform and another one it is not.
fn foreign_platform(testbed: &Testbed) -> (String, String) {
    let own = testbed.docker_ok(
        "builder",
        &["version", "--format", "{{.Server.Os}}/{{.Server.Arch}}"],
    );
    let other = if own.ends_with("/arm64") {
        "linux/amd64"
    } else {
        "linux/arm64"
    };
    (own, other.to_string())
}

#[test]
fn the_platform_a_spec_names_is_the_platform_it_gets_or_the_build_says_why_not() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let (own, other) = foreign_platform(testbed);
    let platform = format!("platform = \"{other}\"");

    // RUN steps on a parent of the builder's own platform: they run as the parent's platform
    // (the builder can emulate the other one, but the parent is not of it), and the image
    // made is refused before its tag moves.
    let (project, _, _) = busybox_project("foreignrun", &platform, "[build]\nrun = [\"true\"]\n");
    let run = project.with_config(&config).run(&["build", "foreignrun"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains(&format!("is {own}, but its spec names {other}")),
        "{}",
        run.stderr()
    );

    // Assembled on a parent of the builder's own platform: the result is not what it names.
    let files = "[[file]]\nsrc = \"marker.txt\"\ndest = \"/marker.txt\"\n";
    let (project, _, _) = busybox_project("foreignparent", &platform, files);
    let run = project
        .with_config(&config)
        .run(&["build", "foreignparent"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains(&format!("is {own}, but its spec names {other}")),
        "{}",
        run.stderr()
    );

    // A parent of the other platform: assembled, and its smoke tests say why they cannot run.
    let base = format!("foreign-base-{}:latest", unique());
    support::load_labelled_base(testbed, &base, other.rsplit('/').next().unwrap());
    let (project, _, _) = busybox_project(
        "foreignsmoke",
        &platform,
        &format!("{files}\n[[smoke]]\nname = \"runs\"\nrun = [\"true\"]\n"),
    );
    let spec = project.read("images/foreignsmoke/image.toml");
    project.write(
        "images/foreignsmoke/image.toml",
        &spec.replace("hallmark-testbed/busybox:latest", &base),
    );
    project.write("pins/foreignsmoke.toml", "");
    project
        .with_config(&config)
        .run(&["lock", "foreignsmoke"])
        .success();
    // Emulation off: the smoke tests cannot run, and the build says why.
    let run = project
        .with_config(&config)
        .run(&["build", "foreignsmoke", "--no-emulate"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr().contains(&format!(
            "cannot run the smoke tests of `foreignsmoke` ({other}) here: the engine is {own}, and emulation is off"
        )),
        "{}",
        run.stderr()
    );
    // On: the engine is asked (a probe of that platform), and they run emulated.
    let run = project
        .with_config(&config)
        .run(&["--json", "build", "foreignsmoke"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let records = support::document(&run.stdout());
    assert_eq!(records[0]["smoke"][0]["emulated"], true, "{records}");
}

// ---------------------------------------------------------------------------------------
// The engine is found as the docker CLI finds it (issue 15).

/// `hallmark --json nodes` in `project` with exactly `env` of the docker CLI's variables set;
/// returns the exit code and the local engine's row.
fn local_engine_row(project: &TestProject, env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let mut command = support::hallmark();
    command
        .args(["--json", "nodes"])
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"));
    for key in [
        "DOCKER_HOST",
        "DOCKER_CONTEXT",
        "DOCKER_CONFIG",
        "DOCKER_TLS_VERIFY",
        "DOCKER_CERT_PATH",
    ] {
        command.env_remove(key);
    }
    command.envs(env.iter().copied());
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let row = serde_json::from_str::<serde_json::Value>(&stdout)
        .map(|document| document["nodes"][0].clone())
        .unwrap_or_else(|_| serde_json::json!({"stderr": String::from_utf8_lossy(&output.stderr)}));
    (output.status.code().unwrap(), row)
}

/// Writes the docker context `name` (engine `host`) into the docker config folder `config`,
/// in the docker CLI's layout; with `tls`, its TLS folder holds copies of those files.
fn write_docker_context(
    config: &std::path::Path,
    name: &str,
    host: &str,
    skip_verify: bool,
    tls: Option<&std::path::Path>,
) {
    use sha2::Digest as _;
    let id = hex::encode(sha2::Sha256::digest(name.as_bytes()));
    let meta = config.join("contexts/meta").join(&id);
    std::fs::create_dir_all(&meta).unwrap();
    let document = serde_json::json!({"Name": name, "Metadata": {}, "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": skip_verify}}});
    std::fs::write(meta.join("meta.json"), document.to_string()).unwrap();
    if let Some(from) = tls {
        let to = config.join("contexts/tls").join(&id).join("docker");
        std::fs::create_dir_all(&to).unwrap();
        for file in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
    }
}

#[test]
fn the_local_engine_is_found_as_the_docker_cli_finds_it() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let config = tempfile::tempdir().unwrap();
    let config_dir = config.path().to_str().unwrap();
    let builder = testbed.endpoint("builder");
    let node2 = testbed.endpoint("node2");
    write_docker_context(config.path(), "hm-builder", &builder, false, None);
    write_docker_context(
        config.path(),
        "hm-unverified",
        "tcp://127.0.0.1:9",
        true,
        None,
    );

    // DOCKER_CONTEXT names a context of the docker config.
    let (code, row) = local_engine_row(
        &project,
        &[
            ("DOCKER_CONFIG", config_dir),
            ("DOCKER_CONTEXT", "hm-builder"),
        ],
    );
    assert_eq!(
        (code, &row["engine"], &row["reachable"]),
        (0, &builder.clone().into(), &true.into()),
        "{row}"
    );
    // Else the config's current context.
    std::fs::write(
        config.path().join("config.json"),
        r#"{"currentContext": "hm-builder"}"#,
    )
    .unwrap();
    let (code, row) = local_engine_row(&project, &[("DOCKER_CONFIG", config_dir)]);
    assert_eq!(
        (code, &row["engine"]),
        (0, &builder.clone().into()),
        "{row}"
    );
    // DOCKER_HOST wins over both.
    let (code, row) = local_engine_row(
        &project,
        &[
            ("DOCKER_CONFIG", config_dir),
            ("DOCKER_CONTEXT", "hm-builder"),
            ("DOCKER_HOST", &node2),
        ],
    );
    assert_eq!((code, &row["engine"]), (0, &node2.clone().into()), "{row}");
    // A context that does not exist, or that skips TLS verification, is refused by name.
    for (context, says) in [
        (
            "hm-missing",
            "`hm-missing` (chosen by DOCKER_CONTEXT) does not exist",
        ),
        ("hm-unverified", "skips TLS verification"),
    ] {
        let (code, row) = local_engine_row(
            &project,
            &[("DOCKER_CONFIG", config_dir), ("DOCKER_CONTEXT", context)],
        );
        assert_eq!(code, 2, "{row}");
        assert!(row["stderr"].as_str().unwrap().contains(says), "{row}");
    }
}

/// Runs `openssl ARGS` in `dir`; it must succeed.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let output = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA in `dir` (ca.pem, ca-key.pem) and a certificate `name`.pem / `name`-key.pem signed by it.
fn certificate_authority(dir: &std::path::Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=hallmark test CA",
        ],
    );
}

fn signed(dir: &std::path::Path, name: &str, extensions: &str) {
    let key = format!("{name}-key.pem");
    let csr = format!("{name}.csr");
    let cert = format!("{name}.pem");
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), extensions).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

#[test]
fn a_tcp_engine_is_reached_with_the_docker_clis_tls_settings_and_refused_with_another_ca() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let pki = tempfile::tempdir().unwrap();
    certificate_authority(pki.path());
    signed(
        pki.path(),
        "server",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    signed(pki.path(), "client", "extendedKeyUsage=clientAuth\n");
    // The docker CLI's cert folder: the CA, the client's certificate and key.
    let certs = pki.path().join("client-certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(pki.path().join("ca.pem"), certs.join("ca.pem")).unwrap();
    std::fs::copy(pki.path().join("client.pem"), certs.join("cert.pem")).unwrap();
    std::fs::copy(pki.path().join("client-key.pem"), certs.join("key.pem")).unwrap();

    let socket = testbed.endpoint("builder");
    let mut proxy = std::process::Command::new("/usr/bin/python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tls_proxy.py"
        ))
        .args([
            "--cert",
            "server.pem",
            "--key",
            "server-key.pem",
            "--ca",
            "ca.pem",
            "--unix",
        ])
        .arg(socket.trim_start_matches("unix://"))
        .current_dir(pki.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(proxy.stdout.take().unwrap()),
        &mut port,
    )
    .unwrap();
    let host = format!("tcp://127.0.0.1:{}", port.trim());

    let certs_dir = certs.to_str().unwrap();
    let (code, row) = local_engine_row(
        &project,
        &[
            ("DOCKER_HOST", &host),
            ("DOCKER_TLS_VERIFY", "1"),
            ("DOCKER_CERT_PATH", certs_dir),
        ],
    );
    assert_eq!(
        (code, &row["reachable"], &row["via"]),
        (0, &true.into(), &"tcp+tls".into()),
        "{row}"
    );

    // The same through a context whose TLS folder holds the files.
    let config = tempfile::tempdir().unwrap();
    write_docker_context(config.path(), "hm-tls", &host, false, Some(&certs));
    let (code, row) = local_engine_row(
        &project,
        &[
            ("DOCKER_CONFIG", config.path().to_str().unwrap()),
            ("DOCKER_CONTEXT", "hm-tls"),
        ],
    );
    assert_eq!(
        (code, &row["reachable"], &row["via"]),
        (0, &true.into(), &"tcp+tls".into()),
        "{row}"
    );

    // Another CA: the engine's certificate is not trusted, and nothing is sent in the clear.
    let other = pki.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    certificate_authority(&other);
    std::fs::copy(other.join("ca.pem"), certs.join("ca.pem")).unwrap();
    let (code, row) = local_engine_row(
        &project,
        &[
            ("DOCKER_HOST", &host),
            ("DOCKER_TLS_VERIFY", "1"),
            ("DOCKER_CERT_PATH", certs_dir),
        ],
    );
    assert_eq!((code, &row["reachable"]), (1, &false.into()), "{row}");
    let _ = proxy.kill();
    let _ = proxy.wait();
}

/// Issue 15: every request carries the negotiated API version in its path (bollard 0.21
/// drops it, and each engine then answers at its newest API). The testbed's daemons run with
/// `--debug`, which logs each request's path (`Calling GET /v1.41/...` on Docker 20.10 and 26,
/// `request-url="/v1.51/..."` on Docker 28).
#[test]
fn requests_carry_the_negotiated_api_version() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    let config = testbed.config();
    let (_, nodes) = support::hallmark_json(&project, &config, &["nodes"]);
    for row in nodes.as_array().unwrap() {
        let node = row["node"].as_str().unwrap();
        // Nothing holds this image: smoke asks the node for it by name (status and verify
        // list each node's images once instead), and says it is not there.
        let smoke = project
            .with_config(&config)
            .run(&["smoke", "hello", "--node", node]);
        assert_ne!(smoke.code(), 0, "{}", smoke.stderr());
        let api = row["api_used"].as_str().unwrap();
        assert_eq!(row["api"], api, "the newest both speak: {row}");
        let log = std::fs::read_to_string(testbed.dir.join(node).join("dockerd.log")).unwrap();
        let asked: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("/images/{tag}/json")))
            .collect();
        assert!(!asked.is_empty(), "{node} logged no inspect of {tag}");
        for line in asked {
            assert!(
                line.contains(&format!("/v{api}/images/{tag}/json")),
                "{node}: {line}"
            );
        }
    }
}

/// Issue 15: a local-only base is pinned by its config digest, which every image store
/// agrees on. The repo's `hello` pin, written as a classic-store image id before that, builds
/// on a containerd-store builder (which does not know that id and looked
/// `docker.io/library/sha256:...` up on the network); `lock` there pins the same digest; a
/// builder without the pinned base is told to run `hallmark lock`, and nothing is pulled.
#[test]
fn a_local_base_pin_builds_on_a_containerd_store_builder() {
    let testbed = Testbed::get();
    testbed.script("load-bases", &["--node", "node1"]);
    let (project, tag) = hello_project();
    let legacy = support::hello_pins().replace("kind = \"config-digest\"", "kind = \"image-id\"");
    assert!(legacy.contains("kind = \"image-id\""));
    project.write("pins/hello.toml", &legacy);
    let config = testbed.config_with_builder(project.root(), "node1");
    let built = build_json(&project, &config, "hello");
    assert_eq!(built["outcome"], "built");
    assert_eq!(
        testbed.checksum_label("node1", &tag),
        built["checksum"].as_str().unwrap()
    );

    project
        .with_config(&config)
        .run(&["lock", "--update", "hello"])
        .success();
    let pins = project.read("pins/hello.toml");
    assert!(pins.contains("kind = \"config-digest\""), "{pins}");
    let digest = &testbed.image_id("builder", "hallmark-testbed/busybox:latest");
    assert!(
        pins.contains(digest.as_str()),
        "the classic store's id: {pins}"
    );
    assert_eq!(
        build_json(&project, &config, "hello")["outcome"],
        "up-to-date"
    );

    // A digest of this test's own, so the daemon log's lines about it are this run's.
    let absent = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&tag))
    );
    project.write("pins/hello.toml", &pins.replace(digest, &absent));
    let run = project.with_config(&config).run(&["build", "hello"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    for word in ["node1", "`hello`", &absent, "hallmark lock --update hello"] {
        assert!(err.contains(word), "says {word}: {err}");
    }
    let log = std::fs::read_to_string(testbed.dir.join("node1/dockerd.log")).unwrap();
    for line in log.lines().filter(|l| l.contains(&absent[7..])) {
        let inspect =
            line.contains("Calling GET /v1.") && line.contains(&format!("/images/{absent}/json"));
        assert!(inspect, "only ever inspected, never pulled: {line}");
    }
}

/// Issue 15: an image a Docker 28 containerd-store engine holds by name but not by content
/// (its manifest gone from containerd's content store) is answered with a stub (no OS,
/// `RootFS: {}`) that bollard's models refused ("missing field `Type`"), so a build whose tag
/// named such an image failed at its first question. hallmark reads it as an image without
/// content, and builds.
#[test]
fn a_stub_image_under_the_tag_on_a_docker_28_builder_is_read_not_refused() {
    let testbed = Testbed::get();
    let node = testbed.node_of("28", "containerd");
    testbed.script("load-bases", &["--node", &node]);
    let (project, tag) = hello_project();
    // An image of this test's own, imported (no parent: a stub left behind by a failed run
    // cannot disturb another test's build cache), removed however the test ends.
    let mut layer = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(tag.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    layer
        .append_data(&mut header, "stub", tag.as_bytes())
        .unwrap();
    let archive = project.root().join("stub.tar");
    std::fs::write(&archive, layer.into_inner().unwrap()).unwrap();
    testbed.docker_ok(&node, &["import", archive.to_str().unwrap(), &tag]);
    let manifest = testbed.image_id(&node, &tag);
    struct Remove<'a>(&'a Testbed, String, [String; 2]);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            for image in &self.2 {
                self.0.docker(&self.1, &["rmi", "-f", image]);
            }
        }
    }
    let _remove = Remove(testbed, node.clone(), [tag.clone(), manifest.clone()]);
    testbed.ctr(&node, &["content", "rm", &manifest]);
    let os = testbed.docker_ok(&node, &["image", "inspect", "--format", "[{{.Os}}]", &tag]);
    assert_eq!(os, "[]", "the engine answers a stub");

    let config = testbed.config_with_builder(project.root(), &node);
    let built = build_json(&project, &config, "hello");
    assert_eq!(built["outcome"], "built");
    assert_eq!(
        testbed.checksum_label(&node, &tag),
        built["checksum"].as_str().unwrap()
    );
}

/// Issue 14, items 3 and 4: 500 `[[file]]` entries arrive in one layer (one COPY each made
/// 503 layers, and past about 120 the engine refused with "max depth exceeded"), and each
/// `run` step is the script it says: a trailing `\` no longer swallows the next step, line
/// breaks and `#` lines are the shell's.
#[test]
fn five_hundred_files_and_run_steps_as_written_build_in_a_few_layers() {
    let testbed = Testbed::get();
    let project = TestProject::new();
    let run = unique();
    let upstream = GitRepo::new(project.root(), "upstream");
    upstream.commit(&[("greeting.txt", "hello\n")], "first");
    // A source and an expected file at paths with `$` and `'`: written quoted, not expanded.
    let mut spec = format!(
        "[image]\nname = \"many-{run}\"\n\n[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n\
         [[source]]\nname = \"upstream\"\ngit = \"{}\"\nrev = \"main\"\ndest = \"/opt/s$HOME'x\"\n\n",
        upstream.url()
    );
    for i in 0..500 {
        spec.push_str(&format!(
            "[[file]]\nsrc = \"f/{i}\"\ndest = \"/opt/many/{i}.txt\"\n"
        ));
        project.write(&format!("images/many/f/{i}"), &format!("file {i}\n"));
    }
    spec.push_str(
        r#"
[build]
run = [
  "ls /opt/many | wc -l > /count && echo one > /one \\",
  "echo two > /two",
  '''
echo three > /three
# a comment line, and a continued one:
echo four \
  > /four
''',
]
expect-files = ["/opt/many/499.txt", "/opt/s$HOME'x/greeting.txt"]
"#,
    );
    project
        .write("images/many/image.toml", &spec)
        .write("pins/many.toml", support::hello_pins());
    project.run(&["lock", "many"]).success();
    let record = build_json(&project, &testbed.config(), "many");
    assert_eq!(record["outcome"], "built", "{record}");
    let tag = format!("many-{run}:latest");
    let layers = |image: &str| {
        testbed
            .docker_ok(
                "builder",
                &[
                    "image",
                    "inspect",
                    "--format",
                    "{{len .RootFS.Layers}}",
                    image,
                ],
            )
            .parse::<usize>()
            .unwrap()
    };
    let parent = layers("hallmark-testbed/busybox:latest");
    // At most one layer each for the source, all the files, each RUN step and the
    // expect-files check (a step that changes nothing may add none).
    let added = layers(&tag) - parent;
    assert!(added <= 1 + 1 + 3 + 1, "{added} layers");
    let out = testbed.run_container(
        "builder",
        &tag,
        &[
            "sh",
            "-c",
            "cat /count /one /two /three /four /opt/many/0.txt /opt/many/499.txt \"/opt/s\\$HOME'x/greeting.txt\"",
        ],
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        // The trailing `\` is the shell's to read: busybox sh gives it to echo.
        [
            "500", "one", "\\", "two", "three", "four", "file", "0", "file", "499", "hello"
        ]
    );
}

/// The layer blobs (not configs or manifests) in the project's layer store, as digests.
fn stored_layers(project: &TestProject) -> Vec<String> {
    let blobs = project.root().join(".test-cache/store/blobs/sha256");
    let mut layers = Vec::new();
    for entry in std::fs::read_dir(&blobs).unwrap() {
        let path = entry.unwrap().path();
        let mut first = [0u8; 1];
        std::io::Read::read(&mut std::fs::File::open(&path).unwrap(), &mut first).unwrap();
        if !matches!(&first, b"{" | b"[") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            layers.push(format!("sha256:{name}"));
        }
    }
    layers
}

/// The blob digests of `reference` as `node` exports it (Docker 25+: `blobs/sha256/<hex>`).
fn blobs_of(testbed: &Testbed, node: &str, reference: &str) -> Vec<String> {
    let saved = testbed.docker(node, &["save", reference]);
    assert!(saved.status.success(), "docker save {reference} on {node}");
    let mut archive = tar::Archive::new(saved.stdout.as_slice());
    let mut blobs = Vec::new();
    for entry in archive.entries().unwrap() {
        let path = entry
            .unwrap()
            .path()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if let Some(hex) = path.strip_prefix("blobs/sha256/") {
            blobs.push(format!("sha256:{hex}"));
        }
    }
    blobs
}

/// The layers (diff ids) of `reference` on `node`.
fn layers_of(testbed: &Testbed, node: &str, reference: &str) -> Vec<String> {
    let args = [
        "image",
        "inspect",
        "--format",
        "{{json .RootFS.Layers}}",
        reference,
    ];
    serde_json::from_str(&testbed.docker_ok(node, &args)).unwrap()
}

/// Issue 19: on every engine kind, a normalised build leaves in the layer store only the
/// normalised layers (no raw copy of the build's layers, none of the parent's written), and
/// a rebuild that moves the tag removes the image it supersedes from the builder.
#[test]
fn a_normalised_build_keeps_no_raw_copy_and_removes_the_image_it_supersedes() {
    let testbed = Testbed::get();
    let body =
        "[build]\nrun = [\"echo RUNWORD one > /built && mkdir -p /opt/d && echo x > /opt/d/f\"]\n";
    let (project, tag, _) = busybox_project("lean", "", body);
    let spec_path = project.root().join("images/lean/image.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let parent = layers_of(testbed, "builder", "hallmark-testbed/busybox:latest");
    let mut built: Vec<String> = Vec::new();
    for (round, (node, kind)) in engine_kinds(testbed, &project).iter().enumerate() {
        if node != "builder" {
            testbed.script("load-bases", &["--node", node]);
        }
        let config = testbed.config_with_builder(project.root(), node);
        let build = || {
            project
                .with_config(&config)
                .run(&["-q", "build", "lean"])
                .success();
        };
        std::fs::write(&spec_path, spec.replace(" one ", &format!(" one{round} "))).unwrap();
        build();
        let first = testbed.image_id(node, &tag);
        let first_layers = layers_of(testbed, node, &tag);
        std::fs::write(&spec_path, spec.replace(" one ", &format!(" two{round} "))).unwrap();
        build();
        let second = testbed.image_id(node, &tag);
        assert_ne!(first, second, "{node} ({kind})");
        built.extend(first_layers);
        built.extend(layers_of(testbed, node, &tag));
        // The base's blobs as this node holds it (compressed, if it came so), which the pin
        // check exports on a containerd store.
        let base_blobs = blobs_of(testbed, node, "hallmark-testbed/busybox:latest");
        for layer in stored_layers(&project) {
            // On a containerd store, the check of the external base's pin exports the base
            // into the store once (base.rs); normalisation never writes a parent's layer.
            assert!(
                !(parent.contains(&layer) || base_blobs.contains(&layer))
                    || kind.contains("containerd"),
                "{node} ({kind}): the parent's layer {layer} was written into the store"
            );
            assert!(
                built.contains(&layer) || parent.contains(&layer) || base_blobs.contains(&layer),
                "{node} ({kind}): {layer} in the store is no layer of the images built (a raw copy)"
            );
        }
        assert!(
            !testbed
                .docker(node, &["image", "inspect", &first])
                .status
                .success(),
            "{node} ({kind}): the superseded image {first} is still on the builder"
        );
    }
    // An image another tag still names stays when hallmark's tag moves off it.
    let second = testbed.image_id("builder", &tag);
    let other = format!("other-{tag}");
    testbed.docker_ok("builder", &["tag", &second, &other]);
    std::fs::write(&spec_path, spec.replace(" one ", " three ")).unwrap();
    project
        .with_config(testbed.config())
        .run(&["-q", "build", "lean"])
        .success();
    assert_eq!(testbed.image_id("builder", &other), second);
    testbed.docker_ok("builder", &["rmi", &other]);
}

/// Issue 19: a build interrupted while normalising (or right after, in its smoke test) leaves
/// the tag on the image it had and that image on the builder; nothing carries the new
/// checksum.
#[test]
fn an_interrupted_normalisation_leaves_the_tag_and_the_previous_image() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[build]\nrun = [\"echo RUNWORD > /built-by\"]\n";
    let (project, tag, _) = busybox_project("kept", "", body);
    project
        .with_config(&config)
        .run(&["-q", "build", "kept"])
        .success();
    let before = testbed.image_id("builder", &tag);
    let spec_path = project.root().join("images/kept/image.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap().replace(
        "echo ",
        "dd if=/dev/urandom of=/big bs=1M count=200 && echo ",
    ) + "\n[[smoke]]\nname = \"hangs\"\nrun = [\"sleep\", \"600\"]\n";
    std::fs::write(&spec_path, spec).unwrap();
    let checksum = project.run(&["checksum", "kept"]).success().stdout()[..64].to_string();
    let child = support::spawn(&project, &config, &["build", "kept"]);
    support::wait_for("the engine's unfinished image", || {
        !images_labelled(testbed, "builder", &pending(&checksum)).is_empty()
    });
    let (code, stderr) = interrupt(child, "-INT");
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(testbed.image_id("builder", &tag), before, "the tag moved");
    assert!(images_labelled(testbed, "builder", &checksum).is_empty());
    assert!(running_labelled(testbed, "builder", &pending(&checksum)).is_empty());
}

/// `prune` removes the step images a superseded engine build left on the builder (the
/// engine's build cache: a forced rebuild of a big image leaves as much again) and keeps
/// those of the build that made the current image, with the image; on every engine kind as
/// the builder.
#[test]
fn prune_removes_the_build_cache_of_superseded_builds_on_every_engine_kind() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    // Every step image after the ENV carries it: how this test finds its own among the
    // shared builders' images. The build arg makes the first step this test's own too, so
    // no other test's build finds a step this test's prune removes in its engine's cache.
    let run = unique();
    let marker = format!("TEST_BUILD_CACHE={run}");
    let spec = project
        .read("images/hello/image.toml")
        .replace("[env]\n", &format!("[env]\nTEST_BUILD_CACHE = \"{run}\"\n"))
        .replace(
            "[build]\n",
            &format!("[build]\nargs = {{ TEST_BUILD_CACHE = \"{run}\" }}\n"),
        );
    project.write("images/hello/image.toml", &spec);
    for (node, kind) in engine_kinds(testbed, &project) {
        if node != "builder" {
            testbed.script("load-bases", &["--node", &node]);
        }
        let config = testbed.config_with_builder(project.root(), &node);
        let ours = || -> std::collections::BTreeSet<String> {
            let listed = testbed.docker_ok(&node, &["image", "ls", "-aq", "--no-trunc"]);
            let mut ids: Vec<&str> = listed.lines().collect();
            ids.sort();
            ids.dedup();
            let mut args = vec![
                "image",
                "inspect",
                "--format",
                "{{.Id}} {{json .Config.Env}}",
            ];
            args.extend(ids);
            // Another test's image may go between the listing and this: its error is not ours.
            let inspected = testbed.docker(&node, &args);
            String::from_utf8_lossy(&inspected.stdout)
                .lines()
                .filter(|line| line.contains(&marker))
                .map(|line| line.split(' ').next().unwrap().to_string())
                .collect()
        };
        let build = || {
            project
                .with_config(&config)
                .run(&["-q", "build", "--force", "hello"])
                .success();
        };
        build();
        let first = ours();
        build();
        let second = ours();
        let current = testbed.image_id(&node, &tag);
        let superseded: Vec<&String> = first.iter().filter(|id| **id != current).collect();
        let latest: Vec<&String> = second.difference(&first).collect();
        if kind.contains("classic") {
            // The classic store's builder commits an image for every instruction.
            assert!(!superseded.is_empty(), "{node} ({kind}): {first:?}");
            assert!(!latest.is_empty(), "{node} ({kind}): {second:?}");
        }
        let pruned = project
            .with_config(&config)
            .run(&["prune"])
            .success()
            .stderr();
        let after = ours();
        eprintln!(
            "{node} ({kind}): {} steps superseded, {} of the latest build; {}",
            superseded.len(),
            latest.len(),
            pruned.trim()
        );
        assert!(
            superseded.iter().all(|id| !after.contains(*id)),
            "{node} ({kind}): {superseded:?} left after prune: {after:?}\n{pruned}"
        );
        assert!(
            latest.iter().all(|id| after.contains(*id)),
            "{node} ({kind}): the current build's cache {latest:?} went: {after:?}\n{pruned}"
        );
        assert_eq!(testbed.image_id(&node, &tag), current, "{node} ({kind})");
        let removed: usize = pruned
            .split("removed ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{pruned}"));
        assert!(removed >= superseded.len(), "{node} ({kind}): {pruned}");
        // The image still runs from what stayed.
        let greeting = testbed.run_container(&node, &tag, &["cat", "/etc/hello.txt"]);
        assert!(greeting.contains("hello from hallmark"), "{greeting}");
    }
}

/// A time past 2262 (which moby writes as the epoch when it unpacks the layer) under a source
/// date above 0: the layer directories cannot say what the export's true time clamps to, so
/// the export is read, and the image is the one the export alone makes.
#[test]
fn a_time_past_2262_normalises_as_the_export_does() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    let spec = project.read("images/hello/image.toml").replace(
        "run = [\"hello > /etc/hello.txt\"]",
        "run = [\"hello > /etc/hello.txt && touch -d '2300-01-01 00:00:00' /etc/late\"]",
    );
    let spec = spec.replace("[image]\n", "[image]\nsource-date-epoch = 1700000000\n");
    project.write("images/hello/image.toml", &spec);
    let config = testbed.config();
    let mut images = Vec::new();
    for env in [&[][..], &[("HALLMARK_NORMALIZE_FROM", "export")][..]] {
        let args = ["build", "--force", "hello"];
        let (code, records) = support::hallmark_json_with(&project, &config, &args, env);
        assert_eq!(code, 0, "{records}");
        let record = &records[0];
        assert_eq!(record["normalized_from"], "export", "{record}");
        let reason = record["normalized_from_reason"].as_str().unwrap();
        let why = if env.is_empty() {
            "epoch"
        } else {
            "HALLMARK_NORMALIZE_FROM"
        };
        assert!(reason.contains(why), "{record}");
        images.push(testbed.image_id("builder", &tag));
        let mtime = testbed.run_container("builder", &tag, &["stat", "-c", "%Y", "/etc/late"]);
        assert_eq!(mtime.trim(), "1700000000", "clamped to the source date");
    }
    assert_eq!(images[0], images[1]);
}

/// A smoke program that cannot start (not in the image) fails the build naming the image, the
/// test, its spec line and the program, in the engine's words; no container is left and
/// nothing carries the checksum. An outside test saw a bare engine 400 that named none of them.
#[test]
fn a_smoke_program_that_cannot_start_is_named_with_its_test_and_spec_line() {
    let testbed = Testbed::get();
    let body = "[build]\nrun = [\"echo RUNWORD > /built-by\"]\n\n[[smoke]]\nname = \"starts nothing\"\nrun = [\"/no/such/program\", \"--flag\"]\n";
    let (project, _, checksum) = busybox_project("unstartable", "", body);
    let config = testbed.config();
    let run = project.with_config(&config).run(&["build", "unstartable"]);
    let stderr = run.stderr();
    assert_eq!(run.code(), 1, "{stderr}");
    for word in [
        "smoke test `starts nothing`",
        "`unstartable`",
        "image.toml:",
        "/no/such/program --flag",
    ] {
        assert!(stderr.contains(word), "says {word}: {stderr}");
    }
    assert!(images_labelled(testbed, "builder", &checksum).is_empty());
    assert!(containers_labelled(testbed, "builder", &pending(&checksum)).is_empty());
}

/// Issue 39: a served smoke test (a process kept running, probed inside its container over
/// 127.0.0.1 until ready, then asked, its answer matched) passes on the builder and on every
/// node of the testbed; one whose service is never ready fails at its timeout with the
/// process's logs shown and no container left; an `expect` that does not match fails naming
/// the test. The boot options (environment, a node path mounted read-only, shared memory,
/// ulimits, user) reach the container.
#[test]
fn a_served_smoke_test_passes_everywhere_and_a_never_ready_one_fails_at_its_timeout() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let serve = r#"mkdir -p /tmp/www/v1 && echo '{"data": [{"id": "tiny-RUNWORD"}], "shm": "'$(df -k /dev/shm | tail -1 | tr -s ' ' | cut -d' ' -f2)'", "mem": "'$(ulimit -l)'", "who": "'$(id -u)'", "env": "'$SMOKE_ENV'"}' > /tmp/www/v1/models && exec httpd -f -v -p 127.0.0.1:8080 -h /tmp/www"#;
    let body = format!(
        r#"[[smoke]]
name = "served"
serve = ["sh", "-c", '''{serve}''']
ready = ["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/v1/models"]
run = ["wget", "-q", "-O", "-", "http://127.0.0.1:8080/v1/models"]
expect = '"id": "tiny-RUNWORD".*"shm": "65536".*"mem": "1024".*"who": "1234".*"env": "set"'
timeout = 60
env = {{ SMOKE_ENV = "set" }}
shm_size = "64m"
ulimits = {{ memlock = 1048576 }}
user = "1234"
"#
    );
    let (project, _tag, _checksum) = busybox_project("served", "", &body);
    project
        .with_config(&config)
        .run(&["-q", "build", "served"])
        .success();
    project
        .with_config(&config)
        .run(&["-q", "distribute", "served"])
        .success();
    for node in testbed.nodes() {
        let smoked = project
            .with_config(&config)
            .run(&["smoke", "served", "--node", &node]);
        assert_eq!(smoked.code(), 0, "{node}: {}", smoked.stderr());
    }

    // Never ready: the probe asks a port nothing serves; the process says why in its log.
    let never = "[[smoke]]\nname = \"never ready\"\nserve = [\"sh\", \"-c\", \"echo serving-nothing-RUNWORD; exec sleep 600\"]\nready = [\"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:9/\"]\nrun = [\"true\"]\ntimeout = 3\n";
    let (never_project, _, checksum) = busybox_project("never", "", never);
    let failed = never_project
        .with_config(&config)
        .run(&["--json", "build", "never"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let said = failed.stderr();
    assert!(
        said.contains("never ready") && said.contains("not ready in 3 s"),
        "{said}"
    );
    assert!(
        said.contains("serving-nothing-"),
        "the process's log is shown: {said}"
    );
    assert!(
        containers_labelled(testbed, "builder", &checksum).is_empty(),
        "a smoke container was left"
    );

    // The answer does not match: the test is named.
    let mismatch = body.replace("expect = '", "expect = 'no such answer ");
    let (wrong, _, _) = busybox_project("wrong", "", &mismatch);
    let failed = wrong.with_config(&config).run(&["build", "wrong"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    assert!(
        failed.stderr().contains("served") && failed.stderr().contains("does not match"),
        "{}",
        failed.stderr()
    );

    // A ready probe that is not in the image fails at once (not at its 600 s deadline),
    // naming it.
    let missing = "[[smoke]]\nname = \"no probe\"\nserve = [\"sh\", \"-c\", \"exec sleep 600\"]\nready = [\"no-such-probe-RUNWORD\"]\nrun = [\"true\"]\ntimeout = 600\n";
    let (missing, _, _) = busybox_project("noprobe", "", missing);
    let failed = missing.with_config(&config).run(&["build", "noprobe"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    assert!(
        failed.stderr().contains("the ready probe `no-such-probe-")
            && failed.stderr().contains("cannot run in the image (exit 12"),
        "{}",
        failed.stderr()
    );

    // A server that dies while it is probed is the server's failure: its exit code and last
    // lines, not the probe's answer. The probe tells it to die, then waits.
    let dies = "[[smoke]]\nname = \"dies\"\nserve = [\"sh\", \"-c\", \"touch /tmp/up; while [ ! -e /tmp/die ]; do sleep 0.1; done; echo dying-RUNWORD; exit 7\"]\nready = [\"test\", \"-e\", \"/tmp/up\"]\nrun = [\"sh\", \"-c\", \"touch /tmp/die; sleep 5; echo probe-answered\"]\ntimeout = 60\n";
    let (dies, _, _) = busybox_project("dies", "", dies);
    let failed = dies.with_config(&config).run(&["build", "dies"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let said = failed.stderr();
    assert!(
        said.contains("the served process exited with 7 while `sh -c touch /tmp/die")
            && said.contains("dying-"),
        "{said}"
    );
}

/// A smoke test's node path that is not there is a clear error naming the node and the path.
#[test]
fn a_smoke_mount_missing_on_the_node_names_it() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[[smoke]]\nname = \"weights\"\nrun = [\"ls\", \"/engram-local\"]\nmounts = [{ source = \"/var/tmp/no-such-weights-RUNWORD\", target = \"/engram-local\", readonly = true }]\n";
    let (project, _, _) = busybox_project("mounted", "", body);
    let failed = project.with_config(&config).run(&["build", "mounted"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let said = failed.stderr();
    assert!(
        said.contains("/var/tmp/no-such-weights-") && said.contains("builder"),
        "{said}"
    );
}

/// `on = "nodes"`: a test the builder skips (it may have no GPU) and `smoke --all-nodes` runs
/// on every node at once, one row and one JUnit suite each, naming the node. Here that test
/// fails wherever it runs: the build passes (skipped on the builder), every node fails.
#[test]
fn a_nodes_only_smoke_test_is_skipped_at_build_and_run_on_every_node() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let body = "[[smoke]]\nname = \"everywhere\"\nrun = [\"true\"]\n\n[[smoke]]\nname = \"on nodes\"\non = \"nodes\"\nrun = [\"sh\", \"-c\", \"echo nodes-only-RUNWORD; exit 7\"]\n";
    let (project, _, _) = busybox_project("onnodes", "", body);
    let record = build_json(&project, &config, "onnodes");
    let smoked = record["smoke"].as_array().unwrap();
    assert_eq!(smoked.len(), 1, "{record}");
    assert_eq!(smoked[0]["name"], "everywhere");
    project
        .with_config(&config)
        .run(&["-q", "distribute", "onnodes"])
        .success();
    // `distribute --smoke`: shipped (skipped: the nodes hold it), then tested on each node.
    let shipped = project
        .with_config(&config)
        .run(&["distribute", "onnodes", "--smoke"]);
    assert_eq!(shipped.code(), 1, "{}", shipped.stderr());
    for node in testbed.nodes() {
        assert!(
            shipped.stderr().contains(&format!("node `{node}`"))
                && shipped.stderr().contains("on nodes"),
            "{node}: {}",
            shipped.stderr()
        );
    }
    // With --json: one document, the shipment and every node's smoke results.
    let shipped = project
        .with_config(&config)
        .run(&["--json", "distribute", "onnodes", "--smoke"]);
    assert_eq!(shipped.code(), 1, "{}", shipped.stderr());
    let document: serde_json::Value = serde_json::from_str(&shipped.stdout()).unwrap();
    assert!(document["images"].is_array(), "{document}");
    let smoked = document["smoke"].as_array().unwrap();
    for node in testbed.nodes() {
        let row = smoked
            .iter()
            .find(|r| r["node"] == node.as_str() && r["name"] == "on nodes")
            .unwrap_or_else(|| panic!("{node}: {document}"));
        assert_eq!(row["passed"], false, "{row}");
        assert_eq!(row["exit_code"], 7, "{row}");
        assert_eq!(row["image"], "onnodes", "{row}");
    }
    let junit = project.root().join("smoke.xml");
    let all = project.with_config(&config).run(&[
        "--json",
        "smoke",
        "onnodes",
        "--all-nodes",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(all.code(), 1, "{}", all.stderr());
    let rows = support::document(&all.stdout());
    let rows = rows.as_array().unwrap();
    let xml = std::fs::read_to_string(&junit).unwrap();
    for node in testbed.nodes() {
        let failed = rows
            .iter()
            .find(|r| r["node"] == node.as_str() && r["name"] == "on nodes")
            .unwrap_or_else(|| panic!("{node}: no row: {rows:?}"));
        assert_eq!(failed["exit_code"], 7, "{failed}");
        assert!(
            xml.contains(&format!("on {node}\"")),
            "{node}: no suite: {xml}"
        );
    }
    assert_eq!(
        xml.matches("<failure").count(),
        testbed.nodes().len(),
        "{xml}"
    );
}

/// The repository's served example (images/chat): its stand-in server boots in the image and
/// answers the operator's probes, a chat answer and a tool call, before the tag moves.
#[test]
fn the_served_example_boots_and_answers_a_chat_and_a_tool_call() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("images/chat");
    let project = TestProject::new();
    for file in ["stand_in.py", "probe.py"] {
        project.write(
            &format!("images/chat/{file}"),
            &std::fs::read_to_string(root.join(file)).unwrap(),
        );
    }
    let spec = std::fs::read_to_string(root.join("image.toml")).unwrap();
    project.write(
        "images/chat/image.toml",
        &format!("[image]\nname = \"chat-{run}\"\n\n{spec}"),
    );
    // The base is made on this machine: its digest is locked here.
    project
        .with_config(&config)
        .run(&["lock", "chat"])
        .success();
    let record = build_json(&project, &config, "chat");
    let smoke = &record["smoke"][0];
    assert_eq!(smoke["name"], "serves a chat and a tool call", "{record}");
    assert_eq!(smoke["passed"], true, "{record}");
    assert!(
        smoke["logs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("POST /v1/chat/completions")),
        "the stand-in's log is kept: {record}"
    );
}
