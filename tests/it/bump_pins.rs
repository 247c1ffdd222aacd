//! `hallmark bump --base / --wheel / --apt` (issue 38, "every pin moves"): the base moved to
//! the newest tag on the builder whose image differs from the pin, a wheel to the newest
//! version of a local package index, the apt packages locked again; `--dry-run` writes
//! nothing; `--build --bisect` leaves the newest good candidate pinned and names the first
//! bad one. Real engines (the testbed's builder), a real pip against a folder of wheels.

use crate::support::{TestProject, Testbed, unique};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// `hallmark --json ARGS...` on the testbed: the exit code and the whole document.
fn json(project: &TestProject, config: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let run = project.with_config(config).run_with(&all, env);
    let document: Value = serde_json::from_str(&run.stdout())
        .unwrap_or_else(|e| panic!("not json ({e}): {}\n{}", run.stdout(), run.stderr()));
    assert_eq!(document["version"], 1, "{document}");
    (run.code(), document)
}

/// Images `repository:tag` on the builder, each busybox with `/version` holding its number
/// (so each has its own digest), labelled `org.opencontainers.image.created` when a date is
/// given. Made with `docker import`, as operators make local bases.
fn import_tags(testbed: &Testbed, repository: &str, tags: &[(&str, &str, Option<&str>)]) {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs.tar");
    let container = testbed.docker_ok(
        "builder",
        &["create", "hallmark-testbed/busybox:latest", "true"],
    );
    testbed.docker_ok(
        "builder",
        &["export", "-o", rootfs.to_str().unwrap(), &container],
    );
    testbed.docker_ok("builder", &["rm", &container]);
    for (tag, version, created) in tags {
        let tar = dir.path().join(format!("{tag}.tar"));
        std::fs::copy(&rootfs, &tar).unwrap();
        std::fs::write(dir.path().join("version"), format!("{version}\n")).unwrap();
        let appended = Command::new("tar")
            .arg("-rf")
            .arg(&tar)
            .arg("-C")
            .arg(dir.path())
            .arg("version")
            .status()
            .unwrap();
        assert!(appended.success());
        let mut args = vec!["import".to_string()];
        if let Some(created) = created {
            args.push("--change".into());
            args.push(format!("LABEL org.opencontainers.image.created={created}"));
        }
        args.push(tar.to_str().unwrap().into());
        args.push(format!("{repository}:{tag}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        testbed.docker_ok("builder", &args);
    }
}

/// Removes the test's own images from the builder (by its repository; other tests run at
/// the same time).
fn remove_repository(testbed: &Testbed, repository: &str) {
    let listed = testbed.docker_ok(
        "builder",
        &["images", "--format", "{{.Repository}}:{{.Tag}}", repository],
    );
    for reference in listed.lines().filter(|l| !l.is_empty()) {
        let _ = testbed.docker("builder", &["rmi", "-f", reference]);
    }
}

/// A project with image `app` on `from_ref`, smoke-testing that its `/version` is below 3.
fn base_project(from_ref: &str, run: &str) -> TestProject {
    let project = TestProject::new();
    project.write(
        "images/app/image.toml",
        &format!(
            r#"[image]
name = "hm-bump-app-{run}"

[from]
ref = "{from_ref}"

[[smoke]]
name = "version below 3"
run = ["sh", "-c", "test $(cat /version) -lt 3"]

[labels]
"test.run" = "{run}"
"#
        ),
    );
    project
}

fn pinned_digest(project: &TestProject) -> String {
    let pins: toml::Value = toml::from_str(&project.read("pins/app.toml")).unwrap();
    pins["base"]["digest"].as_str().unwrap().to_string()
}

#[test]
fn bump_base_moves_to_the_newest_tag_whose_image_differs_and_dry_run_writes_nothing() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let repository = format!("hm-bump-base-{run}");
    import_tags(
        testbed,
        &repository,
        &[
            ("2026.01", "1", None),
            ("2026.02", "2", None),
            ("2026.10", "3", None),
        ],
    );
    // A newer tag naming the pinned image again is no move: 2026.10 is taken, not 2026.11.
    testbed.docker_ok(
        "builder",
        &[
            "tag",
            &format!("{repository}:2026.01"),
            &format!("{repository}:2026.11"),
        ],
    );
    let project = base_project(&format!("{repository}:2026.01"), &run);
    let on_builder = project.with_config(&config);
    on_builder.run(&["lock", "app"]).success();
    let old_digest = pinned_digest(&project);
    let newest = testbed.image_id("builder", &format!("{repository}:2026.10"));
    assert_ne!(old_digest, newest);
    let (spec, pins) = (
        project.read("images/app/image.toml"),
        project.read("pins/app.toml"),
    );

    let (code, document) = json(
        &project,
        &config,
        &["bump", "app", "--base", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{document}");
    assert_eq!(
        document["bump"]["chosen"]["candidate"], "2026.10",
        "{document}"
    );
    assert_eq!(
        document["bump"]["chosen"]["pin"],
        newest.as_str(),
        "{document}"
    );
    assert_eq!(document["bump"]["order"], "version", "{document}");
    assert_eq!(document["bump"]["written"], false, "{document}");
    let verdicts: Vec<(&str, &str)> = document["tried"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["candidate"].as_str().unwrap(),
                t["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [("2026.10", "newer"), ("2026.11", "same")],
        "{document}"
    );
    assert_eq!(
        project.read("images/app/image.toml"),
        spec,
        "--dry-run wrote the spec"
    );
    assert_eq!(
        project.read("pins/app.toml"),
        pins,
        "--dry-run wrote the pins"
    );

    // A glob matching nothing: exit 1, nothing written.
    let nothing = on_builder.run(&["bump", "app", "--base", "--tags", "1999.*"]);
    assert_eq!(nothing.code(), 1, "{}", nothing.stderr());
    assert!(
        nothing.stderr().contains("no tag matches `1999.*`"),
        "{}",
        nothing.stderr()
    );
    assert_eq!(project.read("pins/app.toml"), pins);

    // --tags narrows the walk: 2026.0* stops at 2026.02.
    let (code, narrowed) = json(
        &project,
        &config,
        &["bump", "app", "--base", "--tags", "2026.0*", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{narrowed}");
    assert_eq!(
        narrowed["bump"]["chosen"]["candidate"], "2026.02",
        "{narrowed}"
    );
    assert_eq!(
        narrowed["bump"]["chosen"]["pin"],
        testbed
            .image_id("builder", &format!("{repository}:2026.02"))
            .as_str()
    );

    on_builder.run(&["bump", "app", "--base"]).success();
    let written = project.read("images/app/image.toml");
    assert_eq!(
        written,
        spec.replace(
            &format!("{repository}:2026.01"),
            &format!("{repository}:2026.10")
        ),
        "only the ref moves, the rest byte for byte"
    );
    assert_eq!(pinned_digest(&project), newest);
    on_builder.run(&["check", "app"]).success();
    // No tag matching the glob after the pin: nothing to do, exit 0, nothing written.
    let pinned = project.read("pins/app.toml");
    let again = on_builder.run(&["bump", "app", "--base", "--tags", "2026.0*"]);
    again.success();
    assert!(
        again.stderr().contains("nothing to do"),
        "{}",
        again.stderr()
    );
    assert_eq!(project.read("pins/app.toml"), pinned);
    remove_repository(testbed, &repository);
}

#[test]
fn bump_base_orders_tags_that_are_not_versions_by_their_created_labels() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let repository = format!("hm-bump-dated-{run}");
    // By name, `zulu` is the newest; by date, `bravo`: `mike`'s label reads later as text,
    // but at +09:00 it is an hour before `bravo`'s.
    import_tags(
        testbed,
        &repository,
        &[
            ("zulu", "1", Some("2026-01-01T00:00:00Z")),
            ("bravo", "2", Some("2026-03-01T00:00:00Z")),
            ("mike", "2", Some("2026-03-01T08:00:00+09:00")),
        ],
    );
    let project = base_project(&format!("{repository}:zulu"), &run);
    project.with_config(&config).run(&["lock", "app"]).success();
    let (code, document) = json(
        &project,
        &config,
        &["bump", "app", "--base", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["bump"]["order"], "date", "{document}");
    assert_eq!(document["bump"]["candidates"], 2, "{document}");
    assert_eq!(
        document["bump"]["chosen"]["candidate"], "bravo",
        "{document}"
    );
    remove_repository(testbed, &repository);
}

#[test]
fn bump_base_bisect_leaves_the_newest_good_tag_pinned_and_names_the_first_bad_one() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let repository = format!("hm-bump-bisect-{run}");
    // v3 and v4 fail the smoke test (`/version` below 3).
    import_tags(
        testbed,
        &repository,
        &[
            ("v1", "1", None),
            ("v2", "2", None),
            ("v3", "3", None),
            ("v4", "4", None),
        ],
    );
    let project = base_project(&format!("{repository}:v1"), &run);
    let on_builder = project.with_config(&config);
    on_builder.run(&["lock", "app"]).success();
    let (code, document) = json(
        &project,
        &config,
        &["bump", "app", "--base", "--build", "--bisect"],
        &[],
    );
    assert_eq!(code, 1, "{document}");
    assert_eq!(document["bump"]["broken"]["candidate"], "v3", "{document}");
    assert_eq!(document["bump"]["chosen"]["candidate"], "v2", "{document}");
    assert!(
        document["bump"]["broken"]["error"]
            .as_str()
            .unwrap()
            .contains("version below 3"),
        "{document}"
    );
    assert!(
        project
            .read("images/app/image.toml")
            .contains(&format!("ref = \"{repository}:v2\"")),
        "{}",
        project.read("images/app/image.toml")
    );
    assert_eq!(
        pinned_digest(&project),
        testbed.image_id("builder", &format!("{repository}:v2"))
    );
    remove_repository(testbed, &repository);
}

/// Wheels `hmbump` 1.0, 1.1 and 1.2 (pure Python) in `dir`; 1.2 fails to import.
fn write_wheels(dir: &Path) {
    write_wheel_versions(dir, &["1.0", "1.1", "1.2"]);
}

/// Wheels `hmbump` at `versions` (pure Python) in `dir`; 1.2 fails to import.
fn write_wheel_versions(dir: &Path, versions: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
import base64, hashlib, sys, zipfile
for version in sys.argv[2:]:
    body = "raise ImportError('hmbump 1.2 is broken')\n" if version == "1.2" else f"VERSION = '{version}'\n"
    info = f"hmbump-{version}.dist-info"
    files = {
        "hmbump/__init__.py": body,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: hmbump\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    with zipfile.ZipFile(f"{sys.argv[1]}/hmbump-{version}-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record += f"{name},sha256={digest},{len(text)}\n"
        record += f"{info}/RECORD,,\n"
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", (1980, 1, 1, 0, 0, 0)), record)
"#;
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .args(versions)
        .status()
        .unwrap();
    assert!(status.success());
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// A project with image `py` on the testbed's Python base, wheel `hmbump` 1.0, smoke-testing
/// its import; and pip's settings for the folder of wheels (no other index).
pub(crate) fn wheel_project(run: &str) -> (TestProject, std::path::PathBuf) {
    let project = TestProject::new();
    let wheels = project.root().join("wheelhouse");
    write_wheels(&wheels);
    project.write(
        "images/py/image.toml",
        &format!(
            r#"[image]
name = "hm-bump-py-{run}"

[from]
ref = "hallmark-testbed/python:bookworm"

[[wheel]]
name = "hmbump"
version = "1.0"

[[smoke]]
name = "hmbump imports"
run = ["python3", "-c", "import hmbump"]

[labels]
"test.run" = "{run}"
"#
        ),
    );
    (project, wheels)
}

#[test]
fn bump_wheel_moves_to_the_newest_version_of_the_index_with_its_hash() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let (project, wheels) = wheel_project(&unique());
    let pip = [
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", wheels.to_str().unwrap()),
    ];
    let on_builder = project.with_config(&config);
    on_builder.run_with(&["lock", "py"], &pip).success();
    let (spec, pins) = (
        project.read("images/py/image.toml"),
        project.read("pins/py.toml"),
    );

    let (code, document) = json(
        &project,
        &config,
        &["bump", "py", "--wheel", "hmbump", "--dry-run"],
        &pip,
    );
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["bump"]["chosen"]["candidate"], "1.2", "{document}");
    assert_eq!(document["bump"]["candidates"], 2, "{document}");
    assert_eq!(project.read("images/py/image.toml"), spec);
    assert_eq!(project.read("pins/py.toml"), pins);

    on_builder
        .run_with(&["bump", "py", "--wheel", "hmbump"], &pip)
        .success();
    assert_eq!(
        project.read("images/py/image.toml"),
        spec.replace("version = \"1.0\"", "version = \"1.2\"")
    );
    let pinned: toml::Value = toml::from_str(&project.read("pins/py.toml")).unwrap();
    let wheel = &pinned["wheel"][0];
    assert_eq!(wheel["version"].as_str(), Some("1.2"), "{pinned}");
    assert_eq!(wheel["file"].as_str(), Some("hmbump-1.2-py3-none-any.whl"));
    assert_eq!(
        wheel["sha256"].as_str().unwrap(),
        sha256_of(&wheels.join("hmbump-1.2-py3-none-any.whl"))
    );
    on_builder.run_with(&["check", "py"], &pip).success();

    // Bad input names the image and the wheel.
    let unknown = on_builder.run_with(&["bump", "py", "--wheel", "nope"], &pip);
    assert_eq!(unknown.code(), 2, "{}", unknown.stderr());
    assert!(
        unknown
            .stderr()
            .contains("image `py` has no wheel `nope` (its wheels: `hmbump`)"),
        "{}",
        unknown.stderr()
    );
}

#[test]
fn bump_wheel_keeps_the_pins_build_flavour_and_takes_pre_releases_only_when_asked() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let (project, wheels) = wheel_project(&unique());
    std::fs::remove_dir_all(&wheels).unwrap();
    write_wheel_versions(
        &wheels,
        &[
            "1.0+cu126",
            "1.1+cu126",
            "1.3+rocm6.3",
            "1.4rc1+cu126",
            "1.5",
            "1.6.dev0+cu126",
        ],
    );
    let spec = project
        .read("images/py/image.toml")
        .replace("version = \"1.0\"", "version = \"1.0+cu126\"");
    project.write("images/py/image.toml", &spec);
    let pip = [
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", wheels.to_str().unwrap()),
    ];
    project
        .with_config(&config)
        .run_with(&["lock", "py"], &pip)
        .success();
    let bump = |extra: &[&str]| {
        let mut args = vec!["bump", "py", "--wheel", "hmbump", "--dry-run"];
        args.extend_from_slice(extra);
        let (code, document) = json(&project, &config, &args, &pip);
        assert_eq!(code, 0, "{document}");
        document
    };
    // 1.3+rocm6.3 and 1.5 are newer, but other flavours; 1.4rc1 and 1.6.dev0 are not releases.
    let kept = bump(&[]);
    assert_eq!(kept["bump"]["chosen"]["candidate"], "1.1+cu126", "{kept}");
    let skipped = kept["bump"]["skipped"].to_string();
    assert!(
        skipped.contains("2 pre- or dev release(s)") && skipped.contains("--pre"),
        "{skipped}"
    );
    assert!(
        skipped.contains("+rocm6.3") && skipped.contains("local label"),
        "{skipped}"
    );
    let pre = bump(&["--pre"]);
    assert_eq!(
        pre["bump"]["chosen"]["candidate"], "1.6.dev0+cu126",
        "{pre}"
    );
    let rocm = bump(&["--wheel-local", "rocm*"]);
    assert_eq!(rocm["bump"]["chosen"]["candidate"], "1.3+rocm6.3", "{rocm}");
    let bare = bump(&["--wheel-local", ""]);
    assert_eq!(bare["bump"]["chosen"]["candidate"], "1.5", "{bare}");
    assert_eq!(
        project.read("images/py/image.toml"),
        spec,
        "--dry-run writes nothing"
    );
}

#[test]
fn bump_base_keeps_the_tags_family_and_skips_pre_releases() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let repository = format!("hm-bump-family-{run}");
    import_tags(
        testbed,
        &repository,
        &[
            ("v1.0", "1", None),
            ("v1.1", "2", None),
            ("v1.2rc1", "3", None),
            ("v1.3-slim", "4", None),
            ("v1.4.dev0", "5", None),
            ("v1.5-beta", "6", None),
        ],
    );
    let project = base_project(&format!("{repository}:v1.0"), &run);
    project.with_config(&config).run(&["lock", "app"]).success();
    let dry = |extra: &[&str]| {
        let mut args = vec!["bump", "app", "--base", "--dry-run"];
        args.extend_from_slice(extra);
        let (code, document) = json(&project, &config, &args, &[]);
        assert_eq!(code, 0, "{document}");
        document
    };
    let found = dry(&[]);
    assert_eq!(found["bump"]["chosen"]["candidate"], "v1.1", "{found}");
    assert_eq!(found["bump"]["order"], "version", "{found}");
    let skipped = found["bump"]["skipped"].to_string();
    assert!(
        skipped.contains("3 pre-release tag(s)") && skipped.contains("v1.3-slim"),
        "{skipped}"
    );
    let pre = dry(&["--pre", "--exclude-tags", "*-beta"]);
    assert_eq!(pre["bump"]["chosen"]["candidate"], "v1.4.dev0", "{pre}");
    remove_repository(testbed, &repository);
}

#[test]
fn bump_wheel_bisect_pins_the_last_version_that_imports() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let (project, wheels) = wheel_project(&unique());
    let pip = [
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", wheels.to_str().unwrap()),
    ];
    let on_builder = project.with_config(&config);
    on_builder.run_with(&["lock", "py"], &pip).success();
    let run = on_builder.run_with(
        &["bump", "py", "--wheel", "hmbump", "--build", "--bisect"],
        &pip,
    );
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(
        run.stderr()
            .contains("1.2 broke the build or its smoke tests")
            && run.stderr().contains("1.1 is pinned"),
        "{}",
        run.stderr()
    );
    assert!(
        project
            .read("images/py/image.toml")
            .contains("version = \"1.1\"")
    );
    let pinned: toml::Value = toml::from_str(&project.read("pins/py.toml")).unwrap();
    assert_eq!(
        pinned["wheel"][0]["sha256"].as_str().unwrap(),
        sha256_of(&wheels.join("hmbump-1.1-py3-none-any.whl"))
    );
}

#[test]
fn bump_refuses_what_it_cannot_move_naming_the_image() {
    // Offline: each is refused before any engine or index is asked.
    let project = TestProject::new();
    project.write(
        "images/base/image.toml",
        "[from]\nref = \"example/base:1\"\n",
    );
    project.write(
        "pins/base.toml",
        &format!(
            "[base]\nref = \"example/base:1\"\ndigest = \"sha256:{}\"\nkind = \"config-digest\"\n",
            "a".repeat(64)
        ),
    );
    project.write("images/kid/image.toml", "[from]\nimage = \"base\"\n");
    project.run(&["check", "kid"]).success();

    let base = project.run(&["bump", "kid", "--base"]);
    assert_eq!(base.code(), 2, "{}", base.stderr());
    assert!(
        base.stderr()
            .contains("image `kid` has no external base to move: its parent is the spec `base`"),
        "{}",
        base.stderr()
    );
    let wheel = project.run(&["bump", "kid", "--wheel", "b12x"]);
    assert_eq!(wheel.code(), 2, "{}", wheel.stderr());
    assert!(
        wheel
            .stderr()
            .contains("image `kid` has no wheel `b12x` (it has no `[[wheel]]`)"),
        "{}",
        wheel.stderr()
    );
    let apt = project.run(&["bump", "kid", "--apt"]);
    assert_eq!(apt.code(), 2, "{}", apt.stderr());
    assert!(
        apt.stderr().contains("image `kid` has no apt packages"),
        "{}",
        apt.stderr()
    );
    // A variant's base is the spec's it varies.
    project.write("images/var/image.toml", "[variant]\nof = \"base\"\n");
    project.write("pins/var.toml", &project.read("pins/base.toml"));
    let variant = project.run(&["bump", "var", "--base"]);
    assert_eq!(variant.code(), 2, "{}", variant.stderr());
    assert!(
        variant.stderr().contains("image `var` is a variant"),
        "{}",
        variant.stderr()
    );
    let mixed = project.run(&["bump", "kid", "--apt", "--source", "x"]);
    assert_eq!(mixed.code(), 2, "{}", mixed.stderr());
    let tags = project.run(&["bump", "kid", "--apt", "--tags", "v*"]);
    assert_eq!(tags.code(), 2, "{}", tags.stderr());
}

#[test]
fn bump_apt_locks_the_packages_again_and_is_a_no_op_when_the_archive_serves_the_pins() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let project = TestProject::new();
    project.write(
        "images/jq/image.toml",
        &format!(
            "[image]\nname = \"hm-bump-apt-{run}\"\n\n[from]\nref = \"hallmark-testbed/python:bookworm\"\n\n[build]\napt = [\"jq\"]\n"
        ),
    );
    let on_builder = project.with_config(&config);
    on_builder.run(&["lock", "jq"]).success();
    let locked = project.read("pins/jq.toml");

    // Nothing moved in the archive: nothing to do, the file untouched.
    let same = on_builder.run(&["bump", "jq", "--apt"]);
    same.success();
    assert!(same.stderr().contains("nothing to do"), "{}", same.stderr());
    assert_eq!(project.read("pins/jq.toml"), locked);

    // A pin of a package jq needs, dropped by hand (as an older lock would lack one): bump
    // locks again and writes what the archive serves, which is what lock wrote.
    let mut pins: toml::Table = toml::from_str(&locked).unwrap();
    let apt = pins["apt"].as_array_mut().unwrap();
    let before = apt.len();
    apt.retain(|p| p["name"].as_str() != Some("libjq1"));
    assert_eq!(apt.len(), before - 1, "jq needs libjq1: {locked}");
    let edited = toml::to_string(&pins).unwrap();
    project.write("pins/jq.toml", &edited);
    let (code, document) = json(
        &project,
        &config,
        &["bump", "jq", "--apt", "--dry-run"],
        &[],
    );
    assert_eq!(code, 0, "{document}");
    assert_eq!(document["bump"]["written"], false);
    assert_eq!(document["bump"]["candidates"], 1, "{document}");
    assert_eq!(
        project.read("pins/jq.toml"),
        edited,
        "--dry-run wrote the pins"
    );
    on_builder.run(&["bump", "jq", "--apt"]).success();
    assert_eq!(project.read("pins/jq.toml"), locked);
}

#[test]
fn a_signal_during_a_bisect_build_puts_the_spec_and_pins_back_and_exits_130() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let repository = format!("hm-bump-signal-{run}");
    import_tags(
        testbed,
        &repository,
        &[("v1", "1", None), ("v2", "2", None), ("v3", "3", None)],
    );
    // v2's image carries a label of its own: its smoke container is found by it.
    let marker = format!("hm-hang-{run}");
    let tagged = format!("{repository}:v2");
    let container = testbed.docker_ok("builder", &["create", &tagged, "true"]);
    let rootfs = tempfile::tempdir().unwrap();
    let tar = rootfs.path().join("v2.tar");
    testbed.docker_ok(
        "builder",
        &["export", "-o", tar.to_str().unwrap(), &container],
    );
    testbed.docker_ok("builder", &["rm", &container]);
    testbed.docker_ok(
        "builder",
        &[
            "import",
            "--change",
            &format!("LABEL {marker}=1"),
            tar.to_str().unwrap(),
            &tagged,
        ],
    );
    let project = TestProject::new();
    project.write(
        "images/app/image.toml",
        &format!(
            r#"[image]
name = "hm-bump-signal-app-{run}"

[from]
ref = "{repository}:v1"

[[smoke]]
name = "version below 3 (v2 hangs)"
run = ["sh", "-c", "test $(cat /version) != 2 || sleep 600; test $(cat /version) -lt 3"]
"#
        ),
    );
    project.with_config(&config).run(&["lock", "app"]).success();
    let (spec, pins) = (
        project.read("images/app/image.toml"),
        project.read("pins/app.toml"),
    );

    // v3 fails its smoke test; bisection then builds v2, whose smoke test hangs: stopped there.
    let mut child = crate::support::spawn(
        &project,
        &config,
        &["bump", "app", "--base", "--build", "--bisect"],
    );
    let hanging = || {
        testbed
            .docker_ok(
                "builder",
                &[
                    "ps",
                    "-q",
                    "--filter",
                    &format!("label={marker}=1"),
                    "--filter",
                    "status=running",
                ],
            )
            .lines()
            .any(|l| !l.is_empty())
    };
    crate::support::wait_for("v2's smoke test running", || {
        hanging() || child.try_wait().unwrap().is_some()
    });
    assert!(
        child.try_wait().unwrap().is_none(),
        "bump ended before v2's smoke test"
    );
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "bump did not end after SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        !stderr.contains("broke the build"),
        "the signal is no candidate's failure: {stderr}"
    );
    assert_eq!(project.read("images/app/image.toml"), spec, "{stderr}");
    assert_eq!(project.read("pins/app.toml"), pins, "{stderr}");
    assert!(!hanging(), "the smoke container was left running");
    remove_repository(testbed, &repository);
}

#[test]
fn bump_base_lists_the_tags_of_the_registry_the_base_comes_from_and_pulls_the_one_chosen() {
    let testbed = Testbed::get();
    let config = testbed.config();
    let run = unique();
    let dir = tempfile::tempdir().unwrap();
    let registry = crate::support::OperatorRegistry::start(dir.path());
    let repository = format!("{}/hm-bump-registry-{run}", registry.address);
    import_tags(
        testbed,
        &repository,
        &[("v1", "1", None), ("v2", "2", None), ("v3", "3", None)],
    );
    for tag in ["v1", "v2", "v3"] {
        testbed.docker_ok("builder", &["push", &format!("{repository}:{tag}")]);
    }
    // The builder keeps v1 only: v2 and v3 are in the registry alone.
    for tag in ["v2", "v3"] {
        testbed.docker_ok("builder", &["rmi", &format!("{repository}:{tag}")]);
    }
    let project = base_project(&format!("{repository}:v1"), &run);
    let on_builder = project.with_config(&config);
    on_builder.run(&["lock", "app"]).success();

    let bumped = on_builder.run(&["bump", "app", "--base"]);
    bumped.success();
    assert!(
        bumped
            .stderr()
            .contains(&format!("pulled {repository}:v3 onto the builder")),
        "{}",
        bumped.stderr()
    );
    assert!(
        project
            .read("images/app/image.toml")
            .contains(&format!("ref = \"{repository}:v3\"")),
        "{}",
        project.read("images/app/image.toml")
    );
    // Pinned by the registry's digest, as lock pins a pulled base on a classic store.
    let pins: toml::Value = toml::from_str(&project.read("pins/app.toml")).unwrap();
    assert_eq!(pins["base"]["kind"].as_str(), Some("repo-digest"), "{pins}");
    let repo_digest = testbed.docker_ok(
        "builder",
        &[
            "image",
            "inspect",
            "--format",
            "{{index .RepoDigests 0}}",
            &format!("{repository}:v3"),
        ],
    );
    assert_eq!(
        Some(repo_digest.rsplit_once('@').unwrap().1),
        pins["base"]["digest"].as_str(),
        "{pins}"
    );
    on_builder.run(&["check", "app"]).success();
    remove_repository(testbed, &repository);
}
