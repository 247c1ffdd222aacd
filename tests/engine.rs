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
    assert!(pins.contains("kind = \"image-id\""), "{pins}");
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
    let build = project.run(&["--config", config.to_str().unwrap(), "build", "served"]);
    assert_eq!(build.code(), 2, "{}", build.stderr());
    assert!(
        !project.root().join(".hallmark/logs").exists(),
        "nothing may be built"
    );
}

/// Issue 7: normalised images are bit-for-bit the same on two engines: the same layers and
/// the same config digest (the classic store's image id).
#[test]
fn normalised_builds_on_two_engines_are_identical() {
    let testbed = Testbed::get();
    testbed.script("load-bases", &["--node", "node3"]);
    let (project, tag) = hello_project();
    // A clone-at-pin image too: a patched source copied in, and a RUN step on it.
    let upstream = GitRepo::new(project.root(), "upstream");
    upstream.commit(&[("greeting.txt", "hello\n")], "first");
    upstream.git(&["tag", "v1"]);
    let run = unique();
    project
        .write(
            "images/clone/image.toml",
            &format!(
                "[image]\nname = \"clone-{run}\"\n\n[from]\nimage = \"hello\"\n\n[[source]]\nname = \"upstream\"\ngit = \"{}\"\nrev = \"v1\"\ndest = \"/opt/upstream\"\npatches = [\"fix\"]\n\n[build]\nrun = [\"wc -c /opt/upstream/greeting.txt > /opt/size.txt && mkdir -p /var/made\"]\n",
                upstream.url()
            ),
        )
        .write("patches/fix/series", "0001-world.patch\n")
        .write("patches/fix/0001-world.patch", &one_line_patch("greeting.txt", "hello", "hello world"));
    project.run(&["lock", "clone"]).success();
    let on = |config: &std::path::Path| {
        let run = project.run(&[
            "--config",
            config.to_str().unwrap(),
            "--json",
            "build",
            "--force",
            "clone",
        ]);
        run.success();
        let records: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
        records
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["image"].as_str().unwrap().to_string(),
                    r["image_id"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let first = on(&testbed.config());
    let second = on(&testbed.config_with_builder(project.root(), "node3"));
    assert_eq!(first.len(), 2);
    assert_eq!(
        first, second,
        "hello and clone differ between the two engines"
    );
    let layers = |node: &str| {
        testbed.docker_ok(
            node,
            &[
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}}",
                &tag,
            ],
        )
    };
    assert_eq!(layers("builder"), layers("node3"));
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
        .write("pins/many.toml", HELLO_PINS);
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
