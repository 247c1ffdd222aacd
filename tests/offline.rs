//! The offline core, driven through the real binary: checksum, render, check, lock.

mod support;

use support::{GitRepo, TestProject, one_line_patch, run_in};

const BASE_DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// A project with a clone-at-pin image patched by a 2-patch series and an add-on image.
fn fixture() -> (TestProject, GitRepo, String) {
    let project = TestProject::new();
    let upstream = GitRepo::new(project.root(), "upstream");
    let commit = upstream.commit(
        &[("greeting.txt", "hello\n"), ("lib/x.py", "X = 1\n")],
        "first",
    );
    upstream.git(&["tag", "v1"]);
    let url = upstream.url();
    project
        .write(
            "images/app/image.toml",
            &format!(
                r#"
[image]
tag = "local"

[from]
ref = "example/base:1"

[[source]]
name = "upstream"
git = "{url}"
rev = "v1"
dest = "/src/upstream"
patches = ["fix"]

[[file]]
src = "run.sh"
dest = "/usr/local/bin/run.sh"

[env]
MODE = "fast"

[[smoke]]
name = "greets"
run = ["cat", "/src/upstream/greeting.txt"]
"#
            ),
        )
        .write("images/app/run.sh", "#!/bin/sh\necho run\n")
        .write(
            "pins/app.toml",
            &format!(
                r#"
[base]
ref = "example/base:1"
digest = "{BASE_DIGEST}"

[[source]]
name = "upstream"
git = "{url}"
rev = "v1"
commit = "{commit}"
"#
            ),
        )
        .write(
            "patches/fix/series",
            "# applied in order\n0001-world.patch\n0002-comma.patch -p1\n",
        )
        .write(
            "patches/fix/0001-world.patch",
            &one_line_patch("greeting.txt", "hello", "hello world"),
        )
        .write(
            "patches/fix/0002-comma.patch",
            &one_line_patch("greeting.txt", "hello world", "hello, world!"),
        )
        .write(
            "images/addon/image.toml",
            "[from]\nimage = \"app\"\n\n[env]\nEXTRA = \"1\"\n\n[container]\ncmd = [\"run.sh\"]\n",
        );
    let exec = project.root().join("images/app/run.sh");
    std::fs::set_permissions(&exec, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (project, upstream, commit)
}

fn checksums(project: &TestProject) -> String {
    project.run(&["checksum", "--all"]).success().stdout()
}

#[test]
fn checksum_prints_one_line_per_image() {
    let (project, _, _) = fixture();
    let out = checksums(&project);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (line, name) in lines.iter().zip(["addon", "app"]) {
        let (hex, image) = line.split_once("  ").unwrap();
        assert_eq!(image, name);
        assert_eq!(hex.len(), 64);
        assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}

#[test]
fn checksum_is_the_sha256_of_the_explained_document() {
    let (project, _, _) = fixture();
    let document = project
        .run(&["checksum", "--explain", "app"])
        .success()
        .stdout();
    // Recomputed by hand, as docs/checksum.md says: `hallmark checksum --explain IMAGE | sha256sum`.
    let mut sha256sum = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut sha256sum.stdin.take().unwrap(), document.as_bytes()).unwrap();
    let summed = String::from_utf8(sha256sum.wait_with_output().unwrap().stdout).unwrap();
    let expected = summed.split_whitespace().next().unwrap().to_string();
    let line = project.run(&["checksum", "app"]).success().stdout();
    assert_eq!(line, format!("{expected}  app\n"));
    assert!(document.starts_with("hallmark-checksum v1\n"));
}

#[test]
fn checksum_ignores_path_mtime_and_umask() {
    let (project, _, _) = fixture();
    let before = checksums(&project);
    let copy = tempfile::Builder::new()
        .prefix("elsewhere")
        .tempdir()
        .unwrap();
    let status = std::process::Command::new("cp")
        .args(["-r", "--no-preserve=mode,timestamps"])
        .arg(project.root().join("images"))
        .arg(project.root().join("pins"))
        .arg(project.root().join("patches"))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    // Another umask: group and other lose every bit; the exec bit of run.sh stays.
    for entry in walkdir::WalkDir::new(copy.path()) {
        let entry = entry.unwrap();
        let mode = entry.metadata().unwrap().permissions();
        let executable = std::os::unix::fs::PermissionsExt::mode(&mode) & 0o100 != 0
            || entry.file_type().is_dir();
        let new = if executable { 0o700 } else { 0o600 };
        std::fs::set_permissions(
            entry.path(),
            std::os::unix::fs::PermissionsExt::from_mode(new),
        )
        .unwrap();
        if entry.file_type().is_file() {
            let file = std::fs::File::options()
                .write(true)
                .open(entry.path())
                .unwrap();
            file.set_modified(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_234_567),
            )
            .unwrap();
        }
    }
    std::fs::set_permissions(
        copy.path().join("images/app/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let after = run_in(copy.path(), &["checksum", "--all"])
        .success()
        .stdout();
    assert_eq!(before, after);
}

#[test]
fn checksum_changes_with_one_byte_of_any_input() {
    let (project, _, _) = fixture();
    let app = |p: &TestProject| p.run(&["checksum", "app"]).success().stdout();
    let addon = |p: &TestProject| p.run(&["checksum", "addon"]).success().stdout();
    let (app0, addon0) = (app(&project), addon(&project));

    let patch = project.read("patches/fix/0002-comma.patch");
    project.write(
        "patches/fix/0002-comma.patch",
        &patch.replace("world!", "world?"),
    );
    let app1 = app(&project);
    assert_ne!(app0, app1, "a patch byte");
    assert_ne!(
        addon0,
        addon(&project),
        "a parent's change reaches the child"
    );
    project.write("patches/fix/0002-comma.patch", &patch);
    assert_eq!(app0, app(&project));

    let pins = project.read("pins/app.toml");
    project.write(
        "pins/app.toml",
        &pins.replace(BASE_DIGEST, &BASE_DIGEST.replace("aaaa", "aaab")),
    );
    assert_ne!(app0, app(&project), "a pin");
    project.write("pins/app.toml", &pins);

    let spec = project.read("images/app/image.toml");
    project.write(
        "images/app/image.toml",
        &spec.replace("\"fast\"", "\"fasT\""),
    );
    assert_ne!(app0, app(&project), "an env value");
    project.write("images/app/image.toml", &spec);

    project.write("images/app/run.sh", "#!/bin/sh\necho ran\n");
    assert_ne!(app0, app(&project), "a copied file");
    project.write("images/app/run.sh", "#!/bin/sh\necho run\n");
    std::fs::set_permissions(
        project.root().join("images/app/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    assert_ne!(app0, app(&project), "the exec bit of a copied file");
}

#[test]
fn reformatting_a_spec_keeps_its_checksum() {
    let (project, upstream, _) = fixture();
    let before = checksums(&project);
    let url = upstream.url();
    project.write(
        "images/app/image.toml",
        &format!(
            r#"# Same spec: other key order, comments, inline tables, whitespace.
env = {{ MODE = "fast" }}   # inline

[[smoke]]
run = [ "cat",
        "/src/upstream/greeting.txt" ]
name = 'greets'

[from]
ref   =   "example/base:1"

[[file]]
dest = "/usr/local/bin/run.sh"
src = "run.sh"

[image]
tag = "local"   # the tag

[[source]]
patches = ["fix"]
dest = "/src/upstream"
rev = "v1"
git = '{url}'
name = "upstream"
"#
        ),
    );
    assert_eq!(before, checksums(&project));
}

#[test]
fn the_project_is_found_from_a_subfolder() {
    let (project, _, _) = fixture();
    let before = checksums(&project);
    let out = run_in(&project.root().join("images/app"), &["checksum", "--all"])
        .success()
        .stdout();
    assert_eq!(before, out);
}

#[test]
fn render_out_writes_a_context_with_patched_sources() {
    let (project, _, _) = fixture();
    let out = project.root().join("ctx");
    let dockerfile = project
        .run(&["render", "app", "--out", out.to_str().unwrap()])
        .success()
        .stdout();
    assert_eq!(
        std::fs::read_to_string(out.join("Dockerfile")).unwrap(),
        dockerfile
    );
    assert_eq!(
        std::fs::read_to_string(out.join("sources/upstream/greeting.txt")).unwrap(),
        "hello, world!\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("sources/upstream/lib/x.py")).unwrap(),
        "X = 1\n"
    );
    // Every file in one archive, unpacked by one ADD: names never reach a Dockerfile line.
    let archive = std::fs::File::open(out.join("files.tar")).unwrap();
    let entries: Vec<(String, u32)> = tar::Archive::new(archive)
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            (path, e.header().mode().unwrap())
        })
        .collect();
    assert!(
        entries.contains(&("./usr/local/bin/run.sh".into(), 0o755)),
        "{entries:?}"
    );
    assert!(dockerfile.contains("ADD files.tar /\n"), "{dockerfile}");
    assert!(
        dockerfile.contains("COPY sources/upstream \"/src/upstream\""),
        "{dockerfile}"
    );
    assert!(
        dockerfile.contains(&format!("ARG HALLMARK_PARENT=example/base@{BASE_DIGEST}")),
        "{dockerfile}"
    );
}

#[test]
fn render_of_a_derived_image_names_its_parent_tag_as_default() {
    let (project, _, _) = fixture();
    let dockerfile = project.run(&["render", "addon"]).success().stdout();
    assert!(
        dockerfile.contains("ARG HALLMARK_PARENT=app:local\nFROM ${HALLMARK_PARENT}"),
        "{dockerfile}"
    );
    let checksum = project.run(&["checksum", "addon"]).success().stdout();
    let label = format!("\"hallmark.checksum\"=\"{}\"", &checksum[..64]);
    assert!(dockerfile.contains(&label), "{dockerfile}");
}

#[test]
fn check_passes_on_a_good_project() {
    let (project, _, _) = fixture();
    project.run(&["check", "--all"]).success();
}

#[test]
fn check_names_the_set_file_and_hunk_of_a_patch_that_no_longer_applies() {
    let (project, upstream, _) = fixture();
    let moved = upstream.commit(&[("greeting.txt", "bonjour\n")], "upstream moved");
    let pins = project.read("pins/app.toml");
    let old = pins
        .lines()
        .find(|l| l.starts_with("commit"))
        .unwrap()
        .to_string();
    project.write(
        "pins/app.toml",
        &pins.replace(&old, &format!("commit = \"{moved}\"")),
    );
    let run = project.run(&["check", "app"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("patch set `fix`"), "{err}");
    assert!(err.contains("0001-world.patch"), "{err}");
    assert!(
        err.contains("hunk #1 `@@ -1 +1 @@` of greeting.txt"),
        "{err}"
    );
}

#[test]
fn check_refuses_a_cmd_that_repeats_the_baked_entrypoint() {
    let (project, _, _) = fixture();
    let pins = project.read("pins/app.toml");
    project.write(
        "pins/app.toml",
        &pins.replace(
            &format!("digest = \"{BASE_DIGEST}\""),
            &format!("digest = \"{BASE_DIGEST}\"\nentrypoint = [\"vllm\", \"serve\"]"),
        ),
    );
    let spec = project.read("images/app/image.toml");
    project.write(
        "images/app/image.toml",
        &format!("{spec}\n[container]\ncmd = [\"vllm\", \"serve\", \"/models/x\"]\n"),
    );
    let run = project.run(&["check", "app"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr().contains("vllm serve vllm serve /models/x"),
        "{}",
        run.stderr()
    );
    // The child inherits the parent's baked entrypoint through the chain.
    project.write(
        "images/addon/image.toml",
        "[from]\nimage = \"app\"\n\n[container]\nentrypoint = [\"vllm\", \"serve\"]\n",
    );
    project.write("images/app/image.toml", &spec);
    let run = project.run(&["check", "addon"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("repeats the base's baked ENTRYPOINT `vllm serve`"),
        "{}",
        run.stderr()
    );
}

#[test]
fn lock_pins_a_tag_to_its_commit_and_keeps_current_pins() {
    let (project, upstream, commit) = fixture();
    std::fs::remove_file(project.root().join("pins/app.toml")).unwrap();
    project.write(
        "pins/app.toml",
        &format!("[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n"),
    );
    let run = project.run(&["lock", "app"]);
    run.success();
    assert!(
        run.stderr().contains("kept the digest written in pins/"),
        "{}",
        run.stderr()
    );
    assert!(
        run.stderr()
            .contains(&format!("source upstream: v1 -> {commit}")),
        "{}",
        run.stderr()
    );
    let pins = project.read("pins/app.toml");
    assert!(pins.contains(&format!("commit = \"{commit}\"")), "{pins}");

    // The tag moves upstream: the pin holds until `--update`.
    let newer = upstream.commit(
        &[("greeting.txt", "hello\n"), ("extra.txt", "x\n")],
        "newer",
    );
    upstream.git(&["tag", "-f", "v1"]);
    project.run(&["lock", "app"]).success();
    assert!(project.read("pins/app.toml").contains(&commit));
    project.run(&["lock", "app", "--update"]).success();
    assert!(project.read("pins/app.toml").contains(&newer));
}

#[test]
fn lock_without_an_engine_or_a_hand_written_digest_says_what_to_do() {
    let (project, _, _) = fixture();
    std::fs::remove_file(project.root().join("pins/app.toml")).unwrap();
    let run = project.run(&["lock", "app"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("cannot pin the base `example/base:1`"),
        "{}",
        run.stderr()
    );
}

/// The seed's real images: complete Dockerfiles, held by golden files.
#[test]
fn real_images_render_golden() {
    let root = env!("CARGO_MANIFEST_DIR");
    for image in ["dsv41-flash", "dsv41-flash-b12x", "hello"] {
        let dockerfile = run_in(std::path::Path::new(root), &["render", image])
            .success()
            .stdout();
        insta::assert_snapshot!(format!("render_{image}"), dockerfile);
    }
}

#[test]
fn real_images_checksum_offline() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run_in(root, &["checksum", "--all"]).success().stdout();
    let images: Vec<String> = std::fs::read_dir(root.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(out.lines().count(), images.len(), "{out}");
    for image in &images {
        assert!(
            out.lines().any(|l| l.ends_with(&format!("  {image}"))),
            "{image} missing in {out}"
        );
    }
}
