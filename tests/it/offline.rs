//! The offline core, driven through the real binary: checksum, render, check, lock.

use crate::support;

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
fn a_reader_that_went_away_ends_the_printing_not_the_command() {
    // `hallmark checksum --all | head -1`: the pipe's reader is gone before hallmark writes,
    // so every write fails with EPIPE (Rust ignores SIGPIPE). `println!` panicked here.
    let (project, _, _) = fixture();
    for args in [
        &["checksum", "--all"][..],
        &["checksum", "--explain", "app"],
        &["--json", "checksum", "--all"],
        &["render", "app"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = support::hallmark()
            .args(args)
            .current_dir(project.root())
            .env("HALLMARK_CACHE", project.root().join(".test-cache"))
            .env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
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
    assert!(document.starts_with("hallmark-checksum v2\n"));
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
        .arg(project.root().join("hallmark.toml"))
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

/// Issue 14 item 8: the nearest `images/` folder was the project, so `check` run in a `docs/`
/// holding an `images/` folder passed on that folder's specs and never saw the project's. The
/// root is the folder holding `hallmark.toml`.
#[test]
fn a_folder_holding_images_is_not_taken_for_the_project() {
    let (project, _, _) = fixture();
    project.write(
        "docs/images/example/image.toml",
        "[from]\nref = \"example/base:1\"\n",
    );
    let run = run_in(&project.root().join("docs"), &["--json", "check", "--all"]);
    let report: serde_json::Value = serde_json::from_str(&run.stdout()).unwrap();
    let checked: Vec<&str> = report["passed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["image"].as_str().unwrap())
        .collect();
    assert_eq!(checked, ["addon", "app"], "{report}");
    run.success();
}

/// Without `hallmark.toml` up the tree there is no project, and the error says which folder
/// looks like one and how to mark it; `-C DIR` names a project from anywhere, and must name
/// its root.
#[test]
fn the_project_is_anchored_on_hallmark_toml_or_named_with_dash_c() {
    let (project, _, _) = fixture();
    let before = checksums(&project);
    let elsewhere = tempfile::Builder::new()
        .prefix("elsewhere")
        .tempdir()
        .unwrap();
    let root = project.root().to_str().unwrap();
    let out = run_in(elsewhere.path(), &["-C", root, "checksum", "--all"]);
    assert_eq!(out.success().stdout(), before);
    let out = run_in(elsewhere.path(), &["--project", root, "checksum", "--all"]);
    assert_eq!(out.success().stdout(), before);

    let images = project.root().join("images");
    let inside = images.to_str().unwrap();
    let refused = run_in(elsewhere.path(), &["-C", inside, "checksum", "--all"]);
    assert_eq!(refused.code(), 2, "{}", refused.stderr());
    assert!(
        refused.stderr().contains("holds no hallmark.toml"),
        "{}",
        refused.stderr()
    );

    std::fs::remove_file(project.root().join("hallmark.toml")).unwrap();
    let lost = project.run(&["check", "--all"]);
    assert_eq!(lost.code(), 2, "{}", lost.stderr());
    let err = lost.stderr();
    assert!(err.contains("no project found"), "{err}");
    assert!(
        err.contains(&format!(
            "touch {}/hallmark.toml",
            project.root().canonicalize().unwrap().display()
        )),
        "{err}"
    );
}

/// `check --all` of a project with no image is an error (exit 2), not a pass over nothing.
#[test]
fn check_all_of_a_project_without_images_says_so() {
    let project = TestProject::new();
    for args in [
        &["check", "--all"][..],
        &["check"],
        &["checksum", "--all"],
        &["lock"],
    ] {
        let run = project.run(args);
        assert_eq!(run.code(), 2, "{args:?}: {}", run.stderr());
        assert!(
            run.stderr().contains("the project has no images"),
            "{}",
            run.stderr()
        );
    }
    std::fs::remove_dir(project.root().join("images")).unwrap();
    let run = project.run(&["check", "--all"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr().contains("the project has no images"),
        "{}",
        run.stderr()
    );
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
    // The label says the Dockerfile is rendered, not an image hallmark finished.
    let label = format!("\"hallmark.checksum\"=\"rendered-{}\"", &checksum[..64]);
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
    // The engine cannot be reached: said as such, exit 1 (issue 42), naming what it was for.
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("unreachable"), "{}", run.stderr());
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

/// A project whose image `big` copies `images/big/<file>` into the image.
fn one_file_project(file: &str) -> TestProject {
    let project = TestProject::new();
    project
        .write(
            "images/big/image.toml",
            &format!("[from]\nref = \"example/base:1\"\n\n[[file]]\nsrc = \"{file}\"\ndest = \"/{file}\"\n"),
        )
        .write(
            "pins/big.toml",
            &format!("[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n"),
        );
    project
}

/// Runs hallmark in `project` and returns its output with its peak resident set in KiB, as
/// the kernel counted it for hallmark alone (wait4 in a small parent), whatever else runs.
fn run_measured(project: &TestProject, args: &[&str]) -> (std::process::Output, i64) {
    // The peak is measured by a small process that forks hallmark and reads its rusage:
    // Linux carries the spawning process's high-water mark into the child across exec, and
    // this test process (every suite in one crate) is larger than the bound checked.
    const MEASURE: &str = "import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, file=open(os.environ['PEAK_FILE'], 'w'))
sys.exit(os.waitstatus_to_exitcode(status))";
    let peak_file = project.root().join(".peak-kib");
    let output = std::process::Command::new("python3")
        .args(["-c", MEASURE, env!("CARGO_BIN_EXE_hallmark")])
        .args(args)
        .current_dir(project.root())
        .env("HALLMARK_CACHE", project.root().join(".test-cache"))
        .env("PEAK_FILE", &peak_file)
        .output()
        .unwrap();
    let peak = std::fs::read_to_string(&peak_file)
        .unwrap_or_else(|e| panic!("no peak measured ({e}): {output:?}"));
    (output, peak.trim().parse().unwrap())
}

/// Issue 14 item 7: planning read every `[[file]]` whole (a 500 MB file: `checksum` at 494 MB
/// resident). A 2 GiB file (sparse: the test writes nothing) is now hashed in flat memory.
#[test]
fn checksum_of_a_2gib_file_stays_under_64mib() {
    let project = one_file_project("big.bin");
    let big = std::fs::File::create(project.root().join("images/big/big.bin")).unwrap();
    big.set_len(2 << 30).unwrap();
    let (output, peak_kib) = run_measured(&project, &["checksum", "--explain", "big"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // `head -c 2G /dev/zero | sha256sum`
    assert!(
        stdout.contains(
            "file /big.bin 0644 a7c744c13cc101ed66c29f672f92455547889cc586ce6d44fe76ae824958ea51\n"
        ),
        "{stdout}"
    );
    assert!(
        peak_kib < 64 * 1024,
        "checksum peaked at {peak_kib} KiB resident"
    );
}

/// Issue 14 item 7: `status` and `verify` (every command that plans) hashed every file again
/// each time. A file's hash is now remembered by its size, mtime, ctime, inode and device
/// once it has settled, and only a file that changed is read; a rewrite that keeps size and
/// mtime still shows (its ctime moves).
#[test]
fn an_unchanged_file_is_not_read_again_and_a_changed_one_is() {
    let project = one_file_project("payload.txt");
    let path = project.root().join("images/big/payload.txt");
    std::fs::write(&path, "first\n").unwrap();
    let hashed = |expected: &str| {
        let run = project.run(&["-v", "checksum", "big"]).success().stderr();
        assert!(run.contains(expected), "{run}");
        project.run(&["checksum", "big"]).success().stdout()
    };
    // A hash is remembered only for a file whose timestamps are 2 s old (docs/checksum.md):
    // what is waited for is that time itself.
    let settled = |path: &std::path::Path| {
        let changed = std::fs::metadata(path).unwrap().modified().unwrap();
        let ready = changed + std::time::Duration::from_millis(2100);
        if let Ok(left) = ready.duration_since(std::time::SystemTime::now()) {
            std::thread::sleep(left);
        }
    };
    settled(&path);
    let first = hashed("files: 1 hashed (6 bytes read), 0 unchanged");
    let again = hashed("files: 0 hashed (0 bytes read), 1 unchanged");
    assert_eq!(first, again);
    // Same size, same mtime, other bytes.
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::write(&path, "other\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let changed = hashed("files: 1 hashed (6 bytes read), 0 unchanged");
    assert_ne!(first, changed);
}

/// Issue 14 item 9: the tags hallmark accepts, in order, are exactly those of
/// `packaging.tags.sys_tags()` (what current pip matches wheels with) for the same
/// interpreter: the host's Python, probed with the probe that runs in images. (packaging 22
/// added `cp311-none-any`; older pips vendor 21.3.)
#[test]
fn wheel_tags_are_the_ones_pip_computes_for_the_same_python() {
    let probe = hallmark::inputs::python::probe_command();
    let answer = std::process::Command::new(&probe[0])
        .args(&probe[1..])
        .output()
        .unwrap();
    assert!(
        answer.status.success(),
        "{}",
        String::from_utf8_lossy(&answer.stderr)
    );
    let target =
        hallmark::inputs::python::parse_probe_answer(&String::from_utf8_lossy(&answer.stdout))
            .unwrap();
    let packaging = tempfile::tempdir().unwrap();
    let installed = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(packaging.path())
        .arg("packaging==24.2")
        .output()
        .unwrap();
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let pips = std::process::Command::new("python3")
        .args([
            "-c",
            "from packaging import tags; print(*map(str, tags.sys_tags()), sep='\\n')",
        ])
        .env("PYTHONPATH", packaging.path())
        .output()
        .unwrap();
    assert!(
        pips.status.success(),
        "{}",
        String::from_utf8_lossy(&pips.stderr)
    );
    let pips = String::from_utf8(pips.stdout).unwrap();
    let ours = target.interpreter.supported_tags();
    assert_eq!(ours.len(), pips.lines().count(), "{:?}", target.interpreter);
    for (i, (ours, pips)) in ours.iter().zip(pips.lines()).enumerate() {
        assert_eq!(ours, pips, "tag {i} for {:?}", target.interpreter);
    }
}

/// A project whose `arm` image (linux/arm64) installs MarkupSafe 2.1.5, a wheel with a
/// build per Python and machine on PyPI; `python` is its `[python]` pin, if any.
fn wheel_project(python: Option<&str>) -> TestProject {
    let project = TestProject::new();
    project
        .write(
            "images/arm/image.toml",
            "[image]\nplatform = \"linux/arm64\"\n\n[from]\nref = \"example/base:1\"\n\n[[wheel]]\nname = \"markupsafe\"\nversion = \"2.1.5\"\n",
        )
        .write(
            "pins/arm.toml",
            &format!(
                "[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n{}",
                python.unwrap_or_default()
            ),
        );
    project
}

const ARM_PYTHON: &str = "\n[python]\nversion = \"3.11\"\nimplementation = \"cpython\"\nabi = \"cp311\"\nmachine = \"aarch64\"\nlibc = \"glibc 2.36\"\n";

/// Issue 14 item 9: `lock` pinned the wheel pip picks for the host (x86_64, the host's
/// Python), so an arm64 image locked on x86 CI got an x86 wheel. It now asks pip for the
/// image's Python and platform (here written by hand in `[python]`; PyPI is real).
#[test]
fn lock_pins_the_wheel_for_the_images_python_and_platform() {
    let project = wheel_project(Some(ARM_PYTHON));
    project.run(&["lock", "arm"]).success();
    let pins = project.read("pins/arm.toml");
    assert!(
        pins.contains("file = \"MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl\""),
        "{pins}"
    );
    assert!(pins.contains("machine = \"aarch64\""), "{pins}");
    project.run(&["check", "arm"]).success();

    // A hand edit to another machine's wheel is caught by `check`.
    let edited = pins.replace(
        "aarch64.manylinux2014_aarch64",
        "x86_64.manylinux2014_x86_64",
    );
    project.write("pins/arm.toml", &edited);
    let check = project.run(&["check", "arm"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(
        check
            .stderr()
            .contains("does not install on the pinned Python 3.11"),
        "{}",
        check.stderr()
    );
}

/// Without an engine that can run the image's Python and without `[python]`, a wheel built
/// for one platform cannot be chosen: exit 2, saying what to write.
#[test]
fn lock_without_the_images_python_refuses_a_platform_wheel() {
    let project = wheel_project(None);
    let run = project.run(&["lock", "arm"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("pins/arm.toml"), "{err}");
    assert!(
        err.contains("cannot tell which Python image `arm` runs"),
        "{err}"
    );
    assert!(err.contains("[python] version = "), "{err}");
}

/// Issue 14 item 13: `check --all` planned each image with all its parents again (a 3,000-deep
/// chain: 4 min 46 s, where `checksum` took 0.3 s), and reported a broken parent once per
/// image standing on it. Each image is now planned once (each has one file: 3,000 files
/// hashed, not the 4.5 million a plan per image would read), and a broken root is reported
/// once, the images on it named after it.
#[test]
fn check_plans_each_image_of_a_3000_deep_chain_once() {
    const DEPTH: usize = 3000;
    let project = TestProject::new();
    let parent = |k: usize| match k {
        0 => "ref = \"example/base:1\"".to_string(),
        _ => format!("image = \"i{:04}\"", k - 1),
    };
    for k in 0..DEPTH {
        project
            .write(
                &format!("images/i{k:04}/image.toml"),
                &format!(
                    "[from]\n{}\n\n[[file]]\nsrc = \"f\"\ndest = \"/f{k}\"\n",
                    parent(k)
                ),
            )
            .write(&format!("images/i{k:04}/f"), &format!("{k}\n"));
    }
    project.write(
        "pins/i0000.toml",
        &format!("[base]\nref = \"example/base:1\"\ndigest = \"{BASE_DIGEST}\"\n"),
    );
    let checked = project.run(&["-v", "check", "--all"]);
    checked.success();
    assert!(
        checked.stderr().contains(&format!("files: {DEPTH} hashed")),
        "{}",
        checked.stderr()
    );

    project.write(
        "images/i0000/image.toml",
        "[from]\nref = \"example/base:1\"\nbroken = true\n",
    );
    let broken = project.run(&["check", "--all"]);
    assert_eq!(broken.code(), 2);
    let err = broken.stderr();
    assert_eq!(err.matches("unknown field `broken`").count(), 1, "{err}");
    assert_eq!(
        err.matches("not checked: its parent chain holds `i0000`")
            .count(),
        DEPTH - 1
    );
    assert!(err.contains("error: image `i2999`: not checked"), "{err}");

    // Checking one image names it, and the problem it stands on, once.
    let one = project.run(&["check", "i2999"]);
    assert_eq!(one.code(), 2);
    let err = one.stderr();
    assert_eq!(err.matches("error:").count(), 2, "{err}");
    assert!(err.contains("unknown field `broken`"), "{err}");
    assert!(err.contains("image `i2999`: not checked"), "{err}");
}

/// The checksum counts meaning, not spelling (checksum document v2): a destination with a
/// trailing `/`, a source's `rev` written as the tag or as the same commit in hex, a
/// `[[file]]` whose source file was renamed with the same bytes and destination: the same
/// checksum. A change of meaning (another destination, other bytes) still changes it. An
/// outside test saw each of the first three give a new checksum, and so a rebuild.
#[test]
fn the_checksum_counts_meaning_not_spelling() {
    let (project, _, commit) = fixture();
    let checksum = |project: &TestProject| {
        project.run(&["checksum", "app"]).success().stdout()[..64].to_string()
    };
    let original = checksum(&project);
    let edit = |file: &str, from: &str, to: &str| {
        let text = project.read(file);
        assert!(text.contains(from), "{file}: {from}");
        project.write(file, &text.replace(from, to));
    };

    edit(
        "images/app/image.toml",
        "dest = \"/src/upstream\"",
        "dest = \"/src/upstream/\"",
    );
    assert_eq!(checksum(&project), original, "a trailing slash");
    edit(
        "images/app/image.toml",
        "rev = \"v1\"",
        &format!("rev = \"{commit}\""),
    );
    edit(
        "pins/app.toml",
        "rev = \"v1\"",
        &format!("rev = \"{commit}\""),
    );
    assert_eq!(checksum(&project), original, "the same commit in hex");
    std::fs::rename(
        project.root().join("images/app/run.sh"),
        project.root().join("images/app/start.sh"),
    )
    .unwrap();
    edit(
        "images/app/image.toml",
        "src = \"run.sh\"",
        "src = \"start.sh\"",
    );
    assert_eq!(checksum(&project), original, "a renamed file");
    let explained = project
        .run(&["checksum", "--explain", "app"])
        .success()
        .stdout();
    assert!(
        explained.starts_with("hallmark-checksum v2\n"),
        "{explained}"
    );

    edit(
        "images/app/image.toml",
        "dest = \"/usr/local/bin/run.sh\"",
        "dest = \"/usr/local/bin/go.sh\"",
    );
    assert_ne!(checksum(&project), original, "another destination");
    edit(
        "images/app/image.toml",
        "dest = \"/usr/local/bin/go.sh\"",
        "dest = \"/usr/local/bin/run.sh\"",
    );
    assert_eq!(checksum(&project), original);
    project.write("images/app/start.sh", "#!/bin/sh\necho other\n");
    assert_ne!(checksum(&project), original, "other bytes");
}

/// `check --all` when a parent's patch series does not apply: the parent's problem is said
/// once and the image on it is "not checked", never `ok` (an outside test saw `ok  addon`).
#[test]
fn check_all_says_a_child_is_not_checked_when_its_parents_series_fails() {
    let (project, _, _) = fixture();
    project.write(
        "patches/fix/0002-comma.patch",
        &one_line_patch("greeting.txt", "no such line", "x"),
    );
    let run = project.run(&["check", "--all"]);
    let (stdout, stderr) = (run.stdout(), run.stderr());
    assert_eq!(run.code(), 1, "{stdout}{stderr}");
    let said = format!("{stdout}{stderr}");
    assert!(!said.contains("ok  addon"), "{said}");
    // The cause is said first, and once.
    let cause = said.find("0002-comma.patch").unwrap();
    assert!(
        cause < said.find("image `addon`: not checked").unwrap(),
        "{said}"
    );
    assert_eq!(
        said.matches("does not apply to source").count(),
        1,
        "{said}"
    );
    assert!(said.contains("image `addon`: not checked"), "{said}");
    assert!(said.contains("0002-comma.patch"), "{said}");
}

/// `checksum --all` with one broken spec prints the others' checksums, says the broken one
/// on stderr, and exits 2 (the first broken spec hid every checksum).
#[test]
fn checksum_all_prints_the_others_when_one_spec_is_broken() {
    let (project, _, _) = fixture();
    project.write("images/broken/image.toml", "[from\n");
    let run = project.run(&["checksum", "--all"]);
    let (stdout, stderr) = (run.stdout(), run.stderr());
    assert_eq!(run.code(), 2, "{stdout}{stderr}");
    assert!(stderr.contains("images/broken/image.toml"), "{stderr}");
    let images: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(_, i)| i)
        .collect();
    assert_eq!(images, ["addon", "app"], "{stdout}");
}

/// Completions and the man page come from the command line's definition, outside any project.
#[test]
fn completions_and_the_man_page_are_written_outside_a_project() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let run = support::run_in(dir.path(), &["completions", shell]);
        run.success();
        for verb in ["distribute", "verify", "patches"] {
            assert!(run.stdout().contains(verb), "{shell}: {}", run.stdout());
        }
    }
    let man = support::run_in(dir.path(), &["man"]);
    man.success();
    assert!(man.stdout().starts_with(".ie") && man.stdout().contains(".TH hallmark 1"));
    assert_eq!(
        support::run_in(dir.path(), &["completions", "cmd"]).code(),
        2
    );
}

/// Issue 42: `lock` against a builder it cannot reach says so (exit 1, the engine's words),
/// for a base to pin and for apt packages: not "no reachable engine holds it ... load it" or
/// "build or load it on the builder", which sent the operator to load images on a builder
/// that was down.
#[test]
fn lock_against_an_unreachable_builder_says_unreachable() {
    let project = TestProject::new();
    project
        .write(
            "hallmark.toml",
            "[builder]\nname = \"builder\"\nengine = \"unix:///nonexistent/hm-lock.sock\"\n",
        )
        .write(
            "images/base/image.toml",
            "[from]\nref = \"hallmark-testbed/busybox:latest\"\n",
        )
        .write(
            "images/apt/image.toml",
            "[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\napt = [\"jq\"]\n",
        )
        .write("pins/apt.toml", include_str!("../../pins/hello.toml"));
    for image in ["base", "apt"] {
        let run = project.run(&["lock", image]);
        let stderr = run.stderr();
        assert_eq!(run.code(), 1, "{image}: {stderr}");
        assert!(stderr.contains("unreachable"), "{image}: {stderr}");
        assert!(stderr.contains("hm-lock.sock"), "{image}: {stderr}");
        assert!(!stderr.contains("load it"), "{image}: {stderr}");
    }
}

/// The files under `dir`, relative, sorted.
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap();
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

/// Issue 42: `render --out DIR` into a folder an earlier render wrote removes what that
/// render wrote first (a stale file went into a plain `docker build DIR`), and only that: a
/// file of the user's in DIR stays.
#[test]
fn render_out_removes_what_it_wrote_before_and_nothing_else() {
    let (project, _, _) = fixture();
    let out = project.root().join("ctx");
    let fresh = project.root().join("fresh");
    let render = |image: &str, dir: &std::path::Path| {
        project
            .run(&["render", image, "--out", dir.to_str().unwrap()])
            .success();
    };
    render("app", &out);
    let first = files_under(&out);
    std::fs::write(out.join("mine.txt"), "the user's\n").unwrap();
    render("addon", &out);
    render("addon", &fresh);
    let mut expected = files_under(&fresh);
    expected.push("mine.txt".into());
    expected.sort();
    assert_eq!(files_under(&out), expected, "app's context was {first:?}");
    assert!(first.len() > expected.len() - 1, "{first:?}");
    assert_eq!(
        std::fs::read_to_string(out.join("mine.txt")).unwrap(),
        "the user's\n"
    );
}

/// A package made by `dpkg-deb` (xz, as Debian's), its bytes.
fn made_deb(dir: &std::path::Path, name: &str, version: &str) -> Vec<u8> {
    let root = dir.join(format!("{name}-root"));
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::write(
        root.join("DEBIAN/control"),
        format!("Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: a test\n"),
    )
    .unwrap();
    let deb = dir.join(format!("{name}.deb"));
    let made = std::process::Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&root)
        .arg(&deb)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    std::fs::read(deb).unwrap()
}

/// Issue 42: an apt pin is what its package file says. A hand-edited `version` that the
/// file's own control data does not say is refused by `check` at its key; the SBOM names the
/// version the file holds; a pin whose file is not in the layer store yet is a warning.
#[test]
fn an_apt_pin_whose_version_its_file_does_not_say_is_refused() {
    use sha2::Digest as _;
    let project = TestProject::new();
    let deb = made_deb(project.root(), "hm-tool", "1.4-2");
    let sha = hex::encode(sha2::Sha256::digest(&deb));
    let store = project.root().join(".test-cache/store/debs");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join(&sha), &deb).unwrap();
    project.write(
        "images/app/image.toml",
        "[from]\nref = \"hallmark-testbed/busybox:latest\"\n\n[build]\napt = [\"hm-tool\"]\n",
    );
    let pins = |version: &str| {
        format!(
            "{}\n[apt-against]\nbuild = \"base hallmark-testbed/busybox:latest sha256:1e096cc00b119129bf663698e45a6656bf7762975e4526e12809cca0e658eb2c\"\n\n[[apt]]\nname = \"hm-tool\"\nversion = \"{version}\"\narchitecture = \"amd64\"\nwanted = true\narchive = \"http://deb.debian.org/debian\"\npath = \"pool/main/h/hm-tool/hm-tool_1.4-2_amd64.deb\"\nsize = {}\nsha256 = \"{sha}\"\n",
            include_str!("../../pins/hello.toml"),
            deb.len()
        )
    };
    project.write("pins/app.toml", &pins("1.4-2"));
    let checked = project.run(&["check", "app"]);
    assert_eq!(checked.code(), 0, "{}", checked.stderr());
    let sbom = |project: &TestProject| project.run(&["sbom", "app"]).success().stdout();
    assert!(sbom(&project).contains("1.4-2"));

    project.write("pins/app.toml", &pins("9.9-1"));
    let edited = project.run(&["check", "app"]);
    let stderr = edited.stderr();
    assert_eq!(edited.code(), 2, "{stderr}");
    assert!(stderr.contains("pins/app.toml:"), "{stderr}");
    assert!(stderr.contains("`apt.version`"), "{stderr}");
    assert!(stderr.contains("9.9-1"), "{stderr}");
    assert!(stderr.contains("says 1.4-2"), "{stderr}");
    // The SBOM names what the file holds, not the edit.
    let document = sbom(&project);
    assert!(document.contains("1.4-2"), "{document}");
    assert!(!document.contains("9.9-1"), "{document}");

    // Not in the layer store: not checked, and the JSON document says so in `warnings`.
    std::fs::remove_file(store.join(&sha)).unwrap();
    let unread = project.run(&["--json", "check", "app"]);
    assert_eq!(unread.code(), 0, "{}", unread.stderr());
    let document: serde_json::Value = serde_json::from_str(&unread.stdout()).unwrap();
    let warnings = document["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("apt `hm-tool=9.9-1`")),
        "{document}"
    );
}

/// Issue 42: where stderr is no terminal (a pipe: CI logs, ssh), a long `lock`, `build` and
/// `distribute` say they are at work every interval (10 s; 0.3 s here), as the bars do on a
/// terminal; nothing with `-q`. The builder here accepts connections and never answers, so
/// each command works until the answer deadline (3 s).
#[test]
fn long_commands_say_they_are_at_work_on_a_stderr_that_is_a_pipe() {
    let project = TestProject::new();
    let socket = project.root().join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    project
        .write(
            "hallmark.toml",
            &format!(
                "[builder]\nname = \"builder\"\nengine = \"unix://{}\"\n\n[[node]]\nname = \"node1\"\nengine = \"unix://{}\"\n",
                socket.display(),
                socket.display()
            ),
        )
        .write(
            "images/app/image.toml",
            "[from]\nref = \"hallmark-testbed/busybox:latest\"\n",
        );
    let env = [
        ("HALLMARK_ANSWER_TIMEOUT", "3"),
        ("HALLMARK_PROGRESS_INTERVAL", "0.3"),
    ];
    for verb in ["lock", "build", "distribute"] {
        let run = support::run_in_with(project.root(), &[verb, "app"], &env);
        let stderr = run.stderr();
        assert_ne!(run.code(), 0, "{verb}: {stderr}");
        let lines = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("hallmark {verb}: still at work, ")))
            .count();
        assert!(lines >= 3, "{verb}: {lines} lines: {stderr}");
        let quiet = support::run_in_with(project.root(), &["-q", verb, "app"], &env);
        assert!(
            !quiet.stderr().contains("still at work"),
            "{}",
            quiet.stderr()
        );
    }
}

/// A smoke that would run no test fails, before any engine is asked (the engines here do not
/// exist): an image without `[[smoke]]`, or a smoke on the builder of tests that are all
/// `on = "nodes"` (a CI job that forgot `--node` went green), or on a node of tests that are
/// all `on = "builder"`.
#[test]
fn a_smoke_that_would_run_no_test_fails_and_says_why() {
    let (project, _upstream, _) = fixture();
    let config = project.root().join("nowhere.toml");
    std::fs::write(
        &config,
        "[builder]\nname = \"b\"\nengine = \"unix:///nonexistent/b.sock\"\n\n[[node]]\nname = \"n1\"\nengine = \"unix:///nonexistent/n1.sock\"\n",
    )
    .unwrap();
    let spec = project.read("images/app/image.toml");
    let smoke = |on: Option<&str>, args: &[&str]| {
        let text = match on {
            Some(on) => spec.replace(
                "name = \"greets\"",
                &format!("name = \"greets\"\non = \"{on}\""),
            ),
            None => spec.replace(
                "[[smoke]]\nname = \"greets\"\nrun = [\"cat\", \"/src/upstream/greeting.txt\"]\n",
                "",
            ),
        };
        assert_ne!(text, spec);
        project.write("images/app/image.toml", &text);
        let mut all = vec!["smoke", "app"];
        all.extend_from_slice(args);
        project.with_config(&config).run(&all)
    };
    let forgot_node = smoke(Some("nodes"), &[]);
    assert_eq!(forgot_node.code(), 2, "{}", forgot_node.stderr());
    assert!(
        forgot_node
            .stderr()
            .contains("none of image `app`'s 1 smoke test(s) runs on the builder `b`")
            && forgot_node.stderr().contains("--node N"),
        "{}",
        forgot_node.stderr()
    );
    let builder_only = smoke(Some("builder"), &["--node", "n1"]);
    assert_eq!(builder_only.code(), 2, "{}", builder_only.stderr());
    assert!(
        builder_only.stderr().contains("runs on `n1`"),
        "{}",
        builder_only.stderr()
    );
    let none = smoke(None, &["--node", "n1"]);
    assert_eq!(none.code(), 2, "{}", none.stderr());
    assert!(
        none.stderr().contains("image `app` has no smoke test"),
        "{}",
        none.stderr()
    );
}

/// A deadline set in the environment that is not a number of seconds is refused before
/// anything runs, naming the variable and its value (it was read as the default, silently).
#[test]
fn a_deadline_in_the_environment_that_is_no_number_is_refused() {
    let (project, _upstream, _) = fixture();
    for (name, value) in [
        ("HALLMARK_SMOKE_TIMEOUT", "ten"),
        ("HALLMARK_ANSWER_TIMEOUT", "0"),
        ("HALLMARK_STALL_TIMEOUT", "18446744073709551616"),
    ] {
        let run = support::run_in_with(project.root(), &["check", "app"], &[(name, value)]);
        assert_eq!(run.code(), 2, "{name}: {}", run.stderr());
        assert!(
            run.stderr()
                .contains(&format!("{name}=`{value}` is not a number of seconds")),
            "{}",
            run.stderr()
        );
    }
    support::run_in_with(
        project.root(),
        &["check", "app"],
        &[("HALLMARK_SMOKE_TIMEOUT", "600")],
    )
    .success();
}
