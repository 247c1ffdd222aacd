//! Builds on real engines of the testbed (scripts/testbed): nothing here is mocked.

mod support;

use support::{GitRepo, TestProject, Testbed, one_line_patch, unique};

const HELLO_PINS: &str = include_str!("../pins/hello.toml");

/// The repository's `hello`, under a repository name and label of its own, so tests that
/// share a builder share neither a tag nor a checksum. Returns the project and the tag.
fn hello_project() -> (TestProject, String) {
    let project = TestProject::new();
    let spec = include_str!("../images/hello/image.toml");
    let run = unique();
    let spec =
        format!("{spec}\n[image]\nname = \"hello-{run}\"\n\n[labels]\n\"test.run\" = \"{run}\"\n");
    project
        .write("images/hello/image.toml", &spec)
        .write(
            "images/hello/hello.sh",
            include_str!("../images/hello/hello.sh"),
        )
        .write("pins/hello.toml", HELLO_PINS);
    let script = project.root().join("images/hello/hello.sh");
    std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (project, format!("hello-{run}:latest"))
}

fn build_json(project: &TestProject, config: &std::path::Path, image: &str) -> serde_json::Value {
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "--json",
        "build",
        image,
    ]);
    run.success();
    let records: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
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
        .run(&[
            "--config",
            config.to_str().unwrap(),
            "smoke",
            "hello",
            "--junit",
            junit.to_str().unwrap(),
        ])
        .success();
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"2\" failures=\"0\""), "{xml}");

    // On a node that never received the image the smoke run fails, and CI still gets its
    // report, with the reason as an error case.
    let missing = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "smoke",
        "hello",
        "--node",
        "node2",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(missing.code(), 1, "{}", missing.stderr());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("failures=\"1\"") && xml.contains("holds no image with checksum"),
        "{xml}"
    );
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
    let lock = project.run(&["--config", config.to_str().unwrap(), "lock", "app"]);
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
    testbed.script("load-bases", &["--node", "node3"]);
    let (project, tag) = hello_project();
    let on_builder = build_json(&project, &testbed.config(), "hello");
    let other = testbed.config_with_builder(project.root(), "node3");
    let on_node3 = build_json(&project, &other, "hello");
    assert_eq!(on_builder["checksum"], on_node3["checksum"]);
    assert_eq!(on_builder["outcome"], "built");
    assert_eq!(on_node3["outcome"], "built");
    assert!(on_builder["context_sha256"].is_string());
    assert_eq!(on_builder["context_sha256"], on_node3["context_sha256"]);
    assert_eq!(
        testbed.checksum_label("node3", &tag),
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
    let run = project.run(&["--config", config.to_str().unwrap(), "build", "hello"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("failed to build at Step 7/"), "{err}");
    assert!(
        err.contains("RUN echo boom-from-the-step && exit 3"),
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
    let build = project.run(&["--config", config.to_str().unwrap(), "build", "served"]);
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
    // a file and replaces a directory of its parent's, and makes a hard link.
    let upstream = GitRepo::new(project.root(), "upstream");
    upstream.commit(&[("greeting.txt", "hello\n")], "first");
    upstream.git(&["tag", "v1"]);
    let run = unique();
    let clone = format!("clone-{run}:latest");
    project
        .write(
            "images/clone/image.toml",
            &format!(
                "[image]\nname = \"clone-{run}\"\n\n[from]\nimage = \"hello\"\n\n[[source]]\nname = \"upstream\"\ngit = \"{}\"\nrev = \"v1\"\ndest = \"/opt/upstream\"\npatches = [\"fix\"]\n\n[build]\nrun = [\"wc -c /opt/upstream/greeting.txt > /opt/size.txt && mkdir -p /var/made && rm /etc/hello.txt && rm -rf /usr/local/bin && mkdir /usr/local/bin && ln /opt/size.txt /usr/local/bin/size\"]\n",
                upstream.url()
            ),
        )
        .write("patches/fix/series", "0001-world.patch\n")
        .write("patches/fix/0001-world.patch", &one_line_patch("greeting.txt", "hello", "hello world"));
    project.run(&["lock", "clone"]).success();
    let engines = engine_kinds(testbed, &project);
    assert!(engines.len() >= 2, "{engines:?}");
    let mut seen: Vec<(String, Vec<String>)> = Vec::new();
    for (node, kind) in &engines {
        if node != "builder" {
            testbed.script("load-bases", &["--node", node]);
        }
        let config = testbed.config_with_builder(project.root(), node);
        project
            .run(&[
                "--config",
                config.to_str().unwrap(),
                "-q",
                "build",
                "--force",
                "clone",
            ])
            .success();
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
        seen.push((format!("{node} ({kind})"), vec![image(&tag), image(&clone)]));
    }
    for (engine, images) in &seen[1..] {
        assert_eq!(images, &seen[0].1, "{engine} and {} differ", seen[0].0);
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
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "--json",
        "build",
        "--check-repro",
        "hello",
    ]);
    run.success();
    assert!(run.stderr().contains("reproducible"), "{}", run.stderr());
    let records: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
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
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "build",
        "--check-repro",
        "hello",
    ]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    let differs: Vec<&str> = err.lines().filter(|l| l.starts_with("differs: ")).collect();
    assert_eq!(differs.len(), 1, "{err}");
    assert!(differs[0].ends_with("/stamp: content"), "{err}");
}

/// Issue 15: every request carries the negotiated API version in its path (bollard 0.21
/// drops it, and each engine then answers at its newest API). The testbed's daemons run with
/// `--debug`, which logs each request's path.
#[test]
fn requests_carry_the_negotiated_api_version() {
    let testbed = Testbed::get();
    let (project, tag) = hello_project();
    let config = testbed.config();
    let (_, nodes) = support::hallmark_json(&project, &config, &["nodes"]);
    // Nothing holds this image: status asks the builder and every node for it.
    project
        .run(&["--config", config.to_str().unwrap(), "status"])
        .success();
    for node in ["builder", "node1"] {
        let row = support::row(&nodes, node);
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
                line.contains(&format!("Calling GET /v{api}/images/{tag}/json")),
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
    let legacy = HELLO_PINS.replace("kind = \"config-digest\"", "kind = \"image-id\"");
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
        .run(&[
            "--config",
            config.to_str().unwrap(),
            "lock",
            "--update",
            "hello",
        ])
        .success();
    let pins = project.read("pins/hello.toml");
    assert!(pins.contains("kind = \"config-digest\""), "{pins}");
    let digest = "sha256:1e096cc00b119129bf663698e45a6656bf7762975e4526e12809cca0e658eb2c";
    assert!(pins.contains(digest), "the classic store's id: {pins}");
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
    let run = project.run(&["--config", config.to_str().unwrap(), "build", "hello"]);
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
